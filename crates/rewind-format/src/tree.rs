//! A file tree's bytes inside its volume (`docs/format/tree.md`): where the
//! superblock, the inode bitmap, the inodes and every file's data sit in the
//! volume's 2^60-byte address space, and the encodings of the superblock,
//! an inode and a directory block. No I/O here.
//!
//! Every inode and every file has a fixed place, so a file tree needs no
//! allocator for data and no extent maps: file `i`'s block `j` is block
//! `DATA_FIRST_BLOCK + i·FILE_BLOCKS_MAX + j` of the volume, and the volume
//! (a logging-layout volume, sparse) stores only what was written.

use rewind_types::Timestamp;

use crate::{crc32c, verify_crc, FormatError, Reader, Writer};

/// A tree's block size: every structure below is one block.
pub const TREE_BLOCK_BYTES: usize = 4096;
/// The size of a tree's volume: 2^48 blocks.
pub const TREE_VOLUME_BYTES: u64 = 1 << 60;
/// Inode numbers run from 1 (the root) to `INODES_MAX - 1`.
pub const INODES_MAX: u64 = 1 << 23;
/// The most blocks one file holds: 64 GiB.
pub const FILE_BLOCKS_MAX: u64 = 1 << 24;
pub const FILE_BYTES_MAX: u64 = FILE_BLOCKS_MAX * TREE_BLOCK_BYTES as u64;
pub const ROOT_INODE: u64 = 1;

pub const SUPERBLOCK_BLOCK: u64 = 0;
/// The inode bitmap (bit `i` set: inode `i` is in use), from this block.
pub const BITMAP_FIRST_BLOCK: u64 = 1;
pub const BITMAP_BLOCKS: u64 = INODES_MAX / (TREE_BLOCK_BYTES as u64 * 8);
pub const INODE_FIRST_BLOCK: u64 = 1024;
pub const DATA_FIRST_BLOCK: u64 = 1 << 47;

const _: () = assert!(BITMAP_FIRST_BLOCK + BITMAP_BLOCKS <= INODE_FIRST_BLOCK);
const _: () = assert!(INODE_FIRST_BLOCK + INODES_MAX <= DATA_FIRST_BLOCK);
const _: () = assert!((DATA_FIRST_BLOCK + INODES_MAX * FILE_BLOCKS_MAX) * TREE_BLOCK_BYTES as u64 == TREE_VOLUME_BYTES);

/// The volume block holding inode `ino`.
pub fn inode_block(ino: u64) -> u64 {
    assert!(ino > 0 && ino < INODES_MAX, "inode {ino} out of range");
    INODE_FIRST_BLOCK + ino
}

/// The volume block holding block `index` of file `ino`'s data.
pub fn data_block(ino: u64, index: u64) -> u64 {
    assert!(ino > 0 && ino < INODES_MAX && index < FILE_BLOCKS_MAX, "block {index} of inode {ino} out of range");
    DATA_FIRST_BLOCK + ino * FILE_BLOCKS_MAX + index
}

/// Block 0: says the volume holds a file tree, and in which format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub created: Timestamp,
}

impl Superblock {
    const MAGIC: u32 = u32::from_le_bytes(*b"RWTR");
    const VERSION: u32 = 1;
    const WHAT: &'static str = "file tree superblock";

    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer
            .u32(Self::MAGIC)
            .u32(Self::VERSION)
            .u32(TREE_BLOCK_BYTES as u32)
            .u32(0)
            .u64(INODES_MAX)
            .u64(FILE_BLOCKS_MAX)
            .u64(DATA_FIRST_BLOCK)
            .u64(self.created.unix_nanos());
        writer.into_sealed(TREE_BLOCK_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = Reader::new(Self::WHAT, bytes);
        reader.magic(Self::MAGIC)?;
        let version = reader.u32()?;
        let block_bytes = reader.u32()?;
        reader.u32()?;
        let (inodes_max, file_blocks_max, data_first) = (reader.u64()?, reader.u64()?, reader.u64()?);
        let created = Timestamp::from_unix_nanos(reader.u64()?);
        check_sealed(Self::WHAT, bytes)?;
        if version != Self::VERSION {
            return Err(FormatError::UnsupportedVersion { what: Self::WHAT, found: version, supported: Self::VERSION });
        }
        let expected = (TREE_BLOCK_BYTES as u32, INODES_MAX, FILE_BLOCKS_MAX, DATA_FIRST_BLOCK);
        if (block_bytes, inodes_max, file_blocks_max, data_first) != expected {
            return Err(reader.invalid(format!(
                "geometry {block_bytes}-byte blocks, {inodes_max} inodes, {file_blocks_max} blocks a file, data \
                 from block {data_first}; this build knows only {expected:?}"
            )));
        }
        Ok(Superblock { created })
    }
}

