//! Changed-block tracking: which blocks read differently at two points in
//! time, answered from the version index, the overlay and the current
//! store's per-block times — the same plan a read makes — so it needs no
//! bitmap kept on the side and survives any crash by construction (MYCDP
//! §3.3.2 restores to the original disk by sending only these blocks).
//!
//! A block is reported changed when its two plans differ: different
//! versions, or the same version found in two places (which holding the
//! destage and history locks rules out, so in practice never). The answer
//! may only err on the side of "changed": a block is reported unchanged
//! only when both points read the same version, the same chunk (the chunk
//! store deduplicates, so two versions of equal bytes may share one), or
//! both read zeros. Either way the two points read the same bytes. A block
//! the background copy after a revert put back into the current store is
//! planned as the version it copies (`Copies::Traced`), so the copy changes
//! no answer.

use std::sync::Arc;

use crate::volume::read::{Copies, Mismatch, OverlayAccess, Source, Stretch, View};
use crate::{EngineError, Volume};
use rewind_types::{BlockIndex, Timestamp};

/// One extent of a comparison, covering the range asked in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeExtent {
    pub length: u64,
    /// The extent may read differently at the two points.
    pub changed: bool,
}

impl View {
    /// The extents of `offset..offset + length` that read differently in
    /// this view than in `earlier` (a view of the same volume). The reply
    /// may cover less than asked (at most 2^18 blocks), as NBD's block
    /// status does; ask again from where it ends.
    pub fn changes_since(&self, earlier: &View, offset: u64, length: u64) -> Result<Vec<ChangeExtent>, EngineError> {
        self.volume().changes_between(earlier, Some(self.at()), offset, length)
    }
}

impl Volume {
    /// As [`View::changes_since`], for the present.
    pub fn changes_since(
        self: &Arc<Self>,
        earlier: &View,
        offset: u64,
        length: u64,
    ) -> Result<Vec<ChangeExtent>, EngineError> {
        self.changes_between(earlier, None, offset, length)
    }

    /// Every range of the volume that reads differently at `later` (the
    /// present if `None`) than at `earlier`, as (offset, length) in bytes,
    /// neighbours merged, in order.
    pub fn changed_ranges(
        self: &Arc<Self>,
        earlier: &View,
        later: Option<&View>,
    ) -> Result<Vec<(u64, u64)>, EngineError> {
        if let Some(later) = later.filter(|later| !Arc::ptr_eq(self, later.volume())) {
            return Err(EngineError::InvalidArgument(format!(
                "cannot compare {} with a view of {}: changes are between two points of one volume",
                self.name(),
                later.volume().name()
            )));
        }
        let size = self.size_bytes();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut offset = 0;
        while offset < size {
            let extents = self.changes_between(earlier, later.map(View::at), offset, size - offset)?;
            assert!(!extents.is_empty(), "a non-empty range has extents");
            for extent in extents {
                if extent.changed {
                    match ranges.last_mut() {
                        Some((start, length)) if *start + *length == offset => *length += extent.length,
                        _ => ranges.push((offset, extent.length)),
                    }
                }
                offset += extent.length;
            }
        }
        Ok(ranges)
    }

    fn changes_between(
        self: &Arc<Self>,
        earlier: &View,
        later: Option<Timestamp>,
        offset: u64,
        length: u64,
    ) -> Result<Vec<ChangeExtent>, EngineError> {
        if !Arc::ptr_eq(self, earlier.volume()) {
            return Err(EngineError::InvalidArgument(format!(
                "cannot compare {} with a view of {}: changes are between two points of one volume",
                self.name(),
                earlier.volume().name()
            )));
        }
        self.check_open()?;
        self.check_range(offset, length)?;
        self.check_settled()?;
        if length == 0 {
            return Ok(Vec::new());
        }
        let block_size = self.block_size();
        let end = offset + length;
        // No version moves between the two plans: not from the overlay to
        // the current store (destage), nor from the journal to the chunk
        // store (archive), so one version is planned from one place.
        let _wanted = self.passes_wanted.hold();
        let _no_archive = self.history_work.lock();
        let _no_destage = self.destage_lock();
        let mut extents: Vec<ChangeExtent> = Vec::new();
        let mut push = |length: u64, changed: bool| match extents.last_mut() {
            Some(last) if last.changed == changed => last.length += length,
            _ => extents.push(ChangeExtent { length, changed }),
        };
        let mut position = offset;
        for stretch in self.stretches(offset, end)? {
            let (first, count) = match stretch {
                // What this volume never wrote reads as zeros, or the same
                // point of its base, at both points.
                Stretch::Unwritten(length) => {
                    push(length, false);
                    position += length;
                    continue;
                }
                Stretch::Plan(first, count) => (first, count),
            };
            let plan = |at: Option<Timestamp>| -> Result<Vec<Source>, EngineError> {
                self.plan(at, OverlayAccess::Lock, Copies::Traced, first, count)?
                    .map_err(|Mismatch(block)| self.corrupt_current(block))
            };
            let before = plan(Some(earlier.at()))?;
            let after = plan(later)?;
            assert_eq!(before.len(), after.len(), "one source per block in both plans");
            for (index, (before, after)) in before.iter().zip(&after).enumerate() {
                let block_end = block_size.offset_of(BlockIndex(first.0 + index as u64 + 1)).min(end);
                push(block_end - position, before != after);
                position = block_end;
            }
        }
        Ok(extents)
    }
}
