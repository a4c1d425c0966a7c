//! The background copy after a revert (IBM §2.4): a revert is metadata
//! only (`revert.rs`), so afterwards every block changed since the point
//! reverted to is read through the version index, from the journal or the
//! chunk store, until it is written again. The copy puts those blocks back
//! into the current store, so the present reads at the current store's
//! speed again, while reads are correct throughout.
//!
//! A copied block is the volume as at the point reverted to, stamped with
//! the revert's time R: the present and views from R on read it in the
//! current store; views before R see a newer time there and look into
//! history, as for any block written since them. No write has the time R
//! (the revert took it from the volume's clock), so the stamp also says
//! "copied": changed-block tracking plans such a block as the version it
//! copies (`Copies::Traced`), and the copy is never filed as history.
//!
//! The copy goes through the journal like a write (records marked with
//! the revert's time, `docs/format/journal.md`) and from there through the
//! overlay and the layout's own destage: COW and Checkpointing file the
//! version the current store held before the copy overwrites it, ROW
//! merges it at its next snapshot, the controller cache lets it go as any
//! block. So a crash needs nothing new: recovery applies the records again.
//! A block is copied only if the revert still decides what it reads — its
//! newest version is from before R — and is checked again under the write
//! lock (with the destager held off) before its record is appended: a
//! client write that came meanwhile is newer, and wins.
//!
//! The copy runs after the slow work on history (not holding it off), a
//! bounded amount per pass, one pass at a time, and saves how far it has come (`revert-copy`) once its records are
//! durable; a newer revert starts it again from the first block. The
//! Logging layout has no current store: nothing to copy. Blocks that read
//! a clone's base at the point reverted to are left to read it there.

use std::sync::atomic::Ordering;

use rewind_format::meta::{Revert, RevertCopyProgress};
use rewind_io::{read_file_healing, write_file_atomic};
use rewind_types::{BlockIndex, Timestamp, Version, VersionData};

use crate::timespec::DisplayTime;
use crate::volume::read::{Copies, Mismatch, OverlayAccess, Source, Stretch};
use crate::volume::WriteState;
use crate::{EngineError, Volume};

/// Where the copy after the last revert stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyState {
    pub revert: Revert,
    /// Every block before this one is done.
    pub block_next: u64,
}

/// The background copy after a revert, for `rewind volume info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevertCopyStatus {
    /// The time of the revert being copied for.
    pub revert_at: Timestamp,
    /// Blocks looked at so far (every one before this is done)...
    pub blocks_done: u64,
    /// ...of the volume's blocks.
    pub blocks_total: u64,
}

/// Bytes of blocks looked at in one step (planned, read and checked
/// together; the most one journal record of the copy holds).
const STEP_BYTES: u64 = 8 << 20;
/// Bytes copied in one pass of the slow work at most: the copy yields to
/// the other volumes' history work, and the disk to clients, between passes.
const PASS_BYTES_MAX: u64 = 512 << 20;
/// Blocks looked at in one pass at most (each costs a current-store entry
/// read, and where it was changed an index lookup).
const PASS_BLOCKS_MAX: u64 = 1 << 20;

impl Volume {
    fn revert_copy_path(&self) -> String {
        format!("{}/revert-copy", self.dir)
    }

    /// Where the copy after the last revert starts on opening: where it was
    /// saved, or the first block if the last revert is another.
    pub(super) fn resume_revert_copy(&self) -> Result<(), EngineError> {
        let Some(revert) = self.reverts().last().copied().filter(|_| self.current.is_some()) else {
            return Ok(());
        };
        let path = self.revert_copy_path();
        let saved = match self.storage().exists(&path).map_err(EngineError::io(&path))? {
            false => None,
            true => {
                let bytes = read_file_healing(self.storage(), &path, rewind_format::meta::healed)
                    .map_err(EngineError::io(&path))?;
                let progress = RevertCopyProgress::decode(&bytes)
                    .map_err(|error| crate::volume::recovery::corrupt_file(&path, error))?;
                Some(progress)
            }
        };
        let block_next = saved.filter(|saved| saved.revert_at == revert.at).map_or(0, |saved| saved.block_next);
        if block_next < self.block_count() {
            *self.revert_copy.lock() = Some(CopyState { revert, block_next });
        }
        Ok(())
    }

