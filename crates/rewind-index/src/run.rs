//! Immutable sorted runs: reading one key through the fence and the page
//! cache, streaming all of one for a merge, and writing a new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rewind_format::index::{
    decode_fence, encode_fence, encode_page, key_of, Key, Page, RunHeader, ENTRIES_PER_PAGE, PAGE_BYTES,
};
use rewind_format::meta::RunInfo;
use rewind_io::{File, OpenMode, Storage};
use rewind_types::{Timestamp, Version};

use crate::cache::{PageBytes, PageCache};
use crate::IndexError;

/// Process-unique run identities, so runs of different volumes can share one
/// page cache.
static RUN_UID_NEXT: AtomicU64 = AtomicU64::new(1);

pub struct Run {
    uid: u64,
    info: RunInfo,
    path: String,
    file: Arc<dyn File>,
    header: RunHeader,
    /// First key of every data page.
    fence: Vec<Key>,
    cache: Arc<PageCache>,
}

impl Run {
    pub fn open(storage: &dyn Storage, path: &str, info: RunInfo, cache: Arc<PageCache>) -> Result<Run, IndexError> {
        let file = storage.open_file(path, OpenMode::Existing).map_err(IndexError::io(path))?;
        let mut header_page = vec![0u8; PAGE_BYTES];
        file.read_exact_at(&mut header_page, 0).map_err(IndexError::io(path))?;
        let header = RunHeader::decode(&header_page).map_err(IndexError::corrupt(path))?;
        if header.entry_count != info.entry_count
            || header.timestamp_min != info.timestamp_min
            || header.timestamp_max != info.timestamp_max
        {
            return Err(IndexError::Corrupt {
                path: path.to_owned(),
                reason: format!("run header {header:?} disagrees with the manifest's {info:?}"),
            });
        }
        // The header is checksummed, not trusted: the fence it places must
        // lie within the file before it is read into memory (a header
        // claiming 2^60 entries made this allocate first; found by the
        // `index_run` fuzz target).
        let size_bytes = file.size_bytes().map_err(IndexError::io(path))?;
        let fence_end = header.fence_offset().checked_add(header.fence_bytes());
        if fence_end.is_none_or(|end| end > size_bytes) {
            return Err(IndexError::Corrupt {
                path: path.to_owned(),
                reason: format!(
                    "a run of {size_bytes} bytes cannot hold the {} pages its header counts",
                    header.data_page_count
                ),
            });
        }
        let mut fence_bytes = vec![0u8; header.fence_bytes() as usize];
        file.read_exact_at(&mut fence_bytes, header.fence_offset()).map_err(IndexError::io(path))?;
        let fence = decode_fence(&fence_bytes, &header).map_err(IndexError::corrupt(path))?;
        Ok(Run {
            uid: RUN_UID_NEXT.fetch_add(1, Ordering::Relaxed),
            info,
            path: path.to_owned(),
            file,
            header,
            fence,
            cache,
        })
    }

    pub fn info(&self) -> RunInfo {
        self.info
    }

    /// The run's file, whole: readable while this run is held, even once a
    /// merge has replaced it and removed its file.
    pub fn read_bytes(&self) -> Result<Vec<u8>, IndexError> {
        let size_bytes = self.file.size_bytes().map_err(IndexError::io(&self.path))?;
        let mut bytes = vec![0; usize::try_from(size_bytes).expect("a run fits in memory")];
        self.file.read_exact_at(&mut bytes, 0).map_err(IndexError::io(&self.path))?;
        Ok(bytes)
    }

    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// Bytes of memory this run pins (its fence).
    pub fn memory_bytes(&self) -> usize {
        self.fence.capacity() * std::mem::size_of::<Key>()
    }

    fn page(&self, number: u64) -> Result<PageBytes, IndexError> {
        self.cache.get((self.uid, number), || {
            // Read where the cache keeps it: a `Vec` turned into an `Arc`
            // afterwards is copied (half of a page load's time in a view
            // read's profile). An iterator of known length is collected in
            // place.
            let mut bytes: PageBytes = std::iter::repeat_n(0u8, PAGE_BYTES).collect();
            let buffer = Arc::get_mut(&mut bytes).expect("a page just made has no other holder");
            self.file.read_exact_at(buffer, (1 + number) * PAGE_BYTES as u64).map_err(IndexError::io(&self.path))?;
            let page = Page::verify(&bytes, number).map_err(IndexError::corrupt(&self.path))?;
            // Lookups find a page by its fence key and rely on the page
            // starting there; a page and fence that disagree (each with a
            // good checksum) once tripped the assertion in `find_le_many`
            // (found by the `index_run` fuzz target).
            let fence_key = self.fence[number as usize];
            if page.key(0) != fence_key {
                return Err(IndexError::Corrupt {
                    path: self.path.clone(),
                    reason: format!("page {number} starts at {:?}, the fence says {fence_key:?}", page.key(0)),
                });
            }
            Ok(bytes)
        })
    }

