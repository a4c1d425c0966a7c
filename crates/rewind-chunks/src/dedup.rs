//! The dedup index: chunk hash → chunk id (MYCDP's Deduplicator lookup, seed
//! 004 §3.2), built to stay within bounded memory at 10^8 chunks.
//!
//! New entries go into an in-memory table; when it is full it is written as
//! an immutable run sorted by hash, with a fence (the first 8 bytes of each
//! page's first hash) and a Bloom filter of ~10 bits per entry. A lookup of a
//! hash that is not stored — new data, the common case — is answered by the
//! filters without a read; one that is stored costs one page read. Runs of
//! similar size are merged, `fanin` at a time, so there are O(log N) of them.
//!
//! The index is derived data: every entry is also in a pack footer. The
//! manifest records the newest pack whose chunks are all in runs; on open,
//! the chunks of later packs are read back from their footers. An entry may
//! be stale (its id freed by garbage collection, perhaps reused for other
//! bytes): the store checks every hit against the chunk table, and merges
//! drop entries of freed ids.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rewind_format::chunks::{
    bloom_bits, decode_dedup_page, decode_fence, encode_dedup_page, encode_fence, fence_key, DedupEntry, DedupManifest,
    DedupRunHeader, DedupRunInfo, DEDUP_ENTRIES_PER_PAGE, DEDUP_PAGE_BYTES,
};
use rewind_format::meta::healed;
use rewind_format::pack::ChunkHash;
use rewind_io::{read_file_healing, write_file_atomic, File, OpenMode, Storage};
use rewind_types::ChunkId;
use rustc_hash::FxHashMap;

use crate::ChunkError;

#[derive(Clone, Copy, Debug)]
pub struct DedupConfig {
    /// Entries held in memory before they are written as a run.
    pub memtable_entries_max: usize,
    /// How many runs of one size class are merged into one.
    pub merge_fanin: usize,
    pub bloom_bits_per_entry: u64,
    pub bloom_hashes: u32,
}

impl Default for DedupConfig {
    fn default() -> Self {
        // 10 bits and 7 positions per entry: about 1% false positives.
        DedupConfig { memtable_entries_max: 1 << 18, merge_fanin: 4, bloom_bits_per_entry: 10, bloom_hashes: 7 }
    }
}

struct DedupRun {
    info: DedupRunInfo,
    path: String,
    file: Arc<dyn File>,
    header: DedupRunHeader,
    fence: Vec<u64>,
    bloom: Vec<u64>,
}

