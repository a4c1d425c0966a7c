//! A volume: the write path, durability, destaging to the current store,
//! checkpoints and recovery.
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
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_cache::{CacheConfig, ControllerCache};
use rustc_hash::{FxHashMap, FxHashSet};

use rewind_chunks::ChunkStore;
use rewind_format::current::{BlockMeta, BlockState};
use rewind_format::journal::{RecordKind, RECORD_HEADER_BYTES};
use rewind_format::meta::healed;
use rewind_format::meta::{Checkpoint, Layout, TimelineBucket, VolumeMeta, VolumePolicy};

use crate::layout::{CurrentWrites, LayoutRules};
use rewind_index::{IndexConfig, PageCache, VersionIndex};
use rewind_io::{read_file_healing, write_file_atomic, OpenMode, Storage};
use rewind_journal::{Journal, JournalConfig, JournalError};
use rewind_types::{BlockIndex, BlockSize, Lsn, Timestamp, Version, VersionData};

use crate::current::CurrentStore;
use crate::device_io::{VolumeIo, VolumeIoStats};
use crate::history::History;
use crate::node::WorkSignal;
use crate::EngineError;

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
    /// Block versions waiting to be destaged before writers destage themselves.
    pub overlay_versions_max: usize,
    /// Versions in the live memtable before it is sealed and written as a run.
    pub memtable_versions_max: usize,
    /// Checkpoint at least this often (nanoseconds) while there are writes...
    pub checkpoint_interval_nanos: u64,
    /// ...and after this many journal bytes, bounding recovery time.
    pub checkpoint_journal_bytes: u64,
    /// Apply retention (advance its clock, rewrite the runs it thins) this
    /// often (nanoseconds). Each pass rewrites the index runs old enough to
    /// thin further, so this trades reclaim delay for rewrite work.
    pub retention_interval_nanos: u64,
    /// Move history from the journal into the chunk store this often
    /// (nanoseconds), or sooner once `archive_bytes_soft` of it waits.
    pub archive_interval_nanos: u64,
    pub archive_bytes_soft: u64,
    /// Versions younger than this (nanoseconds) stay in the journal.
    pub archive_age_nanos: u64,
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
            overlay_versions_max: 1 << 18,
            memtable_versions_max: 1 << 20,
            checkpoint_interval_nanos: 30_000_000_000,
            checkpoint_journal_bytes: 1 << 30,
            retention_interval_nanos: 600_000_000_000,
            archive_interval_nanos: 30_000_000_000,
            archive_bytes_soft: 64 << 20,
            archive_age_nanos: 1_000_000_000,
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
pub(crate) struct Pending {
    pub lsn: Lsn,
    pub version: Version,
}

pub(crate) struct WriteState {
    pub timestamp_last: Timestamp,
    /// New versions get times at or after this: the last archive cutoff.
    pub timestamp_floor: Timestamp,
    /// Per block, its versions not yet destaged, oldest first.
    pub overlay: FxHashMap<u64, smallvec::SmallVec<[Pending; 1]>>,
    pub timeline_unsaved: BTreeMap<u64, TimelineBucket>,
    /// The IBM controller cache of split-stream, split-down-stream and
    /// checkpointing, fed every block written: its dirty pages are the
    /// overlay's blocks, and...
    cache: Option<ControllerCache<()>>,
    /// ...the blocks it has destaged (let go), for the destager.
    let_go: FxHashSet<u64>,
    crcs: Vec<u32>,
    versions: Vec<Version>,
}

pub(crate) struct DestageState {
    /// Every durable record up to this LSN is in the current store.
    pub lsn_applied: Lsn,
}

pub(crate) struct MaintenanceState {
    /// When maintenance first saw records that are not durable yet.
    undurable_since: Option<Timestamp>,
    /// The durable LSN maintenance last saw, and since when it has not moved.
    quiet: (Lsn, Timestamp),
    checkpoint_last: Timestamp,
    checkpoint_lsn: Lsn,
    checkpoint_journal_bytes: u64,
    /// ROW: when the redirected blocks were last merged into the current store.
    merged_at: Timestamp,
    /// Recovery starts in this journal segment: the ones before it may be
    /// reclaimed once their history is archived.
    pub replay_segment: u32,
}

/// When the slow work on history last ran.
pub(crate) struct HistoryWork {
    pub archive_last: Timestamp,
    space_checked: Timestamp,
}

#[derive(Default)]
pub(crate) struct Counters {
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
    pub versions_archived: AtomicU64,
    pub journal_bytes_reclaimed: AtomicU64,
}

/// What a node's volumes share.
pub(crate) struct Shared {
    /// Cached version index pages.
    pub cache: Arc<PageCache>,
    pub chunks: Arc<ChunkStore>,
    /// Wakes the maintenance loop.
    pub work: Arc<WorkSignal>,
    /// The free space client writes may use.
    pub space: Arc<crate::reserve::SpaceGauge>,
}