    /// For each `blocks[i]` whose `found[i]` is still `None`, the newest
    /// version of it at or before `at` in this run. Where `blocks` ascend
    /// (a read's do), neighbours usually share a page: it is looked up once,
    /// not per block, and searched on from where the block before was found.
    pub fn find_le_many(&self, blocks: &[u64], at: Timestamp, found: &mut [Option<Version>]) -> Result<(), IndexError> {
        /// The page in hand, and the last key looked up in it with how many
        /// of its entries are `<=` that key.
        struct InHand {
            number: usize,
            bytes: PageBytes,
            last: Option<(Key, usize)>,
        }
        let mut current: Option<InHand> = None;
        for (&block, slot) in blocks.iter().zip(found.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            let key = (block, at.unix_nanos());
            let in_current = current.as_ref().is_some_and(|InHand { number, .. }| {
                self.fence[*number] <= key && self.fence.get(number + 1).is_none_or(|&next| key < next)
            });
            if !in_current {
                let pages_le = self.fence.partition_point(|&first| first <= key);
                let Some(number) = pages_le.checked_sub(1) else { continue };
                current = Some(InHand { number, bytes: self.page(number as u64)?, last: None });
            }
            let in_hand = current.as_mut().expect("set above");
            let page = Page::assume_verified(&in_hand.bytes);
            let count = match in_hand.last {
                Some((last, count)) if last <= key => page.count_le_from(key, count),
                _ => page.count_le(key),
            };
            in_hand.last = Some((key, count));
            assert!(count > 0, "the fence key of this page is <= key");
            if page.key(count - 1).0 == block {
                *slot = Some(page.entry(count - 1).map_err(IndexError::corrupt(&self.path))?);
            }
        }
        Ok(())
    }

    /// The lowest block at or after `block` with a version in this run, of
    /// any time: one page looked at (the one whose fence key is at or
    /// before the block's first), and the next page's fence key.
    pub fn first_block_from(&self, block: u64) -> Result<Option<u64>, IndexError> {
        let key = (block, 0);
        let pages_le = self.fence.partition_point(|&first| first <= key);
        let Some(number) = pages_le.checked_sub(1) else {
            return Ok(self.fence.first().map(|&(first, _)| first));
        };
        let bytes = self.page(number as u64)?;
        let page = Page::assume_verified(&bytes);
        // Entries `<= (block, 0)` are below the block but for one stamped
        // at time 0 exactly.
        let count = page.count_le(key);
        if count > 0 && page.key(count - 1).0 == block {
            return Ok(Some(block));
        }
        if count < page.len() {
            return Ok(Some(page.key(count).0));
        }
        Ok(self.fence.get(number + 1).map(|&(first, _)| first))
    }

    /// Streams every version in key order, reading ahead in large chunks and
    /// bypassing the page cache (a merge reads each page once).
    pub fn scan(&self) -> RunScan<'_> {
        RunScan { run: self, next_page: 0, chunk: Vec::new(), chunk_first_page: 0, pending: Vec::new() }
    }
}

pub struct RunScan<'a> {
    run: &'a Run,
    next_page: u64,
    chunk: Vec<u8>,
    chunk_first_page: u64,
    /// Versions of the current page not yet handed out, in reverse order.
    pending: Vec<Version>,
}

const SCAN_CHUNK_PAGES: u64 = 256;

impl RunScan<'_> {
    pub fn next_version(&mut self) -> Result<Option<Version>, IndexError> {
        if let Some(version) = self.pending.pop() {
            return Ok(Some(version));
        }
        let run = self.run;
        if self.next_page == run.header.data_page_count {
            return Ok(None);
        }
        let chunk_pages = (self.chunk.len() / PAGE_BYTES) as u64;
        if self.next_page >= self.chunk_first_page + chunk_pages {
            let pages = SCAN_CHUNK_PAGES.min(run.header.data_page_count - self.next_page);
            self.chunk.resize(pages as usize * PAGE_BYTES, 0);
            let offset = (1 + self.next_page) * PAGE_BYTES as u64;
            run.file.read_exact_at(&mut self.chunk, offset).map_err(IndexError::io(&run.path))?;
            self.chunk_first_page = self.next_page;
        }
        let at = (self.next_page - self.chunk_first_page) as usize * PAGE_BYTES;
        let page =
            Page::verify(&self.chunk[at..at + PAGE_BYTES], self.next_page).map_err(IndexError::corrupt(&run.path))?;
        for index in (0..page.len()).rev() {
            self.pending.push(page.entry(index).map_err(IndexError::corrupt(&run.path))?);
        }
        self.next_page += 1;
        Ok(self.pending.pop())
    }
}

