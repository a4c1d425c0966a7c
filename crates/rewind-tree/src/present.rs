//! The present of a tree: every change as one transaction, committed as one
//! compound write of the tree's volume.
//!
//! # Design
//!
//! - One lock (`state`) serialises the tree's changes; each change gathers
//!   its new blocks (inodes, directory blocks, bitmap, file data) in a
//!   [`Txn`], commits them with one `Volume::write_compound`, and only then
//!   puts them in the caches. A failed commit changed nothing, on disk or in
//!   memory. The volume's own write lock serialises the journal anyway, so
//!   one lock per tree costs no parallelism there; reads of file data take
//!   the lock only to look the inode up.
//! - Metadata changes are durable before they return, as RFC 1813 (§1.6)
//!   asks of CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and LINK;
//!   file writes are durable when asked (`Stability`) or at `commit`. A
//!   SETATTR that changes only attributes (mode, owner, times), which §1.6
//!   leaves out of its synchronous procedures, is durable with the next
//!   change that is, or at the volume's commit interval (50 ms; later
//!   while maintenance destages): each waiting for a flush, they took
//!   1.1 ms against nfs-ganesha's 0.23 in the SPECsfs-like mix
//!   (BENCHMARKS.md). One that sets the size changes the file's bytes, and
//!   is durable before it returns.
//!   A change waits for the disk after it has released the lock
//!   ([`Owed`]): the journal is one ordered log, so a flush makes every
//!   record before it durable, and an operation that sees a change not
//!   yet durable can only become durable with it. Holding the lock through
//!   the flush made every other client's call, reads included, wait for
//!   each metadata change's disk write in turn, and left the journal's
//!   group commit nothing to group.
//! - A COMMIT makes durable what it names, one file's writes: the tree
//!   keeps, per inode changed by a change that did not wait, its last
//!   record's LSN ([`Unsynced`]), and a COMMIT waits for the disk only if
//!   that record is not durable yet. Any change that waits (another
//!   client's COMMIT, a CREATE, a REMOVE) flushes the whole journal, so
//!   under several clients most COMMITs find their file's writes durable
//!   already; flushing again for each took 0.7–0.95 ms of the mix's
//!   COMMITs under four clients (BENCHMARKS.md).
//! - Stale data: a file that shrinks keeps its old blocks past the new end
//!   until they are zeroed, which happens in further compound writes after
//!   the one that shrank it (so no view ever sees zeros inside the old
//!   size), each lowering the inode's `blocks_end`. Blocks at or after
//!   `blocks_end` are always zeros; blocks between the size and it are
//!   zeroed before the file grows over them. A crash between those writes
//!   leaves only that bound higher than it need be.
//! - Caches are bounded maps of inodes and decoded directories; what they
//!   drop is read again from the volume.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rewind_engine::{Change, Durability, Volume, VolumeKind, COMPOUND_BLOCKS_MAX};
use rewind_format::tree::{
    data_block, inode_block, DirBlock, FileKind, Inode, Superblock, BITMAP_BLOCKS, BITMAP_FIRST_BLOCK, FILE_BLOCKS_MAX,
    FILE_BYTES_MAX, INODES_MAX, ROOT_INODE, SUPERBLOCK_BLOCK, SYMLINK_TARGET_BYTES_MAX, TREE_BLOCK_BYTES,
    TREE_VOLUME_BYTES,
};
use rewind_types::{Lsn, Timestamp};
use rustc_hash::FxHashMap;

use crate::namespace::{check_name, load_directory, load_inode, Attributes, Caller, Directory, Handle, Slot, Store};
use crate::Namespace;
use crate::{TreeError, TreeView};

const BLOCK: u64 = TREE_BLOCK_BYTES as u64;
const BITS_PER_BLOCK: u64 = BLOCK * 8;
const WORDS_PER_BLOCK: usize = TREE_BLOCK_BYTES / 8;
pub(crate) const INODES_CACHED_MAX: usize = 1 << 16;
pub(crate) const DIRECTORIES_CACHED_MAX: usize = 1 << 12;
/// Stale blocks zeroed per compound write (the inode's block is the other).
const DRAIN_BLOCKS_MAX: u64 = COMPOUND_BLOCKS_MAX - 1;
/// Stale blocks a growing file has zeroed within its own write; more are
/// zeroed in writes of their own first.
const STALE_BLOCKS_INLINE_MAX: u64 = 256;
/// Blocks whose status one look at the volume takes, finding the data to zero.
const STATUS_WINDOW_BLOCKS: u64 = 1 << 16;
/// Runs of blocks zeroed per compound write (well within its extents).
const ZERO_RUNS_MAX: usize = 1024;

/// What `Tree::zero_data` lowers with each write.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lower {
    BlocksEnd,
    Nothing,
}

/// How durable a file write must be before it returns (NFSv3's `stable_how`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    /// Durable at the next `commit` (or before, as the journal goes).
    Unstable,
    DataSync,
    FileSync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    ServerNow,
    Client(Timestamp),
}

/// Attributes to change; `None` leaves one as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttributes {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// How CREATE treats a name that exists (NFSv3's `createmode3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateHow {
    /// Use the file that is there (its size set if asked).
    Unchecked(SetAttributes),
    /// Fail with `Exists`.
    Guarded(SetAttributes),
    /// Create once: a retry with the same verifier finds its own file.
    Exclusive([u8; 8]),
}

/// Weak cache consistency: an inode's attributes just before and just after
/// a change, taken under the same lock as the change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wcc {
    pub before: Attributes,
    pub after: Attributes,
}

/// A map that forgets an arbitrary entry once full: everything in it can be
/// read again from the volume.
pub(crate) struct Bounded<T> {
    pub(crate) map: FxHashMap<u64, T>,
    entries_max: usize,
}

impl<T> Bounded<T> {
    pub(crate) fn new(entries_max: usize) -> Bounded<T> {
        Bounded { map: FxHashMap::default(), entries_max }
    }

    pub(crate) fn insert(&mut self, key: u64, value: T) {
        if self.map.len() >= self.entries_max && !self.map.contains_key(&key) {
            let victim = *self.map.keys().next().expect("full");
            self.map.remove(&victim);
        }
        self.map.insert(key, value);
    }
}

struct State {
    /// The inode bitmap, as on disk.
    bitmap: Vec<u64>,
    inodes: Bounded<Inode>,
    directories: Bounded<Arc<Directory>>,
    /// Where the search for a free inode starts.
    allocate_from: u64,
    /// The time of the last change a client could see (zeroing stale data
    /// past the end of files is not one).
    changed_at: Timestamp,
    unsynced: Unsynced,
}

/// Inodes changed by commits that did not wait for the disk, with the LSN of
/// the last such record of each: what a COMMIT of one has to make durable.
/// Bounded: at `UNSYNCED_TRACKED_MAX` inodes, those already durable are
/// forgotten, and if that leaves more than half, all are, their newest LSN
/// kept as `floor`, which then stands for every inode not tracked (so each
/// forgetting frees at least half, and tracking costs O(1) amortised).
#[derive(Default)]
struct Unsynced {
    lsns: FxHashMap<u64, Lsn>,
    floor: Lsn,
}

