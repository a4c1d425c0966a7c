//! What the present and the past share: reading a tree's inodes and
//! directories from a block source, handles, attributes, permission checks
//! and directory listings. [`Tree`](crate::Tree) and
//! [`TreeView`](crate::TreeView) each implement [`Store`] (with their own
//! caches) and get [`Namespace`] from it.

use std::sync::Arc;

use rewind_format::tree::{
    data_block, inode_block, Author, DirBlock, FileKind, Inode, INODES_MAX, NAME_BYTES_MAX, ROOT_INODE,
    TREE_BLOCK_BYTES,
};
use rewind_types::Timestamp;
use rustc_hash::FxHashMap;

use crate::TreeError;

const BLOCK: u64 = TREE_BLOCK_BYTES as u64;
/// READDIR cookies 1 and 2 are "." and ".."; entries follow from 3.
const COOKIE_FIRST_ENTRY: u64 = 3;

/// Names an inode in one incarnation: a handle to a removed file, or to the
/// file its inode number holds now, is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub ino: u64,
    pub generation: u32,
}

/// Who asks: the credentials of the request (AUTH_SYS) and where it came
/// from (an IPv6 address, IPv4 mapped into it, and a port: the front end
/// turns its socket address into these, the core knows no sockets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub gids: Vec<u32>,
    pub address: [u8; 16],
    pub port: u16,
    /// Set when a proxy replays a change the upstream server has already
    /// allowed: it is made as root, and recorded as this user's.
    pub acting_for: Option<u32>,
}

impl Caller {
    pub fn root(address: [u8; 16], port: u16) -> Caller {
        Caller { uid: 0, gid: 0, gids: Vec::new(), address, port, acting_for: None }
    }

    /// Root, making a change that `uid` made on the upstream server.
    pub fn acting_for(uid: u32, address: [u8; 16], port: u16) -> Caller {
        Caller { acting_for: Some(uid), ..Caller::root(address, port) }
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.contains(&gid)
    }

    /// The caller as an inode records its last writer.
    pub(crate) fn author(&self) -> Author {
        Author { address: self.address, port: self.port, uid: self.acting_for.unwrap_or(self.uid) }
    }

    /// Whether the permission bits of `inode` give the caller every one of
    /// `wanted` (4 read, 2 write, 1 execute). Root passes, except that
    /// executing needs some execute bit (as the kernel does).
    pub(crate) fn may(&self, inode: &Inode, wanted: u32) -> bool {
        if self.uid == 0 {
            return wanted & 1 == 0 || inode.kind == Some(FileKind::Directory) || inode.mode & 0o111 != 0;
        }
        let bits = match () {
            _ if self.uid == inode.uid => inode.mode >> 6,
            _ if self.in_group(inode.gid) => inode.mode >> 3,
            _ => inode.mode,
        } & 7;
        bits & wanted == wanted
    }
}

/// The rights of NFSv3's ACCESS, as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
}

/// An inode as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub handle: Handle,
    pub kind: FileKind,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Bytes of blocks the file may use (whole blocks up to its size).
    pub used_bytes: u64,
    pub rdev: (u32, u32),
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub author: Author,
}

impl Attributes {
    pub(crate) fn of(inode: &Inode) -> Attributes {
        Attributes {
            handle: Handle { ino: inode.ino, generation: inode.generation },
            kind: inode.kind.expect("attributes of a live inode"),
            mode: inode.mode,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            size: inode.size,
            used_bytes: inode.size.next_multiple_of(BLOCK),
            rdev: inode.rdev,
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            author: inode.author,
        }
    }
}

/// One name of a directory listing, with the attributes of what it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryPlus {
    /// Where a listing resumes after this entry.
    pub cookie: u64,
    pub name: Vec<u8>,
    pub attributes: Attributes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadDir {
    pub entries: Vec<DirEntryPlus>,
    /// No entries after these.
    pub eof: bool,
}

