//! Packs on two tiers (issue 14 req 2, MYCDP's Disk_Cache over the cloud,
//! seed 004 §3.2): every pack is written locally and sealed there, then
//! uploaded to a remote store (a bucket) in the background; once uploaded,
//! its local copy may be evicted to keep the local tier under a budget,
//! least recently read first and never the newest packs (recent writes, the
//! history the present and recent views read). Reads of evicted packs are
//! ranged reads of the remote copy, of each aligned 4 MiB window a read
//! covers (those a read needs fetched in parallel, each once however many
//! readers want it), kept in a small in-memory cache of the windows read
//! last. Windows this large keep a restore from the bucket from paying a
//! request per MiB (1 MiB windows restored at 0.8× the speed of 4 MiB ones;
//! bench/restic.py), at the price of 4 MiB fetched for a random 4 KiB read.
//!
//! The upload and the eviction are work the embedder calls
//! ([`TieredPackStore::upload_next`], [`TieredPackStore::evict`]), as the
//! rest of the chunk store's background work: nothing here starts a
//! thread or reads the clock.
//!
//! A pack deleted (a collection rewrote or freed it) leaves the local tier at
//! once, but its remote copy is only *retired*: a node's catalog in the
//! bucket (`rewind_engine::catalog`) may still name it, so it is deleted
//! remotely once a catalog taken after the delete is published
//! ([`TieredPackStore::begin_capture`], [`TieredPackStore::delete_retired`]).
//! A crash forgets what was retired; such a pack is listed again at open, a
//! pack no chunk lives in, and the next collection deletes it again.
//!
//! What is on which tier is found again at open from the two listings: a
//! pack only local is waiting for its upload (one a crash interrupted is
//! uploaded again: a lost reply shows as the pack already there, of the
//! same size); a pack only remote was evicted.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use rewind_io::File;
use rustc_hash::FxHashSet;

use crate::pack_store::{read_then_scatter, Generation, PackStore, PackUpload, StoredPack};
use crate::peers::pack_owner;
use crate::retention::locked;

/// The aligned windows reads from the remote tier fetch whole.
const REMOTE_WINDOW_BYTES: u64 = 4 << 20;
/// How many windows one read fetches at once: ranged GETs in parallel (MYCDP's
/// Recovery_Assembler fetching from the cloud in parallel).
const PARALLEL_FETCHES_MAX: usize = 8;

/// The local tier's budget and what never leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierConfig {
    /// Bytes of packs the local tier keeps at most, once they are uploaded
    /// (packs waiting for their upload stay whatever their size).
    pub cache_bytes_max: u64,
    /// The newest packs are never evicted: the history written last.
    pub newest_kept: usize,
    /// Bytes of remote ranges kept in memory.
    pub memory_bytes_max: usize,
    /// Packs smaller than this wait to go up together
    /// ([`TieredPackStore::upload_next_large`] passes them by): a bucket
    /// is billed, and slowed, by the object.
    pub batch_below_bytes: u64,
    /// This node's number in a bucket shared with other nodes
    /// (`crate::peers`): its packs are the remote tier's packs of that
    /// number; the others' are read (borrowed chunks) but never listed,
    /// evicted or deleted here.
    pub node: u16,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            cache_bytes_max: u64::MAX,
            newest_kept: 4,
            memory_bytes_max: 64 << 20,
            batch_below_bytes: 8 << 20,
            node: 0,
        }
    }
}

/// Where one pack is.
#[derive(Clone, Debug)]
struct Placement {
    bytes: u64,
    generation: Generation,
    local: bool,
    remote: bool,
    /// An upload, a fetch or a delete of it is under way: no other starts.
    busy: bool,
    /// When the pack was last read (a tick of `clock`), for eviction.
    read_at: u64,
    /// Another node's pack, found when first read (`crate::peers`).
    borrowed: bool,
}

