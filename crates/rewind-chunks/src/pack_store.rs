//! The pack-store seam: where sealed packs live (issue 14). The chunk store
//! writes, reads, lists and deletes packs only through [`PackStore`]; a
//! local directory ([`LocalPackStore`]) and S3-compatible object storage
//! (the `rewind-s3` crate) implement it, and [`conformance`] is the one
//! suite every implementation passes — with [`FaultyPackStore`] injecting
//! failures around any of them.
//!
//! The contract is object storage's, the weaker of the two:
//! - A pack is written once, whole: [`PackUpload`] takes its bytes front to
//!   back and nothing is visible under its number until
//!   [`PackUpload::finish`], which makes it durable and fails with
//!   `AlreadyExists` if the number is taken (S3 `If-None-Match: *`). An
//!   upload dropped or aborted leaves nothing behind.
//! - Reads are byte ranges (S3 ranged GETs); a range past the end fails
//!   with `UnexpectedEof`, a missing pack with `NotFound`.
//! - Every stored pack has a [`Generation`]: a token that differs between
//!   two objects written under the same number with different contents (S3's
//!   ETag), so whoever recorded one can tell the object was replaced.
//! - Errors are `std::io::Error`s; those [`rewind_io::is_transient`] calls
//!   transient (a full disk, a timeout, a throttled request) may be retried.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rewind_format::crc32c;
use rewind_io::{File, OpenMode, Storage, WriteBehind, DIRECT_ALIGN};
use rustc_hash::FxHashMap;

use crate::pack_name;

/// Which version of a stored object this is (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Generation(pub String);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Fills `bufs` from one contiguous read by `read` (a [`PackStore::read`]).
pub(crate) fn read_then_scatter(
    read: impl FnOnce(&mut [u8]) -> io::Result<()>,
    bufs: &mut [io::IoSliceMut<'_>],
) -> io::Result<()> {
    let mut bytes = vec![0; bufs.iter().map(|buf| buf.len()).sum()];
    read(&mut bytes)?;
    let mut rest = &bytes[..];
    for buf in bufs {
        let (head, tail) = rest.split_at(buf.len());
        buf.copy_from_slice(head);
        rest = tail;
    }
    Ok(())
}

/// A pack as the store lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPack {
    pub pack: u64,
    pub bytes: u64,
    pub generation: Generation,
}

