//! Compound writes: several extents written and zeroed as one point in time,
//! all or none — what a file tree needs to change a file's blocks and its
//! inode, or two directories in a rename, without a crash or a view ever
//! showing half of it.
//!
//! The whole change is one journal record (`RecordKind::Compound`), so the
//! journal's torn-record rule makes it atomic on disk, and its versions all
//! carry the record's time, so a view at any T has all of them or none.

use std::sync::atomic::Ordering;

use rewind_format::journal::{CompoundExtent, COMPOUND_EXTENTS_MAX, COMPOUND_EXTENT_BYTES, RECORD_HEADER_BYTES};
use rewind_types::{BlockIndex, Lsn, Timestamp, Version, VersionData};

use crate::volume::{Durability, Volume, RECORD_BYTES_MAX, ZERO_RECORD_BLOCKS_MAX};
use crate::EngineError;

/// One part of a compound write, in bytes; whole blocks only.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a> {
    /// `data` at `offset`.
    Write { offset: u64, data: &'a [u8] },
    /// `length` bytes at `offset` read as zeros from now on.
    Zero { offset: u64, length: u64 },
}

impl Change<'_> {
    fn range(&self) -> (u64, u64) {
        match *self {
            Change::Write { offset, data } => (offset, data.len() as u64),
            Change::Zero { offset, length } => (offset, length),
        }
    }
}

/// The largest payload of one compound write.
pub const COMPOUND_BYTES_MAX: usize = RECORD_BYTES_MAX;
/// The most blocks, written and zeroed, one compound write changes: each
/// becomes a version in memory at once, as in a zero record.
pub const COMPOUND_BLOCKS_MAX: u64 = ZERO_RECORD_BLOCKS_MAX;

/// Where a compound write went: its point in time, and its journal record's
/// LSN, which [`Volume::flush_through`] makes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompoundWritten {
    pub at: Timestamp,
    pub lsn: Lsn,
}

impl Volume {
    /// Writes and zeroes `changes` (whole blocks, disjoint, in any order) as
    /// one point in time, all or none, and returns that time and its record. Refused whole
    /// if any change is misaligned, out of range or overlaps another, or if
    /// together they exceed [`COMPOUND_BYTES_MAX`] of data or
    /// `COMPOUND_EXTENTS_MAX` extents.
    pub fn write_compound(
        &self,
        now: Timestamp,
        changes: &[Change<'_>],
        durability: Durability,
    ) -> Result<CompoundWritten, EngineError> {
        self.check_writable()?;
        let (extents, data) = self.compound_extents(changes)?;
        self.check_room()?;
        let written = {
            let mut state = self.write.lock();
            let timestamp_before = state.timestamp_last;
            let timestamp = Volume::next_timestamp(&mut state, now);
            let mut crcs = std::mem::take(&mut state.crcs);
            crcs.clear();
            let appended = self.journal.append_compound(timestamp, &extents, &data, &mut crcs).map_err(|error| {
                // Nothing was written: no point in time either.
                state.timestamp_last = timestamp_before;
                self.fail(error.into())
            })?;
            let block_bytes = self.meta.block_size.bytes();
            let mut versions = std::mem::take(&mut state.versions);
            versions.clear();
            let mut data_blocks = 0u32;
            for extent in &extents {
                for block in extent.block_first.0..extent.block_first.0 + u64::from(extent.block_count) {
                    let (data, crc32c) = match extent.zero {
                        true => (VersionData::Zero, self.zero_block_crc32c),
                        false => {
                            let offset = appended.data_offset + data_blocks * block_bytes;
                            let crc32c = crcs[data_blocks as usize];
                            data_blocks += 1;
                            (VersionData::Journal { segment: appended.segment, offset }, crc32c)
                        }
                    };
                    versions.push(Version { block: BlockIndex(block), timestamp, data, crc32c });
                }
            }
            assert_eq!(data_blocks as usize, crcs.len(), "one CRC per data block");
            state.versions = versions;
            state.crcs = crcs;
            let table_bytes = extents.len() * COMPOUND_EXTENT_BYTES + (data_blocks as usize * 4).next_multiple_of(8);
            let journal_bytes =
                (RECORD_HEADER_BYTES + table_bytes) as u64 + u64::from(data_blocks) * u64::from(block_bytes);
            let zero_blocks = state.versions.iter().filter(|version| version.data == VersionData::Zero).count();
            self.record_versions(&mut state, appended.lsn, journal_bytes, zero_blocks);
            CompoundWritten { at: timestamp, lsn: appended.lsn }
        };
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(data.iter().map(|slice| slice.len() as u64).sum(), Ordering::Relaxed);
        self.after_write(durability)?;
        Ok(written)
    }

    /// The journal's extents for `changes`, sorted, and the data of each
    /// data extent in that order (borrowed, not copied); refuses what the
    /// record cannot hold (see `write_compound`).
    fn compound_extents<'a>(
        &self,
        changes: &[Change<'a>],
    ) -> Result<(Vec<CompoundExtent>, Vec<&'a [u8]>), EngineError> {
        let block_bytes = u64::from(self.meta.block_size.bytes());
        if changes.is_empty() || changes.len() as u64 > COMPOUND_EXTENTS_MAX {
            return Err(EngineError::InvalidArgument(format!(
                "a compound write has 1 to {COMPOUND_EXTENTS_MAX} changes, not {}",
                changes.len()
            )));
        }
        let mut sorted: Vec<&Change<'_>> = changes.iter().collect();
        sorted.sort_unstable_by_key(|change| change.range().0);
        let mut end = 0;
        let mut data_bytes = 0u64;
        let mut blocks = 0u64;
        for change in &sorted {
            let (offset, length) = change.range();
            self.check_range(offset, length)?;
            if length == 0 || !offset.is_multiple_of(block_bytes) || !length.is_multiple_of(block_bytes) {
                return Err(EngineError::InvalidArgument(format!(
                    "a compound write changes whole {block_bytes}-byte blocks; {length} bytes at {offset} are not"
                )));
            }
            if offset < end {
                return Err(EngineError::InvalidArgument(format!(
                    "the changes of a compound write overlap at byte {offset}"
                )));
            }
            end = offset + length;
            blocks += length / block_bytes;
            if let Change::Write { data, .. } = change {
                data_bytes += data.len() as u64;
            }
        }
        if data_bytes > COMPOUND_BYTES_MAX as u64 || blocks > COMPOUND_BLOCKS_MAX {
            return Err(EngineError::InvalidArgument(format!(
                "a compound write holds at most {COMPOUND_BYTES_MAX} bytes of data and {COMPOUND_BLOCKS_MAX} \
                 blocks in all, not {data_bytes} bytes and {blocks} blocks"
            )));
        }
        let mut data = Vec::new();
        let extents = sorted
            .iter()
            .map(|change| {
                let (offset, length) = change.range();
                if let Change::Write { data: bytes, .. } = change {
                    data.push(*bytes);
                }
                CompoundExtent {
                    block_first: BlockIndex(offset / block_bytes),
                    block_count: u32::try_from(length / block_bytes).expect("bounded by COMPOUND_BYTES_MAX"),
                    zero: matches!(change, Change::Zero { .. }),
                }
            })
            .collect();
        Ok((extents, data))
    }
}
