//! Archiving: moving history out of the journal into the node's chunk store
//! (MYCDP's archiver, seed 004 §3.3.1), and giving the journal's space back.
//!
//! The journal is the fast, durable path for writes; it is a poor place to
//! keep weeks of history (every version at full size, superseded ones too).
//! An archive pass picks a *cutoff*: a time before which no version can
//! still arrive and, with a granularity `g`, a multiple of `g`, so every
//! window before it is closed and thinning has already dropped the versions
//! it supersedes — those never reach the chunk store (IBM §3.1) — and a
//! time whose state thinning still keeps exactly (`exact_cutoff`), so the
//! archived runs hold the state before it, which is what a volume rebuilt
//! from its bucket reads as its present. The version
//! index then merges its recent runs, hands each surviving version older
//! than the cutoff to [`JournalArchiver`] (read from the journal, checked
//! against its CRC, stored as a chunk or, if all zeros, as a zero), and
//! writes them as an archived run once the chunks are durable.
//!
//! The chunks of a batch go into packs in layers (`layered_order`), from
//! the newest: the last version of each block in the batch, in block
//! order, then each one's second to last, and so on — not each block's
//! versions side by side. The first layer is the state at the batch's
//! cutoff, which every view at a time after it reads (of the blocks not
//! written again since): a view of any time between two passes, or of a
//! bookmark taken after a burst, reads it in one sweep. Layering from the
//! oldest instead, as before, scattered that state across as many layers
//! as its blocks had versions (a view read at half the live read after
//! random writes at QD 32). One exception: where a bookmark falls between
//! a block's versions in the batch, the version it names goes first, and
//! the rest follow from the newest, a layer down. A bookmark is the one
//! sign of which past times will be read: a pass covering a fill, a
//! bookmark and an overwrite then stores the bookmarked fill together.
//!
//! History that lies in the journal in runs (a write of 64 KiB or more)
//! is not copied where copying buys nothing: a version whose bytes are new
//! to the chunk store and do not compress, in a sealed segment (a later one
//! has a durable record), stays where it is — the store adopts the segment
//! file as a pack (a second name, no bytes written; once, however many
//! passes archive parts of it: `Volume::adopted_segments`) and the chunk is
//! *bare* (`ArchiveSession::put_from_journal`, `Volume::put_version`, which
//! the layouts that file history at destage use too). The journal then only
//! lets its own name go. Such history is in the order it was written, which
//! for a run is block order; short writes (random 4 KiB ones) are stored in
//! layers as above, where a view of a later time reads them together.
//!
//! A journal segment is deleted once recovery starts after it (the
//! checkpoint) and its newest record is older than the cutoff (no index
//! entry refers to it). A view that looked a version up in it just before
//! sees `JournalError::Reclaimed` and looks again.

use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rewind_chunks::{ArchiveSession, ChunkStore, InSegment};
use rewind_index::{ArchiveFailed, Archiver, IndexError, ReleaseHook, Thinning};
use rewind_journal::Journal;
use rewind_types::{ChunkId, Lsn, Timestamp, Version, VersionData};
use rustc_hash::FxHashMap;

use crate::volume::gather::{JournalGather, GATHER_BYTES_MAX};
use crate::volume::HistoryWork;
use crate::{EngineError, Volume};

/// Releases the chunks of archived versions the index drops.
pub(crate) struct ReleaseChunks {
    pub chunks: Arc<ChunkStore>,
    pub block_bytes: u32,
}

impl ReleaseHook for ReleaseChunks {
    fn release(&self, version: &Version) {
        if let VersionData::Chunk(id) = version.data {
            self.chunks.release(id, self.block_bytes);
        }
    }
}

/// The embedder's clock, for the one wait inside background work: an archive
/// pass pausing for a burst or reads, or keeping to its budget beside reads
/// (`Volume::pause_before_part`). The engine reads no clock of its own
/// (times are passed in, for the deterministic simulator).
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
    fn sleep(&self, nanos: u64);
}