/// Where sealed packs live. See the module documentation for the contract.
pub trait PackStore: Send + Sync {
    /// Where pack `pack` is, for messages: a path or a URL.
    fn locate(&self, pack: u64) -> String;
    /// Starts writing pack `pack`.
    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>>;
    /// The size and generation of pack `pack`.
    fn stat(&self, pack: u64) -> io::Result<StoredPack>;
    /// Reads `buf.len()` bytes of pack `pack` at `offset`.
    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Fills `bufs` in turn from the bytes of pack `pack` at `offset` on. A
    /// store whose packs are files reads straight into them; any other reads
    /// the range whole and copies it out.
    fn read_vectored(&self, pack: u64, offset: u64, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<()> {
        read_then_scatter(|range| self.read(pack, offset, range), bufs)
    }
    /// Stores the whole of `file` as pack `pack`, as [`PackStore::create`]
    /// and an upload of its bytes would: an *adopted* file (a sealed journal
    /// segment, which nothing writes again). `path` is its name in the
    /// storage the node's stores share; a local store gives it a second name
    /// there rather than copying it, so the bytes are written once. The
    /// default copies them.
    fn adopt(&self, pack: u64, path: &str, file: &dyn File) -> io::Result<Generation> {
        let _ = path;
        copy_into(self, pack, file)
    }
    /// Removes pack `pack` durably; removing a pack that is not there is not
    /// an error (a crash may have come between a removal and its record).
    fn delete(&self, pack: u64) -> io::Result<()>;
    /// Every pack stored, in number order.
    fn list(&self) -> io::Result<Vec<StoredPack>>;
}

/// [`PackStore::adopt`] by copying: `file`'s bytes uploaded as pack `pack`.
fn copy_into<S: PackStore + ?Sized>(store: &S, pack: u64, file: &dyn File) -> io::Result<Generation> {
    const COPY_BYTES: u64 = 1 << 20;
    let bytes = file.size_bytes()?;
    let mut upload = store.create(pack)?;
    let mut buffer = vec![0; COPY_BYTES.min(bytes) as usize];
    let mut offset = 0;
    while offset < bytes {
        let piece = &mut buffer[..COPY_BYTES.min(bytes - offset) as usize];
        let read = file.read_exact_at(piece, offset).and_then(|()| upload.append(piece));
        if let Err(error) = read {
            let _ = upload.abort();
            return Err(error);
        }
        offset += piece.len() as u64;
    }
    upload.finish()
}

/// A pack being written; see [`PackStore::create`].
pub trait PackUpload: Send {
    /// Adds `bytes` to the end of the pack. Local stores take the room here,
    /// so a full disk fails an append, never the finish.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// The bytes appended so far.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes the pack durable and visible under its number.
    fn finish(self: Box<Self>) -> io::Result<Generation>;
    /// Leaves nothing behind.
    fn abort(self: Box<Self>) -> io::Result<()>;
}

/// How many bytes at the end of a local pack its generation covers: a
/// pack's trailer and footer (their CRCs) are there.
const GENERATION_TAIL_BYTES: u64 = 4096;

/// Packs as files in a directory of a [`Storage`]: `NNNN.pack`, written as
/// `NNNN.pack.part` and renamed when finished. A local pack's generation is
/// its size and the CRC-32C of its last 4 KiB, where a pack keeps its
/// trailer and the CRC of its footer.
pub struct LocalPackStore {
    storage: Arc<dyn Storage>,
    dir: String,
    /// Packs opened for reading, kept open: reads come one chunk at a time.
    open: parking_lot::Mutex<FxHashMap<u64, Arc<dyn File>>>,
    /// Whether the filesystem takes direct I/O (see [`PartFile`]): false
    /// once it refused it, said in the log then.
    direct: AtomicBool,
}

/// How many packs [`LocalPackStore`] keeps open for reading.
const OPEN_PACKS_MAX: usize = 256;

impl LocalPackStore {
    /// The packs in `dir` (created if needed). Uploads a crash interrupted
    /// (`.part` files) are removed.
    pub fn open(storage: Arc<dyn Storage>, dir: &str) -> io::Result<LocalPackStore> {
        storage.create_dir_all(dir)?;
        let mut removed = false;
        for name in storage.list_dir(dir)? {
            if name.ends_with(PART_SUFFIX) {
                tracing::info!(path = %format!("{dir}/{name}"), "removing a pack a crash left half written");
                storage.remove_file(&format!("{dir}/{name}"))?;
                removed = true;
            }
        }
        if removed {
            storage.sync_dir(dir)?;
        }
        Ok(LocalPackStore { storage, dir: dir.to_owned(), open: Default::default(), direct: AtomicBool::new(true) })
    }

    fn path(&self, pack: u64) -> String {
        format!("{}/{}", self.dir, pack_name(pack))
    }

