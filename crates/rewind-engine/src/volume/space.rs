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
//! A measurement is a scan of every archived index entry: at 10^7 versions
//! 400 MiB read and half a second, which a monitor asking every few seconds
//! must not pay each time. So the volume keeps its last one, the set of
//! chunks included (a bit per chunk id of the store: 12 MiB per 10^8), with
//! the index's chunk epoch it was taken at, which moves whenever the
//! versions in the chunk store change (`VersionIndex::chunk_epoch`). While
//! the epoch stays, the measurement is exact as it is. An archive pass or a
//! filing of history says what it added and the measurement takes that in,
//! measuring only the chunks new to the volume; anything else that moves
//! the epoch (thinning that drops archived versions: retention, a range
//! delete, a space cap) has the next measurement scan again.
//!
//! The cap limits the archived history (the chunks); the journal holds only
//! what has not been archived yet and empties itself. Over the cap, the
//! oldest history goes first: the horizon moves forward by as large a share
//! of the history written since it as the share of space over the cap
//! (from the timeline's per-minute activity), and the next passes correct
//! the estimate. Bookmarks stay, as under retention.

use rewind_chunks::{ChunkSet, Measured};
use rewind_index::EpochStep;
use rewind_types::{ChunkId, Timestamp, VersionData};

use crate::{EngineError, Volume};

/// What a volume's archived versions refer to, as of an index chunk epoch
/// (see the module documentation).
pub(crate) struct SpaceTally {
    chunk_epoch: u64,
    chunks: ChunkSet,
    chunk_references: u64,
    measured: Measured,
}

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
    /// Measures the volume's history now and remembers it: a scan of its
    /// archived index entries and of the chunk table where they point,
    /// unless they are as they were at the last one (see the module
    /// documentation).
    pub fn measure_space(&self, now: Timestamp) -> Result<VolumeSpace, EngineError> {
        let mut tally = self.space_tally.lock();
        let tally = match &mut *tally {
            Some(tally) if tally.chunk_epoch == self.index.chunk_epoch() => tally,
            stale => stale.insert(self.tally_space()?),
        };
        let space = VolumeSpace {
            measured_at: now,
            chunk_references: tally.chunk_references,
            chunks: tally.measured.chunks,
            chunk_raw_bytes: tally.measured.raw_bytes,
            chunk_stored_bytes: tally.measured.stored_bytes,
            journal_bytes: self.journal.size_bytes()?,
        };
        *self.space.lock() = Some(space);
        Ok(space)
    }

    fn tally_space(&self) -> Result<SpaceTally, EngineError> {
        let mut chunks = ChunkSet::default();
        let mut chunk_references = 0;
        let chunk_epoch = self.index.for_each_chunk(&mut |version| {
            if let VersionData::Chunk(id) = version.data {
                chunks.insert(id);
                chunk_references += 1;
            }
            Ok(())
        })?;
        let measured = self.chunks.measure(&chunks)?;
        Ok(SpaceTally { chunk_epoch, chunks, chunk_references, measured })
    }

    /// Takes into the last measurement the versions an operation that made
    /// `step` added to the chunk store (`added`: their chunks), if it was
    /// taken at `step.from`: only chunks new to the volume are measured.
    pub(crate) fn tally_added(&self, step: EpochStep, added: &[ChunkId]) {
        let mut slot = self.space_tally.lock();
        let Some(tally) = slot.as_mut().filter(|tally| tally.chunk_epoch == step.from) else { return };
        let mut new = ChunkSet::default();
        let mut any_new = false;
        for &id in added {
            if tally.chunks.insert(id) {
                new.insert(id);
                any_new = true;
            }
        }
        let measured = match any_new {
            true => self.chunks.measure(&new),
            false => Ok(Measured::default()),
        };
        match measured {
            Ok(measured) => {
                tally.measured += measured;
                tally.chunk_references += added.len() as u64;
                tally.chunk_epoch = step.to;
            }
            // The next measurement scans, and reports what went wrong.
            Err(_) => *slot = None,
        }
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