/// Work waiting for archive passes to end — a diff, a history or volume
/// delete, whatever holds the chunk store's reference gate for writing (a
/// collection, a recount, coalescing packs, saving the counts at shutdown),
/// whatever waits for its one session (a destage filing history in the
/// layouts that do so then, a catalog's capture of the chunk table)
/// — which a pass must not keep waiting while it pauses for a burst or
/// reads (`Volume::pause_before_part`): it goes on at once while any is marked. One
/// per node, since a collection waits for every volume. And whether the
/// node is stopping, which no pass keeps waiting either (see
/// [`PassesWanted::stop`]).
#[derive(Default)]
pub(crate) struct PassesWanted {
    waiting: AtomicUsize,
    stopping: AtomicBool,
}

impl PassesWanted {
    /// Marks work waiting until the mark is dropped.
    pub(crate) fn hold(&self) -> PassWanted<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        PassWanted(self)
    }

    /// The node is stopping: a pass in progress gives up at its next part
    /// (a pass over what a burst left can take minutes, and a stop that
    /// waits that long is killed by whoever asked for it), and the next
    /// start archives its versions again. What it stored is referred to by
    /// nothing: the chunk store counts its references again at that start.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn any(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0 || self.stopping()
    }
}

pub(crate) struct PassWanted<'a>(&'a PassesWanted);

impl Drop for PassWanted<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An archive pass that reads go on beside, unheld (see
/// `Volume::pause_before_part`), takes at most one part of this many of the
/// time: random reads right after the write jobs ran at 0.93 of their
/// rested speed beside it (0.85–1.11 at an eighth, 0.53–0.71 beside a pass
/// at full speed; by hand, on a disk with little room: BENCHMARKS.md).
const ARCHIVE_SHARE_BESIDE_READS: u64 = 16;

/// The whole of the time, in the parts an archive pass's share is counted
/// in (`Volume::archive_share`), and the least share a pass that goes on
/// takes.
const SHARE_WHOLE: u64 = 1 << 10;
const SHARE_LEAST: u64 = SHARE_WHOLE / ARCHIVE_SHARE_BESIDE_READS;

/// The share of the time (in parts of `SHARE_WHOLE`) a pass over `waiting`
/// bytes of a volume's history takes during a burst's budget, with `room`
/// bytes free above twice the reserve: none while they take less than half
/// the room, the room a burst may keep archiving waiting in (the pass that
/// follows needs room for its packs whether it runs now or later; the
/// other half is left for other volumes' passes and the writes that come
/// meanwhile); beyond, a share that grows with them, from the least to the
/// whole once they take three quarters. The pass keeps pace with the
/// pressure on space rather than stepping from none to a core and the disk
/// at half the room: random writes synced every 8, right after a burst
/// that left 14 GiB waiting with 24 GiB of room, ran at 0.59 of their
/// rested speed beside a pass at full speed (bench/nbd.py, BENCHMARKS.md).
fn archive_share_of_room(waiting: u64, room: u64) -> u64 {
    let (half, most) = (room / 2, room / 4 * 3);
    if waiting < half {
        return 0;
    }
    if waiting >= most {
        return SHARE_WHOLE;
    }
    let share = u128::from(waiting - half) * u128::from(SHARE_WHOLE) / u128::from(most - half);
    (share as u64).clamp(SHARE_LEAST, SHARE_WHOLE)
}

/// Versions written in runs of at least this many bytes, one after another
/// in the journal, may stay there as bare chunks (see the module
/// documentation): read in block order they are one sequential read, as a
/// pack's layer is. A 64 KiB run read from the page cache costs no more per
/// byte than a longer one.
const ADOPT_RUN_BYTES_MIN: usize = 64 << 10;

/// Stores the journal data of versions as chunks.
struct JournalArchiver<'a> {
    volume: &'a Volume,
    session: Option<ArchiveSession<'a>>,
    /// The segments looked at so far: their paths, for those the chunk
    /// store may adopt.
    sealed_segments: SealedSegments,
    gather: JournalGather,
    /// The volume's bookmarks' times, ascending, as the pass began, and the
    /// order in which a batch's versions are stored (`layered_order`).
    bookmarks: Vec<Timestamp>,
    order: Vec<usize>,
    /// The chunks the versions archived so far refer to.
    added: Vec<ChunkId>,
    /// When the part under way began, on the embedder's clock (none before
    /// the first, or without a clock): what `Volume::pause_before_part`
    /// budgets by.
    part_began: Option<Timestamp>,
    /// Why the last call failed.
    error: Option<EngineError>,
    /// Whether it gave up because the node is stopping.
    stopped: bool,
}

