//! The current store: the present contents of a volume in `current.img`, at
//! their natural offsets, so reads of the present cost one `pread`, and
//! sequential reads stay sequential however the volume was written. Next to it,
//! `current.meta` holds a [`BlockMeta`] per block: its CRC-32C (checked on
//! every read), whether it is data or zeros, and the time of its latest version
//! (which lets a view tell at once whether a block changed after its time).
//!
//! The store is written only with records already durable in the journal (the
//! write-ahead rule), so it can never hold data the journal could lose; it is
//! synced at checkpoints, and recovery re-applies the journal after the last
//! checkpoint.
//!
//! The files are sparse; space is allocated (`File::allocate`) before a
//! write into a region not yet allocated since the store was opened, 64 KiB
//! at a time, so a full disk fails the destage that needed space — which
//! is retried — and never the sync of a checkpoint, which would poison.

use std::sync::Arc;

use parking_lot::Mutex;
use rewind_format::current::{BlockMeta, BLOCK_META_BYTES};
use rewind_io::{File, OpenMode, Storage};
use rewind_types::{BlockIndex, BlockSize};

use crate::EngineError;

pub struct CurrentStore {
    data: Arc<dyn File>,
    meta: Arc<dyn File>,
    data_path: String,
    meta_path: String,
    block_size: BlockSize,
    block_count: u64,
    data_allocated: Allocated,
    meta_allocated: Allocated,
}

/// Which regions of a file have been allocated since it was opened.
struct Allocated {
    /// One bit per `REGION_BYTES`.
    bits: Mutex<Vec<u64>>,
}

const REGION_BYTES: u64 = 64 << 10;

/// The longest `pwrite` of data. The page cache sizes a buffered write's
/// folios by its length, and ext4 walks every buffer head of a folio on each
/// write into it and on its writeback: on this machine's kernel (6.18) a
/// 4 KiB write into a block once written in a 1 MiB run cost 20 µs of CPU,
/// into one written 32 KiB at a time 3.9 µs, while a sequential run costs
/// 1.3× as much CPU in 32 KiB writes (`bench/folios.py`, BENCHMARKS.md).
/// The destager's random 4 KiB writes are what the reads right after
/// random writes share a core with.
const WRITE_PIECE_BYTES: usize = 32 << 10;

impl Allocated {
    fn new(file_bytes: u64) -> Allocated {
        Allocated { bits: Mutex::new(vec![0; file_bytes.div_ceil(REGION_BYTES).div_ceil(64) as usize]) }
    }

    /// Allocates the regions of `offset..offset + length` that are not yet.
    fn ensure(&self, file: &dyn File, offset: u64, length: u64) -> std::io::Result<()> {
        let (first, end) = (offset / REGION_BYTES, (offset + length).div_ceil(REGION_BYTES));
        let mut bits = self.bits.lock();
        let marked = |bits: &[u64], region: u64| bits[(region / 64) as usize] >> (region % 64) & 1 == 1;
        if (first..end).all(|region| marked(&bits, region)) {
            return Ok(());
        }
        file.allocate(first * REGION_BYTES, (end - first) * REGION_BYTES)?;
        for region in first..end {
            bits[(region / 64) as usize] |= 1 << (region % 64);
        }
        Ok(())
    }

    /// A hole was punched: the regions it touches must be allocated again.
    fn forget(&self, offset: u64, length: u64) {
        let mut bits = self.bits.lock();
        for region in offset / REGION_BYTES..(offset + length).div_ceil(REGION_BYTES) {
            bits[(region / 64) as usize] &= !(1 << (region % 64));
        }
    }
}

impl CurrentStore {
    pub fn open(
        storage: &dyn Storage,
        dir: &str,
        block_size: BlockSize,
        block_count: u64,
        mode: OpenMode,
    ) -> Result<CurrentStore, EngineError> {
        CurrentStore::open_named(storage, dir, "current", block_size, block_count, mode)
    }