/// Writes a new run from versions pushed in key order.
pub struct RunWriter {
    path: String,
    file: Arc<dyn File>,
    page: Vec<Version>,
    page_count: u64,
    fence: Vec<Key>,
    /// Encoded pages not yet written, flushed in large writes.
    out: Vec<u8>,
    out_offset: u64,
    entry_count: u64,
    timestamp_min: Timestamp,
    timestamp_max: Timestamp,
    key_last: Option<Key>,
}

const WRITE_CHUNK_BYTES: usize = 1 << 20;

impl RunWriter {
    pub fn create(storage: &dyn Storage, path: &str) -> Result<RunWriter, IndexError> {
        if storage.exists(path).map_err(IndexError::io(path))? {
            // Left behind by a crash before the manifest listed it.
            storage.remove_file(path).map_err(IndexError::io(path))?;
        }
        let file = storage.open_file(path, OpenMode::CreateNew).map_err(IndexError::io(path))?;
        Ok(RunWriter {
            path: path.to_owned(),
            file,
            page: Vec::with_capacity(ENTRIES_PER_PAGE),
            page_count: 0,
            fence: Vec::new(),
            out: Vec::with_capacity(WRITE_CHUNK_BYTES),
            out_offset: PAGE_BYTES as u64,
            entry_count: 0,
            timestamp_min: Timestamp::MAX,
            timestamp_max: Timestamp::MIN,
            key_last: None,
        })
    }

    pub fn push(&mut self, version: Version) -> Result<(), IndexError> {
        let key = key_of(&version);
        assert!(self.key_last.is_none_or(|last| last < key), "versions arrive in key order");
        self.key_last = Some(key);
        self.entry_count += 1;
        self.timestamp_min = self.timestamp_min.min(version.timestamp);
        self.timestamp_max = self.timestamp_max.max(version.timestamp);
        self.page.push(version);
        if self.page.len() == ENTRIES_PER_PAGE {
            self.finish_page()?;
        }
        Ok(())
    }

    fn finish_page(&mut self) -> Result<(), IndexError> {
        let mut bytes = [0u8; PAGE_BYTES];
        encode_page(self.page_count, &self.page, &mut bytes);
        self.fence.push(key_of(&self.page[0]));
        self.page.clear();
        self.page_count += 1;
        self.out.extend_from_slice(&bytes);
        if self.out.len() >= WRITE_CHUNK_BYTES {
            self.flush_out()?;
        }
        Ok(())
    }

    fn flush_out(&mut self) -> Result<(), IndexError> {
        rewind_io::write_reserved(&*self.file, &self.out, self.out_offset).map_err(IndexError::io(&self.path))?;
        self.out_offset += self.out.len() as u64;
        self.out.clear();
        Ok(())
    }

    /// Completes the run and makes its bytes durable (the caller syncs the
    /// directory and lists the run in the manifest).
    pub fn finish(mut self, id: u64) -> Result<RunInfo, IndexError> {
        assert!(self.entry_count > 0, "runs are never empty");
        if !self.page.is_empty() {
            self.finish_page()?;
        }
        let fence = encode_fence(&self.fence);
        self.out.extend_from_slice(&fence);
        self.flush_out()?;
        let header = RunHeader {
            entry_count: self.entry_count,
            data_page_count: self.page_count,
            timestamp_min: self.timestamp_min,
            timestamp_max: self.timestamp_max,
            fence_crc32c: rewind_format::crc32c(&fence),
        };
        rewind_io::write_reserved(&*self.file, &header.encode(), 0).map_err(IndexError::io(&self.path))?;
        self.file.sync_data().map_err(IndexError::io(&self.path))?;
        Ok(RunInfo {
            id,
            entry_count: self.entry_count,
            timestamp_min: self.timestamp_min,
            timestamp_max: self.timestamp_max,
        })
    }
}