impl JournalArchiver<'_> {
    fn archive_versions(&mut self, versions: &mut [Version]) -> Result<(), EngineError> {
        let volume = self.volume;
        let block_bytes = volume.block_size().bytes() as usize;
        layered_order(versions, &self.bookmarks, &mut self.order);
        let in_runs = in_journal_runs(versions.iter().map(|version| version.data), block_bytes);
        for part in self.order.chunks(GATHER_BYTES_MAX / block_bytes) {
            if volume.passes_wanted.stopping() {
                self.stopped = true;
                return Ok(());
            }
            self.part_began = volume.pause_before_part(self.part_began);
            self.gather.read(&volume.journal, part.iter().map(|&at| versions[at].data), block_bytes)?;
            let session = self.session.as_mut().expect("archiving until finished");
            for (gathered, &at) in part.iter().enumerate() {
                let block = self.gather.block(gathered);
                let version = &mut versions[at];
                volume.check_version_bytes(version, block, "the journal", "being archived")?;
                version.data = if block.iter().all(|&byte| byte == 0) {
                    VersionData::Zero
                } else {
                    let id = volume.put_version(session, version, block, in_runs[at], &mut self.sealed_segments)?;
                    self.added.push(id);
                    VersionData::Chunk(id)
                };
            }
            self.gather.let_go();
        }
        Ok(())
    }
}

/// The journal segments an archive pass or a destage looked at, by number:
/// the path of each the chunk store may adopt (`Journal::sealed_segment`),
/// asked once each.
pub(super) type SealedSegments = FxHashMap<u32, Option<String>>;

/// The path of journal segment `segment` if the chunk store may adopt it.
fn sealed_segment<'s>(
    known: &'s mut SealedSegments,
    journal: &Journal,
    segment: u32,
) -> Result<Option<&'s str>, EngineError> {
    let path = match known.entry(segment) {
        Entry::Occupied(known) => known.into_mut(),
        Entry::Vacant(unknown) => unknown.insert(journal.sealed_segment(segment)?),
    };
    Ok(path.as_deref())
}

/// Which versions (by their `data`) lie in the journal in runs of at least
/// [`ADOPT_RUN_BYTES_MIN`]: each right after the one before in its segment.
pub(super) fn in_journal_runs(data: impl ExactSizeIterator<Item = VersionData>, block_bytes: usize) -> Vec<bool> {
    let run_min = (ADOPT_RUN_BYTES_MIN / block_bytes).max(1);
    let count = data.len();
    let mut placed: Vec<(u32, u32, usize)> = data
        .enumerate()
        .filter_map(|(at, data)| match data {
            VersionData::Journal { segment, offset } => Some((segment, offset, at)),
            _ => None,
        })
        .collect();
    placed.sort_unstable();
    let mut in_runs = vec![false; count];
    let mut start = 0;
    while start < placed.len() {
        let mut end = start + 1;
        while end < placed.len()
            && placed[end].0 == placed[start].0
            && u64::from(placed[end].1) == u64::from(placed[end - 1].1) + block_bytes as u64
        {
            end += 1;
        }
        if end - start >= run_min {
            placed[start..end].iter().for_each(|&(_, _, at)| in_runs[at] = true);
        }
        start = end;
    }
    in_runs
}