    /// A store of the same format in `{dir}/{stem}.img` and `{stem}.meta`
    /// (a promoted clone's copy of its base is one).
    pub(crate) fn open_named(
        storage: &dyn Storage,
        dir: &str,
        stem: &str,
        block_size: BlockSize,
        block_count: u64,
        mode: OpenMode,
    ) -> Result<CurrentStore, EngineError> {
        let data_path = format!("{dir}/{stem}.img");
        let meta_path = format!("{dir}/{stem}.meta");
        let data = storage.open_file(&data_path, mode).map_err(EngineError::io(&data_path))?;
        let meta = storage.open_file(&meta_path, mode).map_err(EngineError::io(&meta_path))?;
        let data_bytes = block_count * u64::from(block_size.bytes());
        let meta_bytes = block_count * BLOCK_META_BYTES as u64;
        // Sparse files of the full size; holes read as zeros (and as "unwritten").
        if data.size_bytes().map_err(EngineError::io(&data_path))? != data_bytes {
            data.set_len(data_bytes).map_err(EngineError::io(&data_path))?;
        }
        if meta.size_bytes().map_err(EngineError::io(&meta_path))? != meta_bytes {
            meta.set_len(meta_bytes).map_err(EngineError::io(&meta_path))?;
        }
        let (data_allocated, meta_allocated) = (Allocated::new(data_bytes), Allocated::new(meta_bytes));
        Ok(CurrentStore { data, meta, data_path, meta_path, block_size, block_count, data_allocated, meta_allocated })
    }

    /// The apparent size of both files.
    pub fn size_bytes(&self) -> u64 {
        self.block_count * (u64::from(self.block_size.bytes()) + BLOCK_META_BYTES as u64)
    }

    fn check_range(&self, first: BlockIndex, count: u64) {
        assert!(first.0.checked_add(count).is_some_and(|end| end <= self.block_count), "range checked by caller");
    }

    /// Reads the metadata of `count` blocks from `first`; `None` for an
    /// entry that fails its check (which a concurrent update can cause, so
    /// a caller that needs the entry retries before calling it corruption).
    pub fn read_meta(
        &self,
        first: BlockIndex,
        count: u64,
        out: &mut Vec<Option<BlockMeta>>,
    ) -> Result<(), EngineError> {
        self.check_range(first, count);
        let mut bytes = vec![0u8; count as usize * BLOCK_META_BYTES];
        self.meta
            .read_exact_at(&mut bytes, first.0 * BLOCK_META_BYTES as u64)
            .map_err(EngineError::io(&self.meta_path))?;
        out.clear();
        out.extend(bytes.chunks_exact(BLOCK_META_BYTES).map(|entry| BlockMeta::decode(entry).ok()));
        Ok(())
    }

    /// The lowest block at or after `first` whose metadata may say it was
    /// written: the entries before it read as zeros, which is unwritten
    /// (the metadata file's holes, `File::next_data`).
    pub fn next_written(&self, first: BlockIndex) -> Result<Option<BlockIndex>, EngineError> {
        self.check_range(first, 0);
        let meta_bytes = BLOCK_META_BYTES as u64;
        let next = self.meta.next_data(first.0 * meta_bytes).map_err(EngineError::io(&self.meta_path))?;
        Ok(next.map(|offset| BlockIndex(offset / meta_bytes)).filter(|block| block.0 < self.block_count))
    }

    /// The block after the stretch of metadata entries written from `first`
    /// on (where the metadata file's next hole starts), so that a look
    /// at the blocks from `first` can stop there; `first` if its entry lies
    /// in a hole.
    pub fn written_until(&self, first: BlockIndex) -> Result<BlockIndex, EngineError> {
        self.check_range(first, 0);
        let meta_bytes = BLOCK_META_BYTES as u64;
        let hole = self.meta.next_hole(first.0 * meta_bytes).map_err(EngineError::io(&self.meta_path))?;
        Ok(BlockIndex(hole.div_ceil(meta_bytes).min(self.block_count)))
    }

