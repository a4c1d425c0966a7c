//! Laying out the history a view reads in block order, so that reading it
//! reads its packs in order (issue 13's "keep history that is read together
//! stored together").
//!
//! An archive pass stores versions in the order of its batches (each
//! block's newest version in the batch first, see `archive.rs`), which
//! serves a view of a time at or after the pass. A view of a point before
//! later passes rewrote some of its blocks, or between the sequential
//! passes of one batch, finds its blocks' versions among other points'
//! versions: it reads more of the packs than it returns (records between
//! the ones it wants, up to 16 KiB at a time) or many small reads: after
//! bench/views.py's write jobs, 1.27 bytes of packs per byte of the view
//! in 20 reads per MiB, and 0.67 of the live read's speed; laid out, 1.03
//! bytes in 4 reads, and 0.77 (BENCHMARKS.md, "A view of the past against
//! the present").
//!
//! `View::defrag` plans the view piece by piece, as a read would, and asks
//! the chunk store to copy the chunks of each piece, in block order, into
//! new packs (`ChunkStore::relocate`), unless they already lie in long
//! runs. Pieces the volume never wrote are passed over (a 4 TiB volume
//! with 16 MiB written took 74 s to plan piece by piece). The versions
//! keep their chunk ids: only the chunk table's slots
//! move, crash-safely as a repack's do, so the index, the other views and
//! the other volumes sharing a chunk are untouched, and every read made
//! meanwhile finds the chunk in its old pack or its new one. The old
//! records become dead space for collection. Blocks the view reads from
//! the journal, the current store or a clone's base are not history in the
//! chunk store, and stay where they are (a clone's base point is laid out
//! by a defrag of the base's view).
//!
//! The history of bookmarks is laid out so in the background
//! (`Volume::lay_out_bookmarks`), each once an archive pass has taken all
//! of it into the chunk store, while the volume is neither written nor
//! read: a bookmark is the one sign of which past times will be read.
//! `VolumeConfig::lay_out_bookmarks` (`rewind serve --no-bookmark-layout`)
//! turns that off.

use std::sync::atomic::Ordering;

use rewind_chunks::RelocateReport;
use rewind_format::meta::VolumeKind;
use rewind_types::{BlockIndex, ChunkId, Timestamp, Version, VersionData};

use crate::timespec::DisplayTime;
use crate::volume::maintenance::IDLE_WORK_SLICE_NANOS;
use crate::volume::read::{Copies, OverlayAccess, Source, View};
use crate::{EngineError, Volume};

/// Blocks planned and laid out at a time: 32 MiB of 4 KiB blocks, the
/// chunk store's pack size.
const PIECE_BLOCKS: u64 = 8192;

/// What a defrag did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Blocks of the view whose version is archived history (read from the
    /// chunk store now, or once the block is written again).
    pub blocks_archived: u64,
    /// The distinct chunks they read, and the runs of neighbouring records
    /// those lay in before.
    pub chunks: u64,
    pub runs_before: u64,
    /// Chunks copied into new packs in block order, and the bytes written.
    pub chunks_moved: u64,
    pub bytes_written: u64,
    /// Chunks whose record failed its check, left where they are.
    pub chunks_damaged: u64,
    /// Blocks passed over unplanned: whole pieces this volume never wrote.
    pub blocks_skipped: u64,
}

impl DefragReport {
    fn add(&mut self, relocated: RelocateReport) {
        self.chunks += relocated.chunks;
        self.runs_before += relocated.runs_before;
        self.chunks_moved += relocated.chunks_moved;
        self.bytes_written += relocated.bytes_written;
        self.chunks_damaged += relocated.chunks_damaged;
    }
}

