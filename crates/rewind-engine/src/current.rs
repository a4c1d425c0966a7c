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

use std::sync::Arc;

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
}

impl CurrentStore {
    pub fn open(
        storage: &dyn Storage,
        dir: &str,
        block_size: BlockSize,
        block_count: u64,
        mode: OpenMode,
    ) -> Result<CurrentStore, EngineError> {
        let data_path = format!("{dir}/current.img");
        let meta_path = format!("{dir}/current.meta");
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
        Ok(CurrentStore { data, meta, data_path, meta_path, block_size, block_count })
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

    pub fn read_data(&self, first: BlockIndex, buf: &mut [u8]) -> Result<(), EngineError> {
        self.check_range(first, buf.len() as u64 / u64::from(self.block_size.bytes()));
        self.data.read_exact_at(buf, self.block_size.offset_of(first)).map_err(EngineError::io(&self.data_path))
    }

    /// Writes whole blocks of data and then their metadata.
    pub fn write_blocks(&self, first: BlockIndex, data: &[u8], metas: &[BlockMeta]) -> Result<(), EngineError> {
        assert_eq!(data.len(), metas.len() * self.block_size.bytes() as usize);
        self.check_range(first, metas.len() as u64);
        rewind_io::write_reserved(&*self.data, data, self.block_size.offset_of(first))
            .map_err(EngineError::io(&self.data_path))?;
        self.write_meta(first, metas)
    }

    /// Deallocates blocks (they read as zeros) and then writes their metadata.
    pub fn zero_blocks(&self, first: BlockIndex, metas: &[BlockMeta]) -> Result<(), EngineError> {
        self.check_range(first, metas.len() as u64);
        let length = metas.len() as u64 * u64::from(self.block_size.bytes());
        self.data.punch_hole(self.block_size.offset_of(first), length).map_err(EngineError::io(&self.data_path))?;
        self.write_meta(first, metas)
    }

    fn write_meta(&self, first: BlockIndex, metas: &[BlockMeta]) -> Result<(), EngineError> {
        let mut bytes = vec![0u8; metas.len() * BLOCK_META_BYTES];
        for (meta, slot) in metas.iter().zip(bytes.chunks_exact_mut(BLOCK_META_BYTES)) {
            meta.encode(slot);
        }
        rewind_io::write_reserved(&*self.meta, &bytes, first.0 * BLOCK_META_BYTES as u64)
            .map_err(EngineError::io(&self.meta_path))
    }

    pub fn sync(&self) -> Result<(), EngineError> {
        self.data.sync_data().map_err(EngineError::io(&self.data_path))?;
        self.meta.sync_data().map_err(EngineError::io(&self.meta_path))
    }
}
