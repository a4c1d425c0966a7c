//! The node's chunk store: every archived block version's bytes, stored once
//! (MYCDP's Deduplicator, Chunk_Info and Archiver, seed 004 §3.2–3.3).
//!
//! ```text
//! put(bytes) ── BLAKE3 ──► dedup index ── hit ──► count += 1, same id
//!                               └── miss ──► new id, zstd, pack writer
//! finish ──► seal packs ──► table slots ──► fsync table
//! ```
//!
//! **Reference counts live in memory, and are exact.** The version index
//! runs of the volumes are the truth about which chunk ids history refers
//! to; on open, the engine *marks* every id its runs refer to, so the counts
//! start exact, and from then on they change in step with the runs: an
//! archive pass counts its references before its run is written, a merge
//! releases what it drops while it writes the run that no longer refers to
//! it. After a crash they are simply counted again. Counting 10^8 references
//! takes tens of seconds, so a clean shutdown saves them
//! ([`ChunkStore::save_counts`]) and the next open may take them back
//! ([`ChunkStore::resume_counts`]) — only if nothing can have changed since,
//! which `saved.rs` makes sure of.
//!
//! Garbage collection frees the ids whose count is zero and rewrites packs
//! that are mostly dead. It must never free a chunk that a durable run still
//! refers to. Merges release references *before* their new run replaces the
//! old ones durably, so collection waits for every merge in flight: merges
//! hold the *reference gate* shared ([`ChunkStore::hold_references`]),
//! collection holds it exclusively. A merge that fails after releasing may
//! have left counts too low, an archive pass that fails after putting chunks
//! too high: either asks for a *recount* ([`ChunkStore::request_recount`]),
//! and collection refuses to run until the embedder has counted every
//! reference again ([`ChunkStore::recount`]) — online, as opening does.
//!
//! Faults stay small. A failed sync poisons the store (no archiving or
//! collection until restart: the device may have dropped what it was asked
//! to keep); anything else fails only the operation that met it. A full
//! disk fails an archive pass cleanly — its unfinished pack is deleted, the
//! chunks it put are forgotten by the dedup index — and the next pass tries
//! again. Damage is repaired from what is derived from what: a damaged
//! dedup run from the pack footers (the index is rebuilt), a damaged table
//! slot from the footer that lists the id, a pack whose trailer or footer
//! is damaged is read through the table and rewritten by the next
//! collection; a chunk that can be found nowhere is *missing*, which fails
//! only the reads of the history that needs it.
//!
//! Durability order, which recovery relies on:
//! 1. a pack is sealed (fsync, directory fsync) before its chunks' slots are
//!    written; slots are synced before any run refers to their ids;
//! 2. a repack seals the new pack, records a repack intent, rewrites the
//!    moved ids' slots, syncs the table, and only then deletes the old packs;
//!    an intent found on open is completed from the new pack's footer;
//! 3. a pack without a valid trailer can only be the newest, left by a crash
//!    while it was written: nothing refers to it and it is deleted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use rewind_format::chunks::{RepackIntent, SavedCounts, SavedPack, TableSlot};
use rewind_format::crc32c;
use rewind_format::meta::healed;
use rewind_format::pack::{
    ChunkHash, Codec, FooterEntry, FOOTER_ENTRY_BYTES, PACK_HEADER_BYTES, PACK_TRAILER_BYTES, RECORD_HEADER_BYTES,
};
use rewind_io::{read_file_healing, write_file_atomic, OpenMode, Storage};
use rewind_types::ChunkId;
use rustc_hash::FxHashMap;

use crate::dedup::{DedupConfig, DedupIndex};
use crate::locality::{self, LocalityCache};
use crate::pack::record_header_bytes;
use crate::pack_store::{LocalPackStore, PackStore};
use crate::peers::{pack_owner, packs_before, PeerChunks};
use crate::saved::{self, Saved};
use crate::table::ChunkTable;
use crate::{chunk_hash, pack_name, Check, ChunkError, ChunkLocation, Compressor, PackReader, PackWriter};

#[derive(Clone, Copy, Debug)]
pub struct ChunkStoreConfig {
    /// A pack is sealed once it holds about this many bytes.
    pub pack_bytes_target: u64,
    pub dedup: DedupConfig,
    /// Collection rewrites packs whose live chunks take less than this
    /// percentage of their bytes.
    pub repack_live_percent: u64,
    /// Sealed packs kept open for reading: their header and trailer
    /// checked once. A few hundred bytes each; opening one again costs a
    /// stat and two reads, which with 32 kept was 2.2% of a view read's
    /// samples over 410 packs (13 GiB of history).
    pub open_packs_max: usize,
    /// This node's number among the nodes sharing its bucket (0: a bucket of
    /// its own); its packs are numbered under it (`crate::peers`).
    pub node: u16,
}

impl Default for ChunkStoreConfig {
    fn default() -> Self {
        ChunkStoreConfig {
            pack_bytes_target: 32 << 20,
            dedup: DedupConfig::default(),
            repack_live_percent: 50,
            open_packs_max: 4096,
            node: 0,
        }
    }
}

/// `counts[id]` of an id with no chunk (never used, or freed).
const FREE: u32 = u32::MAX;
/// A count that has reached this stays: the chunk is kept for good (a
/// pattern referenced four billion times) rather than the count wrapping.
const STICKY: u32 = u32::MAX - 1;
/// Scratch buffers of `read_many` kept for reuse (the headers, gaps and
/// compressed records of a span: each up to 1 MiB and a record).
const SPARE_SPANS_MAX: usize = 8;
const SLOT_BYTES: u64 = rewind_format::chunks::TABLE_SLOT_BYTES as u64;
/// Table slots read at a time by scans: 1 MiB.
const SCAN_IDS: u64 = 1 << 14;

/// What collection knows of a sealed pack.
#[derive(Clone, Copy, Debug, Default)]
struct PackStats {
    bytes: u64,
    /// Chunks in it that are not free (live or dead), and the bytes they
    /// take: records and footer entries.
    held_chunks: u64,
    held_bytes: u64,
    /// Its trailer or footer is damaged: its chunks are read where the
    /// table says, and collection rewrites it (finding them by the table).
    footer_damaged: bool,
    /// An adopted journal segment ([`ArchiveSession::put_from_journal`]):
    /// its chunks are bare, found by the table as a damaged footer's are.
    adopted: bool,
    /// A record of it failed its check when a repack copied it: it is left
    /// as it is (what of it is whole stays readable, the damaged chunk
    /// fails the reads that need it), and no repack takes it again, so that
    /// collection goes on with the other packs.
    left_damaged: bool,
}

impl PackStats {
    fn new(bytes: u64) -> PackStats {
        PackStats { bytes, held_chunks: 0, held_bytes: 0, footer_damaged: false, adopted: false, left_damaged: false }
    }

    fn hold(&mut self, stored_bytes: u32) {
        self.held_chunks += 1;
        self.held_bytes += footprint(stored_bytes);
    }

    fn free(&mut self, stored_bytes: u32) {
        self.held_chunks -= 1;
        self.held_bytes -= footprint(stored_bytes);
    }

    /// Bytes that hold no chunk: freed records and their footer entries.
    fn slack(&self) -> u64 {
        self.bytes.saturating_sub(PACK_OVERHEAD_BYTES + self.held_bytes)
    }
}

/// A pack's header and trailer.
const PACK_OVERHEAD_BYTES: u64 = (PACK_HEADER_BYTES + PACK_TRAILER_BYTES) as u64;

/// The bytes a chunk of `stored_bytes` takes in a pack: its record and its
/// footer entry.
fn footprint(stored_bytes: u32) -> u64 {
    (RECORD_HEADER_BYTES as u64 + u64::from(stored_bytes)).next_multiple_of(8) + FOOTER_ENTRY_BYTES as u64
}

struct State {
    /// Reference count by chunk id (index 0 unused).
    counts: Vec<u32>,
    /// No id below this is free.
    free_hint: u64,
    /// Ids with a count above zero, and at zero (dead, not yet collected).
    live: u64,
    dead: u64,
    references: u64,
    /// Σ references × raw size: what the archived versions would take
    /// without deduplication or compression.
    logical_bytes: u64,
    /// Raw and stored bytes of the chunks that are not free.
    held_raw_bytes: u64,
    held_stored_bytes: u64,
    /// Chunks that are not free whose slots name other nodes' packs
    /// (borrowed, `crate::peers`), and their stored bytes: not counted in
    /// the held bytes above, nor in any pack's stats.
    borrowed_chunks: u64,
    borrowed_stored_bytes: u64,
    dedup: DedupIndex,
    /// Hashes of ids near recent dedup hits (see `locality.rs`).
    locality: LocalityCache,
    /// Ids handed out by the session in progress, whose slots are not
    /// written yet: their table slots may still describe what the id held
    /// before it was freed.
    unslotted: rustc_hash::FxHashSet<u64>,
    pack_next: u64,
    packs: BTreeMap<u64, PackStats>,
    /// Packs that did not open, with why: a crash's unsealed leftover unless
    /// history refers to them (decided by `finish_open`).
    unreadable: BTreeMap<u64, String>,
    /// Packs that did not open although history refers to them, with why:
    /// kept as they are (their records may be whole; a mended header or a
    /// copy put back brings their chunks back), their chunks reported
    /// missing.
    unopened_but_needed: BTreeMap<u64, String>,
    /// The store has been opened and marked: puts and collection may run.
    open: bool,
    /// Why the counts may be wrong: collection waits for a recount.
    recount: Option<String>,
    /// Why the dedup index must be rebuilt before the next lookup.
    dedup_damage: Option<String>,
    /// Ids history refers to whose chunk is nowhere to be found, with why.
    missing: BTreeMap<u64, String>,
    /// Counts a clean shutdown saved, until opening takes them or counts.
    saved: Option<Box<Saved>>,
    /// The counts were taken from the last clean shutdown, not counted.
    counts_restored: bool,
    /// The counts were saved: the store is closed for good.
    closed: bool,
}

impl State {
    fn reference(&mut self, id: ChunkId, raw_bytes: u32) {
        let count = &mut self.counts[id.0 as usize];
        assert_ne!(*count, FREE, "chunk {id} is referenced but free");
        if *count == 0 {
            self.dead -= 1;
            self.live += 1;
        }
        if *count < STICKY {
            *count += 1;
        }
        self.references += 1;
        self.logical_bytes += u64::from(raw_bytes);
    }

    /// A new id, counted once.
    fn allocate(&mut self) -> ChunkId {
        let mut id = self.free_hint.max(1);
        while (id as usize) < self.counts.len() && self.counts[id as usize] != FREE {
            id += 1;
        }
        if id as usize == self.counts.len() {
            self.counts.push(FREE);
        }
        self.free_hint = id + 1;
        self.counts[id as usize] = 0;
        self.dead += 1;
        ChunkId(id)
    }

    fn is_live(&self, id: ChunkId) -> bool {
        self.counts.get(id.0 as usize).is_some_and(|&count| count != FREE)
    }
}

#[derive(Default)]
struct Counters {
    chunks_written: AtomicU64,
    raw_bytes_written: AtomicU64,
    stored_bytes_written: AtomicU64,
    chunks_adopted: AtomicU64,
    adopted_bytes: AtomicU64,
    dedup_hits: AtomicU64,
    dedup_hits_nearby: AtomicU64,
    collections: AtomicU64,
    chunks_freed: AtomicU64,
    packs_deleted: AtomicU64,
    packs_rewritten: AtomicU64,
    chunks_relocated: AtomicU64,
    dedup_hits_peers: AtomicU64,
}

/// The chunk store of a node. See the module documentation.
pub struct ChunkStore {
    storage: Arc<dyn Storage>,
    dir: String,
    /// Where the sealed packs are (see `pack_store`).
    packs: Arc<dyn PackStore>,
    config: ChunkStoreConfig,
    table: ChunkTable,
    state: Mutex<State>,
    readers: Mutex<FxHashMap<u64, Arc<PackReader>>>,
    /// Buffers for spans of records, kept between reads (see `read_many`).
    spare_spans: Mutex<Vec<Vec<u8>>>,
    gate: RwLock<()>,
    /// One archive session or collection at a time.
    writing: Mutex<()>,
    /// Set by a failed sync; see the module documentation.
    poisoned: Mutex<Option<String>>,
    counters: Counters,
    /// What other nodes sharing the bucket store, and until when (the
    /// embedder's clock) it may be borrowed from (see [`ChunkStore::set_peers`]).
    peers: RwLock<Option<(Arc<dyn PeerChunks>, u64)>>,
}