    pub fn data_path(&self) -> &str {
        &self.data_path
    }

    /// The data file, for writing behind a copy into the store (see
    /// `rewind_io::WriteBehind`).
    pub(crate) fn data_file(&self) -> &dyn File {
        &*self.data
    }

    pub fn read_data(&self, first: BlockIndex, buf: &mut [u8]) -> Result<(), EngineError> {
        self.check_range(first, buf.len() as u64 / u64::from(self.block_size.bytes()));
        self.data.read_exact_at(buf, self.block_size.offset_of(first)).map_err(EngineError::io(&self.data_path))
    }

    /// Writes whole blocks of data and then their metadata.
    pub fn write_blocks(&self, first: BlockIndex, data: &[u8], metas: &[BlockMeta]) -> Result<(), EngineError> {
        self.write_block_stretches(first, &[data], metas, &mut Vec::new())
    }

    /// [`CurrentStore::write_blocks`] for blocks that lie in memory in
    /// `stretches` (whole blocks each; together the blocks from `first`,
    /// in order), written from where they lie: the destager's blocks,
    /// straight from the journal's memory. Stretches shorter than a piece
    /// (`WRITE_PIECE_BYTES`), such as random writes' blocks, are copied
    /// into `staging` until they make one, unless one is all there is.
    pub fn write_block_stretches(
        &self,
        first: BlockIndex,
        stretches: &[&[u8]],
        metas: &[BlockMeta],
        staging: &mut Vec<u8>,
    ) -> Result<(), EngineError> {
        let bytes: usize = stretches.iter().map(|stretch| stretch.len()).sum();
        assert_eq!(bytes, metas.len() * self.block_size.bytes() as usize);
        self.check_range(first, metas.len() as u64);
        let offset = self.block_size.offset_of(first);
        self.data_allocated.ensure(&*self.data, offset, bytes as u64).map_err(EngineError::io(&self.data_path))?;
        staging.clear();
        let (mut at, mut staged_at) = (offset, offset);
        for (index, stretch) in stretches.iter().enumerate() {
            assert!(stretch.len().is_multiple_of(self.block_size.bytes() as usize), "whole blocks");
            let alone = staging.is_empty() && index + 1 == stretches.len();
            if stretch.len() >= WRITE_PIECE_BYTES || alone {
                self.write_pieces(staging, staged_at)?;
                staging.clear();
                self.write_pieces(stretch, at)?;
            } else {
                if staging.is_empty() {
                    staged_at = at;
                }
                staging.extend_from_slice(stretch);
                if staging.len() >= WRITE_PIECE_BYTES {
                    self.write_pieces(staging, staged_at)?;
                    staging.clear();
                }
            }
            at += stretch.len() as u64;
        }
        self.write_pieces(staging, staged_at)?;
        self.write_meta(first, metas)
    }

    /// Writes `data` at `offset` of the data file, a piece at a time.
    fn write_pieces(&self, data: &[u8], offset: u64) -> Result<(), EngineError> {
        for (at, piece) in (offset..).step_by(WRITE_PIECE_BYTES).zip(data.chunks(WRITE_PIECE_BYTES)) {
            self.data.write_all_at(piece, at).map_err(EngineError::io(&self.data_path))?;
        }
        Ok(())
    }

    /// Deallocates blocks (they read as zeros) and then writes their metadata.
    pub fn zero_blocks(&self, first: BlockIndex, metas: &[BlockMeta]) -> Result<(), EngineError> {
        self.check_range(first, metas.len() as u64);
        let length = metas.len() as u64 * u64::from(self.block_size.bytes());
        let offset = self.block_size.offset_of(first);
        self.data_allocated.forget(offset, length);
        self.data.punch_hole(offset, length).map_err(EngineError::io(&self.data_path))?;
        self.write_meta(first, metas)
    }