/// Inodes `Unsynced` tracks before it forgets some.
const UNSYNCED_TRACKED_MAX: usize = 1 << 16;

impl Unsynced {
    fn changed(&mut self, ino: u64, lsn: Lsn, lsn_durable: Lsn) {
        // (Equal: another inode of the record whose first ones set the floor.)
        assert!(lsn >= self.floor, "records are tracked in LSN order");
        if self.lsns.len() >= UNSYNCED_TRACKED_MAX && !self.lsns.contains_key(&ino) {
            self.lsns.retain(|_, &mut last| last > lsn_durable);
            if self.lsns.len() > UNSYNCED_TRACKED_MAX / 2 {
                self.floor = self.lsns.drain().map(|(_, last)| last).max().expect("full");
            }
        }
        self.lsns.insert(ino, lsn);
    }

    /// The LSN through which the journal must be durable for inode `ino`'s
    /// changes to be.
    fn through(&self, ino: u64) -> Lsn {
        self.lsns.get(&ino).copied().unwrap_or(self.floor)
    }
}

/// The new blocks of one change, and what the caches learn once it commits.
#[derive(Default)]
struct Txn {
    blocks: BTreeMap<u64, Vec<u8>>,
    /// A file write's blocks, from the first: one run, written as it is.
    data: Option<(u64, Vec<u8>)>,
    zeros: Vec<(u64, u64)>,
    inodes: BTreeMap<u64, Inode>,
    directories: BTreeMap<u64, Arc<Directory>>,
    bits: BTreeMap<u64, bool>,
    /// Only zeroes stale data nobody can see.
    unseen: bool,
}

impl Txn {
    fn unseen() -> Txn {
        Txn { unseen: true, ..Txn::default() }
    }

    fn put_inode(&mut self, inode: Inode) {
        self.blocks.insert(inode_block(inode.ino), inode.encode());
        self.inodes.insert(inode.ino, inode);
    }

    fn put_directory_block(&mut self, dir: u64, directory: &Directory, index: u32) {
        self.blocks.insert(data_block(dir, u64::from(index)), directory.blocks[index as usize].as_bytes().to_vec());
    }
}

/// Whether a committed change still has to reach the disk before its call
/// returns; [`Tree::settle`] pays it once the lock is released.
#[must_use = "a change committed with Durability::Fua is durable only once settled"]
struct Owed(bool);

impl Owed {
    /// For buffered commits, which owe nothing.
    fn assert_paid(self) {
        assert!(!self.0, "a buffered commit owes no flush");
    }
}

/// A file tree, as it is now.
pub struct Tree {
    volume: Arc<Volume>,
    state: Mutex<State>,
    /// A mirror's: what NFS wants durable before it returns (metadata,
    /// stable writes) reaches the disk with the journal's next flush. The
    /// proxy flushes itself once it has released its own order (or, with
    /// `--async`, leaves it to the journal: the upstream holds it durably).
    lazy: AtomicBool,
}

impl Store for Tree {
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), TreeError> {
        Ok(self.volume.read(offset, buf)?)
    }

    fn inode(&self, ino: u64) -> Result<Inode, TreeError> {
        let mut state = self.state.lock();
        self.cached_inode(&mut state, ino)
    }

    fn directory(&self, dir: &Inode) -> Result<Arc<Directory>, TreeError> {
        let mut state = self.state.lock();
        self.cached_directory(&mut state, dir)
    }

    fn writable(&self) -> bool {
        true
    }

    fn at_one_moment<R>(&self, read: impl FnOnce(&dyn Store) -> R) -> R {
        read(&Locked { tree: self, state: RefCell::new(self.state.lock()) })
    }
}

/// The present with its lock held: what `at_one_moment` reads through.
struct Locked<'a> {
    tree: &'a Tree,
    state: RefCell<MutexGuard<'a, State>>,
}

impl Store for Locked<'_> {
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), TreeError> {
        self.tree.read_bytes(offset, buf)
    }

    fn inode(&self, ino: u64) -> Result<Inode, TreeError> {
        self.tree.cached_inode(&mut self.state.borrow_mut(), ino)
    }

    fn directory(&self, dir: &Inode) -> Result<Arc<Directory>, TreeError> {
        self.tree.cached_directory(&mut self.state.borrow_mut(), dir)
    }

    fn writable(&self) -> bool {
        true
    }

    fn at_one_moment<R>(&self, read: impl FnOnce(&dyn Store) -> R) -> R {
        read(self)
    }
}

impl Tree {
    /// Makes `volume` (a new tree volume, see `VolumeSpec::tree`) a tree
    /// with an empty root directory owned by root, mode 0755.
    fn format(volume: Arc<Volume>, now: Timestamp) -> Result<Tree, TreeError> {
        assert_eq!(volume.size_bytes(), TREE_VOLUME_BYTES);
        let root = Inode {
            kind: Some(FileKind::Directory),
            generation: 1,
            mode: 0o755,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            parent: ROOT_INODE,
            ..Inode::unused(ROOT_INODE)
        };
        let mut bitmap = vec![0u64; (INODES_MAX / 64) as usize];
        // Inode 0 is never handed out.
        bitmap[0] = 1 | 1 << ROOT_INODE;
        let tree = Tree::assemble(volume, bitmap);
        let mut txn = Txn::default();
        txn.blocks.insert(SUPERBLOCK_BLOCK, Superblock { created: now }.encode());
        txn.blocks.insert(BITMAP_FIRST_BLOCK, tree.bitmap_block(&tree.state.lock(), &txn, 0));
        txn.put_inode(root);
        let mut state = tree.state.lock();
        let owed = tree.commit(&mut state, txn, now, Durability::Fua)?;
        tree.settle(state, owed)?;
        Ok(tree)
    }

    /// Opens the tree in `volume`, a file tree's volume; a new one (or one
    /// whose creation was cut short before it got its superblock) gets an
    /// empty root directory first.
    pub fn open(volume: Arc<Volume>, now: Timestamp) -> Result<Tree, TreeError> {
        if volume.kind() != VolumeKind::Tree {
            return Err(TreeError::Invalid(format!("volume {} is a block volume, not a file tree", volume.name())));
        }
        let mut block = vec![0u8; TREE_BLOCK_BYTES];
        volume.read(SUPERBLOCK_BLOCK * BLOCK, &mut block)?;
        if block.iter().all(|&byte| byte == 0) {
            // (The superblock is in the same record as everything else a
            // new tree has, so it is there or nothing is.)
            return Tree::format(volume, now);
        }
        Superblock::decode(&block).map_err(|error| TreeError::damaged("superblock", error))?;
        let mut bytes = vec![0u8; (BITMAP_BLOCKS * BLOCK) as usize];
        volume.read(BITMAP_FIRST_BLOCK * BLOCK, &mut bytes)?;
        let bitmap = bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes"))).collect();
        Ok(Tree::assemble(volume, bitmap))
    }

