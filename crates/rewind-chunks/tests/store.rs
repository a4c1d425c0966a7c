//! Model test of the chunk store on the simulated disk. The test plays the
//! engine: it puts chunks in archive sessions, keeps the references whose
//! session finished as "durable history", releases some of them (as merges
//! do, under the reference gate), collects garbage, and dies at random
//! points — any step of a session or of a collection — after which the store
//! is reopened and marked from the durable references. Sometimes it shuts
//! down cleanly instead, saving its counts, and the next open takes them
//! back (unless the save died part-way). Every durable
//! reference must read back its bytes; deduplication must find repeated
//! contents; nothing the durable references hold may be collected.
//!
//! Some sessions archive from "journal segments" the test writes first,
//! as the engine archives from its journal: the store adopts such a file
//! as a pack for the chunks that are new and do not compress, and the test
//! then deletes the file's first name, as the journal reclaims it.
//!
//! Each case prints its seed; `REWIND_SEED=<n>` replays one case and
//! `REWIND_SEEDS=<n>` runs that many.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rewind_chunks::{ChunkError, ChunkStore, ChunkStoreConfig, CollectPhase, Counting, DedupConfig, InSegment};
use rewind_format::journal::{SegmentHeader, SEGMENT_HEADER_BYTES};
use rewind_io::{OpenMode, SimConfig, SimStorage, Storage};
use rewind_types::{BlockSize, ChunkId, Lsn, Timestamp};

const BLOCK: usize = 512;

fn config(rng: &mut StdRng) -> ChunkStoreConfig {
    ChunkStoreConfig {
        pack_bytes_target: rng.random_range(2_000..40_000),
        dedup: DedupConfig {
            memtable_entries_max: rng.random_range(4..64),
            merge_fanin: rng.random_range(2..5),
            bloom_bits_per_entry: 10,
            bloom_hashes: 7,
        },
        repack_live_percent: rng.random_range(20..80),
        open_packs_max: rng.random_range(1..8),
        // Packs numbered under a node number of a shared bucket, or not.
        node: rng.random_range(0..3),
    }
}

/// Contents drawn from a small pool, so some repeat (dedup), and half
/// compressible.
fn contents(rng: &mut StdRng, pool: u64) -> Vec<u8> {
    let which = rng.random_range(0..pool);
    let mut bytes = vec![(which % 251) as u8; BLOCK];
    if which % 2 == 0 {
        StdRng::seed_from_u64(which).fill_bytes(&mut bytes);
    } else {
        bytes[..8].copy_from_slice(&which.to_le_bytes());
    }
    bytes
}

/// The durable history, as the engine describes its runs to the store.
fn describe(durable: &[(ChunkId, Vec<u8>)]) -> Vec<u8> {
    durable.iter().flat_map(|(id, _)| id.0.to_le_bytes()).collect()
}

/// Opens the store: with the counts a clean shutdown saved for this
/// history if there are any, else marking every durable reference.
fn open(storage: &SimStorage, config: ChunkStoreConfig, durable: &[(ChunkId, Vec<u8>)], seed: u64) -> ChunkStore {
    let store = ChunkStore::open(Arc::new(storage.clone()), "chunks", config)
        .unwrap_or_else(|error| panic!("seed {seed}: open: {error}"));
    if store.resume_counts(&describe(durable)) {
        return store;
    }
    for (id, bytes) in durable {
        store.mark(*id, bytes.len() as u32).unwrap_or_else(|error| panic!("seed {seed}: mark {id}: {error}"));
    }
    store.finish_open(Counting::Exact).unwrap_or_else(|error| panic!("seed {seed}: finish_open: {error}"));
    store
}

fn check_reads(store: &ChunkStore, durable: &[(ChunkId, Vec<u8>)], seed: u64) {
    let block = durable.first().map_or(BLOCK, |(_, bytes)| bytes.len());
    let mut out = vec![0; block];
    for (id, bytes) in durable {
        store.read(*id, &mut out).unwrap_or_else(|error| panic!("seed {seed}: read {id}: {error}"));
        assert!(
            &out == bytes,
            "seed {seed}: chunk {id} reads other bytes: {:?} instead of {:?}",
            &out[..9],
            &bytes[..9]
        );
    }
    // All at once, as a view's read asks for them (duplicates included).
    let ids: Vec<ChunkId> = durable.iter().map(|(id, _)| *id).collect();
    let mut all = vec![0; block * ids.len()];
    let crcs = store.read_many(&ids, &mut all).unwrap_or_else(|error| panic!("seed {seed}: read_many: {error}"));
    for (((id, bytes), out), crc) in durable.iter().zip(all.chunks_exact(block)).zip(crcs) {
        assert!(out == bytes.as_slice(), "seed {seed}: chunk {id} reads other bytes through read_many");
        assert_eq!(crc, rewind_format::crc32c(bytes), "seed {seed}: chunk {id}'s CRC-32C through read_many");
    }
}

