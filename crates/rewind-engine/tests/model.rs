//! Model-based test of the engine on the simulated disk: random writes,
//! zeroings, flushes, bookmarks, maintenance, failed fsyncs and crashes,
//! checked against an oracle holding the volume's contents after every
//! journal record. `read_at(T)` for random `T` must match the oracle; every
//! acknowledged flush must survive every crash. A third of the cases have a
//! protection granularity: then a view at `T` shows the latest time at or
//! before `T` that the granularity keeps exact (a window end, a bookmark or
//! the creation), and it must match the oracle there.
//!
//! Each case prints its seed; `REWIND_SEED=<n>` replays one case and
//! `REWIND_SEEDS=<n>` runs that many.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rewind_engine::{
    BlockSize, BookmarkName, Durability, EngineError, Node, NodeConfig, Timestamp, Volume, VolumeConfig, VolumeName,
    VolumeSpec, ZeroMode,
};
use rewind_index::IndexConfig;
use rewind_io::{SimConfig, SimStorage};
use rewind_journal::JournalConfig;

/// The volume's contents after each journal record; record `i` has LSN `i`
/// (entry 0 is the empty volume at creation).
struct Oracle {
    states: Vec<(Timestamp, Vec<u8>)>,
    /// The engine's clock: the last time it handed out.
    clock: Timestamp,
    /// Records acknowledged durable (flush or FUA).
    durable: usize,
    block_bytes: u64,
}

impl Oracle {
    fn image(&self) -> &Vec<u8> {
        &self.states.last().unwrap().1
    }

    fn at(&self, at: Timestamp) -> &Vec<u8> {
        let after = self.states.partition_point(|(time, _)| *time <= at);
        &self.states[after - 1].1
    }

