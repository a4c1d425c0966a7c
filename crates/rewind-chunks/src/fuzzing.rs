//! Hooks for the fuzz targets in `fuzz/` (feature `fuzzing`, never enabled
//! by the product): the dedup index is internal to the store, so this opens
//! one from whatever files a storage holds and drives it the way the store
//! does.

use std::sync::Arc;

use rewind_format::pack::ChunkHash;
use rewind_io::Storage;
use rewind_types::ChunkId;

use crate::dedup::{DedupConfig, DedupIndex};
use crate::ChunkError;

/// Opens the dedup index in `dir`, looks up each of `hashes` in its runs
/// (the ids found for each, possibly stale, as the store sees them), then
/// flushes it with nothing in memory, which merges runs whose size class is
/// full (every id counted live): what the store does after archiving.
pub fn dedup_lookups_then_merge(
    storage: Arc<dyn Storage>,
    dir: &str,
    config: DedupConfig,
    hashes: &[ChunkHash],
) -> Result<Vec<Vec<ChunkId>>, ChunkError> {
    let mut index = DedupIndex::open(storage, dir, config)?;
    let mut found = Vec::with_capacity(hashes.len());
    for hash in hashes {
        let mut ids = Vec::new();
        index.find_in_runs(hash, &mut ids)?;
        found.push(ids);
    }
    let packs_covered = index.packs_covered();
    index.flush(packs_covered, &|_| true)?;
    Ok(found)
}
