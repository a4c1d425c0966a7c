//! A volume: its state and the write path (here), durability, and one home
//! per concern: `recovery` (create, open, replay), `destage` (overlay to the
//! current store), `maintenance` (commits, vouches, checkpoints, faults and
//! the slow work on history). What differs between layouts is asked of
//! [`crate::layout::LayoutRules`], never decided here by a layout's name.
//!
//! ```text
//! write ──► journal (append; durable at commit) ──► current store (destage,
//!   │                                               only durable records)
//!   ├─────► version index (memtable → runs) ──► archive: chunk store
//!   └─────► overlay: blocks whose newest versions are not destaged yet
//! ```
//!
//! Locks, always taken in this order, never the other way round:
//! `history_work` → `maintenance` → `destage` → `write`. A destage pass
//! takes `write` briefly to collect versions from the overlay and to
//! retire them; a read under `write` (a read-modify-write) never waits for
//! `destage` (see the read path).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rewind_cache::{CacheConfig, ControllerCache};
use rustc_hash::FxHashMap;

use rewind_chunks::ChunkStore;
use rewind_format::current::{BlockMeta, BlockState};
use rewind_format::journal::{RecordKind, RECORD_HEADER_BYTES};
use rewind_format::meta::healed;
use rewind_format::meta::{Checkpoint, Layout, TimelineBucket, VolumeMeta, VolumePolicy};

use crate::layout::{CurrentWrites, LayoutRules};
use rewind_index::{IndexConfig, PageCache, VersionIndex};
use rewind_io::{read_file_healing, write_file_atomic, OpenMode, Storage};
use rewind_journal::{Journal, JournalConfig, JournalError, RecentMemory};
use rewind_types::{BlockIndex, BlockSize, Lsn, Timestamp, Version, VersionData};

use crate::current::CurrentStore;
use crate::device_io::{VolumeIo, VolumeIoStats};
use crate::node::WorkSignal;
pub use crate::volume::archive::Clock;
use crate::volume::archive::PassesWanted;
use crate::volume::history::History;
use crate::EngineError;

mod archive;
mod bookmarks;
pub(crate) mod clients;
pub(crate) mod compound;
mod copy;
mod damage;
pub(crate) mod defrag;
mod destage;
pub(crate) mod diff;
mod gather;
pub(crate) mod history;
pub(crate) mod import;
mod lineage;
mod maintenance;
mod overlay;
pub(crate) mod promote;
pub(crate) mod read;
pub(crate) mod rebuild;
mod recovery;
pub(crate) mod revert;
pub(crate) mod revert_copy;
pub(crate) mod space;
pub(crate) mod writes;

use destage::DestageState;
pub(crate) use lineage::Base;
use maintenance::Fault;
use maintenance::HistoryWork;
use maintenance::MaintenanceState;
pub(crate) use maintenance::Work;
use overlay::Overlay;