/// What the tiers hold and have done, for `rewind stats` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub local_packs: u64,
    pub local_bytes: u64,
    pub remote_packs: u64,
    pub remote_bytes: u64,
    /// Packs (and their bytes) sealed locally and not yet uploaded: what
    /// losing the local disk now would lose.
    pub upload_waiting_packs: u64,
    pub upload_waiting_bytes: u64,
    pub uploads: u64,
    pub uploaded_bytes: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Reads served by the local tier, by the memory cache, by the remote one.
    pub local_reads: u64,
    pub memory_reads: u64,
    pub remote_reads: u64,
    pub remote_read_bytes: u64,
    pub remote_deletes: u64,
    /// Packs deleted here whose remote copies wait (for a catalog, or for
    /// the other nodes sharing the bucket to let them go).
    pub retired_packs: u64,
    /// Packs kept on the local tier whatever the budget (the present's).
    pub kept_packs: u64,
}

#[derive(Default)]
struct Counters {
    uploads: AtomicU64,
    uploaded_bytes: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    local_reads: AtomicU64,
    memory_reads: AtomicU64,
    remote_reads: AtomicU64,
    remote_read_bytes: AtomicU64,
    remote_deletes: AtomicU64,
}

/// A window of a pack read from the remote tier.
struct CachedWindow {
    pack: u64,
    start: u64,
    bytes: Arc<Vec<u8>>,
}

/// The windows read from the remote tier last, newest at the back.
#[derive(Default)]
struct WindowCache {
    windows: VecDeque<CachedWindow>,
    bytes: usize,
}

impl WindowCache {
    fn get(&self, pack: u64, start: u64) -> Option<Arc<Vec<u8>>> {
        let found = self.windows.iter().rev().find(|window| window.pack == pack && window.start == start);
        found.map(|window| Arc::clone(&window.bytes))
    }

    fn insert(&mut self, pack: u64, start: u64, bytes: Arc<Vec<u8>>, max: usize) {
        if bytes.len() > max || self.get(pack, start).is_some() {
            return;
        }
        self.bytes += bytes.len();
        self.windows.push_back(CachedWindow { pack, start, bytes });
        while self.bytes > max {
            let oldest = self.windows.pop_front().expect("over budget means not empty");
            self.bytes -= oldest.bytes.len();
        }
    }

    fn forget(&mut self, pack: u64) {
        self.windows.retain(|window| window.pack != pack);
        self.bytes = self.windows.iter().map(|window| window.bytes.len()).sum();
    }
}

/// Packs on a local and a remote tier; see the module documentation.
pub struct TieredPackStore {
    local: Arc<dyn PackStore>,
    remote: Arc<dyn PackStore>,
    config: TierConfig,
    placements: Arc<Mutex<BTreeMap<u64, Placement>>>,
    /// Signalled when a pack stops being busy (`Placement::busy`).
    unbusied: Condvar,
    memory: Mutex<WindowCache>,
    /// Windows being fetched from the remote tier: a reader that needs one
    /// waits for it (`fetched`) rather than fetching it again.
    fetching: Mutex<FxHashSet<(u64, u64)>>,
    fetched: Condvar,
    clock: AtomicU64,
    counters: Counters,
    /// Packs deleted here whose remote copies wait for a catalog taken
    /// after their deletion.
    retired: Mutex<Vec<Retired>>,
    /// Counts catalog captures (see [`TieredPackStore::begin_capture`]).
    epoch: AtomicU64,
    /// Told whenever a pack is sealed locally: it waits for its upload.
    waker: Arc<Mutex<Option<Waker>>>,
    /// Packs the embedder keeps on the local tier whatever the budget
    /// ([`TieredPackStore::keep_local`]).
    kept: Mutex<FxHashSet<u64>>,
}

/// A pack deleted here, not yet from the remote tier.
#[derive(Clone, Copy, Debug)]
struct Retired {
    pack: u64,
    /// The capture epoch it was deleted in.
    epoch: u64,
    /// Whether it was in the bucket when deleted here.
    uploaded: bool,
    /// When a catalog taken after it was first published (the caller's clock).
    published_at: Option<u64>,
}

/// What [`TieredPackStore::wake_on_sealed`] calls.
pub type Waker = Box<dyn Fn() + Send + Sync>;

