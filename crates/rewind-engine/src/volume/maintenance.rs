//! A volume's background work, run when the embedder calls it: commits that
//! are due, the vouch record after a quiet spell, destaging, index seals and
//! checkpoints (`maintain`, often); merges, retention, the space cap and
//! archiving (`maintain_history`, on a thread of its own). Transient faults
//! (a full disk, no descriptors) are noted here and retried by themselves;
//! everything else poisons the volume (`Volume::fail`).

use super::destage::Leaving;
use super::*;

pub(crate) struct MaintenanceState {
    /// The durable LSN maintenance last saw, and since when it has not moved.
    quiet: (Lsn, Timestamp),
    checkpoint_last: Timestamp,
    checkpoint_lsn: Lsn,
    checkpoint_journal_bytes: u64,
    /// ROW: when the redirected blocks were last merged into the current store.
    merged_at: Timestamp,
    /// Recovery starts in this journal segment: the ones before it may be
    /// reclaimed once their history is archived.
    pub replay_segment: u32,
    /// The point the last checkpoint was taken at (its LSN, where the next
    /// record starts, its time): where the next one that leaves a hot set
    /// behind cuts (see `Volume::checkpoint_leaving`).
    cut_next: Checkpoint,
}

/// Reads of less than this on average are small (see
/// `Volume::reads_hold_destaging`): a random 4 KiB read, not the 256 KiB
/// to 2 MiB a sequential copy asks for at a time.
const SMALL_READ_BYTES: u64 = 64 << 10;

/// How long one round of the node's work on history spends on a volume's
/// work done only when it is idle (laying out bookmarks, writing the
/// journal's spares) before it goes on to the other volumes (the work goes
/// on at the next round, a second later in `rewind serve`): a volume with
/// many terabytes written takes hours to lay out, and the other volumes'
/// archive passes must not wait that long.
pub(crate) const IDLE_WORK_SLICE_NANOS: u64 = 500_000_000;

/// When the slow work on history last ran.
pub(crate) struct HistoryWork {
    pub archive_last: Timestamp,
    space_checked: Timestamp,
}

/// A transient failure of a volume's work, for `rewind volume info` and
/// for logging it once rather than at every retry.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub what: String,
    pub since: Timestamp,
    /// Only this work succeeding clears it: the others succeed around it
    /// (the journal's write-out every few milliseconds while destaging
    /// fails for a full disk).
    work: Work,
}

/// The kinds of a volume's background work, each on a thread of its own
/// in `rewind serve` (see `Node::maintain`, `Node::write_out_journals`,
/// `Node::maintain_history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    Maintenance,
    JournalWriteOut,
    History,
}

pub(crate) fn write_checkpoint(storage: &dyn Storage, dir: &str, checkpoint: &Checkpoint) -> Result<(), EngineError> {
    let path = format!("{dir}/checkpoint");
    write_file_atomic(storage, &path, &checkpoint.encode()).map_err(EngineError::io(&path))
}

impl MaintenanceState {
    /// The state of a volume just opened at `checkpoint`.
    pub(super) fn after(checkpoint: &Checkpoint) -> MaintenanceState {
        MaintenanceState {
            quiet: (Lsn::ZERO, checkpoint.timestamp_last),
            checkpoint_last: checkpoint.timestamp_last,
            checkpoint_lsn: checkpoint.lsn,
            checkpoint_journal_bytes: 0,
            merged_at: checkpoint.timestamp_last,
            replay_segment: checkpoint.replay_from.segment,
            cut_next: *checkpoint,
        }
    }
}

impl HistoryWork {
    pub(super) fn after(checkpoint: &Checkpoint) -> HistoryWork {
        HistoryWork { archive_last: checkpoint.timestamp_last, space_checked: checkpoint.timestamp_last }
    }
}

