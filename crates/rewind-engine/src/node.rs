//! A node: one data directory holding volumes and the chunk store they
//! share (deduplication works across all of a node's volumes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use rewind_chunks::retention::Retention;
use rewind_chunks::tiered::{TierConfig, TierStats, TieredPackStore};
use rewind_chunks::{
    ChunkError, ChunkStats, ChunkStore, ChunkStoreConfig, CollectPhase, CollectReport, Counting, LocalPackStore,
    MetaStore, PackStore,
};
use rewind_format::meta::{Layout, RetentionTier, VolumeBase, VolumeKind, VolumeMeta, VolumePolicy};
use rewind_format::tree::{TREE_BLOCK_BYTES, TREE_VOLUME_BYTES};
use rewind_index::{PageCache, PageCacheStats};
use rewind_io::{CountingStorage, IoStats, Storage};
use rewind_journal::RecentMemory;
use rewind_types::{BlockSize, Timestamp, VolumeName};

use crate::catalog::Catalogs;
use crate::group::GroupState;
use crate::layout::LayoutRules;
use crate::pool::Pool;
use crate::reserve::{Reserve, SpaceGauge, SpaceReport, SpaceState};
use crate::volume::{Base, Shared, Work};
use crate::{Clock, EngineError, InUse, PromoteReport, Volume, VolumeConfig};

#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    pub volume: VolumeConfig,
    /// Memory for cached version index pages, shared by all volumes.
    pub index_cache_bytes: u64,
    /// Memory the volumes' journals keep what they wrote in until it is
    /// destaged, shared by all volumes (see `rewind_journal::RecentMemory`).
    pub journal_memory_bytes: u64,
    pub chunks: ChunkStoreConfig,
    /// Collect garbage in the chunk store at most this often (nanoseconds),
    /// when there is any.
    pub collect_interval_nanos: u64,
    /// Free space client writes leave alone (see [`Reserve`]).
    pub reserve: Reserve,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            volume: VolumeConfig::default(),
            index_cache_bytes: 64 << 20,
            journal_memory_bytes: 1 << 30,
            chunks: ChunkStoreConfig::default(),
            collect_interval_nanos: 300_000_000_000,
            reserve: Reserve::default(),
        }
    }
}

/// What to create.
#[derive(Clone, Debug)]
pub struct VolumeSpec {
    pub name: VolumeName,
    pub size_bytes: u64,
    pub block_size: BlockSize,
    /// Protection granularity (0 = every write); see [`Volume::set_policy`].
    pub granularity_nanos: u64,
    /// Retention tiers (empty: forever); see [`Volume::set_policy`].
    pub retention: Vec<RetentionTier>,
    /// The most bytes history may take (0: no cap); see [`Volume::set_policy`].
    pub space_max_bytes: u64,
    /// Where writes go (see [`Layout`]); fixed at creation.
    pub layout: Layout,
    /// The controller cache of split-stream, split-down-stream and
    /// checkpointing volumes (0: 64 MiB); only for those layouts.
    pub cache_bytes: u64,
    /// A block volume, or a file tree's (see [`VolumeSpec::tree`]).
    pub kind: VolumeKind,
}

impl VolumeSpec {
    /// A volume in the default layout that keeps every write forever, with
    /// no space cap; set the rest with struct update syntax.
    pub fn new(name: VolumeName, size_bytes: u64, block_size: BlockSize) -> VolumeSpec {
        VolumeSpec {
            name,
            size_bytes,
            block_size,
            granularity_nanos: 0,
            retention: Vec::new(),
            space_max_bytes: 0,
            layout: Layout::Journaled,
            cache_bytes: 0,
            kind: VolumeKind::Blocks,
        }
    }

    /// The volume of a file tree (`rewind_format::tree`): logging layout
    /// (no current store: the tree's address space is sparse), 4 KiB blocks,
    /// 2^60 bytes.
    pub fn tree(name: VolumeName) -> VolumeSpec {
        let block_size = BlockSize::new(TREE_BLOCK_BYTES as u32).expect("a block size");
        VolumeSpec {
            layout: Layout::Logging,
            kind: VolumeKind::Tree,
            ..VolumeSpec::new(name, TREE_VOLUME_BYTES, block_size)
        }
    }
}

/// Whether deleting a volume that has clones deletes them too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clones {
    /// Refuse, naming them.
    Refuse,
    /// Delete them (and their clones) first.
    Delete,
}

/// The controller cache of a volume with one, created without a size.
pub const CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Wakes the embedder's maintenance loop when there is work to do.
#[derive(Default)]
pub struct WorkSignal {
    pending: Mutex<bool>,
    condvar: Condvar,
}

impl WorkSignal {
    pub fn notify(&self) {
        *self.pending.lock() = true;
        self.condvar.notify_one();
    }

    /// Waits until notified or `timeout` passes; returns whether notified.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut pending = self.pending.lock();
        if !*pending {
            self.condvar.wait_for(&mut pending, timeout);
        }
        std::mem::take(&mut *pending)
    }
}

/// The base a clone described by `meta` reads from, lent by the open
/// volume it names (`None` for a volume that is not a clone).
/// Where the clones among `metas` of the volume `name` start (their base
/// points, while lent).
pub(crate) fn branch_points<'a>(name: &str, metas: impl IntoIterator<Item = &'a VolumeMeta>) -> Vec<Timestamp> {
    let lent = metas.into_iter().filter_map(VolumeMeta::lent_base);
    lent.filter(|base| base.volume.as_str() == name).map(|base| base.at).collect()
}

pub(crate) fn lend_base(
    volumes: &BTreeMap<String, Arc<Volume>>,
    damaged: &BTreeMap<String, DamagedVolume>,
    meta: &VolumeMeta,
) -> Result<Option<Base>, EngineError> {
    let Some(base) = meta.lent_base() else {
        return Ok(None);
    };
    let name = base.volume.as_str();
    match volumes.get(name) {
        Some(volume) => Ok(Some(volume.lend_again(&meta.name, base.at))),
        None => Err(EngineError::Corrupt {
            volume: meta.name.to_string(),
            detail: match damaged.get(name) {
                Some(_) => format!("it is a clone of volume {name}, which is damaged: repair {name} first"),
                None => format!("it is a clone of volume {name}, which is missing"),
            },
        }),
    }
}

