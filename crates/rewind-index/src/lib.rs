//! The version index: for every block of a volume, its versions by time, and
//! `find_le(block, T)` — the newest version at or before `T`.
//!
//! Design (after MYCDP's Version_Index, seed 004 §3.2, made log-structured):
//! new versions go into an in-memory append buffer, the [`Memtable`]. The
//! engine *seals* it when it is full; a sealed memtable is written out as an
//! immutable *run* — versions sorted by `(block, time)` in checksummed 4 KiB
//! pages — once the journal records it came from are durable. Runs are
//! listed, oldest first, in an atomically replaced manifest, which also
//! records the last journal LSN they cover: recovery replays the journal from
//! there, so the journal is the append buffer's redo log.
//!
//! Because a volume's version times strictly increase, the memtables and runs
//! cover disjoint, ordered time ranges. A lookup at `T` walks them newest
//! first, skips every source that starts after `T`, and stops at the first
//! source that has a version of the block at or before `T`.
//!
//! Runs are merged in the background, always a contiguous group of the
//! newest ones (a `fanin`-ary counter), so there are O(log N) runs.
//!
//! Memory is bounded regardless of history length: the memtable by the
//! engine's cap, each run by its fence (16 bytes per 127 versions, 12.6 MB
//! for 10^8 versions), and pages by the shared [`PageCache`].
//!
//! Concurrency: lookups may run concurrently with inserts, sealing, writing
//! runs and merging. A lookup holds the state lock only while it searches the
//! live memtable, then works on a snapshot of `Arc`s.

mod cache;
mod memtable;
mod run;

pub use cache::{PageCache, PageCacheStats};
pub use memtable::Memtable;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rewind_format::meta::{IndexManifest, RunInfo};
use rewind_format::FormatError;
use rewind_io::{read_file, write_file_atomic, Storage};
use rewind_types::{Lsn, Timestamp, Version};

use run::{Run, RunWriter};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    #[error("version index I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("version index corrupt in {path}: {reason}")]
    Corrupt { path: String, reason: String },
}

impl IndexError {
    fn io(path: &str) -> impl FnOnce(io::Error) -> IndexError + '_ {
        move |source| IndexError::Io { path: path.to_owned(), source }
    }

    fn corrupt(path: &str) -> impl FnOnce(FormatError) -> IndexError + '_ {
        move |error| IndexError::Corrupt { path: path.to_owned(), reason: error.to_string() }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct IndexConfig {
    /// How many runs of one size class are merged into one.
    pub merge_fanin: usize,
    /// Runs of up to this many versions form the smallest size class.
    pub merge_base_versions: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { merge_fanin: 4, merge_base_versions: 1 << 18 }
    }
}

/// Sizes, for stats and the memory bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub versions_in_memory: u64,
    pub versions_in_runs: u64,
    pub run_count: u64,
    /// Heap bytes pinned by memtables and fences (not the page cache).
    pub memory_bytes: u64,
}

struct State {
    active: Memtable,
    /// Sealed memtables waiting to become runs, oldest first.
    frozen: Vec<Arc<Memtable>>,
    /// Oldest first.
    runs: Vec<Arc<Run>>,
}

pub struct VersionIndex {
    storage: Arc<dyn Storage>,
    dir: String,
    config: IndexConfig,
    cache: Arc<PageCache>,
    state: RwLock<State>,
    /// Held by whoever changes the runs; owns the durable manifest.
    manifest: Mutex<IndexManifest>,
}

const MANIFEST: &str = "manifest";

fn run_name(id: u64) -> String {
    format!("{id:010}.run")
}

impl VersionIndex {
    /// Creates an empty index in `dir`.
    pub fn create(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: IndexConfig,
        cache: Arc<PageCache>,
    ) -> Result<VersionIndex, IndexError> {
        storage.create_dir_all(dir).map_err(IndexError::io(dir))?;
        let manifest = IndexManifest { lsn_indexed: Lsn::ZERO, run_id_next: 1, runs: Vec::new() };
        let path = format!("{dir}/{MANIFEST}");
        write_file_atomic(&*storage, &path, &manifest.encode()).map_err(IndexError::io(&path))?;
        Ok(VersionIndex::assemble(storage, dir, config, cache, manifest, Vec::new()))
    }