    /// A revert was made: the copy starts for it (see `revert.rs`).
    pub(super) fn start_revert_copy(&self, revert: Revert) {
        if self.current.is_some() {
            *self.revert_copy.lock() = Some(CopyState { revert, block_next: 0 });
        }
    }

    /// The background copy after the last revert, if it is not finished.
    pub fn revert_copy_status(&self) -> Option<RevertCopyStatus> {
        self.revert_copy.lock().map(|state| RevertCopyStatus {
            revert_at: state.revert.at,
            blocks_done: state.block_next,
            blocks_total: self.block_count(),
        })
    }

    /// One pass of the copy (see the module documentation). Returns
    /// whether it copied anything.
    pub(crate) fn copy_after_revert(&self) -> Result<bool, EngineError> {
        let Some(_one_pass_at_a_time) = self.revert_copying.try_lock() else {
            return Ok(false);
        };
        let Some(CopyState { revert, mut block_next }) = *self.revert_copy.lock() else {
            return Ok(false);
        };
        // Views (which the copy reads) wait for recovery to finish.
        if !self.is_settled() || self.check_writable().is_err() {
            return Ok(false);
        }
        let block_count = self.block_count();
        let block_bytes = u64::from(self.block_size().bytes());
        let pass_end = block_count.min(block_next + PASS_BLOCKS_MAX);
        let mut copied_bytes = 0;
        let step_blocks = (STEP_BYTES / block_bytes).max(1);
        while block_next < pass_end && copied_bytes < PASS_BYTES_MAX {
            if self.closed.load(Ordering::Acquire) {
                // Being deleted, or the node is closing: the rest can wait.
                return Ok(copied_bytes > 0);
            }
            // Blocks never written read the same at every time: nothing to
            // copy (a thin terabyte was 256 passes of entries read).
            let step = step_blocks.min(block_count - block_next);
            let count = match self.look_ahead(block_next * block_bytes, block_count * block_bytes, step)? {
                Stretch::Unwritten(length) => {
                    block_next += length / block_bytes;
                    continue;
                }
                Stretch::Plan(_, count) => count,
            };
            match self.copy_step(&revert, BlockIndex(block_next), count)? {
                Some(blocks) => copied_bytes += blocks * block_bytes,
                // A newer revert came: the next pass starts over for it.
                None => return Ok(copied_bytes > 0),
            }
            block_next += count;
        }
        // The records are durable before the progress that counts on them.
        self.flush()?;
        let path = self.revert_copy_path();
        let progress = RevertCopyProgress { revert_at: revert.at, block_next };
        write_file_atomic(self.storage(), &path, &progress.encode()).map_err(EngineError::io(&path))?;
        let mut state = self.revert_copy.lock();
        if state.map(|state| state.revert) != Some(revert) {
            // A newer revert started the copy over meanwhile.
            return Ok(copied_bytes > 0);
        }
        *state = (block_next < block_count).then_some(CopyState { revert, block_next });
        if block_next == block_count {
            tracing::info!(
                volume = %self.name(), revert = %DisplayTime(revert.at),
                "the background copy after the revert is finished: the present reads from the current store again"
            );
        }
        Ok(copied_bytes > 0)
    }

