//! The index against a `BTreeMap` of every version: whatever the sequence of
//! inserts, seals, run writes, merges, archive passes and reopenings,
//! `find_le` answers as the oracle does — at every time, or with a
//! granularity, at every time thinning keeps exact (window ends and pins).
//! Archived versions come back with their archived data; every archived
//! version a merge drops is released exactly once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rewind_index::{ArchiveFailed, Archiver, IndexConfig, PageCache, ReleaseHook, Thinning, VersionIndex};
use rewind_io::{SimConfig, SimStorage, Storage};
use rewind_types::{BlockIndex, ChunkId, Lsn, Timestamp, Version, VersionData};

/// Archives journal versions as chunks with fresh ids, remembering which.
#[derive(Default)]
struct Chunks {
    next: u64,
    /// (block, time) → the chunk its version was archived as.
    archived: HashMap<(u64, u64), ChunkId>,
    released: BTreeSet<ChunkId>,
}

struct TestArchiver<'a>(&'a Mutex<Chunks>);

impl Archiver for TestArchiver<'_> {
    fn archive(&mut self, versions: &mut [Version]) -> Result<(), ArchiveFailed> {
        let mut chunks = self.0.lock();
        for version in versions {
            assert!(matches!(version.data, VersionData::Journal { .. }), "only journal versions are archived");
            chunks.next += 1;
            let id = ChunkId(chunks.next);
            chunks.archived.insert((version.block.0, version.timestamp.unix_nanos()), id);
            version.data = VersionData::Chunk(id);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ArchiveFailed> {
        Ok(())
    }
}

struct Releases(Arc<Mutex<Chunks>>);

impl ReleaseHook for Releases {
    fn release(&self, version: &Version) {
        let VersionData::Chunk(id) = version.data else { panic!("only archived versions are released") };
        assert!(self.0.lock().released.insert(id), "chunk {id} released twice");
    }
}

/// Times start well after the first window of any granularity drawn below.
const TIME_START: u64 = 1_000_000;

fn check(
    index: &VersionIndex,
    oracle: &BTreeMap<(u64, u64), Version>,
    rng: &mut StdRng,
    time_max: u64,
    chunks: &Chunks,
    seed: u64,
) {
    let thinning = index.thinning();
    let at = thinning.exact_at_or_before(Timestamp::from_unix_nanos(rng.random_range(TIME_START..=time_max + 2)));
    if thinning.deleted_range(at).is_some_and(|(_, to)| at < to) {
        return; // Deleted history: the engine refuses such times.
    }
    let blocks: Vec<u64> = (0..rng.random_range(1..40)).map(|_| rng.random_range(0..300)).collect();
    let found = index.find_le_many(&blocks, at).unwrap();
    for (block, found) in blocks.iter().zip(found) {
        let mut expected =
            oracle.range((*block, 0)..=(*block, at.unix_nanos())).next_back().map(|(_, version)| *version);
        if let Some(version) = expected.as_mut() {
            if let Some(&id) = chunks.archived.get(&(version.block.0, version.timestamp.unix_nanos())) {
                version.data = VersionData::Chunk(id);
            }
        }
        assert_eq!(found, expected, "seed {seed}: block {block} at {at:?}");
    }
}

/// `versioned_blocks` finds, from every block, the next one with a version
/// the index keeps, as a scan of all of them does.
fn check_versioned_blocks(index: &VersionIndex, seed: u64) {
    let mut kept = BTreeSet::new();
    index
        .for_each_version(&mut |version| {
            kept.insert(version.block.0);
            Ok(())
        })
        .unwrap();
    let versioned = index.versioned_blocks();
    for block in 0..=310 {
        let expected = kept.range(block..).next().copied();
        assert_eq!(versioned.first_from(block).unwrap(), expected, "seed {seed}: first versioned block from {block}");
    }
}

#[test]
fn find_le_matches_the_oracle() {
    let mut merges = 0;
    let mut reopens = 0;
    let mut thinned = 0;
    let mut deletes = 0;
    let mut archived = 0;
    for seed in 0..40u64 {
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), seed));
        let config = IndexConfig {
            merge_fanin: rng.random_range(2..5),
            runs_soft_max: rng.random_range(6..20),
            late_entries: false,
        };
        let cache = PageCache::new(64 * 4096);
        let mut index = VersionIndex::create(Arc::clone(&storage), "index", config, Arc::clone(&cache)).unwrap();
        let chunks = Arc::new(Mutex::new(Chunks::default()));
        index.set_release_hook(Arc::new(Releases(Arc::clone(&chunks))));
        // Half the cases keep every version; the others a window of a few records.
        let granularity_nanos = if seed % 2 == 0 { 0 } else { rng.random_range(1..20_000) };
        index.set_thinning(Thinning { granularity_nanos, ..Thinning::default() });
        let mut oracle = BTreeMap::new();
        let mut time = TIME_START;
        let mut lsn = 0u64;
        for _ in 0..rng.random_range(100..1500) {
            match rng.random_range(0..100) {
                0..=79 => {
                    time += rng.random_range(1..1000);
                    lsn += 1;
                    let first = rng.random_range(0..300u64);
                    let versions: Vec<Version> = (first..(first + rng.random_range(1..8)).min(300))
                        .map(|block| Version {
                            block: BlockIndex(block),
                            timestamp: Timestamp::from_unix_nanos(time),
                            data: if rng.random_bool(0.1) {
                                VersionData::Zero
                            } else {
                                VersionData::Journal { segment: rng.random(), offset: rng.random() }
                            },
                            crc32c: rng.random(),
                        })
                        .collect();
                    for version in &versions {
                        oracle.insert((version.block.0, time), *version);
                    }
                    index.insert(Lsn(lsn), &versions);
                }
                80..=82 => index.seal(),
                83 if time > TIME_START + 2 => {
                    // Delete a range of history (after the last one: ranges stay sorted and disjoint).
                    let mut thinning = index.thinning();
                    let start = thinning.deleted.last().map_or(TIME_START, |&(_, to)| to.unix_nanos() + 1);
                    if start + 1 < time {
                        let from = rng.random_range(start..time - 1);
                        let to = rng.random_range(from + 1..time);
                        thinning.deleted.push((Timestamp::from_unix_nanos(from), Timestamp::from_unix_nanos(to)));
                        index.set_thinning(thinning);
                        index.seal();
                        index.persist(Lsn(lsn)).unwrap();
                        index.rewrite_all().unwrap();
                        deletes += 1;
                    }
                }
                84 => {
                    // A bookmark now: the newest time so far stays exact.
                    let mut thinning = index.thinning();
                    thinning.pins.push(Timestamp::from_unix_nanos(time));
                    thinning.pins.dedup();
                    index.set_thinning(thinning);
                }
                85..=89 => {
                    index.persist(Lsn(lsn)).unwrap();
                }
                90..=93 => {
                    while index.compact().unwrap() {
                        merges += 1;
                    }
                }
                94 => {
                    // Reopen: what is not in runs is replayed by the caller; here we
                    // re-insert everything after lsn_indexed as the engine would.
                    index.seal();
                    index.persist(Lsn(lsn)).unwrap();
                    assert_eq!(index.lsn_indexed(), Lsn(lsn), "seed {seed}");
                    let thinning = index.thinning();
                    drop(index);
                    index = VersionIndex::open(Arc::clone(&storage), "index", config, Arc::clone(&cache)).unwrap();
                    index.set_thinning(thinning);
                    index.set_release_hook(Arc::new(Releases(Arc::clone(&chunks))));
                    reopens += 1;
                }
                95..=96 => {
                    // Archive everything older than a cutoff that no memtable reaches.
                    index.seal();
                    index.persist(Lsn(lsn)).unwrap();
                    let from = index.archived_before().unix_nanos().max(TIME_START);
                    let cutoff = Timestamp::from_unix_nanos(rng.random_range(from..=time + 1));
                    let report = index.archive(cutoff, &mut TestArchiver(&chunks)).unwrap();
                    assert!(index.archived_before() >= cutoff, "seed {seed}");
                    archived += report.versions_archived;
                }
                97 => check_versioned_blocks(&index, seed),
                _ => check(&index, &oracle, &mut rng, time, &chunks.lock(), seed),
            }
        }
        check_versioned_blocks(&index, seed);
        for _ in 0..50 {
            check(&index, &oracle, &mut rng, time, &chunks.lock(), seed);
        }
        // Every archived version still in the index refers to its own chunk,
        // which was never released; all the others were released.
        let mut referenced = BTreeSet::new();
        index
            .for_each_chunk(&mut |version| {
                let VersionData::Chunk(id) = version.data else { unreachable!() };
                assert!(referenced.insert(id), "seed {seed}: chunk {id} referenced twice");
                Ok(())
            })
            .unwrap();
        let chunks = chunks.lock();
        assert!(referenced.is_disjoint(&chunks.released), "seed {seed}: a kept version's chunk was released");
        assert_eq!(referenced.len() + chunks.released.len(), chunks.archived.len(), "seed {seed}: chunks leaked");
        let stats = index.stats();
        let kept = stats.versions_in_memory + stats.versions_in_runs;
        assert_eq!(kept + index.versions_thinned(), oracle.len() as u64, "seed {seed}: written = kept + thinned");
        if granularity_nanos == 0 && index.thinning().deleted.is_empty() {
            assert_eq!(index.versions_thinned(), 0, "seed {seed}");
        }
        thinned += index.versions_thinned();
    }
    println!("{merges} merges, {reopens} reopenings, {deletes} range deletes, {thinned} versions thinned, {archived} archived");
    assert!(deletes > 20, "the test must exercise range deletes");
    assert!(archived > 1000, "the test must exercise archiving");
    assert!(merges > 20 && reopens > 20, "the test must exercise merging and reopening");
    assert!(thinned > 1000, "the test must exercise thinning");
}

