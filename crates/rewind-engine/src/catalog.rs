//! The node in its bucket (issue 14 req 3): a *catalog* names everything a
//! node needs besides its packs to be rebuilt — the chunk table, each
//! volume's archived index runs and metadata (`volume::rebuild`), the
//! consistency groups, files the embedder names — as content-addressed pieces
//! (`docs/format/bucket.md`). [`Node::publish_catalog`] takes one and
//! publishes it after what it names; [`Node::recover`] rebuilds a node on
//! an empty data directory from the newest.
//!
//! What keeps a catalog true:
//! Besides the volumes and the chunk table, a catalog keeps the node's
//! consistency groups and whatever files of the data directory's top level
//! the embedder names (the CLI: its access grants); a recovery writes them
//! back.
//!
//! What keeps a catalog true:
//! - It is taken with collection held off ([`ChunkStore::hold_references`]):
//!   no chunk id the captured runs name is freed, reused or moved between
//!   capturing the runs and reading the table, so each id's slot names
//!   the bytes its versions were archived as.
//! - It is published (one write-once object, `catalogs/N`) only after every
//!   piece and every pack the captured table may name is in the bucket: a
//!   reader never sees a catalog naming an object not yet uploaded.
//! - A pack deleted locally stays in the bucket until a catalog taken after
//!   its deletion is published (`rewind_chunks::tiered`, *retired* packs),
//!   so the newest catalog's packs are there. Catalogs are kept
//!   [`CATALOGS_KEPT`] deep; pieces no kept catalog names are deleted.
//!
//! The RPO is what the newest catalog does not hold: history not yet
//! archived (`--archive-interval`) or not yet published (`--upload-interval`).

use std::collections::{btree_map, BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_chunks::meta_store::MetaStore;
use rewind_chunks::retention::{locked, Retention, RetentionReport};
use rewind_chunks::tiered::TieredPackStore;
use rewind_chunks::{ChunkStore, ChunkStoreConfig, LocalPackStore, PackStore};
use rewind_format::catalog::{Catalog, CatalogFile, PIECE_BYTES};
use rewind_format::groups::Groups;
use rewind_format::meta::{IndexManifest, VolumeMeta};
use rewind_index::{run_file_name, Run};
use rewind_io::{read_file, write_file_atomic, Storage};
use rewind_types::Timestamp;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::group::GROUPS_FILE;
use crate::node::{volume_dir, Bucket, CHUNKS_DIR, VOLUMES_DIR};
use crate::pool::{Members, Pool, PoolStatus};
use crate::volume::rebuild::{rebuild, RebuiltVolume, CATALOGED_FILES};
use crate::{EngineError, Node, NodeConfig, Volume};

/// Catalogs kept in the bucket: the newest and the two before it.
pub const CATALOGS_KEPT: usize = 3;

/// The node's side of its catalogs.
pub(crate) struct Catalogs {
    store: Arc<dyn MetaStore>,
    retention: Option<Arc<dyn Retention>>,
    /// The other nodes sharing the bucket, if any (`crate::pool`).
    members: Option<Members>,
    state: Mutex<CatalogState>,
}

#[derive(Default)]
struct CatalogState {
    /// The bucket's catalogs and pieces have been listed.
    listed: bool,
    /// The newest catalogs, oldest first (at most [`CATALOGS_KEPT`]).
    kept: VecDeque<Catalog>,
    /// Older catalogs the bucket's object lock keeps (a delete was refused),
    /// by generation: their pieces stay too.
    held: BTreeMap<u64, Catalog>,
    /// Pieces in the bucket.
    pieces: FxHashSet<[u8; 32]>,
    /// Of them, those whose delete the bucket's object lock refused: their
    /// hold is let run out, so a catalog that names one again writes it
    /// again, which has it held again.
    refused: FxHashSet<[u8; 32]>,
    /// Index runs already cut into pieces, by [`Run::uid`]: runs never change.
    runs: FxHashMap<u64, CatalogFile>,
    /// When the newest catalog was last found to describe the node.
    current_at: Option<Timestamp>,
    /// Per volume in the newest catalog, the point it rebuilds it at.
    points: Vec<(String, Timestamp)>,
    /// The last catalog this node wrote without learning whether the write
    /// took (its reply lost): found there later, it is this node's.
    unanswered: Option<Vec<u8>>,
}

/// What [`Node::publish_catalog`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub generation: u64,
    pub files: usize,
    pub pieces_uploaded: usize,
    pub bytes_uploaded: u64,
}

