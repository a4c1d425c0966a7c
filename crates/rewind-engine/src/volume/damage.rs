//! What a volume knows to be damaged in its history: archived versions
//! whose chunk is damaged or missing. Such damage fails only the reads that
//! need those versions (views at those times, archiving them elsewhere);
//! the present and the rest of the history are served. It is found when the
//! node counts the chunks history refers to (on open and on a recount), and
//! shown by `rewind volume info` until the history is repaired or deleted.

use parking_lot::Mutex;
use rewind_types::{ChunkId, Timestamp, VersionData};
use rustc_hash::FxHashSet;

use crate::timespec::DisplayTime;
use crate::{EngineError, Volume};

/// Damage notes of one volume, newest last.
#[derive(Default)]
pub(crate) struct HistoryDamage {
    notes: Mutex<Vec<String>>,
}

/// The most notes kept: each says how much it covers.
const NOTES_MAX: usize = 16;

impl Volume {
    /// Marks every chunk the volume's history refers to (opening the node,
    /// or recounting).
    pub(crate) fn mark_chunks(&self, mark: &mut dyn FnMut(ChunkId, u32)) -> Result<(), EngineError> {
        let block_bytes = self.block_size().bytes();
        self.index.for_each_chunk(&mut |version| {
            let VersionData::Chunk(id) = version.data else { unreachable!("archived versions") };
            mark(id, block_bytes);
            Ok(())
        })?;
        Ok(())
    }

    /// Appends a description of what [`Volume::mark_chunks`] would count
    /// (see `VersionIndex::describe`), naming the volume.
    pub(crate) fn describe_chunks(&self, out: &mut Vec<u8>) {
        let name = self.name().as_str().as_bytes();
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&self.created().unix_nanos().to_le_bytes());
        self.index.describe(out);
    }

    pub(crate) fn note_history_damage(&self, note: &str) {
        let mut notes = self.damage.notes.lock();
        if notes.len() < NOTES_MAX && !notes.iter().any(|known| known == note) {
            notes.push(note.to_owned());
        }
    }

    /// Notes which of the volume's archived versions refer to `missing`
    /// chunks (`reasons` says why each is missing), as one line: how many,
    /// which blocks, written when.
    pub(crate) fn attribute_missing_chunks(
        &self,
        missing: &FxHashSet<u64>,
        reasons: &[(ChunkId, String)],
    ) -> Result<(), EngineError> {
        let mut count = 0u64;
        let (mut first, mut last) = (Timestamp::MAX, Timestamp::MIN);
        let (mut block_low, mut block_high) = (u64::MAX, 0);
        let mut example = None;
        self.index.for_each_chunk(&mut |version| {
            let VersionData::Chunk(id) = version.data else { unreachable!("archived versions") };
            if missing.contains(&id.0) {
                count += 1;
                first = first.min(version.timestamp);
                last = last.max(version.timestamp);
                block_low = block_low.min(version.block.0);
                block_high = block_high.max(version.block.0);
                example.get_or_insert(id);
            }
            Ok(())
        })?;
        let Some(example) = example else { return Ok(()) };
        let reason = reasons.iter().find(|(id, _)| *id == example).map_or("", |(_, reason)| reason.as_str());
        let note = format!(
            "{count} archived versions of blocks {block_low}..={block_high}, written from {} to {}, refer to \
             chunks that are damaged or missing (chunk {example}: {reason}); views that need them fail",
            DisplayTime(first),
            DisplayTime(last)
        );
        tracing::error!(volume = %self.name(), %note, "history damaged");
        self.note_history_damage(&note);
        Ok(())
    }

    /// What is known to be damaged in the volume's history, if anything.
    pub fn history_damage(&self) -> Vec<String> {
        self.damage.notes.lock().clone()
    }
}