    /// Copies what needs it among `count` blocks from `first`. Returns how
    /// many blocks it copied, or `None` if `revert` is no longer the last.
    fn copy_step(&self, revert: &Revert, first: BlockIndex, count: u64) -> Result<Option<u64>, EngineError> {
        let newest = self.planned_or_corrupt(|| self.plan_newest(None, OverlayAccess::Lock, first, count))?;
        if !newest.iter().any(|&(_, written)| written < revert.at) {
            return Ok(Some(0));
        }
        let then =
            self.planned_or_corrupt(|| self.plan(Some(revert.to), OverlayAccess::Lock, Copies::Read, first, count))?;
        let wanted: Vec<bool> = newest
            .iter()
            .zip(&then)
            .map(|(&(now, written), &then)| written < revert.at && then != now && then != Source::Base)
            .collect();
        if !wanted.contains(&true) {
            return Ok(Some(0));
        }
        // The point reverted to is pinned: what it reads cannot change.
        let block_bytes = self.block_size().bytes() as usize;
        let mut data = vec![0u8; count as usize * block_bytes];
        for run in runs(&wanted, |index| then[index] == Source::Zero) {
            if !run.zero {
                let offset = self.block_size().offset_of(BlockIndex(first.0 + run.start as u64));
                self.read_with(Some(revert.to), OverlayAccess::Lock, offset, &mut data[run.bytes(block_bytes)])?;
            }
        }
        self.check_room()?;
        // The destager held off, so that what the current store holds is
        // what this looks at until the records are in the overlay.
        let _no_destage = self.destage_lock();
        let mut state = self.write.lock();
        if self.reverts().last() != Some(revert) {
            return Ok(None);
        }
        let newest = match self.plan_newest(None, OverlayAccess::Held(&state), first, count)? {
            Ok(newest) => newest,
            Err(Mismatch(block)) => return Err(self.corrupt_current(block)),
        };
        // Written since the look above: newer than the revert, and kept.
        let wanted: Vec<bool> =
            wanted.iter().zip(&newest).map(|(&wanted, &(_, written))| wanted && written < revert.at).collect();
        let mut copied = 0;
        for run in runs(&wanted, |index| then[index] == Source::Zero) {
            self.append_copy_run(&mut state, revert, first, &run, &data[run.bytes(block_bytes)])?;
            copied += run.len() as u64;
        }
        self.counters.revert_blocks_copied.fetch_add(copied, Ordering::Relaxed);
        Ok(Some(copied))
    }

    /// Appends one run of the copy and puts its blocks in the overlay.
    fn append_copy_run(
        &self,
        state: &mut WriteState,
        revert: &Revert,
        first: BlockIndex,
        run: &Run,
        data: &[u8],
    ) -> Result<(), EngineError> {
        let block = BlockIndex(first.0 + run.start as u64);
        let block_bytes = self.block_size().bytes();
        let mut crcs = Vec::new();
        let appended = match run.zero {
            true => self.journal.append_revert_zero(revert.at, block, run.len() as u32),
            false => self.journal.append_revert_copy(revert.at, block, data, &mut crcs),
        };
        let appended = appended.map_err(|error| self.fail(error.into()))?;
        let versions: Vec<Version> = (0..run.len())
            .map(|index| Version {
                block: BlockIndex(block.0 + index as u64),
                timestamp: revert.at,
                data: match run.zero {
                    true => VersionData::Zero,
                    false => VersionData::Journal {
                        segment: appended.segment,
                        offset: appended.data_offset + index as u32 * block_bytes,
                    },
                },
                crc32c: crcs.get(index).copied().unwrap_or(self.zero_block_crc32c),
            })
            .collect();
        state.overlay.record(appended.lsn, &versions, true, self.journal.lsn_durable());
        self.note_overlay(&state.overlay);
        let record_bytes = rewind_format::journal::RECORD_HEADER_BYTES as u64
            + match run.zero {
                true => 0,
                false => (crcs.len() as u64 * 4).next_multiple_of(8) + data.len() as u64,
            };
        self.counters.journal_bytes_appended.fetch_add(record_bytes, Ordering::Relaxed);
        Ok(())
    }
}

/// A run of neighbouring blocks of one step that are copied alike.
struct Run {
    start: usize,
    end: usize,
    zero: bool,
}

impl Run {
    fn len(&self) -> usize {
        self.end - self.start
    }

    fn bytes(&self, block_bytes: usize) -> std::ops::Range<usize> {
        self.start * block_bytes..self.end * block_bytes
    }
}