/// Writes `blocks` as journal segment `segment` does (a segment header,
/// then the blocks), durably, at `journal/NNNN.seg`; returns its path.
fn write_segment(storage: &dyn Storage, segment: u32, blocks: &[Vec<u8>]) -> Result<String, std::io::Error> {
    storage.create_dir_all("journal")?;
    let path = format!("journal/{segment:08}.seg");
    let file = storage.open_file(&path, OpenMode::CreateNew)?;
    let header = SegmentHeader {
        segment,
        block_size: BlockSize::new(blocks.first().map_or(BLOCK, Vec::len) as u32).unwrap(),
        lsn_first: Lsn(1),
        timestamp_before: Timestamp::MIN,
        recycled: false,
        written_ahead: false,
    };
    file.write_all_at(&header.encode(), 0)?;
    file.write_all_at(&blocks.concat(), SEGMENT_HEADER_BYTES as u64)?;
    file.sync_data()?;
    storage.sync_dir("journal")?;
    Ok(path)
}

/// Puts `blocks` in one session, from the segment at `path` if given, where
/// they are its blocks from `first` on (`adopted_as`: the pack the store
/// adopted it as, if it did).
fn put_session(
    store: &ChunkStore,
    blocks: &[Vec<u8>],
    path: Option<&str>,
    first: usize,
    adopted_as: &mut Option<u64>,
) -> Result<Vec<ChunkId>, ChunkError> {
    let mut session = store.session()?;
    let mut ids = Vec::new();
    for (index, bytes) in blocks.iter().enumerate() {
        ids.push(match path {
            Some(path) => {
                let offset = (SEGMENT_HEADER_BYTES + (first + index) * bytes.len()) as u64;
                let crc32c = rewind_format::crc32c(bytes);
                session.put_from_journal(bytes, InSegment { path, offset, crc32c, adopted_as: &mut *adopted_as })?
            }
            None => session.put(bytes)?,
        });
    }
    session.finish()?;
    Ok(ids)
}

#[derive(Default, Debug)]
struct Exercised {
    dedup_hits: u64,
    chunks_freed: u64,
    packs_rewritten: u64,
    chunks_relocated: u64,
    chunks_adopted: u64,
    deaths: u64,
    counts_restored: u64,
}

fn run(seed: u64) -> Exercised {
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let storage = SimStorage::new(SimConfig::default(), seed);
    let config = config(&mut rng);
    let pool = rng.random_range(20..400);
    let mut durable: Vec<(ChunkId, Vec<u8>)> = Vec::new();
    let mut store = open(&storage, config, &durable, seed);
    let mut exercised = Exercised::default();
    for step in 0..rng.random_range(20..120) {
        // Sometimes the process dies a few changes into the next step.
        let dies = rng.random_bool(0.15);
        if dies {
            storage.stop_after(rng.random_range(0..30));
        }
        let op = rng.random_range(0..12);
        if std::env::var_os("REWIND_DEBUG").is_some() {
            println!(
                "step {step} op {op} dies {dies} durable {:?}",
                durable.iter().map(|(id, b)| (id.0, b[0], b[8])).collect::<Vec<_>>()
            );
        }
        let mut saved_counts = None;
        let outcome: Result<(), ChunkError> = match op {
            0..=4 => {
                let count = rng.random_range(1..60);
                let batch: Vec<Vec<u8>> = (0..count).map(|_| contents(&mut rng, pool)).collect();
                let from_journal = rng.random_bool(0.5);
                let reclaim = rng.random_bool(0.7);
                (|| {
                    let path = match from_journal {
                        true => Some(
                            write_segment(&storage, step as u32, &batch)
                                .map_err(|source| ChunkError::Io { path: "journal".into(), source })?,
                        ),
                        false => None,
                    };
                    let adopted_before = store.stats().chunks_adopted;
                    let ids = put_session(&store, &batch, path.as_deref(), 0, &mut None)?;
                    exercised.chunks_adopted += store.stats().chunks_adopted - adopted_before;
                    durable.extend(ids.into_iter().zip(batch));
                    if let (Some(path), true) = (path, reclaim) {
                        // The journal reclaims the segment: its name goes.
                        let removed = storage.remove_file(&path).and_then(|()| storage.sync_dir("journal"));
                        removed.map_err(|source| ChunkError::Io { path, source })?;
                    }
                    Ok(())
                })()
            }
            5..=7 if !durable.is_empty() => {
                // A merge drops some history.
                let _gate = store.hold_references();
                for _ in 0..rng.random_range(1..=durable.len()) {
                    let (id, bytes) = durable.swap_remove(rng.random_range(0..durable.len()));
                    store.release(id, bytes.len() as u32);
                }
                Ok(())
            }
            10 => store.save_counts(&describe(&durable)).map(|saved| saved_counts = Some(saved)),
            11 if !durable.is_empty() => {
                // A defrag lays some history out in another order.
                let mut ids: Vec<ChunkId> = (0..rng.random_range(1..=durable.len()))
                    .map(|_| durable[rng.random_range(0..durable.len())].0)
                    .collect();
                ids.sort_unstable_by_key(|id| std::cmp::Reverse(id.0));
                store.relocate(&ids).map(|report| exercised.chunks_relocated += report.chunks_moved)
            }
            _ => {
                store.collect(&mut |_: CollectPhase, done, total| assert!(done <= total, "seed {seed}")).map(|report| {
                    exercised.chunks_freed += report.chunks_freed;
                    exercised.packs_rewritten += report.packs_rewritten;
                })
            }
        };
        if dies && storage.is_stopped() {
            // Failed part-way, or finished with its very last change and died.
            drop(store);
            storage.crash();
            exercised.deaths += 1;
            store = open(&storage, config, &durable, seed);
        } else {
            storage.stop_after(u64::MAX);
            outcome.unwrap_or_else(|error| panic!("seed {seed} step {step}: {error}"));
            if let Some(saved) = saved_counts {
                // A clean shutdown, and power lost while the store is down.
                drop(store);
                storage.crash();
                store = open(&storage, config, &durable, seed);
                assert_eq!(store.stats().counts_restored, saved, "seed {seed} step {step}: saved counts taken back");
                exercised.counts_restored += u64::from(saved);
            }
        }
        check_reads(&store, &durable, seed);
        let stats = store.stats();
        assert_eq!(stats.references, durable.len() as u64, "seed {seed} step {step}");
        assert_eq!(stats.logical_bytes, (durable.len() * BLOCK) as u64, "seed {seed}");
        exercised.dedup_hits = exercised.dedup_hits.max(stats.dedup_hits);
    }
    // A final collection keeps exactly the referenced chunks.
    storage.stop_after(u64::MAX);
    store.collect(&mut |_, _, _| {}).unwrap();
    let stats = store.stats();
    let mut distinct: Vec<ChunkId> = durable.iter().map(|(id, _)| *id).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(stats.chunks_live, distinct.len() as u64, "seed {seed}");
    assert_eq!(stats.chunks_dead, 0, "seed {seed}");
    check_reads(&store, &durable, seed);
    drop(store);
    storage.crash();
    let store = open(&storage, config, &durable, seed);
    check_reads(&store, &durable, seed);
    exercised
}

