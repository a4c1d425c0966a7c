//! The chunk table: chunk id → where its chunk is, one 64-byte slot per id
//! at offset `id · 64` of `chunks/table` (slot 0 is the header).
//!
//! The table is the authority on locations; pack footers carry the ids too,
//! so a repack interrupted by a crash is completed from the new pack's
//! footer. Slots are written only for chunks in sealed packs, and synced
//! before anything that refers to their ids is made durable. A slot that
//! nothing refers to may be stale (its id was freed); nobody reads it.
//!
//! Reads are positional and take no lock; writes are serialised by the
//! store. A read that overlaps the write of the same slot (a repack moving a
//! chunk that is being read) can see part of the old slot and part of the
//! new: `pread` and `pwrite` of one file are not atomic with respect to each
//! other. Such a slot fails its checksum, and is read once more while no
//! slot is being written before it is called damaged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use rewind_format::chunks::{decode_table_header, encode_table_header, TableSlot, TABLE_SLOT_BYTES};
use rewind_format::FormatError;
use rewind_io::{File, OpenMode, Storage};
use rewind_types::ChunkId;

use crate::ChunkError;

pub(crate) struct ChunkTable {
    path: String,
    file: Arc<dyn File>,
    /// One past the highest id with a slot in the file.
    id_end: AtomicU64,
    /// Held while a slot is written, and to read again a slot that failed
    /// its check (see the module doc).
    writing: Mutex<()>,
}

const SLOT: u64 = TABLE_SLOT_BYTES as u64;