/// Where a name sits in its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub block: u32,
    pub offset: u16,
    pub ino: u64,
    pub kind: FileKind,
}

impl Slot {
    fn cookie(&self) -> u64 {
        u64::from(self.block) * BLOCK + u64::from(self.offset) + COOKIE_FIRST_ENTRY
    }
}

/// A directory's blocks, decoded, with its names indexed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Directory {
    pub blocks: Vec<DirBlock>,
    pub names: FxHashMap<Vec<u8>, Slot>,
}

impl Directory {
    pub(crate) fn decode(dir: &Inode, bytes: &[u8]) -> Result<Directory, TreeError> {
        let mut directory = Directory::default();
        for (index, block) in bytes.chunks_exact(TREE_BLOCK_BYTES).enumerate() {
            let block = DirBlock::decode(block)
                .map_err(|error| TreeError::damaged(format_args!("directory {} block {index}", dir.ino), error))?;
            for entry in block.entries() {
                let slot = Slot { block: index as u32, offset: entry.offset, ino: entry.ino, kind: entry.kind };
                if directory.names.insert(entry.name, slot).is_some() {
                    return Err(TreeError::Damaged(format!("directory {} names something twice", dir.ino)));
                }
            }
            directory.blocks.push(block);
        }
        Ok(directory)
    }

    /// The names from `cookie` on, in cookie order.
    fn after(&self, cookie: u64) -> Vec<(&[u8], Slot)> {
        let mut slots: Vec<(&[u8], Slot)> = self
            .names
            .iter()
            .map(|(name, slot)| (name.as_slice(), *slot))
            .filter(|(_, slot)| slot.cookie() > cookie)
            .collect();
        slots.sort_unstable_by_key(|(_, slot)| slot.cookie());
        slots
    }
}

/// Reads a tree's structures: what the present and each view provide.
pub(crate) trait Store {
    /// Bytes of the tree's volume.
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), TreeError>;
    /// Inode `ino` (below `INODES_MAX`), live or free.
    fn inode(&self, ino: u64) -> Result<Inode, TreeError>;
    /// The decoded directory of `dir`, a live directory inode.
    fn directory(&self, dir: &Inode) -> Result<Arc<Directory>, TreeError>;
    /// The present is; the past is not.
    fn writable(&self) -> bool;
    /// Runs `read` on the tree as it is at one moment. The present holds
    /// its lock throughout, so that a directory and the inodes it names
    /// agree: a REMOVE or RENAME on another connection cannot free an
    /// inode between the two reads. The past does not change.
    fn at_one_moment<R>(&self, read: impl FnOnce(&dyn Store) -> R) -> R
    where
        Self: Sized;

    /// The live inode a handle names, or `Stale`.
    fn live(&self, handle: Handle) -> Result<Inode, TreeError> {
        if handle.ino == 0 || handle.ino >= INODES_MAX {
            return Err(TreeError::Stale);
        }
        let inode = self.inode(handle.ino)?;
        match inode.kind.is_some() && inode.generation == handle.generation {
            true => Ok(inode),
            false => Err(TreeError::Stale),
        }
    }

    fn live_directory(&self, handle: Handle) -> Result<Inode, TreeError> {
        let inode = self.live(handle)?;
        match inode.kind {
            Some(FileKind::Directory) => Ok(inode),
            _ => Err(TreeError::NotDirectory),
        }
    }
}

/// Reads inode `ino` from a block source.
pub(crate) fn load_inode(store: &impl Store, ino: u64) -> Result<Inode, TreeError> {
    let mut block = vec![0u8; TREE_BLOCK_BYTES];
    store.read_bytes(inode_block(ino) * BLOCK, &mut block)?;
    Inode::decode(ino, &block).map_err(|error| TreeError::damaged(format_args!("inode {ino}"), error))
}