impl Volume {
    /// Background work, called periodically by the embedder: commits buffered
    /// writes, destages, writes and merges index runs, checkpoints. Returns
    /// whether it did anything.
    pub fn maintain(&self, now: Timestamp) -> Result<bool, EngineError> {
        let mut maintenance = self.maintenance.lock();
        if self.closed.load(Ordering::Acquire) || self.is_poisoned() {
            return Ok(false);
        }
        // Embedders without a journal writer of its own (`Node::write_out_journals`).
        let mut worked = self.write_out_journal(now)?;
        worked |= self.vouch_when_quiet(&mut maintenance, now)?;
        let merge_due = self.merge_due(&maintenance, now);
        let in_burst = self.in_burst(now);
        let overlay_versions = self.overlay_versions.load(Ordering::Relaxed);
        let destage_waits =
            in_burst && self.overlay_held.load(Ordering::Relaxed) < self.config.overlay_versions_max / 2;
        let leaves_hot_set = self.rules().overlay_absorbs_overwrites();
        if overlay_versions > 0 && merge_due && !destage_waits {
            let before = self.overlay_versions.load(Ordering::Relaxed);
            match (self.rules().has_controller_cache(), in_burst) {
                (true, _) => self.destage(Leaving::LetGo)?,
                (false, true) => self.destage(self.leaving_while_written(super::destage::BURST_SLICE_SHARE))?,
                // What a burst left, unless small reads come (and then later).
                (false, false) if leaves_hot_set => _ = self.destage_unless_read(None, now)?,
                (false, false) => self.destage(Leaving::Durable)?,
            }
            maintenance.merged_at = now;
            worked |= self.overlay_versions.load(Ordering::Relaxed) < before;
        }
        if self.index.active_len() >= self.config.memtable_versions_max {
            self.index.seal();
        }
        worked |= self.persist_index(self.journal.lsn_durable())? > 0;
        let lsn_last = Lsn(self.journal.lsn_next().0 - 1);
        let journal_bytes = self.counters.journal_bytes_appended.load(Ordering::Relaxed);
        let since = now.unix_nanos().saturating_sub(maintenance.checkpoint_last.unix_nanos());
        // A checkpoint destages everything: in ROW, a merge, so only at a
        // snapshot, unless the journal since the last one grows too long;
        // in a burst, only once it has grown twice as long. Where the
        // overlay absorbs overwrites it leaves the blocks rewritten since
        // the last one behind, so it need not wait for a burst, and
        // recovery replays at most twice `checkpoint_journal_bytes` of
        // journal, as after a burst elsewhere.
        let journal_since = journal_bytes - maintenance.checkpoint_journal_bytes;
        // At rest — destaged, neither written nor read — while recovery
        // would replay from a segment before the journal's current one (a
        // burst since the last checkpoint, or a fuzzy one that left blocks
        // behind and so replays from its cut): it costs little then (nothing
        // to destage, nothing left behind), and lets the journal give those
        // segments back, or keep them as spares for the next burst, now
        // rather than at the next interval with writes.
        let replay_behind = maintenance.replay_segment < self.journal.position_next().segment;
        let at_rest =
            replay_behind && self.overlay_versions.load(Ordering::Relaxed) == 0 && !self.foreground_active(now);
        let due = if in_burst && !leaves_hot_set {
            journal_since >= 2 * self.config.checkpoint_journal_bytes
        } else {
            (since >= self.config.checkpoint_interval_nanos && merge_due)
                || journal_since >= self.config.checkpoint_journal_bytes
                || (at_rest && merge_due)
        };
        // Where it leaves a hot set, what the checkpoint destages goes first,
        // a part at a time, so that small reads right after a burst stop it
        // (`destage_unless_read`): one that became due between a burst's
        // last write and the reads' first took their speed for as long as
        // it lasted (BENCHMARKS.md). It is taken once nothing is left
        // before its cut.
        if (lsn_last > maintenance.checkpoint_lsn || at_rest)
            && due
            && (!leaves_hot_set || self.destage_unless_read(Some(maintenance.cut_next.lsn), now)?)
        {
            drop(maintenance);
            self.checkpoint_leaving(now, leaves_hot_set)?;
            let replay_segment = self.maintenance.lock().replay_segment;
            self.reclaim_journal(replay_segment, now)?;
            worked = true;
        }
        Ok(worked)
    }

    /// Has the journal vouch for its last records once nothing has been
    /// made durable for `vouch_after_nanos` (see `rewind_journal`): damage
    /// to an acknowledged write is then told from a torn one after a crash.
    fn vouch_when_quiet(&self, maintenance: &mut MaintenanceState, now: Timestamp) -> Result<bool, EngineError> {
        let lsn_durable = self.journal.lsn_durable();
        if maintenance.quiet.0 != lsn_durable {
            maintenance.quiet = (lsn_durable, now);
            return Ok(false);
        }
        let quiet_nanos = now.unix_nanos().saturating_sub(maintenance.quiet.1.unix_nanos());
        if self.config.vouch_after_nanos == 0 || quiet_nanos < self.config.vouch_after_nanos {
            return Ok(false);
        }
        self.journal.vouch().map_err(|error| self.fail(error.into()))
    }

