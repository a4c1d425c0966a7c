//! Device I/O accounting: a [`Storage`] that counts what goes through it.
//!
//! The lab counts the I/Os each CDP layout would issue to its stores; a
//! volume counts the ones it does issue, per store, the same way: reads and
//! writes, their bytes, syncs, and how many I/Os began where the store's
//! previous one ended (sequential; the rest are random).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{File, OpenMode, Space, Storage};

/// What one store's I/O has been since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Reads and writes that began where the previous one (to any file of
    /// the store) ended.
    pub sequential: u64,
    pub syncs: u64,
}

impl IoStats {
    pub fn random(&self) -> u64 {
        self.reads + self.writes - self.sequential
    }
}

impl std::ops::Add for IoStats {
    type Output = IoStats;

    fn add(self, other: IoStats) -> IoStats {
        IoStats {
            reads: self.reads + other.reads,
            read_bytes: self.read_bytes + other.read_bytes,
            writes: self.writes + other.writes,
            write_bytes: self.write_bytes + other.write_bytes,
            sequential: self.sequential + other.sequential,
            syncs: self.syncs + other.syncs,
        }
    }
}

/// The counters of one store, shared by its files.
#[derive(Default)]
pub struct IoCounters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    sequential: AtomicU64,
    syncs: AtomicU64,
    /// Which file (by the number it was opened as) and where the last I/O ended.
    head: Mutex<(u64, u64)>,
    files_opened: AtomicU64,
}

impl IoCounters {
    pub fn stats(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            sequential: self.sequential.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }

    fn count(&self, file: u64, offset: u64, bytes: usize) {
        let mut head = self.head.lock();
        if *head == (file, offset) {
            self.sequential.fetch_add(1, Ordering::Relaxed);
        }
        *head = (file, offset + bytes as u64);
    }
}

/// A [`Storage`] whose files count their I/O into one [`IoCounters`].
pub struct CountingStorage {
    inner: Arc<dyn Storage>,
    counters: Arc<IoCounters>,
}

impl CountingStorage {
    pub fn new(inner: Arc<dyn Storage>) -> CountingStorage {
        CountingStorage { inner, counters: Arc::new(IoCounters::default()) }
    }

    pub fn counters(&self) -> &Arc<IoCounters> {
        &self.counters
    }

    fn counting(&self, inner: Arc<dyn File>) -> Arc<dyn File> {
        let number = self.counters.files_opened.fetch_add(1, Ordering::Relaxed) + 1;
        Arc::new(CountingFile { inner, counters: Arc::clone(&self.counters), number })
    }
}

struct CountingFile {
    inner: Arc<dyn File>,
    counters: Arc<IoCounters>,
    /// Numbered from 1, so that no file matches the initial head.
    number: u64,
}

impl File for CountingFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.counters.count(self.number, offset, buf.len());
        Ok(())
    }

    fn read_exact_vectored_at(&self, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        self.inner.read_exact_vectored_at(bufs, offset)?;
        let bytes: usize = bufs.iter().map(|buf| buf.len()).sum();
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.counters.count(self.number, offset, bytes);
        Ok(())
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(data, offset)?;
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.counters.count(self.number, offset, data.len());
        Ok(())
    }

    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.inner.next_data(offset)
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        self.inner.next_hole(offset)
    }

    fn allocate(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.allocate(offset, length)
    }

    fn start_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.start_writeback(offset, length)
    }

    fn wait_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.wait_writeback(offset, length)
    }

    fn finish_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.finish_writeback(offset, length)
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.inner.size_bytes()
    }

    fn set_len(&self, size_bytes: u64) -> io::Result<()> {
        self.inner.set_len(size_bytes)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, length)
    }

    fn zero_range(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.zero_range(offset, length)
    }
}

impl Storage for CountingStorage {
    fn create_dir_all(&self, dir: &str) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn open_file(&self, path: &str, mode: OpenMode) -> io::Result<Arc<dyn File>> {
        Ok(self.counting(self.inner.open_file(path, mode)?))
    }

    fn remove_file(&self, path: &str) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn remove_dir_all(&self, dir: &str) -> io::Result<()> {
        self.inner.remove_dir_all(dir)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn hard_link(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.hard_link(from, to)
    }

    fn link_count(&self, path: &str) -> io::Result<u64> {
        self.inner.link_count(path)
    }

    fn list_dir(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        self.inner.exists(path)
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.sync_dir(dir)?;
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn space(&self) -> io::Result<Space> {
        self.inner.space()
    }

    fn open_direct(&self, path: &str) -> io::Result<Arc<dyn File>> {
        Ok(self.counting(self.inner.open_direct(path)?))
    }

    fn create_scratch(&self, dir: &str) -> io::Result<Arc<dyn File>> {
        Ok(self.counting(self.inner.create_scratch(dir)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimStorage;

    #[test]
    fn counts_reads_writes_bytes_syncs_and_sequential_runs() {
        let storage = CountingStorage::new(Arc::new(SimStorage::new(crate::SimConfig::default(), 1)));
        let first = storage.open_file("a", OpenMode::CreateNew).unwrap();
        let second = storage.open_file("b", OpenMode::CreateNew).unwrap();
        first.write_all_at(&[1; 4096], 0).unwrap();
        first.write_all_at(&[2; 4096], 4096).unwrap(); // sequential
        second.write_all_at(&[3; 512], 8192).unwrap(); // another file: random
        first.write_all_at(&[4; 4096], 8192).unwrap(); // where `first` ended, but `second` came between
        let mut buf = [0; 4096];
        first.read_exact_at(&mut buf, 0).unwrap();
        first.read_exact_at(&mut buf, 4096).unwrap(); // sequential
        first.sync_data().unwrap();
        let stats = storage.counters().stats();
        assert_eq!(
            stats,
            IoStats { reads: 2, read_bytes: 8192, writes: 4, write_bytes: 3 * 4096 + 512, sequential: 2, syncs: 1 }
        );
        assert_eq!(stats.random(), 4);
    }
}
