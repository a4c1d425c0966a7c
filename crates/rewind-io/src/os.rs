//! [`Storage`] on the real filesystem.

use std::fs;
use std::io;
use std::num::NonZeroU64;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{fadvise, fallocate, flock, statvfs, Advice, FallocateFlags, FlockOperation};

use crate::{sync_failed, File, OpenMode, Space, Storage};

/// Volumes are private: only the user Rewind runs as may enter the data
/// directory or read what is in it.
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

pub struct OsStorage {
    root: PathBuf,
}

impl OsStorage {
    /// Uses `root` (created if missing) as the storage root, and makes it
    /// private (mode 0700) if it was not.
    pub fn new(root: &Path) -> io::Result<Self> {
        fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(root)?;
        let mode = fs::metadata(root)?.permissions().mode() & 0o777;
        if mode != DIR_MODE {
            fs::set_permissions(root, fs::Permissions::from_mode(DIR_MODE))?;
            tracing::warn!(root = %root.display(), "the data directory was mode {mode:o}; it is 700 now");
        }
        Ok(OsStorage { root: root.to_path_buf() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, relative: &str) -> PathBuf {
        debug_assert!(!relative.starts_with('/') && !relative.contains(".."), "{relative}");
        self.root.join(relative)
    }

    /// Takes an exclusive advisory lock on `relative`, so that two processes
    /// never open the same data directory. Held until the guard is dropped.
    pub fn lock_exclusive(&self, relative: &str) -> io::Result<DirLock> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(FILE_MODE)
            .open(self.path(relative))?;
        flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(io::Error::from)?;
        Ok(DirLock { _file: file })
    }
}

/// Guard of [`OsStorage::lock_exclusive`].
pub struct DirLock {
    _file: fs::File,
}

struct OsFile {
    file: fs::File,
}

impl File for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn read_exact_vectored_at(&self, mut bufs: &mut [io::IoSliceMut<'_>], mut offset: u64) -> io::Result<()> {
        /// The most slices one `preadv` takes (Linux's `IOV_MAX`).
        const SLICES_MAX: usize = 1024;
        io::IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let batch = bufs.len().min(SLICES_MAX);
            match rustix::io::preadv(&self.file, &mut bufs[..batch], offset) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffers")),
                Ok(read) => {
                    offset += read as u64;
                    io::IoSliceMut::advance_slices(&mut bufs, read);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn allocate(&self, offset: u64, length: u64) -> io::Result<()> {
        match fallocate(&self.file, FallocateFlags::KEEP_SIZE, offset, length) {
            Ok(()) => Ok(()),
            // Filesystems that cannot reserve space: writes may then meet a
            // full disk at sync time, which poisons (as it must).
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            Err(errno) => Err(errno.into()),
        }
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        // Filesystems that do not track holes report every byte as data.
        match rustix::fs::seek(&self.file, rustix::fs::SeekFrom::Data(offset)) {
            Ok(data) => Ok(Some(data)),
            // No data at or after `offset`.
            Err(rustix::io::Errno::NXIO) => Ok(None),
            Err(errno) => Err(errno.into()),
        }
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        match rustix::fs::seek(&self.file, rustix::fs::SeekFrom::Hole(offset)) {
            Ok(hole) => Ok(hole),
            // `offset` is at or past the end.
            Err(rustix::io::Errno::NXIO) => Ok(offset),
            Err(errno) => Err(errno.into()),
        }
    }

    fn set_len(&self, size_bytes: u64) -> io::Result<()> {
        self.file.set_len(size_bytes)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data().map_err(sync_failed)
    }

    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()> {
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match fallocate(&self.file, flags, offset, length) {
            Ok(()) => Ok(()),
            // Filesystems without hole punching: write the zeros instead.
            Err(rustix::io::Errno::OPNOTSUPP) => {
                let zeros = vec![0u8; 64 * 1024];
                let mut done = 0;
                while done < length {
                    let step = (length - done).min(zeros.len() as u64);
                    self.file.write_all_at(&zeros[..step as usize], offset + done)?;
                    done += step;
                }
                Ok(())
            }
            Err(errno) => Err(errno.into()),
        }
    }

    fn zero_range(&self, offset: u64, length: u64) -> io::Result<()> {
        let flags = FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE;
        match fallocate(&self.file, flags, offset, length) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => Err(io::ErrorKind::Unsupported.into()),
            Err(errno) => Err(errno.into()),
        }
    }

    fn start_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        self.sync_range(offset, length, libc::SYNC_FILE_RANGE_WRITE)
    }

    fn wait_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        self.sync_range(offset, length, libc::SYNC_FILE_RANGE_WAIT_BEFORE).map_err(sync_failed)
    }

