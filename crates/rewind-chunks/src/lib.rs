//! The chunk store: block versions named by the BLAKE3 hash of their bytes,
//! stored once per node however many versions and volumes share them,
//! compressed with zstd where that pays, in write-once, checksummed pack
//! files (MYCDP's chunks, seed 004 §3.2; byte layouts in
//! `docs/format/pack.md` and `docs/format/chunk-store.md`). [`ChunkStore`]
//! puts the pieces together: the chunk table, the dedup index, reference
//! counts and garbage collection.
//!
//! A pack is written once, front to back, and sealed: footer, trailer, then
//! made durable under its number by the pack store it lives in
//! ([`pack_store`]: a local directory, or object storage). Nothing may refer to a chunk before its pack is
//! sealed, so a pack found unsealed after a crash holds nothing anyone needs;
//! a pack that something refers to and that fails to open or verify is
//! corruption.
//!
//! Every read checks the stored bytes' CRC-32C, decompresses, and checks the
//! BLAKE3 hash of the result against the chunk's name.

pub mod conformance;
mod dedup;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod locality;
pub mod meta_store;
mod pack;
pub mod pack_store;
pub mod peers;
pub mod retention;
mod saved;
mod store;
mod table;
pub mod tiered;

pub use dedup::DedupConfig;
pub use meta_store::{LocalMetaStore, MetaStore};
pub use pack::{Check, Compressor, PackReader, PackWriter, SealedPack, SAVING_SHARE_MIN};
pub use pack_store::{Generation, LocalPackStore, PackStore, PackUpload, StoredPack};
pub use rewind_format::pack::{ChunkHash, Codec};
pub use store::{
    ArchiveSession, ChunkSet, ChunkStats, ChunkStore, ChunkStoreConfig, CollectPhase, CollectReport, Counting,
    InSegment, Measured, OpenReport, RelocateReport, RELOCATE_RUN_CHUNKS_MIN,
};

use std::io;

use rewind_types::ChunkId;

/// The BLAKE3 hash that names a chunk.
pub fn chunk_hash(bytes: &[u8]) -> ChunkHash {
    blake3::hash(bytes).into()
}

/// Where one chunk's record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkLocation {
    pub pack: u64,
    /// Byte offset of the record from the start of the pack (of the bytes
    /// themselves, for a bare chunk).
    pub offset: u64,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
    /// The CRC-32C of a bare chunk: one with no record around it, in an
    /// adopted journal segment (`rewind_format::chunks::TableSlot::bare_crc32c`).
    pub bare_crc32c: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("chunk store I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    /// A sync failed: the device may have dropped what it was asked to keep.
    #[error("the chunk store could not make {path} durable: {source}")]
    SyncFailed { path: String, source: io::Error },
    /// The pack has no valid trailer: it was being written when the process
    /// stopped. Corruption if anything refers to it.
    #[error("pack {path} was never sealed: {reason}")]
    Unsealed { path: String, reason: String },
    #[error("chunk store corrupt in {path} at byte {offset}: {reason}")]
    Corrupt { path: String, offset: u64, reason: String },
    /// History refers to a chunk the store cannot produce.
    #[error("chunk {id} is missing from the chunk store: {reason}")]
    Missing { id: ChunkId, reason: String },
    #[error(
        "the chunk store is poisoned by a failed sync ({cause}); no archiving or garbage collection \
         until the server restarts"
    )]
    Poisoned { cause: String },
    /// Reference counts may be wrong after an earlier failure; collection
    /// waits until they have been counted again.
    #[error("garbage collection waits for every chunk reference to be counted again ({cause})")]
    CountsStale { cause: String },
}

impl ChunkError {
    fn io(path: &str) -> impl FnOnce(io::Error) -> ChunkError + '_ {
        move |source| ChunkError::Io { path: path.to_owned(), source }
    }

    fn sync(path: &str) -> impl FnOnce(io::Error) -> ChunkError + '_ {
        move |source| ChunkError::SyncFailed { path: path.to_owned(), source }
    }

    /// For a call that may have lost what it was to make durable (a
    /// pack's finish or delete): a sync error unless it is one that passes.
    fn sync_or_io(path: &str) -> impl FnOnce(io::Error) -> ChunkError + '_ {
        move |source| match rewind_io::is_transient(&source) {
            true => ChunkError::Io { path: path.to_owned(), source },
            false => ChunkError::SyncFailed { path: path.to_owned(), source },
        }
    }

    fn corrupt(path: &str, offset: u64, reason: impl ToString) -> ChunkError {
        ChunkError::Corrupt { path: path.to_owned(), offset, reason: reason.to_string() }
    }

    /// Whether the error is a condition that passes (a full disk, no file
    /// descriptors left): the operation may be tried again later.
    pub fn is_transient(&self) -> bool {
        matches!(self, ChunkError::Io { source, .. } if rewind_io::is_transient(source))
    }
}

/// The file name of pack `pack` (16 hex digits, so names sort by number).
pub fn pack_name(pack: u64) -> String {
    format!("{pack:016x}.pack")
}