#[test]
fn chunk_store_keeps_every_durable_reference_through_deaths() {
    if let Ok(seed) = std::env::var("REWIND_SEED") {
        println!("{:?}", run(seed.parse().expect("REWIND_SEED is a number")));
        return;
    }
    let seeds: u64 = std::env::var("REWIND_SEEDS").map_or(200, |count| count.parse().expect("a number"));
    let mut total = Exercised::default();
    for seed in 0..seeds {
        let case = run(seed);
        total.dedup_hits += case.dedup_hits;
        total.chunks_freed += case.chunks_freed;
        total.packs_rewritten += case.packs_rewritten;
        total.chunks_relocated += case.chunks_relocated;
        total.chunks_adopted += case.chunks_adopted;
        total.deaths += case.deaths;
        total.counts_restored += case.counts_restored;
    }
    println!("{total:?}");
    assert!(
        seeds < 50
            || (total.dedup_hits > 100
                && total.chunks_freed > 100
                && total.packs_rewritten > 20
                && total.chunks_relocated > 100
                && total.chunks_adopted > 100
                && total.deaths > 50
                && total.counts_restored > 50),
        "dedup, collection, repacking, relocation, adoption, deaths and saved counts must be exercised"
    );
}

#[test]
fn dedup_finds_contents_across_sessions_and_reopening() {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let config = ChunkStoreConfig {
        dedup: DedupConfig { memtable_entries_max: 8, ..DedupConfig::default() },
        ..ChunkStoreConfig::default()
    };
    let blocks: Vec<Vec<u8>> = (0..100u8).map(|byte| vec![byte; 4096]).collect();
    let store = open(&storage, config, &[], 1);
    let mut session = store.session().unwrap();
    let first: Vec<ChunkId> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    let durable: Vec<(ChunkId, Vec<u8>)> = first.iter().copied().zip(blocks.iter().cloned()).collect();
    drop(store);
    storage.crash();
    // The dedup index is found again (runs, and the footers of newer packs).
    let store = open(&storage, config, &durable, 1);
    let mut session = store.session().unwrap();
    let again: Vec<ChunkId> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    assert_eq!(first, again, "the same contents get the same ids");
    let stats = store.stats();
    assert_eq!((stats.chunks_live, stats.references, stats.dedup_hits), (100, 200, 100));
    assert_eq!(stats.logical_bytes, 200 * 4096);
    assert!(stats.unique_stored_bytes < stats.unique_raw_bytes / 20, "runs of one byte compress: {stats:?}");
}

#[test]
fn a_damaged_chunk_is_reported_not_returned() {
    let storage = SimStorage::new(SimConfig::default(), 2);
    let store = open(&storage, ChunkStoreConfig::default(), &[], 2);
    let mut session = store.session().unwrap();
    let block: Vec<u8> = (0..4096u32).map(|index| (index * 31 % 256) as u8).collect();
    let id = session.put(&block).unwrap();
    session.finish().unwrap();
    let pack = storage_pack(&storage);
    storage.corrupt(&pack, 64 + 56 + 10, 0x40).unwrap();
    let mut out = vec![0; 4096];
    let error = store.read(id, &mut out).unwrap_err();
    assert!(matches!(error, ChunkError::Corrupt { .. }), "{error}");
    let error = store.read(ChunkId(id.0 + 1), &mut out).unwrap_err();
    assert!(matches!(error, ChunkError::Missing { .. }), "{error}");
}