impl DamagedVolume {
    /// What is known of the volume `name` that failed to open with `error`.
    fn new(storage: &dyn Storage, name: &str, error: &EngineError) -> DamagedVolume {
        let path = format!("{}/volume.meta", volume_dir(name));
        let meta = rewind_io::read_file(storage, &path).ok().and_then(|bytes| VolumeMeta::decode(&bytes).ok());
        DamagedVolume { name: name.to_owned(), meta, problem: error.to_string(), holds_branch_point: false }
    }

    /// An open volume taken out of service because of `problem`.
    pub(crate) fn of(volume: &Volume, problem: String) -> DamagedVolume {
        let name = volume.name().to_string();
        DamagedVolume { name, meta: Some(volume.meta()), problem, holds_branch_point: false }
    }

    /// Lets go of the branch point this damaged clone held on its base
    /// (see [`hold_damaged_branch_points`]): it is deleted, or repaired and
    /// then holds it as every open clone does.
    pub(crate) fn release_branch_point(&mut self, volumes: &BTreeMap<String, Arc<Volume>>) {
        if !std::mem::take(&mut self.holds_branch_point) {
            return;
        }
        let base = self.meta.as_ref().and_then(VolumeMeta::lent_base).expect("only a clone holds a branch point");
        let volume = volumes.get(base.volume.as_str()).expect("a base holding a branch point is open");
        volume.release_time(base.at);
    }
}

/// The volume `base` is set aside: what it held for its damaged clones
/// went with it (a repair opens it afresh, and holds them again).
pub(crate) fn base_set_aside(base: &str, damaged: &mut BTreeMap<String, DamagedVolume>) {
    for damage in damaged.values_mut() {
        let lent = damage.meta.as_ref().and_then(VolumeMeta::lent_base);
        if lent.is_some_and(|lent| lent.volume.as_str() == base) {
            damage.holds_branch_point = false;
        }
    }
}

/// A damaged clone is not lent its base, which must still keep its clock
/// past the branch point (see `Volume::lend_again`) and the branch point
/// exact for the clone's repair: each damaged clone whose base is open
/// holds it there, once. Called whenever a volume becomes damaged or a base
/// opens again; what a base held goes with it when it is set aside.
pub(crate) fn hold_damaged_branch_points(
    volumes: &BTreeMap<String, Arc<Volume>>,
    damaged: &mut BTreeMap<String, DamagedVolume>,
) {
    for damage in damaged.values_mut().filter(|damage| !damage.holds_branch_point) {
        let Some(base) = damage.meta.as_ref().and_then(VolumeMeta::lent_base) else { continue };
        if let Some(volume) = volumes.get(base.volume.as_str()) {
            volume.advance_clock(base.at);
            volume.hold_again(base.at);
            damage.holds_branch_point = true;
        }
    }
}

pub(crate) const VOLUMES_DIR: &str = "volumes";
/// EFBIG.
const FILE_TOO_LARGE: i32 = 27;
pub(crate) const CHUNKS_DIR: &str = "chunks";
/// A volume size the 64-bit byte offsets of NBD and the formats can address.
const VOLUME_BYTES_MAX: u64 = 1 << 60;

/// A volume that could not be opened: not served, shown with what is wrong
/// so that an operator can repair or delete it (the node serves the others).
#[derive(Clone, Debug)]
pub struct DamagedVolume {
    pub name: String,
    /// What it is, if its metadata could be read.
    pub meta: Option<VolumeMeta>,
    /// What stopped it opening.
    pub problem: String,
    /// A clone whose branch point its open base holds for it.
    holds_branch_point: bool,
}

pub struct Node {
    pub(crate) storage: Arc<dyn Storage>,
    /// Counts the chunk store's device I/O: the history's data.
    chunk_io: Arc<CountingStorage>,
    pub(crate) config: NodeConfig,
    pub(crate) shared: Shared,
    pub(crate) volumes: RwLock<BTreeMap<String, Arc<Volume>>>,
    /// Volumes that did not open. While there are any, the chunks their
    /// history refers to are uncounted, so nothing is collected.
    pub(crate) damaged: RwLock<BTreeMap<String, DamagedVolume>>,
    /// The consistency groups (see `crate::group`).
    pub(crate) groups: Mutex<GroupState>,
    /// Serialises creating, deleting and repairing volumes, and changing
    /// which volumes are in which group.
    pub(crate) admin: Mutex<()>,
    collect_last: Mutex<Option<Timestamp>>,
    /// When the journals' idle spare buffers were last given back.
    spares_released_last: Mutex<Timestamp>,
    /// The packs' two tiers, when they go to a bucket.
    pub(crate) tiered: Option<Arc<TieredPackStore>>,
    /// Since when each pack waiting for its upload has been seen waiting.
    upload_waiting_since: Mutex<BTreeMap<u64, Timestamp>>,
    /// The node's catalogs in the bucket, when it has one.
    pub(crate) catalogs: Option<Catalogs>,
    /// See [`Bucket::alert_after_nanos`].
    bucket_alert_after_nanos: u64,
}

/// Where a node's packs go beyond its disk (see [`Node::open_with_bucket`]).
pub struct Bucket {
    pub packs: Arc<dyn PackStore>,
    pub tier: TierConfig,
    /// Where the node's catalogs go (see `crate::catalog`).
    pub meta: Arc<dyn MetaStore>,
    /// The bucket's object lock, if it holds what is written
    /// (`rewind_chunks::retention`): extended after each catalog.
    pub retention: Option<Arc<dyn Retention>>,
    /// History waiting this long (nanoseconds) for its upload is an alert
    /// (see [`Node::bucket_alert`]).
    pub alert_after_nanos: u64,
    /// The node's place among others sharing the bucket (`crate::pool`):
    /// `meta` is then its own directory of the bucket, and `tier.node`
    /// its number.
    pub pool: Option<Pool>,
}