    fn finish_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        self.sync_range(offset, length, flags).map_err(sync_failed)?;
        // Only advice: the pages may stay, which costs memory, not data.
        let _ = fadvise(&self.file, offset, NonZeroU64::new(length), Advice::DontNeed);
        Ok(())
    }
}

impl OsFile {
    /// `sync_file_range` over the range; a file (or filesystem) that does
    /// not take it is left to the next sync.
    fn sync_range(&self, offset: u64, length: u64, flags: libc::c_uint) -> io::Result<()> {
        let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else { return Ok(()) };
        // SAFETY: a system call on a descriptor `self.file` owns and keeps
        // open for the call; it reads and writes no memory of ours.
        if unsafe { libc::sync_file_range(self.file.as_raw_fd(), offset, length, flags) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINVAL | libc::ESPIPE | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(()),
            _ => Err(error),
        }
    }
}

/// An open file of the operating system as a [`File`] (a restore's target,
/// which may be a block device).
pub fn os_file(file: fs::File) -> Arc<dyn File> {
    Arc::new(OsFile { file })
}

impl Storage for OsStorage {
    fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(self.path(dir))
    }

    fn open_file(&self, path: &str, mode: OpenMode) -> io::Result<Arc<dyn File>> {
        let mut options = fs::OpenOptions::new();
        options.read(true).write(true).mode(FILE_MODE);
        match mode {
            OpenMode::Existing => {}
            OpenMode::CreateNew => {
                options.create_new(true);
            }
            OpenMode::OpenOrCreate => {
                options.create(true);
            }
        }
        let file = options.open(self.path(path))?;
        Ok(Arc::new(OsFile { file }))
    }

    fn remove_file(&self, path: &str) -> io::Result<()> {
        fs::remove_file(self.path(path))
    }

    fn remove_dir_all(&self, dir: &str) -> io::Result<()> {
        fs::remove_dir_all(self.path(dir))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.path(from), self.path(to))
    }

    fn hard_link(&self, from: &str, to: &str) -> io::Result<()> {
        fs::hard_link(self.path(from), self.path(to))
    }

    fn link_count(&self, path: &str) -> io::Result<u64> {
        Ok(std::os::unix::fs::MetadataExt::nlink(&fs::metadata(self.path(path))?))
    }

    fn list_dir(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(self.path(dir))? {
            let name = entry?.file_name();
            names.push(
                name.into_string().map_err(|name| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("non-UTF-8 file name {name:?}"))
                })?,
            );
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        self.path(path).try_exists()
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        fs::File::open(self.path(dir))?.sync_all().map_err(sync_failed)
    }

    fn create_scratch(&self, dir: &str) -> io::Result<Arc<dyn File>> {
        // O_TMPFILE where the filesystem has it: never linked, so nothing
        // is left behind by a crash.
        let file = tempfile::tempfile_in(self.path(dir))?;
        Ok(Arc::new(OsFile { file }))
    }

    fn open_direct(&self, path: &str) -> io::Result<Arc<dyn File>> {
        let opened = fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(self.path(path));
        match opened {
            Ok(file) => Ok(Arc::new(OsFile { file })),
            // What open(2) says when the filesystem does not do O_DIRECT.
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the filesystem refuses direct I/O (O_DIRECT): {error}"),
            )),
            Err(error) => Err(error),
        }
    }

    fn space(&self) -> io::Result<Space> {
        let stats = statvfs(&self.root)?;
        Ok(Space {
            total_bytes: stats.f_blocks.saturating_mul(stats.f_frsize),
            free_bytes: stats.f_bavail.saturating_mul(stats.f_frsize),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, Arc<dyn File>) {
        let dir = tempfile::tempdir().unwrap();
        let storage = OsStorage::new(dir.path()).unwrap();
        let file = storage.open_file("f", OpenMode::CreateNew).unwrap();
        file.write_all_at(bytes, 0).unwrap();
        (dir, file)
    }

    /// Reads `lengths` slices at `offset` with one scatter read and returns
    /// them joined.
    fn scattered(file: &dyn File, lengths: &[usize], offset: u64) -> io::Result<Vec<u8>> {
        let mut buffers: Vec<Vec<u8>> = lengths.iter().map(|&length| vec![0xee; length]).collect();
        let mut slices: Vec<io::IoSliceMut<'_>> = buffers.iter_mut().map(|buf| io::IoSliceMut::new(buf)).collect();
        file.read_exact_vectored_at(&mut slices, offset)?;
        Ok(buffers.concat())
    }

    /// `next_data` never passes over data, in a sparse file and in the
    /// simulator alike: every byte it skips reads as zeros.
    #[test]
    fn next_data_passes_over_holes_never_data() {
        const SIZE: u64 = 64 << 20;
        let dir = tempfile::tempdir().unwrap();
        let os = OsStorage::new(dir.path()).unwrap();
        let sim = crate::SimStorage::new(crate::SimConfig::default(), 7);
        for (name, storage) in [("os", &os as &dyn Storage), ("sim", &sim)] {
            let file = storage.open_file("sparse", OpenMode::CreateNew).unwrap();
            file.set_len(SIZE).unwrap();
            let data = [(16 << 20) + 100, 40 << 20];
            for at in data {
                file.write_all_at(&[7; 10], at).unwrap();
            }
            let mut bytes = vec![0; SIZE as usize];
            file.read_exact_at(&mut bytes, 0).unwrap();
            let offsets = [0, 1 << 20, (16 << 20) + 50, (16 << 20) + 105, (16 << 20) + 110, 30 << 20, SIZE - 1];
            for offset in offsets {
                let next = file.next_data(offset).unwrap();
                let skipped_to = next.unwrap_or(SIZE);
                println!("{name}: next data from {offset}: {next:?}");
                assert!(skipped_to >= offset, "{name}: {next:?} before {offset}");
                let skipped = &bytes[offset as usize..skipped_to as usize];
                assert!(
                    skipped.iter().all(|&byte| byte == 0),
                    "{name}: data passed over from {offset} to {skipped_to}"
                );
            }
            // And every hole it finds is zeros, from where it starts to the
            // next data.
            for offset in offsets {
                let hole = file.next_hole(offset).unwrap();
                println!("{name}: next hole from {offset}: {hole}");
                assert!(hole >= offset && hole <= SIZE, "{name}: hole at {hole} from {offset}");
                let hole_end = file.next_data(hole).unwrap().unwrap_or(SIZE);
                let zeros = &bytes[hole.min(SIZE) as usize..hole_end as usize];
                assert!(zeros.iter().all(|&byte| byte == 0), "{name}: a hole at {hole} holds data");
            }
            if name == "sim" {
                // The simulator keeps holes of whole 512-byte sectors.
                assert_eq!(file.next_data(0).unwrap(), Some(16 << 20), "the simulator's holes are its zeros");
                assert_eq!(file.next_hole(16 << 20).unwrap(), (16 << 20) + 512);
                assert_eq!(file.next_data((40 << 20) + 512).unwrap(), None, "nothing after the last write's sector");
            }
        }
    }

    #[test]
    fn a_scatter_read_fills_every_slice_in_turn() {
        let bytes: Vec<u8> = (0..20_000u32).map(|index| (index % 251) as u8).collect();
        let (_dir, file) = file_of(&bytes);
        let lengths = [0, 3, 0, 4096, 1000, 56, 0];
        assert_eq!(scattered(&*file, &lengths, 17).unwrap(), bytes[17..17 + 5155]);
        // More slices than one `preadv` takes.
        let lengths = vec![7; 2500];
        assert_eq!(scattered(&*file, &lengths, 2).unwrap(), bytes[2..2 + 17_500]);
        assert_eq!(scattered(&*file, &[0, 0], 19_999).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn a_scatter_read_past_the_end_is_a_short_read() {
        let (_dir, file) = file_of(&[1; 100]);
        let error = scattered(&*file, &[50, 50, 1], 0).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
        let error = scattered(&*file, &[10], 100).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
    }
}