/// The storage parts a volume is assembled from.
struct Parts {
    journal: Journal,
    index: VersionIndex,
    current: Option<CurrentStore>,
    history: History,
    io: VolumeIo,
}

/// What recovery hands the volume it opens.
struct Recovered {
    /// Time of the newest record replayed.
    timestamp_last: Timestamp,
    /// Versions replayed that go back to the overlay (COW and the other
    /// layouts that file history as it leaves the overlay).
    pending: Vec<Pending>,
    /// The journal tail cut off, if any.
    dropped: Option<rewind_journal::DroppedTail>,
    /// Some records could not be re-applied to the current store.
    unsettled: bool,
}

/// A transient failure of a volume's work, for `rewind volume info` and
/// for logging it once rather than at every retry.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub what: String,
    pub since: Timestamp,
}

/// The share of the controller cache's pages that may be dirty (IBM §4.1).
const CACHE_DIRTY_FRACTION: f64 = 0.03;

/// The largest write record; larger writes become several records.
const RECORD_BYTES_MAX: usize = 32 << 20;
/// The most blocks one zero record covers; larger ranges become several,
/// with backpressure between them, so memory stays bounded.
const ZERO_RECORD_BLOCKS_MAX: u64 = 1 << 16;

pub struct Volume {
    pub(crate) meta: VolumeMeta,
    pub(crate) dir: String,
    storage: Arc<dyn Storage>,
    pub(crate) config: VolumeConfig,
    pub(crate) journal: Journal,
    pub(crate) index: VersionIndex,
    /// The present, at natural offsets; none in the Logging layout.
    pub(crate) current: Option<CurrentStore>,
    pub(crate) chunks: Arc<ChunkStore>,
    io: VolumeIo,
    pub(crate) write: Mutex<WriteState>,
    pub(crate) destage: Mutex<DestageState>,
    pub(crate) maintenance: Mutex<MaintenanceState>,
    /// Taken by the slow work on history (never while holding `maintenance`).
    pub(crate) history_work: Mutex<HistoryWork>,
    pub(crate) overlay_versions: AtomicUsize,
    poisoned: Mutex<Option<String>>,
    closed: AtomicBool,
    pub(crate) history: History,
    pub(crate) space: Mutex<Option<crate::VolumeSpace>>,
    pub(crate) counters: Counters,
    pub(crate) clients: crate::clients::Clients,
    pub(crate) damage: crate::damage::HistoryDamage,
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
    zero_block_crc32c: u32,
}

impl Volume {
    pub(crate) fn create(
        storage: Arc<dyn Storage>,
        dir: &str,
        meta: VolumeMeta,
        policy: VolumePolicy,
        config: VolumeConfig,
        shared: &Shared,
    ) -> Result<Arc<Volume>, EngineError> {
        storage.create_dir_all(dir).map_err(EngineError::io(dir))?;
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let io = VolumeIo::new(&storage);
        let journal_dir = format!("{dir}/journal");
        let journal = Journal::create(io.journal(), &journal_dir, meta.block_size, config.journal, meta.created)?;
        let cache = Arc::clone(&shared.cache);
        let rules = LayoutRules::of(meta.layout);
        let index_config = IndexConfig { late_entries: rules.history_at_destage(), ..config.index };
        let index = VersionIndex::create(io.index(), &format!("{dir}/index"), index_config, cache)?;
        let current = match rules.has_current_store() {
            true => {
                let current =
                    CurrentStore::open(&*io.current(), dir, meta.block_size, block_count, OpenMode::CreateNew)?;
                current.sync()?;
                Some(current)
            }
            false => None,
        };
        let history = History::create(&*storage, dir, policy)?;
        index.set_thinning(history.thinning(meta.created));
        let checkpoint =
            Checkpoint { lsn: Lsn::ZERO, replay_from: journal.position_next(), timestamp_last: meta.created };
        write_checkpoint(&*storage, dir, &checkpoint)?;
        // Written last: a directory without it is an unfinished creation.
        let path = format!("{dir}/volume.meta");
        write_file_atomic(&*storage, &path, &meta.encode()).map_err(EngineError::io(&path))?;
        let parts = Parts { journal, index, current, history, io };
        let recovered =
            Recovered { timestamp_last: meta.created, pending: Vec::new(), dropped: None, unsettled: false };
        Ok(Arc::new(Volume::assemble(storage, dir, meta, config, parts, checkpoint, shared, recovered)))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &str,
        meta: VolumeMeta,
        config: VolumeConfig,
        Parts { journal, index, current, history, io }: Parts,
        checkpoint: Checkpoint,
        shared: &Shared,
        Recovered { timestamp_last, pending, dropped: recovered, unsettled }: Recovered,
    ) -> Volume {
        let chunks = Arc::clone(&shared.chunks);
        let recovered_count = pending.len();
        let mut overlay: FxHashMap<u64, smallvec::SmallVec<[Pending; 1]>> = FxHashMap::default();
        for pending in pending {
            overlay.entry(pending.version.block.0).or_default().push(pending);
        }
        let zero_block_crc32c = rewind_format::crc32c(&vec![0u8; meta.block_size.bytes() as usize]);
        index.set_release_hook(Arc::new(crate::archive::ReleaseChunks {
            chunks: Arc::clone(&chunks),
            block_bytes: meta.block_size.bytes(),
        }));
        Volume {
            dir: dir.to_owned(),
            storage,
            config,
            write: Mutex::new(WriteState {
                timestamp_last: checkpoint.timestamp_last.max(timestamp_last),
                timestamp_floor: index.archived_before(),
                overlay,
                timeline_unsaved: BTreeMap::new(),
                cache: LayoutRules::of(meta.layout).has_controller_cache().then(|| {
                    let block_bytes = u64::from(meta.block_size.bytes());
                    ControllerCache::new(CacheConfig::new(meta.cache_bytes, block_bytes, CACHE_DIRTY_FRACTION))
                }),
                let_go: FxHashSet::default(),
                crcs: Vec::new(),
                versions: Vec::new(),
            }),
            destage: Mutex::new(DestageState { lsn_applied: journal.lsn_durable() }),
            maintenance: Mutex::new(MaintenanceState {
                undurable_since: None,
                quiet: (Lsn::ZERO, checkpoint.timestamp_last),
                checkpoint_last: checkpoint.timestamp_last,
                checkpoint_lsn: checkpoint.lsn,
                checkpoint_journal_bytes: 0,
                merged_at: checkpoint.timestamp_last,
                replay_segment: checkpoint.replay_from.segment,
            }),
            history_work: Mutex::new(HistoryWork {
                archive_last: checkpoint.timestamp_last,
                space_checked: checkpoint.timestamp_last,
            }),
            journal,
            index,
            current,
            chunks,
            io,
            overlay_versions: AtomicUsize::new(recovered_count),
            poisoned: Mutex::new(None),
            closed: AtomicBool::new(false),
            history,
            space: Mutex::new(None),
            counters: Counters::default(),
            clients: crate::clients::Clients::default(),
            damage: crate::damage::HistoryDamage::default(),
            fault: Mutex::new(None),
            fault_logged: Mutex::new(None),
            recovered,
            settled: AtomicBool::new(!unsettled),
            disk: Arc::clone(&shared.space),
            work: Arc::clone(&shared.work),
            zero_block_crc32c,
            meta,
        }
    }

