//! [`Storage`] in memory, for deterministic simulation.
//!
//! It models what a crash (power loss, kernel panic) leaves behind:
//! - file data: the bytes made durable by `sync_data`, plus each later write
//!   independently surviving with probability `write_survival`, possibly torn
//!   at sector granularity with probability `torn_write` (the disk wrote some
//!   of its sectors);
//! - the namespace (creations, renames, removals): the entries made durable by
//!   `sync_dir`, plus a random prefix of the later operations — journaling
//!   filesystems commit metadata in order.
//!
//! Directories themselves are created durably at once; Rewind creates them
//! once and syncs their parents, so modelling their loss would add nothing.
//!
//! A crash also invalidates every open handle: any call on a handle from before
//! the crash fails, just as the dead process could not make one.
//!
//! Faults: `fail_syncs` makes the next N `sync_data` calls fail with EIO (or,
//! `fail_syncs_as_full`, ENOSPC: a thin pool run dry) and, as Linux does,
//! forget the unsynced writes while reads keep showing them;
//! `set_capacity` gives the disk a size: a write or `allocate` that would need
//! more space than is free fails with ENOSPC and changes nothing (space is
//! counted per file as the larger of its length and what was allocated, and
//! given back when the file is removed);
//! `corrupt` flips bits in stored bytes; `stop_after` lets N more changes
//! through and then fails every call, as if the process had died right
//! there — the test then calls `crash`, which puts a crash at any step of
//! a multi-step operation.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{sync_failed, File, OpenMode, Space, Storage};

#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Chance that an unsynced write reaches the disk before a crash.
    pub write_survival: f64,
    /// Chance that a surviving unsynced write is torn.
    pub torn_write: f64,
    pub sector_bytes: u64,
    /// Whether the filesystem takes direct I/O ([`Storage::open_direct`]).
    pub direct_io: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { write_survival: 0.5, torn_write: 0.25, sector_bytes: 512, direct_io: true }
    }
}

#[derive(Clone)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
    gate: Arc<SyncGate>,
}

/// Where file syncs wait while a test holds them ([`SimStorage::hold_syncs`]),
/// and file writes while it holds those ([`SimStorage::hold_writes`]), as
/// if the disk took its time: so a test sees what goes on meanwhile, and
/// chooses the order in which writes in flight land.
#[derive(Default)]
struct SyncGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    held: bool,
    syncs_waiting: usize,
    /// File writes so far.
    writes: u64,
    writes_held: bool,
    /// Tickets of the writes waiting at the gate, in arrival order, and of
    /// those let through but not yet gone.
    writes_waiting: Vec<u64>,
    writes_released: BTreeSet<u64>,
    ticket_next: u64,
}

impl SyncGate {
    fn pass(&self) {
        let mut state = self.state.lock();
        if !state.held {
            return;
        }
        state.syncs_waiting += 1;
        self.changed.notify_all();
        while state.held {
            self.changed.wait(&mut state);
        }
        state.syncs_waiting -= 1;
    }

    /// Holds a write, before it changes anything, while writes are held and
    /// the test has not let this one through.
    fn pass_write(&self) {
        let mut state = self.state.lock();
        if !state.writes_held {
            return;
        }
        let ticket = state.ticket_next;
        state.ticket_next += 1;
        state.writes_waiting.push(ticket);
        self.changed.notify_all();
        while state.writes_held && !state.writes_released.contains(&ticket) {
            self.changed.wait(&mut state);
        }
        state.writes_released.remove(&ticket);
        state.writes_waiting.retain(|&waiting| waiting != ticket);
    }

    fn note_write(&self) {
        self.state.lock().writes += 1;
        self.changed.notify_all();
    }
}