    /// Whether the volume has been written within `burst_quiet_nanos` of
    /// `now`: background work then waits, within its budgets, so the burst
    /// has the disk (see `VolumeConfig::burst_quiet_nanos`).
    pub(crate) fn in_burst(&self, now: Timestamp) -> bool {
        self.note_reads(now);
        let written_at = self.written_at_nanos.load(Ordering::Relaxed);
        let quiet = self.config.burst_quiet_nanos;
        quiet > 0 && written_at > 0 && now.unix_nanos().saturating_sub(written_at) < quiet
    }

    /// Whether the volume is written or read now: within `burst_quiet_nanos`
    /// of `now` (never, where that is 0).
    pub(crate) fn foreground_active(&self, now: Timestamp) -> bool {
        let quiet = self.config.burst_quiet_nanos;
        let read_at = self.note_reads(now);
        let reading = quiet > 0 && read_at > 0 && now.unix_nanos().saturating_sub(read_at) < quiet;
        reading || self.in_burst(now)
    }

    /// Whether the work done only when the volume is idle (laying out
    /// bookmarks, writing the journal's spares) waits: for writes or reads
    /// of the volume (within `burst_quiet_nanos`), for other work waiting
    /// for the node's passes to end, or because the volume closes.
    pub(crate) fn idle_work_waits(&self, now: Timestamp) -> bool {
        self.foreground_active(now) || self.passes_wanted.any() || self.closed.load(Ordering::Acquire)
    }

    /// Whether the volume is read right after a burst of writes (see
    /// `VolumeConfig::burst_reads_nanos`): read within `burst_quiet_nanos`
    /// of `now` and written within `burst_reads_nanos` (but not within the
    /// burst: then `in_burst` rules). Background work that such reads keep
    /// waiting costs no room while it waits: reads add no history, and a
    /// write ends it.
    pub(crate) fn reads_after_burst(&self, now: Timestamp) -> bool {
        let read_at = self.note_reads(now);
        let written_at = self.written_at_nanos.load(Ordering::Relaxed);
        let quiet = self.config.burst_quiet_nanos;
        if quiet == 0 || written_at == 0 || read_at == 0 {
            return false;
        }
        let since_write = now.unix_nanos().saturating_sub(written_at);
        let reading = now.unix_nanos().saturating_sub(read_at) < quiet;
        reading && since_write >= quiet && since_write < self.config.burst_reads_nanos
    }

    /// Whether reads right after a burst keep destaging waiting, where the
    /// overlay absorbs overwrites: while they are small (the reads seen
    /// last took less than `SMALL_READ_BYTES` each). A small read costs the
    /// same from the journal as from the current store, so destaging does
    /// nothing for it and takes a core and the disk from it (random reads
    /// right after the write jobs ran at 0.64 of rested while a checkpoint
    /// destaged what the burst left, 0.90 held: BENCHMARKS.md). Large reads
    /// let it go on: a copy of blocks a random burst scattered through the
    /// journal reads them at a third of its rested speed, destaged beside
    /// it or not (0.32 and 0.35 in 10 s), and only once they are back in
    /// block order in the current store at full speed, so a long one wants
    /// them there soon. The overlay does not grow meanwhile: a write ends it.
    pub(crate) fn reads_hold_destaging(&self, now: Timestamp) -> bool {
        self.rules().overlay_absorbs_overwrites()
            && self.reads_after_burst(now)
            && self.reads_small.load(Ordering::Relaxed)
    }

    /// The history waiting for the archiver, in bytes.
    pub(crate) fn history_waiting_bytes(&self) -> u64 {
        self.index.versions_unarchived() * u64::from(self.block_size().bytes())
    }

    /// When the volume was last seen read (unix nanoseconds; 0: not since
    /// its last write). Reads are seen by their count moving between calls,
    /// which maintenance makes on every pass; and whether those seen last
    /// were small, by the bytes they read (`reads_hold_destaging`).
    fn note_reads(&self, now: Timestamp) -> u64 {
        let reads = self.counters.reads.load(Ordering::Relaxed);
        let read_bytes = self.counters.read_bytes.load(Ordering::Relaxed);
        let reads_new = reads.wrapping_sub(self.reads_seen.swap(reads, Ordering::Relaxed));
        let bytes_new = read_bytes.wrapping_sub(self.read_bytes_seen.swap(read_bytes, Ordering::Relaxed));
        if reads_new != 0 {
            self.read_at_nanos.fetch_max(now.unix_nanos(), Ordering::Relaxed);
            // Two looks may interleave their swaps: a rough average is enough.
            self.reads_small.store(bytes_new < reads_new.saturating_mul(SMALL_READ_BYTES), Ordering::Relaxed);
        }
        self.read_at_nanos.load(Ordering::Relaxed)
    }