/// What the newest catalog holds, for `rewind stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogStatus {
    pub generation: u64,
    pub taken: Timestamp,
    /// When the node last found it to describe it (nothing archived since).
    pub current_at: Timestamp,
    /// Per volume in it, the point it would be recovered at.
    pub volumes: Vec<(String, Timestamp)>,
    /// Older catalogs the bucket's object lock keeps: points a node can
    /// still be recovered at (`--as-of`).
    pub held_catalogs: usize,
    /// The bucket's object lock, if any.
    pub lock: Option<RetentionReport>,
    /// The other nodes sharing the bucket, if any.
    pub pool: Option<PoolStatus>,
}

/// What a catalog is made of: its files (by path), and the packs the
/// captured chunk table may name (sorted).
struct Capture {
    files: Vec<(String, Captured)>,
    packs: Vec<u64>,
}

/// A file captured for a catalog.
enum Captured {
    Bytes(Vec<u8>),
    /// A volume's archived index manifest.
    Manifest(String, IndexManifest),
    Run(Arc<Run>),
}

/// What [`Node::recover`] rebuilt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub generation: u64,
    pub taken: Timestamp,
    pub volumes: Vec<RebuiltVolume>,
    /// Volumes not rebuilt, with why.
    pub left_out: Vec<(String, String)>,
    pub bytes_downloaded: u64,
}

impl Catalogs {
    pub(crate) fn new(
        store: Arc<dyn MetaStore>,
        retention: Option<Arc<dyn Retention>>,
        pool: Option<Pool>,
    ) -> Catalogs {
        Catalogs { store, retention, members: pool.map(Members::new), state: Mutex::default() }
    }
}

fn bucket_error(error: std::io::Error) -> EngineError {
    EngineError::io("the bucket")(error)
}

/// The newest catalog in `store` taken at or before `as_of` (the newest of
/// all without it), if any.
pub(crate) fn newest(store: &dyn MetaStore, as_of: Option<Timestamp>) -> Result<Option<Catalog>, EngineError> {
    let names = store.list("catalogs").map_err(bucket_error)?;
    let mut generations: Vec<u64> = names.iter().filter_map(|name| Catalog::parse_name(name)).collect();
    generations.sort_unstable();
    for &generation in generations.iter().rev() {
        let catalog = fetch_catalog(store, generation)?;
        if as_of.is_none_or(|as_of| catalog.taken <= as_of) {
            return Ok(Some(catalog));
        }
    }
    Ok(None)
}

fn fetch_catalog(store: &dyn MetaStore, generation: u64) -> Result<Catalog, EngineError> {
    let name = Catalog::name(generation);
    let bytes = store.get(&name).map_err(bucket_error)?;
    Catalog::decode(&bytes).map_err(|error| EngineError::Corrupt {
        volume: String::new(),
        detail: format!("{}: {error}", store.locate(&name)),
    })
}

/// Per volume in `catalog`, the point a recovery rebuilds it at (read
/// from its index manifest's pieces).
fn recovery_points(store: &dyn MetaStore, catalog: &Catalog) -> Result<Vec<(String, Timestamp)>, EngineError> {
    let mut points = Vec::new();
    for file in &catalog.files {
        let Some(name) =
            file.path.strip_prefix(&format!("{VOLUMES_DIR}/")).and_then(|rest| rest.strip_suffix("/index/manifest"))
        else {
            continue;
        };
        let bytes = fetch_file(store, file)?;
        let manifest = IndexManifest::decode(&bytes).map_err(|error| EngineError::Corrupt {
            volume: name.to_owned(),
            detail: format!("{} in the catalog: {error}", file.path),
        })?;
        points.push((name.to_owned(), manifest.archived_before));
    }
    Ok(points)
}

/// A cataloged file's bytes, each piece checked against its name.
pub(crate) fn fetch_file(store: &dyn MetaStore, file: &CatalogFile) -> Result<Vec<u8>, EngineError> {
    let mut bytes = Vec::with_capacity(file.bytes as usize);
    for hash in &file.pieces {
        let name = Catalog::piece_name(hash);
        let piece = store.get(&name).map_err(bucket_error)?;
        if store.content_hash(&piece) != *hash {
            return Err(EngineError::Corrupt {
                volume: String::new(),
                detail: format!("{} does not hash to its name", store.locate(&name)),
            });
        }
        bytes.extend_from_slice(&piece);
    }
    if bytes.len() as u64 != file.bytes {
        return Err(EngineError::Corrupt {
            volume: String::new(),
            detail: format!("{}: {} bytes, the catalog says {}", file.path, bytes.len(), file.bytes),
        });
    }
    Ok(bytes)
}