struct State {
    config: SimConfig,
    rng: StdRng,
    epoch: u64,
    /// Ordered, so that a crash draws its randomness in the same order each
    /// run: a seed replays exactly.
    inodes: BTreeMap<u64, Inode>,
    inode_next: u64,
    names: BTreeMap<String, u64>,
    names_durable: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    namespace_pending: Vec<NamespaceOp>,
    /// Syncs still to fail, and the errno they fail with.
    sync_failures_pending: (u32, i32),
    /// File writes still to fail with ENOSPC (`fail_writes_as_full`).
    write_failures_pending: u32,
    /// Changes still allowed before every call fails (`stop_after`).
    changes_until_stop: Option<u64>,
    /// The disk's size (`set_capacity`); `None`: unlimited.
    capacity_bytes: Option<u64>,
}

impl State {
    /// Counts one change against `stop_after`; fails once it is used up.
    fn change(&mut self) -> io::Result<()> {
        match &mut self.changes_until_stop {
            None => Ok(()),
            Some(0) => Err(stopped()),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
        }
    }

    /// Bytes the live files take.
    fn used_bytes(&self) -> u64 {
        let live: BTreeSet<u64> = self.names.values().copied().collect();
        live.iter().filter_map(|inode| self.inodes.get(inode)).map(Inode::footprint).sum()
    }

    /// Fails with ENOSPC if growing one file's footprint from `before` to
    /// `after` bytes does not fit.
    fn check_space(&self, before: u64, after: u64) -> io::Result<()> {
        let Some(capacity) = self.capacity_bytes else { return Ok(()) };
        if after <= before || self.used_bytes() - before + after <= capacity {
            return Ok(());
        }
        Err(io::Error::new(io::ErrorKind::StorageFull, "no space left on the simulated disk"))
    }