#[derive(Clone, Copy, Debug)]
pub struct VolumeConfig {
    pub journal: JournalConfig,
    pub index: IndexConfig,
    /// Ask the maintenance thread to write buffered journal bytes out (not
    /// yet syncing them) once this many are waiting.
    pub commit_bytes_soft: u64,
    /// Writers commit themselves (backpressure) once this many bytes wait.
    pub unwritten_bytes_max: u64,
    /// Buffered writes reach the disk at least this often (nanoseconds): what
    /// a power loss can take from writes that were never flushed.
    pub commit_interval_nanos: u64,
    /// Block versions waiting to be destaged before writers destage
    /// themselves: about 100 bytes of memory each, so 100 MiB at most per
    /// volume by default. Where the overlay absorbs overwrites (the
    /// journaled layout) they are blocks (`Overlay::held`), each with its
    /// newest durable version and those written since the last commit, so
    /// about twice that memory under sustained writes: a burst that rewrites up to 2 GiB
    /// of 4 KiB blocks (half of it, see `burst_quiet_nanos`) is destaged
    /// once, after it, and a writer that finds them all waiting destages
    /// the sixteenth written least recently, a short pass.
    pub overlay_versions_max: usize,
    /// While the volume is being written (a write within this many
    /// nanoseconds; 0 never waits), background work leaves the disk to the
    /// journal: destaging waits until half of `overlay_versions_max` is
    /// waiting, archiving as `burst_archive_wait_nanos` says, checkpoints until
    /// twice `checkpoint_journal_bytes` (where the overlay absorbs
    /// overwrites, a checkpoint leaves the blocks rewritten since the last
    /// one instead, and need not wait). A burst then goes to the disk once,
    /// at the journal's speed, and the second copies follow it.
    pub burst_quiet_nanos: u64,
    /// Reads keep archiving waiting too, for at most this long after the
    /// last write (nanoseconds; 0: never): a read job right after a burst of
    /// writes keeps the cores the archiver would take from it, and a pass
    /// already under way pauses for it, while the history every volume of
    /// the node has waiting fits the disk's free space above twice the
    /// reserve. In the journaled layout small reads keep destaging (and
    /// the checkpoints that destage) waiting as well, and a pass under way
    /// stops between its parts (`Volume::reads_hold_destaging`); large
    /// reads do not, since destaging puts the present back in block order
    /// in the current store, which a long sequential read needs to run at
    /// full speed (BENCHMARKS.md). Elsewhere destaging does not wait for
    /// reads: the layouts' client tests pin when Checkpointing and COW copy
    /// out.
    pub burst_reads_nanos: u64,
    /// Versions in the live memtable before it is sealed and written as a run.
    pub memtable_versions_max: usize,
    /// Checkpoint at least this often (nanoseconds) while there are writes...
    pub checkpoint_interval_nanos: u64,
    /// ...and after this many journal bytes, bounding recovery time: it
    /// replays at most twice this (a burst's checkpoints wait for twice as
    /// much, or, where the overlay absorbs overwrites, cut at the last one).
    pub checkpoint_journal_bytes: u64,
    /// Apply retention (advance its clock, rewrite the runs it thins) this
    /// often (nanoseconds). Each pass rewrites the index runs old enough to
    /// thin further, so this trades reclaim delay for rewrite work.
    pub retention_interval_nanos: u64,
    /// Move history from the journal into the chunk store this often
    /// (nanoseconds), or sooner once `archive_bytes_soft` of it waits.
    pub archive_interval_nanos: u64,
    pub archive_bytes_soft: u64,
    /// How long a burst keeps archiving waiting, from its first write
    /// (nanoseconds; see `burst_quiet_nanos`): while the history waiting
    /// also takes less than half the free space above twice the reserve
    /// (the bound reads right after a burst keep to), the burst writes the
    /// disk once and its history is archived when it pauses; a pass under
    /// way when a burst begins pauses too, between its parts. A volume
    /// written without pause archives as usual after it, alongside the
    /// writes, so history reaches the chunk store (and a bucket) at most
    /// this much later than at rest.
    pub burst_archive_wait_nanos: u64,
    /// Versions younger than this (nanoseconds) stay in the journal.
    pub archive_age_nanos: u64,
    /// Lay out the history of each bookmark in block order in the
    /// background once it is archived (see `Volume::lay_out_bookmarks`).
    pub lay_out_bookmarks: bool,
    /// Once the journal has been quiet this long (nanoseconds) after a
    /// commit, a vouch record makes damage to the last acknowledged writes
    /// detectable (see `rewind_journal`); 0 never vouches.
    pub vouch_after_nanos: u64,
}

impl Default for VolumeConfig {
    fn default() -> Self {
        VolumeConfig {
            journal: JournalConfig::default(),
            index: IndexConfig::default(),
            commit_bytes_soft: 4 << 20,
            unwritten_bytes_max: 64 << 20,
            commit_interval_nanos: 50_000_000,
            overlay_versions_max: 1 << 20,
            burst_quiet_nanos: 250_000_000,
            burst_reads_nanos: 60_000_000_000,
            memtable_versions_max: 1 << 20,
            checkpoint_interval_nanos: 30_000_000_000,
            checkpoint_journal_bytes: 1 << 30,
            retention_interval_nanos: 600_000_000_000,
            archive_interval_nanos: 30_000_000_000,
            archive_bytes_soft: 64 << 20,
            burst_archive_wait_nanos: 60_000_000_000,
            archive_age_nanos: 1_000_000_000,
            lay_out_bookmarks: true,
            vouch_after_nanos: 100_000_000,
        }
    }
}

/// When a write must be durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// At the next flush (or commit interval).
    Buffered,
    /// Before the call returns (NBD's FUA).
    Fua,
}

/// How zeroed blocks are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroMode {
    /// Record zeros without data and deallocate the blocks (TRIM, WRITE_ZEROES).
    Deallocate,
    /// Store zero-filled blocks (WRITE_ZEROES with NO_HOLE).
    Allocate,
}

/// A block version not yet in the current store.
#[derive(Clone, Copy, Debug)]
struct Pending {
    pub lsn: Lsn,
    pub version: Version,
}