fn storage_pack(storage: &SimStorage) -> String {
    use rewind_io::Storage;
    let names = storage.list_dir("chunks/packs").unwrap();
    assert_eq!(names.len(), 1);
    format!("chunks/packs/{}", names[0])
}

/// A store with 50 chunks, two references to each of the first ten.
fn store_with_history(storage: &SimStorage, seed: u64) -> (ChunkStore, Vec<(ChunkId, Vec<u8>)>) {
    let store = open(storage, ChunkStoreConfig::default(), &[], seed);
    let blocks: Vec<Vec<u8>> = (0..50u32).chain(0..10).map(|index| index.to_le_bytes().repeat(BLOCK / 4)).collect();
    let mut session = store.session().unwrap();
    let durable = blocks.iter().map(|block| (session.put(block).unwrap(), block.clone())).collect();
    session.finish().unwrap();
    (store, durable)
}

#[test]
fn saved_counts_never_outlive_a_crash_after_the_open_that_took_them() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let (store, mut durable) = store_with_history(&storage, 3);
    assert!(store.save_counts(&describe(&durable)).unwrap());
    drop(store);
    let store = open(&storage, ChunkStoreConfig::default(), &durable, 3);
    assert!(store.stats().counts_restored, "a clean shutdown's counts are taken back");
    // History moves on (a merge drops the second reference to five chunks),
    // then the process dies: the counts saved before are stale.
    {
        let _gate = store.hold_references();
        for (id, bytes) in durable.drain(50..55) {
            store.release(id, bytes.len() as u32);
        }
    }
    drop(store);
    storage.crash();
    // Even told the old history, the store has nothing saved to believe.
    let stale: Vec<(ChunkId, Vec<u8>)> = durable.iter().cloned().chain(durable[..5].iter().cloned()).collect();
    let store = ChunkStore::open(Arc::new(storage.clone()), "chunks", ChunkStoreConfig::default()).unwrap();
    assert!(!store.resume_counts(&describe(&stale)), "opening removed the saved counts");
    drop(store);
    let store = open(&storage, ChunkStoreConfig::default(), &durable, 3);
    let stats = store.stats();
    assert!(!stats.counts_restored);
    assert_eq!((stats.chunks_live, stats.references), (50, 55));
    check_reads(&store, &durable, 3);
}

#[test]
fn saved_counts_apply_only_to_the_history_and_files_they_were_saved_with() {
    // A history described differently from how it was saved.
    let storage = SimStorage::new(SimConfig::default(), 4);
    let (store, durable) = store_with_history(&storage, 4);
    assert!(store.save_counts(&describe(&durable)).unwrap());
    drop(store);
    let store = ChunkStore::open(Arc::new(storage.clone()), "chunks", ChunkStoreConfig::default()).unwrap();
    assert!(!store.resume_counts(&describe(&durable[..59])), "one reference fewer");
    for (id, bytes) in &durable {
        store.mark(*id, bytes.len() as u32).unwrap();
    }
    store.finish_open(Counting::Exact).unwrap();
    assert_eq!(store.stats().references, 60);
    drop(store);

    // Damage to either file: reported, and counted again.
    for (file, offset) in [("chunks/counts.meta", 40), ("chunks/counts", 4 * 7)] {
        assert!(store_saved_again(&storage, &durable));
        storage.corrupt(file, offset, 0x10).unwrap();
        if file.ends_with(".meta") {
            // The meta file keeps two copies: damage both.
            let half = storage_file_len(&storage, file) / 2;
            storage.corrupt(file, half + offset, 0x10).unwrap();
        }
        let store = ChunkStore::open(Arc::new(storage.clone()), "chunks", ChunkStoreConfig::default()).unwrap();
        assert!(!store.resume_counts(&describe(&durable)), "damaged {file}");
        drop(store);
    }

    // A pack that went away while the store was down.
    assert!(store_saved_again(&storage, &durable));
    let pack = storage_pack(&storage);
    rewind_io::Storage::remove_file(&storage, &pack).unwrap();
    let store = ChunkStore::open(Arc::new(storage.clone()), "chunks", ChunkStoreConfig::default()).unwrap();
    assert!(!store.resume_counts(&describe(&durable)), "a pack is missing");
}

/// Opens the store by counting, and saves its counts again.
fn store_saved_again(storage: &SimStorage, durable: &[(ChunkId, Vec<u8>)]) -> bool {
    let store = open(storage, ChunkStoreConfig::default(), durable, 4);
    store.save_counts(&describe(durable)).unwrap()
}

fn storage_file_len(storage: &SimStorage, path: &str) -> u64 {
    use rewind_io::{OpenMode, Storage};
    storage.open_file(path, OpenMode::Existing).unwrap().size_bytes().unwrap()
}