    /// The part file `part` (just created as `file`), written directly
    /// where the filesystem takes it.
    fn part_file(&self, part: &str, file: Arc<dyn File>) -> io::Result<PartFile> {
        if self.direct.load(Ordering::Relaxed) {
            match self.storage.open_direct(part) {
                Ok(direct) => {
                    return Ok(PartFile::Direct { file: direct, staged: Vec::new(), staged_len: 0, on_disk: 0 })
                }
                Err(error) if error.kind() == io::ErrorKind::Unsupported => {
                    tracing::info!(dir = %self.dir, %error, "the filesystem refuses direct I/O: packs are written through the page cache");
                    self.direct.store(false, Ordering::Relaxed);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(PartFile::Buffered(WriteBehind::new(file)))
    }

    /// Pack `pack`, open for reading.
    fn file(&self, pack: u64) -> io::Result<Arc<dyn File>> {
        if let Some(file) = self.open.lock().get(&pack) {
            return Ok(Arc::clone(file));
        }
        let file = self.storage.open_file(&self.path(pack), OpenMode::Existing)?;
        let mut open = self.open.lock();
        if open.len() >= OPEN_PACKS_MAX {
            open.clear();
        }
        open.insert(pack, Arc::clone(&file));
        Ok(file)
    }

    fn generation_of(file: &dyn File, bytes: u64) -> io::Result<Generation> {
        let tail = bytes.min(GENERATION_TAIL_BYTES);
        let mut buf = vec![0; tail as usize];
        file.read_exact_at(&mut buf, bytes - tail)?;
        Ok(local_generation(bytes, &buf))
    }
}

const PART_SUFFIX: &str = ".part";

fn local_generation(bytes: u64, tail: &[u8]) -> Generation {
    Generation(format!("{bytes}-{:08x}", crc32c(tail)))
}

/// `name` if it names a pack (16 hex digits and `.pack`).
pub fn parse_pack_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".pack")?;
    if digits.len() != 16 || !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

impl PackStore for LocalPackStore {
    fn locate(&self, pack: u64) -> String {
        self.path(pack)
    }

    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>> {
        let path = self.path(pack);
        let part = format!("{path}{PART_SUFFIX}");
        let file = match self.storage.open_file(&part, OpenMode::CreateNew) {
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                // Left by an upload this process abandoned without aborting.
                self.storage.remove_file(&part)?;
                self.storage.open_file(&part, OpenMode::CreateNew)?
            }
            opened => opened?,
        };
        Ok(Box::new(LocalUpload {
            storage: Arc::clone(&self.storage),
            dir: self.dir.clone(),
            file: Some(self.part_file(&part, file)?),
            path,
            part,
            written: 0,
            tail: Vec::new(),
        }))
    }

    fn stat(&self, pack: u64) -> io::Result<StoredPack> {
        let file = self.file(pack)?;
        let bytes = file.size_bytes()?;
        Ok(StoredPack { pack, bytes, generation: LocalPackStore::generation_of(&*file, bytes)? })
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // A range past the end fails with `UnexpectedEof` (a short read).
        self.file(pack)?.read_exact_at(buf, offset)
    }

    fn read_vectored(&self, pack: u64, offset: u64, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<()> {
        self.file(pack)?.read_exact_vectored_at(bufs, offset)
    }

    fn adopt(&self, pack: u64, path: &str, file: &dyn File) -> io::Result<Generation> {
        match self.storage.hard_link(path, &self.path(pack)) {
            // Other filesystems, or one without hard links: a copy.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::CrossesDevices | io::ErrorKind::Unsupported | io::ErrorKind::PermissionDenied
                ) =>
            {
                tracing::info!(%path, dir = %self.dir, %error, "cannot give a journal segment a second name among the packs: it is copied");
                return copy_into(self, pack, file);
            }
            linked => linked?,
        }
        self.storage.sync_dir(&self.dir)?;
        Ok(self.stat(pack)?.generation)
    }

    fn delete(&self, pack: u64) -> io::Result<()> {
        self.open.lock().remove(&pack);
        match self.storage.remove_file(&self.path(pack)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            removed => removed,
        }?;
        self.storage.sync_dir(&self.dir)
    }

    fn list(&self) -> io::Result<Vec<StoredPack>> {
        let mut packs = Vec::new();
        for name in self.storage.list_dir(&self.dir)? {
            let Some(pack) = parse_pack_name(&name) else {
                if !name.ends_with(PART_SUFFIX) {
                    tracing::warn!(path = %format!("{}/{name}", self.dir), "ignoring a file that is not a pack");
                }
                continue;
            };
            match self.stat(pack) {
                Ok(stored) => packs.push(stored),
                // Deleted since the listing (a collection running meanwhile).
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        packs.sort_by_key(|stored| stored.pack);
        Ok(packs)
    }
}

struct LocalUpload {
    storage: Arc<dyn Storage>,
    dir: String,
    path: String,
    part: String,
    /// `None` once finished or aborted.
    file: Option<PartFile>,
    written: u64,
    /// The last bytes appended, up to [`GENERATION_TAIL_BYTES`].
    tail: Vec<u8>,
}

/// How a pack's part file is written. Directly (`O_DIRECT`), a megabyte
/// at a time from one buffer: archived history is written once and read
/// seldom, and through the page cache every byte was copied into a page
/// taken fresh (the pages of the megabytes before left the cache as they
/// reached the device, so as not to push the present out): on a VM that
/// hands freed memory back to its host, a host fault for every page — 22%
/// of the server's samples while a burst was archived at 110 MiB/s, in the
/// kernel's copy alone (BENCHMARKS.md). Where the filesystem refuses direct
/// I/O (tmpfs), through the page cache, written behind
/// (`rewind_io::WriteBehind`): the device writes while the archiver fills
/// the next megabyte, and the pages leave the cache once on the device.
enum PartFile {
    Direct {
        file: Arc<dyn File>,
        /// The bytes not yet on the device, at an aligned start in here
        /// (`rewind_io::aligned_slice`); they follow `on_disk`.
        staged: Vec<u8>,
        staged_len: usize,
        /// Bytes of the file on the device: whole sectors.
        on_disk: u64,
    },
    Buffered(WriteBehind<Arc<dyn File>>),
}

/// What a direct part file writes at once.
const DIRECT_WRITE_BYTES: usize = 1 << 20;

impl PartFile {
    fn file(&self) -> &dyn File {
        match self {
            PartFile::Direct { file, .. } => &**file,
            PartFile::Buffered(behind) => behind.file(),
        }
    }

    /// Writes `bytes` at `offset`, the end of what was appended so far.
    fn append(&mut self, bytes: &[u8], offset: u64) -> io::Result<()> {
        match self {
            PartFile::Buffered(behind) => {
                behind.file().write_all_at(bytes, offset)?;
                // An error here is the device's, for bytes already written:
                // the append fails, as the pack's finish would have.
                behind.written(offset, bytes.len() as u64)
            }
            PartFile::Direct { file, staged, staged_len, on_disk } => {
                assert_eq!(*on_disk + *staged_len as u64, offset, "appends follow each other");
                let mut rest = bytes;
                while !rest.is_empty() {
                    let stage = rewind_io::aligned_slice(staged, DIRECT_WRITE_BYTES);
                    let take = rest.len().min(DIRECT_WRITE_BYTES - *staged_len);
                    stage[*staged_len..*staged_len + take].copy_from_slice(&rest[..take]);
                    *staged_len += take;
                    rest = &rest[take..];
                    if *staged_len == DIRECT_WRITE_BYTES {
                        file.write_all_at(stage, *on_disk)?;
                        *on_disk += DIRECT_WRITE_BYTES as u64;
                        *staged_len = 0;
                    }
                }
                Ok(())
            }
        }
    }

    /// Puts every byte appended on the device and makes the file
    /// `length` bytes long and durable.
    fn finish(&mut self, length: u64) -> io::Result<()> {
        if let PartFile::Direct { file, staged, staged_len, on_disk } = self {
            if *staged_len > 0 {
                // The last sector padded with zeros, then cut off at the end.
                let padded = staged_len.next_multiple_of(DIRECT_ALIGN);
                let stage = rewind_io::aligned_slice(staged, DIRECT_WRITE_BYTES);
                stage[*staged_len..padded].fill(0);
                file.write_all_at(&stage[..padded], *on_disk)?;
                *on_disk += padded as u64;
                *staged_len = 0;
                file.set_len(length)?;
            }
            assert!(*on_disk >= length && *on_disk - length < DIRECT_ALIGN as u64, "every byte appended is written");
        }
        self.file().sync_data()
    }
}

impl LocalUpload {
    fn file(&mut self) -> &mut PartFile {
        self.file.as_mut().expect("an upload is used until it is finished or aborted")
    }

    /// Removes the part file: the upload leaves nothing behind.
    fn remove_part(&mut self) -> io::Result<()> {
        self.file.take();
        self.storage.remove_file(&self.part)
    }
}

impl PackUpload for LocalUpload {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        // Space first: a full disk fails here, never at the finish's sync.
        let (offset, length) = (self.written, bytes.len() as u64);
        let file = self.file();
        file.file().allocate(offset, length)?;
        file.append(bytes, offset)?;
        self.written += length;
        let keep = GENERATION_TAIL_BYTES as usize;
        if bytes.len() >= keep {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - keep..]);
        } else {
            self.tail.extend_from_slice(bytes);
            let excess = self.tail.len().saturating_sub(keep);
            self.tail.drain(..excess);
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        self.written
    }

    fn finish(mut self: Box<Self>) -> io::Result<Generation> {
        let length = self.written;
        self.file().finish(length)?;
        if self.storage.exists(&self.path)? {
            self.remove_part()?;
            let message = format!("{} already exists; packs are written once", self.path);
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, message));
        }
        self.storage.rename(&self.part, &self.path)?;
        self.file.take();
        self.storage.sync_dir(&self.dir)?;
        Ok(local_generation(self.written, &self.tail))
    }