pub(crate) fn volume_dir(name: &str) -> String {
    format!("{VOLUMES_DIR}/{name}")
}

impl Node {
    /// Opens (creating if needed) the data directory behind `storage` and
    /// recovers every volume in it, then counts the chunks their history
    /// refers to. A volume that does not open is set aside as damaged (see
    /// [`Node::damaged_volumes`]) and the others are served; history that
    /// refers to a chunk that is damaged or missing fails only the reads
    /// that need it (see [`Volume::history_damage`]).
    pub fn open(storage: Arc<dyn Storage>, config: NodeConfig) -> Result<Node, EngineError> {
        Node::open_with_bucket(storage, config, None)
    }

    /// Opens the node as [`Node::open`] does, its packs tiered to `bucket`
    /// if given: sealed here, uploaded by [`Node::maintain_bucket`], and
    /// evicted locally beyond the tier's budget (see `rewind_chunks::tiered`).
    pub fn open_with_bucket(
        storage: Arc<dyn Storage>,
        config: NodeConfig,
        bucket: Option<Bucket>,
    ) -> Result<Node, EngineError> {
        storage.create_dir_all(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))?;
        storage.sync_dir("").map_err(EngineError::io("."))?;
        let chunk_io = Arc::new(CountingStorage::new(Arc::clone(&storage)));
        let packs_dir = format!("{CHUNKS_DIR}/packs");
        let local: Arc<dyn PackStore> = Arc::new(
            LocalPackStore::open(Arc::clone(&chunk_io) as Arc<dyn Storage>, &packs_dir)
                .map_err(EngineError::io(&packs_dir))?,
        );
        let bucket_alert_after_nanos = bucket.as_ref().map_or(u64::MAX, |bucket| bucket.alert_after_nanos);
        let node_number = bucket.as_ref().map_or(0, |bucket| bucket.tier.node);
        if let Some(pool) = bucket.as_ref().and_then(|bucket| bucket.pool.as_ref()) {
            assert_eq!(pool.number, node_number, "the pool's node number is the tier's");
        }
        let config = NodeConfig { chunks: ChunkStoreConfig { node: node_number, ..config.chunks }, ..config };
        let (tiered, catalogs) = match bucket {
            None => (None, None),
            Some(bucket) => {
                let tiered = TieredPackStore::open(local.clone(), bucket.packs, bucket.tier)
                    .map_err(EngineError::io(&packs_dir))?;
                (Some(Arc::new(tiered)), Some(Catalogs::new(bucket.meta, bucket.retention, bucket.pool)))
            }
        };
        let packs = tiered.clone().map_or(local, |tiered| tiered as Arc<dyn PackStore>);
        let chunks = Arc::new(ChunkStore::open_with_packs(
            Arc::clone(&chunk_io) as Arc<dyn Storage>,
            CHUNKS_DIR,
            config.chunks,
            packs,
        )?);
        let shared = Shared {
            cache: PageCache::new(config.index_cache_bytes),
            chunks: Arc::clone(&chunks),
            work: Arc::new(WorkSignal::default()),
            journal_work: Arc::new(WorkSignal::default()),
            space: Arc::new(SpaceGauge::default()),
            passes_wanted: Arc::default(),
            clock: Arc::default(),
            journal_memory: RecentMemory::new(config.journal_memory_bytes),
        };
        let space = storage.space().map_err(EngineError::io("."))?;
        if let (_, SpaceState::Exhausted | SpaceState::Low) = shared.space.update(space, config.reserve) {
            let report = shared.space.report();
            tracing::warn!(
                free_bytes = report.free_bytes,
                reserve_bytes = report.reserve_bytes,
                "the data directory's filesystem is nearly full"
            );
        }
        // Before the volumes: their shares of group bookmarks are held as they open.
        let groups = GroupState::open(&*storage)?;
        let mut volumes = BTreeMap::new();
        let mut damaged = BTreeMap::new();
        let mut unopened = Vec::new();
        for name in storage.list_dir(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))? {
            if name.starts_with('.') {
                // Not a volume (no volume name starts with a dot): a size probe left by a crash.
                let path = volume_dir(&name);
                storage.remove_file(&path).map_err(EngineError::io(&path))?;
                continue;
            }
            let dir = volume_dir(&name);
            let meta = format!("{dir}/volume.meta");
            if !storage.exists(&meta).map_err(EngineError::io(&meta))? {
                tracing::warn!(volume = %name, "removing a volume whose creation did not finish");
                storage.remove_dir_all(&dir).map_err(EngineError::io(&dir))?;
                storage.sync_dir(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))?;
                continue;
            }
            unopened.push(name);
        }
        let metas: Vec<VolumeMeta> =
            unopened.iter().filter_map(|name| Volume::read_meta(&*storage, &volume_dir(name)).ok()).collect();
        // Bases before their clones: each round opens the volumes whose base
        // is open (or that are not clones); a volume whose metadata cannot
        // be read opens at once, to be set aside with what is wrong.
        while !unopened.is_empty() {
            let waits_for_base = |name: &String| -> bool {
                let meta = Volume::read_meta(&*storage, &volume_dir(name));
                let meta = meta.ok();
                let base = meta.as_ref().and_then(VolumeMeta::lent_base).map(|base| base.volume.to_string());
                base.is_some_and(|base| unopened.contains(&base) && !volumes.contains_key(&base))
            };
            let (waiting, ready): (Vec<String>, Vec<String>) = unopened.iter().cloned().partition(waits_for_base);
            // A cycle, which only damaged metadata can make, opens anyway and fails.
            let (ready, waiting) = if ready.is_empty() { (waiting, Vec::new()) } else { (ready, waiting) };
            for name in ready {
                let dir = volume_dir(&name);
                let lend = |meta: &VolumeMeta| lend_base(&volumes, &damaged, meta);
                // Kept exact through the recovery's own checkpoint: its
                // clones' branch points, and its shares of group bookmarks
                // (one a crash left unsaved is held only after the open).
                let mut pins = branch_points(&name, &metas);
                pins.extend(groups.points_of(&name));
                match Volume::open(Arc::clone(&storage), &dir, config.volume, &shared, &lend, &pins) {
                    Ok(volume) => {
                        groups.hold_shares_lacking(&volume);
                        volumes.insert(name, volume);
                    }
                    Err(error) => {
                        let damage = DamagedVolume::new(&*storage, &name, &error);
                        tracing::error!(volume = %name, problem = %damage.problem, "volume is damaged; serving the others");
                        damaged.insert(name, damage);
                    }
                }
            }
            unopened = waiting;
        }
        // Before anything below thins history.
        hold_damaged_branch_points(&volumes, &mut damaged);
        let history = damaged.is_empty().then(|| describe_history(&volumes));
        let counted = history.as_ref().is_some_and(|history| chunks.resume_counts(history));
        let mut missing_by_volume = Vec::new();
        for volume in volumes.values().filter(|_| !counted) {
            let mut missing = Vec::new();
            let counted = volume.mark_chunks(&mut |id, raw_bytes| {
                if let Err(error) = chunks.mark(id, raw_bytes) {
                    missing.push(error.to_string());
                }
            });
            if let Err(error) = counted {
                // Its history cannot be read to the end: uncounted, like a damaged volume's.
                let problem = format!("its version index cannot be read: {error}");
                tracing::error!(volume = %volume.name(), %problem, "volume is damaged; serving the others");
                damaged.insert(volume.name().to_string(), DamagedVolume::of(volume, problem));
            }
            missing_by_volume.push((volume.name().to_string(), missing));
        }
        for name in damaged.keys() {
            volumes.remove(name);
        }
        let report = if counted {
            rewind_chunks::OpenReport::default()
        } else {
            let counting = if damaged.is_empty() { Counting::Exact } else { Counting::Conservative };
            chunks.finish_open(counting)?
        };
        for (name, missing) in missing_by_volume {
            if let (Some(volume), Some(first)) = (volumes.get(&name), missing.first()) {
                tracing::error!(volume = %name, count = missing.len(), first = %first, "history refers to chunks the store lacks");
                volume.note_history_damage(&format!(
                    "{} archived versions refer to chunks the store lacks ({first})",
                    missing.len()
                ));
            }
        }
        if !report.missing.is_empty() {
            let missing: rustc_hash::FxHashSet<u64> = report.missing.iter().map(|(id, _)| id.0).collect();
            for volume in volumes.values() {
                volume.attribute_missing_chunks(&missing, &report.missing)?;
            }
        }
        for volume in volumes.values().filter(|volume| volume.rules().history_at_destage()) {
            match volume.checkpoint(volume.timestamp_last()) {
                Ok(()) => {}
                Err(error) if error.is_transient() => {
                    tracing::warn!(volume = %volume.name(), %error, "cannot finish recovery yet; maintenance tries again");
                    volume.unsettle();
                }
                Err(error) => {
                    let problem = format!("recovery failed: {error}");
                    damaged.insert(volume.name().to_string(), DamagedVolume::of(volume, problem));
                }
            }
        }
        for name in damaged.keys() {
            volumes.remove(name);
        }
        // The clones of what was set aside since.
        hold_damaged_branch_points(&volumes, &mut damaged);
        let groups = Mutex::new(groups);
        let node = Node {
            storage,
            chunk_io,
            config,
            shared,
            volumes: RwLock::new(volumes),
            damaged: RwLock::new(damaged),
            groups,
            admin: Mutex::new(()),
            collect_last: Mutex::new(None),
            spares_released_last: Mutex::default(),
            tiered,
            upload_waiting_since: Mutex::new(BTreeMap::new()),
            catalogs,
            bucket_alert_after_nanos,
        };
        node.finish_groups();
        Ok(node)
    }

    /// Gives the node the embedder's clock, so that an archive pass pauses
    /// while a volume is read right after a burst of writes (see
    /// `VolumeConfig::burst_reads_nanos`); without one, passes never pause.
    /// Once: later calls change nothing.
    pub fn set_clock(&self, clock: Arc<dyn Clock>) {
        let _ = self.shared.clock.set(clock);
    }

    /// Calls `waker` whenever a pack is sealed and waits for its upload (the
    /// embedder's uploaders: see [`Node::maintain_bucket`]). Nothing without
    /// a bucket.
    pub fn wake_on_sealed(&self, waker: rewind_chunks::tiered::Waker) {
        if let Some(tiered) = &self.tiered {
            tiered.wake_on_sealed(waker);
        }
    }

    /// Uploads every pack waiting for its upload, then evicts uploaded packs
    /// beyond the local tier's budget; the embedder calls it from threads
    /// of its own (several may upload at once). Does nothing without a
    /// bucket. A failure (the bucket does not answer) is returned and the
    /// work is tried again by the next call.
    pub fn maintain_bucket(&self, now: Timestamp) -> Result<bool, EngineError> {
        let Some(tiered) = &self.tiered else { return Ok(false) };
        // Filing history at destage has no clock of its own (`Volume::archive` has).
        self.shared.chunks.expire_peers(now.unix_nanos());
        let mut worked = false;
        self.note_waiting(tiered, now);
        // Small packs go at the next catalog, put together (`publish_catalog`).
        while let Some(_pack) = tiered.upload_next_large().map_err(EngineError::io("the bucket"))? {
            worked = true;
        }
        // The present's packs, evicted before they were known to be (`keep_present_local`).
        while let Some(_pack) = tiered.fetch_next_kept().map_err(EngineError::io("the bucket"))? {
            worked = true;
        }
        worked |= tiered.evict().map_err(EngineError::io("the local pack cache"))? > 0;
        self.note_waiting(tiered, now);
        Ok(worked)
    }

    /// Remembers since when each pack waiting for its upload has been seen
    /// waiting (at most one upload pass after it was sealed).
    fn note_waiting(&self, tiered: &TieredPackStore, now: Timestamp) {
        let waiting = tiered.waiting();
        let mut since = self.upload_waiting_since.lock();
        since.retain(|pack, _| waiting.contains(pack));
        for pack in waiting {
            since.entry(pack).or_insert(now);
        }
    }

    /// What the local tier and the bucket hold, and what waits for its
    /// upload; `None` without a bucket.
    pub fn bucket_stats(&self) -> Option<TierStats> {
        self.tiered.as_ref().map(|tiered| tiered.stats())
    }

    /// How long the oldest pack waiting for its upload has waited at `now`
    /// (nanoseconds; 0 when none waits): the archived history a lost disk
    /// would take with it is that old at most. `None` without a bucket.
    pub fn bucket_upload_lag_nanos(&self, now: Timestamp) -> Option<u64> {
        self.tiered.as_ref()?;
        let since = self.upload_waiting_since.lock();
        let oldest = since.values().min().copied();
        Some(oldest.map_or(0, |oldest| now.unix_nanos().saturating_sub(oldest.unix_nanos())))
    }

    /// An alert when history has waited for its upload longer than the
    /// bucket's `alert_after_nanos`: a lost disk now would lose it. `None`
    /// otherwise, and without a bucket.
    pub fn bucket_alert(&self, now: Timestamp) -> Option<String> {
        let lag = self.bucket_upload_lag_nanos(now)?;
        let stats = self.bucket_stats()?;
        (lag >= self.bucket_alert_after_nanos).then(|| {
            format!(
                "history has waited {:.0} s for the bucket ({} bytes in {} packs): a lost disk would lose it; is the \
                 bucket reachable, are the credentials right? (the log says what failed)",
                lag as f64 / 1e9,
                stats.upload_waiting_bytes,
                stats.upload_waiting_packs
            )
        })
    }

    /// Volumes that did not open, with what is wrong.
    pub fn damaged_volumes(&self) -> Vec<DamagedVolume> {
        self.damaged.read().values().cloned().collect()
    }

    /// Free space on the data directory's filesystem against the reserve,
    /// as of the last maintenance pass.
    pub fn space(&self) -> SpaceReport {
        self.shared.space.report()
    }

    pub fn create_volume(&self, spec: VolumeSpec, now: Timestamp) -> Result<Arc<Volume>, EngineError> {
        let block_bytes = u64::from(spec.block_size.bytes());
        if spec.size_bytes == 0 || !spec.size_bytes.is_multiple_of(block_bytes) || spec.size_bytes > VOLUME_BYTES_MAX {
            return Err(EngineError::InvalidArgument(format!(
                "a volume's size must be a positive multiple of its block size ({block_bytes} bytes) \
                 and at most {VOLUME_BYTES_MAX} bytes; {} is not",
                spec.size_bytes
            )));
        }
        let rules = LayoutRules::of(spec.layout);
        let tree = VolumeSpec::tree(spec.name.clone());
        if spec.kind == VolumeKind::Tree
            && (spec.layout, spec.size_bytes, spec.block_size, spec.cache_bytes)
                != (tree.layout, tree.size_bytes, tree.block_size, 0)
        {
            return Err(EngineError::InvalidArgument(
                "a file tree's volume is made by VolumeSpec::tree (logging layout, 4 KiB blocks, 2^60 bytes)".into(),
            ));
        }
        if spec.cache_bytes > 0 && !rules.has_controller_cache() {
            return Err(EngineError::InvalidArgument(format!(
                "a controller cache size is for the layouts with one ({}), not {}",
                LayoutRules::names_where(LayoutRules::has_controller_cache),
                spec.layout.name()
            )));
        }
        RetentionTier::check_new(&spec.retention, spec.granularity_nanos).map_err(|reason| {
            EngineError::InvalidArgument(format!(
                "retention {} does not fit: {reason}",
                crate::timespec::display_retention(&spec.retention)
            ))
        })?;
        let meta = VolumeMeta {
            name: spec.name,
            size_bytes: spec.size_bytes,
            block_size: spec.block_size,
            created: now,
            layout: spec.layout,
            cache_bytes: match spec.cache_bytes {
                0 if rules.has_controller_cache() => CACHE_BYTES_DEFAULT,
                bytes => bytes,
            },
            base: None,
            kind: spec.kind,
        };
        let policy = VolumePolicy::new(spec.granularity_nanos, spec.retention, spec.space_max_bytes, now);
        self.install(meta, policy, |_| Ok(None))
    }

    /// Creates the volume `name`, a writable clone of `source` as it was at
    /// exactly `at` (an exact point of its history, see
    /// [`Volume::resolve_time`]): nothing is copied, so it is immediate
    /// whatever the size and history. It starts with the source's size,
    /// block size, layout, granularity, retention and space cap.
    pub fn clone_volume(
        &self,
        source: &str,
        at: Option<Timestamp>,
        name: VolumeName,
        now: Timestamp,
    ) -> Result<Arc<Volume>, EngineError> {
        let source = self.volume(source)?;
        let meta = VolumeMeta { name, base: None, created: now, ..source.meta() };
        let policy =
            VolumePolicy::new(source.granularity_nanos(), source.retention(), source.space_max_bytes(), meta.created);
        self.install(meta, policy, |meta| {
            // Under the admin lock: the source cannot be deleted meanwhile.
            if !self.volumes.read().values().any(|open| Arc::ptr_eq(open, &source)) {
                return Err(EngineError::VolumeNotFound(source.name().to_string()));
            }
            let base = source.lend(&meta.name, at, now)?;
            // The clone begins once its base point is past (a point made now
            // is after every write so far, which may be stamped ahead of `now`).
            meta.created = meta.created.max(base.origin().at);
            meta.base = Some(base.origin());
            Ok(Some(base))
        })
    }

    /// Detaches the clone `name` from its base: copies the base's branch
    /// point into the clone (reporting progress as bytes gone through of
    /// the volume's size) while the clone serves as before, then makes the
    /// copy its base. Afterwards the base can be deleted; the clone's
    /// contents, views and history are unchanged. See `volume/promote.rs`.
    pub fn promote_volume(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<PromoteReport, EngineError> {
        let volume = self.volume(name)?;
        let promoting = volume.start_promote()?;
        let (copy, bytes_copied) = volume.copy_base(&promoting, progress)?;
        let base = copy.origin().clone();
        // Under the admin lock: not deleted meanwhile, and a delete of the
        // base after this sees a volume that no longer reads from it.
        let _admin = self.admin.lock();
        if !self.volumes.read().get(name).is_some_and(|open| Arc::ptr_eq(open, &volume)) {
            return Err(EngineError::VolumeNotFound(name.to_owned()));
        }
        volume.adopt_base_copy(&promoting, copy)?;
        tracing::info!(volume = name, base = %base.volume, bytes_copied, "promoted: the clone has its own copy of its base");
        Ok(PromoteReport { base, bytes_copied })
    }

    /// Creates the directory of a new volume described by `meta` and
    /// serves it; `lend` gives a clone its base once the name is known free.
    fn install(
        &self,
        meta: VolumeMeta,
        policy: VolumePolicy,
        lend: impl FnOnce(&mut VolumeMeta) -> Result<Option<Base>, EngineError>,
    ) -> Result<Arc<Volume>, EngineError> {
        if let Some(refusal) = self.shared.space.refusal() {
            return Err(EngineError::NoSpace { volume: meta.name.to_string(), detail: refusal });
        }
        let _admin = self.admin.lock();
        let name = meta.name.to_string();
        if self.volumes.read().contains_key(&name) || self.damaged.read().contains_key(&name) {
            return Err(EngineError::VolumeExists(name));
        }
        if self.is_group(&name) {
            return Err(EngineError::InvalidArgument(format!(
                "a group is named {name}; a volume needs a name of its own"
            )));
        }
        let mut meta = meta;
        let base = lend(&mut meta)?;
        let dir = volume_dir(&name);
        if self.storage.exists(&dir).map_err(EngineError::io(&dir))? {
            self.storage.remove_dir_all(&dir).map_err(EngineError::io(&dir))?;
        }
        if LayoutRules::of(meta.layout).has_current_store() {
            self.check_file_size(meta.size_bytes)?;
        }
        let created =
            Volume::create(Arc::clone(&self.storage), &dir, meta, policy, self.config.volume, &self.shared, base);
        let volume = match created {
            Ok(volume) => volume,
            Err(error) => {
                // Nothing is left behind (a full disk part-way, say).
                if let Err(cleanup) = self.storage.remove_dir_all(&dir) {
                    tracing::warn!(%dir, %cleanup, "cannot remove a volume whose creation failed");
                }
                return Err(error);
            }
        };
        self.storage.sync_dir(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))?;
        self.volumes.write().insert(name, Arc::clone(&volume));
        Ok(volume)
    }

    /// Refuses a volume larger than the filesystem lets one file be, before
    /// anything is created: a sparse file of that size is made and removed.
    fn check_file_size(&self, size_bytes: u64) -> Result<(), EngineError> {
        let probe = format!("{VOLUMES_DIR}/.size-probe");
        if self.storage.exists(&probe).map_err(EngineError::io(&probe))? {
            self.storage.remove_file(&probe).map_err(EngineError::io(&probe))?;
        }
        let file = self.storage.open_file(&probe, rewind_io::OpenMode::CreateNew).map_err(EngineError::io(&probe))?;
        let sized = file.set_len(size_bytes);
        drop(file);
        self.storage.remove_file(&probe).map_err(EngineError::io(&probe))?;
        match sized {
            Ok(()) => Ok(()),
            Err(error)
                if error.raw_os_error() == Some(FILE_TOO_LARGE) || error.kind() == std::io::ErrorKind::FileTooLarge =>
            {
                Err(EngineError::InvalidArgument(format!(
                    "a volume of {size_bytes} bytes is larger than the data directory's filesystem allows one \
                     file to be ({error}); pick a smaller size or a filesystem with larger files (ext4 allows \
                     16 TiB, XFS 8 EiB)"
                )))
            }
            Err(error) => Err(EngineError::Io { path: probe, source: error }),
        }
    }

    /// Deletes a volume and all its history. With clients attached (see
    /// [`Volume::attach`]) it refuses, naming them, unless forced; forced,
    /// they get errors from then on.
    pub fn delete_volume(&self, name: &str, in_use: InUse, clones: Clones) -> Result<(), EngineError> {
        let _admin = self.admin.lock();
        // Clones of clones first, so no volume goes before one reading from it.
        let doomed = match clones {
            Clones::Refuse => {
                let dependents = self.clones_of(name);
                if !dependents.is_empty() {
                    return Err(EngineError::HasClones { volume: name.to_owned(), clones: dependents });
                }
                vec![name.to_owned()]
            }
            Clones::Delete => {
                let mut doomed = self.clones_and_theirs(name);
                doomed.insert(0, name.to_owned());
                doomed.reverse();
                doomed
            }
        };
        if in_use == InUse::Refuse {
            for doomed in &doomed {
                let clients = self.volumes.read().get(doomed).map(|volume| volume.clients()).unwrap_or_default();
                if !clients.is_empty() {
                    return Err(EngineError::InUse { volume: doomed.clone(), clients });
                }
            }
        }
        for doomed in doomed {
            self.delete_one(&doomed)?;
        }
        Ok(())
    }

    /// The volumes, open or damaged, that are clones of `name` (and read
    /// from it: a promoted clone does not).
    /// The clones of `name`, their clones, and so on: what deleting it
    /// with `Clones::Delete` deletes with it, bases before their clones.
    pub fn clones_and_theirs(&self, name: &str) -> Vec<String> {
        let mut all = self.clones_of(name);
        let mut next = 0;
        while next < all.len() {
            let theirs = self.clones_of(&all[next]);
            all.extend(theirs);
            next += 1;
        }
        all
    }

    fn clones_of(&self, name: &str) -> Vec<String> {
        let reads = |base: Option<&VolumeBase>| base.is_some_and(|base| !base.copied && base.volume.as_str() == name);
        let open = self.volumes.read();
        let open = open.values().filter(|volume| reads(volume.base().as_ref())).map(|volume| volume.name().to_string());
        let damaged = self.damaged.read();
        let damaged = damaged.values().filter(|damage| reads(damage.meta.as_ref().and_then(|meta| meta.base.as_ref())));
        open.chain(damaged.map(|damage| damage.name.clone())).collect()
    }

    /// Deletes one volume no other reads from (the caller holds `admin`).
    fn delete_one(&self, name: &str) -> Result<(), EngineError> {
        self.leave_group(name)?;
        if self.damaged.read().contains_key(name) {
            // Nothing of it is open, and its references were never counted.
            self.remove_volume_dir(name)?;
            let volumes = self.volumes.read();
            if let Some(mut damage) = self.damaged.write().remove(name) {
                damage.release_branch_point(&volumes);
            }
            return Ok(());
        }
        let volume = self.volume(name)?;
        volume.close();
        // Its chunks may be collected once the volume is gone; should the
        // deletion not complete, the next start counts them again.
        volume.release_all()?;
        self.volumes.write().remove(name);
        self.remove_volume_dir(name)
    }

    fn remove_volume_dir(&self, name: &str) -> Result<(), EngineError> {
        let dir = volume_dir(name);
        // Removing volume.meta first makes the deletion atomic: a crash
        // part-way leaves an unfinished volume, which opening removes.
        let meta = format!("{dir}/volume.meta");
        if self.storage.exists(&meta).map_err(EngineError::io(&meta))? {
            self.storage.remove_file(&meta).map_err(EngineError::io(&meta))?;
            self.storage.sync_dir(&dir).map_err(EngineError::io(&dir))?;
        }
        self.storage.remove_dir_all(&dir).map_err(EngineError::io(&dir))?;
        self.storage.sync_dir(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))
    }

    pub fn volume(&self, name: &str) -> Result<Arc<Volume>, EngineError> {
        if let Some(volume) = self.volumes.read().get(name) {
            return Ok(Arc::clone(volume));
        }
        match self.damaged.read().get(name) {
            Some(damage) => Err(EngineError::Damaged { volume: name.to_owned(), problem: damage.problem.clone() }),
            None => Err(EngineError::VolumeNotFound(name.to_owned())),
        }
    }

    pub fn volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes.read().values().cloned().collect()
    }

    /// One round of the quick background work on every volume (commits,
    /// destaging, index runs, checkpoints; see [`Volume::maintain`]). A
    /// volume that fails is poisoned (and logged) without stopping work on
    /// the others; the first error is returned.
    pub fn maintain(&self, now: Timestamp) -> Result<bool, EngineError> {
        self.measure_space();
        self.release_idle_journal_memory(now);
        let waiting = self.volumes().iter().map(|volume| volume.history_waiting_bytes()).sum();
        self.shared.space.set_history_waiting(waiting);
        self.for_each_volume(now, Work::Maintenance, |volume| volume.maintain(now))
    }

    /// Gives back the journals' spare batch buffers that no batch took
    /// within the last minute or so (see `RecentMemory::release_idle_spares`).
    fn release_idle_journal_memory(&self, now: Timestamp) {
        /// A burst's buffers are kept at least this long for the next burst.
        const SPARES_KEPT_NANOS: u64 = 60_000_000_000;
        let mut last = self.spares_released_last.lock();
        if now.unix_nanos().saturating_sub(last.unix_nanos()) >= SPARES_KEPT_NANOS {
            self.shared.journal_memory.release_idle_spares();
            *last = now;
        }
    }

    /// Measures the free space against the reserve, logging when that
    /// changes (see `crate::reserve`).
    fn measure_space(&self) {
        let space = match self.storage.space() {
            Ok(space) => space,
            Err(error) => {
                tracing::warn!(%error, "cannot measure the data directory's free space");
                return;
            }
        };
        let (before, after) = self.shared.space.update(space, self.config.reserve);
        if before == after {
            return;
        }
        let report = self.shared.space.report();
        let (free, reserve) = (report.free_bytes, report.reserve_bytes);
        match after {
            SpaceState::Exhausted => tracing::error!(
                free_bytes = free,
                reserve_bytes = reserve,
                "free space is below the reserve: writes to volumes are refused (ENOSPC) until space is freed"
            ),
            SpaceState::Low => tracing::warn!(
                free_bytes = free,
                reserve_bytes = reserve,
                "free space is low: less than twice the reserve; writes are refused below the reserve"
            ),
            SpaceState::Ok => {
                tracing::info!(free_bytes = free, reserve_bytes = reserve, "free space is back above twice the reserve")
            }
        }
    }

    /// Runs `work` on every volume. A failure fails that volume's work only
    /// (a transient one is retried by the next pass; see
    /// [`Volume::note_fault`] for how often it is logged); the first is
    /// returned.
    fn for_each_volume(
        &self,
        now: Timestamp,
        kind: Work,
        work: impl Fn(&Volume) -> Result<bool, EngineError>,
    ) -> Result<bool, EngineError> {
        let mut worked = false;
        let mut first_error = None;
        for volume in self.volumes() {
            match work(&volume) {
                Ok(did) => {
                    worked |= did;
                    volume.clear_fault(kind);
                }
                Err(error) => {
                    if volume.note_fault(kind, &error, now) {
                        tracing::error!(volume = %volume.name(), %error, "maintenance failed");
                    }
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(worked), Err)
    }

    /// Hands every volume's waiting journal bytes to the disk, once a
    /// commit's worth waits, and commits what has waited undurable for the
    /// commit interval (see [`Volume::write_out_journal`]). Embedders run
    /// it on a thread of its own, woken by [`Node::journal_signal`] and
    /// periodically, so the journal keeps reaching the disk, and durability
    /// its interval, while [`Node::maintain`] is busy destaging: otherwise
    /// writers find its buffer full and write it themselves, a stall of a
    /// whole buffer's write and sync.
    pub fn write_out_journals(&self, now: Timestamp) -> Result<bool, EngineError> {
        self.for_each_volume(now, Work::JournalWriteOut, |volume| volume.write_out_journal(now))
    }

    /// One round of the slow work on history on every volume (see
    /// [`Volume::maintain_history`]), then garbage collection when due.
    /// Embedders run it on a thread of its own, apart from [`Node::maintain`].
    pub fn maintain_history(&self, now: Timestamp) -> Result<bool, EngineError> {
        let mut first_error = None;
        let mut worked =
            self.for_each_volume(now, Work::History, |volume| volume.maintain_history(now)).unwrap_or_else(|error| {
                first_error = Some(error);
                true
            });
        let collect_due = {
            // The first collection comes one interval after the node opened.
            let last = *self.collect_last.lock().get_or_insert(now);
            let since = now.unix_nanos().saturating_sub(last.unix_nanos());
            let interval = self.config.collect_interval_nanos;
            // A repack takes the disk from the volumes written or read at
            // the time (a layout's dead space, rewritten during random writes
            // synced every 8); they keep it waiting, for one more interval at most.
            since >= interval
                && (since >= interval.saturating_mul(2)
                    || !self.volumes().iter().any(|volume| volume.foreground_active(now)))
        };
        let collectable = !self.shared.chunks.is_poisoned() && self.damaged.read().is_empty();
        if collect_due && collectable && self.shared.chunks.collection_due() {
            *self.collect_last.lock() = Some(now);
            match self.collect(&mut |_, _, _| {}) {
                Ok(report) => worked |= report != CollectReport::default(),
                Err(error) => {
                    tracing::error!(%error, "garbage collection failed");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(worked), Err)
    }

    /// Collects garbage in the chunk store now (see [`ChunkStore::collect`]),
    /// counting every reference again first if an earlier failure left the
    /// counts in doubt. Refused while a volume is damaged: the chunks its
    /// history refers to are not counted.
    pub fn collect(&self, progress: &mut dyn FnMut(CollectPhase, u64, u64)) -> Result<CollectReport, EngineError> {
        let damaged: Vec<String> = self.damaged.read().keys().cloned().collect();
        if !damaged.is_empty() {
            return Err(EngineError::CollectionWaits { volumes: damaged });
        }
        let _wanted = self.shared.passes_wanted.hold();
        if self.shared.chunks.recount_pending().is_some() {
            self.recount_chunks()?;
        }
        Ok(self.shared.chunks.collect(progress)?)
    }

    /// Counts every chunk reference of every volume again (see
    /// [`ChunkStore::recount`]).
    pub(crate) fn recount_chunks(&self) -> Result<(), EngineError> {
        // Waits for archive passes to end (a repair's recount too).
        let _wanted = self.shared.passes_wanted.hold();
        let counting = if self.damaged.read().is_empty() { Counting::Exact } else { Counting::Conservative };
        let volumes = self.volumes();
        let report = self.shared.chunks.recount(counting, |mark| {
            for volume in &volumes {
                volume.mark_chunks(mark)?;
            }
            Ok::<(), EngineError>(())
        })?;
        if !report.missing.is_empty() {
            let missing: rustc_hash::FxHashSet<u64> = report.missing.iter().map(|(id, _)| id.0).collect();
            for volume in &volumes {
                volume.attribute_missing_chunks(&missing, &report.missing)?;
            }
        }
        Ok(())
    }

    pub fn chunk_stats(&self) -> ChunkStats {
        self.shared.chunks.stats()
    }

    /// Device I/O of the chunk store (packs, chunk table, dedup index) since the node opened.
    pub fn chunk_io_stats(&self) -> IoStats {
        self.chunk_io.counters().stats()
    }

    /// Checkpoints every healthy volume and writes the dedup index's memory
    /// out (before a clean shutdown).
    pub fn checkpoint_all(&self, now: Timestamp) -> Result<(), EngineError> {
        for volume in self.volumes() {
            if !volume.is_poisoned() {
                volume.checkpoint(now)?;
            }
        }
        match self.shared.chunks.flush_dedup() {
            Ok(()) | Err(ChunkError::Poisoned { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// The node is about to stop: archive passes in progress give up at
    /// their next part instead of finishing (see `PassesWanted::stop`), so
    /// the embedder's background threads end promptly. Call it before
    /// waiting for them; [`Node::shut_down`] follows.
    pub fn stop_passes(&self) {
        self.shared.passes_wanted.stop();
    }

    /// Checkpoints every volume and saves the chunk store's reference
    /// counts so the next start need not count them: the last thing a clean
    /// shutdown does (no archiving or collection can follow). Counts are
    /// not saved while a volume is damaged or poisoned; failing to save them
    /// costs the next start a count, nothing else.
    pub fn shut_down(&self, now: Timestamp) -> Result<(), EngineError> {
        // Saving the counts waits for archive passes to end.
        let _wanted = self.shared.passes_wanted.hold();
        self.checkpoint_all(now)?;
        let volumes = self.volumes.read();
        if !self.damaged.read().is_empty() || volumes.values().any(|volume| volume.is_poisoned()) {
            tracing::info!("not saving the chunk reference counts: a volume is damaged; the next start counts them");
            return Ok(());
        }
        let history = describe_history(&volumes);
        if let Err(error) = self.shared.chunks.save_counts(&history) {
            tracing::warn!(%error, "cannot save the chunk reference counts; the next start counts them");
        }
        Ok(())
    }

    pub fn work_signal(&self) -> Arc<WorkSignal> {
        Arc::clone(&self.shared.work)
    }

    /// What wakes the journals' writer ([`Node::write_out_journals`]):
    /// a volume's journal has a commit's worth of bytes waiting.
    pub fn journal_signal(&self) -> Arc<WorkSignal> {
        Arc::clone(&self.shared.journal_work)
    }

    pub fn page_cache_stats(&self) -> PageCacheStats {
        self.shared.cache.stats()
    }
}

/// What the chunk references of `volumes` are counted from, for the chunk
/// store to compare with what its saved counts were counted from (see
/// `ChunkStore::resume_counts`). Volumes in name order.
fn describe_history(volumes: &BTreeMap<String, Arc<Volume>>) -> Vec<u8> {
    let mut history = Vec::new();
    for volume in volumes.values() {
        volume.describe_chunks(&mut history);
    }
    history
}