/// Checks the CRC-32C in the last 4 bytes of a block (see `Writer::into_sealed`).
fn check_sealed(what: &'static str, bytes: &[u8]) -> Result<(), FormatError> {
    if bytes.len() != TREE_BLOCK_BYTES {
        return Err(FormatError::Invalid { what, reason: format!("{} bytes instead of one block", bytes.len()) });
    }
    let (body, stored) = bytes.split_at(TREE_BLOCK_BYTES - 4);
    verify_crc(what, u32::from_le_bytes(stored.try_into().expect("4 bytes")), crc32c(body))
}

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileKind {
    Regular = 1,
    Directory = 2,
    Symlink = 3,
    CharDevice = 4,
    BlockDevice = 5,
    Socket = 6,
    Fifo = 7,
}

impl FileKind {
    pub fn from_code(code: u8) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::CharDevice,
            5 => FileKind::BlockDevice,
            6 => FileKind::Socket,
            7 => FileKind::Fifo,
            _ => return None,
        })
    }
}

/// Who last changed an inode: the client's address (IPv4 as IPv4-mapped
/// IPv6) and the user it said it was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Author {
    pub address: [u8; 16],
    pub port: u16,
    pub uid: u32,
}

/// The longest symlink target, kept in the inode.
pub const SYMLINK_TARGET_BYTES_MAX: usize = 2048;
const INODE_TARGET_OFFSET: usize = 256;

/// One inode, one block. A free inode keeps its generation, so that a
/// handle to what it held before is told from what it holds next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub generation: u32,
    /// `None`: free.
    pub kind: Option<FileKind>,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Devices: major and minor number.
    pub rdev: (u32, u32),
    pub atime: Timestamp,
    pub mtime: Timestamp,
    /// When the inode itself last changed.
    pub ctime: Timestamp,
    /// Directories: the parent directory (the root's is itself).
    pub parent: u64,
    /// Data blocks from here on read as zeros; below it, blocks past `size`
    /// may still hold bytes of a longer past, to be zeroed before the file
    /// grows over them.
    pub blocks_end: u64,
    /// The verifier of an exclusive create, until the first change after it.
    pub verifier: [u8; 8],
    pub author: Author,
    /// Symlinks: the target.
    pub target: Vec<u8>,
}

impl Inode {
    const MAGIC: u32 = u32::from_le_bytes(*b"RWIN");
    const WHAT: &'static str = "file tree inode";

    /// A free inode that never held anything.
    pub fn unused(ino: u64) -> Inode {
        Inode {
            ino,
            generation: 0,
            kind: None,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: (0, 0),
            atime: Timestamp::MIN,
            mtime: Timestamp::MIN,
            ctime: Timestamp::MIN,
            parent: 0,
            blocks_end: 0,
            verifier: [0; 8],
            author: Author::default(),
            target: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.target.len() <= SYMLINK_TARGET_BYTES_MAX);
        assert!(self.mode <= 0o7777 && self.blocks_end <= FILE_BLOCKS_MAX && self.size <= FILE_BYTES_MAX);
        let mut writer = Writer::new();
        writer
            .u32(Self::MAGIC)
            .u32(1)
            .u64(self.ino)
            .u32(self.generation)
            .u8(self.kind.map_or(0, |kind| kind as u8))
            .zeros(3)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u64(self.size)
            .u32(self.rdev.0)
            .u32(self.rdev.1)
            .u64(self.atime.unix_nanos())
            .u64(self.mtime.unix_nanos())
            .u64(self.ctime.unix_nanos())
            .u64(self.parent)
            .u64(self.blocks_end)
            .slice(&self.verifier)
            .slice(&self.author.address)
            .u32(u32::from(self.author.port))
            .u32(self.author.uid)
            .u32(self.target.len() as u32);
        assert!(writer.len() <= INODE_TARGET_OFFSET);
        writer.zeros(INODE_TARGET_OFFSET - writer.len()).slice(&self.target);
        writer.into_sealed(TREE_BLOCK_BYTES)
    }