struct WriteState {
    pub timestamp_last: Timestamp,
    /// New versions get times at or after this: the last archive cutoff.
    pub timestamp_floor: Timestamp,
    /// Per block, its versions not yet destaged, and the controller cache.
    pub overlay: Overlay,
    pub timeline_unsaved: BTreeMap<u64, TimelineBucket>,
    crcs: Vec<u32>,
    versions: Vec<Version>,
}

#[derive(Default)]
struct Counters {
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub zeroes: AtomicU64,
    pub zero_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub journal_bytes_appended: AtomicU64,
    pub checkpoints: AtomicU64,
    pub archive_passes: AtomicU64,
    /// Bytes of packs written laying out bookmarks in the background.
    pub layout_bytes_written: AtomicU64,
    pub archive_pauses: AtomicU64,
    pub archive_yields: AtomicU64,
    pub destage_stops: AtomicU64,
    pub versions_archived: AtomicU64,
    pub journal_bytes_reclaimed: AtomicU64,
    pub revert_blocks_copied: AtomicU64,
}

/// What a node's volumes share.
pub(crate) struct Shared {
    /// Cached version index pages.
    pub cache: Arc<PageCache>,
    pub chunks: Arc<ChunkStore>,
    /// Wakes the maintenance loop.
    pub work: Arc<WorkSignal>,
    /// Wakes the journals' writer (`Node::write_out_journals`).
    pub journal_work: Arc<WorkSignal>,
    /// The free space client writes may use.
    pub space: Arc<crate::reserve::SpaceGauge>,
    /// Work waiting for archive passes to end.
    pub passes_wanted: Arc<PassesWanted>,
    /// The embedder's clock (`Node::set_clock`).
    pub clock: Arc<OnceLock<Arc<dyn Clock>>>,
    /// What the journals keep in memory of what they wrote.
    pub journal_memory: Arc<RecentMemory>,
}

/// The largest write record; larger writes become several records.
const RECORD_BYTES_MAX: usize = 32 << 20;
/// The most blocks one zero record covers; larger ranges become several,
/// with backpressure between them, so memory stays bounded.
const ZERO_RECORD_BLOCKS_MAX: u64 = 1 << 16;

pub struct Volume {
    meta: VolumeMeta,
    dir: String,
    storage: Arc<dyn Storage>,
    config: VolumeConfig,
    journal: Journal,
    index: VersionIndex,
    /// The present, at natural offsets; none in the Logging layout.
    current: Option<CurrentStore>,
    chunks: Arc<ChunkStore>,
    io: VolumeIo,
    write: Mutex<WriteState>,
    destage: Mutex<DestageState>,
    /// Writers at the overlay's limit wait here for a destage pass under
    /// way to retire its next part, or to end (see `Volume::make_room`).
    room: Mutex<()>,
    room_made: parking_lot::Condvar,
    writers_waiting_for_room: AtomicUsize,
    maintenance: Mutex<MaintenanceState>,
    /// Taken by the slow work on history (never while holding `maintenance`).
    history_work: Mutex<HistoryWork>,
    /// The bookmark being laid out in the background (see `defrag.rs`).
    bookmark_layout: Mutex<defrag::BookmarkLayout>,
    /// Work waiting for archive passes to end (the node's).
    passes_wanted: Arc<PassesWanted>,
    /// The embedder's clock, once it gives one (the node's).
    clock: Arc<OnceLock<Arc<dyn Clock>>>,
    overlay_versions: AtomicUsize,
    /// What the overlay holds against `overlay_versions_max` (`Overlay::held`).
    overlay_held: AtomicUsize,
    /// The time of the last version appended (unix nanoseconds): whether
    /// the volume is in a burst of writes (see `burst_quiet_nanos`).
    written_at_nanos: AtomicU64,
    /// When the journal's writer or maintenance first saw records that are
    /// not durable yet (unix nanoseconds; 0: none seen).
    undurable_since_nanos: AtomicU64,
    /// When the burst the last write belongs to began (unix nanoseconds):
    /// the first write after `burst_quiet_nanos` without one.
    burst_began_nanos: AtomicU64,
    /// The read count `in_burst` last saw, and when it saw it move (unix
    /// nanoseconds): whether the volume is being read.
    reads_seen: AtomicU64,
    read_at_nanos: AtomicU64,
    /// The bytes read as `reads_seen` was last taken, and whether the
    /// reads since the look before were small (see `note_reads`).
    read_bytes_seen: AtomicU64,
    reads_small: AtomicBool,
    poisoned: Mutex<Option<String>>,
    closed: AtomicBool,
    history: History,
    /// The packs the chunk store adopted journal segments as, by segment,
    /// since the volume opened (see `archive.rs`): a segment archived in
    /// parts is adopted once. Forgotten as the journal reclaims them.
    adopted_segments: Mutex<FxHashMap<u32, Option<u64>>>,
    space: Mutex<Option<crate::VolumeSpace>>,
    /// What the last measurement of `space` counted (see `space.rs`).
    space_tally: Mutex<Option<space::SpaceTally>>,
    counters: Counters,
    clients: crate::volume::clients::Clients,
    damage: crate::volume::damage::HistoryDamage,
    /// The last transient failure of this volume's work (a full disk, no
    /// descriptors): it is retried by itself; cleared by the next success.
    fault: Mutex<Option<Fault>>,
    /// The last fault logged, and when (see `note_fault`).
    fault_logged: Mutex<Option<(String, Timestamp)>>,
    /// What recovery cut off the journal's tail when the volume was opened.
    recovered: Option<rewind_journal::DroppedTail>,
    /// False after a crash until everything replayed is in the current store
    /// again (the first checkpoint): until then a block may be torn there by
    /// the crash, covered for the present by the overlay but not for views,
    /// so views wait (see [`Volume::check_settled`]).
    settled: AtomicBool,
    disk: Arc<crate::reserve::SpaceGauge>,
    work: Arc<WorkSignal>,
    journal_work: Arc<WorkSignal>,
    zero_block_crc32c: u32,
    /// A clone's base: what it reads where it never wrote (see `lineage`).
    /// Some exactly when `meta.base` is; a promote swaps what it holds.
    base: Mutex<Option<Arc<lineage::Base>>>,
    /// The clones open on this volume, and the points they start from.
    clones: Mutex<BTreeMap<rewind_types::VolumeName, Timestamp>>,
    /// A promote is copying this clone's base.
    promoting: AtomicBool,
    /// The background copy after the last revert, while it is unfinished.
    revert_copy: Mutex<Option<revert_copy::CopyState>>,
    /// Held by the pass of that copy running.
    revert_copying: Mutex<()>,
}