/// The order in which to store `versions` (in key order: by block, then
/// time) as indices into it: layer by layer, and by block within a layer
/// (see the module documentation). A version's layer is how many versions
/// of its block come after it in `versions` — but if one of the
/// `bookmarks` (times, ascending) falls between the block's first and last
/// version, the version the latest such bookmark names is in layer 0 and
/// the others one layer further down.
fn layered_order(versions: &[Version], bookmarks: &[Timestamp], order: &mut Vec<usize>) {
    let mut keyed: Vec<(u32, u32)> = Vec::with_capacity(versions.len());
    let mut start = 0;
    while start < versions.len() {
        let block = versions[start].block;
        let mut end = start + 1;
        while end < versions.len() && versions[end].block == block {
            assert!(versions[end - 1].timestamp < versions[end].timestamp, "a block's versions in time order");
            end += 1;
        }
        assert!(end == versions.len() || block < versions[end].block, "versions in block order");
        let run = &versions[start..end];
        let (first, last) = (run[0].timestamp, run[run.len() - 1].timestamp);
        let bookmarked = bookmarks[..bookmarks.partition_point(|&at| at < last)]
            .last()
            .filter(|&&at| at >= first)
            .map(|&at| run.partition_point(|version| version.timestamp <= at) - 1);
        for (index, at) in (start..end).enumerate() {
            let after = (run.len() - 1 - index) as u32;
            let layer = match bookmarked {
                None => after,
                Some(named) if named == index => 0,
                Some(_) => after + 1,
            };
            keyed.push((layer, at as u32));
        }
        start = end;
    }
    keyed.sort_unstable();
    order.clear();
    order.extend(keyed.into_iter().map(|(_, at)| at as usize));
}

impl Archiver for JournalArchiver<'_> {
    fn archive(&mut self, versions: &mut [Version]) -> Result<(), ArchiveFailed> {
        match self.archive_versions(versions) {
            Ok(()) if self.stopped => Err(ArchiveFailed),
            Ok(()) => Ok(()),
            Err(error) => {
                self.error = Some(error);
                Err(ArchiveFailed)
            }
        }
    }

    fn finish(&mut self) -> Result<(), ArchiveFailed> {
        let session = self.session.take().expect("finished once");
        session.finish().map_err(|error| {
            self.error = Some(error.into());
            ArchiveFailed
        })
    }
}

impl Volume {
    /// Runs an index operation that may release archived chunks: collection
    /// waits for it, and counts every reference again first if it fails
    /// part-way (it may have released references its old runs still hold).
    pub(crate) fn releasing<T>(&self, operation: impl FnOnce() -> Result<T, IndexError>) -> Result<T, EngineError> {
        let _gate = self.chunks.hold_references();
        operation().map_err(|error| {
            self.chunks.request_recount(format!("a merge of volume {} failed: {error}", self.name()));
            self.fail(error.into())
        })
    }

    /// Writes the sealed memtables whose records are durable up to `lsn`
    /// as runs. In the layouts that file history late, that thins versions
    /// already in the chunk store, which releases them: see `releasing`.
    pub(crate) fn persist_index(&self, lsn: Lsn) -> Result<usize, EngineError> {
        self.releasing(|| self.index.persist(lsn))
    }

    pub(crate) fn archive_due(&self, work: &HistoryWork, now: Timestamp) -> bool {
        if self.archive_share(now) == 0 {
            return false;
        }
        let elapsed = now.unix_nanos().saturating_sub(work.archive_last.unix_nanos());
        elapsed >= self.config.archive_interval_nanos || self.history_waiting_bytes() >= self.config.archive_bytes_soft
    }