    fn write_meta(&self, first: BlockIndex, metas: &[BlockMeta]) -> Result<(), EngineError> {
        let mut bytes = vec![0u8; metas.len() * BLOCK_META_BYTES];
        for (meta, slot) in metas.iter().zip(bytes.chunks_exact_mut(BLOCK_META_BYTES)) {
            meta.encode(slot);
        }
        let offset = first.0 * BLOCK_META_BYTES as u64;
        self.meta_allocated
            .ensure(&*self.meta, offset, bytes.len() as u64)
            .map_err(EngineError::io(&self.meta_path))?;
        self.meta.write_all_at(&bytes, offset).map_err(EngineError::io(&self.meta_path))
    }

    /// Writes behind the destager: waits for the blocks whose writeback
    /// the call before started, then starts it for what was written since.
    /// The page cache then never holds more than two parts' worth of the
    /// store's dirty pages, which the kernel would otherwise write back
    /// gigabytes at a time, and a journal commit's `fdatasync` would wait
    /// behind them (seconds, measured: BENCHMARKS.md). The pages stay
    /// cached: present reads want them.
    pub fn write_behind(&self) -> Result<(), EngineError> {
        let bytes = self.block_count * u64::from(self.block_size.bytes());
        self.data.wait_writeback(0, bytes).map_err(EngineError::io(&self.data_path))?;
        self.data.start_writeback(0, bytes).map_err(EngineError::io(&self.data_path))
    }

    pub fn sync(&self) -> Result<(), EngineError> {
        self.data.sync_data().map_err(EngineError::io(&self.data_path))?;
        self.meta.sync_data().map_err(EngineError::io(&self.meta_path))
    }
}

#[cfg(test)]
mod tests {
    use rewind_format::current::{BlockMeta, BlockState};
    use rewind_io::{OpenMode, SimConfig, SimStorage, Storage};
    use rewind_types::{BlockIndex, BlockSize, Timestamp};

    use super::{CurrentStore, WRITE_PIECE_BYTES};

    /// Stretches of every mix of lengths — shorter than a piece (staged),
    /// a piece or longer (written where they lie), a short one alone —
    /// land where their blocks go: the store reads back their
    /// concatenation, and the blocks around stay unwritten.
    #[test]
    fn stretches_of_any_length_are_written_where_their_blocks_go() {
        const BLOCK: usize = 4096;
        let piece_blocks = WRITE_PIECE_BYTES / BLOCK;
        let patterns: [&[usize]; 6] = [
            &[1],
            &[1, 1, 1],
            &[piece_blocks + 3],
            &[2, piece_blocks, 1, 1],
            &[piece_blocks - 1, 1, 2 * piece_blocks, 3],
            &[1; 20],
        ];
        for (index, lengths) in patterns.iter().enumerate() {
            let storage = SimStorage::new(SimConfig::default(), index as u64);
            storage.create_dir_all("v").unwrap();
            let store =
                CurrentStore::open(&storage, "v", BlockSize::new(BLOCK as u32).unwrap(), 256, OpenMode::CreateNew)
                    .unwrap();
            let owned: Vec<Vec<u8>> = lengths
                .iter()
                .enumerate()
                .map(|(at, &blocks)| (0..blocks * BLOCK).map(|byte| (at * 7 + byte / BLOCK + 1) as u8).collect())
                .collect();
            let stretches: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            let blocks: usize = lengths.iter().sum();
            let meta = BlockMeta { state: BlockState::Data, crc32c: 0, timestamp: Timestamp::from_unix_nanos(1) };
            let first = 5;
            store.write_block_stretches(BlockIndex(first), &stretches, &vec![meta; blocks], &mut Vec::new()).unwrap();
            let mut read = vec![0xff; (blocks + 2) * BLOCK];
            store.read_data(BlockIndex(first - 1), &mut read).unwrap();
            let expected: Vec<u8> = [&[0; BLOCK][..], &owned.concat(), &[0; BLOCK]].concat();
            assert!(read == expected, "stretches of {lengths:?} blocks read back otherwise");
        }
    }
}
