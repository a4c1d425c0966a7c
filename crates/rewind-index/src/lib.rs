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
//! *Archiving* moves history out of the journal (MYCDP's archiver, seed 004
//! §3.3.1): [`VersionIndex::archive`] merges the *recent* runs holding
//! versions older than a cutoff, thinning as any merge does, hands the
//! versions before the cutoff to an [`Archiver`] that stores their data
//! elsewhere, and writes them as an *archived* run, the rest as a recent
//! one. The manifest's `archived_before` separates the two groups: every
//! run lies wholly on one side, and merges never mix them, so the journal
//! bytes history needs are exactly those of the recent runs and memtables.
//! Versions a merge drops whose data is archived are reported to the
//! [`ReleaseHook`], which releases their chunks.
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
pub mod repair;
mod run;
mod thin;

pub use cache::{PageCache, PageCacheStats};
pub use memtable::Memtable;
pub use run::Run;
pub use thin::Thinning;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rewind_format::meta::{healed, IndexManifest, RunInfo};
use rewind_format::FormatError;
use rewind_io::{read_file_healing, write_file_atomic, Storage};
use rewind_types::{Lsn, Timestamp, Version, VersionData};

use run::RunWriter;
use thin::Thin;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    #[error("version index I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("version index corrupt in {path}: {reason}")]
    Corrupt { path: String, reason: String },
    /// The [`Archiver`] failed; it holds the cause.
    #[error("archiving failed")]
    ArchiveFailed,
}

/// Stores the data of versions an archive pass moves out of the journal.
pub trait Archiver {
    /// Replaces the data of `versions` (in key order, all older than the
    /// cutoff, all in the journal) by where it is archived.
    fn archive(&mut self, versions: &mut [Version]) -> Result<(), ArchiveFailed>;
    /// Makes everything `archive` stored durable; the archived run that
    /// refers to it is written after this returns.
    fn finish(&mut self) -> Result<(), ArchiveFailed>;
}

/// An [`Archiver`] failed; it keeps the cause for its caller.
#[derive(Debug)]
pub struct ArchiveFailed;

/// Told of each archived version ([`VersionData::Chunk`]) a merge drops,
/// while the merge runs: before the new run durably replaces the old ones.
pub trait ReleaseHook: Send + Sync {
    fn release(&self, version: &Version);
}

/// What one archive pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    pub versions_archived: u64,
    pub versions_thinned: u64,
    pub runs_rewritten: u64,
    /// How the pass moved the chunk epoch (see [`VersionIndex::chunk_epoch`]).
    pub chunk_epoch: EpochStep,
}

/// A change of [`VersionIndex::chunk_epoch`] made by one operation alone:
/// what was known at `from`, with what the operation added, is the truth
/// at `to`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochStep {
    pub from: u64,
    pub to: u64,
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
    /// Versions may arrive late: filed when they reach history (copied
    /// before an overwrite) rather than when written, so only each block's
    /// own versions arrive in time order, and memtables and runs overlap in
    /// time. Lookups then consult every source; nothing refers to the
    /// journal, so nothing is archived.
    pub late_entries: bool,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { merge_fanin: 4, runs_soft_max: 48, late_entries: false }
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
    /// A memtable written as a run, emptied, for the next seal: its pages
    /// are already faulted in. A fresh one's growth paid a page fault for
    /// every 4 KiB, 7% of the server's CPU under sustained 1 MiB writes
    /// (BENCHMARKS.md, "Fresh memory under sustained writes, again").
    spare: Option<Memtable>,
    /// Oldest first.
    runs: Vec<Arc<Run>>,
    /// See [`VersionIndex::chunk_epoch`]; moved under this lock, so a
    /// snapshot of the runs and memtables comes with its epoch.
    chunk_epoch: u64,
}