impl DedupRun {
    fn open(storage: &dyn Storage, path: &str, info: DedupRunInfo) -> Result<DedupRun, ChunkError> {
        let file = storage.open_file(path, OpenMode::Existing).map_err(ChunkError::io(path))?;
        let mut page = vec![0; DEDUP_PAGE_BYTES];
        file.read_exact_at(&mut page, 0).map_err(ChunkError::io(path))?;
        let header = DedupRunHeader::decode(&page).map_err(|error| ChunkError::corrupt(path, 0, error))?;
        if header.entry_count != info.entry_count {
            return Err(ChunkError::corrupt(
                path,
                0,
                format!("holds {} entries, the manifest says {}", header.entry_count, info.entry_count),
            ));
        }
        // The header is checksummed, not trusted: what it places must lie
        // within the file before it is read into memory.
        let size_bytes = file.size_bytes().map_err(ChunkError::io(path))?;
        if header.end_bytes().is_none_or(|end| end > size_bytes) {
            let reason = format!("a run of {size_bytes} bytes cannot hold what its header describes: {header:?}");
            return Err(ChunkError::corrupt(path, 0, reason));
        }
        let mut fence = vec![0; header.fence_bytes() as usize];
        file.read_exact_at(&mut fence, header.fence_offset()).map_err(ChunkError::io(path))?;
        let fence =
            decode_fence(&fence, &header).map_err(|error| ChunkError::corrupt(path, header.fence_offset(), error))?;
        let mut bloom_bytes = vec![0; header.bloom_bytes() as usize];
        file.read_exact_at(&mut bloom_bytes, header.bloom_offset()).map_err(ChunkError::io(path))?;
        rewind_format::verify_crc("dedup run bloom filter", header.bloom_crc32c, rewind_format::crc32c(&bloom_bytes))
            .map_err(|error| ChunkError::corrupt(path, header.bloom_offset(), error))?;
        let bloom = bloom_bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().expect("8"))).collect();
        Ok(DedupRun { info, path: path.to_owned(), file, header, fence, bloom })
    }

    fn may_hold(&self, hash: &ChunkHash) -> bool {
        bloom_bits(hash, self.header.bloom_bits, self.header.bloom_hashes)
            .all(|bit| self.bloom[(bit / 64) as usize] >> (bit % 64) & 1 == 1)
    }

    fn read_page(&self, number: u64, page: &mut Vec<u8>, out: &mut Vec<DedupEntry>) -> Result<(), ChunkError> {
        page.resize(DEDUP_PAGE_BYTES, 0);
        let offset = (1 + number) * DEDUP_PAGE_BYTES as u64;
        self.file.read_exact_at(page, offset).map_err(ChunkError::io(&self.path))?;
        decode_dedup_page(page, number, out).map_err(|error| ChunkError::corrupt(&self.path, offset, error))
    }

    /// Pushes the ids this run holds for `hash`.
    fn find(&self, hash: &ChunkHash, found: &mut Vec<ChunkId>) -> Result<(), ChunkError> {
        if !self.may_hold(hash) {
            return Ok(());
        }
        let key = fence_key(hash);
        // Pages whose first key is below `key` may end with it; equal keys may
        // continue over several pages.
        let first = self.fence.partition_point(|&fence| fence < key).saturating_sub(1);
        let end = self.fence.partition_point(|&fence| fence <= key);
        let (mut page, mut entries) = (Vec::new(), Vec::new());
        for number in first..end.max(first + 1) {
            self.read_page(number as u64, &mut page, &mut entries)?;
            found.extend(entries.iter().filter(|entry| entry.hash == *hash).map(|entry| entry.id));
        }
        Ok(())
    }

    fn memory_bytes(&self) -> u64 {
        (self.fence.capacity() * 8 + self.bloom.capacity() * 8) as u64
    }
}

/// Streams a run's entries in order.
struct RunScan<'a> {
    run: &'a DedupRun,
    next_page: u64,
    page: Vec<u8>,
    entries: Vec<DedupEntry>,
    position: usize,
    /// The hash of the entry returned last.
    last: Option<ChunkHash>,
}