#[test]
fn a_damaged_page_is_reported() {
    let sim = SimStorage::new(SimConfig::default(), 1);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let cache = PageCache::new(1 << 20);
    let index = VersionIndex::create(Arc::clone(&storage), "index", IndexConfig::default(), cache).unwrap();
    let versions: Vec<Version> = (0..500)
        .map(|block| Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(1),
            data: VersionData::Zero,
            crc32c: 0,
        })
        .collect();
    index.insert(Lsn(1), &versions);
    index.seal();
    index.persist(Lsn(1)).unwrap();
    // Page 2 of the run file is data page 1 (blocks 127..254).
    sim.corrupt("index/0000000001.run", 2 * 4096 + 40, 0x01).unwrap();
    assert!(index.find_le(3, Timestamp::MAX).unwrap().is_some());
    let error = index.find_le(130, Timestamp::MAX).unwrap_err();
    assert!(error.to_string().contains("checksum mismatch"), "{error}");
}

/// Memtables sealed at random sizes (as checkpoints and the memtable cap do)
/// must still be merged into O(fanin · log N) runs: none may be stranded.
#[test]
fn runs_stay_logarithmic_whatever_the_seal_sizes() {
    for seed in 0..6u64 {
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), seed));
        let config = IndexConfig { merge_fanin: 4, runs_soft_max: 1000, late_entries: false };
        let index = VersionIndex::create(storage, "index", config, PageCache::new(1 << 20)).unwrap();
        let (mut time, mut lsn, mut total) = (0u64, 0u64, 0u64);
        let mut runs_max = 0;
        for _ in 0..400 {
            // Seal sizes over three orders of magnitude, like a quiet checkpoint
            // followed by a full memtable.
            let seal_at = match rng.random_range(0..3) {
                0 => rng.random_range(1..20),
                1 => rng.random_range(200..300),
                _ => 1024 + rng.random_range(0..16),
            };
            for _ in 0..seal_at {
                time += 1;
                lsn += 1;
                let version = Version {
                    block: BlockIndex(rng.random_range(0..10_000)),
                    timestamp: Timestamp::from_unix_nanos(time),
                    data: VersionData::Zero,
                    crc32c: 0,
                };
                index.insert(Lsn(lsn), &[version]);
            }
            total += seal_at;
            index.seal();
            index.persist(Lsn(lsn)).unwrap();
            while index.compact().unwrap() {}
            runs_max = runs_max.max(index.stats().run_count);
        }
        // log4(total / smallest seal) levels, at most fanin-1 runs each, plus
        // stragglers waiting for the next merge at their level.
        let levels = (total as f64).log(4.0).ceil() as u64;
        println!("{total} versions, at most {runs_max} runs at once ({levels} levels)");
        assert!(runs_max <= 4 * levels, "seed {seed}: {runs_max} runs for {total} versions");
        assert_eq!(index.stats().versions_in_runs, total);
    }
}