    fn abort(mut self: Box<Self>) -> io::Result<()> {
        self.remove_part()
    }
}

impl Drop for LocalUpload {
    /// An upload dropped unfinished (a panic, an error on the way) leaves
    /// nothing; a crash leaves its part file to the next open.
    fn drop(&mut self) {
        if self.file.is_some() {
            if let Err(error) = self.remove_part() {
                tracing::warn!(path = %self.part, %error, "cannot remove an unfinished pack");
            }
        }
    }
}

/// What [`FaultyPackStore`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every call fails with a transient error (`TimedOut`), as a store that
    /// does not answer; nothing reaches the inner store.
    Unreachable,
    /// Every read returns its bytes with one bit flipped.
    FlipBit,
    /// Finishing an upload fails after the inner store finished it: the
    /// caller does not know the pack is there (a reply lost on the way).
    LoseFinishReply,
}

/// A [`PackStore`] around another that fails on request: the conformance
/// suite and the chunk store's tests use it to show that faults stay
/// errors of the calls they hit.
pub struct FaultyPackStore {
    inner: Arc<dyn PackStore>,
    fault: Arc<parking_lot::Mutex<Option<Fault>>>,
    injected: Arc<AtomicU64>,
}

impl FaultyPackStore {
    pub fn new(inner: Arc<dyn PackStore>) -> FaultyPackStore {
        FaultyPackStore { inner, fault: Arc::default(), injected: Arc::default() }
    }