impl Node {
    /// Takes a catalog of the node and, if it differs from the newest in the
    /// bucket, publishes it after every piece and pack it names; then
    /// deletes the bucket's copies of packs retired before it, and
    /// catalogs and pieces no longer kept. `None` without a bucket, or when
    /// a pack it may name is still being uploaded by another thread (the
    /// next call publishes it). Calls are serialised.
    /// `node_files` are top-level files of the data directory to keep too.
    pub fn publish_catalog(&self, now: Timestamp, node_files: &[&str]) -> Result<Option<Published>, EngineError> {
        let (Some(tiered), Some(catalogs)) = (&self.tiered, &self.catalogs) else { return Ok(None) };
        let mut state = catalogs.state.lock();
        if !state.listed {
            let names = catalogs.store.list("catalogs").map_err(bucket_error)?;
            let mut generations: Vec<u64> = names.iter().filter_map(|name| Catalog::parse_name(name)).collect();
            generations.sort_unstable();
            let kept = generations.len().saturating_sub(CATALOGS_KEPT);
            state.kept = generations[kept..]
                .iter()
                .map(|&generation| fetch_catalog(&*catalogs.store, generation))
                .collect::<Result<_, _>>()?;
            state.pieces = catalogs
                .store
                .list("pieces")
                .map_err(bucket_error)?
                .iter()
                .filter_map(|name| parse_hex_hash(name))
                .collect();
            state.points = match state.kept.back() {
                Some(newest) => recovery_points(&*catalogs.store, newest)?,
                None => Vec::new(),
            };
            state.listed = true;
        }
        // What the other nodes sharing the bucket store, before this
        // catalog: what it borrows is what they had published. A bucket
        // that does not answer here does not stop the catalog.
        if let Some(members) = &catalogs.members {
            if let Err(error) = members.refresh(now, &self.shared.chunks) {
                tracing::warn!(%error, "cannot read the other nodes' catalogs; their packs are kept");
            }
        }
        // Holds first: a catalog that waits for its packs must not let the
        // bucket's older objects go.
        if let Some(retention) = &catalogs.retention {
            retention.extend().map_err(bucket_error)?;
        }
        // MYCDP's hot set: the versions the present reads stay on the disk.
        // Advisory: a failure here must not hold the catalog back.
        if let Err(error) = self.keep_present_local(tiered) {
            tracing::warn!(%error, "cannot name the packs the present reads; they may be evicted");
        }
        // Small packs waiting for their upload go up as one (or a few).
        let small = tiered.waiting_small();
        if small.len() > 1 {
            // Waits for archive passes to end.
            let _wanted = self.shared.passes_wanted.hold();
            self.shared.chunks.coalesce(&small)?;
        }
        let epoch = tiered.begin_capture();
        let Capture { files: captured, packs } = self.capture(tiered, node_files)?;
        let points: Vec<(String, Timestamp)> = captured
            .iter()
            .filter_map(|(_, content)| match content {
                Captured::Manifest(volume, manifest) => Some((volume.clone(), manifest.archived_before)),
                _ => None,
            })
            .collect();
        // Every pack the captured table may name goes first.
        while tiered.upload_next().map_err(bucket_error)?.is_some() {}
        // (One a collection deleted before its upload is not: the catalog
        // waits for a capture that does not name it.)
        if !tiered.all_uploaded(&packs) {
            return Ok(None);
        }
        let mut files = Vec::with_capacity(captured.len());
        let (mut pieces_uploaded, mut bytes_uploaded) = (0, 0);
        for (path, content) in captured {
            let uid = match &content {
                Captured::Run(run) => Some(run.uid()),
                Captured::Bytes(_) | Captured::Manifest(..) => None,
            };
            if let Some(file) = uid.and_then(|uid| state.runs.get(&uid)).filter(|file| file.path == path) {
                files.push(file.clone());
                continue;
            }
            let bytes = match content {
                Captured::Bytes(bytes) => bytes,
                Captured::Manifest(_, manifest) => manifest.encode(),
                Captured::Run(run) => run.read_bytes()?,
            };
            let mut pieces = Vec::new();
            for piece in bytes.chunks(PIECE_BYTES as usize) {
                let hash = catalogs.store.content_hash(piece);
                if !state.pieces.contains(&hash) || state.refused.contains(&hash) {
                    match catalogs.store.put_new(&Catalog::piece_name(&hash), piece) {
                        // Content-addressed: what is there is this piece.
                        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                            return Err(bucket_error(error));
                        }
                        _ => {}
                    }
                    // Only once written again: a failed write tries again next time.
                    state.refused.remove(&hash);
                    state.pieces.insert(hash);
                    pieces_uploaded += 1;
                    bytes_uploaded += piece.len() as u64;
                }
                pieces.push(hash);
            }
            let file = CatalogFile { path, bytes: bytes.len() as u64, pieces };
            if let Some(uid) = uid {
                state.runs.insert(uid, file.clone());
            }
            files.push(file);
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let republish = |newest: &Catalog| {
            catalogs.members.as_ref().is_some_and(|members| members.republish_due(newest.taken, now))
        };
        let unchanged = state.kept.back().is_some_and(|newest| newest.files == files && !republish(newest));
        let published = match unchanged {
            true => None,
            false => {
                let mut generation = state.kept.back().map_or(0, |newest| newest.generation) + 1;
                let catalog = loop {
                    let catalog = Catalog { generation, taken: now, files: files.clone() };
                    let name = Catalog::name(generation);
                    let encoded = catalog.encode();
                    let unanswered_before = state.unanswered.replace(encoded.clone());
                    let error = match catalogs.store.put_new(&name, &encoded) {
                        Ok(()) => {
                            state.unanswered = None;
                            break catalog;
                        }
                        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => error,
                        Err(error) => return Err(bucket_error(error)),
                    };
                    // Ours if it holds what this node wrote there and never
                    // heard back about (a reply lost): kept as published,
                    // and this catalog follows it. Taken for someone
                    // else's, every later catalog chose the same name and
                    // failed the same way, until a restart.
                    let there = catalogs.store.get(&name).map_err(bucket_error)?;
                    let ours = there == encoded || unanswered_before.as_ref() == Some(&there);
                    if !ours {
                        return Err(EngineError::Io {
                            path: catalogs.store.locate(&name),
                            source: std::io::Error::new(
                                error.kind(),
                                "written by someone else: another node publishes to this bucket and prefix",
                            ),
                        });
                    }
                    let adopted = Catalog::decode(&there).map_err(|error| EngineError::Io {
                        path: catalogs.store.locate(&name),
                        source: std::io::Error::other(error.to_string()),
                    })?;
                    state.kept.push_back(adopted);
                    generation += 1;
                };
                let report = Published { generation, files: catalog.files.len(), pieces_uploaded, bytes_uploaded };
                state.kept.push_back(catalog);
                state.points = points;
                Some(report)
            }
        };
        state.current_at = Some(now);
        // Nothing taken from here on may name what was retired before it.
        match &catalogs.members {
            None => tiered.delete_retired(epoch),
            Some(members) => tiered.delete_retired_unless(epoch, now.unix_nanos(), |pack, published_at| {
                members.holds(pack, Timestamp::from_unix_nanos(published_at))
            }),
        }
        .map_err(bucket_error)?;
        if published.is_some() || !state.held.is_empty() {
            self.prune_catalogs(catalogs, &mut state)?;
        }
        let live: FxHashSet<u64> = self.runs_held();
        state.runs.retain(|uid, _| live.contains(uid));
        Ok(published)
    }