impl TieredPackStore {
    /// The two tiers, with what each holds found from their listings.
    pub fn open(
        local: Arc<dyn PackStore>,
        remote: Arc<dyn PackStore>,
        config: TierConfig,
    ) -> io::Result<TieredPackStore> {
        let mut placements = BTreeMap::new();
        for stored in remote.list()?.into_iter().filter(|stored| pack_owner(stored.pack) == config.node) {
            placements.insert(stored.pack, Placement::of(&stored, false, true));
        }
        for stored in local.list()? {
            let placement = placements.entry(stored.pack).or_insert_with(|| Placement::of(&stored, true, false));
            if placement.remote && placement.bytes != stored.bytes {
                let message = format!(
                    "pack {} is {} bytes here and {} bytes in {}: two writers share the bucket",
                    local.locate(stored.pack),
                    stored.bytes,
                    placement.bytes,
                    remote.locate(stored.pack)
                );
                return Err(io::Error::new(io::ErrorKind::InvalidData, message));
            }
            placement.local = true;
        }
        let waiting = placements.values().filter(|placement| !placement.remote).count();
        if waiting > 0 {
            tracing::info!(packs = waiting, "packs wait for their upload");
        }
        Ok(TieredPackStore {
            local,
            remote,
            config,
            placements: Arc::new(Mutex::new(placements)),
            unbusied: Condvar::new(),
            memory: Mutex::default(),
            fetching: Mutex::default(),
            fetched: Condvar::new(),
            clock: AtomicU64::new(1),
            counters: Counters::default(),
            retired: Mutex::default(),
            epoch: AtomicU64::new(0),
            waker: Arc::default(),
            kept: Mutex::default(),
        })
    }

    /// Calls `waker` whenever a pack is sealed locally and waits for its
    /// upload: the embedder's uploaders start at once rather than at their
    /// next look.
    pub fn wake_on_sealed(&self, waker: Waker) {
        *self.waker.lock() = Some(waker);
    }

    /// Uploads the oldest pack waiting for its upload, if any; returns it.
    /// Several threads may call it at once: each takes another pack.
    pub fn upload_next(&self) -> io::Result<Option<u64>> {
        self.upload_next_where(|_| true)
    }

    /// Uploads the next pack waiting for its upload that is not small
    /// ([`TierConfig::batch_below_bytes`]): the small ones wait for
    /// [`TieredPackStore::waiting_small`]'s caller to put them together.
    pub fn upload_next_large(&self) -> io::Result<Option<u64>> {
        self.upload_next_where(|placement| placement.bytes >= self.config.batch_below_bytes)
    }

    /// The packs waiting for their upload that are small, in number order.
    pub fn waiting_small(&self) -> Vec<u64> {
        let placements = self.placements.lock();
        let small = |placement: &Placement| {
            placement.local && !placement.remote && !placement.busy && placement.bytes < self.config.batch_below_bytes
        };
        placements.iter().filter(|(_, placement)| small(placement)).map(|(&pack, _)| pack).collect()
    }

    fn upload_next_where(&self, wanted: impl Fn(&Placement) -> bool) -> io::Result<Option<u64>> {
        let pack = {
            let mut placements = self.placements.lock();
            let next = placements
                .iter_mut()
                .find(|(_, placement)| placement.local && !placement.remote && !placement.busy && wanted(placement));
            let Some((&pack, placement)) = next else { return Ok(None) };
            placement.busy = true;
            pack
        };
        let uploaded = self.upload(pack);
        let mut placements = self.placements.lock();
        let placement = placements.get_mut(&pack).expect("a pack being uploaded is not deleted");
        placement.busy = false;
        self.unbusied.notify_all();
        let bytes = uploaded?;
        placement.remote = true;
        self.counters.uploads.fetch_add(1, Ordering::Relaxed);
        self.counters.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(Some(pack))
    }