impl State {
    fn step_chunk_epoch(&mut self) -> EpochStep {
        let from = self.chunk_epoch;
        self.chunk_epoch += 1;
        EpochStep { from, to: self.chunk_epoch }
    }
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
    release_hook: RwLock<Option<Arc<dyn ReleaseHook>>>,
    archive_progress: ArchiveProgress,
}

/// How far the archive pass under way is: the versions of the runs it
/// merges, and how many of them it has been through (archived, kept as
/// recent, or thinned). A pass over what a burst left takes a while, and
/// the versions it archives leave the journal's count only as it ends.
#[derive(Default)]
struct ArchiveProgress {
    done: AtomicU64,
    /// 0 while no pass is under way.
    total: AtomicU64,
}

/// Marks a pass under way until dropped, however the pass ends.
struct PassUnderWay<'a>(&'a ArchiveProgress);

impl Drop for PassUnderWay<'_> {
    fn drop(&mut self) {
        self.0.total.store(0, Ordering::Release);
        self.0.done.store(0, Ordering::Release);
    }
}

/// Versions an archive pass hands its [`Archiver`] at a time.
const ARCHIVE_BATCH_MAX: usize = 1 << 14;

const MANIFEST: &str = "manifest";

/// The blocks that had versions when [`VersionIndex::versioned_blocks`]
/// was asked.
pub struct VersionedBlocks {
    /// Sorted, distinct.
    in_memory: Vec<u64>,
    runs: Vec<Arc<Run>>,
}

impl VersionedBlocks {
    /// The lowest block at or after `block` with a version, if any.
    pub fn first_from(&self, block: u64) -> Result<Option<u64>, IndexError> {
        let mut first = self.in_memory.get(self.in_memory.partition_point(|&held| held < block)).copied();
        for run in &self.runs {
            if let Some(found) = run.first_block_from(block)? {
                assert!(found >= block, "a run's first block from {block} is {found}");
                first = Some(first.map_or(found, |first| first.min(found)));
            }
        }
        Ok(first)
    }
}

fn scan_runs<'a>(
    runs: impl Iterator<Item = &'a Arc<Run>>,
    visit: &mut dyn FnMut(&Version) -> Result<(), IndexError>,
) -> Result<(), IndexError> {
    for run in runs {
        let mut scan = run.scan();
        while let Some(version) = scan.next_version()? {
            visit(&version)?;
        }
    }
    Ok(())
}