    fn check_running(&self) -> io::Result<()> {
        if self.changes_until_stop == Some(0) {
            Err(stopped())
        } else {
            Ok(())
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("simulated process death (stop_after)")
}

#[derive(Default)]
struct Inode {
    contents: Vec<u8>,
    contents_durable: Vec<u8>,
    pending: Vec<DataOp>,
    /// The end of the space reserved by `allocate`.
    allocated_end: u64,
}

impl Inode {
    /// The disk space the file takes.
    fn footprint(&self) -> u64 {
        (self.contents.len() as u64).max(self.allocated_end)
    }
}

enum DataOp {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    PunchHole { offset: u64, length: u64 },
}

struct NamespaceOp {
    dir: String,
    kind: NamespaceOpKind,
}

enum NamespaceOpKind {
    Link { name: String, inode: u64 },
    Unlink { name: String },
    Rename { from: String, to: String },
}

impl SimStorage {
    pub fn new(config: SimConfig, seed: u64) -> Self {
        let mut dirs = BTreeSet::new();
        dirs.insert(String::new());
        SimStorage {
            state: Arc::new(Mutex::new(State {
                config,
                rng: StdRng::seed_from_u64(seed),
                epoch: 0,
                inodes: BTreeMap::new(),
                inode_next: 1,
                names: BTreeMap::new(),
                names_durable: BTreeMap::new(),
                dirs,
                namespace_pending: Vec::new(),
                sync_failures_pending: (0, 0),
                write_failures_pending: 0,
                changes_until_stop: None,
                capacity_bytes: None,
            })),
            gate: Arc::default(),
        }
    }

    /// A handle on `inode`, opened in `epoch`.
    fn file(&self, inode: u64, epoch: u64, direct: bool) -> Arc<dyn File> {
        Arc::new(SimFile { state: Arc::clone(&self.state), gate: Arc::clone(&self.gate), inode, epoch, direct })
    }

    /// Makes every file sync wait until [`SimStorage::release_syncs`].
    pub fn hold_syncs(&self) {
        self.gate.state.lock().held = true;
    }

    pub fn release_syncs(&self) {
        self.gate.state.lock().held = false;
        self.gate.changed.notify_all();
    }

    /// Makes every file write wait, before it lands, until it is let through
    /// ([`SimStorage::release_newest_write`]) or [`SimStorage::release_writes`].
    pub fn hold_writes(&self) {
        self.gate.state.lock().writes_held = true;
    }

    pub fn release_writes(&self) {
        self.gate.state.lock().writes_held = false;
        self.gate.changed.notify_all();
    }

    /// Lets the write that came to the held gate last land; false if none waits.
    /// (The oldest waits until then: a test lands writes in flight in the
    /// opposite of the order they were made.)
    pub fn release_newest_write(&self) -> bool {
        let mut state = self.gate.state.lock();
        let Some(&newest) = state.writes_waiting.iter().rev().find(|&ticket| !state.writes_released.contains(ticket))
        else {
            return false;
        };
        state.writes_released.insert(newest);
        self.gate.changed.notify_all();
        true
    }

    /// Waits until `writes` writes wait at the held gate, not yet let
    /// through; false if nothing changes for `timeout`.
    pub fn wait_for_writes_held(&self, writes: usize, timeout: Duration) -> bool {
        let mut state = self.gate.state.lock();
        while state.writes_waiting.len() - state.writes_released.len() < writes {
            if self.gate.changed.wait_for(&mut state, timeout).timed_out() {
                return false;
            }
        }
        true
    }

    /// Waits until `writes` file writes were made in all (see
    /// [`SimStorage::writes`]); false if nothing changes for `timeout`.
    pub fn wait_for_writes(&self, writes: u64, timeout: Duration) -> bool {
        let mut state = self.gate.state.lock();
        while state.writes < writes {
            if self.gate.changed.wait_for(&mut state, timeout).timed_out() {
                return false;
            }
        }
        true
    }

    /// File writes so far.
    pub fn writes(&self) -> u64 {
        self.gate.state.lock().writes
    }

    /// Waits until `syncs` syncs wait at the held gate and `writes` file
    /// writes were made in all; false if nothing changes for `timeout`: a
    /// guard that fails a test rather than hanging it, not simulated time
    /// (the simulator reads no clock).
    pub fn wait_while_syncs_held(&self, syncs: usize, writes: u64, timeout: Duration) -> bool {
        let mut state = self.gate.state.lock();
        while !(state.held && state.syncs_waiting >= syncs && state.writes >= writes) {
            if self.gate.changed.wait_for(&mut state, timeout).timed_out() {
                return false;
            }
        }
        true
    }

    /// Simulates power loss: keeps the durable state plus a random part of the
    /// rest, and invalidates all open handles.
    pub fn crash(&self) {
        let mut state = self.state.lock();
        let state = &mut *state;
        state.epoch += 1;
        state.changes_until_stop = None;
        for inode in state.inodes.values_mut() {
            let mut survived = std::mem::take(&mut inode.contents_durable);
            for op in std::mem::take(&mut inode.pending) {
                if !state.rng.random_bool(state.config.write_survival) {
                    continue;
                }
                match op {
                    DataOp::Write { offset, data } => {
                        if state.rng.random_bool(state.config.torn_write) {
                            let sector = state.config.sector_bytes as usize;
                            for (index, piece) in data.chunks(sector).enumerate() {
                                if state.rng.random_bool(0.5) {
                                    let at = offset + (index * sector) as u64;
                                    apply_write(&mut survived, at, piece);
                                }
                            }
                        } else {
                            apply_write(&mut survived, offset, &data);
                        }
                    }
                    DataOp::SetLen(size_bytes) => survived.resize(size_bytes as usize, 0),
                    DataOp::PunchHole { offset, length } => apply_punch(&mut survived, offset, length),
                }
            }
            inode.contents = survived.clone();
            inode.contents_durable = survived;
        }
        let pending = std::mem::take(&mut state.namespace_pending);
        let kept = state.rng.random_range(0..=pending.len());
        for op in pending.into_iter().take(kept) {
            apply_namespace(&mut state.names_durable, op.kind);
        }
        state.names = state.names_durable.clone();
        let live: BTreeSet<u64> = state.names.values().copied().collect();
        state.inodes.retain(|inode, _| live.contains(inode));
    }

    /// Simulates power loss during the last write to `path`: of that write
    /// only the first `sectors` sectors reached the disk, every earlier
    /// write to `path` did; the namespace keeps every change; other files
    /// keep only what was synced. A [`SimStorage::crash`] whose tear is
    /// chosen, to test each one.
    pub fn crash_tearing_last_write(&self, path: &str, sectors: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        let state = &mut *state;
        let torn = *state.names.get(path).ok_or_else(|| not_found(path))?;
        state.epoch += 1;
        state.changes_until_stop = None;
        let sector = state.config.sector_bytes;
        for (&number, inode) in &mut state.inodes {
            let mut survived = std::mem::take(&mut inode.contents_durable);
            let mut ops = std::mem::take(&mut inode.pending);
            if number == torn {
                let last = ops.iter().rposition(|op| matches!(op, DataOp::Write { .. }));
                for (index, op) in ops.drain(..).enumerate() {
                    match op {
                        DataOp::Write { offset, data } if Some(index) == last => {
                            let kept = data.len().min((sectors * sector) as usize);
                            apply_write(&mut survived, offset, &data[..kept]);
                        }
                        DataOp::Write { offset, data } => apply_write(&mut survived, offset, &data),
                        DataOp::SetLen(size_bytes) => survived.resize(size_bytes as usize, 0),
                        DataOp::PunchHole { offset, length } => apply_punch(&mut survived, offset, length),
                    }
                }
            }
            inode.contents = survived.clone();
            inode.contents_durable = survived;
        }
        for op in std::mem::take(&mut state.namespace_pending) {
            apply_namespace(&mut state.names_durable, op.kind);
        }
        state.names = state.names_durable.clone();
        let live: BTreeSet<u64> = state.names.values().copied().collect();
        state.inodes.retain(|inode, _| live.contains(inode));
        Ok(())
    }

    /// Lets `changes` more changes (writes, syncs, creations, renames,
    /// removals) through, then fails every call until [`SimStorage::crash`].
    pub fn stop_after(&self, changes: u64) {
        self.state.lock().changes_until_stop = Some(changes);
    }

    /// Whether a `stop_after` budget has run out.
    pub fn is_stopped(&self) -> bool {
        self.state.lock().changes_until_stop == Some(0)
    }

    /// Gives the disk a size (`None`: unlimited); see the module documentation.
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        self.state.lock().capacity_bytes = capacity_bytes;
    }

    /// Bytes the files take now.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// Makes the next `count` calls to `sync_data` fail with EIO.
    pub fn fail_syncs(&self, count: u32) {
        self.state.lock().sync_failures_pending = (count, libc_eio());
    }

    /// Makes the next `count` calls to `sync_data` fail with ENOSPC, as a
    /// device that could not find room for what it was writing back does.
    pub fn fail_syncs_as_full(&self, count: u32) {
        self.state.lock().sync_failures_pending = (count, libc_enospc());
    }

    /// Makes the next `count` file writes (and zeroed ranges) fail with
    /// ENOSPC, changing nothing: a thin device out of room for blocks
    /// already allocated.
    pub fn fail_writes_as_full(&self, count: u32) {
        self.state.lock().write_failures_pending = count;
    }

    /// Flips the bits of `mask` in the byte at `offset` of `path`, in both the
    /// visible and the durable contents.
    pub fn corrupt(&self, path: &str, offset: u64, mask: u8) -> io::Result<()> {
        let mut state = self.state.lock();
        let inode = *state.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = state.inodes.get_mut(&inode).expect("named inode exists");
        for bytes in [&mut inode.contents, &mut inode.contents_durable] {
            if let Some(byte) = bytes.get_mut(offset as usize) {
                *byte ^= mask;
            }
        }
        Ok(())
    }
}

/// The start of the first 512-byte sector of `contents`, from the one
/// holding `offset` on, whose being all zeros `wanted` accepts: the
/// simulated filesystem keeps holes at that grain.
fn sector_from(contents: &[u8], offset: u64, wanted: impl Fn(bool) -> bool) -> Option<u64> {
    const SECTOR: usize = 512;
    let first = offset as usize / SECTOR * SECTOR;
    let rest = contents.get(first..).unwrap_or_default();
    let found = rest.chunks(SECTOR).position(|sector| wanted(sector.iter().all(|&byte| byte == 0)));
    found.map(|index| (first + index * SECTOR) as u64)
}

fn apply_write(bytes: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset as usize..end].copy_from_slice(data);
}