    fn assemble(volume: Arc<Volume>, bitmap: Vec<u64>) -> Tree {
        let state = State {
            bitmap,
            inodes: Bounded::new(INODES_CACHED_MAX),
            directories: Bounded::new(DIRECTORIES_CACHED_MAX),
            allocate_from: ROOT_INODE + 1,
            changed_at: volume.timestamp_last(),
            unsynced: Unsynced::default(),
        };
        Tree { volume, state: Mutex::new(state), lazy: AtomicBool::new(false) }
    }

    /// Makes the tree a mirror's (see `lazy`): its changes are durable at
    /// the journal's next flush (`commit_writes`), not before they return.
    pub fn record_lazily(&self) {
        self.lazy.store(true, Ordering::Relaxed);
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }

    pub fn root(&self) -> Result<Handle, TreeError> {
        Ok(self.getattr_root()?.handle)
    }

    /// The tree as it was at `at` (the latest exact point at or before it).
    pub fn view(&self, at: Timestamp) -> Result<TreeView, TreeError> {
        Ok(TreeView::new(self.volume.view(at)?))
    }

    /// The tree at exactly `at`, a time an earlier view resolved to (a
    /// handle into the past): refused if `at` is no longer kept exactly, or
    /// is after `now`.
    pub fn view_exactly(&self, at: Timestamp, now: Timestamp) -> Result<TreeView, TreeError> {
        Ok(TreeView::new(self.volume.view_exactly(at, now)?))
    }

    /// Inodes in use (the root included) and the most there can be.
    pub fn inode_counts(&self) -> (u64, u64) {
        let state = self.state.lock();
        let used: u64 = state.bitmap.iter().map(|word| u64::from(word.count_ones())).sum();
        // (Inode 0 is marked but not an inode.)
        (used - 1, INODES_MAX - 1)
    }

    /// The time of the last change to what the tree shows: a view there
    /// shows it as it is now.
    pub fn changed_at(&self) -> Timestamp {
        self.state.lock().changed_at
    }

    /// Makes every change so far durable.
    pub fn commit_writes(&self) -> Result<(), TreeError> {
        Ok(self.volume.flush()?)
    }

    /// Makes every change so far to `file` durable (NFS COMMIT), with no
    /// wait for the disk if a flush since already has (see the module's
    /// design notes).
    pub fn commit_file(&self, file: Handle) -> Result<(), TreeError> {
        let through = self.state.lock().unsynced.through(file.ino);
        Ok(self.volume.flush_through(through)?)
    }

    fn cached_inode(&self, state: &mut State, ino: u64) -> Result<Inode, TreeError> {
        if let Some(inode) = state.inodes.map.get(&ino) {
            return Ok(inode.clone());
        }
        let inode = load_inode(self, ino)?;
        state.inodes.insert(ino, inode.clone());
        Ok(inode)
    }

    fn cached_directory(&self, state: &mut State, dir: &Inode) -> Result<Arc<Directory>, TreeError> {
        if let Some(directory) = state.directories.map.get(&dir.ino) {
            return Ok(Arc::clone(directory));
        }
        let directory = Arc::new(load_directory(self, dir)?);
        state.directories.insert(dir.ino, Arc::clone(&directory));
        Ok(directory)
    }

    /// An inode as the transaction has it so far.
    fn txn_inode(&self, state: &mut State, txn: &Txn, ino: u64) -> Result<Inode, TreeError> {
        match txn.inodes.get(&ino) {
            Some(inode) => Ok(inode.clone()),
            None => self.cached_inode(state, ino),
        }
    }

    fn txn_directory(&self, state: &mut State, txn: &Txn, dir: &Inode) -> Result<Directory, TreeError> {
        match txn.directories.get(&dir.ino) {
            Some(directory) => Ok((**directory).clone()),
            None => Ok((*self.cached_directory(state, dir)?).clone()),
        }
    }

    fn live(&self, state: &mut State, txn: &Txn, handle: Handle) -> Result<Inode, TreeError> {
        if handle.ino == 0 || handle.ino >= INODES_MAX {
            return Err(TreeError::Stale);
        }
        let inode = self.txn_inode(state, txn, handle.ino)?;
        match inode.kind.is_some() && inode.generation == handle.generation {
            true => Ok(inode),
            false => Err(TreeError::Stale),
        }
    }

    /// A directory the caller may add names to and remove them from.
    fn writable_directory(
        &self,
        state: &mut State,
        txn: &Txn,
        handle: Handle,
        caller: &Caller,
    ) -> Result<Inode, TreeError> {
        let dir = self.live(state, txn, handle)?;
        if dir.kind != Some(FileKind::Directory) {
            return Err(TreeError::NotDirectory);
        }
        if !caller.may(&dir, 2 | 1) {
            return Err(TreeError::AccessDenied);
        }
        Ok(dir)
    }

    /// The bytes of bitmap block `index` with the transaction's changes.
    fn bitmap_block(&self, state: &State, txn: &Txn, index: u64) -> Vec<u8> {
        let first = index as usize * WORDS_PER_BLOCK;
        let mut words = state.bitmap[first..first + WORDS_PER_BLOCK].to_vec();
        for (&ino, &used) in txn.bits.range(index * BITS_PER_BLOCK..(index + 1) * BITS_PER_BLOCK) {
            let (word, bit) = ((ino % BITS_PER_BLOCK / 64) as usize, ino % 64);
            match used {
                true => words[word] |= 1 << bit,
                false => words[word] &= !(1 << bit),
            }
        }
        words.iter().flat_map(|word| word.to_le_bytes()).collect()
    }

    fn set_bit(&self, state: &State, txn: &mut Txn, ino: u64, used: bool) {
        txn.bits.insert(ino, used);
        let index = ino / BITS_PER_BLOCK;
        let block = self.bitmap_block(state, txn, index);
        txn.blocks.insert(BITMAP_FIRST_BLOCK + index, block);
    }

    fn is_used(state: &State, ino: u64) -> bool {
        state.bitmap[(ino / 64) as usize] & (1 << (ino % 64)) != 0
    }

    /// The inode the search for a free one tries after `ino`: past the
    /// last, it wraps to the first after the root.
    fn inode_after(ino: u64) -> u64 {
        if ino + 1 >= INODES_MAX {
            ROOT_INODE + 1
        } else {
            ino + 1
        }
    }