    /// Keeps on the local tier, whatever `--cache-max`, the packs holding
    /// the newest archived version of every block of the volumes that read
    /// their present from history (no current store: `logging`); the other
    /// layouts' present is in their current store. Evicted ones come back
    /// (`Node::maintain_bucket`). Recent writes and views are the newest
    /// packs, which the tiered store keeps anyway.
    /// One index lookup per block of those volumes: only with a budget.
    fn keep_present_local(&self, tiered: &TieredPackStore) -> Result<(), EngineError> {
        if !tiered.evicts() {
            return Ok(());
        }
        let volumes: Vec<Arc<Volume>> =
            self.volumes.read().values().filter(|volume| !volume.rules().has_current_store()).cloned().collect();
        let mut ids = Vec::new();
        for volume in &volumes {
            volume.present_chunks(&mut ids)?;
        }
        tiered.keep_local(self.shared.chunks.packs_of(&mut ids)?);
        Ok(())
    }

    /// Deletes catalogs older than the kept ones, and pieces none names.
    /// Those the bucket's object lock holds stay, and a catalog held keeps
    /// its pieces: until its hold runs out it is a point a node can still
    /// be recovered at (`rewind node recover --as-of`).
    fn prune_catalogs(&self, catalogs: &Catalogs, state: &mut CatalogState) -> Result<(), EngineError> {
        let mut dropped: FxHashMap<u64, Catalog> = FxHashMap::default();
        while state.kept.len() > CATALOGS_KEPT {
            let catalog = state.kept.pop_front().expect("more than kept");
            dropped.insert(catalog.generation, catalog);
        }
        let oldest = state.kept.front().map_or(0, |catalog| catalog.generation);
        for name in catalogs.store.list("catalogs").map_err(bucket_error)? {
            let Some(generation) = Catalog::parse_name(&name).filter(|&generation| generation < oldest) else {
                continue;
            };
            match catalogs.store.delete(&format!("catalogs/{name}")) {
                Ok(()) => {
                    state.held.remove(&generation);
                }
                Err(error) if locked(&error).is_some() => {
                    if let btree_map::Entry::Vacant(entry) = state.held.entry(generation) {
                        entry.insert(match dropped.remove(&generation) {
                            Some(catalog) => catalog,
                            None => fetch_catalog(&*catalogs.store, generation)?,
                        });
                    }
                }
                Err(error) => return Err(bucket_error(error)),
            }
        }
        let named: FxHashSet<[u8; 32]> = state
            .kept
            .iter()
            .chain(state.held.values())
            .flat_map(|catalog| catalog.files.iter().flat_map(|file| file.pieces.iter().copied()))
            .collect();
        let unnamed: Vec<[u8; 32]> = state.pieces.iter().filter(|hash| !named.contains(*hash)).copied().collect();
        for hash in unnamed {
            match catalogs.store.delete(&Catalog::piece_name(&hash)) {
                Ok(()) => {}
                Err(error) if locked(&error).is_some() => {
                    state.refused.insert(hash);
                    continue;
                }
                Err(error) => return Err(bucket_error(error)),
            }
            state.pieces.remove(&hash);
            state.refused.remove(&hash);
        }
        Ok(())
    }