impl ChunkTable {
    pub fn open(storage: &dyn Storage, path: &str) -> Result<ChunkTable, ChunkError> {
        let file = storage.open_file(path, OpenMode::OpenOrCreate).map_err(ChunkError::io(path))?;
        let size = file.size_bytes().map_err(ChunkError::io(path))?;
        if size < SLOT {
            // New, or its creation was cut short: nothing can refer to it yet.
            file.write_all_at(&encode_table_header(), 0).map_err(ChunkError::io(path))?;
            file.sync_data().map_err(ChunkError::sync(path))?;
            storage.sync_dir(rewind_io::parent_dir(path)).map_err(ChunkError::sync(path))?;
        } else {
            let mut header = [0; TABLE_SLOT_BYTES];
            file.read_exact_at(&mut header, 0).map_err(ChunkError::io(path))?;
            if let Err(error) = decode_table_header(&header) {
                // The header holds nothing but the format: write it again.
                tracing::warn!(%path, %error, "rewriting the chunk table's damaged header");
                file.write_all_at(&encode_table_header(), 0).map_err(ChunkError::io(path))?;
                file.sync_data().map_err(ChunkError::sync(path))?;
            }
        }
        // A slot torn off the end by a crash belonged to a chunk nothing refers to.
        let id_end = (size / SLOT).max(1);
        Ok(ChunkTable { path: path.to_owned(), file, id_end: AtomicU64::new(id_end), writing: Mutex::new(()) })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn id_end(&self) -> u64 {
        self.id_end.load(Ordering::Acquire)
    }

    /// The slot of `id`, if it was ever written.
    pub fn read(&self, id: ChunkId) -> Result<Option<TableSlot>, ChunkError> {
        if id.0 == 0 || id.0 >= self.id_end() {
            return Ok(None);
        }
        let mut bytes = [0; TABLE_SLOT_BYTES];
        self.file.read_exact_at(&mut bytes, id.0 * SLOT).map_err(ChunkError::io(&self.path))?;
        self.slot_in(&bytes, id.0, id).map_err(|error| ChunkError::corrupt(&self.path, id.0 * SLOT, error))
    }

    /// The bytes of the slot of `id`, read while no slot is being written:
    /// whole, so a slot that fails its check now is damaged.
    fn read_settled(&self, id: ChunkId) -> std::io::Result<[u8; TABLE_SLOT_BYTES]> {
        let _writing = self.writing.lock();
        let mut bytes = [0; TABLE_SLOT_BYTES];
        self.file.read_exact_at(&mut bytes, id.0 * SLOT)?;
        Ok(bytes)
    }

    /// The slot of `id` in `bytes`, which [`ChunkTable::read_range`] filled
    /// from id `first` on. A slot that fails its check is read again while
    /// no slot is being written; only then is it damaged.
    pub fn slot_in(&self, bytes: &[u8], first: u64, id: ChunkId) -> Result<Option<TableSlot>, FormatError> {
        assert!(id.0 >= first);
        let at = (id.0 - first) as usize * TABLE_SLOT_BYTES;
        let decoded = TableSlot::decode(&bytes[at..at + TABLE_SLOT_BYTES], id);
        match decoded {
            Err(error) => match self.read_settled(id) {
                Ok(again) => TableSlot::decode(&again, id),
                // Not readable again: the first check's failure stands.
                Err(_) => Err(error),
            },
            whole => whole,
        }
    }

    /// Reads the slots of ids `first..first + count` (all below `id_end`)
    /// into `out` as raw bytes, for a sequential scan.
    pub fn read_range(&self, first: u64, count: u64, out: &mut Vec<u8>) -> Result<(), ChunkError> {
        assert!(first >= 1 && first + count <= self.id_end());
        out.resize((count * SLOT) as usize, 0);
        self.file.read_exact_at(out, first * SLOT).map_err(ChunkError::io(&self.path))
    }

    /// Reserves disk space for the slots of every id below `id_end`, so
    /// writing them cannot meet a full disk.
    pub fn reserve(&self, id_end: u64) -> Result<(), ChunkError> {
        self.file.allocate(0, id_end * SLOT).map_err(ChunkError::io(&self.path))
    }

    pub fn write(&self, id: ChunkId, slot: &TableSlot) -> Result<(), ChunkError> {
        assert!(id.0 > 0);
        let _writing = self.writing.lock();
        self.file.write_all_at(&slot.encode(id), id.0 * SLOT).map_err(ChunkError::io(&self.path))?;
        self.id_end.fetch_max(id.0 + 1, Ordering::AcqRel);
        Ok(())
    }

    /// Zeroes the slot of `id`, a freed id, as if never written.
    pub fn clear(&self, id: ChunkId) -> Result<(), ChunkError> {
        assert!(id.0 > 0 && id.0 < self.id_end());
        let _writing = self.writing.lock();
        self.file.write_all_at(&[0; TABLE_SLOT_BYTES], id.0 * SLOT).map_err(ChunkError::io(&self.path))
    }

    pub fn sync(&self) -> Result<(), ChunkError> {
        self.file.sync_data().map_err(ChunkError::sync(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_io::OsStorage;

    #[test]
    fn a_slot_read_while_it_is_written_is_never_taken_for_damage() {
        let dir = tempfile::tempdir().unwrap();
        let storage = OsStorage::new(dir.path()).unwrap();
        let table = ChunkTable::open(&storage, "table").unwrap();
        const IDS: u64 = 256;
        let slot = |pack: u64| TableSlot {
            hash: [pack as u8; 32],
            pack,
            offset: 7,
            stored_bytes: 100,
            raw_bytes: 4096,
            bare_crc32c: None,
        };
        for id in 1..=IDS {
            table.write(ChunkId(id), &slot(1)).unwrap();
        }
        let rounds = 4000u64;
        let done = std::sync::atomic::AtomicBool::new(false);
        let reads = std::thread::scope(|scope| {
            scope.spawn(|| {
                // A repack moving the chunks back and forth.
                for round in 0..rounds {
                    for id in 1..=IDS {
                        table.write(ChunkId(id), &slot(1 + round % 2)).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            });
            let mut reads = 0u64;
            let mut bytes = Vec::new();
            while !done.load(Ordering::Acquire) {
                table.read_range(1, IDS, &mut bytes).unwrap();
                for id in 1..=IDS {
                    let id = ChunkId(id);
                    let ranged = table.slot_in(&bytes, 1, id).unwrap_or_else(|error| panic!("read {reads}: {error}"));
                    assert!(matches!(ranged, Some(TableSlot { pack: 1 | 2, .. })), "read {reads}: {ranged:?}");
                }
                let read = table.read(ChunkId(reads % IDS + 1)).unwrap_or_else(|error| panic!("read {reads}: {error}"));
                assert!(matches!(read, Some(TableSlot { pack: 1 | 2, .. })), "read {reads}: {read:?}");
                reads += 1;
            }
            reads
        });
        assert!(reads > 0, "the reader ran beside {rounds} rounds of writes");
    }
}