    /// The share of the time an archive pass may take at `now`, in parts of
    /// `SHARE_WHOLE`; none (it waits) for a burst, in its first
    /// `burst_archive_wait_nanos`, while the history waiting fits half the
    /// room (see `archive_share_of_room` for the share beyond), and for
    /// reads right after one while the node's history waiting fits the
    /// disk's free space above twice the reserve
    /// (`SpaceGauge::history_waiting_fits_room`), `1 /
    /// ARCHIVE_SHARE_BESIDE_READS` beside such reads past that; all of it
    /// otherwise.
    fn archive_share(&self, now: Timestamp) -> u64 {
        if !self.in_burst(now) {
            return match self.reads_after_burst(now) {
                false => SHARE_WHOLE,
                true if self.disk.history_waiting_fits_room() => 0,
                true => SHARE_LEAST,
            };
        }
        let burst_nanos = now.unix_nanos().saturating_sub(self.burst_began_nanos.load(Ordering::Relaxed));
        if burst_nanos >= self.config.burst_archive_wait_nanos {
            return SHARE_WHOLE;
        }
        let disk = self.disk.report();
        let room = disk.free_bytes.saturating_sub(disk.reserve_bytes.saturating_mul(2));
        archive_share_of_room(self.history_waiting_bytes(), room)
    }

    /// Within an archive pass, before each part: waits, on the embedder's
    /// clock (none, no pause: see `Node::set_clock`), while a burst or
    /// reads right after one keep archiving waiting (`archive_share` is
    /// none). A pass over what a burst left takes a core and the disk for
    /// as long as it lasts, and one that began in the moment between two
    /// write jobs, or just before the reads, would take them from what
    /// follows (random writes synced every 8 ran at half their rested
    /// speed beside one: BENCHMARKS.md); it goes on once they pause, once
    /// the burst is past its budget or the reads have gone on for
    /// `burst_reads_nanos` after the last write, when the volume closes,
    /// or at once when other work waits for it to end (`PassesWanted`).
    ///
    /// A pass that goes on beside them, because its history does not fit
    /// the room they would keep it waiting in, goes on by budget: after a
    /// part that began at `part_began`, it waits until the part's time is
    /// at most its share of the time since, as long as the share stays
    /// less than the whole. At full speed, at nice 10, such a pass still
    /// took most of the core the reads left idle between requests. Returns
    /// when the next part begins.
    fn pause_before_part(&self, part_began: Option<Timestamp>) -> Option<Timestamp> {
        // Reads are seen by their count moving between two looks.
        const LOOK_EVERY_NANOS: u64 = 20_000_000;
        let clock = self.clock.get()?;
        let waited_for = || self.passes_wanted.any() || self.closed.load(Ordering::Acquire);
        let mut paused = false;
        while !waited_for() && self.archive_share(clock.now()) == 0 {
            if !paused {
                paused = true;
                self.counters.archive_pauses.fetch_add(1, Ordering::Relaxed);
            }
            clock.sleep(LOOK_EVERY_NANOS);
        }
        if let Some(began) = part_began.filter(|_| !paused) {
            let now = clock.now();
            let share = self.archive_share(now).clamp(SHARE_LEAST, SHARE_WHOLE);
            let part_nanos = now.unix_nanos().saturating_sub(began.unix_nanos());
            let rest_nanos = u128::from(part_nanos) * u128::from(SHARE_WHOLE - share) / u128::from(share);
            let until = now.saturating_add_nanos(u64::try_from(rest_nanos).unwrap_or(u64::MAX));
            let mut yielded = false;
            loop {
                let now = clock.now();
                if now >= until || waited_for() || self.archive_share(now) == SHARE_WHOLE {
                    break;
                }
                if !yielded {
                    yielded = true;
                    self.counters.archive_yields.fetch_add(1, Ordering::Relaxed);
                }
                clock.sleep(LOOK_EVERY_NANOS.min(until.unix_nanos() - now.unix_nanos()));
            }
        }
        Some(clock.now())
    }