    /// Opens the index in `dir`. Versions from journal records after
    /// [`VersionIndex::lsn_indexed`] must be inserted again.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: IndexConfig,
        cache: Arc<PageCache>,
    ) -> Result<VersionIndex, IndexError> {
        let path = format!("{dir}/{MANIFEST}");
        let bytes = read_file(&*storage, &path).map_err(IndexError::io(&path))?;
        let manifest = IndexManifest::decode(&bytes).map_err(IndexError::corrupt(&path))?;
        let mut runs = Vec::with_capacity(manifest.runs.len());
        for info in &manifest.runs {
            let path = format!("{dir}/{}", run_name(info.id));
            runs.push(Arc::new(Run::open(&*storage, &path, *info, Arc::clone(&cache))?));
        }
        // Runs written or merged away around a crash, and never (or no longer) listed.
        let listed: Vec<String> = manifest.runs.iter().map(|info| run_name(info.id)).collect();
        for name in storage.list_dir(dir).map_err(IndexError::io(dir))? {
            if name != MANIFEST && !listed.contains(&name) {
                let path = format!("{dir}/{name}");
                storage.remove_file(&path).map_err(IndexError::io(&path))?;
            }
        }
        Ok(VersionIndex::assemble(storage, dir, config, cache, manifest, runs))
    }

    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: IndexConfig,
        cache: Arc<PageCache>,
        manifest: IndexManifest,
        runs: Vec<Arc<Run>>,
    ) -> VersionIndex {
        assert!(config.merge_fanin >= 2);
        VersionIndex {
            storage,
            dir: dir.to_owned(),
            config,
            cache,
            state: RwLock::new(State { active: Memtable::default(), frozen: Vec::new(), runs }),
            manifest: Mutex::new(manifest),
        }
    }

    /// Every journal record up to this LSN is in the runs.
    pub fn lsn_indexed(&self) -> Lsn {
        self.manifest.lock().lsn_indexed
    }

    /// Adds the versions of journal record `lsn` (all with one time, later
    /// than every version already in the index).
    pub fn insert(&self, lsn: Lsn, versions: &[Version]) {
        self.state.write().active.insert(lsn, versions);
    }

    /// Versions in the live memtable.
    pub fn active_len(&self) -> usize {
        self.state.read().active.len()
    }

    /// Moves the live memtable aside, to be written as a run by [`persist`]
    /// once the journal holds its records durably.
    ///
    /// [`persist`]: VersionIndex::persist
    pub fn seal(&self) {
        let mut state = self.state.write();
        if !state.active.is_empty() {
            let sealed = std::mem::take(&mut state.active);
            state.frozen.push(Arc::new(sealed));
        }
    }

    /// For each block of `blocks`, the newest version at or before `at`.
    pub fn find_le_many(&self, blocks: &[u64], at: Timestamp) -> Result<Vec<Option<Version>>, IndexError> {
        let mut found = vec![None; blocks.len()];
        let (frozen, runs) = {
            let state = self.state.read();
            for (slot, &block) in found.iter_mut().zip(blocks) {
                *slot = state.active.find_le(block, at);
            }
            (state.frozen.clone(), state.runs.clone())
        };
        if found.iter().all(Option::is_some) {
            return Ok(found);
        }
        for memtable in frozen.iter().rev() {
            if memtable.timestamp_min().is_some_and(|first| first > at) {
                continue;
            }
            for (slot, &block) in found.iter_mut().zip(blocks) {
                if slot.is_none() {
                    *slot = memtable.find_le(block, at);
                }
            }
        }
        for run in runs.iter().rev() {
            if run.info().timestamp_min > at {
                continue;
            }
            for (slot, &block) in found.iter_mut().zip(blocks) {
                if slot.is_none() {
                    *slot = run.find_le(block, at)?;
                }
            }
        }
        Ok(found)
    }

    /// The newest version of `block` at or before `at`.
    pub fn find_le(&self, block: u64, at: Timestamp) -> Result<Option<Version>, IndexError> {
        Ok(self.find_le_many(&[block], at)?.pop().expect("one answer"))
    }

    /// Writes every sealed memtable whose records are durable (LSN at most
    /// `lsn_durable`) as a run. Returns how many were written.
    pub fn persist(&self, lsn_durable: Lsn) -> Result<usize, IndexError> {
        let mut manifest = self.manifest.lock();
        let mut written = 0;
        loop {
            let oldest = self.state.read().frozen.first().cloned();
            let Some(memtable) = oldest.filter(|memtable| memtable.lsn_last() <= lsn_durable) else {
                return Ok(written);
            };
            let id = manifest.run_id_next;
            let path = format!("{}/{}", self.dir, run_name(id));
            let mut writer = RunWriter::create(&*self.storage, &path)?;
            for version in memtable.sorted() {
                writer.push(version)?;
            }
            let info = writer.finish(id)?;
            let mut next = manifest.clone();
            next.runs.push(info);
            next.run_id_next = id + 1;
            next.lsn_indexed = memtable.lsn_last();
            self.write_manifest(&next)?;
            let run = Arc::new(Run::open(&*self.storage, &path, info, Arc::clone(&self.cache))?);
            *manifest = next;
            let mut state = self.state.write();
            let first = state.frozen.remove(0);
            assert!(Arc::ptr_eq(&first, &memtable));
            state.runs.push(run);
            written += 1;
        }
    }

    fn write_manifest(&self, manifest: &IndexManifest) -> Result<(), IndexError> {
        let path = format!("{}/{MANIFEST}", self.dir);
        // Also makes the names of newly written runs durable: same directory.
        write_file_atomic(&*self.storage, &path, &manifest.encode()).map_err(IndexError::io(&path))
    }

    fn size_class(&self, info: &RunInfo) -> u32 {
        let mut class = 0;
        let mut limit = self.config.merge_base_versions;
        while info.entry_count > limit {
            class += 1;
            limit = limit.saturating_mul(self.config.merge_fanin as u64);
        }
        class
    }

    /// Runs one merge if the newest runs call for it; returns whether it did.
    pub fn compact(&self) -> Result<bool, IndexError> {
        let mut manifest = self.manifest.lock();
        let runs = self.state.read().runs.clone();
        let fanin = self.config.merge_fanin;
        if runs.len() < fanin {
            return Ok(false);
        }
        let newest = &runs[runs.len() - fanin..];
        let class = self.size_class(&newest[0].info());
        if newest.iter().any(|run| self.size_class(&run.info()) != class) {
            return Ok(false);
        }
        let id = manifest.run_id_next;
        let path = format!("{}/{}", self.dir, run_name(id));
        let mut writer = RunWriter::create(&*self.storage, &path)?;
        let mut scans: Vec<_> = newest.iter().map(|run| run.scan()).collect();
        let mut heap = BinaryHeap::new();
        for (source, scan) in scans.iter_mut().enumerate() {
            if let Some(version) = scan.next_version()? {
                heap.push(Reverse(((version.block.0, version.timestamp.unix_nanos()), source, VersionKey(version))));
            }
        }
        while let Some(Reverse((_, source, VersionKey(version)))) = heap.pop() {
            writer.push(version)?;
            if let Some(next) = scans[source].next_version()? {
                heap.push(Reverse(((next.block.0, next.timestamp.unix_nanos()), source, VersionKey(next))));
            }
        }
        drop(scans);
        let info = writer.finish(id)?;
        let mut next = manifest.clone();
        let first = next.runs.len() - fanin;
        next.runs.splice(first.., [info]);
        next.run_id_next = id + 1;
        self.write_manifest(&next)?;
        let run = Arc::new(Run::open(&*self.storage, &path, info, Arc::clone(&self.cache))?);
        *manifest = next;
        {
            let mut state = self.state.write();
            let first = state.runs.len() - fanin;
            for (old, merged) in state.runs[first..].iter().zip(newest) {
                assert!(Arc::ptr_eq(old, merged), "only the merger changes runs");
            }
            state.runs.splice(first.., [run]);
        }
        for old in newest {
            self.cache.forget_run(old.uid());
            let path = format!("{}/{}", self.dir, run_name(old.info().id));
            self.storage.remove_file(&path).map_err(IndexError::io(&path))?;
        }
        Ok(true)
    }

    pub fn stats(&self) -> IndexStats {
        let state = self.state.read();
        let memtables = std::iter::once(&state.active).chain(state.frozen.iter().map(|memtable| &**memtable));
        let (versions_in_memory, memtable_bytes) = memtables
            .fold((0, 0), |(count, bytes), memtable| (count + memtable.len(), bytes + memtable.memory_bytes()));
        let fence_bytes: usize = state.runs.iter().map(|run| run.memory_bytes()).sum();
        IndexStats {
            versions_in_memory: versions_in_memory as u64,
            versions_in_runs: state.runs.iter().map(|run| run.info().entry_count).sum(),
            run_count: state.runs.len() as u64,
            memory_bytes: (memtable_bytes + fence_bytes) as u64,
        }
    }

    pub fn page_cache(&self) -> &Arc<PageCache> {
        &self.cache
    }
}

/// Heap entries compare by key and source only; the version rides along.
struct VersionKey(Version);

impl PartialEq for VersionKey {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for VersionKey {}

impl PartialOrd for VersionKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for VersionKey {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}