    /// Decodes inode `ino` from its block; all zeros is an inode never used.
    pub fn decode(ino: u64, bytes: &[u8]) -> Result<Inode, FormatError> {
        if bytes.iter().all(|&byte| byte == 0) {
            return Ok(Inode::unused(ino));
        }
        let mut reader = Reader::new(Self::WHAT, bytes);
        reader.magic(Self::MAGIC)?;
        let version = reader.u32()?;
        check_sealed(Self::WHAT, bytes)?;
        if version != 1 {
            return Err(FormatError::UnsupportedVersion { what: Self::WHAT, found: version, supported: 1 });
        }
        let stored_ino = reader.u64()?;
        if stored_ino != ino {
            return Err(reader.invalid(format!("inode {stored_ino} found where inode {ino} belongs")));
        }
        let generation = reader.u32()?;
        let code = reader.u8()?;
        let kind = match code {
            0 => None,
            code => Some(FileKind::from_code(code).ok_or_else(|| reader.invalid(format!("unknown kind {code}")))?),
        };
        reader.take(3)?;
        let mode = reader.u32()?;
        let (nlink, uid, gid) = (reader.u32()?, reader.u32()?, reader.u32()?);
        let size = reader.u64()?;
        let rdev = (reader.u32()?, reader.u32()?);
        let time = |reader: &mut Reader<'_>| reader.u64().map(Timestamp::from_unix_nanos);
        let (atime, mtime, ctime) = (time(&mut reader)?, time(&mut reader)?, time(&mut reader)?);
        let (parent, blocks_end) = (reader.u64()?, reader.u64()?);
        let verifier = reader.take(8)?.try_into().expect("8 bytes");
        let address = reader.take(16)?.try_into().expect("16 bytes");
        let port = reader.u32()?;
        let author_uid = reader.u32()?;
        let target_len = reader.u32()? as usize;
        if mode > 0o7777 || blocks_end > FILE_BLOCKS_MAX || size > FILE_BYTES_MAX || port > u32::from(u16::MAX) {
            return Err(reader.invalid(format!("mode {mode:o}, size {size}, blocks end {blocks_end}, port {port}")));
        }
        if target_len > SYMLINK_TARGET_BYTES_MAX || (target_len > 0 && kind != Some(FileKind::Symlink)) {
            return Err(reader.invalid(format!("a symlink target of {target_len} bytes")));
        }
        let target = bytes[INODE_TARGET_OFFSET..INODE_TARGET_OFFSET + target_len].to_vec();
        Ok(Inode {
            ino,
            generation,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            rdev,
            atime,
            mtime,
            ctime,
            parent,
            blocks_end,
            verifier,
            author: Author { address, port: port as u16, uid: author_uid },
            target,
        })
    }
}

/// The longest name in a directory.
pub const NAME_BYTES_MAX: usize = 255;
/// A directory entry's fixed part: inode (8), record length (2), name
/// length (1), kind (1).
const ENTRY_HEADER_BYTES: usize = 12;

/// The bytes an entry with a name of `name_len` bytes needs.
pub fn entry_bytes(name_len: usize) -> usize {
    (ENTRY_HEADER_BYTES + name_len).next_multiple_of(8)
}

/// One name in a directory block, at `offset` within the block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub offset: u16,
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

/// A directory block, as ext2 lays one out: a chain of entries, each with
/// its record length, covering the block exactly; an entry's record may
/// hold free space after it, and an entry with inode 0 is free space. A
/// removed entry's space joins the entry before it (or, first in the block,
/// it becomes free), so the entries that stay never move: their offsets
/// are stable READDIR cookies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirBlock {
    bytes: Vec<u8>,
}

impl DirBlock {
    const WHAT: &'static str = "file tree directory block";

    pub fn empty() -> DirBlock {
        let mut bytes = vec![0u8; TREE_BLOCK_BYTES];
        bytes[8..10].copy_from_slice(&(TREE_BLOCK_BYTES as u16).to_le_bytes());
        DirBlock { bytes }
    }

