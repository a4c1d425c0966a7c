//! How much room a volume's history takes, and keeping it under the space
//! cap.
//!
//! Chunks are shared — by the versions of one volume that hold the same
//! bytes, and across volumes — so a volume's share of the chunk store is
//! not a counter: it is *measured* by collecting the distinct chunks its
//! archived versions refer to (one bit per chunk id) and summing their sizes
//! from the chunk table. A shared chunk counts in full for every volume that
//! refers to it, like ZFS's `referenced`. Maintenance measures volumes with a
//! space cap at each retention pass; `rewind stats` measures on demand.
//!
//! The cap limits the archived history (the chunks); the journal holds only
//! what has not been archived yet and empties itself. Over the cap, the
//! oldest history goes first: the horizon moves forward by as large a share
//! of the history written since it as the share of space over the cap
//! (from the timeline's per-minute activity), and the next passes correct
//! the estimate. Bookmarks stay, as under retention.

use rewind_types::{Timestamp, VersionData};

use crate::{EngineError, Volume};

/// A volume's history, measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeSpace {
    pub measured_at: Timestamp,
    /// Archived versions that refer to a chunk.
    pub chunk_references: u64,
    /// The distinct chunks they refer to, and their size before and after
    /// compression.
    pub chunks: u64,
    pub chunk_raw_bytes: u64,
    pub chunk_stored_bytes: u64,
    /// History not archived yet.
    pub journal_bytes: u64,
}

impl VolumeSpace {
    /// Bytes the archived versions would take with neither deduplication nor
    /// compression.
    pub fn logical_bytes(&self, block_bytes: u32) -> u64 {
        self.chunk_references * u64::from(block_bytes)
    }

    /// Logical bytes per distinct raw byte (1 when nothing repeats).
    pub fn dedup_ratio(&self, block_bytes: u32) -> f64 {
        ratio(self.logical_bytes(block_bytes), self.chunk_raw_bytes)
    }

    /// Raw bytes per stored byte.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.chunk_raw_bytes, self.chunk_stored_bytes)
    }
}

/// `numerator / denominator`, or 1 when there is nothing to divide by: a
/// ratio of sizes where an empty store neither gains nor loses.
pub fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        1.0
    } else {
        numerator as f64 / denominator as f64
    }
}

impl Volume {
    /// Measures the volume's history now (a scan of its archived index
    /// entries and of the chunk table where they point) and remembers it.
    pub fn measure_space(&self, now: Timestamp) -> Result<VolumeSpace, EngineError> {
        let mut set = rewind_chunks::ChunkSet::default();
        let mut chunk_references = 0;
        self.index.for_each_chunk(&mut |version| {
            if let VersionData::Chunk(id) = version.data {
                set.insert(id);
                chunk_references += 1;
            }
            Ok(())
        })?;
        let measured = self.chunks.measure(&set)?;
        let space = VolumeSpace {
            measured_at: now,
            chunk_references,
            chunks: measured.chunks,
            chunk_raw_bytes: measured.raw_bytes,
            chunk_stored_bytes: measured.stored_bytes,
            journal_bytes: self.journal.size_bytes()?,
        };
        *self.space.lock() = Some(space);
        Ok(space)
    }

    /// The last measurement, if any.
    pub fn space(&self) -> Option<VolumeSpace> {
        *self.space.lock()
    }

    /// Where the horizon must move for the archived history to fit in
    /// `space_max_bytes`, if it does not: `None` when it fits.
    pub(crate) fn horizon_for_space_cap(&self, now: Timestamp) -> Result<Option<Timestamp>, EngineError> {
        let cap = self.space_max_bytes();
        if cap == 0 {
            return Ok(None);
        }
        let space = self.measure_space(now)?;
        let used = space.chunk_stored_bytes;
        if used <= cap {
            return Ok(None);
        }
        let start = self.retention_horizon().unwrap_or(self.created());
        let buckets = self.timeline().buckets;
        // Minutes that end at or before the horizon are history dropped
        // already: counted again, the horizon would stop at the same
        // minute's end every pass, over the cap for good.
        let minute_last = |minute: u64| ((minute + 1) * 60 * Timestamp::NANOS_PER_SECOND).saturating_sub(1);
        let after_start =
            |bucket: &&rewind_format::meta::TimelineBucket| minute_last(bucket.minute) > start.unix_nanos();
        let written: Vec<(u64, u64)> = buckets
            .iter()
            .filter(after_start)
            .map(|bucket| (bucket.minute, bucket.write_bytes + bucket.zero_bytes))
            .collect();
        let total: u64 = written.iter().map(|(_, bytes)| bytes).sum();
        let target = (u128::from(total) * u128::from(used - cap) / u128::from(used)) as u64;
        let mut dropped = 0;
        let mut horizon = now;
        for (minute, bytes) in written {
            dropped += bytes;
            if dropped >= target.max(1) {
                horizon = Timestamp::from_unix_nanos(minute_last(minute));
                break;
            }
        }
        let horizon = horizon.min(now);
        tracing::info!(
            volume = %self.name(), used, cap, horizon = %crate::timespec::DisplayTime(horizon),
            "history is over its space cap: dropping the oldest"
        );
        Ok(Some(horizon))
    }
}