    /// Opens a volume and recovers it: replays the journal after the last
    /// checkpoint into the current store, the index and the timeline.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: VolumeConfig,
        shared: &Shared,
    ) -> Result<Arc<Volume>, EngineError> {
        let meta_path = format!("{dir}/volume.meta");
        let bytes = read_file_healing(&*storage, &meta_path, healed).map_err(EngineError::io(&meta_path))?;
        let meta = VolumeMeta::decode(&bytes).map_err(|error| corrupt_file(&meta_path, error))?;
        let volume_name = meta.name.to_string();
        let checkpoint_path = format!("{dir}/checkpoint");
        let bytes =
            read_file_healing(&*storage, &checkpoint_path, healed).map_err(EngineError::io(&checkpoint_path))?;
        let checkpoint = Checkpoint::decode(&bytes).map_err(|error| corrupt_file(&checkpoint_path, error))?;
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let cache = Arc::clone(&shared.cache);
        let io = VolumeIo::new(&storage);
        let rules = LayoutRules::of(meta.layout);
        let index_config = IndexConfig { late_entries: rules.history_at_destage(), ..config.index };
        let index = VersionIndex::open(io.index(), &format!("{dir}/index"), index_config, cache)?;
        let current = match rules.has_current_store() {
            true => Some(CurrentStore::open(&*io.current(), dir, meta.block_size, block_count, OpenMode::Existing)?),
            false => None,
        };
        let history = History::open(&*storage, dir)?;
        index.set_thinning(history.thinning(meta.created));
        let lsn_indexed = index.lsn_indexed();
        // In COW only copy records are indexed: the last may be older.
        if lsn_indexed < checkpoint.lsn && !rules.history_at_destage() {
            return Err(EngineError::Corrupt {
                volume: volume_name,
                detail: format!(
                    "the version index covers the journal up to LSN {lsn_indexed}, but the checkpoint says {}",
                    checkpoint.lsn
                ),
            });
        }
        let mut recovery = Journal::recover(
            io.journal(),
            &format!("{dir}/journal"),
            meta.block_size,
            config.journal,
            checkpoint.replay_from,
            checkpoint.lsn.next(),
            checkpoint.timestamp_last,
        )?;
        let block_bytes = meta.block_size.bytes() as usize;
        let zero_block_crc32c = rewind_format::crc32c(&vec![0u8; block_bytes]);
        let mut timestamp_last = checkpoint.timestamp_last;
        let mut timeline = BTreeMap::new();
        let mut versions = Vec::new();
        let mut metas = Vec::new();
        // COW: writes since the checkpoint go back to the overlay, to be
        // destaged with their copies; its copy records go back to the index.
        let copies_history = rules.history_at_destage();
        let mut recovered = Vec::new();
        // Records that could not be re-applied to the current store (a full
        // disk) wait in the overlay, as COW's do, and the volume is unsettled.
        let mut unsettled = false;
        while let Some(record) = recovery.next_record()? {
            let header = record.header;
            if header.kind == RecordKind::Copy {
                if header.lsn > lsn_indexed {
                    index.insert(header.lsn, &record.copies()?);
                }
                continue;
            }
            let first = header.block_first;
            if first.0 + u64::from(header.block_count) > block_count {
                return Err(EngineError::Corrupt {
                    volume: volume_name,
                    detail: format!("journal record {} addresses blocks past the end of the volume", header.lsn),
                });
            }
            versions.clear();
            metas.clear();
            for index in 0..header.block_count {
                let (data, crc32c, state) = match header.kind {
                    RecordKind::Write => {
                        let offset = record.data_offset() + index * meta.block_size.bytes();
                        (
                            VersionData::Journal { segment: record.segment, offset },
                            record.block_crc(index),
                            BlockState::Data,
                        )
                    }
                    RecordKind::Zero => (VersionData::Zero, zero_block_crc32c, BlockState::Zero),
                    RecordKind::Copy => unreachable!("handled above"),
                    RecordKind::Vouch | RecordKind::Lost => unreachable!("recovery reads these records itself"),
                };
                let block = BlockIndex(first.0 + u64::from(index));
                versions.push(Version { block, timestamp: header.timestamp, data, crc32c });
                metas.push(BlockMeta { state, crc32c, timestamp: header.timestamp });
            }
            // Re-applied (for ROW, an early merge) unless COW must copy first.
            let lsn = header.lsn;
            let pending = |versions: &Vec<Version>| -> Vec<Pending> {
                versions.iter().map(|&version| Pending { lsn, version }).collect()
            };
            match (&current, header.kind) {
                (None, _) => {}
                (Some(_), _) if copies_history || unsettled => recovered.extend(pending(&versions)),
                (Some(current), kind) => {
                    let applied = match kind {
                        RecordKind::Write => current.write_blocks(first, record.data, &metas),
                        _ => current.zero_blocks(first, &metas),
                    };
                    match applied {
                        Ok(()) => {}
                        Err(error) if error.is_transient() => {
                            tracing::warn!(
                                volume = %volume_name, %error,
                                "cannot re-apply the journal to the current store; the rest waits in memory, and \
                                 views wait until it is applied"
                            );
                            unsettled = true;
                            recovered.extend(pending(&versions));
                        }
                        Err(error) => return Err(error),
                    }
                }
            }
            // (A repair may replay from further back than the index covers:
            // what is archived is in archived runs already.)
            if header.lsn > lsn_indexed && !copies_history && header.timestamp >= index.archived_before() {
                index.insert(header.lsn, &versions);
            }
            if header.lsn > history.timeline_lsn() {
                let bytes = u64::from(header.block_count) * block_bytes as u64;
                add_to_timeline(&mut timeline, header.timestamp, header.kind == RecordKind::Zero, bytes);
            }
            timestamp_last = header.timestamp;
        }
        let (journal, report) = recovery.finish()?;
        if lsn_indexed > journal.lsn_durable() {
            return Err(EngineError::Corrupt {
                volume: volume_name,
                detail: format!(
                    "the version index covers LSN {lsn_indexed} but the journal ends at {}",
                    journal.lsn_durable()
                ),
            });
        }
        if report.records_replayed > 0 {
            tracing::info!(volume = %meta.name, records = report.records_replayed, "recovered volume from its journal");
        }
        if let Some(dropped) = &report.dropped {
            let lsn = dropped.lsn_first;
            let bytes = dropped.bytes;
            let reason = &dropped.reason;
            match dropped.whole {
                true => tracing::warn!(
                    volume = %meta.name, lsn_from = %lsn, bytes, %reason,
                    "dropped the end of the journal: a record there was whole but failed its checks, which could \
                     be a torn write or damage, and no later record vouched for it"
                ),
                false => tracing::info!(
                    volume = %meta.name, lsn_from = %lsn, bytes, %reason,
                    "dropped a torn write from the end of the journal"
                ),
            }
        }
        let recovered = Recovered { timestamp_last, pending: recovered, dropped: report.dropped, unsettled };
        let parts = Parts { journal, index, current, history, io };
        let volume = Volume::assemble(storage, dir, meta, config, parts, checkpoint, shared, recovered);
        debug_assert_eq!(volume.zero_block_crc32c, zero_block_crc32c);
        volume.write.lock().timeline_unsaved = timeline;
        // Make the replay durable so the next start need not repeat it. In
        // COW that destages, which copies into the chunk store: the node
        // does it once the store has counted its references. On a full disk
        // it waits: recovery itself needs no new space.
        if !volume.rules().history_at_destage() {
            if let Err(error) = volume.checkpoint(timestamp_last) {
                if !error.is_transient() {
                    return Err(error);
                }
                tracing::warn!(volume = %volume.name(), %error, "cannot checkpoint after recovery yet; maintenance tries again");
            }
        }
        Ok(Arc::new(volume))
    }

    pub fn name(&self) -> &rewind_types::VolumeName {
        &self.meta.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.meta.size_bytes
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
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_room()?;
        {
            let mut state = self.write.lock();
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
        if self.journal.bytes_unwritten() >= self.config.unwritten_bytes_max {
            self.flush()?;
        }
        if self.overlay_versions.load(Ordering::Relaxed) >= self.config.overlay_versions_max {
            self.flush()?;
            self.destage_durable()?;
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
            self.record_versions(state, appended.lsn, record_bytes as u64, false);
        }
        Ok(())
    }

    /// Files the versions of record `lsn` (in `state.versions`) in the index,
    /// the overlay and the timeline.
    fn record_versions(&self, state: &mut WriteState, lsn: Lsn, journal_bytes: u64, zero: bool) {
        let versions = std::mem::take(&mut state.versions);
        let first = versions.first().expect("records cover blocks");
        if !self.rules().history_at_destage() {
            self.index.insert(lsn, &versions);
        }
        if self.current.is_some() {
            for version in &versions {
                state.overlay.entry(version.block.0).or_default().push(Pending { lsn, version: *version });
            }
            self.overlay_versions.fetch_add(versions.len(), Ordering::Relaxed);
        }
        if let Some(cache) = &mut state.cache {
            for version in &versions {
                let block = version.block.0;
                let outcome = cache.write(block, ());
                // Dirty again: what it was let go with is superseded in the overlay.
                state.let_go.remove(&block);
                state.let_go.extend(outcome.destaged.iter().map(|&(destaged, ())| destaged));
            }
        }
        let bytes = versions.len() as u64 * u64::from(self.meta.block_size.bytes());
        add_to_timeline(&mut state.timeline_unsaved, first.timestamp, zero, bytes);
        self.counters.journal_bytes_appended.fetch_add(journal_bytes, Ordering::Relaxed);
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
                self.write(now, offset + done, &zeros[..step as usize], Durability::Buffered)?;
                done += step;
            }
            return self.after_write(durability);
        }
        if offset < whole_first {
            self.write(now, offset, &vec![0u8; (whole_first - offset) as usize], Durability::Buffered)?;
        }
        let mut block = whole_first / block_bytes;
        let block_end = whole_end / block_bytes;
        while block < block_end {
            let count = (block_end - block).min(ZERO_RECORD_BLOCKS_MAX);
            // Between records: a huge range stays within the memory bounds.
            self.check_room()?;
            {
                let mut state = self.write.lock();
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
                self.record_versions(&mut state, appended.lsn, RECORD_HEADER_BYTES as u64, true);
            }
            block += count;
            self.after_write(Durability::Buffered)?;
        }
        if whole_end < end {
            self.write(now, whole_end, &vec![0u8; (end - whole_end) as usize], Durability::Buffered)?;
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
            self.work.notify();
        }
        Ok(())
    }

    /// Makes every write that completed before this call durable.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.check_writable()?;
        self.journal.commit().map_err(|error| self.fail(error.into()))?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Copies the newest durable version of every overlay block into the
    /// current store and retires what it copied.
    pub(crate) fn destage_durable(&self) -> Result<(), EngineError> {
        self.destage(false)
    }

    /// Destages as [`Volume::destage_durable`] does, but (with
    /// `cached_only`) only the blocks the controller cache has let go —
    /// the least recently written beyond its dirty limit — so overwrites of
    /// the blocks it keeps are absorbed.
    fn destage(&self, cached_only: bool) -> Result<(), EngineError> {
        let (lsn_durable, _) = self.journal.durable_point();
        let mut destage = self.destage.lock();
        if self.current.is_none() {
            // Logging: the index is the present; nothing is destaged.
            destage.lsn_applied = destage.lsn_applied.max(lsn_durable);
            return Ok(());
        }
        if destage.lsn_applied >= lsn_durable && self.overlay_versions.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let copies = self.rules().history_at_destage();
        let (mut newest, mut chains): (Vec<Pending>, Vec<Vec<Pending>>) = {
            let mut state = self.write.lock();
            if !cached_only {
                // Everything leaves: the cache is clean again.
                if let Some(cache) = &mut state.cache {
                    cache.flush();
                }
                state.let_go.clear();
            }
            let blocks: Vec<&smallvec::SmallVec<[Pending; 1]>> = match cached_only {
                true => state.let_go.iter().filter_map(|block| state.overlay.get(block)).collect(),
                false => state.overlay.values().collect(),
            };
            let durable = |pending: &&smallvec::SmallVec<[Pending; 1]>| -> Vec<Pending> {
                pending.iter().take_while(|entry| entry.lsn <= lsn_durable).copied().collect()
            };
            let newest = blocks
                .iter()
                .filter_map(|pending| pending.iter().rev().find(|entry| entry.lsn <= lsn_durable).copied())
                .collect();
            let chains = match copies {
                true => blocks.iter().map(durable).filter(|chain| !chain.is_empty()).collect(),
                false => Vec::new(),
            };
            (newest, chains)
        };
        newest.sort_unstable_by_key(|pending| pending.version.block);
        chains.sort_unstable_by_key(|chain| chain[0].version.block);
        let let_go = self.file_history(&chains).map_err(|error| self.fail(error))?;
        if self.rules().current_writes == CurrentWrites::EveryVersionLetGo {
            // Every version let go goes down to the current store too, in order.
            for wave in waves(let_go) {
                self.apply_to_current(&wave).map_err(|error| self.fail(error))?;
            }
        }
        self.apply_to_current(&newest).map_err(|error| self.fail(error))?;
        if !cached_only {
            destage.lsn_applied = destage.lsn_applied.max(lsn_durable);
        }
        // Retired before `destage` is let go, so no other pass (a bookmark's
        // merge, a writer's backpressure) applies or files them again.
        let mut state = self.write.lock();
        let mut retired = 0;
        for applied in &newest {
            let block = applied.version.block.0;
            let pending = state.overlay.get_mut(&block).expect("only the destager removes overlay entries");
            let keep_from = pending.iter().position(|entry| entry.lsn > applied.lsn).unwrap_or(pending.len());
            retired += keep_from;
            pending.drain(..keep_from);
            if pending.is_empty() {
                state.overlay.remove(&block);
                state.let_go.remove(&block);
            }
        }
        self.overlay_versions.fetch_sub(retired, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `versions` (sorted by block) to the current store, coalescing
    /// neighbours whose journal bytes are contiguous.
    fn apply_to_current(&self, versions: &[Pending]) -> Result<(), EngineError> {
        const RUN_BYTES_MAX: usize = 8 << 20;
        let current = self.current.as_ref().expect("only layouts with a current store have an overlay");
        let block_bytes = self.meta.block_size.bytes();
        let mut buffer = Vec::new();
        let mut metas = Vec::new();
        let mut start = 0;
        while start < versions.len() {
            let first = versions[start].version;
            let mut end = start + 1;
            while end < versions.len() && (end - start) * (block_bytes as usize) < RUN_BYTES_MAX {
                let previous = versions[end - 1].version;
                let next = versions[end].version;
                let adjacent = next.block.0 == previous.block.0 + 1;
                let contiguous = match (previous.data, next.data) {
                    (VersionData::Zero, VersionData::Zero) => true,
                    (
                        VersionData::Journal { segment: a, offset: x },
                        VersionData::Journal { segment: b, offset: y },
                    ) => a == b && y == x + block_bytes,
                    _ => false,
                };
                if !(adjacent && contiguous) {
                    break;
                }
                end += 1;
            }
            let run = &versions[start..end];
            metas.clear();
            metas.extend(run.iter().map(|pending| BlockMeta {
                state: match pending.version.data {
                    VersionData::Zero => BlockState::Zero,
                    VersionData::Journal { .. } | VersionData::Chunk(_) => BlockState::Data,
                },
                crc32c: pending.version.crc32c,
                timestamp: pending.version.timestamp,
            }));
            match first.data {
                VersionData::Zero => current.zero_blocks(first.block, &metas)?,
                VersionData::Chunk(_) => unreachable!("the overlay holds versions in the journal"),
                VersionData::Journal { segment, offset } => {
                    buffer.resize(run.len() * block_bytes as usize, 0);
                    self.journal.read(segment, u64::from(offset), &mut buffer)?;
                    for (pending, block) in run.iter().zip(buffer.chunks_exact(block_bytes as usize)) {
                        if rewind_format::crc32c(block) != pending.version.crc32c {
                            return Err(EngineError::Corrupt {
                                volume: self.meta.name.to_string(),
                                detail: format!(
                                    "journal data of block {} (written at LSN {}) fails its checksum",
                                    pending.version.block, pending.lsn
                                ),
                            });
                        }
                    }
                    current.write_blocks(first.block, &buffer, &metas)?;
                }
            }
            start = end;
        }
        Ok(())
    }

    /// Background work, called periodically by the embedder: commits buffered
    /// writes, destages, writes and merges index runs, checkpoints. Returns
    /// whether it did anything.
    pub fn maintain(&self, now: Timestamp) -> Result<bool, EngineError> {
        let mut maintenance = self.maintenance.lock();
        if self.closed.load(Ordering::Acquire) || self.is_poisoned() {
            return Ok(false);
        }
        let mut worked = false;
        if self.journal.bytes_unwritten() >= self.config.commit_bytes_soft {
            // Hand the bytes to the kernel early; the commit below waits less.
            self.journal.write_out().map_err(|error| self.fail(error.into()))?;
            worked = true;
        }
        if self.journal.lsn_durable() < Lsn(self.journal.lsn_next().0 - 1) {
            let seen = *maintenance.undurable_since.get_or_insert(now);
            if now.unix_nanos().saturating_sub(seen.unix_nanos()) >= self.config.commit_interval_nanos {
                self.flush()?;
                maintenance.undurable_since = None;
                worked = true;
            }
        } else {
            maintenance.undurable_since = None;
        }
        worked |= self.vouch_when_quiet(&mut maintenance, now)?;
        let merge_due = self.merge_due(&maintenance, now);
        if self.overlay_versions.load(Ordering::Relaxed) > 0 && merge_due {
            let before = self.overlay_versions.load(Ordering::Relaxed);
            self.destage(self.rules().has_controller_cache())?;
            maintenance.merged_at = now;
            worked |= self.overlay_versions.load(Ordering::Relaxed) < before;
        }
        if self.index.active_len() >= self.config.memtable_versions_max {
            self.index.seal();
        }
        worked |= self.persist_index(self.journal.lsn_durable())? > 0;
        let lsn_last = Lsn(self.journal.lsn_next().0 - 1);
        let journal_bytes = self.counters.journal_bytes_appended.load(Ordering::Relaxed);
        let since = now.unix_nanos().saturating_sub(maintenance.checkpoint_last.unix_nanos());
        // A checkpoint destages everything: in ROW, a merge, so only at a
        // snapshot, unless the journal since the last one grows too long.
        let due = (since >= self.config.checkpoint_interval_nanos && merge_due)
            || journal_bytes - maintenance.checkpoint_journal_bytes >= self.config.checkpoint_journal_bytes;
        if lsn_last > maintenance.checkpoint_lsn && due {
            drop(maintenance);
            self.checkpoint(now)?;
            let replay_segment = self.maintenance.lock().replay_segment;
            self.reclaim_journal(replay_segment)?;
            worked = true;
        }
        Ok(worked)
    }

    /// Has the journal vouch for its last records once nothing has been
    /// made durable for `vouch_after_nanos` (see `rewind_journal`): damage
    /// to an acknowledged write is then told from a torn one after a crash.
    fn vouch_when_quiet(&self, maintenance: &mut MaintenanceState, now: Timestamp) -> Result<bool, EngineError> {
        let lsn_durable = self.journal.lsn_durable();
        if maintenance.quiet.0 != lsn_durable {
            maintenance.quiet = (lsn_durable, now);
            return Ok(false);
        }
        let quiet_nanos = now.unix_nanos().saturating_sub(maintenance.quiet.1.unix_nanos());
        if self.config.vouch_after_nanos == 0 || quiet_nanos < self.config.vouch_after_nanos {
            return Ok(false);
        }
        self.journal.vouch().map_err(|error| self.fail(error.into()))
    }

    /// Records a failure of this volume's work at `now`; returns whether to
    /// log it: the first time, when it changes, and once a minute while it
    /// lasts (a full disk fails every pass until it is freed).
    pub(crate) fn note_fault(&self, error: &EngineError, now: Timestamp) -> bool {
        const RELOG_NANOS: u64 = 60_000_000_000;
        let what = error.to_string();
        let mut fault = self.fault.lock();
        let since = fault.as_ref().filter(|known| known.what == what).map_or(now, |known| known.since);
        // Remembered across passes that work in between (a full disk fails
        // only the passes that need space): logged once a minute at most.
        let mut logged = self.fault_logged.lock();
        let quiet = logged
            .as_ref()
            .is_some_and(|(text, at)| *text == what && now.unix_nanos().saturating_sub(at.unix_nanos()) < RELOG_NANOS);
        *fault = Some(Fault { what: what.clone(), since });
        if quiet {
            return false;
        }
        *logged = Some((what, now));
        true
    }

    /// The work that failed succeeded: the volume is well again.
    pub(crate) fn clear_fault(&self) {
        if let Some(fault) = self.fault.lock().take() {
            tracing::debug!(volume = %self.name(), failing = %fault.what, "volume works again");
        }
    }

    /// Views wait while recovery is unfinished (see `settled`): the first
    /// checkpoint after a crash could not yet be made (a full disk).
    pub(crate) fn check_settled(&self) -> Result<(), EngineError> {
        if self.settled.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(EngineError::RecoveryPending { volume: self.name().to_string() })
    }

    /// Recovery could not finish (its first checkpoint failed for a full
    /// disk); see `settled`.
    pub(crate) fn unsettle(&self) {
        self.settled.store(false, Ordering::Release);
    }

    /// The transient failure the volume's work is meeting now, if any, and
    /// since when: it retries by itself.
    pub fn fault(&self) -> Option<(String, Timestamp)> {
        self.fault.lock().as_ref().map(|fault| (fault.what.clone(), fault.since))
    }

    /// What recovery cut off the journal's end when the volume was opened.
    pub fn journal_tail_dropped(&self) -> Option<&rewind_journal::DroppedTail> {
        self.recovered.as_ref()
    }

    /// Whether recovery has finished (see `settled`): views are served.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Why the volume refuses writes until restart, if it does.
    pub fn poison_cause(&self) -> Option<String> {
        self.poisoned.lock().clone()
    }

    /// Whether versions may be destaged now. Continuously, but in ROW only
    /// at snapshots: with a granularity g the source is merged once a
    /// window ends (every window end is a snapshot), at every write's
    /// granularity at every pass.
    fn merge_due(&self, maintenance: &MaintenanceState, now: Timestamp) -> bool {
        if !self.rules().destages_at_snapshots() {
            return true;
        }
        let window = self.granularity_nanos();
        window == 0 || now.unix_nanos() / window > maintenance.merged_at.unix_nanos() / window
    }

    /// The slow background work on history, called periodically by the
    /// embedder on a thread of its own so that it never delays commits:
    /// merges index runs, applies retention and the space cap, archives
    /// history into the chunk store and gives journal space back. Returns
    /// whether it did anything.
    pub fn maintain_history(&self, now: Timestamp) -> Result<bool, EngineError> {
        let mut work = self.history_work.lock();
        if self.closed.load(Ordering::Acquire) || self.is_poisoned() {
            return Ok(false);
        }
        let mut worked = self.releasing(|| self.index.compact())?;
        let retention_due = self.history.retention_clock().saturating_add_nanos(self.config.retention_interval_nanos);
        if now >= retention_due {
            worked |= self.apply_retention(now)?;
        }
        if now >= work.space_checked.saturating_add_nanos(self.config.retention_interval_nanos) {
            work.space_checked = now;
            worked |= self.apply_space_cap(now)?;
        }
        if self.archive_due(&work, now) {
            work.archive_last = now;
            worked |= self.archive(now)?;
            let replay_segment = self.maintenance.lock().replay_segment;
            worked |= self.reclaim_journal(replay_segment)?;
        }
        Ok(worked)
    }

    /// Makes everything derived from the journal durable up to the records
    /// appended so far, so recovery can start after them.
    pub fn checkpoint(&self, now: Timestamp) -> Result<(), EngineError> {
        let mut maintenance = self.maintenance.lock();
        let (lsn, replay_from, timestamp_last, timeline) = {
            let mut state = self.write.lock();
            self.index.seal();
            let lsn = Lsn(self.journal.lsn_next().0 - 1);
            let timeline = std::mem::take(&mut state.timeline_unsaved);
            (lsn, self.journal.position_next(), state.timestamp_last, timeline)
        };
        let derived_durable = (|| {
            self.journal.commit()?;
            self.destage_durable()?;
            self.persist_index(lsn)?;
            let destage = self.destage.lock();
            assert!(destage.lsn_applied >= lsn, "destaged through the sealed LSN");
            if let Some(current) = &self.current {
                current.sync()?;
            }
            self.history.save_timeline(lsn, &timeline)
        })();
        if let Err(error) = derived_durable {
            // A failure that passes (a full disk): the activity is saved by
            // the next checkpoint, with what comes meanwhile.
            crate::history::merge_buckets(&mut self.write.lock().timeline_unsaved, timeline);
            return Err(self.fail(error));
        }
        write_checkpoint(&*self.storage, &self.dir, &Checkpoint { lsn, replay_from, timestamp_last })
            .map_err(|error| self.fail(error))?;
        if !self.settled.swap(true, Ordering::AcqRel) {
            tracing::info!(volume = %self.name(), "recovery finished: views are served again");
        }
        maintenance.checkpoint_last = now;
        maintenance.merged_at = now;
        maintenance.checkpoint_lsn = lsn;
        maintenance.replay_segment = replay_from.segment;
        maintenance.checkpoint_journal_bytes = self.counters.journal_bytes_appended.load(Ordering::Relaxed);
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
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

/// `versions` (several per block, oldest first) as rounds of at most one per
/// block, sorted by block: the order in which they may be written.
fn waves(versions: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut rounds: Vec<Vec<Pending>> = Vec::new();
    let mut seen: FxHashMap<u64, usize> = FxHashMap::default();
    for pending in versions {
        let round = seen.entry(pending.version.block.0).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(pending);
        *round += 1;
    }
    for round in &mut rounds {
        round.sort_unstable_by_key(|pending| pending.version.block);
    }
    rounds
}

/// Bytes of a write record's CRC array for `data_bytes` of blocks.
fn crcs_len(data_bytes: usize, block_bytes: u32) -> usize {
    (data_bytes / block_bytes as usize * 4).next_multiple_of(8)
}

fn corrupt_file(path: &str, error: rewind_format::FormatError) -> EngineError {
    EngineError::Corrupt {
        volume: path.split('/').nth(1).unwrap_or(path).to_owned(),
        detail: format!("{path}: {error}"),
    }
}

fn write_checkpoint(storage: &dyn Storage, dir: &str, checkpoint: &Checkpoint) -> Result<(), EngineError> {
    let path = format!("{dir}/checkpoint");
    write_file_atomic(storage, &path, &checkpoint.encode()).map_err(EngineError::io(&path))
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
