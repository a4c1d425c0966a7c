//! Destaging: the newest durable versions in the overlay go to the current
//! store, as the layout's rules say when (continuously, as the controller
//! cache lets go, at snapshots) and which (the newest, or every version let
//! go), after history has been filed from them where the layout files it at
//! destage (`copy.rs`). Only durable journal records are ever applied.

use super::gather::{JournalGather, GATHER_BYTES_MAX};
use super::overlay::DestagePlan;
pub(super) use super::overlay::Leaving;
use super::*;

/// Whether `apply_to_current` retires what it writes as it goes: the
/// newest versions do; the older ones a layout writes first do not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retire {
    No,
    PartByPart,
}

/// A writer at the overlay's limit destages this share of it when no pass
/// is under way: at the default limit (2^20 versions), 2,048 blocks, a
/// short part's worth of 4 KiB blocks (`SHORT_PART_BYTES`).
const WRITER_SLICE_SHARE: usize = 512;

/// Near the overlay's limit, where writers wait for a pass's next part
/// (`make_room`), a pass takes its parts this long instead of
/// `GATHER_BYTES_MAX`. In an 8 GiB pass of 1 MiB writes (past the limit)
/// the worst write waited 78–127 ms against 199–280 ms with 32 MiB parts;
/// but short parts destage random writes 1.2 times slower, so a pass away
/// from the limit (catching up after a burst) keeps the long ones.
const SHORT_PART_BYTES: usize = 8 << 20;

/// From this share of the overlay's limit (7/8), a pass takes short parts.
const SHORT_PARTS_FROM_EIGHTHS: usize = 7;

/// A pass sweeps the overlay in block order only while it holds at least
/// one block in this many of the volume (see `Volume::destage_from_front`):
/// sparser, a part's blocks are seldom neighbours, and the sweep would look
/// at many blocks for each it takes (`SWEEP_LOOKS_PER_BLOCK` bounds that).
const SWEEP_ONE_BLOCK_IN: u64 = 8;

/// The share a background pass in a burst takes (see
/// `Volume::leaving_while_written`): writers at the limit wait for a part
/// of it, not all.
pub(super) const BURST_SLICE_SHARE: usize = 16;

pub(crate) struct DestageState {
    /// Every durable record up to this LSN is in the current store, or
    /// superseded by a later durable record that a pass (or recovery)
    /// applies.
    pub lsn_applied: Lsn,
    /// The block a pass sweeping the overlay in block order goes on from
    /// (see `Volume::destage_from_front`).
    pub sweep_next: u64,
}

/// The destage lock, held. Letting it go wakes the writers waiting for
/// room (`Volume::make_room`): one that found it taken waits to be woken,
/// and whoever held it — a pass, a checkpoint syncing the current store, a
/// read checking a block again — must wake it, or it sleeps until some
/// later pass, for good where no pass comes (a closed volume, a ROW
/// volume inside its window).
pub(super) struct DestageHeld<'a> {
    volume: &'a Volume,
    /// Always `Some` until dropped: taken out so the lock is let go before
    /// the writers are woken.
    state: Option<parking_lot::MutexGuard<'a, DestageState>>,
}

impl std::ops::Deref for DestageHeld<'_> {
    type Target = DestageState;
    fn deref(&self) -> &DestageState {
        self.state.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for DestageHeld<'_> {
    fn deref_mut(&mut self) -> &mut DestageState {
        self.state.as_mut().expect("held until dropped")
    }
}

impl Drop for DestageHeld<'_> {
    fn drop(&mut self) {
        drop(self.state.take());
        self.volume.room_made();
    }
}

/// The share of the controller cache's pages that may be dirty (IBM §4.1).
pub(super) const CACHE_DIRTY_FRACTION: f64 = 0.03;