    /// One archive pass (see the module documentation). Returns whether it
    /// archived anything.
    pub(crate) fn archive(&self, now: Timestamp) -> Result<bool, EngineError> {
        // COW copies history straight into the chunk store: nothing waits in the journal.
        if self.chunks.is_poisoned() || self.rules().history_at_destage() {
            return Ok(false);
        }
        // Everything durable into runs first: only runs are archived.
        self.journal.commit().map_err(|error| self.fail(error.into()))?;
        self.index.seal();
        self.persist_index(self.journal.lsn_durable())?;
        let cutoff = {
            let mut state = self.write.lock();
            let mut cutoff = now.saturating_sub_nanos(self.config.archive_age_nanos);
            if let Some(oldest) = self.index.oldest_in_memory() {
                cutoff = cutoff.min(oldest);
            }
            let granularity = self.granularity_nanos();
            if let Some(windows) = cutoff.unix_nanos().checked_div(granularity) {
                cutoff = Timestamp::from_unix_nanos(windows * granularity);
            }
            if cutoff <= self.index.archived_before() {
                return Ok(false);
            }
            // No later write may land before the cutoff, whatever its clock says.
            state.timestamp_floor = state.timestamp_floor.max(cutoff);
            cutoff
        };
        // What other nodes sharing the bucket lend is trusted only so long.
        self.chunks.expire_peers(now.unix_nanos());
        let _gate = self.chunks.hold_references();
        let Some(cutoff) = self.hold_exact_cutoff(cutoff) else { return Ok(false) };
        let held = Timestamp::from_unix_nanos(cutoff.unix_nanos() - 1);
        let session = self.chunks.session().inspect_err(|_| self.release_time(held))?;
        let mut archiver = JournalArchiver {
            volume: self,
            session: Some(session),
            sealed_segments: SealedSegments::default(),
            gather: JournalGather::default(),
            bookmarks: self.bookmark_times(),
            order: Vec::new(),
            added: Vec::new(),
            part_began: None,
            error: None,
            stopped: false,
        };
        let result = self.index.archive(cutoff, &mut archiver);
        self.release_time(held);
        if let Some(session) = archiver.session.take() {
            // The index failed before the chunks were made durable: no run
            // will refer to them.
            session.abandon();
        }
        let report = match result {
            Ok(report) => report,
            Err(IndexError::ArchiveFailed) if archiver.stopped => {
                tracing::info!(volume = %self.name(), "archive pass stopped: the node is stopping; the next start archives its versions");
                return Ok(false);
            }
            Err(IndexError::ArchiveFailed) => return Err(archiver.error.take().expect("the archiver says why")),
            Err(error) => return Err(self.fail(error.into())),
        };
        self.tally_added(report.chunk_epoch, &archiver.added);
        self.counters.archive_passes.fetch_add(1, Ordering::Relaxed);
        self.counters.versions_archived.fetch_add(report.versions_archived, Ordering::Relaxed);
        Ok(report.versions_archived > 0 || report.runs_rewritten > 0)
    }

    /// The newest point at or before `cutoff` (and after what is archived)
    /// whose state the index still holds exactly, held — pinned — until
    /// [`Volume::release_time`] of the time before it, so that no thinning
    /// meanwhile drops a version across it.
    fn hold_exact_cutoff(&self, cutoff: Timestamp) -> Option<Timestamp> {
        let bookmarks = self.history.bookmarks.lock();
        let cutoff = exact_cutoff(&self.index.thinning(), cutoff, self.index.archived_before())?;
        self.hold_locked(Timestamp::from_unix_nanos(cutoff.unix_nanos() - 1), &bookmarks);
        Some(cutoff)
    }

    /// Stores `block`, the bytes of `version` (checked against its CRC), in
    /// `session` and returns its chunk: left where it lies if `in_run` and
    /// its journal segment is sealed (`ArchiveSession::put_from_journal`,
    /// which stores it anyway if it dedups or compresses), else copied.
    pub(super) fn put_version(
        &self,
        session: &mut ArchiveSession<'_>,
        version: &Version,
        block: &[u8],
        in_run: bool,
        sealed: &mut SealedSegments,
    ) -> Result<ChunkId, EngineError> {
        if let (VersionData::Journal { segment, offset }, true) = (version.data, in_run) {
            if let Some(path) = sealed_segment(sealed, &self.journal, segment)? {
                let mut adopted = self.adopted_segments.lock();
                let adopted_as = adopted.entry(segment).or_default();
                let in_segment = InSegment { path, offset: u64::from(offset), crc32c: version.crc32c, adopted_as };
                return Ok(session.put_from_journal(block, in_segment)?);
            }
        }
        Ok(session.put(block)?)
    }