/// Sizes and ratios, for `rewind stats` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkStats {
    /// Chunks that history refers to.
    pub chunks_live: u64,
    /// Chunks nothing refers to any more, not yet collected.
    pub chunks_dead: u64,
    /// References from versions to chunks.
    pub references: u64,
    /// Raw bytes of every referencing version: the archive's size without
    /// deduplication or compression.
    pub logical_bytes: u64,
    /// Raw and stored (compressed) bytes of the chunks held.
    pub unique_raw_bytes: u64,
    pub unique_stored_bytes: u64,
    pub pack_count: u64,
    pub pack_bytes: u64,
    /// Pack bytes that hold no live chunk: what collection can give back
    /// (exact for collected chunks, estimated for dead ones).
    pub reclaimable_bytes: u64,
    pub table_bytes: u64,
    pub dedup_entries: u64,
    pub dedup_runs: u64,
    /// Heap bytes of counts, dedup filters and fences, and the dedup table.
    pub memory_bytes: u64,
    /// Since the store was opened.
    pub chunks_written: u64,
    pub raw_bytes_written: u64,
    pub stored_bytes_written: u64,
    /// Of the chunks stored, those left where they lay in an adopted
    /// journal segment, and their bytes: history kept without a second copy.
    pub chunks_adopted: u64,
    pub adopted_bytes: u64,
    pub dedup_hits: u64,
    /// Dedup hits answered by the locality cache, without a read.
    pub dedup_hits_nearby: u64,
    pub collections: u64,
    pub chunks_freed: u64,
    pub packs_deleted: u64,
    pub packs_rewritten: u64,
    /// Since the store was opened: chunks copied to be read in order
    /// ([`ChunkStore::relocate`]).
    pub chunks_relocated: u64,
    /// Since the store was opened: chunks found in other nodes' packs
    /// (`crate::peers`) rather than stored.
    pub dedup_hits_peers: u64,
    /// Chunks held whose bytes are in other nodes' packs, and their stored
    /// bytes (not in `unique_*_bytes`).
    pub borrowed_chunks: u64,
    pub borrowed_stored_bytes: u64,
    pub poisoned: Option<String>,
    /// Why collection waits for a recount of references, if it does.
    pub recount_pending: Option<String>,
    /// Chunks history refers to that are damaged or missing.
    pub chunks_missing: u64,
    /// Packs read through the table because their footer is damaged.
    pub packs_footer_damaged: u64,
    /// The reference counts were saved by the last clean shutdown and
    /// taken back at open, rather than counted.
    pub counts_restored: bool,
}

/// How opening (or a recount) counts the chunks nothing referred to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counting {
    /// Every reference was marked: chunks with none are free.
    Exact,
    /// Some history could not be read (a damaged volume): every chunk with
    /// a valid slot is kept, and collection waits for an exact recount.
    Conservative,
}

/// What opening or a recount found wrong, and mended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Chunks history refers to that can be found nowhere, with why.
    pub missing: Vec<(ChunkId, String)>,
    /// Table slots rewritten from the pack footer that lists their id.
    pub slots_repaired: u64,
    /// Packs history needs whose trailer or footer is damaged.
    pub packs_footer_damaged: Vec<u64>,
}

/// A set of chunk ids, one bit each: what some history refers to, to be
/// measured with [`ChunkStore::measure`].
#[derive(Clone, Debug, Default)]
pub struct ChunkSet {
    bits: Vec<u64>,
}

impl ChunkSet {
    /// Adds `id`; returns whether it was not in the set yet.
    pub fn insert(&mut self, id: ChunkId) -> bool {
        let word = (id.0 / 64) as usize;
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let bit = 1 << (id.0 % 64);
        let new = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        new
    }

    fn contains(&self, id: u64) -> bool {
        self.bits.get((id / 64) as usize).is_some_and(|word| word >> (id % 64) & 1 == 1)
    }

    /// Whether any id in `first..first + count` is in the set.
    fn any_in(&self, first: u64, count: u64) -> bool {
        (first / 64..=(first + count - 1) / 64).any(|word| self.bits.get(word as usize).is_some_and(|&bits| bits != 0))
    }
}

/// The distinct chunks of a [`ChunkSet`], and their size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    pub chunks: u64,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

impl std::ops::AddAssign for Measured {
    fn add_assign(&mut self, other: Measured) {
        self.chunks += other.chunks;
        self.raw_bytes += other.raw_bytes;
        self.stored_bytes += other.stored_bytes;
    }
}

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectReport {
    pub chunks_freed: u64,
    pub packs_deleted: u64,
    pub packs_rewritten: u64,
    pub packs_written: u64,
    pub chunks_moved: u64,
    /// Pack bytes before minus after.
    pub bytes_reclaimed: u64,
}

/// Progress of a collection, for progress bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectPhase {
    /// Freeing unreferenced chunks: ids scanned of all.
    Sweep,
    /// Rewriting packs: bytes of old packs done of all.
    Repack,
}

const REPACK_INTENT: &str = "repack";

/// Chunks asked to be laid out in order ([`ChunkStore::relocate`]) that
/// already lie in runs of neighbouring records this long on average stay
/// where they are: a reader in that order reads them with few reads
/// already, and copying them would cost a write of each.
pub const RELOCATE_RUN_CHUNKS_MIN: u64 = 64;

/// What [`ChunkStore::relocate`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelocateReport {
    /// Distinct chunks asked for that this node's packs hold.
    pub chunks: u64,
    /// The runs of neighbouring records they lay in before.
    pub runs_before: u64,
    /// Of them, copied into new packs in the order asked (none when they
    /// already lay in long runs).
    pub chunks_moved: u64,
    /// Bytes of the packs written.
    pub bytes_written: u64,
    /// Chunks whose record failed its check: left where they are (the
    /// reads that need them fail as before), and logged.
    pub chunks_damaged: u64,
}

impl ChunkStore {
    /// Opens (creating if needed) the chunk store in `dir`, completing an
    /// interrupted repack and deleting a pack a crash left unsealed. Every
    /// id starts free: the caller marks each id history refers to with
    /// [`ChunkStore::mark`], then calls [`ChunkStore::finish_open`]. Damage
    /// to what is derived (the dedup index, a table header) is repaired
    /// here; packs that do not open are decided on by `finish_open`.
    pub fn open(storage: Arc<dyn Storage>, dir: &str, config: ChunkStoreConfig) -> Result<ChunkStore, ChunkError> {
        let packs_dir = format!("{dir}/packs");
        let packs = LocalPackStore::open(Arc::clone(&storage), &packs_dir).map_err(ChunkError::io(&packs_dir))?;
        ChunkStore::open_with_packs(storage, dir, config, Arc::new(packs))
    }