fn apply_punch(bytes: &mut [u8], offset: u64, length: u64) {
    let start = (offset as usize).min(bytes.len());
    let end = (offset.saturating_add(length) as usize).min(bytes.len());
    bytes[start..end].fill(0);
}

fn apply_namespace(names: &mut BTreeMap<String, u64>, op: NamespaceOpKind) {
    match op {
        NamespaceOpKind::Link { name, inode } => {
            names.insert(name, inode);
        }
        NamespaceOpKind::Unlink { name } => {
            names.remove(&name);
        }
        NamespaceOpKind::Rename { from, to } => {
            if let Some(inode) = names.remove(&from) {
                names.insert(to, inode);
            }
        }
    }
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such file"))
}

fn dir_of(path: &str) -> String {
    crate::parent_dir(path).to_owned()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Change,
}

struct SimFile {
    state: Arc<Mutex<State>>,
    gate: Arc<SyncGate>,
    inode: u64,
    epoch: u64,
    /// Opened by `open_direct`: reads and writes aligned.
    direct: bool,
}

impl SimFile {
    fn with_inode<T>(
        &self,
        access: Access,
        f: impl FnOnce(&mut Inode, &mut (u32, i32)) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut state = self.state.lock();
        if state.epoch != self.epoch {
            return Err(io::Error::other("handle from before a simulated crash"));
        }
        match access {
            Access::Read => state.check_running()?,
            Access::Change => state.change()?,
        }
        let state = &mut *state;
        match state.inodes.get_mut(&self.inode) {
            Some(inode) => f(inode, &mut state.sync_failures_pending),
            // Unlinked while open: POSIX keeps the inode; nothing of it survives.
            None => Err(io::Error::other("file was removed")),
        }
    }

