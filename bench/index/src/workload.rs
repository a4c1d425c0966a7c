//! The synthetic write stream: journal records the way the engine files them
//! in the index (one `insert` per record, all versions of a record sharing one
//! strictly increasing timestamp).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rewind_types::{BlockIndex, Lsn, Timestamp, Version, VersionData};

/// 2023-11-14T22:13:20Z: any realistic wall-clock start will do.
pub const TIMESTAMP_FIRST: Timestamp = Timestamp::from_unix_nanos(1_700_000_000 * Timestamp::NANOS_PER_SECOND);
/// Records arrive 1 µs apart (a busy volume; the index only needs them ordered).
pub const RECORD_INTERVAL_NANOS: u64 = 1_000;
pub const BLOCK_BYTES: u64 = 4096;
pub const RECORD_BLOCKS_MAX: u64 = 16;
/// Journal segments of 1 GiB, only to give versions realistic locations.
const SEGMENT_BYTES: u64 = 1 << 30;

/// A stream of records for a volume of `block_count` blocks. Each record writes
/// 1–16 consecutive blocks at a uniformly random position:
/// 40 % one block (4 KiB), 30 % 2–8 blocks, 30 % 9–16 blocks (36–64 KiB),
/// a mean of 5.65 blocks per record. Deterministic for a seed.
pub struct Workload {
    rng: SmallRng,
    block_count: u64,
    lsn_last: Lsn,
    timestamp_last: Option<Timestamp>,
    journal_bytes: u64,
}

/// Where a record landed, for lookups of recently written blocks.
#[derive(Clone, Copy, Debug)]
pub struct RecordExtent {
    pub block_first: u64,
    pub block_count: u64,
    pub timestamp: Timestamp,
}

impl Workload {
    pub fn new(seed: u64, block_count: u64) -> Workload {
        assert!(block_count >= RECORD_BLOCKS_MAX, "the volume holds the largest record");
        Workload {
            rng: SmallRng::seed_from_u64(seed),
            block_count,
            lsn_last: Lsn::ZERO,
            timestamp_last: None,
            journal_bytes: 0,
        }
    }

    pub fn timestamp_last(&self) -> Option<Timestamp> {
        self.timestamp_last
    }

    /// Fills `versions` with the next record's versions; returns its LSN and extent.
    pub fn next_record(&mut self, versions: &mut Vec<Version>) -> (Lsn, RecordExtent) {
        let block_count = match self.rng.random_range(0..100u32) {
            0..40 => 1,
            40..70 => self.rng.random_range(2..=8u64),
            _ => self.rng.random_range(9..=RECORD_BLOCKS_MAX),
        };
        let block_first = self.rng.random_range(0..=self.block_count - block_count);
        let timestamp = match self.timestamp_last {
            None => TIMESTAMP_FIRST,
            Some(last) => last.saturating_add_nanos(RECORD_INTERVAL_NANOS),
        };
        let lsn = self.lsn_last.next();
        versions.clear();
        for index in 0..block_count {
            let location = self.journal_bytes + index * BLOCK_BYTES;
            versions.push(Version {
                block: BlockIndex(block_first + index),
                timestamp,
                data: VersionData::Journal {
                    segment: u32::try_from(location / SEGMENT_BYTES).expect("fewer than 4G segments"),
                    offset: (location % SEGMENT_BYTES) as u32,
                },
                crc32c: self.rng.random(),
            });
        }
        // Record header and per-block CRCs are not modelled: only locations matter.
        self.journal_bytes += block_count * BLOCK_BYTES;
        self.lsn_last = lsn;
        self.timestamp_last = Some(timestamp);
        (lsn, RecordExtent { block_first, block_count, timestamp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_ordered_in_range_and_reproducible() {
        let mut one = Workload::new(7, 64);
        let mut two = Workload::new(7, 64);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut timestamp_previous = None;
        for _ in 0..10_000 {
            let (lsn, extent) = one.next_record(&mut a);
            assert_eq!(two.next_record(&mut b).0, lsn);
            assert_eq!(a, b);
            assert!((1..=RECORD_BLOCKS_MAX).contains(&extent.block_count));
            assert!(extent.block_first + extent.block_count <= 64);
            assert!(timestamp_previous < Some(extent.timestamp));
            assert!(a.iter().all(|version| version.timestamp == extent.timestamp));
            timestamp_previous = Some(extent.timestamp);
        }
    }
}