/// The name of run `id`'s file in the index's directory.
pub fn run_file_name(id: u64) -> String {
    run_name(id)
}

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
        let manifest = IndexManifest {
            lsn_indexed: Lsn::ZERO,
            run_id_next: 1,
            versions_thinned: 0,
            archived_before: Timestamp::MIN,
            runs: Vec::new(),
            late_entries: config.late_entries,
        };
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
        let bytes = read_file_healing(&*storage, &path, healed).map_err(IndexError::io(&path))?;
        let manifest = IndexManifest::decode(&bytes).map_err(IndexError::corrupt(&path))?;
        if manifest.late_entries != config.late_entries {
            let reason = format!(
                "the index was made with late entries {}, opened with {}",
                manifest.late_entries, config.late_entries
            );
            return Err(IndexError::Corrupt { path, reason });
        }
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
            state: RwLock::new(State {
                active: Memtable::default(),
                frozen: Vec::new(),
                spare: None,
                runs,
                chunk_epoch: 0,
            }),
            run_id_next: AtomicU64::new(manifest.run_id_next),
            manifest: Mutex::new(manifest),
            persisting: Mutex::new(()),
            compacting: Mutex::new(()),
            thinning: RwLock::new(Thinning::default()),
            release_hook: RwLock::new(None),
            archive_progress: ArchiveProgress::default(),
        }
    }

    /// Who is told of archived versions merges drop.
    pub fn set_release_hook(&self, hook: Arc<dyn ReleaseHook>) {
        *self.release_hook.write() = Some(hook);
    }

    /// Every version older than this is archived.
    pub fn archived_before(&self) -> Timestamp {
        self.manifest.lock().archived_before
    }

    /// The archived part of the index, as one consistent whole: the runs
    /// wholly before [`VersionIndex::archived_before`] (held, so their
    /// files stay readable whatever merges do meanwhile; file names as
    /// [`run_file_name`] gives them), and the manifest of an index made of
    /// them alone, which covers no journal record. What a node needs of the
    /// index to be rebuilt from its chunk store (`rewind_engine::catalog`).
    pub fn archived_part(&self) -> (IndexManifest, Vec<Arc<Run>>) {
        let manifest = self.manifest.lock();
        assert!(!manifest.late_entries, "an index of late entries has no archived part");
        let archived_before = manifest.archived_before;
        let runs: Vec<Arc<Run>> =
            self.state.read().runs.iter().filter(|run| run.info().timestamp_max < archived_before).cloned().collect();
        let part = IndexManifest {
            lsn_indexed: Lsn::ZERO,
            runs: runs.iter().map(|run| run.info()).collect(),
            ..manifest.clone()
        };
        (part, runs)
    }

    /// The oldest version not yet in a run, if any.
    pub fn oldest_in_memory(&self) -> Option<Timestamp> {
        let state = self.state.read();
        state.frozen.first().and_then(|memtable| memtable.timestamp_min()).or_else(|| state.active.timestamp_min())
    }

    /// Versions in recent runs and memtables: those whose data may still be
    /// in the journal.
    pub fn versions_unarchived(&self) -> u64 {
        let archived_before = self.archived_before();
        let state = self.state.read();
        let in_runs: u64 = state
            .runs
            .iter()
            .filter(|run| run.info().timestamp_max >= archived_before)
            .map(|run| run.info().entry_count)
            .sum();
        let in_memory: usize = state.frozen.iter().map(|memtable| memtable.len()).sum::<usize>() + state.active.len();
        in_runs + in_memory as u64
    }

    /// Calls `visit` with every version whose data is in the chunk store
    /// (to count, measure or release the chunks history refers to).
    /// Returns the [`VersionIndex::chunk_epoch`] of what it visited.
    pub fn for_each_chunk(&self, visit: &mut dyn FnMut(&Version) -> Result<(), IndexError>) -> Result<u64, IndexError> {
        self.for_each_version(&mut |version| match version.data {
            VersionData::Chunk(_) => visit(version),
            _ => Ok(()),
        })
    }

    /// Moves whenever the versions whose data is in the chunk store change:
    /// an archive pass adds some, a filing of history (`insert`) adds some,
    /// thinning drops some. Merges and persists that drop none of them
    /// leave it. So what [`VersionIndex::for_each_chunk`] would visit is
    /// the same while it stays, and a measurement of it (a volume's space)
    /// holds; operations that return an [`EpochStep`] say what they added.
    /// Starts at 0 when the index is opened.
    pub fn chunk_epoch(&self) -> u64 {
        self.state.read().chunk_epoch
    }

    /// Appends to `out` a description of the versions
    /// [`VersionIndex::for_each_chunk`] visits: each run's id, size and time
    /// range, and how many versions are in memory. Runs are immutable and a
    /// volume never reuses a run id, so while the description stays the same
    /// so do the chunk references (a chunk store trusts the counts it saved
    /// at shutdown only as long as this holds).
    pub fn describe(&self, out: &mut Vec<u8>) {
        let state = self.state.read();
        let in_memory = state.frozen.iter().map(|memtable| memtable.len()).sum::<usize>() + state.active.len();
        out.extend_from_slice(&(state.runs.len() as u64).to_le_bytes());
        for run in &state.runs {
            let info = run.info();
            for field in [info.id, info.entry_count, info.timestamp_min.unix_nanos(), info.timestamp_max.unix_nanos()] {
                out.extend_from_slice(&field.to_le_bytes());
            }
        }
        out.extend_from_slice(&(in_memory as u64).to_le_bytes());
    }

    /// Calls `visit` with every version the index holds, run by run and
    /// then the memtables (so in no particular order). Returns the
    /// [`VersionIndex::chunk_epoch`] of what it visited.
    pub fn for_each_version(
        &self,
        visit: &mut dyn FnMut(&Version) -> Result<(), IndexError>,
    ) -> Result<u64, IndexError> {
        let (runs, frozen, active, chunk_epoch) = {
            let state = self.state.read();
            (state.runs.clone(), state.frozen.clone(), state.active.sorted(), state.chunk_epoch)
        };
        scan_runs(runs.iter(), visit)?;
        for memtable in frozen {
            memtable.sorted().iter().try_for_each(&mut *visit)?;
        }
        active.iter().try_for_each(visit)?;
        Ok(chunk_epoch)
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
    /// than every version already in the index; with `late_entries`, of any
    /// times, each later than every version of its block).
    /// Returns how the chunk epoch moved, if any of `versions` has its data
    /// in the chunk store (history filed at destage).
    pub fn insert(&self, lsn: Lsn, versions: &[Version]) -> Option<EpochStep> {
        let mut state = self.state.write();
        state.active.insert(lsn, versions, self.config.late_entries);
        let chunks = versions.iter().any(|version| matches!(version.data, VersionData::Chunk(_)));
        chunks.then(|| state.step_chunk_epoch())
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
            // A memtable sealed with a quarter of a spare's room or less
            // (a quiet volume's checkpoint) lets the spare's memory go.
            let fresh =
                state.spare.take().filter(|spare| state.active.len() * 4 > spare.capacity()).unwrap_or_default();
            let sealed = std::mem::replace(&mut state.active, fresh);
            state.frozen.push(Arc::new(sealed));
        }
    }

    /// For each block of `blocks`, the newest version at or before `at`
    /// (fastest when `blocks` ascend: neighbours share index pages).
    pub fn find_le_many(&self, blocks: &[u64], at: Timestamp) -> Result<Vec<Option<Version>>, IndexError> {
        if self.config.late_entries {
            return self.find_le_many_everywhere(blocks, at);
        }
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

    /// With late entries no source can be skipped: the newest version at or
    /// before `at` may be in any of them.
    fn find_le_many_everywhere(&self, blocks: &[u64], at: Timestamp) -> Result<Vec<Option<Version>>, IndexError> {
        let newer = |found: &mut Option<Version>, candidate: Option<Version>| {
            if candidate.is_some_and(|candidate| found.is_none_or(|found| candidate.timestamp > found.timestamp)) {
                *found = candidate;
            }
        };
        let mut found = vec![None; blocks.len()];
        let runs = {
            let state = self.state.read();
            for memtable in state.frozen.iter().map(|memtable| &**memtable).chain([&state.active]) {
                for (slot, &block) in found.iter_mut().zip(blocks) {
                    newer(slot, memtable.find_le(block, at));
                }
            }
            state.runs.clone()
        };
        let mut in_run = vec![None; blocks.len()];
        for run in runs.iter().filter(|run| run.info().timestamp_min <= at) {
            in_run.fill(None);
            run.find_le_many(blocks, at, &mut in_run)?;
            for (slot, candidate) in found.iter_mut().zip(&in_run) {
                newer(slot, *candidate);
            }
        }
        Ok(found)
    }

    /// The newest version of `block` at or before `at`.
    pub fn find_le(&self, block: u64, at: Timestamp) -> Result<Option<Version>, IndexError> {
        Ok(self.find_le_many(&[block], at)?.pop().expect("one answer"))
    }

    /// The blocks with versions in the index now, of any time, to skip
    /// what was never written (a defrag of a thin volume of terabytes
    /// planned every 32 MiB of it). The memtables' blocks are copied (they
    /// are bounded); the runs are looked up as asked.
    pub fn versioned_blocks(&self) -> VersionedBlocks {
        let state = self.state.read();
        let mut in_memory: Vec<u64> =
            state.frozen.iter().map(|memtable| &**memtable).chain([&state.active]).flat_map(Memtable::blocks).collect();
        in_memory.sort_unstable();
        in_memory.dedup();
        VersionedBlocks { in_memory, runs: state.runs.clone() }
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
            // Late entries are in the chunk store: what thinning drops is released.
            let hook = self.release_hook.read().clone();
            let mut thin = Thin::new(memtable.sorted().into_iter().map(Ok), &thinning, hook.as_deref());
            let mut writer = None;
            for version in &mut thin {
                self.writer(&mut writer)?.push(version?)?;
            }
            let (info, run) = self.finish_run(writer.expect("a memtable keeps at least one version"))?;
            let mut manifest = self.manifest.lock();
            let mut next = manifest.clone();
            next.runs.push(info);
            next.versions_thinned += thin.dropped;
            next.lsn_indexed = memtable.lsn_last();
            next.run_id_next = self.run_id_next.load(Ordering::Acquire);
            self.write_manifest(&next)?;
            *manifest = next;
            let mut state = self.state.write();
            if thin.chunks_dropped > 0 {
                state.step_chunk_epoch();
            }
            let first = state.frozen.remove(0);
            assert!(Arc::ptr_eq(&first, &memtable), "only persist removes sealed memtables");
            state.runs.push(run);
            drop((state, manifest, first));
            written += 1;
            self.keep_spare(memtable);
        }
    }

    /// Empties `written`, a memtable written as a run, for the next seal,
    /// unless a lookup holds it still or the spare kept is larger.
    /// Emptied without the state lock: it drops up to a million entries.
    fn keep_spare(&self, written: Arc<Memtable>) {
        let Ok(written) = Arc::try_unwrap(written) else { return };
        let emptied = written.emptied();
        let mut state = self.state.write();
        if state.spare.as_ref().is_none_or(|spare| spare.capacity() < emptied.capacity()) {
            state.spare = Some(emptied);
        }
    }

    /// Records that every journal record up to `lsn` is in the runs, as it
    /// is once nothing sealed at or before `lsn` waits to be written, when
    /// the records after the last version filed carry none (a revert's
    /// copy): recovery need not look at them again. The caller sealed the
    /// memtable when `lsn` was the last record, so none after the seal is
    /// at or before it.
    pub fn indexed_through(&self, lsn: Lsn) -> Result<(), IndexError> {
        let _persisting = self.persisting.lock();
        if self.state.read().frozen.iter().any(|memtable| memtable.lsn_last() <= lsn) {
            return Ok(());
        }
        let mut manifest = self.manifest.lock();
        if manifest.lsn_indexed >= lsn {
            return Ok(());
        }
        let next = IndexManifest { lsn_indexed: lsn, ..manifest.clone() };
        self.write_manifest(&next)?;
        *manifest = next;
        Ok(())
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

    /// The archive pass under way, if any: how many versions of the runs
    /// it merges it has been through, of how many.
    pub fn archive_progress(&self) -> Option<(u64, u64)> {
        let total = self.archive_progress.total.load(Ordering::Acquire);
        (total > 0).then(|| (self.archive_progress.done.load(Ordering::Relaxed).min(total), total))
    }

    /// The runs, and where the recent ones begin.
    fn runs_by_group(&self) -> (Vec<Arc<Run>>, usize) {
        let archived_before = self.archived_before();
        let runs = self.state.read().runs.clone();
        let first_recent = runs.partition_point(|run| run.info().timestamp_max < archived_before);
        (runs, first_recent)
    }

    /// Runs one merge if the runs call for it; returns whether it did.
    /// Archived and recent runs are merged separately.
    pub fn compact(&self) -> Result<bool, IndexError> {
        let _compacting = self.compacting.lock();
        let (runs, first_recent) = self.runs_by_group();
        let sizes: Vec<u64> = runs.iter().map(|run| run.info().entry_count).collect();
        let range = match self.merge_candidates(&sizes[first_recent..]) {
            Some(range) => first_recent + range.start..first_recent + range.end,
            None => match self.merge_candidates(&sizes[..first_recent]) {
                Some(range) => range,
                None => return Ok(false),
            },
        };
        self.merge(&runs[range])?;
        Ok(true)
    }

    /// Merges every run into one per group, applying the current thinning
    /// to all of history (after a range delete or a policy change). Returns
    /// whether there was a run to rewrite.
    pub fn rewrite_all(&self) -> Result<bool, IndexError> {
        Ok(self.rewrite_before(Timestamp::MAX)? > 0)
    }

    /// Merges the runs holding versions at or before `until` (the oldest
    /// ones: runs are in time order) into one, applying the current thinning.
    /// Returns how many runs were rewritten.
    pub fn rewrite_before(&self, until: Timestamp) -> Result<usize, IndexError> {
        let _compacting = self.compacting.lock();
        let (runs, first_recent) = self.runs_by_group();
        let count = match self.config.late_entries {
            // Runs overlap in time: any may hold versions before `until`.
            true => runs.len(),
            false => runs.partition_point(|run| run.info().timestamp_min <= until),
        };
        for group in [&runs[..count.min(first_recent)], &runs[first_recent.min(count)..count]] {
            if !group.is_empty() {
                self.merge(group)?;
            }
        }
        Ok(count)
    }

    /// Archives every version older than `cutoff` (see the module
    /// documentation). The caller guarantees that no version older than
    /// `cutoff` is still in a memtable, nor will be inserted.
    pub fn archive(&self, cutoff: Timestamp, archiver: &mut dyn Archiver) -> Result<ArchiveReport, IndexError> {
        let _compacting = self.compacting.lock();
        let archived_before = self.archived_before();
        if cutoff <= archived_before {
            return Ok(ArchiveReport::default());
        }
        assert!(
            self.oldest_in_memory().is_none_or(|oldest| oldest >= cutoff),
            "versions before the cutoff are in runs"
        );
        let (runs, first_recent) = self.runs_by_group();
        let end = first_recent + runs[first_recent..].partition_point(|run| run.info().timestamp_min < cutoff);
        let group = &runs[first_recent..end];
        let mut report = ArchiveReport { runs_rewritten: group.len() as u64, ..ArchiveReport::default() };
        let mut archived: Option<(RunWriter, u64)> = None;
        let mut recent: Option<(RunWriter, u64)> = None;
        let mut batch = Vec::with_capacity(ARCHIVE_BATCH_MAX.min(1024));
        let thinning = self.thinning();
        let hook = self.release_hook.read().clone();
        let mut thin = Thin::new(merged_versions(group), &thinning, hook.as_deref());
        let progress = &self.archive_progress;
        progress.done.store(0, Ordering::Release);
        progress.total.store(group.iter().map(|run| run.info().entry_count).sum(), Ordering::Release);
        let _under_way = PassUnderWay(progress);
        let mut looked = 0;
        while let Some(version) = thin.next() {
            let version = version?;
            looked += 1;
            if version.timestamp < cutoff {
                batch.push(version);
                if batch.len() == ARCHIVE_BATCH_MAX {
                    report.versions_archived += self.archive_batch(&mut batch, archiver, &mut archived)?;
                }
            } else {
                self.writer(&mut recent)?.push(version)?;
            }
            // Those waiting in `batch` are not through yet.
            progress.done.store(looked + thin.dropped - batch.len() as u64, Ordering::Relaxed);
        }
        report.versions_archived += self.archive_batch(&mut batch, archiver, &mut archived)?;
        report.versions_thinned = thin.dropped;
        // So the pass only adds to the versions in the chunk store (its step says so).
        assert_eq!(thin.chunks_dropped, 0, "recent runs hold no versions in the chunk store");
        archiver.finish().map_err(|ArchiveFailed| IndexError::ArchiveFailed)?;
        let replacement = [archived, recent].into_iter().flatten().map(|writer| self.finish_run(writer));
        let replacement = replacement.collect::<Result<Vec<_>, _>>()?;
        report.chunk_epoch = self.replace_runs(group, replacement, thin.dropped, cutoff, true)?;
        Ok(report)
    }

    /// The writer in `slot`, created (with the next run id) on first use.
    fn writer<'a>(&self, slot: &'a mut Option<(RunWriter, u64)>) -> Result<&'a mut RunWriter, IndexError> {
        if slot.is_none() {
            let id = self.run_id_next.fetch_add(1, Ordering::AcqRel);
            *slot = Some((RunWriter::create(&*self.storage, &format!("{}/{}", self.dir, run_name(id)))?, id));
        }
        Ok(&mut slot.as_mut().expect("created above").0)
    }

    /// Completes a run, durably, and opens it. (Its name becomes durable with
    /// the manifest that lists it: same directory.)
    fn finish_run(&self, (writer, id): (RunWriter, u64)) -> Result<(RunInfo, Arc<Run>), IndexError> {
        let info = writer.finish(id)?;
        let path = format!("{}/{}", self.dir, run_name(id));
        Ok((info, Arc::new(Run::open(&*self.storage, &path, info, Arc::clone(&self.cache))?)))
    }

    /// Has `batch` archived (journal versions only) and written; returns how
    /// many were archived.
    fn archive_batch(
        &self,
        batch: &mut Vec<Version>,
        archiver: &mut dyn Archiver,
        writer: &mut Option<(RunWriter, u64)>,
    ) -> Result<u64, IndexError> {
        let mut journal: Vec<Version> =
            batch.iter().filter(|version| matches!(version.data, VersionData::Journal { .. })).copied().collect();
        archiver.archive(&mut journal).map_err(|ArchiveFailed| IndexError::ArchiveFailed)?;
        let mut converted = journal.iter();
        for version in batch.iter_mut() {
            if matches!(version.data, VersionData::Journal { .. }) {
                let archived = converted.next().expect("one answer per journal version");
                assert_eq!((archived.block, archived.timestamp), (version.block, version.timestamp));
                assert!(!matches!(archived.data, VersionData::Journal { .. }), "archived versions leave the journal");
                *version = *archived;
            }
        }
        if !batch.is_empty() {
            let writer = self.writer(writer)?;
            for version in batch.iter() {
                writer.push(*version)?;
            }
        }
        let count = journal.len() as u64;
        batch.clear();
        Ok(count)
    }

    /// Replaces `merged`, a contiguous group of runs, by one run.
    fn merge(&self, merged: &[Arc<Run>]) -> Result<(), IndexError> {
        let thinning = self.thinning();
        let hook = self.release_hook.read().clone();
        let mut thin = Thin::new(merged_versions(merged), &thinning, hook.as_deref());
        let mut writer = None;
        for version in &mut thin {
            self.writer(&mut writer)?.push(version?)?;
        }
        let replacement = writer.map(|writer| self.finish_run(writer)).transpose()?.into_iter().collect();
        let archived_before = self.archived_before();
        self.replace_runs(merged, replacement, thin.dropped, archived_before, thin.chunks_dropped > 0)?;
        Ok(())
    }

    /// Durably replaces `old`, a contiguous group of runs, by `new` (in time
    /// order, possibly none), then deletes the old files. With
    /// `chunks_changed`, moves the chunk epoch, and returns how.
    fn replace_runs(
        &self,
        old: &[Arc<Run>],
        new: Vec<(RunInfo, Arc<Run>)>,
        dropped: u64,
        archived_before: Timestamp,
        chunks_changed: bool,
    ) -> Result<EpochStep, IndexError> {
        let step = {
            let mut manifest = self.manifest.lock();
            let ids: Vec<u64> = old.iter().map(|run| run.info().id).collect();
            let first = match ids.first() {
                Some(first) => {
                    manifest.runs.iter().position(|listed| listed.id == *first).expect("merged runs are listed")
                }
                // Nothing replaced: new runs (none, for an archive pass over no run) go after the archived ones.
                None => manifest.runs.partition_point(|run| run.timestamp_max < manifest.archived_before),
            };
            let listed: Vec<u64> = manifest.runs[first..first + ids.len()].iter().map(|listed| listed.id).collect();
            assert_eq!(listed, ids, "only the merger removes runs, and runs stay in time order");
            let mut next = manifest.clone();
            next.runs.splice(first..first + ids.len(), new.iter().map(|(info, _)| *info));
            next.versions_thinned += dropped;
            next.archived_before = archived_before;
            next.run_id_next = self.run_id_next.load(Ordering::Acquire);
            self.write_manifest(&next)?;
            *manifest = next;
            let mut state = self.state.write();
            for (listed, replaced) in state.runs[first..first + ids.len()].iter().zip(old) {
                assert!(Arc::ptr_eq(listed, replaced), "state and manifest list the same runs");
            }
            state.runs.splice(first..first + ids.len(), new.into_iter().map(|(_, run)| run));
            match chunks_changed {
                true => state.step_chunk_epoch(),
                false => EpochStep { from: state.chunk_epoch, to: state.chunk_epoch },
            }
        };
        for run in old {
            self.cache.forget_run(run.uid());
            let path = format!("{}/{}", self.dir, run_name(run.info().id));
            self.storage.remove_file(&path).map_err(IndexError::io(&path))?;
        }
        Ok(step)
    }

    pub fn stats(&self) -> IndexStats {
        let state = self.state.read();
        let memtables = std::iter::once(&state.active).chain(state.frozen.iter().map(|memtable| &**memtable));
        let spare_bytes = state.spare.as_ref().map_or(0, Memtable::memory_bytes);
        let (versions_in_memory, memtable_bytes) = memtables
            .fold((0, 0), |(count, bytes), memtable| (count + memtable.len(), bytes + memtable.memory_bytes()));
        let fence_bytes: usize = state.runs.iter().map(|run| run.memory_bytes()).sum();
        IndexStats {
            versions_in_memory: versions_in_memory as u64,
            versions_in_runs: state.runs.iter().map(|run| run.info().entry_count).sum(),
            run_count: state.runs.len() as u64,
            memory_bytes: (memtable_bytes + spare_bytes + fence_bytes) as u64,
        }
    }

    pub fn page_cache(&self) -> &Arc<PageCache> {
        &self.cache
    }
}

/// The versions of `runs` in key order (a k-way merge).
fn merged_versions(runs: &[Arc<Run>]) -> impl Iterator<Item = Result<Version, IndexError>> + '_ {
    let mut scans: Vec<_> = runs.iter().map(|run| run.scan()).collect();
    let mut heap = BinaryHeap::new();
    let mut first_error = None;
    for (source, scan) in scans.iter_mut().enumerate() {
        match scan.next_version() {
            Ok(Some(version)) => {
                heap.push(Reverse((rewind_format::index::key_of(&version), source, VersionKey(version))))
            }
            Ok(None) => {}
            Err(error) => first_error = first_error.or(Some(error)),
        }
    }
    std::iter::from_fn(move || {
        if let Some(error) = first_error.take() {
            return Some(Err(error));
        }
        let Reverse((_, source, VersionKey(version))) = heap.pop()?;
        match scans[source].next_version() {
            Ok(Some(next)) => heap.push(Reverse((rewind_format::index::key_of(&next), source, VersionKey(next)))),
            Ok(None) => {}
            Err(error) => return Some(Err(error)),
        }
        Some(Ok(version))
    })
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
