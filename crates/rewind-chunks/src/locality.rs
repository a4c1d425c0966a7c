//! The dedup index's locality cache, after Data Domain's locality-preserved
//! caching (Zhu, Li and Patterson, FAST '08): at 10^8 chunks the dedup runs
//! and the chunk table no longer fit in memory, and a lookup that hits costs
//! two random reads. But chunks archived together get neighbouring ids, and
//! history that comes back — an image copied again, a file restored and
//! changed — repeats them in the same order. So when a lookup that went to
//! the runs hits near the previous hit, the table slots of the next ids are
//! read in one sequential read and their hashes kept here: the rest of the
//! stream hits in memory.
//!
//! An entry is right as long as its id is not freed (freed ids may be
//! reused for other bytes): the store clears the cache whenever ids are
//! freed (collection, recounting). Moving a chunk to another pack keeps its
//! id and hash.

use rewind_format::pack::ChunkHash;
use rewind_types::ChunkId;
use rustc_hash::FxHashMap;

/// Ids read ahead on a hit: 64 KiB of table.
pub(crate) const WINDOW_IDS: u64 = 1 << 10;
/// Entries per generation; two generations are kept (the older is dropped
/// whole when the newer fills), so memory stays within about 10 MiB.
const GENERATION_ENTRIES_MAX: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct LocalityCache {
    newer: FxHashMap<ChunkHash, ChunkId>,
    older: FxHashMap<ChunkHash, ChunkId>,
    /// The id of the last hit, cached or not.
    last_hit: Option<u64>,
}

impl LocalityCache {
    pub fn find(&self, hash: &ChunkHash) -> Option<ChunkId> {
        self.newer.get(hash).or_else(|| self.older.get(hash)).copied()
    }

    /// Notes a hit on `id`; true if it is near the one before, so that the
    /// ids after it are worth reading ahead.
    pub fn hit(&mut self, id: ChunkId) -> bool {
        let near = self.last_hit.is_some_and(|last| last.abs_diff(id.0) <= WINDOW_IDS);
        self.last_hit = Some(id.0);
        near
    }

    pub fn insert(&mut self, hash: ChunkHash, id: ChunkId) {
        if self.newer.len() >= GENERATION_ENTRIES_MAX {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(hash, id);
    }

    pub fn clear(&mut self) {
        *self = LocalityCache::default();
    }

    pub fn memory_bytes(&self) -> u64 {
        let entry = (size_of::<ChunkHash>() + size_of::<ChunkId>() + 1) as u64;
        (self.newer.capacity() + self.older.capacity()) as u64 * entry
    }
}