impl<'a> RunScan<'a> {
    fn new(run: &'a DedupRun) -> RunScan<'a> {
        RunScan { run, next_page: 0, page: Vec::new(), entries: Vec::new(), position: 0, last: None }
    }

    /// The run's next entry in hash order. Each page is checked to be in
    /// order when read; a page that starts before the one before it ended
    /// is corruption too (merged on, it would write a run out of order).
    fn next_entry(&mut self) -> Result<Option<DedupEntry>, ChunkError> {
        while self.position == self.entries.len() {
            if self.next_page == self.run.header.data_page_count {
                return Ok(None);
            }
            self.run.read_page(self.next_page, &mut self.page, &mut self.entries)?;
            self.next_page += 1;
            self.position = 0;
            if let (Some(last), Some(first)) = (self.last, self.entries.first()) {
                if first.hash < last {
                    let offset = self.next_page * DEDUP_PAGE_BYTES as u64;
                    return Err(ChunkError::corrupt(
                        &self.run.path,
                        offset,
                        format!("dedup index page {} starts before the page before it ends", self.next_page - 1),
                    ));
                }
            }
        }
        self.position += 1;
        let entry = self.entries[self.position - 1];
        self.last = Some(entry.hash);
        Ok(Some(entry))
    }
}

pub(crate) struct DedupIndex {
    storage: Arc<dyn Storage>,
    dir: String,
    config: DedupConfig,
    memtable: FxHashMap<ChunkHash, ChunkId>,
    /// Oldest first.
    runs: Vec<DedupRun>,
    manifest: DedupManifest,
}

const MANIFEST: &str = "manifest";

fn run_name(id: u64) -> String {
    format!("{id:010}.run")
}

impl DedupIndex {
    /// Opens (creating if needed) the index in `dir`. The caller then adds the
    /// chunks of the packs after [`DedupIndex::packs_covered`].
    pub fn open(storage: Arc<dyn Storage>, dir: &str, config: DedupConfig) -> Result<DedupIndex, ChunkError> {
        assert!(config.merge_fanin >= 2 && config.memtable_entries_max > 0);
        storage.create_dir_all(dir).map_err(ChunkError::io(dir))?;
        let path = format!("{dir}/{MANIFEST}");
        let manifest = if storage.exists(&path).map_err(ChunkError::io(&path))? {
            let bytes = read_file_healing(&*storage, &path, healed).map_err(ChunkError::io(&path))?;
            DedupManifest::decode(&bytes).map_err(|error| ChunkError::corrupt(&path, 0, error))?
        } else {
            let manifest = DedupManifest { packs_covered: 0, run_id_next: 1, runs: Vec::new() };
            write_file_atomic(&*storage, &path, &manifest.encode()).map_err(ChunkError::io(&path))?;
            manifest
        };
        let mut runs = Vec::with_capacity(manifest.runs.len());
        for info in &manifest.runs {
            runs.push(DedupRun::open(&*storage, &format!("{dir}/{}", run_name(info.id)), *info)?);
        }
        let listed: Vec<String> = manifest.runs.iter().map(|info| run_name(info.id)).collect();
        for name in storage.list_dir(dir).map_err(ChunkError::io(dir))? {
            if name != MANIFEST && !listed.contains(&name) {
                // Written or merged away around a crash.
                let path = format!("{dir}/{name}");
                storage.remove_file(&path).map_err(ChunkError::io(&path))?;
            }
        }
        Ok(DedupIndex { storage, dir: dir.to_owned(), config, memtable: FxHashMap::default(), runs, manifest })
    }

    /// Starts the index afresh, after its manifest or a run was found
    /// damaged: every run is removed and the new, empty manifest covers no
    /// pack, so the caller adds the chunks of every pack again (the index is
    /// derived data: every entry is in a pack's footer and the chunk table).
    pub fn reset(storage: Arc<dyn Storage>, dir: &str, config: DedupConfig) -> Result<DedupIndex, ChunkError> {
        storage.create_dir_all(dir).map_err(ChunkError::io(dir))?;
        for name in storage.list_dir(dir).map_err(ChunkError::io(dir))? {
            let path = format!("{dir}/{name}");
            storage.remove_file(&path).map_err(ChunkError::io(&path))?;
        }
        let manifest = DedupManifest { packs_covered: 0, run_id_next: 1, runs: Vec::new() };
        let path = format!("{dir}/{MANIFEST}");
        write_file_atomic(&*storage, &path, &manifest.encode()).map_err(ChunkError::io(&path))?;
        Ok(DedupIndex {
            storage,
            dir: dir.to_owned(),
            config,
            memtable: FxHashMap::default(),
            runs: Vec::new(),
            manifest,
        })
    }

    pub fn packs_covered(&self) -> u64 {
        self.manifest.packs_covered
    }

    pub fn insert(&mut self, hash: ChunkHash, id: ChunkId) {
        self.memtable.insert(hash, id);
    }

    pub fn is_full(&self) -> bool {
        self.memtable.len() >= self.config.memtable_entries_max
    }

    /// The id the in-memory table holds for `hash`: always valid, because
    /// garbage collection removes freed ids from it.
    pub fn find_in_memory(&self, hash: &ChunkHash) -> Option<ChunkId> {
        self.memtable.get(hash).copied()
    }

    /// The ids the runs hold for `hash`, newest run first; possibly stale.
    pub fn find_in_runs(&self, hash: &ChunkHash, found: &mut Vec<ChunkId>) -> Result<(), ChunkError> {
        for run in self.runs.iter().rev() {
            run.find(hash, found)?;
        }
        Ok(())
    }

    /// Drops in-memory entries of freed ids.
    pub fn forget(&mut self, is_live: impl Fn(ChunkId) -> bool) {
        self.memtable.retain(|_, id| is_live(*id));
    }