    /// Checks the chain of entries.
    pub fn decode(bytes: &[u8]) -> Result<DirBlock, FormatError> {
        if bytes.len() != TREE_BLOCK_BYTES {
            return Err(FormatError::Invalid { what: Self::WHAT, reason: format!("{} bytes", bytes.len()) });
        }
        let block = DirBlock { bytes: bytes.to_vec() };
        let mut offset = 0;
        while offset < TREE_BLOCK_BYTES {
            let (ino, record, name_len, kind) = block.header(offset);
            let invalid = |reason: String| FormatError::Invalid { what: Self::WHAT, reason };
            if record < ENTRY_HEADER_BYTES || !record.is_multiple_of(8) || offset + record > TREE_BLOCK_BYTES {
                return Err(invalid(format!("entry at {offset} has a record of {record} bytes")));
            }
            if ino != 0 {
                if name_len == 0 || entry_bytes(name_len) > record || ino >= INODES_MAX {
                    return Err(invalid(format!("entry at {offset}: inode {ino}, a name of {name_len} bytes")));
                }
                if FileKind::from_code(kind).is_none() {
                    return Err(invalid(format!("entry at {offset} has unknown kind {kind}")));
                }
            }
            offset += record;
        }
        Ok(block)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn header(&self, offset: usize) -> (u64, usize, usize, u8) {
        let bytes = &self.bytes[offset..offset + ENTRY_HEADER_BYTES];
        let ino = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let record = u16::from_le_bytes(bytes[8..10].try_into().expect("2 bytes")) as usize;
        (ino, record, bytes[10] as usize, bytes[11])
    }

    fn set_header(&mut self, offset: usize, ino: u64, record: usize, name: &[u8], kind: u8) {
        self.bytes[offset..offset + 8].copy_from_slice(&ino.to_le_bytes());
        self.bytes[offset + 8..offset + 10].copy_from_slice(&(record as u16).to_le_bytes());
        self.bytes[offset + 10] = name.len() as u8;
        self.bytes[offset + 11] = kind;
        self.bytes[offset + ENTRY_HEADER_BYTES..offset + ENTRY_HEADER_BYTES + name.len()].copy_from_slice(name);
    }

    /// The names in this block, in offset order.
    pub fn entries(&self) -> Vec<DirEntry> {
        let mut entries = Vec::new();
        let mut offset = 0;
        while offset < TREE_BLOCK_BYTES {
            let (ino, record, name_len, kind) = self.header(offset);
            if ino != 0 {
                let name = self.bytes[offset + ENTRY_HEADER_BYTES..offset + ENTRY_HEADER_BYTES + name_len].to_vec();
                let kind = FileKind::from_code(kind).expect("checked by decode");
                entries.push(DirEntry { offset: offset as u16, ino, kind, name });
            }
            offset += record;
        }
        entries
    }

    /// The longest name a new entry here could have room for, in bytes of
    /// record (compare with [`entry_bytes`]).
    pub fn room_bytes(&self) -> usize {
        let mut room = 0;
        let mut offset = 0;
        while offset < TREE_BLOCK_BYTES {
            let (ino, record, name_len, _) = self.header(offset);
            let used = if ino == 0 { 0 } else { entry_bytes(name_len) };
            room = room.max(record - used);
            offset += record;
        }
        room
    }

    /// Adds an entry; `None` if no record has room for it.
    pub fn insert(&mut self, ino: u64, kind: FileKind, name: &[u8]) -> Option<u16> {
        assert!(ino > 0 && ino < INODES_MAX && !name.is_empty() && name.len() <= NAME_BYTES_MAX);
        let needed = entry_bytes(name.len());
        let mut offset = 0;
        while offset < TREE_BLOCK_BYTES {
            let (existing, record, name_len, existing_kind) = self.header(offset);
            if existing == 0 && record >= needed {
                self.set_header(offset, ino, record, name, kind as u8);
                return Some(offset as u16);
            }
            let used = if existing == 0 { record } else { entry_bytes(name_len) };
            if existing != 0 && record - used >= needed {
                let existing_name =
                    self.bytes[offset + ENTRY_HEADER_BYTES..offset + ENTRY_HEADER_BYTES + name_len].to_vec();
                self.set_header(offset, existing, used, &existing_name, existing_kind);
                self.set_header(offset + used, ino, record - used, name, kind as u8);
                return Some((offset + used) as u16);
            }
            offset += record;
        }
        None
    }

    /// Removes the entry at `offset`; its record joins the one before it.
    pub fn remove(&mut self, offset: u16) {
        let offset = offset as usize;
        let (ino, record, _, _) = self.header(offset);
        assert_ne!(ino, 0, "removing a free record");
        let mut previous = None;
        let mut at = 0;
        while at < offset {
            previous = Some(at);
            at += self.header(at).1;
        }
        assert_eq!(at, offset, "an entry starts at {offset}");
        // The removed name's bytes are cleared, so history compresses and
        // nothing of it lingers in the slack.
        self.bytes[offset..offset + record].fill(0);
        match previous {
            Some(previous) => {
                let (previous_ino, previous_record, name_len, kind) = self.header(previous);
                let name = self.bytes[previous + ENTRY_HEADER_BYTES..previous + ENTRY_HEADER_BYTES + name_len].to_vec();
                self.set_header(previous, previous_ino, previous_record + record, &name, kind);
            }
            None => self.set_header(offset, 0, record, &[], 0),
        }
    }

    /// Points the entry at `offset` at another inode (a rename over it).
    pub fn retarget(&mut self, offset: u16, ino: u64, kind: FileKind) {
        let offset = offset as usize;
        assert_ne!(self.header(offset).0, 0, "retargeting a free record");
        self.bytes[offset..offset + 8].copy_from_slice(&ino.to_le_bytes());
        self.bytes[offset + 11] = kind as u8;
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_and_inode_round_trip_and_damage_is_caught() {
        let superblock = Superblock { created: Timestamp::from_unix_nanos(77) };
        let bytes = superblock.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), superblock);
        let mut damaged = bytes.clone();
        damaged[40] ^= 1;
        assert!(Superblock::decode(&damaged).is_err());

        let inode = Inode {
            kind: Some(FileKind::Symlink),
            generation: 3,
            mode: 0o755,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 5,
            mtime: Timestamp::from_unix_nanos(9),
            author: Author { address: [7; 16], port: 700, uid: 1000 },
            target: b"a/b/c".to_vec(),
            ..Inode::unused(42)
        };
        let bytes = inode.encode();
        assert_eq!(bytes.len(), TREE_BLOCK_BYTES);
        assert_eq!(Inode::decode(42, &bytes).unwrap(), inode);
        assert!(Inode::decode(43, &bytes).is_err(), "an inode in another's place is refused");
        for at in [0, 20, 100, INODE_TARGET_OFFSET + 2, TREE_BLOCK_BYTES - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(Inode::decode(42, &damaged).is_err(), "byte {at}");
        }
        assert_eq!(Inode::decode(9, &[0; TREE_BLOCK_BYTES]).unwrap(), Inode::unused(9));
    }