impl Volume {
    pub fn name(&self) -> &rewind_types::VolumeName {
        &self.meta.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.meta.size_bytes
    }

    pub(crate) fn block_count(&self) -> u64 {
        self.size_bytes() / u64::from(self.block_size().bytes())
    }

    pub fn block_size(&self) -> BlockSize {
        self.meta.block_size
    }

    pub fn created(&self) -> Timestamp {
        self.meta.created
    }

    pub fn layout(&self) -> Layout {
        self.meta.layout
    }

    /// What this volume's layout does differently ([`crate::layout`]).
    /// What the volume is, as written at its creation (or opening: a clone
    /// promoted since reads its own copy of its base, see [`Volume::base`]).
    /// A block volume, or a file tree's.
    pub fn kind(&self) -> rewind_format::meta::VolumeKind {
        self.meta.kind
    }

    /// What the volume's `volume.meta` holds now: a promote since it was
    /// opened has made its base `copied` (the file is rewritten then, the
    /// fields read at opening are not).
    pub(crate) fn meta(&self) -> VolumeMeta {
        VolumeMeta { base: self.base(), ..self.meta.clone() }
    }

    pub fn rules(&self) -> LayoutRules {
        LayoutRules::of(self.meta.layout)
    }

    /// The controller cache size of split-stream, split-down-stream and checkpointing (0 for the others).
    pub fn cache_bytes(&self) -> u64 {
        self.meta.cache_bytes
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.lock().is_some()
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn check_open(&self) -> Result<(), EngineError> {
        if self.closed.load(Ordering::Acquire) {
            Err(EngineError::Closed(self.meta.name.to_string()))
        } else {
            Ok(())
        }
    }

    fn check_writable(&self) -> Result<(), EngineError> {
        self.check_open()?;
        match &*self.poisoned.lock() {
            Some(cause) => Err(EngineError::Poisoned { volume: self.meta.name.to_string(), cause: cause.clone() }),
            None => Ok(()),
        }
    }

    pub(crate) fn check_range(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        match offset.checked_add(length) {
            Some(end) if end <= self.meta.size_bytes => Ok(()),
            _ => Err(EngineError::OutOfRange {
                volume: self.meta.name.to_string(),
                offset,
                length,
                size_bytes: self.meta.size_bytes,
            }),
        }
    }

    /// Poisons the volume after a failed write or fsync and returns the error
    /// to report. A transient failure (a full disk, no descriptors left)
    /// poisons nothing: it fails the request or pass that met it, and the
    /// work is retried; a full disk is reported as such. Corruption found
    /// while writing passes through unchanged.
    pub(crate) fn fail(&self, error: EngineError) -> EngineError {
        if let EngineError::NoSpace { .. } | EngineError::Poisoned { .. } = error {
            return error;
        }
        if error.is_no_space() {
            let detail = error.to_string();
            return EngineError::NoSpace { volume: self.meta.name.to_string(), detail };
        }
        let poisons = match &error {
            _ if error.is_transient() => false,
            EngineError::Journal(JournalError::Corrupt { .. } | JournalError::Reclaimed { .. }) => false,
            EngineError::Journal(_) | EngineError::Io { .. } | EngineError::Index(_) => true,
            _ => false,
        };
        if !poisons {
            return error;
        }
        let cause = error.to_string();
        tracing::error!(volume = %self.meta.name, %cause, "volume poisoned: no more writes until restart");
        self.poisoned.lock().get_or_insert(cause.clone());
        EngineError::Poisoned { volume: self.meta.name.to_string(), cause }
    }

    /// Writes `data` at byte `offset`. Partial blocks are read, patched and
    /// written whole, so every version is a whole block.
    pub fn write(&self, now: Timestamp, offset: u64, data: &[u8], durability: Durability) -> Result<(), EngineError> {
        self.write_by(None, now, offset, data, durability)
    }

    /// [`Volume::write`] for a client that a revert may cut off (see
    /// [`Attachment::write`]).
    pub(crate) fn write_by(
        &self,
        writer: Option<&AtomicBool>,
        now: Timestamp,
        offset: u64,
        data: &[u8],
        durability: Durability,
    ) -> Result<(), EngineError> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_room()?;
        {
            let mut state = self.write.lock();
            self.check_not_cut_off(writer)?;
            let block_bytes = u64::from(self.meta.block_size.bytes());
            let end = offset + data.len() as u64;
            if offset.is_multiple_of(block_bytes) && end.is_multiple_of(block_bytes) {
                self.append_blocks(&mut state, now, self.meta.block_size.block_of(offset), data)?;
            } else {
                let head = offset - offset % block_bytes;
                let tail = end.next_multiple_of(block_bytes);
                let mut merged = vec![0u8; (tail - head) as usize];
                self.read_edges_locked(&state, head, offset, end, tail, &mut merged)?;
                merged[(offset - head) as usize..(end - head) as usize].copy_from_slice(data);
                self.append_blocks(&mut state, now, self.meta.block_size.block_of(head), &merged)?;
            }
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.after_write(durability)
    }

    /// Refuses a write, under the write lock, from a client a revert cut
    /// off: the revert marks its clients under the same lock, so a write
    /// that waited for the lock while the revert was made fails rather
    /// than landing in the reverted present.
    fn check_not_cut_off(&self, writer: Option<&AtomicBool>) -> Result<(), EngineError> {
        match writer {
            Some(cut_off) if cut_off.load(Ordering::Acquire) => {
                Err(EngineError::CutOff { volume: self.meta.name.to_string() })
            }
            _ => Ok(()),
        }
    }

    /// Fills the partial first and last blocks of `head..tail` (the byte range
    /// `offset..end` being overwritten) with their current contents.
    fn read_edges_locked(
        &self,
        state: &WriteState,
        head: u64,
        offset: u64,
        end: u64,
        tail: u64,
        merged: &mut [u8],
    ) -> Result<(), EngineError> {
        let block_bytes = self.meta.block_size.bytes() as usize;
        let last = merged.len() - block_bytes;
        if head < offset {
            self.read_locked(state, head, &mut merged[..block_bytes])?;
        }
        if end < tail && (last > 0 || head == offset) {
            self.read_locked(state, tail - block_bytes as u64, &mut merged[last..])?;
        }
        Ok(())
    }

    /// Backpressure, before anything is appended: refuses new data while
    /// the disk is below the reserve, and makes room first where the
    /// journal's buffer, the memtables or the overlay are full (writers
    /// then do what maintenance has not caught up with). If room cannot be
    /// made (a full disk), the write fails having changed nothing: memory
    /// stays bounded and an error always means the write did not happen.
    fn check_room(&self) -> Result<(), EngineError> {
        if let Some(detail) = self.disk.refusal() {
            return Err(EngineError::NoSpace { volume: self.meta.name.to_string(), detail });
        }
        // Batch by batch, so a writer waits for one batch's write, not for
        // a commit of the whole buffer (which took 40–250 ms at 1 GB/s).
        while self.journal.bytes_unwritten() >= self.config.unwritten_bytes_max {
            self.journal.write_out_oldest().map_err(|error| self.fail(error.into()))?;
        }
        if self.overlay_held.load(Ordering::Relaxed) >= self.config.overlay_versions_max {
            self.make_room()?;
        }
        if self.index.stats().versions_in_memory >= 3 * self.config.memtable_versions_max as u64 {
            self.flush()?;
            self.persist_index(self.journal.lsn_durable())?;
        }
        Ok(())
    }

    fn next_timestamp(state: &mut WriteState, now: Timestamp) -> Timestamp {
        let timestamp = now.max(state.timestamp_last.next()).max(state.timestamp_floor);
        state.timestamp_last = timestamp;
        timestamp
    }

    fn append_blocks(
        &self,
        state: &mut WriteState,
        now: Timestamp,
        first: BlockIndex,
        data: &[u8],
    ) -> Result<(), EngineError> {
        let block_bytes = self.meta.block_size.bytes();
        let blocks_per_record = (RECORD_BYTES_MAX / block_bytes as usize) as u64;
        for (chunk_index, chunk) in data.chunks(RECORD_BYTES_MAX).enumerate() {
            let block = BlockIndex(first.0 + chunk_index as u64 * blocks_per_record);
            let timestamp_before = state.timestamp_last;
            let timestamp = Volume::next_timestamp(state, now);
            let mut crcs = std::mem::take(&mut state.crcs);
            crcs.clear();
            let appended = self.journal.append_write(timestamp, block, chunk, &mut crcs).map_err(|error| {
                // Nothing was written: no point in time either.
                state.timestamp_last = timestamp_before;
                self.fail(error.into())
            })?;
            state.versions.clear();
            for (index, &crc32c) in crcs.iter().enumerate() {
                let offset = appended.data_offset + index as u32 * block_bytes;
                state.versions.push(Version {
                    block: BlockIndex(block.0 + index as u64),
                    timestamp,
                    data: VersionData::Journal { segment: appended.segment, offset },
                    crc32c,
                });
            }
            state.crcs = crcs;
            let record_bytes = RECORD_HEADER_BYTES + (crcs_len(chunk.len(), block_bytes)) + chunk.len();
            self.record_versions(state, appended.lsn, record_bytes as u64, 0);
        }
        Ok(())
    }

    /// Files the versions of record `lsn` (in `state.versions`, of which
    /// `zero_blocks` are zeros) in the index, the overlay and the timeline.
    fn record_versions(&self, state: &mut WriteState, lsn: Lsn, journal_bytes: u64, zero_blocks: usize) {
        let versions = std::mem::take(&mut state.versions);
        let first = versions.first().expect("records cover blocks");
        if !self.rules().history_at_destage() {
            self.index.insert(lsn, &versions);
        }
        state.overlay.record(lsn, &versions, self.current.is_some(), self.journal.lsn_durable());
        self.note_overlay(&state.overlay);
        add_record_to_timeline(
            &mut state.timeline_unsaved,
            first.timestamp,
            versions.len() as u64,
            zero_blocks as u64,
            u64::from(self.meta.block_size.bytes()),
        );
        self.counters.journal_bytes_appended.fetch_add(journal_bytes, Ordering::Relaxed);
        let written_at = first.timestamp.unix_nanos();
        let written_before = self.written_at_nanos.fetch_max(written_at, Ordering::Relaxed);
        if written_at.saturating_sub(written_before) >= self.config.burst_quiet_nanos {
            self.burst_began_nanos.fetch_max(written_at, Ordering::Relaxed);
        }
        // Reads before this write are no reads after the burst: `in_burst`
        // looks only at the count moving from here on.
        self.reads_seen.store(self.counters.reads.load(Ordering::Relaxed), Ordering::Relaxed);
        self.read_bytes_seen.store(self.counters.read_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        state.versions = versions;
    }

    /// Zeroes `length` bytes at `offset` (TRIM and WRITE_ZEROES). Whole blocks
    /// become zero versions; partial ones are read, patched and written.
    pub fn zero(
        &self,
        now: Timestamp,
        offset: u64,
        length: u64,
        mode: ZeroMode,
        durability: Durability,
    ) -> Result<(), EngineError> {
        self.zero_by(None, now, offset, length, mode, durability)
    }

    /// [`Volume::zero`] for a client that a revert may cut off (see
    /// [`Attachment::zero`]).
    pub(crate) fn zero_by(
        &self,
        writer: Option<&AtomicBool>,
        now: Timestamp,
        offset: u64,
        length: u64,
        mode: ZeroMode,
        durability: Durability,
    ) -> Result<(), EngineError> {
        self.check_writable()?;
        self.check_range(offset, length)?;
        self.check_room()?;
        let block_bytes = u64::from(self.meta.block_size.bytes());
        let end = offset + length;
        let whole_first = offset.next_multiple_of(block_bytes);
        let whole_end = end - end % block_bytes;
        if mode == ZeroMode::Allocate || whole_first >= whole_end {
            // Small, or zeros that must be stored as data: write them.
            let zeros = vec![0u8; length.min(RECORD_BYTES_MAX as u64) as usize];
            let mut done = 0;
            while done < length {
                let step = (length - done).min(zeros.len() as u64);
                self.write_by(writer, now, offset + done, &zeros[..step as usize], Durability::Buffered)?;
                done += step;
            }
            return self.after_write(durability);
        }
        if offset < whole_first {
            self.write_by(writer, now, offset, &vec![0u8; (whole_first - offset) as usize], Durability::Buffered)?;
        }
        let mut block = whole_first / block_bytes;
        let block_end = whole_end / block_bytes;
        while block < block_end {
            let count = (block_end - block).min(ZERO_RECORD_BLOCKS_MAX);
            // Between records: a huge range stays within the memory bounds.
            self.check_room()?;
            {
                let mut state = self.write.lock();
                self.check_not_cut_off(writer)?;
                let timestamp_before = state.timestamp_last;
                let timestamp = Volume::next_timestamp(&mut state, now);
                let appended = self.journal.append_zero(timestamp, BlockIndex(block), count as u32).map_err(|error| {
                    state.timestamp_last = timestamp_before;
                    self.fail(error.into())
                });
                let appended = appended?;
                let mut versions = std::mem::take(&mut state.versions);
                versions.clear();
                versions.extend((block..block + count).map(|index| Version {
                    block: BlockIndex(index),
                    timestamp,
                    data: VersionData::Zero,
                    crc32c: self.zero_block_crc32c,
                }));
                state.versions = versions;
                let zero_blocks = state.versions.len();
                self.record_versions(&mut state, appended.lsn, RECORD_HEADER_BYTES as u64, zero_blocks);
            }
            block += count;
            self.after_write(Durability::Buffered)?;
        }
        if whole_end < end {
            self.write_by(writer, now, whole_end, &vec![0u8; (end - whole_end) as usize], Durability::Buffered)?;
        }
        self.counters.zeroes.fetch_add(1, Ordering::Relaxed);
        self.counters.zero_bytes.fetch_add(length, Ordering::Relaxed);
        self.after_write(durability)
    }

    /// After a record is appended: FUA makes it durable (an error then
    /// means it is not durable, though it was written); otherwise wakes
    /// maintenance when there is work. Backpressure comes before the next
    /// append (`check_room`).
    fn after_write(&self, durability: Durability) -> Result<(), EngineError> {
        if durability == Durability::Fua {
            return self.flush();
        }
        if self.index.active_len() >= self.config.memtable_versions_max {
            self.index.seal();
            self.work.notify();
        }
        if self.journal.bytes_unwritten() >= self.config.commit_bytes_soft {
            self.journal_work.notify();
            self.work.notify();
        }
        Ok(())
    }

    /// Publishes the overlay's counts for readers without the write lock.
    fn note_overlay(&self, overlay: &Overlay) {
        self.overlay_versions.store(overlay.versions(), Ordering::Relaxed);
        self.overlay_held.store(overlay.held(), Ordering::Relaxed);
    }

    /// Hands the journal's waiting bytes to the disk once a commit's worth
    /// (`commit_bytes_soft`) waits, so a commit later has less to write,
    /// and commits records left undurable for `commit_interval_nanos`.
    /// Returns whether it wrote; a failed write poisons the volume.
    ///
    /// Both the journal's writer and maintenance call it. Commits were
    /// maintenance's alone, and a destage pass holds maintenance for
    /// seconds under sustained writes: durability then lagged by as long,
    /// past the interval's promise, and the overlay, which absorbs an
    /// overwrite only of a durable version, held two versions of every
    /// block of a volume rewritten in a loop, reached half its limit and
    /// destaged slices of blocks about to be rewritten (BENCHMARKS.md).
    pub(crate) fn write_out_journal(&self, now: Timestamp) -> Result<bool, EngineError> {
        if self.closed.load(Ordering::Acquire) || self.is_poisoned() {
            return Ok(false);
        }
        let mut worked = false;
        if self.journal.bytes_unwritten() >= self.config.commit_bytes_soft {
            self.journal.write_out().map_err(|error| self.fail(error.into()))?;
            worked = true;
        }
        if self.journal.lsn_durable() == Lsn(self.journal.lsn_next().0 - 1) {
            self.undurable_since_nanos.store(0, Ordering::Relaxed);
            return Ok(worked);
        }
        let now_nanos = now.unix_nanos().max(1);
        // Both callers may note it at once: either time will do.
        let first_seen = match self.undurable_since_nanos.load(Ordering::Relaxed) {
            0 => {
                self.undurable_since_nanos.store(now_nanos, Ordering::Relaxed);
                now_nanos
            }
            seen => seen,
        };
        if now_nanos.saturating_sub(first_seen) < self.config.commit_interval_nanos {
            return Ok(worked);
        }
        self.flush()?;
        self.undurable_since_nanos.store(0, Ordering::Relaxed);
        Ok(true)
    }

    /// Makes the writes through `lsn` durable (a compound write's record):
    /// at once, with no wait for the disk, if a flush since already has.
    pub fn flush_through(&self, lsn: Lsn) -> Result<(), EngineError> {
        self.check_writable()?;
        match self.journal.lsn_durable() >= lsn {
            true => Ok(()),
            false => self.flush(),
        }
    }

    /// The LSN through which the journal is durable.
    pub fn lsn_durable(&self) -> Lsn {
        self.journal.lsn_durable()
    }

    /// Makes every write that completed before this call durable.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.check_writable()?;
        self.journal.commit().map_err(|error| self.fail(error.into()))?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// What recovery cut off the journal's end when the volume was opened.
    pub fn journal_tail_dropped(&self) -> Option<&rewind_journal::DroppedTail> {
        self.recovered.as_ref()
    }

    /// Why the volume refuses writes until restart, if it does.
    pub fn poison_cause(&self) -> Option<String> {
        self.poisoned.lock().clone()
    }

    pub(crate) fn storage(&self) -> &dyn Storage {
        &*self.storage
    }

    /// Device I/O of the volume's stores since it was opened.
    pub fn io_stats(&self) -> VolumeIoStats {
        self.io.stats()
    }

    /// Checks `bytes` against `version`'s CRC; a mismatch is corruption,
    /// reported with the block, its time, where it was read and what for.
    pub(crate) fn check_version_bytes(
        &self,
        version: &Version,
        bytes: &[u8],
        place: &str,
        doing: &str,
    ) -> Result<(), EngineError> {
        if rewind_format::crc32c(bytes) == version.crc32c {
            return Ok(());
        }
        Err(EngineError::Corrupt {
            volume: self.name().to_string(),
            detail: format!(
                "block {} written at {} ({place}) fails its checksum while {doing}",
                version.block,
                crate::timespec::DisplayTime(version.timestamp)
            ),
        })
    }

    /// Time of the newest version (the volume's creation if none).
    pub fn timestamp_last(&self) -> Timestamp {
        self.write.lock().timestamp_last
    }
}

/// Bytes of a write record's CRC array for `data_bytes` of blocks.
fn crcs_len(data_bytes: usize, block_bytes: u32) -> usize {
    (data_bytes / block_bytes as usize * 4).next_multiple_of(8)
}

/// Adds a record of `blocks` blocks, `zero_blocks` of them zeroed, to the
/// timeline: one write, or one zeroing if it wrote no data (a compound
/// record that also zeroes counts its zeros' bytes too, as one write).
pub(crate) fn add_record_to_timeline(
    timeline: &mut BTreeMap<u64, TimelineBucket>,
    at: Timestamp,
    blocks: u64,
    zero_blocks: u64,
    block_bytes: u64,
) {
    assert!(zero_blocks <= blocks && blocks > 0);
    if zero_blocks == blocks {
        return add_to_timeline(timeline, at, true, blocks * block_bytes);
    }
    add_to_timeline(timeline, at, false, (blocks - zero_blocks) * block_bytes);
    let minute = at.unix_seconds() / 60;
    timeline.get_mut(&minute).expect("added above").zero_bytes += zero_blocks * block_bytes;
}

pub(crate) fn add_to_timeline(timeline: &mut BTreeMap<u64, TimelineBucket>, at: Timestamp, zero: bool, bytes: u64) {
    let minute = at.unix_seconds() / 60;
    let bucket = timeline.entry(minute).or_insert(TimelineBucket { minute, ..TimelineBucket::default() });
    if zero {
        bucket.zero_count += 1;
        bucket.zero_bytes += bytes;
    } else {
        bucket.write_count += 1;
        bucket.write_bytes += bytes;
    }
}