#[test]
fn counts_that_do_not_fit_on_a_full_disk_are_not_saved_and_cost_only_a_count() {
    let storage = SimStorage::new(SimConfig::default(), 7);
    let (store, durable) = store_with_history(&storage, 7);
    storage.set_capacity(Some(storage.used_bytes() + 16));
    let error = store.save_counts(&describe(&durable)).unwrap_err();
    assert!(error.is_transient(), "a full disk passes: {error}");
    drop(store);
    storage.set_capacity(None);
    let store = open(&storage, ChunkStoreConfig::default(), &durable, 7);
    let stats = store.stats();
    assert!(!stats.counts_restored, "nothing half-saved is taken back");
    assert_eq!((stats.chunks_live, stats.references), (50, 60));
    check_reads(&store, &durable, 7);
}

#[test]
fn counts_in_doubt_are_not_saved() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let (store, durable) = store_with_history(&storage, 5);
    store.request_recount("a merge failed".into());
    assert!(!store.save_counts(&describe(&durable)).unwrap());
    drop(store);
    let store = open(&storage, ChunkStoreConfig::default(), &durable, 5);
    assert!(!store.stats().counts_restored);
}

#[test]
fn a_shutdown_after_an_archive_pass_failed_part_way_counts_at_the_next_open() {
    // Found by hand: a pack that could not be made durable poisoned the
    // store, and the shutdown that followed panicked on the failed pass's
    // chunk ids, left unslotted until a recount frees them.
    let storage = SimStorage::new(SimConfig::default(), 8);
    let (store, durable) = store_with_history(&storage, 8);
    storage.set_capacity(Some(storage.used_bytes() + BLOCK as u64));
    let mut session = store.session().unwrap();
    let failed = (100..200u32).try_for_each(|index| session.put(&index.to_le_bytes().repeat(BLOCK / 4)).map(drop));
    let error = failed.and_then(|()| session.finish()).unwrap_err();
    assert!(error.is_transient(), "a full disk: {error}");
    storage.set_capacity(None);
    assert!(!store.save_counts(&describe(&durable)).unwrap(), "counts in doubt after the failed pass are not saved");
    drop(store);
    let store = open(&storage, ChunkStoreConfig::default(), &durable, 8);
    assert!(!store.stats().counts_restored);
    check_reads(&store, &durable, 8);
}

#[test]
fn history_written_again_in_order_dedups_from_the_locality_cache() {
    let storage = SimStorage::new(SimConfig::default(), 6);
    // Entries leave memory for runs quickly, so hits would need reads.
    let config = ChunkStoreConfig {
        dedup: DedupConfig { memtable_entries_max: 64, ..DedupConfig::default() },
        ..ChunkStoreConfig::default()
    };
    let blocks: Vec<Vec<u8>> = (0..3000u32).map(|index| index.to_le_bytes().repeat(BLOCK / 4)).collect();
    let store = open(&storage, config, &[], 6);
    let mut session = store.session().unwrap();
    let first: Vec<ChunkId> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    let mut durable: Vec<(ChunkId, Vec<u8>)> = first.iter().copied().zip(blocks.iter().cloned()).collect();
    drop(store);
    let store = open(&storage, config, &durable, 6);

    // The same history again, in order, as a copied image brings it.
    let mut session = store.session().unwrap();
    let again: Vec<ChunkId> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    assert_eq!(first, again, "the same contents get the same ids");
    let stats = store.stats();
    assert_eq!(stats.dedup_hits, 3000);
    assert!(stats.dedup_hits_nearby >= 2990, "nearly all hits without a read: {stats:?}");
    durable.extend(again.iter().copied().zip(blocks.iter().cloned()));

    // Collection frees ids (which may be reused for other bytes): the cache
    // forgets them, and every lookup after it is right.
    {
        let _gate = store.hold_references();
        for (id, bytes) in durable.iter().filter(|(id, _)| id.0 % 2 == 0) {
            store.release(*id, bytes.len() as u32);
        }
    }
    durable.retain(|(id, _)| id.0 % 2 == 1);
    assert_eq!(store.collect(&mut |_, _, _| {}).unwrap().chunks_freed, 1500);
    let mut session = store.session().unwrap();
    for (index, block) in blocks.iter().enumerate() {
        let fresh = (index as u32 + 10_000).to_le_bytes().repeat(BLOCK / 4);
        durable.push((session.put(&fresh).unwrap(), fresh));
        let id = session.put(block).unwrap();
        if first[index].0 % 2 == 1 {
            assert_eq!(id, first[index], "a live chunk is found again");
        }
        durable.push((id, block.clone()));
    }
    session.finish().unwrap();
    check_reads(&store, &durable, 6);
}

fn random_block(rng: &mut StdRng, bytes: usize) -> Vec<u8> {
    let mut block = vec![0; bytes];
    rng.fill_bytes(&mut block);
    block
}

/// Stores `blocks` in one archive session; their ids, in order.
fn put_all(store: &ChunkStore, blocks: &[Vec<u8>]) -> Vec<ChunkId> {
    let mut session = store.session().unwrap();
    let ids = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    ids
}