    /// A free inode, taken in the transaction; its stale data (from a
    /// removal a crash cut short) is zeroed first.
    fn allocate(&self, state: &mut State, txn: &mut Txn, now: Timestamp) -> Result<Inode, TreeError> {
        let start = state.allocate_from;
        assert!(start > ROOT_INODE && start < INODES_MAX, "the search starts at an inode: {start}");
        let mut ino = start;
        loop {
            if !Tree::is_used(state, ino) && !txn.bits.contains_key(&ino) {
                break;
            }
            ino = Tree::inode_after(ino);
            if ino == start {
                return Err(TreeError::NoInodes);
            }
        }
        state.allocate_from = Tree::inode_after(ino);
        self.drain(state, ino, 0, now)?;
        let inode = self.cached_inode(state, ino)?;
        assert!(inode.kind.is_none() && inode.blocks_end == 0, "inode {ino} is free and drained");
        self.set_bit(state, txn, ino, true);
        Ok(Inode { generation: inode.generation.wrapping_add(1), ..Inode::unused(ino) })
    }

    /// Commits the transaction as one compound write, then updates the
    /// caches. With `Durability::Fua` the write is durable only once the
    /// returned debt is settled.
    fn commit(&self, state: &mut State, txn: Txn, now: Timestamp, durability: Durability) -> Result<Owed, TreeError> {
        let owed = Owed(durability == Durability::Fua && !self.lazy.load(Ordering::Relaxed));
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (block, bytes) in txn.blocks {
            assert_eq!(bytes.len(), TREE_BLOCK_BYTES);
            match runs.last_mut() {
                Some((first, run)) if *first + run.len() as u64 / BLOCK == block => run.extend_from_slice(&bytes),
                _ => runs.push((block, bytes)),
            }
        }
        let mut changes: Vec<Change<'_>> =
            runs.iter().map(|(block, data)| Change::Write { offset: block * BLOCK, data }).collect();
        if let Some((block, data)) = &txn.data {
            changes.push(Change::Write { offset: block * BLOCK, data });
        }
        changes.extend(
            txn.zeros.iter().map(|&(block, count)| Change::Zero { offset: block * BLOCK, length: count * BLOCK }),
        );
        let written = self.volume.write_compound(now, &changes, Durability::Buffered)?;
        if !txn.unseen {
            state.changed_at = written.at;
        }
        if !owed.0 {
            let lsn_durable = self.volume.lsn_durable();
            for &ino in txn.inodes.keys() {
                state.unsynced.changed(ino, written.lsn, lsn_durable);
            }
        }
        for (ino, inode) in txn.inodes {
            state.inodes.insert(ino, inode);
        }
        for (ino, directory) in txn.directories {
            state.directories.insert(ino, directory);
        }
        for (ino, used) in txn.bits {
            let word = &mut state.bitmap[(ino / 64) as usize];
            match used {
                true => *word |= 1 << (ino % 64),
                false => *word &= !(1 << (ino % 64)),
            }
        }
        Ok(owed)
    }

    /// Releases the lock, then waits for the disk if the change owes it.
    fn settle(&self, state: MutexGuard<'_, State>, owed: Owed) -> Result<(), TreeError> {
        drop(state);
        if owed.0 {
            self.volume.flush()?;
        }
        Ok(())
    }

    /// Zeroes inode `ino`'s blocks from `keep` to its `blocks_end`, in
    /// compound writes of their own, each lowering `blocks_end`.
    fn drain(&self, state: &mut State, ino: u64, keep: u64, now: Timestamp) -> Result<(), TreeError> {
        let blocks_end = self.cached_inode(state, ino)?.blocks_end;
        self.zero_data(state, ino, (keep, blocks_end), Lower::BlocksEnd, now)
    }

    /// Zeroes the blocks of inode `ino` in `from..to` that hold data, from
    /// the top down, in compound writes of their own; with
    /// `Lower::BlocksEnd` each also lowers the inode's `blocks_end` to what
    /// is left below it, and the last to `from`. Only blocks holding data:
    /// `blocks_end` is a high-water mark, and one byte written at 64 GiB
    /// put it 16.7 M blocks up, every one of which became a zero version,
    /// written under the tree's lock, when the file was removed.
    fn zero_data(
        &self,
        state: &mut State,
        ino: u64,
        (from, mut to): (u64, u64),
        lower: Lower,
        now: Timestamp,
    ) -> Result<(), TreeError> {
        while from < to {
            let low = from.max(to.saturating_sub(STATUS_WINDOW_BLOCKS));
            let runs = self.data_runs(ino, low, to)?;
            let mut txn = Txn::unseen();
            let (mut blocks, mut left) = (0, low);
            for &(first, count) in runs.iter().rev() {
                let room = DRAIN_BLOCKS_MAX - blocks;
                if room == 0 || txn.zeros.len() == ZERO_RUNS_MAX {
                    left = first + count;
                    break;
                }
                let take = count.min(room);
                txn.zeros.push((data_block(ino, first + count - take), take));
                blocks += take;
                if take < count {
                    left = first + count - take;
                    break;
                }
            }
            let last = left == from;
            if lower == Lower::BlocksEnd && (!txn.zeros.is_empty() || last) {
                let inode = self.cached_inode(state, ino)?;
                txn.put_inode(Inode { blocks_end: left, ..inode });
            }
            if !txn.zeros.is_empty() || !txn.inodes.is_empty() {
                self.commit(state, txn, now, Durability::Buffered)?.assert_paid();
            }
            to = left;
        }
        Ok(())
    }

    /// The runs `(first, count)` of inode `ino`'s blocks in `from..to`
    /// (at most `STATUS_WINDOW_BLOCKS`) that hold data, lowest first.
    fn data_runs(&self, ino: u64, from: u64, to: u64) -> Result<Vec<(u64, u64)>, TreeError> {
        assert!(from < to && to - from <= STATUS_WINDOW_BLOCKS && to <= FILE_BLOCKS_MAX, "{from}..{to}");
        let statuses = self.volume.block_status(data_block(ino, from) * BLOCK, (to - from) * BLOCK)?;
        let mut runs = Vec::new();
        let mut at = from;
        for status in statuses {
            let count = status.length / BLOCK;
            if status.allocated {
                runs.push((at, count));
            }
            at += count;
        }
        assert_eq!(at, to, "block status covers what was asked");
        Ok(runs)
    }

    /// Zeroes the blocks of `inode` in `from..to` that may hold stale data
    /// (before the file grows over them); up to `STALE_BLOCKS_INLINE_MAX`
    /// of them within `txn`, more in writes of their own first.
    fn zero_stale(
        &self,
        state: &mut State,
        txn: &mut Txn,
        inode: &Inode,
        (from, to): (u64, u64),
        now: Timestamp,
    ) -> Result<(), TreeError> {
        let to = to.min(inode.blocks_end);
        if from >= to {
            return Ok(());
        }
        if to - from > STALE_BLOCKS_INLINE_MAX {
            // (Past the end of the file: nobody sees these zeros arrive.)
            return self.zero_data(state, inode.ino, (from, to), Lower::Nothing, now);
        }
        txn.zeros.push((data_block(inode.ino, from), to - from));
        Ok(())
    }