impl View {
    /// Rewrites the archived history this view reads into new packs in
    /// block order (see the module documentation), while the view and the
    /// volume go on serving. `progress` gets the blocks done of all.
    pub fn defrag(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<DefragReport, EngineError> {
        let volume = self.volume();
        if volume.kind() == VolumeKind::Tree {
            return Err(EngineError::InvalidArgument(format!(
                "{} is a file tree: its 2^60-byte address space is not laid out in block order (its files' history \
                 is read file by file); defrag the views of block volumes",
                volume.name()
            )));
        }
        let mut report = DefragReport::default();
        volume.lay_out(self.at(), 0, &mut report, &mut |done, all| {
            progress(done, all);
            true
        })?;
        Ok(report)
    }
}

/// The bookmark being laid out in the background, and the block it goes
/// on from (those done are saved with the bookmarks: `Bookmarks::laid_out`).
#[derive(Default)]
pub(crate) struct BookmarkLayout {
    under_way: Option<(Timestamp, u64)>,
}

impl Volume {
    /// Lays out the archived history of the state at `at` from block
    /// `first` on, a piece at a time, adding to `report`; after each piece
    /// `go_on(blocks done, all)` says whether to go on. Returns the block
    /// it stopped before (the volume's block count once done).
    fn lay_out(
        &self,
        at: Timestamp,
        mut first: u64,
        report: &mut DefragReport,
        go_on: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<u64, EngineError> {
        let blocks = self.block_count();
        // A block this volume never wrote reads zeros or its clone's base,
        // never its own archived history, so whole pieces without a version
        // of any time are passed over.
        let versioned = self.index.versioned_blocks();
        while first < blocks {
            let skipped = match versioned.first_from(first)? {
                Some(next) if next < blocks => (next - first) / PIECE_BLOCKS * PIECE_BLOCKS,
                _ => blocks - first,
            };
            report.blocks_skipped += skipped;
            first += skipped;
            if first == blocks {
                go_on(first, blocks);
                break;
            }
            let count = PIECE_BLOCKS.min(blocks - first);
            let ids = self.archived_chunks(at, BlockIndex(first), count)?;
            report.blocks_archived += ids.len() as u64;
            report.add(self.chunks.relocate(&ids)?);
            first += count;
            if !go_on(first, blocks) {
                break;
            }
        }
        Ok(first)
    }

    /// The chunks that blocks `first..first + count` read as of `at`, in
    /// block order, for those whose version then is archived history —
    /// also where the view reads the block from the present now (the
    /// current store or the journal, not written since): it reads the
    /// archived version once the block is written again, and laid out now
    /// that read is in order too. (In COW the index holds only what was
    /// copied out, so there the plan's chunks are all.)
    fn archived_chunks(&self, at: Timestamp, first: BlockIndex, count: u64) -> Result<Vec<ChunkId>, EngineError> {
        let sources =
            self.planned_or_corrupt(|| self.plan(Some(at), OverlayAccess::Lock, Copies::Read, first, count))?;
        let in_present = |source: &Source| matches!(source, Source::Current { .. } | Source::Journal { .. });
        let present: Vec<u64> = match self.rules().history_at_destage() {
            true => Vec::new(),
            false => (first.0..first.0 + count).zip(&sources).filter(|(_, s)| in_present(s)).map(|(b, _)| b).collect(),
        };
        let mut archived = match present.is_empty() {
            true => Vec::new(),
            false => self.index.find_le_many(&present, at)?,
        }
        .into_iter();
        Ok(sources
            .iter()
            .filter_map(|source| match source {
                Source::Chunk { id, .. } => Some(*id),
                source if in_present(source) && !present.is_empty() => {
                    match archived.next().expect("a version looked up per block in the present") {
                        Some(Version { data: VersionData::Chunk(id), .. }) => Some(id),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect())
    }

    /// Lays out, in the background, the history of each bookmark once an
    /// archive pass has taken all of it into the chunk store: the newest
    /// first, a piece at a time, for at most `LAYOUT_SLICE_NANOS` per call,
    /// stopping (to go on later) while the volume is written or read, or
    /// other work waits for the node's passes to end. A bookmark is the one
    /// sign of which past times will be read, and a view of one after later
    /// passes finds its blocks among other points' versions (bench/nbd.py's
    /// view read 0.71 of the live read as archived, 0.86 after `volume
    /// defrag`). Returns whether it did anything.
    ///
    /// The bookmark's time is not held meanwhile: deleted, the pieces
    /// planned before the next call only move live chunks other points
    /// read (a relocation moves a chunk's slot, never what its id names),
    /// and the next call lets it go.
    pub(crate) fn lay_out_bookmarks(&self, now: Timestamp) -> Result<bool, EngineError> {
        if !self.lays_out_bookmarks() || self.chunks.is_poisoned() {
            return Ok(false);
        }
        let clock_now = || self.clock.get().map_or(now, |clock| clock.now());
        let began = clock_now();
        let go_on = || {
            let now = clock_now();
            now.unix_nanos().saturating_sub(began.unix_nanos()) < IDLE_WORK_SLICE_NANOS && !self.idle_work_waits(now)
        };
        let mut worked = false;
        while go_on() {
            let Some((at, first)) = self.next_layout() else { break };
            let mut report = DefragReport::default();
            let laid_out = self.lay_out(at, first, &mut report, &mut |_, _| go_on());
            self.counters.layout_bytes_written.fetch_add(report.bytes_written, Ordering::Relaxed);
            worked = true;
            let stopped = match laid_out {
                Ok(stopped) => stopped,
                // Damage (reported to the views that meet it) is not tried
                // again at every pass: the rest of the history stays as archived.
                Err(error) if error.is_corruption() => {
                    tracing::warn!(volume = %self.name(), at = %DisplayTime(at), %error,
                        "a bookmark's history is left as archived; once it is repaired, `rewind volume defrag` \
                         lays it out");
                    self.block_count()
                }
                // A full disk, no descriptors, a failed sync: tried again at
                // a later pass (the pieces done, in order now, move nothing).
                Err(error) => return Err(error),
            };
            if stopped < self.block_count() {
                self.bookmark_layout.lock().under_way = Some((at, stopped));
                break;
            }
            self.bookmark_layout.lock().under_way = None;
            self.note_laid_out(at)?;
            tracing::debug!(volume = %self.name(), at = %DisplayTime(at), "bookmark's history laid out");
        }
        Ok(worked)
    }

    /// Saves that the history of the bookmarks at `at` is laid out, and
    /// forgets the times no bookmark names any more.
    fn note_laid_out(&self, at: Timestamp) -> Result<(), EngineError> {
        let mut bookmarks = self.history.bookmarks.lock();
        let mut next = bookmarks.clone();
        next.laid_out.push(at);
        next.laid_out.sort_unstable();
        next.laid_out.dedup();
        next.laid_out.retain(|&at| bookmarks.entries.iter().any(|bookmark| bookmark.timestamp == at));
        self.save_bookmarks(&next)?;
        *bookmarks = next;
        Ok(())
    }

    /// The bookmark to lay out next and the block to begin at: the one
    /// under way, unless deleted since, else the newest whose history is
    /// all archived and not laid out yet.
    fn next_layout(&self) -> Option<(Timestamp, u64)> {
        let awaiting = self.awaiting_layout();
        let mut layout = self.bookmark_layout.lock();
        match layout.under_way.take() {
            Some((at, first)) if awaiting.contains(&at) => {
                layout.under_way = Some((at, first));
                Some((at, first))
            }
            _ => awaiting.last().map(|&at| (at, 0)),
        }
    }

    /// The bookmarked times (ascending, each once) whose history is all
    /// archived and not laid out yet.
    fn awaiting_layout(&self) -> Vec<Timestamp> {
        let archived_before = self.index.archived_before();
        let bookmarks = self.history.bookmarks.lock();
        let mut awaiting: Vec<Timestamp> = bookmarks
            .entries
            .iter()
            .map(|bookmark| bookmark.timestamp)
            .filter(|at| *at < archived_before && bookmarks.laid_out.binary_search(at).is_err())
            .collect();
        awaiting.sort_unstable();
        awaiting.dedup();
        awaiting
    }

    /// How many bookmarks wait for their history to be laid out in the
    /// background (`VolumeStats::bookmarks_awaiting_layout`).
    pub(crate) fn bookmarks_awaiting_layout(&self) -> u64 {
        match self.lays_out_bookmarks() {
            true => self.awaiting_layout().len() as u64,
            false => 0,
        }
    }

    /// Whether this volume's bookmarks are laid out in the background: not
    /// where history is copied out at destage time (COW, where the index
    /// holds only what was copied), nor in a file tree (a 2^60-byte address
    /// space, planned piece by piece for ever).
    fn lays_out_bookmarks(&self) -> bool {
        self.config.lay_out_bookmarks && !self.rules().history_at_destage() && self.kind() == VolumeKind::Blocks
    }
}