    /// Writes the in-memory entries as a run, covering every pack up to
    /// `packs_covered` (the caller has added all their chunks), then merges
    /// runs if a size class is full. Entries of ids `is_live` rejects go.
    pub fn flush(&mut self, packs_covered: u64, is_live: &dyn Fn(ChunkId) -> bool) -> Result<(), ChunkError> {
        let mut entries: Vec<DedupEntry> = self
            .memtable
            .iter()
            .map(|(&hash, &id)| DedupEntry { hash, id })
            .filter(|entry| is_live(entry.id))
            .collect();
        entries.sort_unstable();
        let mut next = self.manifest.clone();
        next.packs_covered = next.packs_covered.max(packs_covered);
        let written = if entries.is_empty() {
            None
        } else {
            let id = next.run_id_next;
            next.run_id_next += 1;
            let run = self.write_run(id, entries.len() as u64, entries.iter().copied().map(Ok))?;
            next.runs.push(run.info);
            Some(run)
        };
        self.write_manifest(&next)?;
        self.manifest = next;
        self.runs.extend(written);
        self.memtable.clear();
        self.merge_if_due(is_live)
    }

    /// A run's size class: `floor(log_fanin(entries))`.
    fn size_class(&self, entries: u64) -> u32 {
        entries.max(1).ilog(self.config.merge_fanin as u64)
    }

    fn merge_if_due(&mut self, is_live: &dyn Fn(ChunkId) -> bool) -> Result<(), ChunkError> {
        loop {
            let mut by_class: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
            for (position, run) in self.runs.iter().enumerate() {
                by_class.entry(self.size_class(run.info.entry_count)).or_default().push(position);
            }
            let Some(mut group) = by_class.into_values().find(|group| group.len() >= self.config.merge_fanin) else {
                return Ok(());
            };
            group.truncate(self.config.merge_fanin);
            self.merge(&group, is_live)?;
        }
    }