    /// Records a failure of this volume's work at `now`; returns whether to
    /// log it: the first time, when it changes, and once a minute while it
    /// lasts (a full disk fails every pass until it is freed).
    pub(crate) fn note_fault(&self, work: Work, error: &EngineError, now: Timestamp) -> bool {
        const RELOG_NANOS: u64 = 60_000_000_000;
        let what = error.to_string();
        let mut fault = self.fault.lock();
        let since = fault.as_ref().filter(|known| known.what == what).map_or(now, |known| known.since);
        // Remembered across passes that work in between (a full disk fails
        // only the passes that need space): logged once a minute at most.
        let mut logged = self.fault_logged.lock();
        let quiet = logged
            .as_ref()
            .is_some_and(|(text, at)| *text == what && now.unix_nanos().saturating_sub(at.unix_nanos()) < RELOG_NANOS);
        *fault = Some(Fault { what: what.clone(), since, work });
        if quiet {
            return false;
        }
        *logged = Some((what, now));
        true
    }

    /// `work` succeeded: if it is what failed, the volume is well again.
    pub(crate) fn clear_fault(&self, work: Work) {
        let mut fault = self.fault.lock();
        if let Some(cleared) = fault.take_if(|fault| fault.work == work) {
            tracing::debug!(volume = %self.name(), failing = %cleared.what, "volume works again");
        }
    }

    /// Views wait while recovery is unfinished (see `settled`): the first
    /// checkpoint after a crash could not yet be made (a full disk).
    pub(crate) fn check_settled(&self) -> Result<(), EngineError> {
        if self.settled.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(EngineError::RecoveryPending { volume: self.name().to_string() })
    }

    /// Recovery could not finish (its first checkpoint failed for a full
    /// disk); see `settled`.
    pub(crate) fn unsettle(&self) {
        self.settled.store(false, Ordering::Release);
    }

    /// The transient failure the volume's work is meeting now, if any, and
    /// since when: it retries by itself.
    pub fn fault(&self) -> Option<(String, Timestamp)> {
        self.fault.lock().as_ref().map(|fault| (fault.what.clone(), fault.since))
    }

    /// Whether recovery has finished (see `settled`): views are served.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Whether versions may be destaged now. Continuously, but in ROW only
    /// at snapshots: with a granularity g the source is merged once a
    /// window ends (every window end is a snapshot), at every write's
    /// granularity at every pass.
    fn merge_due(&self, maintenance: &MaintenanceState, now: Timestamp) -> bool {
        if !self.rules().destages_at_snapshots() {
            return true;
        }
        let window = self.granularity_nanos();
        window == 0 || now.unix_nanos() / window > maintenance.merged_at.unix_nanos() / window
    }

    /// The slow background work on history, called periodically by the
    /// embedder on a thread of its own so that it never delays commits:
    /// merges index runs, applies retention and the space cap, archives
    /// history into the chunk store and gives journal space back. Returns
    /// whether it did anything.
    pub fn maintain_history(&self, now: Timestamp) -> Result<bool, EngineError> {
        let mut work = self.history_work.lock();
        if self.closed.load(Ordering::Acquire) || self.is_poisoned() {
            return Ok(false);
        }
        // Spares kept for the next burst are the first space given back
        // when the filesystem's runs low (they only make that burst
        // faster), and before the work below that needs space, which fails
        // on a full disk.
        let mut worked = false;
        if self.disk.report().state != crate::reserve::SpaceState::Ok {
            let given_back = self.journal.give_back_spares()?;
            if given_back > 0 {
                tracing::info!(volume = %self.name(), bytes = given_back, "free space is low: gave back the journal's spare segment files");
                worked = true;
            }
        }
        worked |= self.releasing(|| self.index.compact())?;
        let retention_due = self.history.retention_clock().saturating_add_nanos(self.config.retention_interval_nanos);
        if now >= retention_due {
            worked |= self.apply_retention(now)?;
        }
        if now >= work.space_checked.saturating_add_nanos(self.config.retention_interval_nanos) {
            work.space_checked = now;
            worked |= self.apply_space_cap(now)?;
        }
        if self.archive_due(&work, now) {
            work.archive_last = now;
            worked |= self.archive(now)?;
            let replay_segment = self.maintenance.lock().replay_segment;
            worked |= self.reclaim_journal(replay_segment, now)?;
        }
        drop(work);
        // Without holding off what waits for the rest (a diff): it is the
        // work that can wait longest, and takes longest.
        worked |= self.copy_after_revert()?;
        // Last, after reclaiming, which may have kept spares already, and so
        // that its failing (a full disk) holds up nothing: spares written
        // ahead of need, for a journal that takes many commits per segment
        // or for segment files the chunk store adopted, while the volume is
        // idle (their cache flush would hold up commits, their writes reads).
        // One segment at a time, looking again before each, so that a burst
        // or a read that begins meanwhile waits for one segment's write at
        // most; for a slice of the round, as bookmarks are laid out; and
        // while free space stays above twice the reserve (below, spares are
        // given back, above).
        let clock_now = || self.clock.get().map_or(now, |clock| clock.now());
        let began = clock_now();
        let go_on = || {
            let now = clock_now();
            now.unix_nanos().saturating_sub(began.unix_nanos()) < IDLE_WORK_SLICE_NANOS
                && !self.idle_work_waits(now)
                && self.disk.report().state == crate::reserve::SpaceState::Ok
        };
        while go_on() && self.journal.prepare_spare()? {
            worked = true;
        }
        // Last: the work that is only ever worth doing when nothing else is.
        worked |= self.lay_out_bookmarks(now)?;
        Ok(worked)
    }

