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
//! runs. The versions keep their chunk ids: only the chunk table's slots
//! move, crash-safely as a repack's do, so the index, the other views and
//! the other volumes sharing a chunk are untouched, and every read made
//! meanwhile finds the chunk in its old pack or its new one. The old
//! records become dead space for collection. Blocks the view reads from
//! the journal, the current store or a clone's base are not history in the
//! chunk store, and stay where they are (a clone's base point is laid out
//! by a defrag of the base's view).

use rewind_chunks::RelocateReport;
use rewind_types::{BlockIndex, ChunkId, Timestamp};

use crate::volume::read::{Copies, OverlayAccess, Source, View};
use crate::{EngineError, Volume};

/// Blocks planned and laid out at a time: 32 MiB of 4 KiB blocks, the
/// chunk store's pack size.
const PIECE_BLOCKS: u64 = 8192;

/// What a defrag did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Blocks of the view whose data is archived history.
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
        let blocks = volume.size_bytes() / u64::from(volume.block_size().bytes());
        let mut report = DefragReport::default();
        let mut first = 0;
        while first < blocks {
            let count = PIECE_BLOCKS.min(blocks - first);
            let ids = volume.archived_chunks(self.at(), BlockIndex(first), count)?;
            report.blocks_archived += ids.len() as u64;
            report.add(volume.chunks.relocate(&ids)?);
            first += count;
            progress(first, blocks);
        }
        Ok(report)
    }
}

impl Volume {
    /// The chunks that blocks `first..first + count` read as of `at`, in
    /// block order, for those whose data is archived history.
    fn archived_chunks(&self, at: Timestamp, first: BlockIndex, count: u64) -> Result<Vec<ChunkId>, EngineError> {
        let sources =
            self.planned_or_corrupt(|| self.plan(Some(at), OverlayAccess::Lock, Copies::Read, first, count))?;
        Ok(sources
            .iter()
            .filter_map(|source| match source {
                Source::Chunk { id, .. } => Some(*id),
                _ => None,
            })
            .collect())
    }
}