    /// Replaces the runs at `positions` by one.
    fn merge(&mut self, positions: &[usize], is_live: &dyn Fn(ChunkId) -> bool) -> Result<(), ChunkError> {
        let mut scans: Vec<RunScan<'_>> =
            positions.iter().map(|&position| RunScan::new(&self.runs[position])).collect();
        let mut heap = BinaryHeap::new();
        for (source, scan) in scans.iter_mut().enumerate() {
            if let Some(entry) = scan.next_entry()? {
                heap.push(Reverse((entry, source)));
            }
        }
        let mut last: Option<DedupEntry> = None;
        let merged = std::iter::from_fn(|| loop {
            let Reverse((entry, source)) = heap.pop()?;
            match scans[source].next_entry() {
                Ok(Some(next)) => heap.push(Reverse((next, source))),
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
            if last == Some(entry) || !is_live(entry.id) {
                continue;
            }
            last = Some(entry);
            return Some(Ok(entry));
        });
        let id = self.manifest.run_id_next;
        let mut next = self.manifest.clone();
        next.run_id_next += 1;
        let entries_max = positions.iter().map(|&position| self.runs[position].info.entry_count).sum();
        let run = self.write_run_or_nothing(id, entries_max, merged)?;
        let merged_ids: Vec<u64> = positions.iter().map(|&position| self.runs[position].info.id).collect();
        next.runs.retain(|info| !merged_ids.contains(&info.id));
        next.runs.extend(run.as_ref().map(|run| run.info));
        self.write_manifest(&next)?;
        self.manifest = next;
        let old: Vec<DedupRun> = {
            let mut kept = Vec::new();
            let mut old = Vec::new();
            for run in self.runs.drain(..) {
                if merged_ids.contains(&run.info.id) {
                    old.push(run);
                } else {
                    kept.push(run);
                }
            }
            self.runs = kept;
            old
        };
        self.runs.extend(run);
        for run in old {
            self.storage.remove_file(&run.path).map_err(ChunkError::io(&run.path))?;
        }
        Ok(())
    }

    fn write_run(
        &self,
        id: u64,
        entries_max: u64,
        entries: impl Iterator<Item = Result<DedupEntry, ChunkError>>,
    ) -> Result<DedupRun, ChunkError> {
        Ok(self.write_run_or_nothing(id, entries_max, entries)?.expect("entries to write"))
    }

    /// Writes `entries` (sorted, at most `entries_max` of them, which sizes
    /// the Bloom filter) as run `id`, durably; `None` if there were none.
    fn write_run_or_nothing(
        &self,
        id: u64,
        entries_max: u64,
        entries: impl Iterator<Item = Result<DedupEntry, ChunkError>>,
    ) -> Result<Option<DedupRun>, ChunkError> {
        let path = format!("{}/{}", self.dir, run_name(id));
        if self.storage.exists(&path).map_err(ChunkError::io(&path))? {
            self.storage.remove_file(&path).map_err(ChunkError::io(&path))?;
        }
        let file = self.storage.open_file(&path, OpenMode::CreateNew).map_err(ChunkError::io(&path))?;
        let mut out = Vec::with_capacity(1 << 20);
        let mut written = DEDUP_PAGE_BYTES as u64;
        let mut page: Vec<DedupEntry> = Vec::with_capacity(DEDUP_ENTRIES_PER_PAGE);
        let mut fence = Vec::new();
        let bloom_bits_count = (entries_max.max(1) * self.config.bloom_bits_per_entry).next_multiple_of(64);
        let mut bloom = vec![0u64; (bloom_bits_count / 64) as usize];
        let mut entry_count = 0u64;
        let mut encoded = [0u8; DEDUP_PAGE_BYTES];
        let mut flush_page = |page: &mut Vec<DedupEntry>, out: &mut Vec<u8>, fence: &mut Vec<u64>| {
            encode_dedup_page(fence.len() as u64, page, &mut encoded);
            fence.push(fence_key(&page[0].hash));
            out.extend_from_slice(&encoded);
            page.clear();
        };
        for entry in entries {
            let entry = entry?;
            entry_count += 1;
            assert!(entry_count <= entries_max, "more entries than announced");
            for bit in bloom_bits(&entry.hash, bloom_bits_count, self.config.bloom_hashes) {
                bloom[(bit / 64) as usize] |= 1 << (bit % 64);
            }
            page.push(entry);
            if page.len() == DEDUP_ENTRIES_PER_PAGE {
                flush_page(&mut page, &mut out, &mut fence);
                if out.len() >= 1 << 20 {
                    rewind_io::write_reserved(&*file, &out, written).map_err(ChunkError::io(&path))?;
                    written += out.len() as u64;
                    out.clear();
                }
            }
        }
        if !page.is_empty() {
            flush_page(&mut page, &mut out, &mut fence);
        }
        if entry_count == 0 {
            drop(file);
            self.storage.remove_file(&path).map_err(ChunkError::io(&path))?;
            return Ok(None);
        }
        let fence_bytes = encode_fence(&fence);
        let bloom_bytes: Vec<u8> = bloom.iter().flat_map(|word| word.to_le_bytes()).collect();
        out.extend_from_slice(&fence_bytes);
        out.extend_from_slice(&bloom_bytes);
        rewind_io::write_reserved(&*file, &out, written).map_err(ChunkError::io(&path))?;
        let header = DedupRunHeader {
            entry_count,
            data_page_count: fence.len() as u64,
            bloom_bits: bloom_bits_count,
            bloom_hashes: self.config.bloom_hashes,
            fence_crc32c: rewind_format::crc32c(&fence_bytes),
            bloom_crc32c: rewind_format::crc32c(&bloom_bytes),
        };
        rewind_io::write_reserved(&*file, &header.encode(), 0).map_err(ChunkError::io(&path))?;
        file.sync_data().map_err(ChunkError::sync(&path))?;
        // The name becomes durable with the manifest that lists it (same directory).
        let info = DedupRunInfo { id, entry_count };
        Ok(Some(DedupRun { info, path, file, header, fence, bloom }))
    }

    fn write_manifest(&self, manifest: &DedupManifest) -> Result<(), ChunkError> {
        let path = format!("{}/{MANIFEST}", self.dir);
        write_file_atomic(&*self.storage, &path, &manifest.encode()).map_err(ChunkError::io(&path))
    }

    /// Entries in runs and in memory (stale ones included).
    pub fn entry_count(&self) -> u64 {
        self.runs.iter().map(|run| run.info.entry_count).sum::<u64>() + self.memtable.len() as u64
    }

    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Heap bytes: fences, filters and the in-memory table.
    pub fn memory_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(ChunkHash, ChunkId)>() + 8;
        self.runs.iter().map(DedupRun::memory_bytes).sum::<u64>() + (self.memtable.capacity() * entry) as u64
    }
}

#[cfg(test)]
mod tests {
    use rewind_format::chunks::{DedupRunHeader, DedupRunInfo, DEDUP_ENTRIES_PER_PAGE};
    use rewind_io::{SimConfig, SimStorage};

