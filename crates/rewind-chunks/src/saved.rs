//! Reference counts saved by a clean shutdown (`chunks/counts` and
//! `chunks/counts.meta`, docs/format/chunk-store.md), so that opening a
//! store of 10^8 chunks does not read every run of every volume and the
//! whole chunk table to count them again.
//!
//! Counting is what makes the counts trustworthy after a crash, so saved
//! counts must never outlive the moment they describe. Three rules keep
//! them honest: they are written only by a clean shutdown, as the store's
//! last act (it is closed afterwards); opening *removes* both files, durably,
//! before anything can change, so a crash at any later point leaves nothing
//! to trust and the next open counts; and they are used only if the
//! embedder's description of its history (which runs of which volumes) and
//! the store's own files (table length, packs) are what they were when saved.
//! Damage to either file is reported and costs only the time of a count.

use rewind_format::chunks::SavedCounts;
use rewind_format::{crc32c_append, FormatError};
use rewind_io::{read_file, write_file_atomic, OpenMode, Storage};

use crate::ChunkError;

const COUNTS: &str = "counts";
const COUNTS_META: &str = "counts.meta";
/// Counts read or written at a time: 1 MiB.
const PIECE_COUNTS: usize = 1 << 18;

/// Saved counts, read back.
pub(crate) struct Saved {
    pub meta: SavedCounts,
    pub counts: Vec<u32>,
}

/// Reads the counts a clean shutdown saved in `dir`, if any, and removes
/// them (see the module documentation). Damaged counts are reported and
/// dropped: `None`, as if there were none.
pub(crate) fn take(storage: &dyn Storage, dir: &str) -> Result<Option<Saved>, ChunkError> {
    let meta_path = format!("{dir}/{COUNTS_META}");
    let body_path = format!("{dir}/{COUNTS}");
    let saved = if storage.exists(&meta_path).map_err(ChunkError::io(&meta_path))? {
        match read(storage, &meta_path, &body_path) {
            Ok(saved) => Some(saved),
            Err(problem) => {
                tracing::warn!(%problem, "the reference counts saved at shutdown are damaged; counting them again");
                None
            }
        }
    } else {
        None
    };
    // The meta file first: without it the body is never used.
    let mut removed = false;
    for path in [meta_path, body_path.clone(), format!("{body_path}.tmp")] {
        if storage.exists(&path).map_err(ChunkError::io(&path))? {
            storage.remove_file(&path).map_err(ChunkError::io(&path))?;
            removed = true;
        }
    }
    if removed {
        storage.sync_dir(dir).map_err(ChunkError::sync(dir))?;
    }
    Ok(saved)
}

fn read(storage: &dyn Storage, meta_path: &str, body_path: &str) -> Result<Saved, String> {
    let bytes = read_file(storage, meta_path).map_err(|error| format!("{meta_path}: {error}"))?;
    let meta = SavedCounts::decode(&bytes).map_err(|error: FormatError| format!("{meta_path}: {error}"))?;
    let file = storage.open_file(body_path, OpenMode::Existing).map_err(|error| format!("{body_path}: {error}"))?;
    let size_bytes = file.size_bytes().map_err(|error| format!("{body_path}: {error}"))?;
    if size_bytes != meta.count_entries * 4 {
        return Err(format!("{body_path} has {size_bytes} bytes, not {} counts", meta.count_entries));
    }
    let entries = usize::try_from(meta.count_entries).expect("counts fit in memory");
    let mut counts = Vec::with_capacity(entries);
    let mut piece = vec![0u8; PIECE_COUNTS * 4];
    let mut crc = 0;
    while counts.len() < entries {
        let piece = &mut piece[..(entries - counts.len()).min(PIECE_COUNTS) * 4];
        file.read_exact_at(piece, counts.len() as u64 * 4).map_err(|error| format!("{body_path}: {error}"))?;
        crc = crc32c_append(crc, piece);
        counts.extend(piece.chunks_exact(4).map(|bytes| u32::from_le_bytes(bytes.try_into().expect("4 bytes"))));
    }
    if crc != meta.counts_crc32c {
        return Err(format!("{body_path}: CRC-32C {crc:#010x}, expected {:#010x}", meta.counts_crc32c));
    }
    Ok(Saved { meta, counts })
}

/// Writes `counts` and `meta` (whose count length and CRC are filled in
/// here) to `dir`: the counts first, the meta file last, each synced, so a
/// crash while saving leaves either no meta file or one whose CRC the
/// counts fail.
pub(crate) fn save(storage: &dyn Storage, dir: &str, mut meta: SavedCounts, counts: &[u32]) -> Result<(), ChunkError> {
    let body_path = format!("{dir}/{COUNTS}");
    let temporary = format!("{body_path}.tmp");
    if storage.exists(&temporary).map_err(ChunkError::io(&temporary))? {
        storage.remove_file(&temporary).map_err(ChunkError::io(&temporary))?;
    }
    let file = storage.open_file(&temporary, OpenMode::CreateNew).map_err(ChunkError::io(&temporary))?;
    file.allocate(0, counts.len() as u64 * 4).map_err(ChunkError::io(&temporary))?;
    let mut bytes = Vec::with_capacity(PIECE_COUNTS * 4);
    let mut crc = 0;
    for (index, piece) in counts.chunks(PIECE_COUNTS).enumerate() {
        bytes.clear();
        bytes.extend(piece.iter().flat_map(|count| count.to_le_bytes()));
        crc = crc32c_append(crc, &bytes);
        let offset = (index * PIECE_COUNTS * 4) as u64;
        file.write_all_at(&bytes, offset).map_err(ChunkError::io(&temporary))?;
    }
    file.sync_data().map_err(ChunkError::sync(&temporary))?;
    drop(file);
    storage.rename(&temporary, &body_path).map_err(ChunkError::io(&body_path))?;
    (meta.count_entries, meta.counts_crc32c) = (counts.len() as u64, crc);
    let meta_path = format!("{dir}/{COUNTS_META}");
    write_file_atomic(storage, &meta_path, &meta.encode()).map_err(ChunkError::io(&meta_path))
}