    /// Breaks what `fault` says from now on (`None`: nothing).
    pub fn set(&self, fault: Option<Fault>) {
        *self.fault.lock() = fault;
    }

    /// How many calls a fault has broken.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    fn is(&self, fault: Fault) -> bool {
        *self.fault.lock() == Some(fault)
    }

    fn check_reachable(&self) -> io::Result<()> {
        if !self.is(Fault::Unreachable) {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        Err(unreachable_error())
    }
}

fn unreachable_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the pack store does not answer (an injected fault)")
}

impl PackStore for FaultyPackStore {
    fn locate(&self, pack: u64) -> String {
        self.inner.locate(pack)
    }

    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>> {
        self.check_reachable()?;
        let inner = self.inner.create(pack)?;
        Ok(Box::new(FaultyUpload { inner, fault: Arc::clone(&self.fault), injected: Arc::clone(&self.injected) }))
    }

    fn stat(&self, pack: u64) -> io::Result<StoredPack> {
        self.check_reachable()?;
        self.inner.stat(pack)
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_reachable()?;
        self.inner.read(pack, offset, buf)?;
        if self.is(Fault::FlipBit) && !buf.is_empty() {
            self.injected.fetch_add(1, Ordering::Relaxed);
            let middle = buf.len() / 2;
            buf[middle] ^= 0x10;
        }
        Ok(())
    }

    fn adopt(&self, pack: u64, path: &str, file: &dyn File) -> io::Result<Generation> {
        self.check_reachable()?;
        self.inner.adopt(pack, path, file)
    }

    fn delete(&self, pack: u64) -> io::Result<()> {
        self.check_reachable()?;
        self.inner.delete(pack)
    }

    fn list(&self) -> io::Result<Vec<StoredPack>> {
        self.check_reachable()?;
        self.inner.list()
    }
}

struct FaultyUpload {
    inner: Box<dyn PackUpload>,
    fault: Arc<parking_lot::Mutex<Option<Fault>>>,
    injected: Arc<AtomicU64>,
}

impl FaultyUpload {
    fn fault(&self) -> Option<Fault> {
        *self.fault.lock()
    }
}

impl PackUpload for FaultyUpload {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.fault() == Some(Fault::Unreachable) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(unreachable_error());
        }
        self.inner.append(bytes)
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn finish(self: Box<Self>) -> io::Result<Generation> {
        match self.fault() {
            Some(Fault::Unreachable) => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                self.inner.abort()?;
                Err(unreachable_error())
            }
            Some(Fault::LoseFinishReply) => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                self.inner.finish()?;
                Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "the reply to a finished upload was lost (an injected fault)",
                ))
            }
            _ => self.inner.finish(),
        }
    }

    fn abort(self: Box<Self>) -> io::Result<()> {
        self.inner.abort()
    }
}