    /// Deletes the journal segments recovery no longer needs and the index
    /// no longer refers to (keeping spares as of `now`). Returns whether it
    /// deleted any.
    pub(crate) fn reclaim_journal(&self, replay_segment: u32, now: Timestamp) -> Result<bool, EngineError> {
        // In COW the index never refers to the journal: recovery alone needs it.
        let unreferenced_before = match self.rules().history_at_destage() {
            true => Timestamp::MAX,
            false => self.index.archived_before(),
        };
        let freed = self.journal.reclaim(replay_segment, unreferenced_before, now)?;
        let first = self.journal.segment_first();
        self.adopted_segments.lock().retain(|&segment, _| segment >= first);
        self.counters.journal_bytes_reclaimed.fetch_add(freed, Ordering::Relaxed);
        Ok(freed > 0)
    }

    /// Releases every chunk the volume's history refers to (it is being
    /// deleted).
    pub(crate) fn release_all(&self) -> Result<(), EngineError> {
        // No archive pass may add references meanwhile.
        let _wanted = self.passes_wanted.hold();
        let _history_work = self.history_work.lock();
        let block_bytes = self.block_size().bytes();
        self.releasing(|| {
            self.index.for_each_chunk(&mut |version| {
                if let VersionData::Chunk(id) = version.data {
                    self.chunks.release(id, block_bytes);
                }
                Ok(())
            })
        })?;
        Ok(())
    }
}