    /// Mirrors the engine: each record gets `max(now, last + 1)`.
    fn record(&mut self, now: Timestamp, offset: u64, bytes: &[u8]) {
        self.clock = now.max(self.clock.next());
        let mut image = self.image().clone();
        image[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        self.states.push((self.clock, image));
    }

    /// Mirrors how the engine splits a write into records (one per write here:
    /// test writes are far below the 32 MiB record size).
    fn write(&mut self, now: Timestamp, offset: u64, data: &[u8]) {
        self.record(now, offset, data);
    }

    /// Mirrors `Volume::zero`: partial head block, whole blocks, partial tail
    /// block, each its own record.
    fn zero(&mut self, now: Timestamp, offset: u64, length: u64, mode: ZeroMode) {
        let end = offset + length;
        let whole_first = offset.next_multiple_of(self.block_bytes);
        let whole_end = end - end % self.block_bytes;
        if mode == ZeroMode::Allocate || whole_first >= whole_end {
            self.record(now, offset, &vec![0; length as usize]);
            return;
        }
        if offset < whole_first {
            self.record(now, offset, &vec![0; (whole_first - offset) as usize]);
        }
        self.record(now, whole_first, &vec![0; (whole_end - whole_first) as usize]);
        if whole_end < end {
            self.record(now, whole_end, &vec![0; (end - whole_end) as usize]);
        }
    }
}

fn config(rng: &mut StdRng) -> NodeConfig {
    NodeConfig {
        volume: VolumeConfig {
            journal: JournalConfig { segment_bytes_max: rng.random_range(16 << 10..256 << 10) },
            index: IndexConfig { merge_fanin: rng.random_range(2..5), runs_soft_max: rng.random_range(6..20) },
            commit_bytes_soft: rng.random_range(1 << 10..64 << 10),
            unwritten_bytes_max: rng.random_range(64 << 10..1 << 20),
            commit_interval_nanos: rng.random_range(1_000..100_000),
            overlay_versions_max: rng.random_range(8..200),
            memtable_versions_max: rng.random_range(16..300),
            checkpoint_interval_nanos: rng.random_range(10_000..1_000_000),
            checkpoint_journal_bytes: rng.random_range(32 << 10..1 << 20),
        },
        index_cache_bytes: 64 * 4096,
    }
}

fn check_view(volume: &Arc<Volume>, oracle: &Oracle, at: Timestamp, rng: &mut StdRng, seed: u64) {
    let size = oracle.image().len() as u64;
    let offset = rng.random_range(0..size);
    let length = rng.random_range(1..=(size - offset).min(3 * oracle.block_bytes));
    let mut buf = vec![0u8; length as usize];
    volume.view(at).read(offset, &mut buf).unwrap_or_else(|error| panic!("seed {seed}: view read: {error}"));
    let expected = &oracle.at(at)[offset as usize..(offset + length) as usize];
    assert!(buf == expected, "seed {seed}: view at {at:?} differs at offset {offset} length {length}");
}

fn check_everything(volume: &Arc<Volume>, oracle: &Oracle, seed: u64) {
    let mut image = vec![0u8; oracle.image().len()];
    volume.read(0, &mut image).unwrap();
    assert!(&image == oracle.image(), "seed {seed}: live contents differ");
    for (at, _) in &oracle.states {
        // Times whose history was deleted are refused (checked in `run`).
        let Ok(exact) = volume.exact_time(*at) else { continue };
        volume.view(exact).read(0, &mut image).unwrap();
        assert!(&image == oracle.at(exact), "seed {seed}: view at {at:?} (exact: {exact:?}) differs");
    }
}

/// Returns how many versions were thinned (by granularity or range deletes),
/// and how many range deletes there were.
fn run(seed: u64) -> (u64, u64) {
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let storage = SimStorage::new(SimConfig::default(), seed);
    let config = config(&mut rng);
    let block_bytes = [512u32, 1024, 4096][rng.random_range(0..3)];
    let block_count = rng.random_range(8..64u64);
    let size = block_count * u64::from(block_bytes);
    let mut now = Timestamp::from_unix_nanos(1_000_000);
    let mut node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec {
        name: VolumeName::new("v").unwrap(),
        size_bytes: size,
        block_size: BlockSize::new(block_bytes).unwrap(),
        // Time advances up to 5 µs a step: windows of a few to a few dozen steps.
        granularity_nanos: if seed % 3 == 2 { rng.random_range(5_000..100_000) } else { 0 },
    };
    let mut volume = node.create_volume(spec, now).unwrap();
    let mut oracle = Oracle {
        states: vec![(now, vec![0; size as usize])],
        clock: now,
        durable: 0,
        block_bytes: u64::from(block_bytes),
    };
    let mut poisoned = false;
    let mut bookmarks: Vec<(BookmarkName, Timestamp)> = Vec::new();
    let mut deleted: Vec<(Timestamp, Timestamp)> = Vec::new();
    let mut deletes = 0;
    for step in 0..rng.random_range(50..400) {
        // Sometimes the clock stands still: the engine must still order versions.
        if rng.random_bool(0.7) {
            now = now.saturating_add_nanos(rng.random_range(1..5_000));
        }
        match rng.random_range(0..100) {
            0..=44 => {
                let offset = rng.random_range(0..size);
                let length = rng.random_range(1..=(size - offset).min(4 * u64::from(block_bytes)));
                let data: Vec<u8> = (0..length).map(|_| rng.random()).collect();
                let durability = if rng.random_bool(0.1) { Durability::Fua } else { Durability::Buffered };
                let result = volume.write(now, offset, &data, durability);
                if poisoned {
                    assert!(matches!(result, Err(EngineError::Poisoned { .. })), "seed {seed} step {step}");
                } else {
                    result.unwrap();
                    oracle.write(now, offset, &data);
                    if durability == Durability::Fua {
                        oracle.durable = oracle.states.len() - 1;
                    }
                }
            }
            45..=54 => {
                let offset = rng.random_range(0..size);
                let length = rng.random_range(1..=size - offset);
                let mode = if rng.random_bool(0.2) { ZeroMode::Allocate } else { ZeroMode::Deallocate };
                let result = volume.zero(now, offset, length, mode, Durability::Buffered);
                if poisoned {
                    assert!(result.is_err(), "seed {seed} step {step}");
                } else {
                    result.unwrap();
                    oracle.zero(now, offset, length, mode);
                }
            }
            55..=62 => {
                if poisoned {
                    assert!(volume.flush().is_err());
                } else {
                    volume.flush().unwrap();
                    oracle.durable = oracle.states.len() - 1;
                }
            }
            63..=70 => {
                let worked = node.maintain(now);
                assert!(poisoned || worked.is_ok(), "seed {seed}: {worked:?}");
            }
            71..=72 if !poisoned => {
                volume.checkpoint(now).unwrap();
            }
            73..=75 if !poisoned => {
                let name = BookmarkName::new(&format!("b{step}")).unwrap();
                let bookmark = volume.create_bookmark(name.clone(), None, now).unwrap();
                oracle.clock = oracle.clock.max(now);
                assert_eq!(bookmark.timestamp, oracle.clock, "seed {seed}");
                oracle.durable = oracle.states.len() - 1;
                bookmarks.push((name, bookmark.timestamp));
            }
            76..=77 if !poisoned && !bookmarks.is_empty() => {
                let (name, at) = &bookmarks[rng.random_range(0..bookmarks.len())];
                let point = rewind_engine::timespec::PointInTime::Bookmark(name.clone());
                assert_eq!(volume.resolve_time(&point, now).unwrap(), *at);
                assert_eq!(volume.exact_time(*at).unwrap(), *at, "seed {seed}: a bookmark is an exact point");
                check_view(&volume, &oracle, *at, &mut rng, seed);
            }
            78 if !poisoned => {
                // A failed fsync poisons the volume until restart.
                let data = vec![0xee; block_bytes as usize];
                volume.write(now, 0, &data, Durability::Buffered).unwrap();
                oracle.write(now, 0, &data);
                let stats = volume.stats().unwrap();
                if stats.lsn_durable < stats.lsn_last {
                    storage.fail_syncs(1);
                    let error = volume.flush().expect_err("the sync was made to fail");
                    assert!(matches!(error, EngineError::Poisoned { .. }), "seed {seed}: {error}");
                    poisoned = true;
                }
            }
            79 if !poisoned => {
                // Delete a range of history: each block keeps its last version in it.
                let (first, _) = oracle.states[0];
                // The engine's clock may run ahead of `now`; times after `now` are refused.
                let last = oracle.clock.min(now).unix_nanos();
                let from = Timestamp::from_unix_nanos(rng.random_range(first.unix_nanos()..=last));
                let to = Timestamp::from_unix_nanos(rng.random_range(from.unix_nanos()..=last));
                let bookmarked = bookmarks.iter().any(|&(_, at)| from <= at && at < to);
                match volume.delete_history(from, to, now) {
                    Ok(()) => {
                        assert!(from < to && !bookmarked, "seed {seed}: deleted {from:?}..{to:?}");
                        oracle.durable = oracle.states.len() - 1;
                        deleted.push((from, to));
                        deletes += 1;
                    }
                    Err(EngineError::InvalidArgument(message)) => {
                        assert!(from == to || bookmarked, "seed {seed}: {message}");
                    }
                    Err(error) => panic!("seed {seed}: {error}"),
                }
            }
            80..=83 => {
                // Power loss (or a failed fsync followed by a restart).
                drop(volume);
                drop(node);
                storage.crash();
                node = Node::open(Arc::new(storage.clone()), config)
                    .unwrap_or_else(|error| panic!("seed {seed} step {step}: recovery failed: {error}"));
                volume = node.volume("v").unwrap();
                let stats = volume.stats().unwrap();
                let survivors = stats.lsn_last as usize;
                assert!(
                    survivors >= oracle.durable,
                    "seed {seed} step {step}: {survivors} records survived but {} were acknowledged durable",
                    oracle.durable
                );
                assert!(survivors < oracle.states.len(), "seed {seed}: more records than written");
                oracle.states.truncate(survivors + 1);
                oracle.durable = survivors;
                oracle.clock = volume.timestamp_last();
                bookmarks.retain(|(name, _)| volume.bookmarks().iter().any(|bookmark| &bookmark.name == name));
                poisoned = false;
                check_everything(&volume, &oracle, seed);
            }
            _ => {
                let (first, _) = oracle.states[0];
                let at = Timestamp::from_unix_nanos(rng.random_range(first.unix_nanos()..=oracle.clock.unix_nanos()));
                let in_deleted = |at: Timestamp| deleted.iter().any(|&(from, to)| from <= at && at < to);
                match volume.exact_time(at) {
                    Ok(exact) => {
                        assert!(!in_deleted(exact), "seed {seed}: {exact:?} lies in deleted history {deleted:?}");
                        check_view(&volume, &oracle, exact, &mut rng, seed);
                    }
                    Err(EngineError::HistoryDeleted { .. }) => {
                        // With a granularity, rounding down can land in a deleted range too.
                        assert!(in_deleted(at) || volume.granularity_nanos() > 0, "seed {seed}: {at:?} refused");
                    }
                    Err(error) => panic!("seed {seed}: {error}"),
                }
            }
        }
    }
    if !poisoned {
        check_everything(&volume, &oracle, seed);
        // Times outside the history are refused with a clear error.
        let before = Timestamp::from_unix_nanos(999_999);
        let point = rewind_engine::timespec::PointInTime::At(before);
        let error = volume.resolve_time(&point, now).unwrap_err();
        assert!(error.to_string().contains("no history before"), "{error}");
        let future = rewind_engine::timespec::PointInTime::At(now.saturating_add_nanos(1));
        assert!(volume.resolve_time(&future, now).unwrap_err().to_string().contains("future"));
    }
    let stats = volume.stats().unwrap();
    if volume.granularity_nanos() == 0 && deletes == 0 {
        assert_eq!(stats.versions_thinned, 0, "seed {seed}");
    }
    (stats.versions_thinned, deletes)
}

#[test]
fn engine_matches_the_oracle_through_crashes() {
    if let Ok(seed) = std::env::var("REWIND_SEED") {
        let (thinned, deletes) = run(seed.parse().expect("REWIND_SEED is a number"));
        println!("{thinned} versions thinned, {deletes} range deletes");
        return;
    }
    let seeds: u64 = std::env::var("REWIND_SEEDS").map_or(150, |count| count.parse().expect("a number"));
    let (thinned, deletes) = (0..seeds).map(run).fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    println!("{thinned} versions thinned, {deletes} range deletes");
    assert!(seeds < 30 || (thinned > 100 && deletes > 30), "thinning and range deletes must be exercised");
}