    /// The uids of the archived runs the volumes hold now.
    fn runs_held(&self) -> FxHashSet<u64> {
        let volumes: Vec<Arc<Volume>> = self.volumes.read().values().cloned().collect();
        let rebuildable = volumes.iter().filter(|volume| Volume::not_rebuildable(&volume.meta()).is_none());
        rebuildable.flat_map(|volume| volume.archived_part().1).map(|run| run.uid()).collect()
    }

    /// The files of a catalog, and the packs its table may name.
    fn capture(&self, tiered: &TieredPackStore, node_files: &[&str]) -> Result<Capture, EngineError> {
        let read = |path: &str| -> Result<Option<Vec<u8>>, EngineError> {
            match read_file(&*self.storage, path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(EngineError::io(path)(error)),
            }
        };
        let mut captured = Vec::new();
        let _collection_held_off = self.shared.chunks.hold_references();
        let volumes: Vec<Arc<Volume>> = self.volumes.read().values().cloned().collect();
        for volume in &volumes {
            let dir = volume_dir(volume.name().as_str());
            if Volume::not_rebuildable(&volume.meta()).is_some() {
                // Named, so that a recovery says why it is left out.
                captured.push((format!("{dir}/volume.meta"), Captured::Bytes(volume.meta().encode())));
                continue;
            }
            // The runs first: files read after them may only be newer.
            let (manifest, runs) = volume.archived_part();
            let name = volume.name().to_string();
            captured.push((format!("{dir}/index/manifest"), Captured::Manifest(name, manifest)));
            for run in runs {
                captured.push((format!("{dir}/index/{}", run_file_name(run.info().id)), Captured::Run(run)));
            }
            for name in CATALOGED_FILES {
                let path = format!("{dir}/{name}");
                if let Some(bytes) = read(&path)? {
                    captured.push((path, Captured::Bytes(bytes)));
                }
            }
        }
        for &path in [GROUPS_FILE].iter().chain(node_files) {
            if let Some(bytes) = read(path)? {
                captured.push((path.to_owned(), Captured::Bytes(bytes)));
            }
        }
        // After any archive pass in flight: what it borrowed from other
        // nodes sharing the bucket is in this catalog (`crate::pool`). One
        // paused for reads goes on at once, not after the reads.
        let bytes = {
            let _wanted = self.shared.passes_wanted.hold();
            self.shared.chunks.table_for_catalog()?
        };
        captured.push((format!("{CHUNKS_DIR}/table"), Captured::Bytes(bytes)));
        Ok(Capture { files: captured, packs: tiered.packs() })
    }