    /// Opens the chunk store in `dir` as [`ChunkStore::open`] does, with its
    /// packs in `packs` rather than in `dir/packs`.
    pub fn open_with_packs(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: ChunkStoreConfig,
        packs_store: Arc<dyn PackStore>,
    ) -> Result<ChunkStore, ChunkError> {
        assert!(config.pack_bytes_target > 0 && config.pack_bytes_target < 1 << 32);
        storage.create_dir_all(dir).map_err(ChunkError::io(dir))?;
        storage.sync_dir(dir).map_err(ChunkError::sync(dir))?;
        let saved = saved::take(&*storage, dir)?.map(Box::new);
        let table = ChunkTable::open(&*storage, &format!("{dir}/table"))?;
        finish_repack(&*storage, dir, &packs_store, &table)?;
        let mut packs = BTreeMap::new();
        let mut unreadable = BTreeMap::new();
        let listing = packs_store.list().map_err(ChunkError::io(&packs_store.locate(0)))?;
        for stored in listing {
            let pack = stored.pack;
            // Every pack is borrowed to a store of another number: its own
            // would be deleted as empty (`crate::peers`).
            if pack_owner(pack) != config.node {
                return Err(ChunkError::Io {
                    path: packs_store.locate(pack),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "this pack was written by node number {} and the store opens as node {}: a node's \
                             history keeps the node number it was written under",
                            pack_owner(pack),
                            config.node
                        ),
                    ),
                });
            }
            match PackReader::open(&packs_store, pack) {
                Ok(reader) => {
                    packs.insert(pack, PackStats { adopted: reader.is_adopted(), ..PackStats::new(reader.bytes()) });
                }
                // A bucket that does not answer says nothing about the pack:
                // the open fails, to be tried again, and nothing is deleted.
                Err(error) if error.is_transient() => return Err(error),
                Err(error) => {
                    unreadable.insert(pack, error.to_string());
                }
            }
        }
        let dedup_dir = format!("{dir}/dedup");
        let mut dedup = match DedupIndex::open(Arc::clone(&storage), &dedup_dir, config.dedup) {
            Ok(dedup) => dedup,
            Err(error @ ChunkError::Corrupt { .. }) => {
                tracing::warn!(%error, "the dedup index is damaged; rebuilding it from the pack footers");
                DedupIndex::reset(Arc::clone(&storage), &dedup_dir, config.dedup)?
            }
            Err(error) => return Err(error),
        };
        // The chunks of packs the dedup runs do not cover yet. These are the
        // newest packs; one a crash cut short may have a valid trailer over a
        // footer that never reached the disk.
        // An adopted journal segment has no footer: the chunks it holds that
        // the runs do not cover are not found by their bytes again (a later
        // copy of them is stored anew) until the index is rebuilt from the
        // table.
        let uncovered: Vec<u64> = packs
            .range(dedup.packs_covered() + 1..)
            .filter(|(_, stats)| !stats.adopted)
            .map(|(&pack, _)| pack)
            .collect();
        for pack in uncovered {
            match index_footer(&packs_store, pack, &table, &mut dedup) {
                Ok(()) => {}
                Err(error) if error.is_transient() => return Err(error),
                Err(error @ (ChunkError::Corrupt { .. } | ChunkError::Io { .. })) => {
                    packs.remove(&pack);
                    unreadable.insert(pack, error.to_string());
                }
                Err(error) => return Err(error),
            }
        }
        let newest = packs.keys().chain(unreadable.keys()).max().copied().unwrap_or(0);
        let pack_next = newest.max(dedup.packs_covered()).max(packs_before(config.node)) + 1;
        let state = State {
            // Allocated when counting starts (`start_counting`), unless the
            // saved counts are taken back: never both at once.
            counts: Vec::new(),
            free_hint: 1,
            live: 0,
            dead: 0,
            references: 0,
            logical_bytes: 0,
            held_raw_bytes: 0,
            held_stored_bytes: 0,
            borrowed_chunks: 0,
            borrowed_stored_bytes: 0,
            dedup,
            locality: LocalityCache::default(),
            unslotted: Default::default(),
            pack_next,
            packs,
            unreadable,
            unopened_but_needed: BTreeMap::new(),
            open: false,
            recount: None,
            dedup_damage: None,
            missing: BTreeMap::new(),
            saved,
            counts_restored: false,
            closed: false,
        };
        Ok(ChunkStore {
            storage,
            dir: dir.to_owned(),
            packs: packs_store,
            config,
            table,
            state: Mutex::new(state),
            readers: Mutex::new(FxHashMap::default()),
            spare_spans: Mutex::new(Vec::new()),
            gate: RwLock::new(()),
            writing: Mutex::new(()),
            poisoned: Mutex::new(None),
            counters: Counters::default(),
            peers: RwLock::new(None),
        })
    }

    /// Counts one reference from history to `id`, a chunk of `raw_bytes`,
    /// while opening. An id the table never had is missing; the caller
    /// names what refers to it.
    pub fn mark(&self, id: ChunkId, raw_bytes: u32) -> Result<(), ChunkError> {
        let mut state = self.state.lock();
        assert!(!state.open && !state.closed, "marking happens while opening");
        self.start_counting(&mut state);
        mark_in(&mut state, id, raw_bytes)
    }

    /// Ends opening with the counts the last clean shutdown saved (see
    /// [`ChunkStore::save_counts`]) instead of marking, if they were saved
    /// for the same `history` — the embedder's description of everything it
    /// would mark, hashed — and the store holds what it held then (the same
    /// table length, packs and dedup coverage, none damaged). Otherwise
    /// returns false and changes nothing: the caller marks every reference
    /// and calls [`ChunkStore::finish_open`].
    pub fn resume_counts(&self, history: &[u8]) -> bool {
        let mut state = self.state.lock();
        assert!(!state.open && !state.closed, "resuming happens while opening");
        let Some(saved) = state.saved.take() else {
            return false;
        };
        if let Err(difference) = self.still_applies(&state, &saved.meta, history) {
            tracing::info!(%difference, "counting chunk references: the counts saved at shutdown no longer apply");
            self.start_counting(&mut state);
            return false;
        }
        let Saved { meta, counts } = *saved;
        for pack in &meta.packs {
            let stats = state.packs.get_mut(&pack.pack).expect("still_applies checked the packs");
            (stats.held_chunks, stats.held_bytes) = (pack.held_chunks, pack.held_bytes);
        }
        state.counts = counts;
        (state.live, state.dead, state.references, state.logical_bytes) =
            (meta.live, meta.dead, meta.references, meta.logical_bytes);
        (state.held_raw_bytes, state.held_stored_bytes) = (meta.held_raw_bytes, meta.held_stored_bytes);
        // The footers of packs the dedup runs do not cover were indexed
        // again by `open`, freed ids included.
        let state = &mut *state;
        let counts = &state.counts;
        state.dedup.forget(|id| counts.get(id.0 as usize).is_some_and(|&count| count != FREE));
        (state.counts_restored, state.open) = (true, true);
        tracing::info!(live = state.live, dead = state.dead, "took back the chunk reference counts saved at shutdown");
        true
    }

    /// Why saved counts do not describe this store, if they do not.
    fn still_applies(&self, state: &State, meta: &SavedCounts, history: &[u8]) -> Result<(), String> {
        if meta.history != *blake3::hash(history).as_bytes() {
            return Err("the volumes' history changed since they were saved".into());
        }
        if meta.table_id_end != self.table.id_end() || meta.count_entries < meta.table_id_end {
            return Err(format!("the chunk table ends at id {}, saved at {}", self.table.id_end(), meta.table_id_end));
        }
        if let Some((pack, problem)) = state.unreadable.first_key_value() {
            return Err(format!("pack {} does not open: {problem}", pack_name(*pack)));
        }
        let packs_now: Vec<(u64, u64)> = state.packs.iter().map(|(&pack, stats)| (pack, stats.bytes)).collect();
        let packs_saved: Vec<(u64, u64)> = meta.packs.iter().map(|pack| (pack.pack, pack.bytes)).collect();
        if packs_now != packs_saved {
            return Err("the packs are not those saved with them".into());
        }
        if meta.packs_covered != state.dedup.packs_covered() {
            return Err("the dedup index covers other packs than when they were saved".into());
        }
        Ok(())
    }

    /// Saves the reference counts for the next open to take back
    /// ([`ChunkStore::resume_counts`]), `history` describing what they count
    /// as the embedder will describe it then. The last thing a clean
    /// shutdown does: the store is closed afterwards, for good (no archive
    /// session, recount or collection). Counts in doubt (a recount pending),
    /// a poisoned store, damaged packs or missing chunks (which the next
    /// open should find and report again) are not saved, and the next open
    /// counts; false then.
    pub fn save_counts(&self, history: &[u8]) -> Result<bool, ChunkError> {
        let _gate = self.gate.write();
        let _writing = self.writing.lock();
        let mut state = self.state.lock();
        // Ids a failed session handed out stay unslotted until a recount,
        // which it asked for; any other unslotted id is a session in flight.
        assert!(
            state.open && (state.unslotted.is_empty() || state.recount.is_some()),
            "saving happens once, with no session in flight"
        );
        (state.open, state.closed) = (false, true);
        let doubt = if let Some(cause) = self.poisoned.lock().clone() {
            Some(format!("the store is poisoned ({cause})"))
        } else if let Some(cause) = &state.recount {
            Some(format!("they are in doubt ({cause})"))
        } else if let Some(damage) = &state.dedup_damage {
            Some(format!("the dedup index is damaged ({damage})"))
        } else if state.packs.values().any(|pack| pack.footer_damaged) {
            Some("a pack's footer is damaged".to_owned())
        } else if !state.missing.is_empty() {
            Some(format!("history refers to {} chunks that are missing", state.missing.len()))
        } else if state.borrowed_chunks > 0 {
            // The saved counts hold no record of them.
            Some(format!("{} chunks are borrowed from other nodes", state.borrowed_chunks))
        } else {
            None
        };
        if let Some(doubt) = doubt {
            tracing::info!(%doubt, "not saving the chunk reference counts: the next start counts them");
            return Ok(false);
        }
        let meta = SavedCounts {
            history: *blake3::hash(history).as_bytes(),
            table_id_end: self.table.id_end(),
            packs_covered: state.dedup.packs_covered(),
            live: state.live,
            dead: state.dead,
            references: state.references,
            logical_bytes: state.logical_bytes,
            held_raw_bytes: state.held_raw_bytes,
            held_stored_bytes: state.held_stored_bytes,
            packs: state
                .packs
                .iter()
                .map(|(&pack, stats)| SavedPack {
                    pack,
                    bytes: stats.bytes,
                    held_chunks: stats.held_chunks,
                    held_bytes: stats.held_bytes,
                })
                .collect(),
            count_entries: 0,
            counts_crc32c: 0,
        };
        saved::save(&*self.storage, &self.dir, meta, &state.counts)?;
        Ok(true)
    }

    /// Drops saved counts (once it is decided they are not used) and starts
    /// every id free, to be marked.
    fn start_counting(&self, state: &mut State) {
        if state.counts.is_empty() {
            state.saved = None;
            state.counts = vec![FREE; self.table.id_end() as usize];
        }
    }

    /// Ends opening: checks that every referenced chunk has a valid slot in
    /// a sealed pack (one sequential read of the table), mends what can be
    /// mended from what it is derived from, counts what the packs hold, and
    /// forgets dedup entries of unreferenced ids. What cannot be mended is
    /// reported, never an error: only the history that needs it is lost.
    pub fn finish_open(&self, counting: Counting) -> Result<OpenReport, ChunkError> {
        let mut state = self.state.lock();
        assert!(!state.open && !state.closed, "finishing happens while opening");
        self.start_counting(&mut state);
        let report = self.settle(&mut state, counting)?;
        if counting == Counting::Conservative {
            state.recount.get_or_insert_with(|| "some history could not be read to count its chunks".into());
        }
        state.open = true;
        Ok(report)
    }

    /// Counts every reference again, online: `count` marks each chunk id
    /// the history of every volume refers to (as opening does). Waits for
    /// merges and archive passes in flight, and holds them off meanwhile.
    pub fn recount<E: From<ChunkError>>(
        &self,
        counting: Counting,
        count: impl FnOnce(&mut dyn FnMut(ChunkId, u32)) -> Result<(), E>,
    ) -> Result<OpenReport, E> {
        let _gate = self.gate.write();
        let _writing = self.writing.lock();
        assert!(!self.state.lock().closed, "the store is open");
        // Counted apart and put in place only once complete: a recount that
        // fails leaves the counts as they were (in doubt, so collection
        // still waits), and never frees an id history refers to.
        let id_end = self.table.id_end() as usize;
        let mut counts = vec![FREE; id_end];
        let (mut references, mut logical_bytes) = (0u64, 0u64);
        let mut missing = Vec::new();
        count(&mut |id, raw_bytes| match counts.get_mut(id.0 as usize).filter(|_| id.0 > 0) {
            Some(count) => {
                *count = match *count {
                    FREE => 1,
                    STICKY => STICKY,
                    other => other + 1,
                };
                references += 1;
                logical_bytes += u64::from(raw_bytes);
            }
            None => missing.push((id, "the chunk table has no such id".to_owned())),
        })?;
        let mut state = self.state.lock();
        state.live = counts.iter().filter(|&&count| count != FREE && count > 0).count() as u64;
        state.dead = 0;
        state.counts = counts;
        state.locality.clear();
        (state.references, state.logical_bytes) = (references, logical_bytes);
        state.free_hint = 1;
        (state.held_raw_bytes, state.held_stored_bytes) = (0, 0);
        (state.borrowed_chunks, state.borrowed_stored_bytes) = (0, 0);
        for pack in state.packs.values_mut() {
            (pack.held_chunks, pack.held_bytes) = (0, 0);
        }
        state.unslotted.clear();
        state.missing.clear();
        let mut report = self.settle(&mut state, counting)?;
        for (id, reason) in missing {
            state.missing.insert(id.0, reason.clone());
            report.missing.push((id, reason));
        }
        state.recount = match counting {
            Counting::Exact => None,
            Counting::Conservative => Some("some history could not be read to count its chunks".into()),
        };
        tracing::info!(live = state.live, dead = state.dead, "recounted the chunk store's references");
        Ok(report)
    }

    /// Why collection waits for a recount (see [`ChunkStore::recount`]), if it does.
    pub fn recount_pending(&self) -> Option<String> {
        self.state.lock().recount.clone()
    }

    /// Asks for a recount before the next collection: counts may be wrong
    /// after `cause`.
    pub fn request_recount(&self, cause: String) {
        tracing::warn!(%cause, "garbage collection will count every chunk reference again first");
        self.state.lock().recount.get_or_insert(cause);
    }

    /// The table scan of opening and recounting (see `finish_open`).
    fn settle(&self, state: &mut State, counting: Counting) -> Result<OpenReport, ChunkError> {
        let mut report = OpenReport::default();
        let mut bytes = Vec::new();
        // Referenced ids whose slot is unusable, with why: mended from the
        // footers below, or missing.
        let mut unslotted: BTreeMap<u64, String> = BTreeMap::new();
        let id_end = self.table.id_end().min(state.counts.len() as u64);
        let mut first = 1;
        while first < id_end {
            let count = SCAN_IDS.min(id_end - first);
            let window = &state.counts[first as usize..(first + count) as usize];
            // A node sharing its bucket reads them all: stale slots
            // naming other nodes' packs are cleared below.
            let shares_bucket = self.config.node != 0;
            if counting == Counting::Exact && !shares_bucket && window.iter().all(|&count| count == FREE) {
                first += count;
                continue;
            }
            self.table.read_range(first, count, &mut bytes)?;
            for index in 0..count as usize {
                let id = ChunkId(first + index as u64);
                let referenced = state.counts[id.0 as usize] != FREE;
                let slot = match self.table.slot_in(&bytes, first, id) {
                    Ok(Some(slot)) => slot,
                    Ok(None) if referenced => {
                        unslotted.insert(id.0, "its table slot was never written".into());
                        continue;
                    }
                    Err(error) if referenced => {
                        unslotted.insert(id.0, format!("its table slot is damaged: {error}"));
                        continue;
                    }
                    Ok(None) | Err(_) => continue,
                };
                if !referenced && counting == Counting::Exact {
                    // A stale slot naming another node's pack (its id freed
                    // before a crash cleared it) would keep the pack's
                    // owner from deleting it (`crate::peers`).
                    if self.is_borrowed(&slot) {
                        self.table.clear(id)?;
                    }
                    continue;
                }
                if self.is_borrowed(&slot) {
                    // Another node's pack: read (and checked) when read.
                    if !referenced {
                        state.counts[id.0 as usize] = 0;
                        state.dead += 1;
                    }
                    state.borrowed_chunks += 1;
                    state.borrowed_stored_bytes += u64::from(slot.stored_bytes);
                    continue;
                }
                match self.pack_for(state, slot.pack) {
                    Ok(pack) if u64::from(slot.offset) + u64::from(slot.stored_bytes) <= pack.bytes => {
                        pack.hold(slot.stored_bytes);
                    }
                    Ok(_) if referenced => {
                        let reason = format!("its slot points past the end of pack {}", pack_name(slot.pack));
                        state.missing.insert(id.0, reason);
                        continue;
                    }
                    Err(reason) if referenced => {
                        state.missing.insert(id.0, reason);
                        continue;
                    }
                    _ => continue,
                }
                if !referenced {
                    // Conservative: kept, as if something referred to it.
                    state.counts[id.0 as usize] = 0;
                    state.dead += 1;
                }
                state.held_raw_bytes += u64::from(slot.raw_bytes);
                state.held_stored_bytes += u64::from(slot.stored_bytes);
            }
            first += count;
        }
        if !unslotted.is_empty() {
            report.slots_repaired = self.mend_slots(state, &mut unslotted)?;
        }
        state.missing.extend(unslotted);
        for (&id, reason) in &state.missing {
            tracing::error!(chunk = id, %reason, "history refers to a chunk that is damaged or missing");
            report.missing.push((ChunkId(id), reason.clone()));
        }
        // Nothing refers to the packs that did not open and are left here
        // (those history needs are in `unopened_but_needed`): a crash left
        // the newest one unsealed (its writes may reach the disk in any
        // order).
        let newest_sealed = state.packs.keys().next_back().copied().unwrap_or(0);
        for (pack, damage) in std::mem::take(&mut state.unreadable) {
            let path = self.packs.locate(pack);
            if pack > newest_sealed {
                tracing::info!(%path, %damage, "deleting a pack a crash left unfinished");
            } else {
                tracing::warn!(%path, %damage, "deleting a damaged pack that nothing refers to");
            }
            self.packs.delete(pack).map_err(ChunkError::sync_or_io(&path))?;
        }
        report.packs_footer_damaged =
            state.packs.iter().filter(|(_, pack)| pack.footer_damaged).map(|(&pack, _)| pack).collect();
        let counts = &state.counts;
        state.dedup.forget(|id| counts.get(id.0 as usize).is_some_and(|&count| count != FREE));
        Ok(report)
    }

    /// The stats of `pack` if its chunks can be read: a sealed pack, or one
    /// whose trailer or footer is damaged but whose records are there (it is
    /// then read through the table, and rewritten by the next collection).
    fn pack_for<'s>(&self, state: &'s mut State, pack: u64) -> Result<&'s mut PackStats, String> {
        if let Some(damage) = state.unopened_but_needed.get(&pack) {
            return Err(format!("its pack {} is unreadable: {damage}", pack_name(pack)));
        }
        if let Some(damage) = state.unreadable.remove(&pack) {
            match PackReader::open_records(&self.packs, pack) {
                Ok(reader) => {
                    tracing::warn!(
                        pack = %pack_name(pack),
                        %damage,
                        "a pack history needs has a damaged trailer or footer; its chunks are read where the \
                         chunk table says, and the next garbage collection rewrites it"
                    );
                    let adopted = reader.is_adopted();
                    let stats = PackStats { footer_damaged: !adopted, adopted, ..PackStats::new(reader.bytes()) };
                    state.packs.insert(pack, stats);
                }
                Err(error) => {
                    let damage = format!("{damage}; {error}");
                    tracing::error!(
                        pack = %pack_name(pack),
                        %damage,
                        "a pack history needs does not open; it is kept as it is, and its chunks are reported missing"
                    );
                    state.unopened_but_needed.insert(pack, damage.clone());
                    return Err(format!("its pack {} is unreadable: {damage}", pack_name(pack)));
                }
            }
        }
        state.packs.get_mut(&pack).ok_or_else(|| format!("its pack {} does not exist", pack_name(pack)))
    }

    /// Rewrites the table slots of `ids` (referenced, with unusable slots)
    /// from the footers that list them, newest pack first (a chunk moved or
    /// an id reused is in a newer pack), checking each record before
    /// trusting it. Returns how many were mended; the rest stay in `ids`.
    fn mend_slots(&self, state: &mut State, ids: &mut BTreeMap<u64, String>) -> Result<u64, ChunkError> {
        let mut mended = 0;
        let packs: Vec<u64> = state.packs.keys().rev().copied().collect();
        let mut raw = Vec::new();
        for pack in packs {
            if ids.is_empty() {
                break;
            }
            let Ok(reader) = PackReader::open(&self.packs, pack) else { continue };
            let Ok(footer) = reader.footer() else { continue };
            for entry in footer {
                if !ids.contains_key(&entry.id.0) {
                    continue;
                }
                raw.resize(entry.raw_bytes as usize, 0);
                if reader.read(reader.location(&entry), &entry.hash, &mut raw, Check::Hash).is_err() {
                    continue;
                }
                let slot = slot_of(entry.hash, reader.location(&entry));
                self.table.reserve(entry.id.0 + 1)?;
                self.table.write(entry.id, &slot)?;
                let reason = ids.remove(&entry.id.0).expect("checked above");
                tracing::warn!(chunk = entry.id.0, %reason, pack = %pack_name(pack), "rewrote a chunk table slot from its pack's footer");
                let stats = state.packs.get_mut(&pack).expect("listed above");
                stats.hold(slot.stored_bytes);
                state.held_raw_bytes += u64::from(slot.raw_bytes);
                state.held_stored_bytes += u64::from(slot.stored_bytes);
                mended += 1;
            }
        }
        if mended > 0 {
            self.table.sync()?;
        }
        Ok(mended)
    }

    /// Whether a failed sync stopped archiving and collection.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.lock().is_some()
    }

    fn check_poisoned(&self) -> Result<(), ChunkError> {
        match &*self.poisoned.lock() {
            Some(cause) => Err(ChunkError::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Poisons the store after a failed sync (see the module documentation);
    /// other errors pass through.
    fn fail(&self, error: ChunkError) -> ChunkError {
        if let ChunkError::SyncFailed { .. } = error {
            let cause = error.to_string();
            tracing::error!(%cause, "chunk store poisoned: no more archiving or collection until restart");
            self.poisoned.lock().get_or_insert(cause);
        }
        error
    }

    /// Holds off collection while a merge releases references (see the
    /// module documentation).
    pub fn hold_references(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// Drops one reference to `id` (a version of `raw_bytes` history no
    /// longer keeps). The caller holds [`ChunkStore::hold_references`].
    pub fn release(&self, id: ChunkId, raw_bytes: u32) {
        let mut state = self.state.lock();
        let count = state.counts.get(id.0 as usize).copied().unwrap_or(FREE);
        if count == FREE || count == 0 {
            // A merge that failed part-way released what its retry releases
            // again: the counts are in doubt until the recount it asked for.
            assert!(state.recount.is_some(), "chunk {id} released more often than referenced");
            return;
        }
        let count = &mut state.counts[id.0 as usize];
        if *count < STICKY {
            *count -= 1;
            if *count == 0 {
                state.live -= 1;
                state.dead += 1;
            }
        }
        state.references -= 1;
        state.logical_bytes -= u64::from(raw_bytes);
    }

    /// Lets archive passes borrow chunks that other nodes sharing the
    /// bucket store (`crate::peers`): a chunk the node's own dedup index
    /// does not have but `peers` finds gets a slot naming the other node's
    /// pack instead of being stored again — until [`ChunkStore::expire_peers`]
    /// is told a time at or after `until` (what `peers` knows is then too
    /// old to trust). The store reads no clock: the embedder calls
    /// `expire_peers` before each archive pass and regularly.
    pub fn set_peers(&self, peers: Arc<dyn PeerChunks>, until: u64) {
        *self.peers.write() = Some((peers, until));
    }

    /// Stops the borrowing [`ChunkStore::set_peers`] allowed if `now` is
    /// at or past its end.
    pub fn expire_peers(&self, now: u64) {
        let mut peers = self.peers.write();
        if peers.as_ref().is_some_and(|&(_, until)| now >= until) {
            *peers = None;
        }
    }

    /// Whether `slot` names another node's pack.
    fn is_borrowed(&self, slot: &TableSlot) -> bool {
        pack_owner(slot.pack) != self.config.node
    }

    /// Another node's slot for chunk `hash` of `raw_bytes`, if the peers
    /// know one that describes it.
    fn peer_chunk(&self, hash: &ChunkHash, raw_bytes: u32) -> Option<TableSlot> {
        let slot = self.peers.read().as_ref()?.0.find(hash)?;
        let fits = slot.hash == *hash && slot.raw_bytes == raw_bytes && self.is_borrowed(&slot);
        fits.then_some(slot)
    }

    /// The chunk table as a catalog keeps it (`rewind_engine::catalog`,
    /// `crate::peers`): read once no archive session is in flight (it waits
    /// for one), with the slots of free ids (and of ids a failed session
    /// left unslotted) zeroed — what such a slot
    /// still names may be gone, and must be neither lent to other nodes nor
    /// keep their packs from being deleted. The caller holds
    /// [`ChunkStore::hold_references`], so no id history refers to is freed
    /// meanwhile.
    pub fn table_for_catalog(&self) -> Result<Vec<u8>, ChunkError> {
        let _writing = self.writing.lock();
        let id_end = self.table.id_end();
        let mut bytes =
            rewind_io::read_file(&*self.storage, self.table.path()).map_err(ChunkError::io(self.table.path()))?;
        let state = self.state.lock();
        for id in 1..id_end.min(bytes.len() as u64 / SLOT_BYTES) {
            // Ids a failed session handed out stay unslotted (until a
            // recount frees them): their slots say nothing either.
            let free = state.counts.get(id as usize).is_none_or(|&count| count == FREE);
            if free || state.unslotted.contains(&id) {
                let slot = (id * SLOT_BYTES) as usize;
                bytes[slot..slot + SLOT_BYTES as usize].fill(0);
            }
        }
        Ok(bytes)
    }

    /// The packs that hold chunks `ids` (sorted and deduplicated here), as
    /// their table slots say now: a collection may move them afterwards.
    /// Ids without a valid slot are passed over.
    pub fn packs_of(&self, ids: &mut Vec<ChunkId>) -> Result<rustc_hash::FxHashSet<u64>, ChunkError> {
        ids.sort_unstable();
        ids.dedup();
        let mut packs = rustc_hash::FxHashSet::default();
        let id_end = self.table.id_end();
        let mut bytes = Vec::new();
        let mut next = 0;
        while next < ids.len() {
            // One read of the table for the ids of each window.
            let first = ids[next].0;
            if first == 0 || first >= id_end {
                next += 1;
                continue;
            }
            let count = SCAN_IDS.min(id_end - first);
            self.table.read_range(first, count, &mut bytes)?;
            while next < ids.len() && ids[next].0 < first + count {
                let id = ids[next];
                if let Ok(Some(slot)) = self.table.slot_in(&bytes, first, id) {
                    packs.insert(slot.pack);
                }
                next += 1;
            }
        }
        Ok(packs)
    }

    /// Starts putting chunks; only one session or collection runs at a time.
    pub fn session(&self) -> Result<ArchiveSession<'_>, ChunkError> {
        let writing = self.writing.lock();
        self.check_poisoned()?;
        let mut state = self.state.lock();
        assert!(state.open, "the store is open");
        if let Some(damage) = state.dedup_damage.clone() {
            tracing::warn!(%damage, "rebuilding the dedup index from the chunk table");
            self.rebuild_dedup(&mut state)?;
        }
        drop(state);
        Ok(ArchiveSession {
            store: self,
            _writing: writing,
            writer: None,
            compressor: Compressor::new().map_err(ChunkError::io(&self.dir))?,
            stored: Vec::new(),
            unsealed: Vec::new(),
            sealed: Vec::new(),
            borrowed: Vec::new(),
            new_ids: Vec::new(),
            done: false,
        })
    }

    /// Replaces the dedup index by one built from the chunk table: every
    /// chunk that is not free, by its hash. The caller holds `writing`.
    fn rebuild_dedup(&self, state: &mut State) -> Result<(), ChunkError> {
        let mut dedup =
            DedupIndex::reset(Arc::clone(&self.storage), &format!("{}/dedup", self.dir), self.config.dedup)?;
        let mut bytes = Vec::new();
        let id_end = self.table.id_end().min(state.counts.len() as u64);
        let mut first = 1;
        while first < id_end {
            let count = SCAN_IDS.min(id_end - first);
            self.table.read_range(first, count, &mut bytes)?;
            for index in 0..count as usize {
                let id = ChunkId(first + index as u64);
                let held = state.counts[id.0 as usize] != FREE && !state.unslotted.contains(&id.0);
                if let (true, Ok(Some(slot))) = (held, self.table.slot_in(&bytes, first, id)) {
                    dedup.insert(slot.hash, id);
                }
            }
            first += count;
        }
        let covered = state.packs.keys().next_back().copied().unwrap_or(0);
        dedup.flush(covered, &|_| true)?;
        state.dedup = dedup;
        state.dedup_damage = None;
        Ok(())
    }

    /// Reads chunk `id` into `out` (its raw size), checking the table slot
    /// and the record ([`Check::Crc`]: the hash is for scrubs and copies).
    pub fn read(&self, id: ChunkId, out: &mut [u8]) -> Result<(), ChunkError> {
        // A repack may move the chunk and delete its old pack between our
        // reading the slot and opening the pack: then read the slot again.
        for attempt in 0..2 {
            let Some(slot) = self.table.read(id)? else {
                return Err(ChunkError::Missing { id, reason: "its table slot was never written".into() });
            };
            if slot.raw_bytes as usize != out.len() {
                let reason = format!("it holds {} bytes, the version {}", slot.raw_bytes, out.len());
                return Err(ChunkError::Missing { id, reason });
            }
            // (Deleted once opened, the pack is found gone by the read.)
            match self.reader(slot.pack).and_then(|reader| reader.read(location_of(&slot), &slot.hash, out, Check::Crc))
            {
                Err(error) if attempt == 0 && pack_gone(&error) => continue,
                read => return read,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Reads chunks `ids`, each of `out.len() / ids.len()` raw bytes, into
    /// consecutive pieces of `out`, checked as [`ChunkStore::read`] checks
    /// one, and returns the CRC-32C of each chunk's bytes (for the caller's
    /// own check: computed on the way, a chunk stored as it is is read
    /// once). Neighbouring table slots are read together, and so are
    /// neighbouring records of a pack: history archived together lies
    /// together, so a view's sequential read stays close to sequential I/O.
    pub fn read_many(&self, ids: &[ChunkId], out: &mut [u8]) -> Result<Vec<u32>, ChunkError> {
        let wanted: Vec<Option<ChunkId>> = ids.iter().copied().map(Some).collect();
        self.read_many_among(&wanted, out)
    }

    /// [`ChunkStore::read_many`] of chunks among other blocks: `out` holds
    /// a chunk's room for each of `ids`, and only those that name a chunk
    /// are read (the rest of `out` is left as it is), all in one go, so
    /// that a view whose chunks lie between blocks read from elsewhere
    /// reads its neighbouring records together too. The CRC-32C of a room
    /// with no chunk is 0.
    pub fn read_many_among(&self, ids: &[Option<ChunkId>], out: &mut [u8]) -> Result<Vec<u32>, ChunkError> {
        /// Ids apart by at most this share one read of the table.
        const SLOT_SPAN_IDS_MAX: u64 = 256;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        assert_eq!(out.len() % ids.len(), 0, "chunks of one size");
        let chunk_bytes = out.len() / ids.len();
        let id = |index: usize| ids[index].expect("only rooms with a chunk are ordered");
        let mut order: Vec<usize> = (0..ids.len()).filter(|&index| ids[index].is_some()).collect();
        order.sort_unstable_by_key(|&index| id(index));
        let mut slots = vec![None; ids.len()];
        let mut bytes = Vec::new();
        let mut start = 0;
        while start < order.len() {
            let first = id(order[start]).0;
            let mut end = start + 1;
            while end < order.len() && id(order[end]).0 - first < SLOT_SPAN_IDS_MAX {
                end += 1;
            }
            let last = id(order[end - 1]).0;
            if first == 0 || last >= self.table.id_end() {
                let id = if first == 0 { id(order[start]) } else { id(order[end - 1]) };
                return Err(ChunkError::Missing { id, reason: "its table slot was never written".into() });
            }
            self.table.read_range(first, last - first + 1, &mut bytes)?;
            for &index in &order[start..end] {
                let id = id(index);
                let slot = self
                    .table
                    .slot_in(&bytes, first, id)
                    .map_err(|error| ChunkError::Missing { id, reason: format!("its table slot is damaged: {error}") })?
                    .ok_or_else(|| ChunkError::Missing { id, reason: "its table slot was never written".into() })?;
                if slot.raw_bytes as usize != chunk_bytes {
                    let reason = format!("it holds {} bytes, the version {chunk_bytes}", slot.raw_bytes);
                    return Err(ChunkError::Missing { id, reason });
                }
                slots[index] = Some(slot);
            }
            start = end;
        }
        // Scratch (record headers, gaps, compressed records) zeroed once and
        // reused: a fresh buffer would be zeroed on every read.
        let mut scratch = self.spare_spans.lock().pop().unwrap_or_default();
        let mut crcs = vec![0; ids.len()];
        let read = self.read_spans(&slots, order, ids, chunk_bytes, &mut scratch, out, &mut crcs);
        let mut spare = self.spare_spans.lock();
        if spare.len() < SPARE_SPANS_MAX {
            spare.push(scratch);
        }
        read.map(|()| crcs)
    }

    /// The second half of [`ChunkStore::read_many_among`]: the records of the
    /// chunks whose `slots` it found, read in spans of neighbours, and their
    /// CRC-32Cs into `crcs`.
    #[allow(clippy::too_many_arguments)]
    fn read_spans(
        &self,
        slots: &[Option<TableSlot>],
        mut order: Vec<usize>,
        ids: &[Option<ChunkId>],
        chunk_bytes: usize,
        scratch: &mut Vec<u8>,
        out: &mut [u8],
        crcs: &mut [u32],
    ) -> Result<(), ChunkError> {
        /// Records of a pack within this many bytes share one read of the pack.
        const RECORD_SPAN_BYTES_MAX: u64 = 1 << 20;
        /// ...if at most this many bytes lie between two of them: copying a
        /// gap to scratch costs less than another read up to about this
        /// size. An archive pass writes each block's versions together, so
        /// a view of a volume written again since finds its records one or
        /// more apart (4160 bytes for a 4 KiB block): with gaps of 4 KiB at
        /// most, that view read each chunk on its own, at half the speed.
        const RECORD_GAP_BYTES_MAX: u64 = 16 << 10;
        let slot = |index: usize| slots[index].expect("every slot read above");
        order.sort_unstable_by_key(|&index| (slot(index).pack, slot(index).offset));
        let record_end = |slot: TableSlot| u64::from(slot.offset) + record_bytes(&slot);
        let mut start = 0;
        while start < order.len() {
            let first = slot(order[start]);
            let mut span_end = record_end(first);
            let mut end = start + 1;
            while end < order.len() {
                let next = slot(order[end]);
                let near = next.pack == first.pack && u64::from(next.offset) <= span_end + RECORD_GAP_BYTES_MAX;
                if !near || record_end(next).max(span_end) - u64::from(first.offset) > RECORD_SPAN_BYTES_MAX {
                    break;
                }
                span_end = span_end.max(record_end(next));
                end += 1;
            }
            let group = &order[start..end];
            let members: Vec<(usize, TableSlot)> = group.iter().map(|&index| (index, slot(index))).collect();
            let read = self
                .reader(first.pack)
                .and_then(|reader| self.read_span_scattered(&reader, &members, ids, chunk_bytes, scratch, out, crcs));
            match read {
                Ok(()) => {}
                // Repacked meanwhile: read these one by one, through fresh slots.
                Err(error) if pack_gone(&error) => {
                    for &index in group {
                        crcs[index] = self.read_alone(
                            ids[index].expect("ordered"),
                            &mut out[index * chunk_bytes..(index + 1) * chunk_bytes],
                        )?;
                    }
                }
                Err(error) => return Err(error),
            }
            start = end;
        }
        Ok(())
    }

    /// Reads the records of `members` (chunks by index into `out`, and their
    /// slots: neighbours in one pack, in offset order) with one scatter read: the stored bytes of each chunk stored as
    /// it is go straight to its place in `out`, and only headers, the gaps
    /// between records and compressed records to `scratch`. Then checks each
    /// record, and puts each chunk's CRC-32C in `crcs`. A chunk asked for
    /// twice is read once and copied; a record overlapping the one before
    /// (a damaged table) is read on its own.
    #[allow(clippy::too_many_arguments)]
    fn read_span_scattered(
        &self,
        reader: &PackReader,
        members: &[(usize, TableSlot)],
        ids: &[Option<ChunkId>],
        chunk_bytes: usize,
        scratch: &mut Vec<u8>,
        out: &mut [u8],
        crcs: &mut [u32],
    ) -> Result<(), ChunkError> {
        /// Where the bytes of a piece of the span go.
        enum Piece {
            /// To `scratch`: a gap, or a header, or a whole compressed record.
            Scratch(usize),
            /// To the chunk at this index of `out`.
            Out(usize),
        }
        /// What to check once the span is read.
        enum Record {
            /// Header in `scratch` at `header`; stored bytes in `out`.
            InPlace { index: usize, slot: TableSlot, header: usize },
            /// The whole record in `scratch` at `start`.
            InScratch { index: usize, slot: TableSlot, start: usize },
            /// The same record as the chunk at `source` of `out`.
            Copy { index: usize, source: usize },
            /// Overlaps the record before: read on its own.
            Alone { index: usize },
        }
        let start = u64::from(members[0].1.offset);
        let mut pieces = Vec::with_capacity(members.len() * 3);
        let mut records = Vec::with_capacity(members.len());
        let (mut cursor, mut scratch_bytes) = (start, 0);
        let mut previous: Option<(usize, TableSlot)> = None;
        for &(index, slot) in members {
            let offset = u64::from(slot.offset);
            if offset < cursor {
                records.push(match previous {
                    Some((source, before)) if before == slot => Record::Copy { index, source },
                    _ => Record::Alone { index },
                });
                continue;
            }
            if offset > cursor {
                pieces.push(Piece::Scratch((offset - cursor) as usize));
                scratch_bytes += (offset - cursor) as usize;
            }
            let header_bytes = record_header_bytes(location_of(&slot));
            let record_bytes = header_bytes + slot.stored_bytes as usize;
            if slot.stored_bytes as usize == chunk_bytes {
                records.push(Record::InPlace { index, slot, header: scratch_bytes });
                if header_bytes > 0 {
                    pieces.push(Piece::Scratch(header_bytes));
                }
                pieces.push(Piece::Out(index));
                scratch_bytes += header_bytes;
            } else {
                records.push(Record::InScratch { index, slot, start: scratch_bytes });
                pieces.push(Piece::Scratch(record_bytes));
                scratch_bytes += record_bytes;
            }
            cursor = offset + record_bytes as u64;
            previous = Some((index, slot));
        }
        if scratch.len() < scratch_bytes {
            scratch.resize(scratch_bytes, 0);
        }
        {
            let mut chunks: Vec<Option<&mut [u8]>> = out.chunks_exact_mut(chunk_bytes).map(Some).collect();
            let mut rest = &mut scratch[..scratch_bytes];
            let mut slices = Vec::with_capacity(pieces.len());
            for piece in pieces {
                slices.push(std::io::IoSliceMut::new(match piece {
                    Piece::Scratch(length) => {
                        let (head, tail) = std::mem::take(&mut rest).split_at_mut(length);
                        rest = tail;
                        head
                    }
                    Piece::Out(index) => chunks[index].take().expect("each chunk read once"),
                }));
            }
            reader.read_scattered(start, &mut slices)?;
        }
        for record in records {
            match record {
                Record::InPlace { index, slot, header } => {
                    let header = &scratch[header..header + record_header_bytes(location_of(&slot))];
                    let out = &mut out[index * chunk_bytes..(index + 1) * chunk_bytes];
                    crcs[index] = reader.decode_in_place(location_of(&slot), &slot.hash, header, out, Check::Crc)?;
                }
                Record::InScratch { index, slot, start } => {
                    let record = &scratch[start..start + RECORD_HEADER_BYTES + slot.stored_bytes as usize];
                    let out = &mut out[index * chunk_bytes..(index + 1) * chunk_bytes];
                    reader.decode(location_of(&slot), &slot.hash, record, out, Check::Crc)?;
                    crcs[index] = rewind_format::crc32c(out);
                }
                // After its source: records are checked in the order read.
                Record::Copy { index, source } => {
                    out.copy_within(source * chunk_bytes..(source + 1) * chunk_bytes, index * chunk_bytes);
                    crcs[index] = crcs[source];
                }
                Record::Alone { index } => {
                    crcs[index] = self.read_alone(
                        ids[index].expect("ordered"),
                        &mut out[index * chunk_bytes..(index + 1) * chunk_bytes],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// [`ChunkStore::read`] of one chunk of a [`ChunkStore::read_many`];
    /// returns the CRC-32C of its bytes.
    fn read_alone(&self, id: ChunkId, out: &mut [u8]) -> Result<u32, ChunkError> {
        self.read(id, out)?;
        Ok(rewind_format::crc32c(out))
    }

    fn reader(&self, pack: u64) -> Result<Arc<PackReader>, ChunkError> {
        if let Some(reader) = self.readers.lock().get(&pack) {
            return Ok(Arc::clone(reader));
        }
        let footer_damaged = self.state.lock().packs.get(&pack).is_some_and(|stats| stats.footer_damaged);
        let reader = Arc::new(match footer_damaged {
            true => PackReader::open_records(&self.packs, pack)?,
            false => PackReader::open(&self.packs, pack)?,
        });
        let mut readers = self.readers.lock();
        if readers.len() >= self.config.open_packs_max {
            let victim = *readers.keys().next().expect("not empty");
            readers.remove(&victim);
        }
        readers.insert(pack, Arc::clone(&reader));
        Ok(reader)
    }

    /// Finds a valid id holding `hash`: in the dedup index's memory, the
    /// locality cache, or its runs (checked against the table). A damaged
    /// dedup run fails the lookup and has the index rebuilt before the next
    /// session.
    fn find(&self, state: &mut State, hash: &ChunkHash) -> Result<Option<ChunkId>, ChunkError> {
        if let Some(id) = state.dedup.find_in_memory(hash) {
            return Ok(Some(id));
        }
        if let Some(id) = state.locality.find(hash) {
            assert!(state.is_live(id) && !state.unslotted.contains(&id.0), "the cache forgets freed ids");
            state.locality.hit(id);
            self.counters.dedup_hits_nearby.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(id));
        }
        let mut candidates = Vec::new();
        if let Err(error) = state.dedup.find_in_runs(hash, &mut candidates) {
            state.dedup_damage.get_or_insert_with(|| error.to_string());
            return Err(error);
        }
        for id in candidates {
            let slotted = state.is_live(id) && !state.unslotted.contains(&id.0);
            if slotted && self.table.read(id)?.is_some_and(|slot| slot.hash == *hash) {
                if state.locality.hit(id) {
                    self.read_ahead(state, id)?;
                }
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Puts the hashes of the ids after `id` in the locality cache: one
    /// sequential read of their table slots. Slots that do not decode are
    /// left to the lookups that need them.
    fn read_ahead(&self, state: &mut State, id: ChunkId) -> Result<(), ChunkError> {
        let first = id.0 + 1;
        let end = (id.0 + locality::WINDOW_IDS).min(self.table.id_end()).min(state.counts.len() as u64);
        if first >= end {
            return Ok(());
        }
        let mut bytes = Vec::new();
        self.table.read_range(first, end - first, &mut bytes)?;
        for index in 0..(end - first) as usize {
            let id = ChunkId(first + index as u64);
            if !state.is_live(id) || state.unslotted.contains(&id.0) {
                continue;
            }
            if let Ok(Some(slot)) = self.table.slot_in(&bytes, first, id) {
                state.locality.insert(slot.hash, id);
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> ChunkStats {
        let state = self.state.lock();
        let pack_bytes: u64 = state.packs.values().map(|pack| pack.bytes).sum();
        let slack: u64 = state.packs.values().map(PackStats::slack).sum();
        // Borrowed chunks take no bytes here.
        let held = (state.live + state.dead).saturating_sub(state.borrowed_chunks);
        let dead_estimate = (state.held_stored_bytes * state.dead).checked_div(held).unwrap_or(0);
        let counter = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ChunkStats {
            chunks_live: state.live,
            chunks_dead: state.dead,
            references: state.references,
            logical_bytes: state.logical_bytes,
            unique_raw_bytes: state.held_raw_bytes,
            unique_stored_bytes: state.held_stored_bytes,
            pack_count: state.packs.len() as u64,
            pack_bytes,
            reclaimable_bytes: slack + dead_estimate,
            table_bytes: self.table.id_end() * rewind_format::chunks::TABLE_SLOT_BYTES as u64,
            dedup_entries: state.dedup.entry_count(),
            dedup_runs: state.dedup.run_count() as u64,
            memory_bytes: (state.counts.capacity() * 4) as u64
                + state.dedup.memory_bytes()
                + state.locality.memory_bytes(),
            chunks_written: counter(&self.counters.chunks_written),
            raw_bytes_written: counter(&self.counters.raw_bytes_written),
            stored_bytes_written: counter(&self.counters.stored_bytes_written),
            chunks_adopted: counter(&self.counters.chunks_adopted),
            adopted_bytes: counter(&self.counters.adopted_bytes),
            dedup_hits: counter(&self.counters.dedup_hits),
            dedup_hits_nearby: counter(&self.counters.dedup_hits_nearby),
            collections: counter(&self.counters.collections),
            chunks_freed: counter(&self.counters.chunks_freed),
            packs_deleted: counter(&self.counters.packs_deleted),
            packs_rewritten: counter(&self.counters.packs_rewritten),
            chunks_relocated: counter(&self.counters.chunks_relocated),
            dedup_hits_peers: counter(&self.counters.dedup_hits_peers),
            borrowed_chunks: state.borrowed_chunks,
            borrowed_stored_bytes: state.borrowed_stored_bytes,
            poisoned: self.poisoned.lock().clone(),
            recount_pending: state.recount.clone(),
            chunks_missing: state.missing.len() as u64,
            packs_footer_damaged: state.packs.values().filter(|pack| pack.footer_damaged).count() as u64,
            counts_restored: state.counts_restored,
        }
    }

    /// The size of the chunks in `set`, read from the table window by window
    /// (the windows holding none are skipped).
    pub fn measure(&self, set: &ChunkSet) -> Result<Measured, ChunkError> {
        let mut measured = Measured::default();
        let mut bytes = Vec::new();
        let id_end = self.table.id_end();
        let mut first = 1;
        while first < id_end {
            let count = SCAN_IDS.min(id_end - first);
            if set.any_in(first, count) {
                self.table.read_range(first, count, &mut bytes)?;
                for index in 0..count as usize {
                    let id = ChunkId(first + index as u64);
                    if !set.contains(id.0) {
                        continue;
                    }
                    let slot = self.table.slot_in(&bytes, first, id).map_err(|error| ChunkError::Missing {
                        id,
                        reason: format!("its table slot is damaged: {error}"),
                    })?;
                    if let Some(slot) = slot {
                        measured.chunks += 1;
                        measured.raw_bytes += u64::from(slot.raw_bytes);
                        measured.stored_bytes += u64::from(slot.stored_bytes);
                    }
                }
            }
            first += count;
        }
        Ok(measured)
    }

    /// Whether a collection would free anything: dead chunks, or packs worth
    /// rewriting.
    pub fn collection_due(&self) -> bool {
        let state = self.state.lock();
        state.dead > 0 || state.packs.values().any(|pack| self.worth_rewriting(pack))
    }

    /// Mostly dead, or damaged in its footer (rewriting mends it).
    fn worth_rewriting(&self, pack: &PackStats) -> bool {
        pack.footer_damaged
            || (PACK_OVERHEAD_BYTES + pack.held_bytes) * 100 < pack.bytes * self.config.repack_live_percent
    }

    /// Garbage collection: frees every chunk nothing refers to, deletes packs
    /// left empty, and rewrites the live chunks of mostly dead packs into new
    /// ones. Waits for merges in flight; archiving waits for it.
    pub fn collect(&self, progress: &mut dyn FnMut(CollectPhase, u64, u64)) -> Result<CollectReport, ChunkError> {
        let _gate = self.gate.write();
        let _writing = self.writing.lock();
        self.check_poisoned()?;
        let state = self.state.lock();
        assert!(!state.closed, "the store is open");
        if let Some(cause) = state.recount.clone() {
            return Err(ChunkError::CountsStale { cause });
        }
        drop(state);
        let mut report = CollectReport::default();
        self.sweep(&mut report, progress).map_err(|error| self.fail(error))?;
        self.repack(&mut report, progress).map_err(|error| self.fail(error))?;
        self.counters.collections.fetch_add(1, Ordering::Relaxed);
        self.counters.chunks_freed.fetch_add(report.chunks_freed, Ordering::Relaxed);
        self.counters.packs_deleted.fetch_add(report.packs_deleted, Ordering::Relaxed);
        self.counters.packs_rewritten.fetch_add(report.packs_rewritten, Ordering::Relaxed);
        Ok(report)
    }

    /// Frees the ids whose count is zero, reading their slots window by
    /// window to know what their packs lose.
    fn sweep(
        &self,
        report: &mut CollectReport,
        progress: &mut dyn FnMut(CollectPhase, u64, u64),
    ) -> Result<(), ChunkError> {
        let id_end = self.state.lock().counts.len() as u64;
        assert!(id_end <= self.table.id_end().max(1), "every allocated id has a slot outside a session");
        let mut bytes = Vec::new();
        let mut first = 1;
        while first < id_end {
            let count = SCAN_IDS.min(id_end - first);
            let has_dead = self.state.lock().counts[first as usize..(first + count) as usize].contains(&0);
            if has_dead {
                self.table.read_range(first, count, &mut bytes)?;
                let mut state = self.state.lock();
                for index in 0..count as usize {
                    let id = ChunkId(first + index as u64);
                    if state.counts[id.0 as usize] != 0 {
                        continue;
                    }
                    state.counts[id.0 as usize] = FREE;
                    state.dead -= 1;
                    state.free_hint = state.free_hint.min(id.0);
                    report.chunks_freed += 1;
                    // A missing chunk history no longer needs has nothing to give back.
                    if state.missing.remove(&id.0).is_some() {
                        continue;
                    }
                    // A dead chunk's slot was valid when it was counted (open or put).
                    let slot = self
                        .table
                        .slot_in(&bytes, first, id)
                        .map_err(|error| ChunkError::corrupt(self.table.path(), id.0 * 64, error))?
                        .ok_or_else(|| {
                            ChunkError::corrupt(self.table.path(), id.0 * 64, "slot of a counted chunk is empty")
                        })?;
                    if self.is_borrowed(&slot) {
                        state.borrowed_chunks -= 1;
                        state.borrowed_stored_bytes -= u64::from(slot.stored_bytes);
                        // A stale slot naming another node's pack would
                        // keep its owner from deleting it (`crate::peers`).
                        self.table.clear(id)?;
                        continue;
                    }
                    state.held_raw_bytes -= u64::from(slot.raw_bytes);
                    state.held_stored_bytes -= u64::from(slot.stored_bytes);
                    if let Some(pack) = state.packs.get_mut(&slot.pack) {
                        pack.free(slot.stored_bytes);
                    }
                }
            }
            first += count;
            progress(CollectPhase::Sweep, first - 1, id_end - 1);
        }
        let mut state = self.state.lock();
        let state = &mut *state;
        let counts = &state.counts;
        state.dedup.forget(|id| counts.get(id.0 as usize).is_some_and(|&count| count != FREE));
        state.locality.clear();
        Ok(())
    }

    /// Deletes packs that hold nothing, and rewrites those mostly dead (and
    /// small ones) into packs of about the target size.
    fn repack(
        &self,
        report: &mut CollectReport,
        progress: &mut dyn FnMut(CollectPhase, u64, u64),
    ) -> Result<(), ChunkError> {
        let (empty, mut candidates): (Vec<u64>, Vec<(u64, PackStats)>) = {
            let state = self.state.lock();
            let empty =
                state.packs.iter().filter(|(_, pack)| pack.held_chunks == 0).map(|(&number, _)| number).collect();
            let small = |pack: &PackStats| pack.bytes < self.config.pack_bytes_target / 4;
            let candidates: Vec<(u64, PackStats)> = state
                .packs
                .iter()
                .filter(|(_, pack)| !pack.left_damaged)
                .filter(|(_, pack)| pack.held_chunks > 0 && (self.worth_rewriting(pack) || small(pack)))
                .map(|(&number, &pack)| (number, pack))
                .collect();
            (empty, candidates)
        };
        if !empty.is_empty() {
            self.replace_packs(0, &empty, &[])?;
            let mut state = self.state.lock();
            for pack in &empty {
                report.bytes_reclaimed += state.packs.remove(pack).map_or(0, |stats| stats.bytes);
            }
            report.packs_deleted += empty.len() as u64;
        }
        // One small pack alone is not worth rewriting.
        let worth_alone = |pack: &PackStats| self.worth_rewriting(pack);
        if candidates.len() == 1 && !worth_alone(&candidates[0].1) {
            candidates.clear();
        }
        self.rewrite_in_groups(&candidates, report, progress)
    }

    /// Rewrites the live chunks of the small packs among `packs` (under a
    /// quarter of the target size, holding live chunks) into packs of about
    /// the target size; returns how many packs were rewritten. For packs
    /// waiting for their upload to a bucket: they go up together rather
    /// than as small objects.
    pub fn coalesce(&self, packs: &[u64]) -> Result<u64, ChunkError> {
        let _gate = self.gate.write();
        let _writing = self.writing.lock();
        self.check_poisoned()?;
        let candidates: Vec<(u64, PackStats)> = {
            let state = self.state.lock();
            assert!(!state.closed, "the store is open");
            let small = |pack: &&PackStats| {
                pack.held_chunks > 0 && pack.bytes < self.config.pack_bytes_target / 4 && !pack.left_damaged
            };
            packs
                .iter()
                .filter_map(|number| state.packs.get(number).filter(small).map(|&pack| (*number, pack)))
                .collect()
        };
        if candidates.len() < 2 {
            return Ok(0);
        }
        let mut report = CollectReport::default();
        self.rewrite_in_groups(&candidates, &mut report, &mut |_, _, _| {}).map_err(|error| self.fail(error))?;
        self.counters.packs_rewritten.fetch_add(report.packs_rewritten, Ordering::Relaxed);
        Ok(report.packs_rewritten)
    }

    /// Copies the live chunks `ids` (each once, in this order) into new
    /// packs in that order, so that a reader in that order reads them
    /// together: history is archived in the order it was written, a view of
    /// one point in it is read in block order (`rewind_engine`'s defrag).
    /// Chunks that already lie in runs of neighbouring records averaging
    /// [`RELOCATE_RUN_CHUNKS_MIN`], or in one run, stay where they are, and so do chunks
    /// borrowed from other nodes' packs. The old records become dead space
    /// that collection reclaims; each pack written is put in place as a
    /// repack's is (crash-safely, through the repack intent), deleting none.
    pub fn relocate(&self, ids: &[ChunkId]) -> Result<RelocateReport, ChunkError> {
        let _gate = self.gate.write();
        let _writing = self.writing.lock();
        self.check_poisoned()?;
        let chunks = self.relocatable(ids)?;
        let mut report = RelocateReport {
            chunks: chunks.len() as u64,
            runs_before: runs_of_records(&chunks),
            ..RelocateReport::default()
        };
        // One run is in order however short (a small view's, or one piece).
        if report.runs_before <= 1 || report.runs_before * RELOCATE_RUN_CHUNKS_MIN <= report.chunks {
            return Ok(report);
        }
        self.relocate_in_packs(&chunks, &mut report).map_err(|error| self.fail(error))?;
        self.counters.chunks_relocated.fetch_add(report.chunks_moved, Ordering::Relaxed);
        Ok(report)
    }

    /// The distinct ids of `ids`, in order, that are live and held by one of
    /// this node's packs, with their slots.
    fn relocatable(&self, ids: &[ChunkId]) -> Result<Vec<(ChunkId, TableSlot)>, ChunkError> {
        let mut seen = rustc_hash::FxHashSet::default();
        let mut chunks = Vec::with_capacity(ids.len());
        for &id in ids {
            if !seen.insert(id) || !self.state.lock().is_live(id) {
                continue;
            }
            if let Some(slot) = self.table.read(id)? {
                if self.state.lock().packs.contains_key(&slot.pack) {
                    chunks.push((id, slot));
                }
            }
        }
        Ok(chunks)
    }

    /// Writes `chunks` in order into packs of about the target size, each
    /// put in place once sealed.
    fn relocate_in_packs(
        &self,
        chunks: &[(ChunkId, TableSlot)],
        report: &mut RelocateReport,
    ) -> Result<(), ChunkError> {
        let (mut record, mut raw) = (Vec::new(), Vec::new());
        let mut rest = chunks;
        while !rest.is_empty() {
            let number = self.take_pack_number();
            let mut writer = PackWriter::create(&*self.packs, number)?;
            let (mut moved, mut moved_from): (Vec<(ChunkId, TableSlot)>, Vec<TableSlot>) = (Vec::new(), Vec::new());
            let mut taken = 0;
            let copied = (|| {
                for &(id, slot) in rest {
                    if writer.bytes() >= self.config.pack_bytes_target {
                        break;
                    }
                    taken += 1;
                    raw.resize(slot.raw_bytes as usize, 0);
                    let (codec, stored) = match self.reader(slot.pack)?.read_record(
                        location_of(&slot),
                        &slot.hash,
                        &mut record,
                        &mut raw,
                        Check::Crc,
                    ) {
                        Ok(read) => read,
                        Err(error @ ChunkError::Corrupt { .. }) => {
                            tracing::error!(%error, chunk = %id, "a chunk to lay out in order is damaged; it is left where it is");
                            report.chunks_damaged += 1;
                            continue;
                        }
                        Err(error) => return Err(error),
                    };
                    let location = writer.add_stored(id, slot.hash, codec, &record[stored], slot.raw_bytes)?;
                    moved.push((id, slot_of(slot.hash, location)));
                    moved_from.push(slot);
                }
                Ok(())
            })();
            if let Err(error) = copied {
                // Nothing refers to the new pack yet.
                if let Err(discard) = writer.discard() {
                    tracing::warn!(%discard, "cannot delete the unfinished pack of a failed relocation");
                }
                return Err(error);
            }
            rest = &rest[taken..];
            if moved.is_empty() {
                writer.discard()?;
                continue;
            }
            let sealed = writer.seal()?;
            self.replace_packs(number, &[], &moved)?;
            let mut state = self.state.lock();
            for old in &moved_from {
                state.packs.get_mut(&old.pack).expect("a pack of this node").free(old.stored_bytes);
            }
            let mut stats = PackStats::new(sealed.bytes);
            for (_, slot) in &moved {
                stats.hold(slot.stored_bytes);
            }
            state.packs.insert(number, stats);
            report.chunks_moved += moved.len() as u64;
            report.bytes_written += sealed.bytes;
        }
        Ok(())
    }

    /// Rewrites `candidates` in groups whose live chunks fill about a pack.
    fn rewrite_in_groups(
        &self,
        candidates: &[(u64, PackStats)],
        report: &mut CollectReport,
        progress: &mut dyn FnMut(CollectPhase, u64, u64),
    ) -> Result<(), ChunkError> {
        let total: u64 = candidates.iter().map(|(_, pack)| pack.bytes).sum();
        let mut done = 0;
        let mut group: Vec<u64> = Vec::new();
        let mut group_held = 0;
        for (index, &(number, pack)) in candidates.iter().enumerate() {
            group.push(number);
            group_held += pack.held_bytes;
            done += pack.bytes;
            let last = index + 1 == candidates.len();
            let next_overflows = candidates
                .get(index + 1)
                .is_some_and(|(_, next)| group_held + next.held_bytes > self.config.pack_bytes_target);
            if last || next_overflows {
                self.rewrite_group(&group, report)?;
                group.clear();
                group_held = 0;
            }
            progress(CollectPhase::Repack, done, total);
        }
        Ok(())
    }

    /// Counts a chunk stored: its raw and its stored bytes.
    fn count_written(&self, raw_bytes: u32, stored_bytes: u32) {
        self.counters.chunks_written.fetch_add(1, Ordering::Relaxed);
        self.counters.raw_bytes_written.fetch_add(u64::from(raw_bytes), Ordering::Relaxed);
        self.counters.stored_bytes_written.fetch_add(u64::from(stored_bytes), Ordering::Relaxed);
    }

    /// A number for a new pack of this node.
    fn take_pack_number(&self) -> u64 {
        let mut state = self.state.lock();
        state.pack_next += 1;
        state.pack_next - 1
    }

    /// Copies the live chunks of `group` into one new pack, then replaces them.
    fn rewrite_group(&self, group: &[u64], report: &mut CollectReport) -> Result<(), ChunkError> {
        let number = self.take_pack_number();
        let mut writer = PackWriter::create(&*self.packs, number)?;
        let mut moved: Vec<(ChunkId, TableSlot)> = Vec::new();
        let mut copying = 0;
        let copied = (|| {
            let (mut record, mut raw) = (Vec::new(), Vec::new());
            let mut bytes_before = 0;
            for &pack in group {
                copying = pack;
                let reader = self.reader(pack)?;
                bytes_before += reader.bytes();
                for (id, slot) in self.live_entries(&reader)? {
                    raw.resize(slot.raw_bytes as usize, 0);
                    let (codec, stored) =
                        reader.read_record(location_of(&slot), &slot.hash, &mut record, &mut raw, Check::Hash)?;
                    let location = writer.add_stored(id, slot.hash, codec, &record[stored], slot.raw_bytes)?;
                    moved.push((id, slot_of(slot.hash, location)));
                }
            }
            Ok(bytes_before)
        })();
        let bytes_before = match copied {
            Ok(bytes) => bytes,
            Err(error) => {
                // Nothing refers to the new pack yet: it goes, the old ones stay.
                if let Err(discard) = writer.discard() {
                    tracing::warn!(%discard, "cannot delete the unfinished pack of a failed repack");
                }
                if !matches!(error, ChunkError::Corrupt { .. }) {
                    return Err(error);
                }
                // Damage stays with the pack that has it: the group goes
                // on without it.
                tracing::error!(pack = %pack_name(copying), %error, "a pack to rewrite is damaged; it is left as it is");
                if let Some(stats) = self.state.lock().packs.get_mut(&copying) {
                    stats.left_damaged = true;
                }
                let rest: Vec<u64> = group.iter().copied().filter(|&pack| pack != copying).collect();
                return match rest.is_empty() {
                    true => Ok(()),
                    false => self.rewrite_group(&rest, report),
                };
            }
        };
        let sealed = writer.seal()?;
        self.replace_packs(number, group, &moved)?;
        let mut state = self.state.lock();
        for pack in group {
            state.packs.remove(pack);
        }
        let mut stats = PackStats::new(sealed.bytes);
        for (_, slot) in &moved {
            stats.hold(slot.stored_bytes);
        }
        state.packs.insert(number, stats);
        report.packs_rewritten += group.len() as u64;
        report.packs_written += 1;
        report.chunks_moved += moved.len() as u64;
        report.bytes_reclaimed += bytes_before.saturating_sub(sealed.bytes);
        Ok(())
    }

    /// The live chunks of the pack `reader` reads, with their slots: the
    /// footer's entries the table still points at, or, for a pack whose
    /// footer is damaged or an adopted journal segment, every live id the
    /// table points into it (one scan of the table).
    fn live_entries(&self, reader: &PackReader) -> Result<Vec<(ChunkId, TableSlot)>, ChunkError> {
        let pack = reader.pack();
        if !self.state.lock().packs.get(&pack).is_some_and(|stats| stats.footer_damaged || stats.adopted) {
            let mut live = Vec::new();
            for entry in reader.footer()? {
                if let Some(slot) = self.holds(pack, &entry)? {
                    live.push((entry.id, slot));
                }
            }
            return Ok(live);
        }
        let mut live = Vec::new();
        let mut bytes = Vec::new();
        let id_end = self.table.id_end();
        let mut first = 1;
        while first < id_end {
            let count = SCAN_IDS.min(id_end - first);
            self.table.read_range(first, count, &mut bytes)?;
            for index in 0..count as usize {
                let id = ChunkId(first + index as u64);
                if let (true, Ok(Some(slot))) = (self.state.lock().is_live(id), self.table.slot_in(&bytes, first, id)) {
                    if slot.pack == pack {
                        live.push((id, slot));
                    }
                }
            }
            first += count;
        }
        Ok(live)
    }

    /// The slot of `entry` of `pack` if that is the live copy of its chunk.
    fn holds(&self, pack: u64, entry: &FooterEntry) -> Result<Option<TableSlot>, ChunkError> {
        if !self.state.lock().is_live(entry.id) {
            return Ok(None);
        }
        let slot = self.table.read(entry.id)?;
        Ok(slot.filter(|slot| slot.pack == pack && u64::from(slot.offset) == entry.offset))
    }

    /// Points `moved` ids at `new` (a sealed pack, or 0 for none) and deletes
    /// the `old` packs, crash-safely through the repack intent.
    fn replace_packs(&self, new: u64, old: &[u64], moved: &[(ChunkId, TableSlot)]) -> Result<(), ChunkError> {
        let intent_path = format!("{}/{REPACK_INTENT}", self.dir);
        let intent = RepackIntent { new, old: old.to_vec() };
        write_file_atomic(&*self.storage, &intent_path, &intent.encode()).map_err(ChunkError::io(&intent_path))?;
        // From here on the intent must be carried out; a failure part-way
        // leaves it to the next start (which completes it), so it poisons.
        self.carry_out(old, moved, &intent_path).map_err(|error| match error {
            ChunkError::SyncFailed { .. } => error,
            other => ChunkError::SyncFailed {
                path: intent_path.clone(),
                source: std::io::Error::other(format!("a repack stopped after its intent was written: {other}")),
            },
        })
    }

    fn carry_out(&self, old: &[u64], moved: &[(ChunkId, TableSlot)], intent_path: &str) -> Result<(), ChunkError> {
        for (id, slot) in moved {
            self.table.write(*id, slot)?;
        }
        self.table.sync()?;
        let mut readers = self.readers.lock();
        for &pack in old {
            readers.remove(&pack);
            self.packs.delete(pack).map_err(ChunkError::sync_or_io(&self.packs.locate(pack)))?;
        }
        drop(readers);
        self.storage.remove_file(intent_path).map_err(ChunkError::io(intent_path))?;
        self.storage.sync_dir(&self.dir).map_err(ChunkError::sync(&self.dir))
    }

    /// Writes the in-memory dedup entries out (before a clean shutdown, so
    /// the next open reads fewer pack footers).
    pub fn flush_dedup(&self) -> Result<(), ChunkError> {
        let _writing = self.writing.lock();
        self.check_poisoned()?;
        let mut state = self.state.lock();
        let covered = state.packs.keys().next_back().copied().unwrap_or(0);
        let state = &mut *state;
        let counts = &state.counts;
        let is_live = |id: ChunkId| counts.get(id.0 as usize).is_some_and(|&count| count != FREE);
        state.dedup.flush(covered, &is_live).map_err(|error| self.fail(error))
    }
}

/// The runs of neighbouring records `chunks` lie in, taken in order: a run
/// goes on while the next record starts where the one before ends (with
/// its padding), in the same pack.
fn runs_of_records(chunks: &[(ChunkId, TableSlot)]) -> u64 {
    let record_end = |slot: &TableSlot| match slot.bare_crc32c {
        Some(_) => u64::from(slot.offset) + u64::from(slot.stored_bytes),
        None => u64::from(slot.offset) + record_bytes(slot).next_multiple_of(8),
    };
    let follows = |before: &TableSlot, after: &TableSlot| {
        after.pack == before.pack && u64::from(after.offset) == record_end(before)
    };
    let breaks = chunks.windows(2).filter(|pair| !follows(&pair[0].1, &pair[1].1)).count() as u64;
    if chunks.is_empty() {
        0
    } else {
        breaks + 1
    }
}

/// Where the chunk `slot` names is: [`slot_of`] the other way.
fn location_of(slot: &TableSlot) -> ChunkLocation {
    ChunkLocation {
        pack: slot.pack,
        offset: u64::from(slot.offset),
        stored_bytes: slot.stored_bytes,
        raw_bytes: slot.raw_bytes,
        bare_crc32c: slot.bare_crc32c,
    }
}

/// The bytes of the chunk `slot` names in its pack, without padding: its
/// record, or its bare bytes.
fn record_bytes(slot: &TableSlot) -> u64 {
    record_header_bytes(location_of(slot)) as u64 + u64::from(slot.stored_bytes)
}

fn slot_of(hash: ChunkHash, location: ChunkLocation) -> TableSlot {
    TableSlot {
        hash,
        pack: location.pack,
        offset: u32::try_from(location.offset).expect("packs stay below 4 GiB"),
        stored_bytes: location.stored_bytes,
        raw_bytes: location.raw_bytes,
        bare_crc32c: location.bare_crc32c,
    }
}

/// Completes a repack a crash interrupted (see [`ChunkStore::replace_packs`]).
fn finish_repack(
    storage: &dyn Storage,
    dir: &str,
    packs: &Arc<dyn PackStore>,
    table: &ChunkTable,
) -> Result<(), ChunkError> {
    let path = format!("{dir}/{REPACK_INTENT}");
    if !storage.exists(&path).map_err(ChunkError::io(&path))? {
        return Ok(());
    }
    let bytes = read_file_healing(storage, &path, healed).map_err(ChunkError::io(&path))?;
    let intent = match RepackIntent::decode(&bytes) {
        Ok(intent) => intent,
        Err(error) => {
            // Both copies damaged. Carrying it out is not needed for safety:
            // the old packs are deleted only after every slot points at the
            // new one, so each live chunk is in a pack its slot names; the
            // next collection tidies up what the repack left.
            tracing::warn!(%path, %error, "ignoring a damaged repack intent");
            storage.remove_file(&path).map_err(ChunkError::io(&path))?;
            return storage.sync_dir(dir).map_err(ChunkError::sync(dir));
        }
    };
    tracing::info!(new = intent.new, old = ?intent.old, "completing an interrupted repack");
    if intent.new != 0 {
        // Sealed before the intent was written.
        let reader = PackReader::open(packs, intent.new)?;
        for entry in reader.footer()? {
            table.write(entry.id, &slot_of(entry.hash, reader.location(&entry)))?;
        }
        table.sync()?;
    }
    for pack in intent.old {
        packs.delete(pack).map_err(ChunkError::sync_or_io(&packs.locate(pack)))?;
    }
    storage.remove_file(&path).map_err(ChunkError::io(&path))?;
    storage.sync_dir(dir).map_err(ChunkError::io(dir))
}

/// Where an archived version's bytes lie in a sealed journal segment, for
/// [`ArchiveSession::put_from_journal`].
#[derive(Debug)]
pub struct InSegment<'a> {
    /// The segment file's path in the storage the node's stores share.
    pub path: &'a str,
    /// Where the bytes start in the file.
    pub offset: u64,
    /// Their CRC-32C (the version's, which the caller checked them against).
    pub crc32c: u32,
    /// The pack the store adopted the segment as, if it did (the caller
    /// keeps it, so that a segment archived in parts is adopted once); set
    /// when it is adopted.
    pub adopted_as: &'a mut Option<u64>,
}

/// Puts chunks into the store: one archive pass of one volume. Chunks are
/// readable, and may be referred to durably, once [`ArchiveSession::finish`]
/// returns. A session that fails, or is dropped or abandoned unfinished,
/// deletes its unfinished pack and has the dedup index forget the chunks it
/// put; nothing durable refers to them, and the next recount frees them.
pub struct ArchiveSession<'a> {
    store: &'a ChunkStore,
    _writing: MutexGuard<'a, ()>,
    writer: Option<PackWriter>,
    compressor: Compressor,
    /// A chunk's bytes as stored, compressed or not.
    stored: Vec<u8>,
    /// Chunks in the open pack, and in packs sealed by this session.
    unsealed: Vec<(ChunkId, TableSlot)>,
    sealed: Vec<(ChunkId, TableSlot)>,
    /// Chunks borrowed from other nodes' packs (`crate::peers`).
    borrowed: Vec<(ChunkId, TableSlot)>,
    /// Ids this session handed out (their slots are written by `finish`).
    new_ids: Vec<ChunkId>,
    done: bool,
}

impl ArchiveSession<'_> {
    /// Stores `raw` (or finds it stored) and counts one reference to it.
    pub fn put(&mut self, raw: &[u8]) -> Result<ChunkId, ChunkError> {
        let result = self.put_inner(raw, None);
        result.map_err(|error| self.abandon_with(error))
    }

    /// [`ArchiveSession::put`] of a version whose bytes lie `in_segment`, a
    /// sealed journal segment. Bytes that are new and do not compress are
    /// not copied: they stay where they are, a bare chunk of the segment,
    /// which is adopted as a pack ([`PackStore::adopt`]) unless
    /// `in_segment.adopted_as` names the pack it was adopted as and the
    /// store still has it (then its bytes are that pack's). What dedup or
    /// compression saves on is stored as `put` stores it.
    pub fn put_from_journal(&mut self, raw: &[u8], in_segment: InSegment<'_>) -> Result<ChunkId, ChunkError> {
        let result = self.put_inner(raw, Some(in_segment));
        result.map_err(|error| self.abandon_with(error))
    }

    /// Gives up: nothing it put will be referred to (the archive pass that
    /// uses it failed).
    pub fn abandon(mut self) {
        let error = ChunkError::Io { path: self.store.dir.clone(), source: std::io::Error::other("abandoned") };
        self.abandon_with(error);
    }

    fn abandon_with(&mut self, error: ChunkError) -> ChunkError {
        let store = self.store;
        self.done = true;
        if let Some(writer) = self.writer.take() {
            if let Err(discard) = writer.discard() {
                tracing::warn!(%discard, "cannot delete the unfinished pack of a failed archive pass");
            }
        }
        if !self.new_ids.is_empty() || !self.sealed.is_empty() {
            let mut state = store.state.lock();
            let forgotten: rustc_hash::FxHashSet<u64> = self.new_ids.iter().map(|id| id.0).collect();
            // They stay unslotted, so no lookup hands them out, until a
            // recount frees them.
            state.dedup.forget(|id| !forgotten.contains(&id.0));
            state.recount.get_or_insert_with(|| format!("an archive pass stopped part-way: {error}"));
        }
        store.fail(error)
    }

    fn put_inner(&mut self, raw: &[u8], in_segment: Option<InSegment<'_>>) -> Result<ChunkId, ChunkError> {
        let store = self.store;
        let hash = chunk_hash(raw);
        let raw_bytes = u32::try_from(raw.len()).expect("chunks are blocks");
        let id = {
            let mut state = store.state.lock();
            if let Some(id) = store.find(&mut state, &hash)? {
                state.reference(id, raw_bytes);
                store.counters.dedup_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(id);
            }
            let borrowed = store.peer_chunk(&hash, raw_bytes);
            let id = state.allocate();
            state.reference(id, raw_bytes);
            state.dedup.insert(hash, id);
            state.unslotted.insert(id.0);
            self.new_ids.push(id);
            if let Some(slot) = borrowed {
                self.borrowed.push((id, slot));
                store.counters.dedup_hits_peers.fetch_add(1, Ordering::Relaxed);
                return Ok(id);
            }
            id
        };
        let codec = self.compressor.compress(raw, &mut self.stored);
        if let (Codec::Raw, Some(in_segment)) = (codec, in_segment) {
            assert_eq!(crc32c(raw), in_segment.crc32c, "the caller checked the bytes against their CRC");
            let pack = self.adopt(in_segment.path, in_segment.adopted_as)?;
            let offset = u32::try_from(in_segment.offset).expect("journal segments stay below 4 GiB");
            let slot = TableSlot {
                hash,
                pack,
                offset,
                stored_bytes: raw_bytes,
                raw_bytes,
                bare_crc32c: Some(in_segment.crc32c),
            };
            let mut state = store.state.lock();
            state.packs.get_mut(&pack).expect("adopted above").hold(raw_bytes);
            state.held_raw_bytes += u64::from(raw_bytes);
            state.held_stored_bytes += u64::from(raw_bytes);
            self.sealed.push((id, slot));
            store.count_written(raw_bytes, raw_bytes);
            store.counters.chunks_adopted.fetch_add(1, Ordering::Relaxed);
            store.counters.adopted_bytes.fetch_add(u64::from(raw_bytes), Ordering::Relaxed);
            return Ok(id);
        }
        if self.writer.is_none() {
            self.writer = Some(PackWriter::create(&*store.packs, store.take_pack_number())?);
        }
        let writer = self.writer.as_mut().expect("opened above");
        let location = writer.add_stored(id, hash, codec, &self.stored, raw_bytes)?;
        self.unsealed.push((id, slot_of(hash, location)));
        store.count_written(raw_bytes, location.stored_bytes);
        if writer.bytes() >= store.config.pack_bytes_target {
            self.seal()?;
        }
        Ok(id)
    }

    /// The pack of the journal segment at `path`: `adopted_as`, if the
    /// store still has that pack (collection deletes one whose chunks all
    /// died), else adopted now — the file gets the pack's name, durably,
    /// and its chunks' slots may then be written as any sealed pack's.
    fn adopt(&mut self, path: &str, adopted_as: &mut Option<u64>) -> Result<u64, ChunkError> {
        let store = self.store;
        if let Some(pack) = *adopted_as {
            if store.state.lock().packs.get(&pack).is_some_and(|stats| stats.adopted) {
                return Ok(pack);
            }
        }
        let pack = store.take_pack_number();
        let file = store.storage.open_file(path, OpenMode::Existing).map_err(ChunkError::io(path))?;
        let bytes = file.size_bytes().map_err(ChunkError::io(path))?;
        let located = store.packs.locate(pack);
        store.packs.adopt(pack, path, &*file).map_err(ChunkError::sync_or_io(&located))?;
        tracing::debug!(%path, pack = %pack_name(pack), "adopted a journal segment as a pack");
        store.state.lock().packs.insert(pack, PackStats { adopted: true, ..PackStats::new(bytes) });
        *adopted_as = Some(pack);
        Ok(pack)
    }

    fn seal(&mut self) -> Result<(), ChunkError> {
        let Some(writer) = self.writer.take() else { return Ok(()) };
        let sealed = writer.seal()?;
        let mut state = self.store.state.lock();
        let mut stats = PackStats::new(sealed.bytes);
        for (_, slot) in &self.unsealed {
            stats.hold(slot.stored_bytes);
            state.held_raw_bytes += u64::from(slot.raw_bytes);
            state.held_stored_bytes += u64::from(slot.stored_bytes);
        }
        state.packs.insert(sealed.pack, stats);
        self.sealed.append(&mut self.unsealed);
        Ok(())
    }

    /// Seals the open pack and makes every new chunk's slot durable: from
    /// now on runs may refer to the ids this session handed out.
    pub fn finish(mut self) -> Result<(), ChunkError> {
        let result = self.finish_inner();
        match result {
            Ok(()) => {
                self.done = true;
                Ok(())
            }
            Err(error) => Err(self.abandon_with(error)),
        }
    }

    fn finish_inner(&mut self) -> Result<(), ChunkError> {
        self.seal()?;
        if self.sealed.is_empty() && self.borrowed.is_empty() {
            return Ok(());
        }
        let store = self.store;
        let slots = || self.sealed.iter().chain(&self.borrowed);
        let id_end = slots().map(|(id, _)| id.0 + 1).max().expect("not empty");
        store.table.reserve(id_end)?;
        for (id, slot) in slots() {
            store.table.write(*id, slot)?;
        }
        store.table.sync()?;
        let mut state = store.state.lock();
        for id in &self.new_ids {
            state.unslotted.remove(&id.0);
        }
        for (_, slot) in &self.borrowed {
            state.borrowed_chunks += 1;
            state.borrowed_stored_bytes += u64::from(slot.stored_bytes);
        }
        self.borrowed.clear();
        if state.dedup.is_full() {
            let covered = state.packs.keys().next_back().copied().unwrap_or(0);
            let state = &mut *state;
            let counts = &state.counts;
            let is_live = |id: ChunkId| counts.get(id.0 as usize).is_some_and(|&count| count != FREE);
            // The entries stay in memory if this fails (a full disk, say);
            // the next session's flush writes them.
            if let Err(error) = state.dedup.flush(covered, &is_live) {
                tracing::warn!(%error, "cannot write the dedup index's memory out yet");
            }
        }
        Ok(())
    }
}

impl Drop for ArchiveSession<'_> {
    fn drop(&mut self) {
        if !self.done {
            let error =
                ChunkError::Io { path: self.store.dir.clone(), source: std::io::Error::other("stopped part-way") };
            self.abandon_with(error);
        }
    }
}

/// Counts one reference to `id` (see [`ChunkStore::mark`]).
fn mark_in(state: &mut State, id: ChunkId, raw_bytes: u32) -> Result<(), ChunkError> {
    let Some(count) = state.counts.get_mut(id.0 as usize).filter(|_| id.0 > 0) else {
        return Err(ChunkError::Missing { id, reason: "the chunk table has no such id".into() });
    };
    if *count == FREE {
        *count = 0;
        state.dead += 1;
    }
    state.reference(id, raw_bytes);
    Ok(())
}

/// Adds the chunks of `pack`'s footer that the table agrees are its live
/// copies to `dedup` (opening, for packs the dedup runs do not cover).
fn index_footer(
    packs: &Arc<dyn PackStore>,
    pack: u64,
    table: &ChunkTable,
    dedup: &mut DedupIndex,
) -> Result<(), ChunkError> {
    let reader = PackReader::open(packs, pack)?;
    for entry in reader.footer()? {
        // A damaged slot is mended (or reported) once references are counted.
        let current = table.read(entry.id).unwrap_or(None);
        if current.is_some_and(|slot| slot.hash == entry.hash && slot.pack == pack) {
            dedup.insert(entry.hash, entry.id);
        }
    }
    Ok(())
}

/// Whether `error` says a pack is not there: a repack deleted it since its
/// table slot was read.
fn pack_gone(error: &ChunkError) -> bool {
    matches!(error, ChunkError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}