    /// Fails with ENOSPC unless the file may grow to take `end` bytes.
    fn check_growth(&self, end: u64) -> io::Result<()> {
        let state = self.state.lock();
        let Some(inode) = state.inodes.get(&self.inode) else { return Ok(()) };
        let before = inode.footprint();
        state.check_space(before, before.max(end))
    }
}

impl File for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct && !crate::is_direct_aligned(buf, offset) {
            let what = format!("direct read of {} bytes at {offset} into {:p} is not aligned", buf.len(), buf);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        }
        self.with_inode(Access::Read, |inode, _| {
            let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= inode.contents.len() as u64);
            let Some(end) = end else {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past end of file"));
            };
            buf.copy_from_slice(&inode.contents[offset as usize..end as usize]);
            Ok(())
        })
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if self.direct && !crate::is_direct_aligned(data, offset) {
            let what = format!("direct write of {} bytes at {offset} from {:p} is not aligned", data.len(), data);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        }
        self.gate.pass_write();
        {
            let mut state = self.state.lock();
            if state.write_failures_pending > 0 {
                state.write_failures_pending -= 1;
                return Err(io::Error::from_raw_os_error(libc_enospc()));
            }
        }
        self.check_growth(offset + data.len() as u64)?;
        self.with_inode(Access::Change, |inode, _| {
            apply_write(&mut inode.contents, offset, data);
            inode.pending.push(DataOp::Write { offset, data: data.to_vec() });
            Ok(())
        })?;
        self.gate.note_write();
        Ok(())
    }

    fn allocate(&self, offset: u64, length: u64) -> io::Result<()> {
        self.check_growth(offset + length)?;
        self.with_inode(Access::Change, |inode, _| {
            inode.allocated_end = inode.allocated_end.max(offset + length);
            Ok(())
        })
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.with_inode(Access::Read, |inode, _| Ok(inode.contents.len() as u64))
    }

    /// Sectors of zeros are holes here, as a filesystem's never-written
    /// blocks are.
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.with_inode(Access::Read, |inode, _| {
            let sector = sector_from(&inode.contents, offset, |zeros| !zeros);
            Ok(sector.map(|start| start.max(offset)))
        })
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        self.with_inode(Access::Read, |inode, _| {
            let sector = sector_from(&inode.contents, offset, |zeros| zeros);
            Ok(sector.map_or(inode.contents.len() as u64, |start| start.max(offset)).max(offset))
        })
    }

    fn set_len(&self, size_bytes: u64) -> io::Result<()> {
        self.check_growth(size_bytes)?;
        self.with_inode(Access::Change, |inode, _| {
            inode.contents.resize(size_bytes as usize, 0);
            inode.pending.push(DataOp::SetLen(size_bytes));
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.gate.pass();
        self.with_inode(Access::Change, |inode, sync_failures_pending| {
            let (count, errno) = sync_failures_pending;
            if *count > 0 {
                *count -= 1;
                inode.pending.clear();
                return Err(sync_failed(io::Error::from_raw_os_error(*errno)));
            }
            inode.pending.clear();
            inode.contents_durable = inode.contents.clone();
            Ok(())
        })
    }

    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()> {
        self.with_inode(Access::Change, |inode, _| {
            apply_punch(&mut inode.contents, offset, length);
            inode.pending.push(DataOp::PunchHole { offset, length });
            Ok(())
        })
    }

    /// The same bytes as a punched hole; the simulated disk does not tell
    /// the blocks' allocation apart (`allocated_end` stays as it was). A
    /// full disk (`fail_writes_as_full`) refuses it as it does a write: the
    /// filesystem may need blocks to split the file's extents.
    fn zero_range(&self, offset: u64, length: u64) -> io::Result<()> {
        {
            let mut state = self.state.lock();
            if state.write_failures_pending > 0 {
                state.write_failures_pending -= 1;
                return Err(io::Error::from_raw_os_error(libc_enospc()));
            }
        }
        self.punch_hole(offset, length)
    }
}

/// EIO and ENOSPC, without depending on libc for two constants.
const fn libc_eio() -> i32 {
    5
}

const fn libc_enospc() -> i32 {
    28
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.change()?;
        let mut prefix = String::new();
        for part in dir.split('/').filter(|part| !part.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            state.dirs.insert(prefix.clone());
        }
        Ok(())
    }

    fn open_file(&self, path: &str, mode: OpenMode) -> io::Result<Arc<dyn File>> {
        let mut state = self.state.lock();
        match mode {
            OpenMode::Existing => state.check_running()?,
            OpenMode::CreateNew | OpenMode::OpenOrCreate => state.change()?,
        }
        if !state.dirs.contains(crate::parent_dir(path)) {
            return Err(not_found(crate::parent_dir(path)));
        }
        let existing = state.names.get(path).copied();
        let inode = match (existing, mode) {
            (Some(_), OpenMode::CreateNew) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{path} exists")))
            }
            (Some(inode), _) => inode,
            (None, OpenMode::Existing) => return Err(not_found(path)),
            (None, _) => {
                let inode = state.inode_next;
                state.inode_next += 1;
                state.inodes.insert(inode, Inode::default());
                state.names.insert(path.to_owned(), inode);
                let op =
                    NamespaceOp { dir: dir_of(path), kind: NamespaceOpKind::Link { name: path.to_owned(), inode } };
                state.namespace_pending.push(op);
                inode
            }
        };
        Ok(self.file(inode, state.epoch, false))
    }

    fn open_direct(&self, path: &str) -> io::Result<Arc<dyn File>> {
        let state = self.state.lock();
        state.check_running()?;
        if !state.config.direct_io {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the simulated filesystem refuses direct I/O"));
        }
        let inode = *state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(self.file(inode, state.epoch, true))
    }

    fn create_scratch(&self, dir: &str) -> io::Result<Arc<dyn File>> {
        let mut state = self.state.lock();
        state.change()?;
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        // An inode no name links: nothing of it is durable.
        let inode = state.inode_next;
        state.inode_next += 1;
        state.inodes.insert(inode, Inode::default());
        Ok(self.file(inode, state.epoch, false))
    }

    fn remove_file(&self, path: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.change()?;
        state.names.remove(path).ok_or_else(|| not_found(path))?;
        let op = NamespaceOp { dir: dir_of(path), kind: NamespaceOpKind::Unlink { name: path.to_owned() } };
        state.namespace_pending.push(op);
        Ok(())
    }

    fn remove_dir_all(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.change()?;
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let prefix = format!("{dir}/");
        let doomed: Vec<String> = state.names.keys().filter(|name| name.starts_with(&prefix)).cloned().collect();
        for name in doomed {
            state.names.remove(&name);
            // Removing a tree is durable once the tree's parent is synced.
            let op = NamespaceOp { dir: dir_of(dir), kind: NamespaceOpKind::Unlink { name } };
            state.namespace_pending.push(op);
        }
        state.dirs.retain(|other| other != dir && !other.starts_with(&prefix));
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        assert_eq!(crate::parent_dir(from), crate::parent_dir(to), "renames stay in one directory");
        let mut state = self.state.lock();
        state.change()?;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_owned(), inode);
        let op = NamespaceOp {
            dir: dir_of(from),
            kind: NamespaceOpKind::Rename { from: from.to_owned(), to: to.to_owned() },
        };
        state.namespace_pending.push(op);
        Ok(())
    }

    fn hard_link(&self, from: &str, to: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.change()?;
        if !state.dirs.contains(crate::parent_dir(to)) {
            return Err(not_found(crate::parent_dir(to)));
        }
        if state.names.contains_key(to) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{to} exists")));
        }
        let inode = *state.names.get(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_owned(), inode);
        let op = NamespaceOp { dir: dir_of(to), kind: NamespaceOpKind::Link { name: to.to_owned(), inode } };
        state.namespace_pending.push(op);
        Ok(())
    }

    fn link_count(&self, path: &str) -> io::Result<u64> {
        let state = self.state.lock();
        state.check_running()?;
        let inode = *state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(state.names.values().filter(|&&other| other == inode).count() as u64)
    }

    fn list_dir(&self, dir: &str) -> io::Result<Vec<String>> {
        let state = self.state.lock();
        state.check_running()?;
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let direct_child = |path: &String| {
            path.strip_prefix(&prefix).filter(|rest| !rest.is_empty() && !rest.contains('/')).map(str::to_owned)
        };
        let mut entries: Vec<String> =
            state.names.keys().filter_map(direct_child).chain(state.dirs.iter().filter_map(direct_child)).collect();
        entries.sort();
        Ok(entries)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        let state = self.state.lock();
        state.check_running()?;
        Ok(state.names.contains_key(path) || state.dirs.contains(path))
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.change()?;
        let state = &mut *state;
        let pending = std::mem::take(&mut state.namespace_pending);
        for op in pending {
            if op.dir == dir {
                apply_namespace(&mut state.names_durable, op.kind);
            } else {
                state.namespace_pending.push(op);
            }
        }
        Ok(())
    }

    fn space(&self) -> io::Result<Space> {
        let state = self.state.lock();
        state.check_running()?;
        let used_bytes = state.used_bytes();
        Ok(match state.capacity_bytes {
            Some(capacity) => Space { total_bytes: capacity, free_bytes: capacity.saturating_sub(used_bytes) },
            None => Space { total_bytes: u64::MAX, free_bytes: u64::MAX - used_bytes },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_data_survives_a_crash_and_handles_die() {
        let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 7);
        storage.create_dir_all("d").unwrap();
        let file = storage.open_file("d/f", OpenMode::CreateNew).unwrap();
        file.write_all_at(b"durable", 0).unwrap();
        file.sync_data().unwrap();
        storage.sync_dir("d").unwrap();
        file.write_all_at(b"lost", 100).unwrap();
        storage.crash();
        assert!(file.size_bytes().is_err(), "old handles must die with the crash");
        let file = storage.open_file("d/f", OpenMode::Existing).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 7);
    }

    #[test]
    fn unsynced_names_can_vanish() {
        let storage = SimStorage::new(SimConfig::default(), 3);
        storage.create_dir_all("d").unwrap();
        // Without sync_dir, the crash keeps a random prefix of the namespace ops;
        // across seeds both outcomes must occur.
        let mut outcomes = BTreeSet::new();
        for seed in 0..32 {
            let storage = SimStorage::new(SimConfig::default(), seed);
            storage.create_dir_all("d").unwrap();
            let file = storage.open_file("d/f", OpenMode::CreateNew).unwrap();
            file.sync_data().unwrap();
            storage.crash();
            outcomes.insert(storage.exists("d/f").unwrap());
        }
        assert_eq!(outcomes.len(), 2, "seeds 0..32 should both keep and lose the name");
        drop(storage);
    }

    #[test]
    fn a_hard_link_shares_the_file_and_is_durable_once_its_directory_is_synced() {
        let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 5);
        storage.create_dir_all("a").unwrap();
        storage.create_dir_all("b").unwrap();
        let file = storage.open_file("a/f", OpenMode::CreateNew).unwrap();
        file.write_all_at(&[7; 1000], 0).unwrap();
        file.sync_data().unwrap();
        storage.sync_dir("a").unwrap();
        storage.hard_link("a/f", "b/g").unwrap();
        assert_eq!(storage.link_count("a/f").unwrap(), 2);
        assert_eq!(storage.used_bytes(), 1000, "one file, two names");
        let error = storage.hard_link("a/f", "b/g").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(storage.hard_link("a/none", "b/h").unwrap_err().kind(), io::ErrorKind::NotFound);
        storage.sync_dir("b").unwrap();
        storage.remove_file("a/f").unwrap();
        storage.sync_dir("a").unwrap();
        storage.crash();
        let linked = storage.open_file("b/g", OpenMode::Existing).unwrap();
        let mut bytes = [0; 1000];
        linked.read_exact_at(&mut bytes, 0).unwrap();
        assert_eq!(bytes, [7; 1000], "the bytes outlive the first name");
        assert_eq!(storage.link_count("b/g").unwrap(), 1);
    }

    #[test]
    fn stop_after_fails_everything_once_the_budget_is_spent() {
        let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 1);
        let file = storage.open_file("f", OpenMode::CreateNew).unwrap();
        storage.sync_dir("").unwrap();
        storage.stop_after(2);
        file.write_all_at(b"ab", 0).unwrap();
        file.sync_data().unwrap();
        assert!(storage.is_stopped(), "the budget of two changes is spent");
        assert!(file.write_all_at(b"c", 2).is_err());
        assert!(storage.exists("f").is_err(), "a dead process reads nothing either");
        storage.crash();
        let file = storage.open_file("f", OpenMode::Existing).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 2, "what was synced before the stop survives");
    }

    #[test]
    fn a_full_disk_refuses_growth_and_recovers_when_space_is_freed() {
        let storage = SimStorage::new(SimConfig::default(), 1);
        storage.set_capacity(Some(10_000));
        let a = storage.open_file("a", OpenMode::CreateNew).unwrap();
        a.allocate(0, 8_000).unwrap();
        assert_eq!(storage.space().unwrap().free_bytes, 2_000);
        a.write_all_at(&[1; 8_000], 0).unwrap(); // inside what was allocated
        let b = storage.open_file("b", OpenMode::CreateNew).unwrap();
        let error = b.write_all_at(&[2; 3_000], 0).unwrap_err();
        assert!(crate::is_transient(&error), "{error}");
        assert_eq!(b.size_bytes().unwrap(), 0, "a refused write changes nothing");
        assert!(b.allocate(0, 3_000).is_err());
        storage.remove_file("a").unwrap();
        b.write_all_at(&[2; 3_000], 0).unwrap();
        assert_eq!(storage.used_bytes(), 3_000);
    }

    #[test]
    fn failed_sync_forgets_unsynced_writes() {
        let storage = SimStorage::new(SimConfig { write_survival: 1.0, torn_write: 0.0, ..SimConfig::default() }, 1);
        let file = storage.open_file("f", OpenMode::CreateNew).unwrap();
        storage.sync_dir("").unwrap();
        file.write_all_at(b"x", 0).unwrap();
        storage.fail_syncs(1);
        assert!(file.sync_data().is_err());
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, 0).unwrap();
        assert_eq!(&byte, b"x", "the page cache still shows the write");
        storage.crash();
        let file = storage.open_file("f", OpenMode::Existing).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 0, "but it never reached the disk");
    }
}
