//! The storage seam. The engine and the storage parts talk to files only through
//! [`Storage`] and [`File`], so that the same code runs on the real filesystem
//! ([`OsStorage`]) and on [`SimStorage`], which models what survives a crash:
//! the synced bytes plus a random, possibly torn, subset of the unsynced ones.
//!
//! Paths are relative to the storage root and use `/` separators.
//!
//! Contracts:
//! - `File::read_exact_at` fails with `UnexpectedEof` if the range is not fully
//!   inside the file; it never returns a short read.
//! - `File::sync_data` makes every completed `write_all_at`, `set_len`,
//!   `punch_hole` and `zero_range` on that file durable. It does not make
//!   the file's *name* durable: that needs `Storage::sync_dir` on the
//!   parent directory.
//! - After a failed `sync_data`, the state of unsynced data is unknown (Linux may
//!   have dropped the dirty pages); callers must treat the file as poisoned.
//! - All methods may be called concurrently; writes to disjoint ranges do not
//!   interfere.
//! - `File::allocate` reserves disk space for a range, so that writing it
//!   later cannot run out of space: the full-disk error comes then, cleanly,
//!   before any data is in flight, and never from a later `sync_data`.
//!   Writers allocate before they write; that is what makes a failed sync a
//!   device failure (poison) rather than a full disk (an error of the
//!   request, see [`is_transient`]).

mod counting;
mod os;
mod sim;

pub use counting::{CountingStorage, IoCounters, IoStats};
pub use os::{os_file, DirLock, OsStorage};
pub use sim::{SimConfig, SimStorage};

use std::io;
use std::sync::Arc;

/// How [`Storage::open_file`] treats an existing or missing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// The file must not exist; it is created empty.
    CreateNew,
    /// Open it, creating it empty if missing.
    OpenOrCreate,
}