    /// Makes everything derived from the journal durable up to the records
    /// appended so far, so recovery can start after them.
    pub fn checkpoint(&self, now: Timestamp) -> Result<(), EngineError> {
        self.checkpoint_leaving(now, false)
    }

    /// A checkpoint; with `hot_set` (only where the overlay absorbs
    /// overwrites), a fuzzy one: it destages only the blocks not rewritten
    /// since the last checkpoint was taken (its cut), and unless nothing
    /// was left behind, recovery replays from that cut. That is sound:
    /// replay re-applies records to the current store in LSN order, the
    /// newest of a block last; every durable record before the cut is in
    /// the current store or superseded by a durable one after it; and the
    /// index and the timeline, durable through the new point, skip what
    /// they hold. A hot set rewritten between two checkpoints then stays in
    /// the overlay and is destaged once, after the burst, not at every
    /// checkpoint.
    fn checkpoint_leaving(&self, now: Timestamp, hot_set: bool) -> Result<(), EngineError> {
        assert!(!hot_set || self.rules().overlay_absorbs_overwrites(), "a hot set stays only in an absorbing overlay");
        let mut maintenance = self.maintenance.lock();
        let (point, timeline) = {
            let mut state = self.write.lock();
            self.index.seal();
            let lsn = Lsn(self.journal.lsn_next().0 - 1);
            let timeline = std::mem::take(&mut state.timeline_unsaved);
            let point =
                Checkpoint { lsn, replay_from: self.journal.position_next(), timestamp_last: state.timestamp_last };
            (point, timeline)
        };
        let cut = if hot_set { maintenance.cut_next } else { point };
        assert!(cut.lsn <= point.lsn, "a checkpoint cuts at or before its point");
        let lsn = point.lsn;
        let derived_durable = (|| {
            self.journal.commit()?;
            self.destage(match hot_set {
                true => Leaving::NotRewrittenSince { cut: cut.lsn, count: usize::MAX },
                false => Leaving::Durable,
            })?;
            self.persist_index(lsn)?;
            if !self.rules().history_at_destage() {
                // Records after the last write (a revert's copy) file nothing.
                self.index.indexed_through(lsn)?;
            }
            let destage = self.destage_lock();
            assert!(destage.lsn_applied >= cut.lsn, "destaged through the cut");
            // Looked at before the current store is synced: whatever a pass
            // applied before this is synced with it.
            let left_behind = self.write.lock().overlay.holds_through(lsn);
            if let Some(current) = &self.current {
                current.sync()?;
            }
            self.history.save_timeline(lsn, &timeline)?;
            Ok::<_, EngineError>(left_behind)
        })();
        let left_behind = match derived_durable {
            Ok(left_behind) => left_behind,
            Err(error) => {
                // A failure that passes (a full disk): the activity is saved by
                // the next checkpoint, with what comes meanwhile.
                crate::volume::history::merge_buckets(&mut self.write.lock().timeline_unsaved, timeline);
                return Err(self.fail(error));
            }
        };
        let written = if left_behind { cut } else { point };
        write_checkpoint(&*self.storage, &self.dir, &written).map_err(|error| self.fail(error))?;
        if !self.settled.swap(true, Ordering::AcqRel) {
            tracing::info!(volume = %self.name(), "recovery finished: views are served again");
        }
        maintenance.checkpoint_last = now;
        maintenance.merged_at = now;
        maintenance.checkpoint_lsn = lsn;
        maintenance.replay_segment = written.replay_from.segment;
        maintenance.cut_next = point;
        maintenance.checkpoint_journal_bytes = self.counters.journal_bytes_appended.load(Ordering::Relaxed);
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
