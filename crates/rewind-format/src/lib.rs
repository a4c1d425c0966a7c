//! Rewind's on-disk byte formats, and nothing else: no I/O, no allocation
//! policy, no knowledge of files. Every structure carries a magic number, a
//! format version and a CRC-32C checksum, checked right after reading and
//! computed right before writing. All integers are little-endian and of fixed
//! width. The byte-level layout is documented in `docs/format/`.

mod bytes;
pub mod chunks;
pub mod current;
pub mod index;
pub mod journal;
pub mod meta;
pub mod pack;

pub use bytes::{Reader, Writer};

/// Computes the CRC-32C (Castagnoli) checksum used throughout the formats.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a CRC-32C over further bytes.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{what}: bad magic number {found:#010x}")]
    BadMagic { what: &'static str, found: u32 },
    #[error("{what}: unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion { what: &'static str, found: u32, supported: u32 },
    #[error("{what}: damaged (checksum mismatch: stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { what: &'static str, stored: u32, computed: u32 },
    /// The bytes are all there but not what was written.
    #[error("{what}: damaged: {reason}")]
    Damaged { what: &'static str, reason: String },
    #[error("{what}: truncated ({available} bytes, need {needed})")]
    Truncated { what: &'static str, available: usize, needed: usize },
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

/// Checks that a structure's format version is the one this build reads.
pub(crate) fn check_version(what: &'static str, found: u32, supported: u32) -> Result<(), FormatError> {
    if found == supported {
        Ok(())
    } else {
        Err(FormatError::UnsupportedVersion { what, found, supported })
    }
}

/// Checks a stored checksum against the computed one.
pub fn verify_crc(what: &'static str, stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored == computed {
        Ok(())
    } else {
        Err(FormatError::Checksum { what, stored, computed })
    }
}