    /// Copies local pack `pack` to the remote tier; returns its size.
    fn upload(&self, pack: u64) -> io::Result<u64> {
        let bytes = self.local.stat(pack)?.bytes;
        match copy_pack(&*self.local, &*self.remote, pack, bytes) {
            Ok(_) => Ok(bytes),
            // An earlier upload whose reply was lost: there if the same size.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                let there = self.remote.stat(pack)?;
                if there.bytes != bytes {
                    let message = format!(
                        "{} is already there with {} bytes, not {bytes}",
                        self.remote.locate(pack),
                        there.bytes
                    );
                    return Err(io::Error::new(io::ErrorKind::AlreadyExists, message));
                }
                Ok(bytes)
            }
            Err(error) => Err(error),
        }
    }

    /// Keeps `packs` on the local tier from now on, in place of those kept
    /// before, whatever the budget: MYCDP's hot set, the versions the
    /// present reads (the embedder names the packs of the volumes that
    /// read their present from history). Those evicted already come back
    /// with [`TieredPackStore::fetch_next_kept`].
    pub fn keep_local(&self, packs: FxHashSet<u64>) {
        *self.kept.lock() = packs;
    }

    /// Whether the local tier has a budget: whether anything is ever evicted.
    pub fn evicts(&self) -> bool {
        self.config.cache_bytes_max < u64::MAX
    }

    /// Copies back to the local tier one kept pack that is only remote, if
    /// any ([`TieredPackStore::keep_local`]); returns it.
    pub fn fetch_next_kept(&self) -> io::Result<Option<u64>> {
        let kept = self.kept.lock().clone();
        let next = {
            let mut placements = self.placements.lock();
            let next = placements.iter_mut().find(|(pack, placement)| {
                kept.contains(pack) && !placement.local && !placement.borrowed && !placement.busy
            });
            let Some((&pack, placement)) = next else { return Ok(None) };
            placement.busy = true;
            (pack, placement.bytes)
        };
        let (pack, bytes) = next;
        let fetched = copy_pack(&*self.remote, &*self.local, pack, bytes);
        let mut placements = self.placements.lock();
        let placement = placements.get_mut(&pack).expect("a pack being fetched is not deleted");
        placement.busy = false;
        self.unbusied.notify_all();
        fetched?;
        placement.local = true;
        Ok(Some(pack))
    }

    /// Removes the local copies of uploaded packs, least recently read first
    /// and never the newest [`TierConfig::newest_kept`], until the local
    /// tier is within [`TierConfig::cache_bytes_max`]. Returns the bytes freed.
    pub fn evict(&self) -> io::Result<u64> {
        let mut freed = 0;
        loop {
            let victim = {
                let mut placements = self.placements.lock();
                let local_bytes: u64 =
                    placements.values().filter(|placement| placement.local).map(|placement| placement.bytes).sum();
                if local_bytes <= self.config.cache_bytes_max {
                    return Ok(freed);
                }
                let own = placements.iter().filter(|(_, placement)| !placement.borrowed);
                let newest: Vec<u64> = own.rev().take(self.config.newest_kept).map(|(&pack, _)| pack).collect();
                let kept = self.kept.lock();
                let victim = placements
                    .iter()
                    .filter(|(pack, placement)| {
                        placement.local
                            && placement.remote
                            && !placement.busy
                            && !newest.contains(pack)
                            && !kept.contains(pack)
                    })
                    .min_by_key(|(_, placement)| placement.read_at)
                    .map(|(&pack, placement)| (pack, placement.bytes));
                drop(kept);
                // Marked at once: a read from now on goes to the remote
                // copy, and no delete comes in between.
                if let Some((pack, _)) = victim {
                    let placement = placements.get_mut(&pack).expect("listed above");
                    (placement.local, placement.busy) = (false, true);
                }
                victim
            };
            // Whatever is left waits for its upload, or is the newest.
            let Some((pack, bytes)) = victim else { return Ok(freed) };
            let evicted = self.local.delete(pack);
            let mut placements = self.placements.lock();
            let placement = placements.get_mut(&pack).expect("busy while evicted");
            (placement.local, placement.busy) = (evicted.is_err(), false);
            self.unbusied.notify_all();
            drop(placements);
            evicted?;
            freed += bytes;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.counters.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Starts a capture of what the packs hold (a catalog): returns its
    /// epoch. Packs deleted before this call may go from the remote tier
    /// once what was captured is published ([`TieredPackStore::delete_retired`]).
    pub fn begin_capture(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Deletes the remote copies of the packs retired before capture `epoch`
    /// began, once its catalog is published; returns how many. A pack under
    /// object lock stays retired until its hold runs out
    /// (`crate::retention`); any other failure leaves the rest for the next
    /// call.
    pub fn delete_retired(&self, epoch: u64) -> io::Result<usize> {
        self.delete_retired_unless(epoch, 0, |_, _| false)
    }

    /// [`TieredPackStore::delete_retired`], but a pack for which `keep`
    /// says yes stays retired, to be asked about again at the next call:
    /// `keep` is given the pack and when a catalog taken after its retiring
    /// was first published (`now`, of this call or an earlier one) — what
    /// the nodes sharing the bucket decide by (`crate::peers`).
    pub fn delete_retired_unless(&self, epoch: u64, now: u64, keep: impl Fn(u64, u64) -> bool) -> io::Result<usize> {
        let due: Vec<u64> = {
            let mut retired = self.retired.lock();
            for entry in retired.iter_mut().filter(|entry| entry.epoch < epoch) {
                entry.published_at.get_or_insert(now);
            }
            retired
                .iter()
                .filter_map(|entry| {
                    entry.published_at.filter(|&published| !keep(entry.pack, published)).map(|_| entry.pack)
                })
                .collect()
        };
        let mut deleted = 0;
        for &pack in &due {
            match self.remote.delete(pack) {
                Ok(()) => {}
                Err(error) if locked(&error).is_some() => continue,
                Err(error) => return Err(error),
            }
            deleted += 1;
            self.counters.remote_deletes.fetch_add(1, Ordering::Relaxed);
            self.retired.lock().retain(|entry| entry.pack != pack);
        }
        Ok(deleted)
    }

    /// Every pack the tiers hold, in number order.
    pub fn packs(&self) -> Vec<u64> {
        let placements = self.placements.lock();
        placements.iter().filter(|(_, placement)| !placement.borrowed).map(|(&pack, _)| pack).collect()
    }

    /// Whether every pack of `packs` (a capture's) is in the bucket,
    /// or was when it was deleted here (it is kept there while a catalog may
    /// name it): a catalog may name no other. A pack a collection deleted
    /// before its upload is neither.
    pub fn all_uploaded(&self, packs: &[u64]) -> bool {
        let deleted_uploaded: FxHashSet<u64> =
            self.retired.lock().iter().filter(|retired| retired.uploaded).map(|retired| retired.pack).collect();
        let placements = self.placements.lock();
        packs.iter().all(|pack| match placements.get(pack) {
            Some(placement) => placement.remote || placement.borrowed,
            None => deleted_uploaded.contains(pack),
        })
    }

    /// The packs waiting for their upload, oldest first.
    pub fn waiting(&self) -> Vec<u64> {
        let placements = self.placements.lock();
        placements.iter().filter(|(_, placement)| !placement.remote).map(|(&pack, _)| pack).collect()
    }

    pub fn stats(&self) -> TierStats {
        let placements = self.placements.lock();
        let mut stats = TierStats {
            uploads: self.counters.uploads.load(Ordering::Relaxed),
            uploaded_bytes: self.counters.uploaded_bytes.load(Ordering::Relaxed),
            evictions: self.counters.evictions.load(Ordering::Relaxed),
            evicted_bytes: self.counters.evicted_bytes.load(Ordering::Relaxed),
            local_reads: self.counters.local_reads.load(Ordering::Relaxed),
            memory_reads: self.counters.memory_reads.load(Ordering::Relaxed),
            remote_reads: self.counters.remote_reads.load(Ordering::Relaxed),
            remote_read_bytes: self.counters.remote_read_bytes.load(Ordering::Relaxed),
            remote_deletes: self.counters.remote_deletes.load(Ordering::Relaxed),
            retired_packs: self.retired.lock().len() as u64,
            kept_packs: self.kept.lock().len() as u64,
            ..TierStats::default()
        };
        for placement in placements.values().filter(|placement| !placement.borrowed) {
            if placement.local {
                stats.local_packs += 1;
                stats.local_bytes += placement.bytes;
            }
            if placement.remote {
                stats.remote_packs += 1;
                stats.remote_bytes += placement.bytes;
            } else {
                stats.upload_waiting_packs += 1;
                stats.upload_waiting_bytes += placement.bytes;
            }
        }
        stats
    }

    /// Window `start` of `pack` (of `size` bytes) read from the remote tier.
    fn fetch_window(&self, pack: u64, size: u64, start: u64) -> io::Result<Arc<Vec<u8>>> {
        let mut window = vec![0; (REMOTE_WINDOW_BYTES.min(size - start)) as usize];
        self.remote.read(pack, start, &mut window)?;
        self.counters.remote_reads.fetch_add(1, Ordering::Relaxed);
        self.counters.remote_read_bytes.fetch_add(window.len() as u64, Ordering::Relaxed);
        Ok(Arc::new(window))
    }

    /// Reads pack `pack` with `read` from the local copy, if there is one;
    /// `false` if there is none (never was, or evicted since the look-up).
    fn read_local(&self, pack: u64, read: impl FnOnce(&dyn PackStore) -> io::Result<()>) -> io::Result<bool> {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let local = {
            let mut placements = self.placements.lock();
            match placements.get_mut(&pack) {
                Some(placement) => {
                    placement.read_at = tick;
                    placement.local
                }
                None => {
                    drop(placements);
                    self.borrow(pack)?.local
                }
            }
        };
        if !local {
            return Ok(false);
        }
        match read(&*self.local) {
            Ok(()) => {
                self.counters.local_reads.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Reads `buf.len()` bytes at `offset` of `pack` from the remote tier:
    /// each aligned window the range covers is taken from memory, waited
    /// for if another reader is fetching it, or fetched — those this read
    /// fetches, in parallel (up to [`PARALLEL_FETCHES_MAX`] at once).
    fn read_remote(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let size = self.placement(pack)?.bytes;
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
            let message =
                format!("{} bytes at {offset} are past the end of {} ({size} bytes)", buf.len(), self.locate(pack));
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let first = offset / REMOTE_WINDOW_BYTES;
        let last = (offset + buf.len() as u64 - 1) / REMOTE_WINDOW_BYTES;
        let starts: Vec<u64> = (first..=last).map(|window| window * REMOTE_WINDOW_BYTES).collect();
        let mut windows: Vec<Option<Arc<Vec<u8>>>> = vec![None; starts.len()];
        let mut fetched_any = false;
        loop {
            // Cached, or claimed here to be fetched; the rest another reader fetches.
            let mut claimed = Vec::new();
            {
                let memory = self.memory.lock();
                let mut fetching = self.fetching.lock();
                for (index, &start) in starts.iter().enumerate() {
                    if windows[index].is_some() {
                        continue;
                    }
                    if let Some(window) = memory.get(pack, start) {
                        windows[index] = Some(window);
                    } else if fetching.insert((pack, start)) {
                        claimed.push(index);
                    }
                }
                if claimed.is_empty() && windows.iter().any(Option::is_none) {
                    drop(memory);
                    self.fetched.wait(&mut fetching);
                    continue;
                }
            }
            if claimed.is_empty() {
                break;
            }
            fetched_any = true;
            let results: Vec<io::Result<Arc<Vec<u8>>>> = match claimed.len() {
                1 => vec![self.fetch_window(pack, size, starts[claimed[0]])],
                _ => std::thread::scope(|scope| {
                    let mut results = Vec::with_capacity(claimed.len());
                    for batch in claimed.chunks(PARALLEL_FETCHES_MAX) {
                        let handles: Vec<_> = batch
                            .iter()
                            .map(|&index| {
                                let start = starts[index];
                                scope.spawn(move || self.fetch_window(pack, size, start))
                            })
                            .collect();
                        results
                            .extend(handles.into_iter().map(|handle| handle.join().expect("a fetch does not panic")));
                    }
                    results
                }),
            };
            let mut failed = None;
            {
                let mut memory = self.memory.lock();
                let mut fetching = self.fetching.lock();
                for (&index, result) in claimed.iter().zip(results) {
                    fetching.remove(&(pack, starts[index]));
                    match result {
                        Ok(window) => {
                            memory.insert(pack, starts[index], Arc::clone(&window), self.config.memory_bytes_max);
                            windows[index] = Some(window);
                        }
                        Err(error) => failed = Some(error),
                    }
                }
            }
            self.fetched.notify_all();
            if let Some(error) = failed {
                return Err(error);
            }
        }
        if !fetched_any {
            self.counters.memory_reads.fetch_add(1, Ordering::Relaxed);
        }
        let mut copied = 0;
        for (start, window) in starts.iter().zip(windows) {
            let window = window.expect("every window is in hand");
            let from = (offset + copied as u64 - start) as usize;
            let take = (window.len() - from).min(buf.len() - copied);
            buf[copied..copied + take].copy_from_slice(&window[from..from + take]);
            copied += take;
        }
        assert_eq!(copied, buf.len(), "the windows cover the range");
        Ok(())
    }

    fn placement(&self, pack: u64) -> io::Result<Placement> {
        if let Some(placement) = self.placements.lock().get(&pack) {
            return Ok(placement.clone());
        }
        self.borrow(pack)
    }

    /// Another node's pack `pack`, placed on the remote tier when first
    /// asked for; any other pack not placed is on neither tier.
    fn borrow(&self, pack: u64) -> io::Result<Placement> {
        if pack_owner(pack) == self.config.node {
            let message = format!("{} is on neither tier", self.local.locate(pack));
            return Err(io::Error::new(io::ErrorKind::NotFound, message));
        }
        let stored = self.remote.stat(pack)?;
        let placement = Placement { borrowed: true, ..Placement::of(&stored, false, true) };
        Ok(self.placements.lock().entry(pack).or_insert(placement).clone())
    }
}

/// Copies pack `pack` of `bytes` from one tier to the other, 8 MiB at a time.
fn copy_pack(from: &dyn PackStore, to: &dyn PackStore, pack: u64, bytes: u64) -> io::Result<Generation> {
    const PIECE: u64 = 8 << 20;
    let mut copy = to.create(pack)?;
    let mut piece = Vec::new();
    let mut offset = 0;
    while offset < bytes {
        piece.resize(PIECE.min(bytes - offset) as usize, 0);
        from.read(pack, offset, &mut piece)?;
        copy.append(&piece)?;
        offset += piece.len() as u64;
    }
    copy.finish()
}

impl Placement {
    fn of(stored: &StoredPack, local: bool, remote: bool) -> Placement {
        Placement {
            bytes: stored.bytes,
            generation: stored.generation.clone(),
            local,
            remote,
            busy: false,
            read_at: 0,
            borrowed: false,
        }
    }
}

impl TieredPackStore {
    /// Fails with `AlreadyExists` if pack number `pack` is taken: packs are
    /// written once.
    fn refuse_taken(&self, pack: u64) -> io::Result<()> {
        if !self.placements.lock().contains_key(&pack) {
            return Ok(());
        }
        let message = format!("{} already exists; packs are written once", self.locate(pack));
        Err(io::Error::new(io::ErrorKind::AlreadyExists, message))
    }
}

impl PackStore for TieredPackStore {
    fn locate(&self, pack: u64) -> String {
        match self.placements.lock().get(&pack) {
            Some(placement) if !placement.local => self.remote.locate(pack),
            None if pack_owner(pack) != self.config.node => self.remote.locate(pack),
            _ => self.local.locate(pack),
        }
    }

    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>> {
        self.refuse_taken(pack)?;
        let inner = self.local.create(pack)?;
        let (placements, waker) = (Arc::clone(&self.placements), Arc::clone(&self.waker));
        Ok(Box::new(TieredUpload { inner, pack, placements, waker }))
    }

    fn adopt(&self, pack: u64, path: &str, file: &dyn File) -> io::Result<Generation> {
        self.refuse_taken(pack)?;
        let generation = self.local.adopt(pack, path, file)?;
        let stored = self.local.stat(pack)?;
        sealed_locally(&self.placements, &self.waker, &stored);
        Ok(generation)
    }

    fn stat(&self, pack: u64) -> io::Result<StoredPack> {
        let placement = self.placement(pack)?;
        Ok(StoredPack { pack, bytes: placement.bytes, generation: placement.generation })
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.read_local(pack, |local| local.read(pack, offset, buf))? {
            return Ok(());
        }
        // History comes back in the order it was archived: a view reads a
        // pack front to back, a chunk or a span at a time, often from
        // several requests at once; each window is fetched once for them all.
        self.read_remote(pack, offset, buf)
    }

    fn read_vectored(&self, pack: u64, offset: u64, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<()> {
        // Scattered straight from a local copy; a remote one is fetched by
        // windows and copied out.
        if self.read_local(pack, |local| local.read_vectored(pack, offset, bufs))? {
            return Ok(());
        }
        read_then_scatter(|buf| self.read_remote(pack, offset, buf), bufs)
    }

    fn delete(&self, pack: u64) -> io::Result<()> {
        // An upload or a fetch of it under way is waited for (a collection
        // that rewrote the pack must not fail for it), and none starts
        // while it is deleted.
        let placement = {
            let mut placements = self.placements.lock();
            loop {
                let Some(placement) = placements.get_mut(&pack) else { return Ok(()) };
                if !placement.busy {
                    placement.busy = true;
                    break placement.clone();
                }
                self.unbusied.wait(&mut placements);
            }
        };
        self.memory.lock().forget(pack);
        // A borrowed pack's owner deletes it.
        let deleted = if placement.borrowed { Ok(()) } else { self.local.delete(pack) };
        let mut placements = self.placements.lock();
        match deleted {
            Ok(()) => {
                placements.remove(&pack);
            }
            Err(_) => placements.get_mut(&pack).expect("busy while deleted").busy = false,
        }
        self.unbusied.notify_all();
        drop(placements);
        deleted?;
        if !placement.borrowed {
            // Even one never uploaded: an upload whose reply was lost is there.
            let retired = Retired {
                pack,
                epoch: self.epoch.load(Ordering::SeqCst),
                uploaded: placement.remote,
                published_at: None,
            };
            self.retired.lock().push(retired);
        }
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<StoredPack>> {
        let placements = self.placements.lock();
        Ok(placements
            .iter()
            .filter(|(_, placement)| !placement.borrowed)
            .map(|(&pack, placement)| StoredPack {
                pack,
                bytes: placement.bytes,
                generation: placement.generation.clone(),
            })
            .collect())
    }
}

/// Records `stored`, just sealed in the local tier, as waiting for its
/// upload, and wakes the uploaders.
fn sealed_locally(placements: &Mutex<BTreeMap<u64, Placement>>, waker: &Mutex<Option<Waker>>, stored: &StoredPack) {
    placements.lock().insert(stored.pack, Placement::of(stored, true, false));
    if let Some(wake) = &*waker.lock() {
        wake();
    }
}

/// A pack being written to the local tier; once finished it waits for its upload.
struct TieredUpload {
    inner: Box<dyn PackUpload>,
    pack: u64,
    placements: Arc<Mutex<BTreeMap<u64, Placement>>>,
    waker: Arc<Mutex<Option<Waker>>>,
}

impl PackUpload for TieredUpload {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.append(bytes)
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn finish(self: Box<Self>) -> io::Result<Generation> {
        let bytes = self.inner.len();
        let generation = self.inner.finish()?;
        let stored = StoredPack { pack: self.pack, bytes, generation: generation.clone() };
        sealed_locally(&self.placements, &self.waker, &stored);
        Ok(generation)
    }

    fn abort(self: Box<Self>) -> io::Result<()> {
        self.inner.abort()
    }
}