/// A view's read of history on a real disk: `read_many` reads the records
/// of neighbouring chunks with one scatter read, the stored bytes of a chunk
/// kept as it is straight into the caller's buffer. Raw and compressed
/// chunks mixed, asked for out of order and twice, read back their bytes;
/// a flipped byte in a raw chunk's stored bytes (which no copy touched on
/// the way) or in its header is reported, not returned.
#[test]
fn read_many_scatters_records_into_place_and_still_catches_damage() {
    use rewind_io::{OpenMode, OsStorage, Storage};
    const CHUNK: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let store = ChunkStore::open(Arc::clone(&storage), "chunks", ChunkStoreConfig::default()).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let blocks: Vec<Vec<u8>> = (0..64)
        .map(|index| match index % 3 {
            // Compresses: stored as a zstd frame, read into scratch.
            0 => vec![index as u8; CHUNK],
            _ => random_block(&mut rng, CHUNK),
        })
        .collect();
    let ids = put_all(&store, &blocks);

    let mut asked: Vec<usize> = (0..64).rev().chain([5, 5, 9, 0]).collect();
    asked.swap(3, 40);
    let asked_ids: Vec<ChunkId> = asked.iter().map(|&index| ids[index]).collect();
    let mut out = vec![0; CHUNK * asked.len()];
    let crcs = store.read_many(&asked_ids, &mut out).unwrap();
    for ((&index, got), crc) in asked.iter().zip(out.chunks_exact(CHUNK)).zip(crcs) {
        assert!(got == blocks[index].as_slice(), "chunk {index} reads other bytes");
        assert_eq!(crc, rewind_format::crc32c(&blocks[index]), "chunk {index}'s CRC-32C");
    }

    // Find chunk 1's record (raw: random bytes) in the one pack and damage
    // it, first in its stored bytes, then in its header.
    let packs = storage.list_dir("chunks/packs").unwrap();
    assert_eq!(packs.len(), 1, "{packs:?}");
    let pack = storage.open_file(&format!("chunks/packs/{}", packs[0]), OpenMode::Existing).unwrap();
    let mut bytes = vec![0; pack.size_bytes().unwrap() as usize];
    pack.read_exact_at(&mut bytes, 0).unwrap();
    let at = bytes.windows(64).position(|window| window == &blocks[1][..64]).expect("chunk 1 stored as it is");
    for damaged in [at + 1000, at - 40] {
        let mut byte = [0];
        pack.read_exact_at(&mut byte, damaged as u64).unwrap();
        pack.write_all_at(&[byte[0] ^ 0x08], damaged as u64).unwrap();
        let error = store.read_many(&ids[..8], &mut vec![0; CHUNK * 8]).unwrap_err();
        assert!(matches!(error, ChunkError::Corrupt { .. }), "byte {damaged}: {error}");
        pack.write_all_at(&byte, damaged as u64).unwrap();
        store.read_many(&ids[..8], &mut vec![0; CHUNK * 8]).unwrap();
    }
}

/// An archive pass writes each block's versions together, so a view of a
/// volume written again since asks for every other record of a pack (4160
/// bytes apart for 4 KiB chunks): those still share reads of the pack, the
/// records between them read into scratch, not one read per chunk.
#[test]
fn read_many_reads_every_other_record_of_a_pack_in_shared_reads() {
    use rewind_io::CountingStorage;
    const CHUNK: usize = 4096;
    const CHUNKS: usize = 128;
    let counting = Arc::new(CountingStorage::new(Arc::new(SimStorage::new(SimConfig::default(), 11))));
    let store = ChunkStore::open(Arc::clone(&counting) as _, "chunks", ChunkStoreConfig::default()).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let blocks: Vec<Vec<u8>> = (0..CHUNKS).map(|_| random_block(&mut rng, CHUNK)).collect();
    let ids = put_all(&store, &blocks);

    let asked: Vec<usize> = (0..CHUNKS).step_by(2).collect();
    let asked_ids: Vec<ChunkId> = asked.iter().map(|&index| ids[index]).collect();
    let mut out = vec![0; CHUNK * asked.len()];
    // Opens the pack (its trailer and footer) first.
    store.read_many(&ids[1..2], &mut vec![0; CHUNK]).unwrap();
    let before = counting.counters().stats().reads;
    store.read_many(&asked_ids, &mut out).unwrap();
    let reads = counting.counters().stats().reads - before;
    for (&index, got) in asked.iter().zip(out.chunks_exact(CHUNK)) {
        assert!(got == blocks[index].as_slice(), "chunk {index} reads other bytes");
    }
    // One read of the table slots, one scatter read of the records.
    assert_eq!(reads, 2, "reads for {} chunks every other record apart", asked.len());
}

