//! What the engine's model tests share: an oracle of a volume's contents
//! after every record, a random node configuration, random write data and
//! retention policies, and the check of every point an oracle knows.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use rewind_chunks::{ChunkStoreConfig, DedupConfig};
use rewind_engine::{EngineError, NodeConfig, RetentionTier, Timestamp, Volume, VolumeConfig, ZeroMode};
use rewind_index::IndexConfig;
use rewind_journal::JournalConfig;

/// The volume's contents after each write or zero record (entry 0 is the
/// empty volume at creation).
#[derive(Clone)]
pub struct Oracle {
    pub states: Vec<(Timestamp, Vec<u8>)>,
    /// The engine's clock: the last time it handed out.
    pub clock: Timestamp,
    /// Records acknowledged durable (flush or FUA).
    pub durable: usize,
    pub block_bytes: u64,
}

impl Oracle {
    pub fn image(&self) -> &Vec<u8> {
        &self.states.last().unwrap().1
    }

    pub fn at(&self, at: Timestamp) -> &Vec<u8> {
        let after = self.states.partition_point(|(time, _)| *time <= at);
        &self.states[after - 1].1
    }

    /// Mirrors the engine: each record gets `max(now, last + 1)`.
    pub fn record(&mut self, now: Timestamp, offset: u64, bytes: &[u8]) {
        self.clock = now.max(self.clock.next());
        let mut image = self.image().clone();
        image[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        self.states.push((self.clock, image));
    }

    /// Mirrors how the engine splits a write into records (one per write here:
    /// test writes are far below the 32 MiB record size).
    pub fn write(&mut self, now: Timestamp, offset: u64, data: &[u8]) {
        self.record(now, offset, data);
    }

    /// Mirrors `Volume::zero`: partial head block, whole blocks, partial tail
    /// block, each its own record.
    pub fn zero(&mut self, now: Timestamp, offset: u64, length: u64, mode: ZeroMode) {
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

pub fn config(rng: &mut StdRng) -> NodeConfig {
    NodeConfig {
        volume: VolumeConfig {
            journal: JournalConfig {
                segment_bytes_max: rng.random_range(16 << 10..256 << 10),
                batch_bytes_max: rng.random_range(1 << 10..128 << 10),
                // Reclaimed segments kept and spares written ahead, or neither.
                spare_segments_max: rng.random_range(0..3),
                spare_after_commits: rng.random_range(0..64),
                ..JournalConfig::default()
            },
            index: IndexConfig {
                merge_fanin: rng.random_range(2..5),
                runs_soft_max: rng.random_range(6..20),
                late_entries: false,
            },
            commit_bytes_soft: rng.random_range(1 << 10..64 << 10),
            unwritten_bytes_max: rng.random_range(64 << 10..1 << 20),
            commit_interval_nanos: rng.random_range(1_000..100_000),
            overlay_versions_max: rng.random_range(8..200),
            burst_quiet_nanos: rng.random_range(0..50_000),
            memtable_versions_max: rng.random_range(16..300),
            checkpoint_interval_nanos: rng.random_range(10_000..1_000_000),
            checkpoint_journal_bytes: rng.random_range(32 << 10..1 << 20),
            retention_interval_nanos: rng.random_range(5_000..200_000),
            archive_interval_nanos: rng.random_range(5_000..200_000),
            archive_bytes_soft: rng.random_range(4 << 10..256 << 10),
            burst_archive_wait_nanos: rng.random_range(0..200_000),
            archive_age_nanos: rng.random_range(0..50_000),
            lay_out_bookmarks: rng.random_bool(0.5),
            vouch_after_nanos: rng.random_range(0..20_000),
            burst_reads_nanos: rng.random_range(0..200_000),
        },
        index_cache_bytes: 64 * 4096,
        journal_memory_bytes: rng.random_range(0..512 << 10),
        chunks: ChunkStoreConfig {
            pack_bytes_target: rng.random_range(4 << 10..128 << 10),
            dedup: DedupConfig {
                memtable_entries_max: rng.random_range(4..256),
                merge_fanin: rng.random_range(2..5),
                ..DedupConfig::default()
            },
            repack_live_percent: rng.random_range(20..80),
            open_packs_max: rng.random_range(1..8),
            node: 0,
        },
        collect_interval_nanos: rng.random_range(5_000..500_000),
        // The simulated disk has room to spare but for the full-disk steps.
        reserve: rewind_engine::Reserve::Bytes(0),
    }
}

/// Data for a write: random bytes, zeros, or one of a few block patterns
/// (the same pattern makes the same block contents wherever it lands, so the
/// chunk store deduplicates it).
pub fn write_data(rng: &mut StdRng, offset: u64, length: u64, block_bytes: u64) -> Vec<u8> {
    match rng.random_range(0..10) {
        0..=3 => (0..length).map(|_| rng.random()).collect(),
        4 => vec![0; length as usize],
        _ => {
            let pattern = rng.random_range(1..6u64);
            (offset..offset + length).map(|at| (pattern * 37 + at % block_bytes % 29) as u8).collect()
        }
    }
}

pub fn check_everything(volume: &Arc<Volume>, oracle: &Oracle, seed: u64) {
    let mut image = vec![0u8; oracle.image().len()];
    volume.read(0, &mut image).unwrap();
    assert!(&image == oracle.image(), "seed {seed}: live contents differ");
    for (at, _) in &oracle.states {
        // Times whose history was deleted are refused (checked in `run`).
        let Ok(exact) = volume.exact_time(*at) else { continue };
        match volume.view(exact) {
            Err(EngineError::RecoveryPending { .. }) => return,
            view => view.unwrap().read(0, &mut image).unwrap(),
        }
        assert!(&image == oracle.at(exact), "seed {seed}: view at {at:?} (exact: {exact:?}) differs");
    }
}

/// A random retention policy whose intervals are powers of two times 1 µs
/// (so any policy may follow any other): `(granularity, tiers)`.
pub fn random_policy(rng: &mut StdRng) -> (u64, Vec<RetentionTier>) {
    let granularity = [0, 0, 1_000, 2_000][rng.random_range(0..4)];
    let mut tiers = Vec::new();
    let mut age = 0;
    let mut interval = granularity.max(1_000);
    if rng.random_bool(0.7) {
        age = rng.random_range(20_000..200_000);
        tiers.push(RetentionTier { interval_nanos: 0, age_nanos: age });
    }
    for _ in 0..rng.random_range(0..3) {
        interval <<= rng.random_range(1..3);
        age += rng.random_range(50_000..400_000);
        tiers.push(RetentionTier { interval_nanos: interval, age_nanos: age });
    }
    (granularity, tiers)
}