/// Reads and decodes the directory `dir` from a block source.
pub(crate) fn load_directory(store: &impl Store, dir: &Inode) -> Result<Directory, TreeError> {
    if !dir.size.is_multiple_of(BLOCK) || dir.size / BLOCK > u64::from(u32::MAX) {
        return Err(TreeError::Damaged(format!("directory {} has a size of {} bytes", dir.ino, dir.size)));
    }
    let mut bytes = vec![0u8; dir.size as usize];
    store.read_bytes(data_block(dir.ino, 0) * BLOCK, &mut bytes)?;
    Directory::decode(dir, &bytes)
}

pub(crate) fn check_name(name: &[u8]) -> Result<(), TreeError> {
    if name.len() > NAME_BYTES_MAX {
        return Err(TreeError::NameTooLong(name.len()));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(TreeError::Invalid(format!(
            "{:?} is not a name a directory can hold",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// Reading a tree, now or as it was: what NFS's read-only procedures need.
pub trait Namespace {
    fn getattr(&self, handle: Handle) -> Result<Attributes, TreeError>;
    /// The root directory's attributes (its handle is in them).
    fn getattr_root(&self) -> Result<Attributes, TreeError>;
    /// The attributes of `name` in `dir` ("." and ".." included).
    fn lookup(&self, dir: Handle, name: &[u8], caller: &Caller) -> Result<Attributes, TreeError>;
    /// Up to `count` bytes from `offset`, and whether they reach the end.
    fn read(&self, file: Handle, offset: u64, count: u32, caller: &Caller) -> Result<(Vec<u8>, bool), TreeError>;
    fn readlink(&self, link: Handle) -> Result<Vec<u8>, TreeError>;
    /// Up to `entries_max` entries after `cookie` (0: from the start).
    fn readdir(&self, dir: Handle, cookie: u64, entries_max: usize, caller: &Caller) -> Result<ReadDir, TreeError>;
    /// Which of `wanted` (`Access` bits) the caller has.
    fn access(&self, handle: Handle, caller: &Caller, wanted: u32) -> Result<u32, TreeError>;
}

impl<S: Store> Namespace for S {
    fn getattr(&self, handle: Handle) -> Result<Attributes, TreeError> {
        Ok(Attributes::of(&self.live(handle)?))
    }

    fn getattr_root(&self) -> Result<Attributes, TreeError> {
        let root = self.inode(ROOT_INODE)?;
        if root.kind != Some(FileKind::Directory) {
            return Err(TreeError::Damaged("the root is not a directory".into()));
        }
        Ok(Attributes::of(&root))
    }

    fn lookup(&self, dir: Handle, name: &[u8], caller: &Caller) -> Result<Attributes, TreeError> {
        self.at_one_moment(|store| lookup_in(store, dir, name, caller))
    }

    fn read(&self, file: Handle, offset: u64, count: u32, caller: &Caller) -> Result<(Vec<u8>, bool), TreeError> {
        let inode = self.live(file)?;
        match inode.kind {
            Some(FileKind::Regular) => {}
            Some(FileKind::Directory) => return Err(TreeError::IsDirectory),
            _ => return Err(TreeError::Invalid("only regular files are read".into())),
        }
        // Read permission, or (as knfsd allows, for running programs) execute.
        if !(caller.may(&inode, 4) || caller.may(&inode, 1)) {
            return Err(TreeError::AccessDenied);
        }
        let end = offset.saturating_add(u64::from(count)).min(inode.size);
        if offset >= end {
            return Ok((Vec::new(), true));
        }
        let mut bytes = vec![0u8; (end - offset) as usize];
        self.read_bytes(data_block(inode.ino, 0) * BLOCK + offset, &mut bytes)?;
        Ok((bytes, end == inode.size))
    }

    fn readlink(&self, link: Handle) -> Result<Vec<u8>, TreeError> {
        let inode = self.live(link)?;
        match inode.kind {
            Some(FileKind::Symlink) => Ok(inode.target),
            _ => Err(TreeError::NotSymlink),
        }
    }

    fn readdir(&self, dir: Handle, cookie: u64, entries_max: usize, caller: &Caller) -> Result<ReadDir, TreeError> {
        self.at_one_moment(|store| readdir_in(store, dir, cookie, entries_max, caller))
    }

    fn access(&self, handle: Handle, caller: &Caller, wanted: u32) -> Result<u32, TreeError> {
        let inode = self.live(handle)?;
        let directory = inode.kind == Some(FileKind::Directory);
        let mut granted = 0;
        let wanted = match self.writable() {
            true => wanted,
            false => wanted & !(Access::MODIFY | Access::EXTEND | Access::DELETE),
        };
        let rights = [
            (Access::READ, 4),
            (Access::LOOKUP, if directory { 1 } else { 8 }),
            (Access::MODIFY, 2),
            (Access::EXTEND, 2),
            (Access::DELETE, if directory { 2 } else { 8 }),
            (Access::EXECUTE, if directory { 8 } else { 1 }),
        ];
        for (right, bits) in rights {
            // (8: a right that does not apply to this kind of inode.)
            if wanted & right != 0 && bits != 8 && caller.may(&inode, bits) {
                granted |= right;
            }
        }
        Ok(granted)
    }
}

/// The inode a directory names, which must be live and of the kind the
/// directory says: read at one moment, anything else is damage.
fn named(store: &dyn Store, dir: &Inode, ino: u64, kind: FileKind) -> Result<Inode, TreeError> {
    let inode = store.inode(ino)?;
    match inode.kind == Some(kind) {
        true => Ok(inode),
        false => Err(TreeError::Damaged(format!(
            "directory {} names inode {ino} as {kind:?}, which is {:?}",
            dir.ino, inode.kind
        ))),
    }
}

fn lookup_in(store: &dyn Store, dir: Handle, name: &[u8], caller: &Caller) -> Result<Attributes, TreeError> {
    let dir = store.live_directory(dir)?;
    if !caller.may(&dir, 1) {
        return Err(TreeError::AccessDenied);
    }
    let (ino, kind) = match name {
        b"." => (dir.ino, FileKind::Directory),
        b".." => (dir.parent, FileKind::Directory),
        _ => {
            check_name(name)?;
            let slot = *store.directory(&dir)?.names.get(name).ok_or(TreeError::NotFound)?;
            (slot.ino, slot.kind)
        }
    };
    Ok(Attributes::of(&named(store, &dir, ino, kind)?))
}

fn readdir_in(
    store: &dyn Store,
    dir: Handle,
    cookie: u64,
    entries_max: usize,
    caller: &Caller,
) -> Result<ReadDir, TreeError> {
    let dir = store.live_directory(dir)?;
    if !caller.may(&dir, 4) {
        return Err(TreeError::AccessDenied);
    }
    let directory = store.directory(&dir)?;
    let mut entries = Vec::new();
    for (dot_cookie, name, ino) in [(1, &b"."[..], dir.ino), (2, &b".."[..], dir.parent)] {
        if cookie < dot_cookie && entries.len() < entries_max {
            let attributes = Attributes::of(&named(store, &dir, ino, FileKind::Directory)?);
            entries.push(DirEntryPlus { cookie: dot_cookie, name: name.to_vec(), attributes });
        }
    }
    let after = directory.after(cookie.max(COOKIE_FIRST_ENTRY - 1));
    let mut taken = 0;
    for (name, slot) in &after {
        if entries.len() >= entries_max {
            break;
        }
        let inode = named(store, &dir, slot.ino, slot.kind)?;
        entries.push(DirEntryPlus { cookie: slot.cookie(), name: name.to_vec(), attributes: Attributes::of(&inode) });
        taken += 1;
    }
    Ok(ReadDir { eof: taken == after.len(), entries })
}