pub trait File: Send + Sync {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Fills `bufs` in turn from the bytes at `offset` on (a scatter read:
    /// what lies between records goes to scratch, the records' contents
    /// straight where they are wanted, with no copy between).
    fn read_exact_vectored_at(&self, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.read_exact_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Reserves disk space for `offset..offset+length` without changing the
    /// file's size (the range reads as before until written).
    fn allocate(&self, offset: u64, length: u64) -> io::Result<()>;
    fn size_bytes(&self) -> io::Result<u64>;
    fn set_len(&self, size_bytes: u64) -> io::Result<()>;
    /// Makes what was written durable. Its error, whatever the errno, is
    /// [`sync_failed`]'s: never transient.
    fn sync_data(&self) -> io::Result<()>;
    /// Deallocates `offset..offset+length`; it reads back as zeros afterwards.
    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()>;
    /// Makes `offset..offset+length` read as zeros without writing them and
    /// without giving its blocks back: the filesystem marks them unwritten
    /// (`FALLOC_FL_ZERO_RANGE`), and a later write lands in blocks the disk
    /// has had written, which on a thin-provisioned disk is faster than in
    /// new ones (BENCHMARKS.md). `Unsupported` where the filesystem cannot.
    fn zero_range(&self, offset: u64, length: u64) -> io::Result<()>;
    /// An offset at or after `offset` before which every byte from `offset`
    /// reads as zeros (the next data, past a hole: `SEEK_DATA`), or `None`
    /// if every byte from `offset` to the end does. Where holes cannot be
    /// told, `offset` itself (if inside the file).
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        Ok((offset < self.size_bytes()?).then_some(offset))
    }
    /// The start of the first hole at or after `offset` (`SEEK_HOLE`): the
    /// file's end where there is none, or where holes cannot be told.
    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        Ok(self.size_bytes()?.max(offset))
    }
    /// Starts writing `offset..offset+length` to the device without waiting
    /// for it. A hint: where it cannot be given, nothing happens.
    fn start_writeback(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
    /// Waits until the writeback already started in `offset..offset+length`
    /// is on the device; the pages stay in the page cache. An error the
    /// device met writing it is reported here — and would not be reported
    /// again by a later `sync_data`, so the caller must fail: the error is
    /// [`sync_failed`]'s.
    fn wait_writeback(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
    /// Waits until `offset..offset+length` is on the device, then lets the
    /// page cache drop it (for data written once and not read back soon).
    /// Errors as [`File::wait_writeback`].
    fn finish_writeback(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Bytes a [`WriteBehind`] lets wait in the page cache for the device.
pub const WRITE_BEHIND_BYTES: u64 = 16 << 20;

/// Writes behind a sequential-ish copy into `file`, as `nbdcopy` does:
/// each range's writeback starts as soon as it is written, and once more
/// than [`WRITE_BEHIND_BYTES`] are in flight the oldest is waited for and
/// dropped from the page cache. The device then writes while the copy
/// reads, the final sync has little left, the kernel never throttles a
/// burst of dirty pages, and the copy reuses a few page-cache pages instead
/// of touching fresh memory for every byte (which, on a VM, can cost a
/// host page fault a page). One per writing thread; it borrows the file
/// (`&dyn File`) or shares it (`Arc<dyn File>`).
pub struct WriteBehind<F> {
    file: F,
    in_flight: std::collections::VecDeque<(u64, u64)>,
    bytes: u64,
}

impl<F: std::ops::Deref<Target: File>> WriteBehind<F> {
    pub fn new(file: F) -> WriteBehind<F> {
        WriteBehind { file, in_flight: std::collections::VecDeque::new(), bytes: 0 }
    }

    /// The file written.
    pub fn file(&self) -> &F::Target {
        &self.file
    }

    /// `offset..offset+length` was just written.
    pub fn written(&mut self, offset: u64, length: u64) -> io::Result<()> {
        self.file.start_writeback(offset, length)?;
        self.in_flight.push_back((offset, length));
        self.bytes += length;
        while self.bytes > WRITE_BEHIND_BYTES {
            let (offset, length) = self.in_flight.pop_front().expect("bytes in flight are queued");
            self.bytes -= length;
            self.file.finish_writeback(offset, length)?;
        }
        Ok(())
    }
}

pub trait Storage: Send + Sync {
    fn create_dir_all(&self, dir: &str) -> io::Result<()>;
    fn open_file(&self, path: &str, mode: OpenMode) -> io::Result<Arc<dyn File>>;
    fn remove_file(&self, path: &str) -> io::Result<()>;
    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, dir: &str) -> io::Result<()>;
    /// Atomically replaces `to` with `from` (both in the same directory).
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Gives the file `from` a second name, `to` (which must not exist),
    /// durable once `to`'s directory is synced. Fails with
    /// `ErrorKind::CrossesDevices` where the two are on different
    /// filesystems.
    fn hard_link(&self, from: &str, to: &str) -> io::Result<()>;
    /// How many names the file `path` has.
    fn link_count(&self, path: &str) -> io::Result<u64>;
    /// Names (not paths) of the entries directly inside `dir`, sorted.
    fn list_dir(&self, dir: &str) -> io::Result<Vec<String>>;
    fn exists(&self, path: &str) -> io::Result<bool>;
    /// Makes creations, renames and removals of entries in `dir` durable.
    fn sync_dir(&self, dir: &str) -> io::Result<()>;
    /// The size of the filesystem holding the storage, and what is free on it.
    fn space(&self) -> io::Result<Space>;
    /// Opens the existing file `path` for reads and writes that bypass the
    /// page cache (`O_DIRECT`): every read's and write's offset, length and
    /// buffer address must be multiples of [`DIRECT_ALIGN`] (see
    /// [`aligned_slice`]). A write is on the device when it returns, but
    /// durable only after `sync_data`; other handles of the file read what
    /// it wrote. Fails with `ErrorKind::Unsupported` where the filesystem
    /// refuses direct I/O.
    fn open_direct(&self, path: &str) -> io::Result<Arc<dyn File>>;
    /// A new, empty file with no name, in `dir`: scratch space for work
    /// too large for memory (sorting). It is gone when its last handle is,
    /// and after a crash; it is never synced.
    fn create_scratch(&self, dir: &str) -> io::Result<Arc<dyn File>>;
}

/// The alignment of direct I/O ([`Storage::open_direct`]): 4 KiB suits
/// devices with 512-byte and with 4 KiB logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

/// `len` bytes of `buffer` that start at an address aligned for direct I/O,
/// growing the vector to make room (the bytes are whatever was there).
pub fn aligned_slice(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len + DIRECT_ALIGN {
        buffer.resize(len + DIRECT_ALIGN, 0);
    }
    let start = buffer.as_ptr().align_offset(DIRECT_ALIGN);
    assert!(start < DIRECT_ALIGN, "a byte pointer can always be aligned");
    &mut buffer[start..start + len]
}

/// Asks the kernel to back the whole 2 MiB pages of `buffer`'s allocation
/// (its capacity, not only its length) with huge pages, where it lets a
/// process ask (`transparent_hugepage` set to `madvise` or `always`).
/// Advice only: the kernel may decline, and nothing else changes.
///
/// For large buffers that live long and are filled over and over: a huge
/// page is one fault instead of 512 at first fill, one pin instead of 512
/// per direct write, and one TLB entry for a copy into it.
#[allow(clippy::ptr_arg)] // The capacity is the point: a slice has none.
pub fn advise_huge_pages(buffer: &Vec<u8>) {
    const HUGE_PAGE: usize = 2 << 20;
    let start = buffer.as_ptr().align_offset(HUGE_PAGE);
    let len = buffer.capacity().saturating_sub(start) / HUGE_PAGE * HUGE_PAGE;
    if len == 0 {
        return;
    }
    // SAFETY: madvise reads and writes no memory, and the range lies within
    // the vector's allocation. MADV_HUGEPAGE changes no contents.
    let advised = unsafe { libc::madvise(buffer.as_ptr().add(start) as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    // EINVAL: a kernel built without transparent huge pages.
    debug_assert!(advised == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL));
}

/// Whether a direct write of `data` at `offset` is aligned as
/// [`Storage::open_direct`] requires.
pub fn is_direct_aligned(data: &[u8], offset: u64) -> bool {
    let align = DIRECT_ALIGN as u64;
    offset.is_multiple_of(align)
        && (data.len() as u64).is_multiple_of(align)
        && (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
}

/// What a filesystem holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    /// What an unprivileged writer may still use.
    pub free_bytes: u64,
}

/// The error a failed sync returns, whatever the errno it met: data
/// written may not be on the device, and a later sync would not say so
/// again, so the caller must fail (poison) rather than retry. A full disk
/// met at sync time (a thin pool run dry, a filesystem that could not
/// reserve space) is one of these, not the transient full disk a write
/// meets: [`is_transient`] is false for it.
pub fn sync_failed(error: io::Error) -> io::Error {
    io::Error::other(SyncFailed(error))
}

#[derive(Debug)]
struct SyncFailed(io::Error);

impl std::fmt::Display for SyncFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a sync failed ({}): data written may not be on the device", self.0)
    }
}

impl std::error::Error for SyncFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Whether `error` is a condition that passes: a full disk or quota, no
/// file descriptors or memory left, a call to retry, a remote store that
/// does not answer or drops the connection. Such an error fails the request
/// that met it and nothing else; anything else from a write or a sync (EIO,
/// say) means the device may have lost data.
pub fn is_transient(error: &io::Error) -> bool {
    use io::ErrorKind::*;
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    matches!(error.kind(), StorageFull | QuotaExceeded | OutOfMemory | WouldBlock | Interrupted)
        || matches!(error.kind(), TimedOut | ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected)
        || matches!(error.raw_os_error(), Some(EMFILE | ENFILE))
}

/// Replaces the file at `path` with `contents` so that after a crash it holds
/// either the old or the new contents, never a mix: write a temporary file,
/// sync it, rename it over `path`, sync the directory.
pub fn write_file_atomic(storage: &dyn Storage, path: &str, contents: &[u8]) -> io::Result<()> {
    let temporary = format!("{path}.tmp");
    if storage.exists(&temporary)? {
        storage.remove_file(&temporary)?;
    }
    let file = storage.open_file(&temporary, OpenMode::CreateNew)?;
    write_reserved(&*file, contents, 0)?;
    file.sync_data()?;
    drop(file);
    storage.rename(&temporary, path)?;
    storage.sync_dir(parent_dir(path))
}

/// Writes `data` at `offset` after reserving its space (see
/// [`File::allocate`]), so a full disk fails this call and not a later sync.
pub fn write_reserved(file: &dyn File, data: &[u8], offset: u64) -> io::Result<()> {
    if data.is_empty() {
        // fallocate refuses an empty range.
        return Ok(());
    }
    file.allocate(offset, data.len() as u64)?;
    file.write_all_at(data, offset)
}

/// Reads a whole (small) file.
pub fn read_file(storage: &dyn Storage, path: &str) -> io::Result<Vec<u8>> {
    let file = storage.open_file(path, OpenMode::Existing)?;
    let size_bytes = file.size_bytes()?;
    let mut contents = vec![0; usize::try_from(size_bytes).expect("file fits in memory")];
    file.read_exact_at(&mut contents, 0)?;
    Ok(contents)
}

/// Reads a small file that keeps two copies of its contents. When `heal`
/// (`rewind_format::meta::healed`) finds one copy damaged and the other
/// intact, the file is rewritten from the intact one and a warning logged; a
/// rewrite that fails (a full disk, say) is only logged: the intact copy was
/// read, and the next read tries again.
pub fn read_file_healing(
    storage: &dyn Storage,
    path: &str,
    heal: impl Fn(&[u8]) -> Option<(Vec<u8>, String)>,
) -> io::Result<Vec<u8>> {
    let contents = read_file(storage, path)?;
    if let Some((healed, damage)) = heal(&contents) {
        match write_file_atomic(storage, path, &healed) {
            Ok(()) => tracing::warn!(%path, %damage, "repaired a damaged metadata copy"),
            Err(error) => tracing::warn!(%path, %damage, %error, "a metadata copy is damaged; rewriting it failed"),
        }
        return Ok(healed);
    }
    Ok(contents)
}

/// The directory part of a `/`-separated relative path ("" for the root).
pub fn parent_dir(path: &str) -> &str {
    path.rfind('/').map_or("", |slash| &path[..slash])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Kibibytes of huge pages in the mapping that holds `address`, from
    /// /proc/self/smaps.
    fn huge_kib_at(address: usize) -> u64 {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((start, end)) = range.split_once('-') {
                    if let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) {
                        inside = (start..end).contains(&address);
                        continue;
                    }
                }
            }
            if let Some(kib) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                return kib.trim().trim_end_matches(" kB").parse().unwrap();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[test]
    fn advised_buffers_are_backed_by_huge_pages_where_the_kernel_lets_a_process_ask() {
        let setting = fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        println!("transparent_hugepage: {}", setting.trim());
        let mut buffer: Vec<u8> = Vec::with_capacity(16 << 20);
        advise_huge_pages(&buffer);
        buffer.resize(16 << 20, 1);
        let huge_page_inside = buffer.as_ptr().align_offset(2 << 20) + (1 << 20);
        let huge_kib = huge_kib_at(buffer.as_ptr() as usize + huge_page_inside);
        if setting.contains("[never]") {
            assert_eq!(huge_kib, 0, "huge pages though the kernel's setting is never");
        } else {
            assert!(huge_kib >= 2048, "no huge page behind an advised buffer ({setting})");
        }
        assert!(buffer.iter().all(|&byte| byte == 1), "advice changes no contents");
    }

    /// The contract both implementations must keep.
    fn exercise(storage: &dyn Storage) {
        storage.create_dir_all("a/b").unwrap();
        let file = storage.open_file("a/b/f", OpenMode::CreateNew).unwrap();
        assert!(storage.open_file("a/b/f", OpenMode::CreateNew).is_err());
        assert!(storage.open_file("a/b/missing", OpenMode::Existing).is_err());
        file.write_all_at(b"hello", 10).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 15);
        let mut buf = [1u8; 15];
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..10], &[0; 10]);
        assert_eq!(&buf[10..], b"hello");
        let mut past = [0u8; 4];
        let error = file.read_exact_at(&mut past, 13).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        file.allocate(0, 8192).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 15, "allocating keeps the size");
        assert!(storage.space().unwrap().free_bytes > 0);
        file.set_len(8192).unwrap();
        file.write_all_at(&[7; 8192], 0).unwrap();
        file.punch_hole(4096, 4096).unwrap();
        let mut page = [9u8; 4096];
        file.read_exact_at(&mut page, 4096).unwrap();
        assert_eq!(page, [0; 4096]);
        file.read_exact_at(&mut page, 0).unwrap();
        assert_eq!(page, [7; 4096]);
        // Zeroing a range keeps the size and the bytes around it (ext4 and
        // the simulator both can; the test directory is on one of those).
        file.zero_range(1024, 2048).unwrap();
        assert_eq!(file.size_bytes().unwrap(), 8192, "zeroing keeps the size");
        file.read_exact_at(&mut page, 0).unwrap();
        assert_eq!((page[1023], page[1024], page[3071], page[3072]), (7, 0, 0, 7));
        assert!(page[1024..3072].iter().all(|&byte| byte == 0));
        // Writing behind keeps at most the window in flight, and what was
        // written reads back (the page cache may drop it, never lose it).
        let mut behind = WriteBehind::new(&*file);
        for piece in 0..12u8 {
            file.write_all_at(&vec![piece; 4 << 20], u64::from(piece) << 22).unwrap();
            behind.written(u64::from(piece) << 22, 4 << 20).unwrap();
            assert!(behind.bytes <= WRITE_BEHIND_BYTES && behind.in_flight.len() as u64 <= WRITE_BEHIND_BYTES >> 22);
        }
        let mut piece = vec![0u8; 4 << 20];
        for index in 0..12u8 {
            file.read_exact_at(&mut piece, u64::from(index) << 22).unwrap();
            assert!(piece.iter().all(|&byte| byte == index), "piece {index} reads back");
        }
        file.sync_data().unwrap();
        // Direct writes, aligned, are read back through the other handle.
        let direct = storage.open_direct("a/b/f").unwrap();
        let mut buffer = Vec::new();
        let aligned = aligned_slice(&mut buffer, 8192);
        aligned.fill(5);
        direct.write_all_at(aligned, 4096).unwrap();
        direct.sync_data().unwrap();
        file.read_exact_at(&mut page, 8192).unwrap();
        assert_eq!(page, [5; 4096]);
        // The direct handle reads whole sectors, from an aligned buffer only.
        let mut back = Vec::new();
        let sectors = aligned_slice(&mut back, 8192);
        direct.read_exact_at(sectors, 4096).unwrap();
        assert!(sectors.iter().all(|&byte| byte == 5));
        let misaligned = direct.read_exact_at(&mut sectors[1..4097], 4096).unwrap_err();
        assert_eq!(misaligned.kind(), std::io::ErrorKind::InvalidInput);
        assert!(!is_direct_aligned(&aligned[..100], 4096) && !is_direct_aligned(&aligned[1..4097], 4096));
        assert!(!is_direct_aligned(&aligned[..4096], 100) && is_direct_aligned(&aligned[..4096], 8192));
        write_file_atomic(storage, "a/b/g", b"one").unwrap();
        write_file_atomic(storage, "a/b/g", b"two").unwrap();
        assert_eq!(read_file(storage, "a/b/g").unwrap(), b"two");
        assert_eq!(storage.list_dir("a/b").unwrap(), vec!["f".to_string(), "g".to_string()]);
        storage.remove_file("a/b/f").unwrap();
        assert!(!storage.exists("a/b/f").unwrap());
        storage.remove_dir_all("a").unwrap();
        assert!(!storage.exists("a/b/g").unwrap());
    }

    #[test]
    fn os_storage_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        exercise(&OsStorage::new(dir.path()).unwrap());
    }

    #[test]
    fn sim_storage_keeps_the_contract() {
        exercise(&SimStorage::new(SimConfig::default(), 1));
    }
}