/// `versions` (several per block, oldest first) as rounds of at most one per
/// block, sorted by block: the order in which they may be written.
pub(super) fn waves(versions: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut rounds: Vec<Vec<Pending>> = Vec::new();
    let mut seen: FxHashMap<u64, usize> = FxHashMap::default();
    for pending in versions {
        let round = seen.entry(pending.version.block.0).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(pending);
        *round += 1;
    }
    for round in &mut rounds {
        round.sort_unstable_by_key(|pending| pending.version.block);
    }
    rounds
}

impl Volume {
    /// Takes the destage lock: no pass runs, and none writes the current
    /// store, until it is dropped.
    pub(super) fn destage_lock(&self) -> DestageHeld<'_> {
        DestageHeld { volume: self, state: Some(self.destage.lock()) }
    }

    fn destage_try_lock(&self) -> Option<DestageHeld<'_>> {
        Some(DestageHeld { volume: self, state: Some(self.destage.try_lock()?) })
    }

    /// Copies the newest durable version of every overlay block into the
    /// current store and retires what it copied.
    pub(crate) fn destage_durable(&self) -> Result<(), EngineError> {
        self.destage(Leaving::Durable)
    }

    /// The blocks a pass takes while writes go on (a burst): where the
    /// overlay absorbs overwrites, a slice of the least recently written,
    /// `1 / share` of the overlay's limit; elsewhere every durable block.
    pub(super) fn leaving_while_written(&self, share: usize) -> Leaving {
        match self.rules().overlay_absorbs_overwrites() {
            true => Leaving::Oldest((self.config.overlay_versions_max / share).max(1)),
            false => Leaving::Durable,
        }
    }

    /// Backpressure at the overlay's limit. A pass under way retires what
    /// it destaged part by part, so the writer waits for its next part, not
    /// for all of it (a checkpoint's pass in a burst takes seconds); with no
    /// pass under way, the writer commits the journal and destages a slice
    /// itself, a part's worth (`WRITER_SLICE_SHARE`), so its wait stays as
    /// short.
    pub(super) fn make_room(&self) -> Result<(), EngineError> {
        let mut room = self.room.lock();
        while self.overlay_held.load(Ordering::Relaxed) >= self.config.overlay_versions_max {
            if let Some(mut destage) = self.destage_try_lock() {
                drop(room);
                // Only durable versions are destaged; letting the lock go
                // wakes the other writers waiting.
                return self
                    .flush()
                    .and_then(|()| self.destage_locked(&mut destage, self.leaving_while_written(WRITER_SLICE_SHARE)));
            }
            // Woken by the pass's next part, or when the lock is let go.
            self.writers_waiting_for_room.fetch_add(1, Ordering::Relaxed);
            self.room_made.wait(&mut room);
            self.writers_waiting_for_room.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Wakes the writers waiting for room: a part was retired, or the
    /// destage lock let go. Taking `room` first means none is between its
    /// check and its wait.
    fn room_made(&self) {
        let _room = self.room.lock();
        self.room_made.notify_all();
    }

    /// Destages as [`Volume::destage_durable`] does, but only the blocks
    /// `leaving` names: those the controller cache has let go (the least
    /// recently written beyond its dirty limit), so overwrites of the
    /// blocks it keeps are absorbed; or those not rewritten since a
    /// checkpoint's cut; or a slice of the least recently written.
    pub(super) fn destage(&self, leaving: Leaving) -> Result<(), EngineError> {
        self.destage_locked(&mut self.destage_lock(), leaving)
    }

    /// Where the overlay absorbs overwrites, a pass after a burst (see
    /// `Volume::maintain`): the blocks not rewritten since `cut` (every
    /// durable one without it), a part at a time, stopping between parts
    /// once small reads follow the burst (`reads_hold_destaging`, at `now`
    /// with the reads seen since). Returns whether it took them all; the
    /// next pass goes on from where it stopped.
    pub(super) fn destage_unless_read(&self, cut: Option<Lsn>, now: Timestamp) -> Result<bool, EngineError> {
        assert!(self.rules().overlay_absorbs_overwrites(), "only an absorbing overlay is destaged from its front");
        let mut destage = self.destage_lock();
        let lsn_durable = self.journal.lsn_durable();
        let cut = cut.map_or(lsn_durable, |cut| cut.min(lsn_durable));
        let count = GATHER_BYTES_MAX / self.meta.block_size.bytes() as usize;
        for part in 0.. {
            // No pass is under way: the destage lock is held.
            if !self.write.lock().overlay.holds_through(cut) {
                return Ok(true);
            }
            if self.reads_hold_destaging(now) {
                if part > 0 {
                    self.counters.destage_stops.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(false);
            }
            self.destage_locked(&mut destage, Leaving::NotRewrittenSince { cut, count })?;
        }
        unreachable!("a pass ends")
    }

    fn destage_locked(&self, destage: &mut DestageState, leaving: Leaving) -> Result<(), EngineError> {
        let (lsn_durable, _) = self.journal.durable_point();
        if self.current.is_none() {
            // Logging: the index is the present; nothing is destaged.
            destage.lsn_applied = destage.lsn_applied.max(lsn_durable);
            self.journal.forget_written(destage.lsn_applied);
            return Ok(());
        }
        if destage.lsn_applied >= lsn_durable && self.overlay_versions.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        // One buffer for the pass's parts: a fresh 32 MiB per part is zeroed
        // and faulted in again (a tenth of the destager's samples in one
        // profile; none in another, where the allocator kept its pages).
        let mut gather = JournalGather::default();
        let through = match self.rules().overlay_absorbs_overwrites() {
            true => self.destage_from_front(lsn_durable, leaving, &mut destage.sweep_next, &mut gather)?,
            false => {
                let DestagePlan { newest, chains, through } =
                    self.write.lock().overlay.plan_destage(lsn_durable, leaving, self.rules().history_at_destage());
                let let_go = self.file_history(&chains).map_err(|error| self.fail(error))?;
                if self.rules().current_writes == CurrentWrites::EveryVersionLetGo {
                    // Every version let go goes down to the current store too, in order.
                    for wave in waves(let_go) {
                        self.apply_to_current(&wave, Retire::No, &mut gather).map_err(|error| self.fail(error))?;
                    }
                }
                // Retired part by part while `destage` is held, so no other
                // pass (a bookmark's merge, a writer's backpressure) applies
                // or files them again, and writers waiting for room go on
                // after a part.
                self.apply_to_current(&newest, Retire::PartByPart, &mut gather).map_err(|error| self.fail(error))?;
                through
            }
        };
        if let Some(applied_through) = through {
            destage.lsn_applied = destage.lsn_applied.max(applied_through);
            self.journal.forget_written(destage.lsn_applied);
        }
        Ok(())
    }

    /// A pass where the overlay absorbs overwrites: its blocks taken from
    /// the front of the recency queue a part at a time (`plan_front`), so
    /// the write lock is held to plan a part, not the pass — a checkpoint's
    /// pass takes hundreds of thousands of blocks, whose plan held every
    /// writer 40–90 ms — and each part retired once written. Returns the
    /// LSN through which every durable version left or is superseded.
    ///
    /// Once what is left covers much of the volume (what a burst of random
    /// writes leaves), a pass that takes every block up to its bound
    /// sweeps the overlay in block order instead (`plan_sweep`, going on
    /// from `sweep_next`): a part from the front holds the blocks one
    /// stretch of the burst wrote, one in 32 of a 1 GiB volume after random
    /// writes, each a write and a writeback of its own into the current
    /// store, where a part of the sweep writes runs of neighbours. Its
    /// blocks lie all over the journal: those in memory are copies, and
    /// the gather's readers fetch the others from the disk many at once.
    fn destage_from_front(
        &self,
        lsn_durable: Lsn,
        leaving: Leaving,
        sweep_next: &mut u64,
        gather: &mut JournalGather,
    ) -> Result<Option<Lsn>, EngineError> {
        let (bound, mut left, may_sweep) = match leaving {
            Leaving::Durable => (lsn_durable, usize::MAX, true),
            Leaving::NotRewrittenSince { cut, count } => (cut.min(lsn_durable), count, true),
            // Slices in a burst: the least recently written go first.
            Leaving::Oldest(count) => (lsn_durable, count, false),
            Leaving::LetGo => unreachable!("a controller cache decides what it absorbs"),
        };
        let blocks_total = self.meta.size_bytes / u64::from(self.meta.block_size.bytes());
        let mut through = None;
        loop {
            let near_limit = self.overlay_held.load(Ordering::Relaxed)
                >= self.config.overlay_versions_max / 8 * SHORT_PARTS_FROM_EIGHTHS;
            let part_bytes = if near_limit { SHORT_PART_BYTES } else { GATHER_BYTES_MAX };
            let take = left.min(part_bytes / self.meta.block_size.bytes() as usize);
            let (plan, swept) = {
                let mut state = self.write.lock();
                let overlay = &mut state.overlay;
                let sweeps = may_sweep
                    && overlay.blocks() as u64 * SWEEP_ONE_BLOCK_IN >= blocks_total
                    && overlay.oldest().is_some_and(|oldest| oldest.lsn <= bound);
                match sweeps {
                    true => {
                        *sweep_next %= blocks_total;
                        let plan = overlay.plan_sweep((lsn_durable, bound), take, (sweep_next, blocks_total));
                        (plan, true)
                    }
                    false => (overlay.plan_front(lsn_durable, bound, take), false),
                }
            };
            assert!(plan.chains.is_empty(), "history is filed as it is written");
            if let Err(error) = self.apply_to_current(&plan.newest, Retire::PartByPart, gather) {
                // A part of the sweep took nothing out of the queue.
                if !swept {
                    self.write.lock().overlay.requeue(&plan.newest);
                }
                return Err(self.fail(error));
            }
            left -= plan.newest.len();
            through = through.max(plan.through);
            if swept && !self.write.lock().overlay.holds_through(bound) {
                through = Some(bound);
            }
            // A part from the front stopped short of `bound` only with a
            // part's worth taken.
            if through == Some(bound) || left == 0 {
                return Ok(through);
            }
        }
    }

    /// Writes `versions` (at most one per block) to the current store:
    /// their journal bytes read part by part in journal order (a random
    /// write's neighbours in the journal are other blocks of the same
    /// pass), each part written in block order, neighbours together.
    fn apply_to_current(
        &self,
        versions: &[Pending],
        retire: Retire,
        gather: &mut JournalGather,
    ) -> Result<(), EngineError> {
        let block_bytes = self.meta.block_size.bytes() as usize;
        let (zeros, mut data): (Vec<&Pending>, Vec<&Pending>) =
            versions.iter().partition(|pending| pending.version.data == VersionData::Zero);
        let mut staging = Vec::new();
        self.write_runs(&zeros, None, &mut staging)?;
        if retire == Retire::PartByPart {
            self.retire(&zeros);
        }
        data.sort_unstable_by_key(|pending| match pending.version.data {
            VersionData::Journal { segment, offset } => (segment, offset),
            _ => unreachable!("the overlay holds versions in the journal"),
        });
        for part in data.chunks_mut(GATHER_BYTES_MAX / block_bytes) {
            part.sort_unstable_by_key(|pending| pending.version.block);
            gather.read(&self.journal, part.iter().map(|pending| pending.version.data), block_bytes)?;
            for (at, pending) in part.iter().enumerate() {
                self.check_version_bytes(&pending.version, gather.block(at), "the journal", "being destaged")?;
            }
            self.write_runs(part, Some(gather), &mut staging)?;
            gather.let_go();
            self.current.as_ref().expect("destaged into a current store").write_behind()?;
            if retire == Retire::PartByPart {
                self.retire(part);
            }
        }
        Ok(())
    }

    /// Takes `applied` (each its block's newest version written to the
    /// current store) and what it supersedes out of the overlay.
    fn retire(&self, applied: &[&Pending]) {
        if applied.is_empty() {
            return;
        }
        let applied: Vec<Pending> = applied.iter().map(|&&pending| pending).collect();
        let mut state = self.write.lock();
        state.overlay.retire(&applied);
        self.note_overlay(&state.overlay);
        drop(state);
        self.room_made();
    }

    /// Writes `versions` (sorted by block; with `data`, their blocks
    /// gathered in the same order, otherwise zeros) to the current store, a
    /// run of neighbouring blocks at a time.
    fn write_runs(
        &self,
        versions: &[&Pending],
        data: Option<&JournalGather>,
        staging: &mut Vec<u8>,
    ) -> Result<(), EngineError> {
        const RUN_BLOCKS_MAX: usize = 2048;
        let current = self.current.as_ref().expect("only layouts with a current store have an overlay");
        let mut metas = Vec::new();
        let mut start = 0;
        while start < versions.len() {
            let mut end = start + 1;
            while end < versions.len()
                && end - start < RUN_BLOCKS_MAX
                && versions[end].version.block.0 == versions[end - 1].version.block.0 + 1
            {
                end += 1;
            }
            let run = &versions[start..end];
            metas.clear();
            metas.extend(run.iter().map(|pending| BlockMeta {
                state: match data {
                    None => BlockState::Zero,
                    Some(_) => BlockState::Data,
                },
                crc32c: pending.version.crc32c,
                timestamp: pending.version.timestamp,
            }));
            let first = run[0].version.block;
            match data {
                None => current.zero_blocks(first, &metas)?,
                Some(data) => current.write_block_stretches(first, &data.stretches(start..end), &metas, staging)?,
            }
            start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use rewind_io::{SimConfig, SimStorage};
    use rewind_types::{BlockSize, VolumeName};

    use crate::{Durability, Node, NodeConfig, Timestamp, VolumeSpec};

    /// A writer at the overlay's limit that finds the destage lock taken
    /// waits to be woken; here the holder is not a pass (a read checking a
    /// block again, a checkpoint syncing the current store: the test), and
    /// no pass comes after it, so only letting the lock go can wake it.
    #[test]
    fn a_writer_waiting_for_room_is_woken_when_the_destage_lock_is_let_go() {
        let storage = SimStorage::new(SimConfig::default(), 1);
        let mut config = NodeConfig::default();
        config.volume.overlay_versions_max = 8;
        let node = Node::open(Arc::new(storage), config).unwrap();
        let at = |micros: u64| Timestamp::from_unix_nanos(1_000_000_000_000 + micros * 1_000);
        let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
        let volume = node.create_volume(spec, at(0)).unwrap();
        for block in 0..8 {
            volume.write(at(block + 1), block * 4096, &[1; 4096], Durability::Buffered).unwrap();
        }
        assert_eq!(volume.stats().unwrap().versions_pending_destage, 8, "the overlay is at its limit");

        let held = volume.destage_lock();
        let (sender, receiver) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| sender.send(volume.write(at(9), 8 * 4096, &[2; 4096], Durability::Buffered)).unwrap());
            // Looked at every millisecond for 30 s at most (the core reads
            // no clock, its tests included).
            let mut looks = 0;
            while volume.writers_waiting_for_room.load(Ordering::Relaxed) == 0 {
                looks += 1;
                assert!(looks < 30_000, "the writer never waited for room");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(volume.stats().unwrap().writers_waiting_for_room, 1);
            drop(held);
            // A deadline for the failure only: success arrives on the channel.
            let written = receiver.recv_timeout(Duration::from_secs(10));
            if written.is_err() {
                // A pass that retires a part wakes it, so that the scope can
                // end and the test fail.
                volume.flush().unwrap();
                volume.destage_durable().unwrap();
            }
            written.expect("the writer slept on after the destage lock was let go").unwrap();
        });
        assert_eq!(volume.stats().unwrap().writers_waiting_for_room, 0);
    }
}