/// The runs of `wanted` blocks, split where `zero` changes.
fn runs(wanted: &[bool], zero: impl Fn(usize) -> bool) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for index in (0..wanted.len()).filter(|&index| wanted[index]) {
        let zero = zero(index);
        match runs.last_mut() {
            Some(last) if last.end == index && last.zero == zero => last.end += 1,
            _ => runs.push(Run { start: index, end: index + 1, zero }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rewind_io::{SimConfig, SimStorage};
    use rewind_types::{BlockIndex, BlockSize, BookmarkName, Layout, Timestamp, VolumeName};

    use crate::volume::read::{Copies, OverlayAccess, Source};
    use crate::{Durability, EngineError, LayoutRules, Node, NodeConfig, Volume, VolumeSpec, Writers, ZeroMode};

    const BLOCK: u64 = 4096;
    const BLOCKS: u64 = 64;

    fn at(nanos: u64) -> Timestamp {
        Timestamp::from_unix_nanos(1_000_000 + nanos)
    }

    fn image(volume: &Volume) -> Vec<u8> {
        let mut image = vec![0; (BLOCKS * BLOCK) as usize];
        volume.read(0, &mut image).unwrap();
        image
    }

    fn view_image(volume: &Arc<Volume>, at: Timestamp) -> Vec<u8> {
        let mut image = vec![0; (BLOCKS * BLOCK) as usize];
        volume.view(at).unwrap().read(0, &mut image).unwrap();
        image
    }

    /// Where the present is read from, block by block.
    fn present_sources(volume: &Volume) -> Vec<Source> {
        volume.plan(None, OverlayAccess::Lock, Copies::Read, BlockIndex(0), BLOCKS).unwrap().ok().unwrap()
    }

    fn from_history(sources: &[Source]) -> usize {
        sources.iter().filter(|source| matches!(source, Source::Journal { .. } | Source::Chunk { .. })).count()
    }

    /// Runs the slow work until the copy after the revert is finished.
    fn copy_to_the_end(node: &Node, volume: &Volume, now: Timestamp) {
        for _ in 0..10 {
            if volume.revert_copy_status().is_none() {
                return;
            }
            node.maintain_history(now).unwrap();
        }
        panic!("the copy after the revert did not finish: {:?}", volume.revert_copy_status());
    }

    /// A volume in `layout`, written (`good`, bookmarked), overwritten in
    /// part (`bad`), reverted to `good`, and one block written after that.
    struct Reverted {
        storage: SimStorage,
        node: Node,
        volume: Arc<Volume>,
        good_at: Timestamp,
        before_revert: Timestamp,
        good: Vec<u8>,
        bad: Vec<u8>,
        /// The present: `good` but for the block written since the revert.
        expected: Vec<u8>,
    }

    fn reverted(layout: Layout) -> Reverted {
        let storage = SimStorage::new(SimConfig::default(), 5);
        let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
        let spec = VolumeSpec {
            layout,
            ..VolumeSpec::new(VolumeName::new("v").unwrap(), BLOCKS * BLOCK, BlockSize::new(4096).unwrap())
        };
        let volume = node.create_volume(spec, at(0)).unwrap();
        let good: Vec<u8> = (0..BLOCKS * BLOCK).map(|byte| (byte / BLOCK + 1) as u8).collect();
        volume.write(at(1_000), 0, &good, Durability::Fua).unwrap();
        volume.zero(at(1_001), 60 * BLOCK, 4 * BLOCK, ZeroMode::Deallocate, Durability::Fua).unwrap();
        let good_at = volume.create_bookmark(BookmarkName::new("good").unwrap(), None, at(2_000)).unwrap().timestamp;
        let good = image(&volume);
        volume.write(at(3_000), 0, &vec![0xee; 32 * BLOCK as usize], Durability::Fua).unwrap();
        volume.zero(at(3_001), 40 * BLOCK, 4 * BLOCK, ZeroMode::Deallocate, Durability::Fua).unwrap();
        volume.write(at(3_002), 60 * BLOCK, &vec![0xdd; 2 * BLOCK as usize], Durability::Fua).unwrap();
        node.checkpoint_all(at(4_000)).unwrap();
        let bad = image(&volume);

        let report = volume.revert(good_at, at(5_000), Writers::Refuse).unwrap();
        assert_eq!(image(&volume), good, "{}: reverted at once", layout.name());
        if volume.rules().has_current_store() {
            // 0..32 and 40..44; 60..62 were holes.
            assert_eq!(from_history(&present_sources(&volume)), 36, "{}: read through history", layout.name());
        }
        // A write after the revert, before the copy reaches it.
        volume.write(at(6_000), 3 * BLOCK, &vec![0x33; BLOCK as usize], Durability::Fua).unwrap();
        let mut expected = good.clone();
        expected[(3 * BLOCK) as usize..(4 * BLOCK) as usize].fill(0x33);
        Reverted { storage, node, volume, good_at, before_revert: report.revert.before, good, bad, expected }
    }

    impl Reverted {
        /// Every read, allocation status and comparison is as the model says.
        fn check(&self, volume: &Arc<Volume>, when: &str) {
            let name = volume.layout().name();
            assert_eq!(image(volume), self.expected, "{name} {when}: the present");
            assert_eq!(view_image(volume, self.good_at), self.good, "{name} {when}: the point reverted to");
            assert_eq!(view_image(volume, self.before_revert), self.bad, "{name} {when}: the future reverted away");
            let good_view = volume.view(self.good_at).unwrap();
            assert_eq!(
                volume.changed_ranges(&good_view, None).unwrap(),
                [(3 * BLOCK, BLOCK)],
                "{name} {when}: only the write since differs from the point reverted to"
            );
            let before = volume.view(self.before_revert).unwrap();
            assert_eq!(
                volume.changed_ranges(&before, None).unwrap(),
                [(0, 32 * BLOCK), (40 * BLOCK, 4 * BLOCK), (60 * BLOCK, 2 * BLOCK)],
                "{name} {when}: what the revert changed"
            );
            let mut status = volume.block_status(0, BLOCKS * BLOCK).unwrap();
            status.iter_mut().for_each(|extent| extent.zero = !extent.allocated);
            assert_eq!(status, good_view.block_status(0, BLOCKS * BLOCK).unwrap(), "{name} {when}: holes");
        }

        /// Power lost; the node opened again.
        fn crash(&mut self) {
            self.storage.crash();
            self.node = Node::open(Arc::new(self.storage.clone()), NodeConfig::default()).unwrap();
            self.volume = self.node.volume("v").unwrap();
        }
    }

    /// The copy after a revert of a thin volume passes over the blocks it
    /// never wrote without reading their entries: of 16,384 blocks, two
    /// written, it reads a few pages of the current store, copies back the
    /// block overwritten and zeros the one written since the point, and the
    /// present reads as that point.
    #[test]
    fn the_copy_after_a_revert_passes_over_blocks_never_written() {
        const THIN_BLOCKS: u64 = 16_384;
        let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 9)), NodeConfig::default()).unwrap();
        let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), THIN_BLOCKS * BLOCK, BlockSize::new(4096).unwrap());
        let volume = node.create_volume(spec, at(0)).unwrap();
        volume.write(at(1_000), 3 * BLOCK, &[0x11; BLOCK as usize], Durability::Fua).unwrap();
        let good_at = volume.create_bookmark(BookmarkName::new("good").unwrap(), None, at(2_000)).unwrap().timestamp;
        volume.write(at(3_000), 3 * BLOCK, &[0x22; BLOCK as usize], Durability::Fua).unwrap();
        volume.write(at(3_001), 10_000 * BLOCK, &[0x33; BLOCK as usize], Durability::Fua).unwrap();
        node.checkpoint_all(at(4_000)).unwrap();
        volume.revert(good_at, at(5_000), Writers::Refuse).unwrap();
        let read_before = volume.io_stats().current.read_bytes;
        copy_to_the_end(&node, &volume, at(7_000));
        let read = volume.io_stats().current.read_bytes - read_before;
        println!("{read} bytes of the current store read by the copy");
        assert_eq!(volume.stats().unwrap().revert_blocks_copied, 2, "block 3 copied back, block 10000 zeroed");
        assert!(read <= 64 << 10, "{read} bytes of the current store read to copy one block of {THIN_BLOCKS}");
        let mut block = vec![0u8; BLOCK as usize];
        volume.read(3 * BLOCK, &mut block).unwrap();
        assert!(block.iter().all(|&byte| byte == 0x11), "block 3 reads as at the point reverted to");
        volume.read(10_000 * BLOCK, &mut block).unwrap();
        assert!(block.iter().all(|&byte| byte == 0), "block 10000 was not written then");
    }

    /// In every layout: after a revert the present reads as the point
    /// reverted to at once; the copy then puts what was read through
    /// history back into the current store, through a crash, and no read
    /// of the present or of a view, no allocation status and no
    /// comparison of two points changes — but a write that came after the
    /// revert wins over the copy.
    #[test]
    fn the_copy_after_a_revert_brings_the_present_back_to_the_current_store_and_changes_no_read() {
        for layout in Layout::ALL {
            let mut case = reverted(layout);
            let has_current_store = case.volume.rules().has_current_store();
            copy_to_the_end(&case.node, &case.volume, at(7_000));
            let copied = case.volume.stats().unwrap().revert_blocks_copied;
            // 0..32 but the block written since, 40..44 and 60..62 (zeros).
            assert_eq!(copied, if has_current_store { 37 } else { 0 }, "{}", layout.name());
            case.check(&case.volume, "after the copy");
            // Before any checkpoint: recovery applies the copy again.
            case.crash();
            assert_eq!(case.volume.revert_copy_status(), None, "{}: the copy was finished", layout.name());
            case.node.checkpoint_all(at(8_000)).unwrap();
            if has_current_store {
                let sources = present_sources(&case.volume);
                assert_eq!(from_history(&sources), 0, "{}: the present is in the current store", layout.name());
            }
            case.check(&case.volume, "after a crash");
            // The journal ends with the copy's records, which the index
            // does not take: the checkpoint says they need no replay.
            case.crash();
            case.check(&case.volume, "after a checkpoint and a crash");
        }
    }

    /// A full disk stops the copy as it stops writes: an error of the pass,
    /// no poison, every read still right; once space is back it finishes.
    #[test]
    fn a_full_disk_pauses_the_copy_without_poisoning_the_volume() {
        let case = reverted(Layout::Journaled);
        case.storage.set_capacity(Some(case.storage.used_bytes()));
        let refused = case.volume.copy_after_revert();
        assert!(refused.as_ref().is_err_and(EngineError::is_transient), "{refused:?}");
        assert!(case.volume.revert_copy_status().is_some(), "the copy cannot have finished on a full disk");
        assert!(!case.volume.is_poisoned(), "a full disk is not a reason to poison the volume");
        case.check(&case.volume, "with the disk full");
        case.storage.set_capacity(None);
        copy_to_the_end(&case.node, &case.volume, at(8_000));
        case.node.checkpoint_all(at(9_000)).unwrap();
        assert_eq!(from_history(&present_sources(&case.volume)), 0);
        case.check(&case.volume, "after space came back");
    }

    /// Power lost at every moment of the copy's pass and of the checkpoint
    /// that destages it (each change to the disk in turn is the last):
    /// after the restart the copy goes on from what it saved, and nothing
    /// reads differently at any point.
    #[test]
    fn power_lost_at_any_moment_of_the_copy_changes_no_read() {
        for layout in Layout::ALL.into_iter().filter(|&layout| LayoutRules::of(layout).has_current_store()) {
            for changes in 0.. {
                let mut case = reverted(layout);
                case.storage.stop_after(changes);
                // Fails (and poisons the volume) where the disk stops: in
                // the pass, or in the checkpoint that destages what it copied.
                let finished = case.node.maintain_history(at(7_000)).is_ok()
                    && case.node.checkpoint_all(at(7_500)).is_ok()
                    && !case.storage.is_stopped();
                case.crash();
                case.check(&case.volume, &format!("after power was lost at change {changes}"));
                copy_to_the_end(&case.node, &case.volume, at(8_000));
                case.node.checkpoint_all(at(9_000)).unwrap();
                assert_eq!(from_history(&present_sources(&case.volume)), 0, "{}", layout.name());
                case.check(&case.volume, &format!("after the copy, power lost at change {changes}"));
                if finished {
                    println!("{}: power lost at each of {changes} changes of the copy", layout.name());
                    break;
                }
            }
        }
    }
}
