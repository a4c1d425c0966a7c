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
//! Runs are merged in the background, always a contiguous group ending at
//! the newest, keeping their size classes ordered like the digits of a
//! `fanin`-ary counter (see `merge_candidates`), so there are O(log N) runs.
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
mod thin;

pub use cache::{PageCache, PageCacheStats};
pub use memtable::Memtable;
pub use thin::Thinning;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rewind_format::meta::{IndexManifest, RunInfo};
use rewind_format::FormatError;
use rewind_io::{read_file, write_file_atomic, Storage};
use rewind_types::{Lsn, Timestamp, Version};

use run::{Run, RunWriter};
use thin::Thin;

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
    /// How many runs of similar size are merged into one.
    pub merge_fanin: usize,
    /// Past this many runs, the newest are merged whatever their sizes.
    pub runs_soft_max: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { merge_fanin: 4, runs_soft_max: 48 }
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
    /// The durable manifest; held only while it and `state.runs` change
    /// together, never during the long work of writing or merging runs.
    manifest: Mutex<IndexManifest>,
    /// Serialise persisting; serialise merging (they may overlap each other).
    persisting: Mutex<()>,
    compacting: Mutex<()>,
    run_id_next: AtomicU64,
    /// Read at the start of each persist and merge.
    thinning: RwLock<Thinning>,
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
        let manifest = IndexManifest { lsn_indexed: Lsn::ZERO, run_id_next: 1, versions_thinned: 0, runs: Vec::new() };
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
        assert!(config.merge_fanin >= 2 && config.runs_soft_max >= config.merge_fanin);
        VersionIndex {
            storage,
            dir: dir.to_owned(),
            config,
            cache,
            state: RwLock::new(State { active: Memtable::default(), frozen: Vec::new(), runs }),
            run_id_next: AtomicU64::new(manifest.run_id_next),
            manifest: Mutex::new(manifest),
            persisting: Mutex::new(()),
            compacting: Mutex::new(()),
            thinning: RwLock::new(Thinning::default()),
        }
    }

    /// What later persists and merges drop. A pin must be set before any
    /// version after it is inserted (a bookmark at "now" is).
    pub fn set_thinning(&self, thinning: Thinning) {
        *self.thinning.write() = thinning;
    }

    pub fn thinning(&self) -> Thinning {
        self.thinning.read().clone()
    }

    /// Versions thinning has dropped since the index was created.
    pub fn versions_thinned(&self) -> u64 {
        self.manifest.lock().versions_thinned
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

    /// For each block of `blocks`, the newest version at or before `at`
    /// (fastest when `blocks` ascend: neighbours share index pages).
    pub fn find_le_many(&self, blocks: &[u64], at: Timestamp) -> Result<Vec<Option<Version>>, IndexError> {
        let mut found = vec![None; blocks.len()];
        let (frozen, runs) = {
            let state = self.state.read();
            for (slot, &block) in found.iter_mut().zip(blocks) {
                *slot = state.active.find_le(block, at);
            }
            if found.iter().all(Option::is_some) {
                return Ok(found);
            }
            (state.frozen.clone(), state.runs.clone())
        };
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
            if found.iter().all(Option::is_some) {
                break;
            }
            if run.info().timestamp_min <= at {
                run.find_le_many(blocks, at, &mut found)?;
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
        let _persisting = self.persisting.lock();
        let mut written = 0;
        loop {
            let oldest = self.state.read().frozen.first().cloned();
            let Some(memtable) = oldest.filter(|memtable| memtable.lsn_last() <= lsn_durable) else {
                return Ok(written);
            };
            let thinning = self.thinning();
            let mut thin = Thin::new(memtable.sorted().into_iter().map(Ok), &thinning);
            let (info, run) = self.write_run(&mut thin)?;
            let mut manifest = self.manifest.lock();
            let mut next = manifest.clone();
            next.runs.push(info);
            next.versions_thinned += thin.dropped;
            next.lsn_indexed = memtable.lsn_last();
            next.run_id_next = self.run_id_next.load(Ordering::Acquire);
            self.write_manifest(&next)?;
            *manifest = next;
            let mut state = self.state.write();
            let first = state.frozen.remove(0);
            assert!(Arc::ptr_eq(&first, &memtable), "only persist removes sealed memtables");
            state.runs.push(run);
            written += 1;
        }
    }

    /// Writes versions (in key order) as a new run, durably, and opens it.
    fn write_run(
        &self,
        versions: impl Iterator<Item = Result<Version, IndexError>>,
    ) -> Result<(RunInfo, Arc<Run>), IndexError> {
        let id = self.run_id_next.fetch_add(1, Ordering::AcqRel);
        let path = format!("{}/{}", self.dir, run_name(id));
        let mut writer = RunWriter::create(&*self.storage, &path)?;
        for version in versions {
            writer.push(version?)?;
        }
        let info = writer.finish(id)?;
        // The run's name becomes durable with the manifest that lists it (same directory).
        let run = Arc::new(Run::open(&*self.storage, &path, info, Arc::clone(&self.cache))?);
        Ok((info, run))
    }

    fn write_manifest(&self, manifest: &IndexManifest) -> Result<(), IndexError> {
        let path = format!("{}/{MANIFEST}", self.dir);
        // Also makes the names of newly written runs durable: same directory.
        write_file_atomic(&*self.storage, &path, &manifest.encode()).map_err(IndexError::io(&path))
    }

    /// A run's size class: `floor(log_fanin(versions))`.
    fn size_class(&self, versions: u64) -> u32 {
        versions.max(1).ilog(self.config.merge_fanin as u64)
    }

    /// Which runs (a contiguous range, ending at the newest) to merge next.
    ///
    /// The rule keeps size classes non-increasing from the oldest run to the
    /// newest, like the digits of a base-`fanin` counter, whatever the sizes
    /// memtables are sealed at (a quiet checkpoint seals a few versions, a
    /// full memtable a million):
    /// 1. older runs of a smaller class than the newest are merged into it,
    ///    so none is stranded beneath bigger, newer runs;
    /// 2. once the newest class has `fanin` runs, they merge into one run of
    ///    a higher class.
    ///
    /// So there are at most `fanin - 1` runs per class and O(fanin · log N)
    /// in all. Past `runs_soft_max` runs the newest `fanin` merge regardless.
    fn merge_candidates(&self, sizes: &[u64]) -> Option<Range<usize>> {
        let end = sizes.len();
        let newest = self.size_class(*sizes.last()?);
        let older_smaller = sizes[..end - 1].iter().rev().take_while(|&&size| self.size_class(size) < newest).count();
        if older_smaller > 0 {
            return Some(end - 1 - older_smaller..end);
        }
        let same = sizes.iter().rev().take_while(|&&size| self.size_class(size) == newest).count();
        if same >= self.config.merge_fanin {
            return Some(end - same..end);
        }
        (end > self.config.runs_soft_max).then(|| end - self.config.merge_fanin..end)
    }

    /// Runs one merge if the runs call for it; returns whether it did.
    pub fn compact(&self) -> Result<bool, IndexError> {
        let _compacting = self.compacting.lock();
        let runs = self.state.read().runs.clone();
        let sizes: Vec<u64> = runs.iter().map(|run| run.info().entry_count).collect();
        let Some(range) = self.merge_candidates(&sizes) else { return Ok(false) };
        self.merge(&runs[range])?;
        Ok(true)
    }

    /// Merges every run into one, applying the current thinning to all of
    /// history (after a range delete or a policy change). Returns whether
    /// there was a run to rewrite.
    pub fn rewrite_all(&self) -> Result<bool, IndexError> {
        Ok(self.rewrite_before(Timestamp::MAX)? > 0)
    }

    /// Merges the runs holding versions at or before `until` (the oldest
    /// ones: runs are in time order) into one, applying the current thinning.
    /// Returns how many runs were rewritten.
    pub fn rewrite_before(&self, until: Timestamp) -> Result<usize, IndexError> {
        let _compacting = self.compacting.lock();
        let runs = self.state.read().runs.clone();
        let count = runs.partition_point(|run| run.info().timestamp_min <= until);
        if count > 0 {
            self.merge(&runs[..count])?;
        }
        Ok(count)
    }

    /// Replaces `merged`, a contiguous group of runs, by one run.
    fn merge(&self, merged: &[Arc<Run>]) -> Result<(), IndexError> {
        let mut scans: Vec<_> = merged.iter().map(|run| run.scan()).collect();
        let mut heap = BinaryHeap::new();
        for (source, scan) in scans.iter_mut().enumerate() {
            if let Some(version) = scan.next_version()? {
                heap.push(Reverse((rewind_format::index::key_of(&version), source, VersionKey(version))));
            }
        }
        let merged_versions = std::iter::from_fn(|| {
            let Reverse((_, source, VersionKey(version))) = heap.pop()?;
            match scans[source].next_version() {
                Ok(Some(next)) => heap.push(Reverse((rewind_format::index::key_of(&next), source, VersionKey(next)))),
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
            Some(Ok(version))
        });
        let thinning = self.thinning();
        let mut thin = Thin::new(merged_versions, &thinning);
        let (info, run) = self.write_run(&mut thin)?;
        {
            let mut manifest = self.manifest.lock();
            let ids: Vec<u64> = merged.iter().map(|run| run.info().id).collect();
            let first = manifest.runs.iter().position(|listed| listed.id == ids[0]).expect("merged runs are listed");
            let listed: Vec<u64> = manifest.runs[first..first + ids.len()].iter().map(|listed| listed.id).collect();
            assert_eq!(listed, ids, "only the merger removes runs, and runs stay in time order");
            let mut next = manifest.clone();
            next.runs.splice(first..first + ids.len(), [info]);
            next.versions_thinned += thin.dropped;
            next.run_id_next = self.run_id_next.load(Ordering::Acquire);
            self.write_manifest(&next)?;
            *manifest = next;
            let mut state = self.state.write();
            for (old, merged) in state.runs[first..first + ids.len()].iter().zip(merged) {
                assert!(Arc::ptr_eq(old, merged), "state and manifest list the same runs");
            }
            state.runs.splice(first..first + ids.len(), [run]);
        }
        for old in merged {
            self.cache.forget_run(old.uid());
            let path = format!("{}/{}", self.dir, run_name(old.info().id));
            self.storage.remove_file(&path).map_err(IndexError::io(&path))?;
        }
        Ok(())
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