    use super::*;

    fn hash(first: u8, number: usize) -> ChunkHash {
        let mut hash = [0; 32];
        hash[0] = first;
        hash[1..9].copy_from_slice(&(number as u64).to_be_bytes());
        hash
    }

    /// A run file of these pages, each checksummed, with a fence of their
    /// first keys and a Bloom filter that says yes to everything.
    fn run_file(pages: &[Vec<DedupEntry>]) -> Vec<u8> {
        let mut body = Vec::new();
        let mut fence = Vec::new();
        for (number, entries) in pages.iter().enumerate() {
            let mut page = [0; DEDUP_PAGE_BYTES];
            encode_dedup_page(number as u64, entries, &mut page);
            body.extend_from_slice(&page);
            fence.push(fence_key(&entries[0].hash));
        }
        let fence = encode_fence(&fence);
        let bloom = vec![0xff; 8];
        let header = DedupRunHeader {
            entry_count: pages.iter().map(Vec::len).sum::<usize>() as u64,
            data_page_count: pages.len() as u64,
            bloom_bits: 64,
            bloom_hashes: 1,
            fence_crc32c: rewind_format::crc32c(&fence),
            bloom_crc32c: rewind_format::crc32c(&bloom),
        };
        [&header.encode()[..], &body, &fence, &bloom].concat()
    }

    /// Found by the `dedup_run` fuzz target: each page in order and the
    /// fence in order, but page 1 starting before page 0 ends. A merge took
    /// the run for sorted and wrote a run out of order, which then did not
    /// open. The scan reports it as corruption instead.
    #[test]
    fn a_run_whose_page_starts_before_the_page_before_it_ends_is_not_merged_on() {
        let full: Vec<DedupEntry> = (0..DEDUP_ENTRIES_PER_PAGE)
            .map(|number| DedupEntry {
                hash: hash(if number == 0 { 0x10 } else { 0xf0 }, number),
                id: ChunkId(1 + number as u64),
            })
            .collect();
        let late = vec![DedupEntry { hash: hash(0x20, 0), id: ChunkId(9_999) }];
        // A run in order of the same size, so that the two are merged.
        let other: Vec<DedupEntry> = (0..DEDUP_ENTRIES_PER_PAGE)
            .map(|number| DedupEntry { hash: hash(0x30, number), id: ChunkId(5_000 + number as u64) })
            .collect();
        let other_last = vec![DedupEntry { hash: hash(0x40, 0), id: ChunkId(9_000) }];
        let entry_count = DEDUP_ENTRIES_PER_PAGE as u64 + 1;
        let manifest = DedupManifest {
            packs_covered: 0,
            run_id_next: 3,
            runs: vec![DedupRunInfo { id: 1, entry_count }, DedupRunInfo { id: 2, entry_count }],
        };
        let storage = Arc::new(SimStorage::new(SimConfig::default(), 0));
        storage.create_dir_all("dedup").unwrap();
        for (path, bytes) in [
            ("dedup/manifest", manifest.encode()),
            ("dedup/0000000001.run", run_file(&[full, late])),
            ("dedup/0000000002.run", run_file(&[other, other_last])),
        ] {
            let file = storage.open_file(path, OpenMode::CreateNew).unwrap();
            file.write_all_at(&bytes, 0).unwrap();
        }
        let config = DedupConfig { memtable_entries_max: 16, merge_fanin: 2, ..DedupConfig::default() };
        let mut index = DedupIndex::open(storage, "dedup", config).unwrap();
        let error = index.flush(0, &|_| true).unwrap_err().to_string();
        assert!(error.contains("dedup index page 1 starts before the page before it ends"), "{error}");
    }
}