    /// What a new inode gets from the attributes of its creation.
    fn new_inode(
        mut inode: Inode,
        kind: FileKind,
        attributes: &SetAttributes,
        dir: &Inode,
        caller: &Caller,
        now: Timestamp,
    ) -> Inode {
        let default_mode = if kind == FileKind::Directory { 0o755 } else { 0o644 };
        inode.kind = Some(kind);
        inode.mode = attributes.mode.unwrap_or(default_mode) & 0o7777;
        inode.uid = match caller.uid {
            0 => attributes.uid.unwrap_or(0),
            uid => uid,
        };
        // A set-group-ID directory hands its group down (as the kernel does).
        inode.gid = match dir.mode & 0o2000 {
            0 => attributes.gid.filter(|_| caller.uid == 0).unwrap_or(caller.gid),
            _ => dir.gid,
        };
        if kind == FileKind::Directory && dir.mode & 0o2000 != 0 {
            inode.mode |= 0o2000;
        }
        inode.nlink = if kind == FileKind::Directory { 2 } else { 1 };
        inode.parent = if kind == FileKind::Directory { dir.ino } else { 0 };
        (inode.atime, inode.mtime, inode.ctime) = (now, now, now);
        inode.author = caller.author();
        inode
    }

    /// Adds `name` → `ino` to `directory` (of `dir`), growing it by a block
    /// if no block has room, and stages what changed.
    fn add_name(txn: &mut Txn, dir: &mut Inode, directory: &mut Directory, name: &[u8], ino: u64, kind: FileKind) {
        let needed = rewind_format::tree::entry_bytes(name.len());
        let index = match directory.blocks.iter().position(|block| block.room_bytes() >= needed) {
            Some(index) => index,
            None => {
                directory.blocks.push(DirBlock::empty());
                dir.size += BLOCK;
                dir.blocks_end = dir.size / BLOCK;
                directory.blocks.len() - 1
            }
        };
        let offset = directory.blocks[index].insert(ino, kind, name).expect("the block has room");
        directory.names.insert(name.to_vec(), Slot { block: index as u32, offset, ino, kind });
        txn.put_directory_block(dir.ino, directory, index as u32);
    }

    fn remove_name(txn: &mut Txn, dir: &Inode, directory: &mut Directory, name: &[u8]) -> Slot {
        let slot = directory.names.remove(name).expect("the name is there");
        directory.blocks[slot.block as usize].remove(slot.offset);
        txn.put_directory_block(dir.ino, directory, slot.block);
        slot
    }