/// Chunks among other blocks (a view whose chunk blocks lie between blocks
/// of the current store): only the rooms that name a chunk are written,
/// each with its chunk, and the chunks share reads as if asked for alone.
#[test]
fn read_many_among_fills_only_the_rooms_of_chunks() {
    use rewind_io::CountingStorage;
    const CHUNK: usize = 4096;
    const CHUNKS: usize = 64;
    let counting = Arc::new(CountingStorage::new(Arc::new(SimStorage::new(SimConfig::default(), 12))));
    let store = ChunkStore::open(Arc::clone(&counting) as _, "chunks", ChunkStoreConfig::default()).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut rng = StdRng::seed_from_u64(12);
    let blocks: Vec<Vec<u8>> = (0..CHUNKS).map(|_| random_block(&mut rng, CHUNK)).collect();
    let ids = put_all(&store, &blocks);
    store.read_many(&ids[1..2], &mut vec![0; CHUNK]).unwrap();

    // Every third room names a chunk, in reverse order; the others hold 0xAA.
    let rooms: Vec<Option<ChunkId>> = (0..CHUNKS).map(|room| (room % 3 == 0).then(|| ids[CHUNKS - 1 - room])).collect();
    let mut out = vec![0xAA; CHUNK * CHUNKS];
    let before = counting.counters().stats().reads;
    let crcs = store.read_many_among(&rooms, &mut out).unwrap();
    let reads = counting.counters().stats().reads - before;
    for (room, (got, crc)) in out.chunks_exact(CHUNK).zip(&crcs).enumerate() {
        if room % 3 == 0 {
            let block = &blocks[CHUNKS - 1 - room];
            assert!(got == block.as_slice(), "room {room} holds another chunk's bytes");
            assert_eq!(*crc, rewind_format::crc32c(block), "room {room}'s CRC");
        } else {
            assert!(got.iter().all(|&byte| byte == 0xAA), "room {room}, without a chunk, was written");
            assert_eq!(*crc, 0, "room {room} has no chunk");
        }
    }
    // One read of the table slots, one scatter read of the records.
    assert_eq!(reads, 2, "reads for {} chunks among other rooms", rooms.iter().flatten().count());
    assert!(store.read_many_among(&[None, None], &mut [0; 2 * CHUNK]).unwrap() == [0, 0], "no chunk at all");
}

/// A view of one point in history asks for chunks archived far apart (every
/// eighth record here: the versions between them are other points'). Laid
/// out in the order asked, they are read with one scatter read instead of
/// one each, their bytes unchanged, through a reopen; asked again, they
/// stay where they are; the old records are dead space, not lost chunks.
#[test]
fn relocate_lays_out_chunks_in_the_order_asked_once() {
    use rewind_chunks::RELOCATE_RUN_CHUNKS_MIN;
    use rewind_io::CountingStorage;
    const CHUNK: usize = 4096;
    const CHUNKS: usize = 1024;
    let sim = SimStorage::new(SimConfig::default(), 12);
    let counting = Arc::new(CountingStorage::new(Arc::new(sim.clone())));
    let store = ChunkStore::open(Arc::clone(&counting) as _, "chunks", ChunkStoreConfig::default()).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut rng = StdRng::seed_from_u64(12);
    let blocks: Vec<Vec<u8>> = (0..CHUNKS).map(|_| random_block(&mut rng, CHUNK)).collect();
    let ids = put_all(&store, &blocks);
    let asked: Vec<usize> = (0..CHUNKS).step_by(8).collect();
    let asked_ids: Vec<ChunkId> = asked.iter().map(|&index| ids[index]).collect();
    let read_asked = |store: &ChunkStore| {
        let mut out = vec![0; CHUNK * asked.len()];
        let before = counting.counters().stats().reads;
        store.read_many(&asked_ids, &mut out).unwrap();
        for (&index, got) in asked.iter().zip(out.chunks_exact(CHUNK)) {
            assert!(got == blocks[index].as_slice(), "chunk {index} reads other bytes");
        }
        counting.counters().stats().reads - before
    };
    read_asked(&store); // opens the pack
    let scattered = read_asked(&store);
    assert!(scattered > asked.len() as u64 / 2, "{scattered} reads for {} chunks 8 records apart", asked.len());

    // Asked twice over: each chunk once.
    let twice: Vec<ChunkId> = asked_ids.iter().chain(&asked_ids).copied().collect();
    let report = store.relocate(&twice).unwrap();
    assert_eq!(report.chunks, asked.len() as u64);
    assert_eq!(report.runs_before, asked.len() as u64, "no two of them neighbours");
    assert_eq!(report.chunks_moved, asked.len() as u64);
    assert_eq!(report.chunks_damaged, 0);
    assert!(report.bytes_written >= (asked.len() * CHUNK) as u64);
    assert_eq!(store.stats().chunks_relocated, asked.len() as u64);
    read_asked(&store); // opens the new pack
                        // Four reads of table slots (the ids span 1024, read 256 at a time)
                        // and one scatter read of the records.
    assert_eq!(read_asked(&store), 5, "reads after the chunks were laid out in order");

    let again = store.relocate(&asked_ids).unwrap();
    assert_eq!((again.runs_before, again.chunks_moved), (1, 0), "in one run already: left as they are");
    assert!(again.chunks >= RELOCATE_RUN_CHUNKS_MIN);
    let few = store.relocate(&asked_ids[..8]).unwrap();
    assert_eq!((few.chunks, few.runs_before, few.chunks_moved), (8, 1, 0), "one short run: left as it is");

    // The moved chunks' old records are dead: collection keeps every
    // chunk readable, and so does the next open.
    store.collect(&mut |_, _, _| {}).unwrap();
    drop(store);
    let store = ChunkStore::open(Arc::new(sim.clone()), "chunks", ChunkStoreConfig::default()).unwrap();
    for id in &ids {
        store.mark(*id, CHUNK as u32).unwrap();
    }
    store.finish_open(Counting::Exact).unwrap();
    let mut out = vec![0; CHUNK];
    for (index, (id, block)) in ids.iter().zip(&blocks).enumerate() {
        store.read(*id, &mut out).unwrap_or_else(|error| panic!("chunk {index} after a reopen: {error}"));
        assert!(&out == block, "chunk {index} reads other bytes after a reopen");
    }
}

