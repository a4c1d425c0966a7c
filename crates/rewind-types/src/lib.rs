//! Plain data shared by every Rewind crate. No I/O, no dependencies.
//!
//! Index, count and size are different things and get different types: a
//! [`BlockIndex`] addresses a block, a `block_count` counts them, a `size_bytes`
//! measures bytes. On-disk formats use these fixed-width types, never `usize`.

use std::fmt;

pub mod block_hash;
mod layout;
pub use layout::Layout;

/// Nanoseconds since the Unix epoch (UTC). Time enters the engine only as a value
/// of this type; nothing below the front ends reads a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const MIN: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(u64::MAX);
    pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

    pub const fn from_unix_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    pub const fn unix_nanos(self) -> u64 {
        self.0
    }

    pub const fn unix_seconds(self) -> u64 {
        self.0 / Self::NANOS_PER_SECOND
    }

    /// The next representable instant; used to keep a volume's version times
    /// strictly increasing when two writes arrive within one clock tick.
    pub fn next(self) -> Self {
        Timestamp(self.0.checked_add(1).expect("timestamp overflow"))
    }

    /// Converts a wall-clock reading. Only front ends read the clock; the
    /// engine gets the result as an argument.
    pub fn from_system_time(time: std::time::SystemTime) -> Self {
        let since_epoch = time.duration_since(std::time::UNIX_EPOCH).expect("clock set after 1970");
        Timestamp(u64::try_from(since_epoch.as_nanos()).expect("clock set before 2554"))
    }

    pub fn saturating_sub_nanos(self, nanos: u64) -> Self {
        Timestamp(self.0.saturating_sub(nanos))
    }

    pub fn saturating_add_nanos(self, nanos: u64) -> Self {
        Timestamp(self.0.saturating_add(nanos))
    }
}

/// Log sequence number: the position of a record in a volume's journal. Starts
/// at 1; 0 means "nothing yet".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn next(self) -> Lsn {
        Lsn(self.0 + 1)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Address of one block within a volume: byte offset / block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockIndex(pub u64);

impl fmt::Display for BlockIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A volume's block size: a power of two from 512 B to 64 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockSize(u32);

impl BlockSize {
    pub const MIN_BYTES: u32 = 512;
    pub const MAX_BYTES: u32 = 64 * 1024;
    pub const DEFAULT: BlockSize = BlockSize(4096);

    pub fn new(size_bytes: u32) -> Result<Self, InvalidBlockSize> {
        if size_bytes.is_power_of_two() && (Self::MIN_BYTES..=Self::MAX_BYTES).contains(&size_bytes) {
            Ok(BlockSize(size_bytes))
        } else {
            Err(InvalidBlockSize(size_bytes))
        }
    }

    pub const fn bytes(self) -> u32 {
        self.0
    }

    pub const fn shift(self) -> u32 {
        self.0.trailing_zeros()
    }

    pub fn block_of(self, offset_bytes: u64) -> BlockIndex {
        BlockIndex(offset_bytes >> self.shift())
    }

    pub fn offset_of(self, block: BlockIndex) -> u64 {
        block.0 << self.shift()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidBlockSize(pub u32);

impl fmt::Display for InvalidBlockSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block size {} is not a power of two between {} B and {} KiB",
            self.0,
            BlockSize::MIN_BYTES,
            BlockSize::MAX_BYTES / 1024
        )
    }
}

impl std::error::Error for InvalidBlockSize {}

/// A chunk in the node's chunk store: a block's bytes, stored once however
/// many versions (of however many volumes) share them. Ids start at 1; an id
/// freed by garbage collection may name another chunk later, which is why
/// every read also checks the version's CRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId(pub u64);

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where the bytes of one block version live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VersionData {
    /// The block was zeroed (TRIM or WRITE_ZEROES), or held only zeros when
    /// it was archived; no bytes are stored.
    Zero,
    /// A block-sized payload at `offset` bytes into journal segment `segment`.
    Journal { segment: u32, offset: u32 },
    /// Archived into the chunk store.
    Chunk(ChunkId),
}

/// One version of one block: what the version index maps `(block, time)` to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub block: BlockIndex,
    pub timestamp: Timestamp,
    pub data: VersionData,
    /// CRC-32C of the block's bytes (of a zero block for `VersionData::Zero`),
    /// checked on every read of this version.
    pub crc32c: u32,
}

/// A volume's name: 1–64 characters from `[A-Za-z0-9._-]`, not starting with
/// `.` or `-`. `@` is excluded because `NAME@TIME` names a view.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeName(String);

impl VolumeName {
    pub const LENGTH_MAX: usize = 64;

    pub fn new(name: &str) -> Result<Self, InvalidName> {
        validate_name(name, "volume").map(|()| VolumeName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A bookmark's name: same alphabet as volume names, and it must not look like
/// a time (it may not start with a digit, `+` or `-`), so `db@NAME` is never
/// ambiguous.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BookmarkName(String);

impl BookmarkName {
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        validate_name(name, "bookmark")?;
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(InvalidName {
                what: "bookmark",
                name: name.to_owned(),
                reason: "must not start with a digit (it would read as a time)",
            });
        }
        Ok(BookmarkName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BookmarkName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn validate_name(name: &str, what: &'static str) -> Result<(), InvalidName> {
    let invalid = |reason| InvalidName { what, name: name.to_owned(), reason };
    if name.is_empty() || name.len() > VolumeName::LENGTH_MAX {
        return Err(invalid("must be 1 to 64 characters long"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(invalid("may only contain letters, digits, '.', '_' and '-'"));
    }
    if name.starts_with(['.', '-']) {
        return Err(invalid("must not start with '.' or '-'"));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidName {
    pub what: &'static str,
    pub name: String,
    pub reason: &'static str,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} name {:?}: {}", self.what, self.name, self.reason)
    }
}

impl std::error::Error for InvalidName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_bounds() {
        assert!(BlockSize::new(512).is_ok());
        assert!(BlockSize::new(65536).is_ok());
        assert!(BlockSize::new(256).is_err());
        assert!(BlockSize::new(131072).is_err());
        assert!(BlockSize::new(3000).is_err());
        let bs = BlockSize::new(4096).unwrap();
        assert_eq!(bs.block_of(8191), BlockIndex(1));
        assert_eq!(bs.offset_of(BlockIndex(3)), 12288);
    }

    #[test]
    fn names() {
        assert!(VolumeName::new("db-1.vm_2").is_ok());
        assert!(VolumeName::new("db@x").is_err());
        assert!(VolumeName::new("").is_err());
        assert!(VolumeName::new(".hidden").is_err());
        assert!(VolumeName::new(&"a".repeat(65)).is_err());
        assert!(BookmarkName::new("before-upgrade").is_ok());
        assert!(BookmarkName::new("2026").is_err());
        assert!(BookmarkName::new("-10m").is_err());
    }
}