    #[test]
    fn directory_blocks_keep_offsets_and_reuse_space() {
        let mut block = DirBlock::empty();
        assert!(block.is_empty());
        let a = block.insert(5, FileKind::Regular, b"a").unwrap();
        let long = vec![b'x'; NAME_BYTES_MAX];
        let b = block.insert(6, FileKind::Directory, &long).unwrap();
        let c = block.insert(7, FileKind::Symlink, b"c").unwrap();
        assert_eq!((a, b), (0, entry_bytes(1) as u16));
        let names = |block: &DirBlock| block.entries().into_iter().map(|entry| entry.name).collect::<Vec<_>>();
        assert_eq!(names(&block), vec![b"a".to_vec(), long.clone(), b"c".to_vec()]);
        block.remove(b);
        assert_eq!(block.entries().iter().map(|entry| entry.offset).collect::<Vec<_>>(), vec![a, c]);
        // The freed record is found again.
        assert_eq!(block.insert(8, FileKind::Regular, b"d"), Some(b));
        block.remove(a);
        assert_eq!(block.insert(9, FileKind::Regular, b"e"), Some(a), "a free first record is reused");
        block.retarget(c, 11, FileKind::Regular);
        let decoded = DirBlock::decode(block.as_bytes()).unwrap();
        let entries = decoded.entries();
        assert_eq!(entries.iter().map(|entry| entry.ino).collect::<Vec<_>>(), vec![9, 8, 11]);
        // Full: names of 255 bytes take 272 bytes of record, 15 to a block.
        let mut full = DirBlock::empty();
        let count = (0..100).take_while(|index| full.insert(index + 1, FileKind::Regular, &long).is_some()).count();
        assert_eq!(count, TREE_BLOCK_BYTES / entry_bytes(NAME_BYTES_MAX));
        assert!(full.room_bytes() < entry_bytes(NAME_BYTES_MAX));
        // Garbage chains are refused.
        assert!(DirBlock::decode(&[0; TREE_BLOCK_BYTES]).is_err(), "never written");
        let mut bad = DirBlock::empty().as_bytes().to_vec();
        bad[8..10].copy_from_slice(&4000u16.to_le_bytes());
        assert!(DirBlock::decode(&bad).is_err(), "a chain that does not cover the block");
    }

    #[test]
    fn the_address_map_stays_inside_the_volume() {
        assert_eq!(inode_block(ROOT_INODE), INODE_FIRST_BLOCK + 1);
        let last = data_block(INODES_MAX - 1, FILE_BLOCKS_MAX - 1);
        assert_eq!((last + 1) * TREE_BLOCK_BYTES as u64, TREE_VOLUME_BYTES);
        assert!(std::panic::catch_unwind(|| data_block(1, FILE_BLOCKS_MAX)).is_err());
    }
}