/// History archived from a sealed journal segment on a real disk: the
/// chunks that are new and do not compress stay where they lie (the file
/// gets a second name in the packs' directory, nothing is copied), the
/// rest are stored as always. They read back through the table after the
/// journal lets its name go and after a reopen; damage in the segment is
/// reported; collection copies the few live ones of a mostly dead adopted
/// segment into a pack of its own and deletes the segment.
#[test]
fn a_sealed_journal_segment_is_adopted_for_what_neither_dedups_nor_compresses() {
    use rewind_io::OsStorage;
    const CHUNK: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let mut rng = StdRng::seed_from_u64(7);
    // 64 random blocks, 16 that compress, and the first 16 again.
    let mut blocks: Vec<Vec<u8>> = (0..64).map(|_| random_block(&mut rng, CHUNK)).collect();
    blocks.extend((0..16u32).map(|index| index.to_le_bytes().repeat(CHUNK / 4)));
    blocks.extend_from_within(..16);
    let path = write_segment(&*storage, 1, &blocks).unwrap();
    let opened = |durable: &[(ChunkId, Vec<u8>)]| {
        let store = ChunkStore::open(Arc::clone(&storage), "chunks", ChunkStoreConfig::default()).unwrap();
        for (id, bytes) in durable {
            store.mark(*id, bytes.len() as u32).unwrap();
        }
        store.finish_open(Counting::Exact).unwrap();
        store
    };
    let store = opened(&[]);
    // Archived in two sessions, as two passes would: adopted once.
    let mut adopted_as = None;
    let mut ids = put_session(&store, &blocks[..40], Some(&path), 0, &mut adopted_as).unwrap();
    assert!(adopted_as.is_some());
    ids.extend(put_session(&store, &blocks[40..], Some(&path), 40, &mut adopted_as).unwrap());
    let durable: Vec<(ChunkId, Vec<u8>)> = ids.iter().copied().zip(blocks.iter().cloned()).collect();
    let stats = store.stats();
    assert_eq!((stats.chunks_written, stats.chunks_adopted, stats.dedup_hits), (80, 64, 16), "{stats:?}");
    assert_eq!(stats.adopted_bytes, 64 * CHUNK as u64);
    assert_eq!(stats.pack_count, 2, "the adopted segment and a pack of what compressed");
    let packs = storage.list_dir("chunks/packs").unwrap();
    let linked: Vec<&String> =
        packs.iter().filter(|name| storage.link_count(&format!("chunks/packs/{name}")).unwrap() == 2).collect();
    assert_eq!(linked.len(), 1, "{packs:?}");
    let adopted = format!("chunks/packs/{}", linked[0]);
    let pack_bytes = |name: &String| storage.open_file(&format!("chunks/packs/{name}"), OpenMode::Existing).unwrap();
    let written: u64 =
        packs.iter().filter(|name| *name != linked[0]).map(|name| pack_bytes(name).size_bytes().unwrap()).sum();
    assert!(written < 16 * CHUNK as u64 / 4, "only what compressed was written: {written} bytes");
    check_reads(&store, &durable, 7);
    // The journal reclaims the segment; then the node restarts.
    storage.remove_file(&path).unwrap();
    assert_eq!(storage.link_count(&adopted).unwrap(), 1);
    drop(store);
    let store = opened(&durable);
    check_reads(&store, &durable, 7);
    // A flipped bit in an adopted chunk is reported, by a read and by a
    // view's read of its neighbours.
    let file = storage.open_file(&adopted, OpenMode::Existing).unwrap();
    let at = (SEGMENT_HEADER_BYTES + 3 * CHUNK + 100) as u64;
    let mut byte = [0];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x08], at).unwrap();
    let mut out = vec![0; CHUNK];
    let error = store.read(ids[3], &mut out).unwrap_err();
    assert!(matches!(error, ChunkError::Corrupt { .. }) && error.to_string().contains("CRC-32C"), "{error}");
    let mut many = vec![0; 8 * CHUNK];
    let error = store.read_many(&ids[..8], &mut many).unwrap_err();
    assert!(matches!(error, ChunkError::Corrupt { .. }), "{error}");
    file.write_all_at(&byte, at).unwrap();
    // Most of the segment's chunks die: collection copies the rest out.
    let kept: Vec<(ChunkId, Vec<u8>)> = durable[60..].to_vec();
    {
        let _gate = store.hold_references();
        for (id, bytes) in &durable[..60] {
            store.release(*id, bytes.len() as u32);
        }
    }
    let report = store.collect(&mut |_, _, _| {}).unwrap();
    assert!(report.packs_rewritten >= 1, "{report:?}");
    assert!(!storage.exists(&adopted).unwrap(), "the adopted segment is deleted once rewritten");
    check_reads(&store, &kept, 7);
    drop(store);
    check_reads(&opened(&kept), &kept, 7);
}