    /// What the newest catalog holds; `None` without a bucket or before one.
    pub fn catalog_status(&self) -> Option<CatalogStatus> {
        let state = self.catalogs.as_ref()?.state.lock();
        let newest = state.kept.back()?;
        Some(CatalogStatus {
            generation: newest.generation,
            taken: newest.taken,
            current_at: state.current_at.unwrap_or(newest.taken),
            volumes: state.points.clone(),
            held_catalogs: state.held.len(),
            lock: self.catalogs.as_ref()?.retention.as_ref().map(|retention| retention.report()),
            pool: self.catalogs.as_ref()?.members.as_ref().map(|members| members.status(&self.shared.chunks)),
        })
    }

    /// Rebuilds a node on the empty data directory of `storage` from the
    /// newest catalog in `bucket` (taken at or before `as_of`, if given: an
    /// older catalog a bucket's object lock kept, the node as it was before
    /// someone deleted its history): every volume it holds, as of the point
    /// its history was archived and published to, with its bookmarks and
    /// policies; its packs stay in the bucket (serve the node with it).
    /// `progress` hears what is being done, and how far.
    pub fn recover(
        storage: Arc<dyn Storage>,
        config: &NodeConfig,
        bucket: Bucket,
        as_of: Option<Timestamp>,
        progress: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Recovered, EngineError> {
        let occupied = |dir: &str| storage.list_dir(dir).map(|names| !names.is_empty()).unwrap_or(false);
        if occupied(VOLUMES_DIR) || storage.exists(&format!("{CHUNKS_DIR}/table")).unwrap_or(false) {
            return Err(EngineError::InvalidArgument(
                "the data directory holds a node already: recover into an empty one (--data-dir)".into(),
            ));
        }
        let Some(catalog) = newest(&*bucket.meta, as_of)? else {
            return Err(EngineError::InvalidArgument(match as_of {
                None => format!(
                    "no catalog in {}: nothing was published there (a node publishes one every --upload-interval \
                     once its history is archived)",
                    bucket.meta.locate("catalogs")
                ),
                Some(as_of) => format!(
                    "no catalog in {} was taken at or before {}: the oldest left is newer (older ones \
                     were pruned, or let go once their object lock ran out)",
                    bucket.meta.locate("catalogs"),
                    crate::timespec::DisplayTime(as_of)
                ),
            }));
        };
        let total: u64 = catalog.files.iter().map(|file| file.bytes).sum();
        let mut files = BTreeMap::new();
        let mut downloaded = 0;
        for file in &catalog.files {
            let bytes = fetch_file(&*bucket.meta, file)?;
            downloaded += file.bytes;
            progress("downloading the catalog", downloaded, total);
            files.insert(file.path.clone(), bytes);
        }

        // The chunk store: its table, over packs in the bucket.
        storage.create_dir_all(CHUNKS_DIR).map_err(EngineError::io(CHUNKS_DIR))?;
        storage.create_dir_all(VOLUMES_DIR).map_err(EngineError::io(VOLUMES_DIR))?;
        let table = format!("{CHUNKS_DIR}/table");
        let bytes = files.remove(&table).ok_or_else(|| EngineError::Corrupt {
            volume: String::new(),
            detail: format!("catalog {} holds no chunk table", catalog.generation),
        })?;
        write_file_atomic(&*storage, &table, &bytes).map_err(EngineError::io(&table))?;
        let packs_dir = format!("{CHUNKS_DIR}/packs");
        let local: Arc<dyn PackStore> =
            Arc::new(LocalPackStore::open(Arc::clone(&storage), &packs_dir).map_err(EngineError::io(&packs_dir))?);
        let tiered = TieredPackStore::open(local, bucket.packs, bucket.tier).map_err(bucket_error)?;
        progress("reading the packs' footers", 0, 1);
        let chunks_config = ChunkStoreConfig { node: bucket.tier.node, ..config.chunks };
        let chunks = ChunkStore::open_with_packs(Arc::clone(&storage), CHUNKS_DIR, chunks_config, Arc::new(tiered))?;
        let cache = rewind_index::PageCache::new(config.index_cache_bytes);

        // Each volume's files, by volume; bases before their clones.
        let mut by_volume: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
        for (path, bytes) in files.iter() {
            if let Some((volume, name)) =
                path.strip_prefix(&format!("{VOLUMES_DIR}/")).and_then(|rest| rest.split_once('/'))
            {
                by_volume.entry(volume.to_owned()).or_default().insert(name.to_owned(), bytes.clone());
            }
        }
        let mut rebuilt: BTreeMap<String, RebuiltVolume> = BTreeMap::new();
        let mut left_out = Vec::new();
        let mut pending: Vec<String> = by_volume.keys().cloned().collect();
        while !pending.is_empty() {
            let before = pending.len();
            let mut waiting = Vec::new();
            for name in pending {
                let volume_files = &by_volume[&name];
                let meta = volume_files.get("volume.meta").and_then(|bytes| VolumeMeta::decode(bytes).ok());
                let Some(meta) = meta else {
                    left_out.push((name, "its volume.meta is missing or damaged in the catalog".into()));
                    continue;
                };
                if let Some(reason) = Volume::not_rebuildable(&meta) {
                    left_out.push((name, reason));
                    continue;
                }
                if let Some(base) = &meta.base {
                    let base_name = base.volume.to_string();
                    match rebuilt.get(&base_name) {
                        Some(done) if base.at >= done.at => {
                            left_out.push((name, format!("its branch point is after {base_name}'s uploaded history")));
                            continue;
                        }
                        Some(_) => {}
                        None if by_volume.contains_key(&base_name)
                            && !left_out.iter().any(|(left, _)| *left == base_name) =>
                        {
                            waiting.push(name);
                            continue;
                        }
                        None => {
                            left_out.push((name, format!("its base {base_name} is not recovered")));
                            continue;
                        }
                    }
                }
                let dir = volume_dir(&name);
                let what = format!("rebuilding {name}");
                let volume = rebuild(
                    &storage,
                    &dir,
                    volume_files,
                    &config.volume,
                    Arc::clone(&cache),
                    &chunks,
                    &mut |done, total| progress(&what, done, total),
                )?;
                rebuilt.insert(name, volume);
            }
            if waiting.len() == before {
                for name in waiting {
                    left_out.push((name, "its base is not recovered".into()));
                }
                break;
            }
            pending = waiting;
        }

        // The node's own files: everything at the top level.
        for (path, bytes) in files.iter().filter(|(path, _)| !path.contains('/')) {
            let bytes = match path == GROUPS_FILE {
                true => groups_of(bytes, &rebuilt)?,
                false => bytes.clone(),
            };
            write_file_atomic(&*storage, path, &bytes).map_err(EngineError::io(path))?;
        }
        Ok(Recovered {
            generation: catalog.generation,
            taken: catalog.taken,
            volumes: rebuilt.into_values().collect(),
            left_out,
            bytes_downloaded: downloaded,
        })
    }
}

/// The groups file for the rebuilt volumes: members not rebuilt leave their
/// groups, group bookmarks not wholly before each member's point are left
/// out (as the members' own are), and a revert in progress is dropped (its
/// members were rebuilt at points before it).
fn groups_of(bytes: &[u8], rebuilt: &BTreeMap<String, RebuiltVolume>) -> Result<Vec<u8>, EngineError> {
    let mut groups = Groups::decode(bytes)
        .map_err(|error| EngineError::Corrupt { volume: String::new(), detail: format!("groups: {error}") })?;
    for group in &mut groups.entries {
        group.members.retain(|member| rebuilt.contains_key(member.as_str()));
        group.bookmarks.retain(|bookmark| {
            bookmark
                .members
                .iter()
                .all(|point| rebuilt.get(point.volume.as_str()).is_some_and(|volume| point.at < volume.at))
        });
        group.revert = None;
    }
    groups.entries.retain(|group| !group.members.is_empty());
    Ok(groups.encode())
}

fn parse_hex_hash(name: &str) -> Option<[u8; 32]> {
    if name.len() != 64 {
        return None;
    }
    let mut hash = [0; 32];
    for (index, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(name.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(hash)
}