    /// Creates `name` in `dir` as a new inode of `kind`; the common part of
    /// CREATE, MKDIR, SYMLINK and MKNOD. Returns the new inode's attributes
    /// and the directory's change.
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        dir: Handle,
        name: &[u8],
        kind: FileKind,
        attributes: &SetAttributes,
        fill: impl FnOnce(&mut Inode),
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        check_name(name)?;
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut parent = self.writable_directory(&mut state, &txn, dir, caller)?;
        let before = Attributes::of(&parent);
        let mut directory = self.txn_directory(&mut state, &txn, &parent)?;
        if directory.names.contains_key(name) {
            return Err(TreeError::Exists);
        }
        let mut inode =
            Tree::new_inode(self.allocate(&mut state, &mut txn, now)?, kind, attributes, &parent, caller, now);
        fill(&mut inode);
        Tree::add_name(&mut txn, &mut parent, &mut directory, name, inode.ino, kind);
        if kind == FileKind::Directory {
            parent.nlink += 1;
        }
        (parent.mtime, parent.ctime) = (now, now);
        parent.author = caller.author();
        let created = Attributes::of(&inode);
        txn.put_inode(inode);
        let after = Attributes::of(&parent);
        txn.directories.insert(parent.ino, Arc::new(directory));
        txn.put_inode(parent);
        let owed = self.commit(&mut state, txn, now, Durability::Fua)?;
        self.settle(state, owed)?;
        Ok((created, Wcc { before, after }))
    }

    /// NFS CREATE: a regular file.
    pub fn create(
        &self,
        dir: Handle,
        name: &[u8],
        how: &CreateHow,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        check_name(name)?;
        // A name another client makes between the look and the make is
        // found by the next look: UNCHECKED and EXCLUSIVE then answer as if
        // it had been there first (GUARDED refuses either way).
        loop {
            match Namespace::lookup(self, dir, name, caller) {
                Ok(existing) => return self.create_over(dir, existing, how, caller, now),
                Err(TreeError::NotFound) => {}
                Err(error) => return Err(error),
            }
            let (attributes, verifier) = match how {
                CreateHow::Unchecked(attributes) | CreateHow::Guarded(attributes) => (attributes.clone(), [0; 8]),
                CreateHow::Exclusive(verifier) => (SetAttributes::default(), *verifier),
            };
            if attributes.size.is_some_and(|size| size != 0) {
                return Err(TreeError::Invalid("a new file starts empty".into()));
            }
            match self.make(dir, name, FileKind::Regular, &attributes, |inode| inode.verifier = verifier, caller, now) {
                Err(TreeError::Exists) if !matches!(how, CreateHow::Guarded(_)) => continue,
                made => return made,
            }
        }
    }

    /// CREATE of a name that is there: UNCHECKED opens a regular file (and
    /// truncates it if asked), EXCLUSIVE finds the file its own earlier
    /// call made (the same non-zero verifier; zero is what every other
    /// inode holds).
    fn create_over(
        &self,
        dir: Handle,
        existing: Attributes,
        how: &CreateHow,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        let before = self.getattr_of(dir)?;
        match how {
            CreateHow::Guarded(_) => Err(TreeError::Exists),
            CreateHow::Exclusive(verifier) => {
                let made_by_it = existing.kind == FileKind::Regular
                    && *verifier != [0; 8]
                    && self.inode(existing.handle.ino)?.verifier == *verifier;
                match made_by_it {
                    true => Ok((existing, Wcc { after: before.clone(), before })),
                    false => Err(TreeError::Exists),
                }
            }
            CreateHow::Unchecked(attributes) => {
                if existing.kind != FileKind::Regular {
                    return Err(TreeError::Exists);
                }
                let size_only = SetAttributes { size: attributes.size, ..SetAttributes::default() };
                let changed = match size_only.size {
                    Some(_) => self.setattr(existing.handle, &size_only, None, caller, now)?.after,
                    None => existing,
                };
                Ok((changed, Wcc { after: before.clone(), before }))
            }
        }
    }

    fn getattr_of(&self, handle: Handle) -> Result<Attributes, TreeError> {
        let mut state = self.state.lock();
        Ok(Attributes::of(&self.live(&mut state, &Txn::default(), handle)?))
    }

    pub fn mkdir(
        &self,
        dir: Handle,
        name: &[u8],
        attributes: &SetAttributes,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        self.make(dir, name, FileKind::Directory, attributes, |_| {}, caller, now)
    }

    pub fn symlink(
        &self,
        dir: Handle,
        name: &[u8],
        target: &[u8],
        attributes: &SetAttributes,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        if target.len() > SYMLINK_TARGET_BYTES_MAX {
            return Err(TreeError::NameTooLong(target.len()));
        }
        if target.is_empty() || target.contains(&0) {
            return Err(TreeError::Invalid("a symlink's target is a path".into()));
        }
        let attributes = SetAttributes { mode: Some(attributes.mode.unwrap_or(0o777)), ..attributes.clone() };
        let fill = |inode: &mut Inode| {
            inode.target = target.to_vec();
            inode.size = target.len() as u64;
        };
        self.make(dir, name, FileKind::Symlink, &attributes, fill, caller, now)
    }

    /// NFS MKNOD: a device, socket or FIFO.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        dir: Handle,
        name: &[u8],
        kind: FileKind,
        rdev: (u32, u32),
        attributes: &SetAttributes,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        match kind {
            FileKind::CharDevice | FileKind::BlockDevice if caller.uid != 0 => return Err(TreeError::NotPermitted),
            FileKind::CharDevice | FileKind::BlockDevice | FileKind::Socket | FileKind::Fifo => {}
            _ => return Err(TreeError::Invalid(format!("MKNOD makes devices, sockets and FIFOs, not {kind:?}"))),
        }
        let devices = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
        self.make(dir, name, kind, attributes, |inode| inode.rdev = if devices { rdev } else { (0, 0) }, caller, now)
    }

    /// NFS LINK: another name for a file.
    pub fn link(
        &self,
        file: Handle,
        dir: Handle,
        name: &[u8],
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Attributes, Wcc), TreeError> {
        check_name(name)?;
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut inode = self.live(&mut state, &txn, file)?;
        if inode.kind == Some(FileKind::Directory) {
            return Err(TreeError::IsDirectory);
        }
        let mut parent = self.writable_directory(&mut state, &txn, dir, caller)?;
        let before = Attributes::of(&parent);
        let mut directory = self.txn_directory(&mut state, &txn, &parent)?;
        if directory.names.contains_key(name) {
            return Err(TreeError::Exists);
        }
        let kind = inode.kind.expect("live");
        Tree::add_name(&mut txn, &mut parent, &mut directory, name, inode.ino, kind);
        inode.nlink += 1;
        inode.ctime = now;
        (parent.mtime, parent.ctime) = (now, now);
        let linked = Attributes::of(&inode);
        let after = Attributes::of(&parent);
        txn.put_inode(inode);
        txn.directories.insert(parent.ino, Arc::new(directory));
        txn.put_inode(parent);
        let owed = self.commit(&mut state, txn, now, Durability::Fua)?;
        self.settle(state, owed)?;
        Ok((linked, Wcc { before, after }))
    }

    /// Whether the sticky bit of `dir` keeps the caller from removing or
    /// renaming `inode` there.
    fn sticky_refuses(dir: &Inode, inode: &Inode, caller: &Caller) -> bool {
        dir.mode & 0o1000 != 0 && caller.uid != 0 && caller.uid != dir.uid && caller.uid != inode.uid
    }

    /// Whether `inode` may lose its name in `dir` (a REMOVE, RMDIR, or a
    /// RENAME over it): of the kind the caller says (`directory_wanted`),
    /// empty if a directory, and not kept by the sticky bit.
    fn check_unlink(
        &self,
        state: &mut State,
        txn: &Txn,
        dir: &Inode,
        inode: &Inode,
        directory_wanted: bool,
        caller: &Caller,
    ) -> Result<(), TreeError> {
        match (directory_wanted, inode.kind == Some(FileKind::Directory)) {
            (true, false) => return Err(TreeError::NotDirectory),
            (false, true) => return Err(TreeError::IsDirectory),
            (true, true) if !self.txn_directory(state, txn, inode)?.names.is_empty() => {
                return Err(TreeError::NotEmpty)
            }
            _ => {}
        }
        match Tree::sticky_refuses(dir, inode, caller) {
            true => Err(TreeError::AccessDenied),
            false => Ok(()),
        }
    }

    /// One name fewer for `inode`: freed (and its data zeroed afterwards)
    /// when it was the last. Returns whether it was freed.
    fn unlink_inode(&self, state: &State, txn: &mut Txn, mut inode: Inode, now: Timestamp) -> bool {
        let directory = inode.kind == Some(FileKind::Directory);
        inode.nlink = if directory { 0 } else { inode.nlink - 1 };
        inode.ctime = now;
        if inode.nlink > 0 {
            txn.put_inode(inode);
            return false;
        }
        self.set_bit(state, txn, inode.ino, false);
        let freed = Inode { generation: inode.generation, blocks_end: inode.blocks_end, ..Inode::unused(inode.ino) };
        txn.put_inode(freed);
        txn.directories.insert(inode.ino, Arc::new(Directory::default()));
        true
    }

    /// NFS REMOVE (`directory` false) and RMDIR (true).
    pub fn remove(
        &self,
        dir: Handle,
        name: &[u8],
        directory_wanted: bool,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<Wcc, TreeError> {
        match name {
            b"." => return Err(TreeError::Invalid("cannot remove \".\"".into())),
            b".." => return Err(TreeError::NotEmpty),
            _ => check_name(name)?,
        }
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut parent = self.writable_directory(&mut state, &txn, dir, caller)?;
        let before = Attributes::of(&parent);
        let mut directory = self.txn_directory(&mut state, &txn, &parent)?;
        let slot = *directory.names.get(name).ok_or(TreeError::NotFound)?;
        let inode = self.txn_inode(&mut state, &txn, slot.ino)?;
        self.check_unlink(&mut state, &txn, &parent, &inode, directory_wanted, caller)?;
        Tree::remove_name(&mut txn, &parent, &mut directory, name);
        if directory_wanted {
            parent.nlink -= 1;
        }
        (parent.mtime, parent.ctime) = (now, now);
        parent.author = caller.author();
        let freed = self.unlink_inode(&state, &mut txn, inode, now).then_some(slot.ino);
        let after = Attributes::of(&parent);
        txn.directories.insert(parent.ino, Arc::new(directory));
        txn.put_inode(parent);
        let owed = self.commit(&mut state, txn, now, Durability::Fua)?;
        if let Some(ino) = freed {
            self.drain(&mut state, ino, 0, now)?;
        }
        self.settle(state, owed)?;
        Ok(Wcc { before, after })
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_within(&self, state: &mut State, txn: &Txn, mut dir: u64, ancestor: u64) -> Result<bool, TreeError> {
        for _ in 0..INODES_MAX {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INODE {
                return Ok(false);
            }
            dir = self.txn_inode(state, txn, dir)?.parent;
        }
        Err(TreeError::Damaged("a directory's parents form a loop".into()))
    }

    /// NFS RENAME: returns the change of the source and target directories.
    pub fn rename(
        &self,
        from_dir: Handle,
        from_name: &[u8],
        to_dir: Handle,
        to_name: &[u8],
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(Wcc, Wcc), TreeError> {
        for name in [from_name, to_name] {
            if name == b"." || name == b".." {
                return Err(TreeError::Invalid("cannot rename \".\" or \"..\"".into()));
            }
            check_name(name)?;
        }
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut source = self.writable_directory(&mut state, &txn, from_dir, caller)?;
        let target_dir = self.writable_directory(&mut state, &txn, to_dir, caller)?;
        let (source_before, target_before) = (Attributes::of(&source), Attributes::of(&target_dir));
        let same_dir = source.ino == target_dir.ino;
        let mut source_directory = self.txn_directory(&mut state, &txn, &source)?;
        let slot = *source_directory.names.get(from_name).ok_or(TreeError::NotFound)?;
        let mut moved = self.txn_inode(&mut state, &txn, slot.ino)?;
        if Tree::sticky_refuses(&source, &moved, caller) {
            return Err(TreeError::AccessDenied);
        }
        let moving_directory = moved.kind == Some(FileKind::Directory);
        if moving_directory && !same_dir && self.is_within(&mut state, &txn, target_dir.ino, moved.ino)? {
            return Err(TreeError::Invalid("a directory cannot move into itself".into()));
        }
        // In one directory, `source` is the only copy of it that changes.
        let (mut target, mut target_directory) = match same_dir {
            true => (None, None),
            false => (Some(target_dir.clone()), Some(self.txn_directory(&mut state, &txn, &target_dir)?)),
        };
        let replaced = target_directory.as_ref().unwrap_or(&source_directory).names.get(to_name).copied();
        let mut freed = None;
        if let Some(replaced) = replaced {
            if replaced.ino == moved.ino {
                // Two names of one file: nothing to do (POSIX).
                let unchanged = |before: &Attributes| Wcc { before: before.clone(), after: before.clone() };
                return Ok((unchanged(&source_before), unchanged(&target_before)));
            }
            let old = self.txn_inode(&mut state, &txn, replaced.ino)?;
            self.check_unlink(&mut state, &txn, &target_dir, &old, moving_directory, caller)?;
            if moving_directory {
                // The replaced directory's ".." goes.
                target.as_mut().unwrap_or(&mut source).nlink -= 1;
            }
            freed = self.unlink_inode(&state, &mut txn, old, now).then_some(replaced.ino);
        }
        let kind = moved.kind.expect("live");
        Tree::remove_name(&mut txn, &source, &mut source_directory, from_name);
        let into = target.as_mut().unwrap_or(&mut source);
        let into_directory = target_directory.as_mut().unwrap_or(&mut source_directory);
        match replaced {
            Some(replaced) => {
                into_directory.blocks[replaced.block as usize].retarget(replaced.offset, moved.ino, kind);
                into_directory.names.insert(to_name.to_vec(), Slot { ino: moved.ino, kind, ..replaced });
                txn.put_directory_block(into.ino, into_directory, replaced.block);
            }
            None => Tree::add_name(&mut txn, into, into_directory, to_name, moved.ino, kind),
        }
        if let Some(target) = target.as_mut().filter(|_| moving_directory) {
            moved.parent = target.ino;
            source.nlink -= 1;
            target.nlink += 1;
        }
        moved.ctime = now;
        txn.put_inode(moved);
        for dir in std::iter::once(&mut source).chain(target.as_mut()) {
            (dir.mtime, dir.ctime) = (now, now);
            dir.author = caller.author();
        }
        let source_after = Attributes::of(&source);
        let target_after = target.as_ref().map_or_else(|| source_after.clone(), Attributes::of);
        txn.directories.insert(source.ino, Arc::new(source_directory));
        txn.put_inode(source);
        if let (Some(target), Some(directory)) = (target, target_directory) {
            txn.directories.insert(target.ino, Arc::new(directory));
            txn.put_inode(target);
        }
        let owed = self.commit(&mut state, txn, now, Durability::Fua)?;
        if let Some(ino) = freed {
            self.drain(&mut state, ino, 0, now)?;
        }
        self.settle(state, owed)?;
        Ok((Wcc { before: source_before, after: source_after }, Wcc { before: target_before, after: target_after }))
    }

    /// NFS SETATTR; `guard` is the ctime the caller expects (else `NotSync`).
    pub fn setattr(
        &self,
        handle: Handle,
        attributes: &SetAttributes,
        guard: Option<Timestamp>,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<Wcc, TreeError> {
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut inode = self.live(&mut state, &txn, handle)?;
        let original = inode.clone();
        let before = Attributes::of(&inode);
        if guard.is_some_and(|ctime| ctime != inode.ctime) {
            return Err(TreeError::NotSync);
        }
        let owner = caller.uid == 0 || caller.uid == inode.uid;
        if let Some(mode) = attributes.mode {
            if !owner {
                return Err(TreeError::NotPermitted);
            }
            inode.mode = mode & 0o7777;
        }
        if let Some(uid) = attributes.uid.filter(|&uid| uid != inode.uid) {
            if caller.uid != 0 {
                return Err(TreeError::NotPermitted);
            }
            inode.uid = uid;
        }
        if let Some(gid) = attributes.gid.filter(|&gid| gid != inode.gid) {
            if !(caller.uid == 0 || (caller.uid == inode.uid && (caller.gid == gid || caller.gids.contains(&gid)))) {
                return Err(TreeError::NotPermitted);
            }
            inode.gid = gid;
        }
        for (wanted, time) in [(attributes.atime, &mut inode.atime), (attributes.mtime, &mut inode.mtime)] {
            match wanted {
                None => {}
                Some(SetTime::ServerNow) if owner || caller.may(&original, 2) => *time = now,
                Some(SetTime::Client(at)) if owner => *time = at,
                Some(_) => return Err(TreeError::NotPermitted),
            }
        }
        let mut shrunk = None;
        if let Some(size) = attributes.size {
            match inode.kind {
                Some(FileKind::Regular) => {}
                Some(FileKind::Directory) => return Err(TreeError::IsDirectory),
                _ => return Err(TreeError::Invalid("only a regular file has a size to set".into())),
            }
            if !caller.may(&inode, 2) {
                return Err(TreeError::AccessDenied);
            }
            if size > FILE_BYTES_MAX {
                return Err(TreeError::FileTooLarge);
            }
            if size != inode.size {
                shrunk = self.resize(&mut state, &mut txn, &mut inode, size, now)?;
                inode.mtime = now;
            }
        }
        inode.ctime = now;
        inode.verifier = [0; 8];
        inode.author = caller.author();
        let after = Attributes::of(&inode);
        let ino = inode.ino;
        txn.put_inode(inode);
        // Attributes alone are not among RFC 1813's synchronous changes (see
        // the module's design notes); a new size is.
        let durability = match attributes.size {
            Some(_) => Durability::Fua,
            None => Durability::Buffered,
        };
        let owed = self.commit(&mut state, txn, now, durability)?;
        if let Some(keep) = shrunk {
            self.drain(&mut state, ino, keep, now)?;
        }
        self.settle(state, owed)?;
        Ok(Wcc { before, after })
    }

    /// Sets `inode`'s size within `txn`. Growing, the blocks it grows over
    /// are zeroed first; shrinking, the bytes after the new end in its last
    /// block are zeroed in `txn`, and the blocks after it are left for
    /// [`Tree::drain`] after the commit: returns from which block, then.
    fn resize(
        &self,
        state: &mut State,
        txn: &mut Txn,
        inode: &mut Inode,
        size: u64,
        now: Timestamp,
    ) -> Result<Option<u64>, TreeError> {
        let keep = size.div_ceil(BLOCK);
        if size > inode.size {
            self.zero_stale(state, txn, inode, (inode.size.div_ceil(BLOCK), keep), now)?;
            inode.size = size;
            return Ok(None);
        }
        if !size.is_multiple_of(BLOCK) {
            let last = size / BLOCK;
            let mut block = vec![0u8; TREE_BLOCK_BYTES];
            self.volume.read(data_block(inode.ino, last) * BLOCK, &mut block).map_err(TreeError::Engine)?;
            block[(size % BLOCK) as usize..].fill(0);
            txn.blocks.insert(data_block(inode.ino, last), block);
        }
        inode.size = size;
        Ok(Some(keep))
    }

    /// NFS WRITE: `data` at `offset`. Returns the file's change.
    pub fn write(
        &self,
        file: Handle,
        offset: u64,
        data: &[u8],
        stability: Stability,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<Wcc, TreeError> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= FILE_BYTES_MAX)
            .ok_or(TreeError::FileTooLarge)?;
        let mut state = self.state.lock();
        let mut txn = Txn::default();
        let mut inode = self.live(&mut state, &txn, file)?;
        match inode.kind {
            Some(FileKind::Regular) => {}
            Some(FileKind::Directory) => return Err(TreeError::IsDirectory),
            _ => return Err(TreeError::Invalid("only regular files are written".into())),
        }
        if !caller.may(&inode, 2) && caller.uid != inode.uid {
            return Err(TreeError::AccessDenied);
        }
        let before = Attributes::of(&inode);
        if data.is_empty() {
            return Ok(Wcc { after: before.clone(), before });
        }
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let size_blocks = inode.size.div_ceil(BLOCK);
        // Blocks past the old end that the write skips over read as zeros.
        self.zero_stale(&mut state, &mut txn, &inode, (size_blocks, first), now)?;
        let head = (offset - first * BLOCK) as usize;
        let mut bytes = vec![0u8; ((last - first + 1) * BLOCK) as usize];
        // Partial edges are read whole, unless past the old end (zeros then).
        for edge in [first, last] {
            let partial = (edge == first && head > 0) || (edge == last && !end.is_multiple_of(BLOCK));
            if partial && edge < size_blocks {
                let at = ((edge - first) * BLOCK) as usize;
                self.volume.read(data_block(inode.ino, edge) * BLOCK, &mut bytes[at..at + TREE_BLOCK_BYTES])?;
            }
        }
        bytes[head..head + data.len()].copy_from_slice(data);
        txn.data = Some((data_block(inode.ino, first), bytes));
        inode.size = inode.size.max(end);
        inode.blocks_end = inode.blocks_end.max(last + 1).min(FILE_BLOCKS_MAX);
        (inode.mtime, inode.ctime) = (now, now);
        inode.author = caller.author();
        let after = Attributes::of(&inode);
        txn.put_inode(inode);
        let durability = match stability {
            Stability::Unstable => Durability::Buffered,
            Stability::DataSync | Stability::FileSync => Durability::Fua,
        };
        let owed = self.commit(&mut state, txn, now, durability)?;
        self.settle(state, owed)?;
        Ok(Wcc { before, after })
    }
}

#[cfg(test)]
mod tests {
    use rewind_engine::{Node, NodeConfig, VolumeName, VolumeSpec};
    use rewind_io::{SimConfig, SimStorage};

    use super::*;
    use crate::{CreateHow, SetAttributes};

    #[test]
    fn unsynced_inodes_forget_the_durable_first_and_stand_in_a_floor_for_the_rest() {
        let max = UNSYNCED_TRACKED_MAX as u64;
        let mut unsynced = Unsynced::default();
        for ino in 0..max {
            unsynced.changed(ino, Lsn(ino + 1), Lsn::ZERO);
        }
        assert_eq!((unsynced.through(5), unsynced.through(max + 7)), (Lsn(6), Lsn::ZERO));
        // Full, three quarters durable: those go, the rest stay tracked.
        let durable = Lsn(max / 4 * 3);
        unsynced.changed(max, Lsn(max + 1), durable);
        assert_eq!(unsynced.lsns.len() as u64, max / 4 + 1);
        assert_eq!((unsynced.through(5), unsynced.through(max - 1)), (Lsn::ZERO, Lsn(max)));
        // Full again, nothing more durable: all forgotten, their newest the floor.
        let mut ino = max + 1;
        while (unsynced.lsns.len() as u64) < max {
            unsynced.changed(ino, Lsn(ino + 1), durable);
            ino += 1;
        }
        unsynced.changed(ino, Lsn(ino + 1), durable);
        assert_eq!((unsynced.lsns.len(), unsynced.floor), (1, Lsn(ino)));
        assert_eq!((unsynced.through(max - 1), unsynced.through(ino)), (Lsn(ino), Lsn(ino + 1)));
        // Forgetting in the middle of one record's inodes: the floor is
        // that record's own LSN, which its later inodes carry too.
        while (unsynced.lsns.len() as u64) < max - 1 {
            ino += 1;
            unsynced.changed(ino, Lsn(ino + 1), durable);
        }
        let record = Lsn(ino + 2);
        for inode in [ino + 1, ino + 2, ino + 3] {
            unsynced.changed(inode, record, durable);
        }
        assert_eq!((unsynced.floor, unsynced.through(ino + 3), unsynced.through(3)), (record, record, record));
    }

    #[test]
    fn the_search_for_a_free_inode_wraps_past_the_last_one() {
        let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 5)), NodeConfig::default()).unwrap();
        let now = |second: u64| Timestamp::from_unix_nanos(second * 1_000_000_000);
        let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now(1)).unwrap();
        let tree = Tree::open(volume, now(2)).unwrap();
        let (root, caller) = (tree.root().unwrap(), Caller::root([0; 16], 0));
        let how = CreateHow::Unchecked(SetAttributes::default());
        // As after some 8 million files made (and removed) since the tree
        // was opened: the search starts at the last inode there is.
        tree.state.lock().allocate_from = INODES_MAX - 1;
        let (last, _) = tree.create(root, b"last", &how, &caller, now(3)).unwrap();
        let (wrapped, _) = tree.create(root, b"wrapped", &how, &caller, now(4)).unwrap();
        assert_eq!((last.handle.ino, wrapped.handle.ino), (INODES_MAX - 1, ROOT_INODE + 1));
        assert_eq!(tree.inode_counts().0, 3, "the root and the two");
    }
}