/// The newest archive cutoff at or before `cutoff` and after `archived`
/// whose state — every version before it — `thinning` keeps exactly, as
/// [`Volume::exact_time`] decides. Merges never mix archived and recent
/// runs, so the archived runs then hold that state for good: it is the
/// present of a volume rebuilt from its bucket (`crate::volume::rebuild`).
/// A point that retention's horizon, a coarser retention window or a
/// deleted range has already thinned across is not one: the versions
/// before it that later ones superseded are gone.
fn exact_cutoff(thinning: &Thinning, cutoff: Timestamp, archived: Timestamp) -> Option<Timestamp> {
    let before = |at: Timestamp| at.unix_nanos().checked_sub(1).map(Timestamp::from_unix_nanos);
    let mut last = before(cutoff)?;
    while last >= archived {
        let exact = thinning.exact_at_or_before(last);
        let expired = thinning.horizon.is_some_and(|horizon| exact < horizon && !thinning.is_pinned(exact));
        last = match thinning.deleted_range(exact) {
            _ if expired => thinning.pin_before(exact.next())?,
            Some((from, to)) if exact < to => before(from)?,
            _ => return Some(exact.next()).filter(|&cutoff| cutoff > archived),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_types::BlockIndex;

    #[test]
    fn a_pass_in_a_burst_takes_a_share_that_grows_from_half_the_room_to_three_quarters() {
        const ROOM: u64 = 1 << 30;
        let share = |waiting: u64| archive_share_of_room(waiting, ROOM);
        assert_eq!(share(0), 0, "nothing waiting");
        assert_eq!(share(ROOM / 2 - 1), 0, "just under half the room: the pass waits");
        assert_eq!(share(ROOM / 2), SHARE_LEAST, "at half, the least share");
        assert_eq!(share(ROOM / 8 * 5), SHARE_WHOLE / 2, "half way up the ramp, half the time");
        assert!(share(ROOM / 16 * 9) < share(ROOM / 16 * 11), "the share grows with the history waiting");
        assert_eq!(share(ROOM / 4 * 3 - 1), SHARE_WHOLE - 1);
        assert_eq!(share(ROOM / 4 * 3), SHARE_WHOLE, "from three quarters, at full speed");
        assert_eq!(share(2 * ROOM), SHARE_WHOLE, "past the room");
        assert_eq!(archive_share_of_room(0, 0), SHARE_WHOLE, "no room: at full speed");
        assert_eq!(archive_share_of_room(u64::MAX - 1, u64::MAX), SHARE_WHOLE);
    }

    fn version(block: u64, nanos: u64) -> Version {
        Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(nanos),
            data: VersionData::Zero,
            crc32c: 0,
        }
    }

    fn stored(versions: &[Version], bookmarks: &[u64]) -> Vec<(u64, u64)> {
        let bookmarks: Vec<Timestamp> = bookmarks.iter().map(|&nanos| Timestamp::from_unix_nanos(nanos)).collect();
        let mut order = Vec::new();
        layered_order(versions, &bookmarks, &mut order);
        order.iter().map(|&at| (versions[at].block.0, versions[at].timestamp.unix_nanos())).collect()
    }

    #[test]
    fn a_batch_is_stored_newest_layer_first_each_layer_in_block_order() {
        // Block 0 written three times, block 1 once, block 2 twice.
        let versions = [version(0, 1), version(0, 5), version(0, 9), version(1, 2), version(2, 3), version(2, 7)];
        // First the state after the batch, then what each block held before
        // its last write, then before that. Bookmarks outside every block's
        // run of versions change nothing.
        let newest_first = [(0, 9), (1, 2), (2, 7), (0, 5), (2, 3), (0, 1)];
        assert_eq!(stored(&versions, &[]), newest_first);
        assert_eq!(stored(&versions, &[0, 9, 20]), newest_first);
        // A bookmark at 6 names (0, 5) and (2, 3): they go first, and the
        // rest of their blocks' versions a layer down; a second bookmark
        // before it in the same runs does not count.
        assert_eq!(stored(&versions, &[4, 6]), [(0, 5), (1, 2), (2, 3), (0, 9), (2, 7), (0, 1)]);
    }

    #[test]
    fn versions_one_after_another_in_the_journal_for_64_kib_are_in_runs() {
        const BLOCK: u32 = 4096;
        let in_journal = |block: u64, segment: u32, offset: u32| Version {
            data: VersionData::Journal { segment, offset },
            ..version(block, 1)
        };
        // Blocks 0..16 written at once; 16..31 too, but one block short;
        // 40..56 in one write that spans two segments (16 in all, 8 in each).
        let mut versions: Vec<Version> = (0..16).map(|block| in_journal(block, 1, 64 + block as u32 * BLOCK)).collect();
        versions.extend((16..31).map(|block| in_journal(block, 2, 64 + block as u32 * BLOCK)));
        versions.extend((40..48).map(|block| in_journal(block, 3, 900_000 + block as u32 * BLOCK)));
        versions.extend((48..56).map(|block| in_journal(block, 4, 64 + block as u32 * BLOCK)));
        // Written once each, apart: a random write pattern, and zeros.
        versions.extend((60..80).map(|block| in_journal(block, 5, 64 + block as u32 * 2 * BLOCK)));
        versions.push(version(90, 1));
        let data = |versions: &[Version]| versions.iter().map(|version| version.data).collect::<Vec<_>>();
        let in_runs = in_journal_runs(data(&versions).into_iter(), BLOCK as usize);
        let blocks_in_runs: Vec<u64> =
            versions.iter().zip(&in_runs).filter(|(_, &run)| run).map(|(v, _)| v.block.0).collect();
        assert_eq!(blocks_in_runs, (0..16).collect::<Vec<u64>>());
        // With 512-byte blocks, 128 make a run; with 64 KiB blocks, one does.
        assert!(in_journal_runs(data(&versions).into_iter(), 512).iter().all(|&run| !run));
        assert_eq!(in_journal_runs(data(&versions[..3]).into_iter(), 64 << 10), [true, true, true]);
    }
}
