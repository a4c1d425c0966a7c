//! A volume in its node's catalog, and rebuilt from it (issue 14 req 3; the
//! node's side is `crate::catalog`).
//!
//! What a volume needs to be rebuilt from its bucket is its archived
//! history — the archived runs of its version index, whose versions are
//! chunks — and the small files that say what it is and what its history
//! means: `volume.meta`, `bookmarks`, `policy`, `reverts`, `timeline`. Its
//! journal, recent runs and current store are not needed: a rebuilt volume
//! is the volume as it was at its index's *archived before*, the newest
//! point every version before which is archived. Its present is that point,
//! written into a new current store from the index; its bookmarks and
//! reverts after it are left out (their points were not uploaded); a new
//! journal starts after it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rewind_chunks::ChunkStore;
use rewind_format::current::{BlockMeta, BlockState};
use rewind_format::meta::{Bookmarks, Checkpoint, IndexManifest, Reverts, TimelineFrame, VolumeMeta};
use rewind_index::{IndexConfig, PageCache, Run, VersionIndex};
use rewind_io::{write_file_atomic, OpenMode, Storage};
use rewind_journal::Journal;
use rewind_types::{BlockIndex, ChunkId, Lsn, Timestamp, VersionData};

use crate::current::CurrentStore;
use crate::device_io::VolumeIo;
use crate::layout::{Indexing, LayoutRules};
use crate::volume::history::merge_buckets;
use crate::volume::maintenance::write_checkpoint;
use crate::volume::recovery::corrupt_file;
use crate::{EngineError, Volume, VolumeConfig};

/// The files of a volume's directory a catalog keeps as they are.
pub(crate) const CATALOGED_FILES: [&str; 5] = ["volume.meta", "bookmarks", "policy", "reverts", "timeline"];

/// The blocks rebuilt at a time, and how many batches at once.
const REBUILD_BATCH_BLOCKS: u64 = 1024;
const REBUILD_THREADS: usize = 4;

impl Volume {
    /// Why a volume made as `meta` says cannot be rebuilt from its
    /// archived history alone, if it cannot.
    pub(crate) fn not_rebuildable(meta: &VolumeMeta) -> Option<String> {
        if LayoutRules::of(meta.layout).indexing != Indexing::AtWrite {
            return Some(format!(
                "its layout ({}) keeps only some versions as history, so its present is not in the bucket",
                meta.layout.name()
            ));
        }
        if meta.base.as_ref().is_some_and(|base| base.copied) {
            return Some("it is a promoted clone, and its copy of its base is not in the bucket".into());
        }
        None
    }

    /// The archived part of the index (see [`VersionIndex::archived_part`]).
    pub(crate) fn archived_part(&self) -> (IndexManifest, Vec<Arc<Run>>) {
        self.index.archived_part()
    }

    /// Adds to `ids` the chunk of each block's newest version that is
    /// archived: what a read of the present needs from the chunk store when
    /// the layout keeps no current store (MYCDP's hot set, `Node::publish_catalog`).
    pub(crate) fn present_chunks(&self, ids: &mut Vec<ChunkId>) -> Result<(), EngineError> {
        const BATCH: u64 = 4096;
        let block_count = self.meta.size_bytes / u64::from(self.meta.block_size.bytes());
        let mut blocks = Vec::with_capacity(BATCH as usize);
        let mut first = 0;
        while first < block_count {
            blocks.clear();
            blocks.extend(first..(first + BATCH).min(block_count));
            for version in self.index.find_le_many(&blocks, Timestamp::MAX)?.into_iter().flatten() {
                if let VersionData::Chunk(id) = version.data {
                    ids.push(id);
                }
            }
            first += BATCH;
        }
        Ok(())
    }
}

/// A volume rebuilt from a catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuiltVolume {
    pub name: String,
    /// The point it was rebuilt at: its present, and its newest history.
    pub at: Timestamp,
    /// Blocks of its present written from history.
    pub blocks: u64,
    pub bookmarks: usize,
    /// Bookmarks after `at`, left out (names).
    pub bookmarks_left_out: Vec<String>,
    pub reverts_left_out: usize,
}

/// Writes the directory `dir` of a volume from its cataloged `files`
/// (`name → bytes`, names relative to `dir`, the index's under `index/`),
/// reading its present from `chunks`. `volume.meta` is written last: until
/// then the directory is an unfinished creation, which opening removes.
pub(crate) fn rebuild(
    storage: &Arc<dyn Storage>,
    dir: &str,
    files: &BTreeMap<String, Vec<u8>>,
    config: &VolumeConfig,
    cache: Arc<PageCache>,
    chunks: &ChunkStore,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RebuiltVolume, EngineError> {
    let file = |name: &str| -> Result<&Vec<u8>, EngineError> {
        files.get(name).ok_or_else(|| EngineError::Corrupt {
            volume: dir.rsplit('/').next().unwrap_or(dir).to_owned(),
            detail: format!("the catalog holds no {dir}/{name}"),
        })
    };
    let decoded = |name: &str, error| corrupt_file(&format!("{dir}/{name}"), error);
    let meta = VolumeMeta::decode(file("volume.meta")?).map_err(|error| decoded("volume.meta", error))?;
    let manifest = IndexManifest::decode(file("index/manifest")?).map_err(|error| decoded("index/manifest", error))?;
    let at = manifest.archived_before.max(meta.created);
    storage.create_dir_all(&format!("{dir}/index")).map_err(EngineError::io(dir))?;
    for (name, bytes) in files.range("index/".to_owned()..).take_while(|(name, _)| name.starts_with("index/")) {
        if name != "index/manifest" {
            let path = format!("{dir}/{name}");
            write_file_atomic(&**storage, &path, bytes).map_err(EngineError::io(&path))?;
        }
    }
    let path = format!("{dir}/index/manifest");
    write_file_atomic(&**storage, &path, file("index/manifest")?).map_err(EngineError::io(&path))?;

    let io = VolumeIo::new(storage);
    let journal = Journal::create(io.journal(), &format!("{dir}/journal"), meta.block_size, config.journal, at)?;
    let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
    let mut blocks = 0;
    if LayoutRules::of(meta.layout).has_current_store() {
        let index_config = IndexConfig { late_entries: false, ..config.index };
        let index = VersionIndex::open(io.index(), &format!("{dir}/index"), index_config, cache)?;
        let current = CurrentStore::open(&*io.current(), dir, meta.block_size, block_count, OpenMode::CreateNew)?;
        blocks = write_present(&meta, &index, &current, chunks, progress)?;
        current.sync()?;
    }

    // What was kept of its history is kept; what comes after `at` was not uploaded.
    let mut bookmarks = Bookmarks::decode(file("bookmarks")?).map_err(|error| decoded("bookmarks", error))?;
    let (kept, left_out): (Vec<_>, Vec<_>) = bookmarks.entries.drain(..).partition(|bookmark| bookmark.timestamp < at);
    bookmarks.entries = kept;
    bookmarks.laid_out.retain(|&laid_out| laid_out < at);
    let mut reverts = match files.get("reverts") {
        Some(bytes) => Reverts::decode(bytes).map_err(|error| decoded("reverts", error))?,
        None => Reverts::default(),
    };
    let reverts_before = reverts.entries.len();
    reverts.entries.retain(|revert| revert.at < at);
    let mut buckets = BTreeMap::new();
    let (frames, _) = TimelineFrame::decode_all(file("timeline")?);
    for frame in frames {
        let minute_at = at.unix_nanos() / 60_000_000_000;
        let kept = frame.buckets.into_iter().filter(|bucket| bucket.minute <= minute_at);
        merge_buckets(&mut buckets, kept.map(|bucket| (bucket.minute, bucket)));
    }
    // One frame covering no journal record: the new journal's are counted.
    let timeline = TimelineFrame { lsn_last: Lsn::ZERO, buckets: buckets.into_values().collect() };
    let writes = [
        ("bookmarks", bookmarks.encode()),
        ("policy", file("policy")?.clone()),
        ("reverts", reverts.encode()),
        ("timeline", timeline.encode()),
    ];
    for (name, bytes) in writes {
        let path = format!("{dir}/{name}");
        write_file_atomic(&**storage, &path, &bytes).map_err(EngineError::io(&path))?;
    }
    let checkpoint = Checkpoint { lsn: Lsn::ZERO, replay_from: journal.position_next(), timestamp_last: at };
    write_checkpoint(&**storage, dir, &checkpoint)?;
    let path = format!("{dir}/volume.meta");
    write_file_atomic(&**storage, &path, file("volume.meta")?).map_err(EngineError::io(&path))?;
    Ok(RebuiltVolume {
        name: meta.name.to_string(),
        at,
        blocks,
        bookmarks: bookmarks.entries.len(),
        bookmarks_left_out: left_out.into_iter().map(|bookmark| bookmark.name.to_string()).collect(),
        reverts_left_out: reverts_before - reverts.entries.len(),
    })
}

/// Writes each block's newest version in `index` into `current` (blocks
/// with none stay unwritten: zeros, or a clone's base); returns how many.
/// Batches of blocks are rebuilt by [`REBUILD_THREADS`] threads at once, so
/// the bucket's GETs, the opening of sealed segments and the checks run on
/// every core.
fn write_present(
    meta: &VolumeMeta,
    index: &VersionIndex,
    current: &CurrentStore,
    chunks: &ChunkStore,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, EngineError> {
    let block_bytes = meta.block_size.bytes() as usize;
    let block_count = meta.size_bytes / block_bytes as u64;
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let (report, reports) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..REBUILD_THREADS)
            .map(|_| {
                let report = report.clone();
                let (next, done) = (&next, &done);
                scope.spawn(move || -> Result<u64, EngineError> {
                    let mut written = 0;
                    let mut data = Vec::new();
                    loop {
                        let first = next.fetch_add(REBUILD_BATCH_BLOCKS, Ordering::Relaxed);
                        if first >= block_count {
                            return Ok(written);
                        }
                        written += write_batch(meta, index, current, chunks, first, &mut data)?;
                        let blocks = (block_count - first).min(REBUILD_BATCH_BLOCKS);
                        let _ = report.send(done.fetch_add(blocks, Ordering::Relaxed) + blocks);
                    }
                })
            })
            .collect();
        drop(report);
        for blocks_done in reports {
            progress(blocks_done, block_count);
        }
        workers.into_iter().map(|worker| worker.join().expect("a rebuild thread does not panic")).sum()
    })
}

/// Rebuilds the blocks of the batch from `first`; returns how many had a version.
fn write_batch(
    meta: &VolumeMeta,
    index: &VersionIndex,
    current: &CurrentStore,
    chunks: &ChunkStore,
    first: u64,
    data: &mut Vec<u8>,
) -> Result<u64, EngineError> {
    let block_bytes = meta.block_size.bytes() as usize;
    let block_count = meta.size_bytes / block_bytes as u64;
    let corrupt = |detail: String| EngineError::Corrupt { volume: meta.name.to_string(), detail };
    let mut written = 0;
    let blocks: Vec<u64> = (first..block_count.min(first + REBUILD_BATCH_BLOCKS)).collect();
    let found = index.find_le_many(&blocks, Timestamp::MAX)?;
    let ids: Vec<ChunkId> = found
        .iter()
        .filter_map(|version| match version.as_ref()?.data {
            VersionData::Chunk(id) => Some(id),
            _ => None,
        })
        .collect();
    data.resize(ids.len() * block_bytes, 0);
    let mut crcs = chunks.read_many(&ids, data)?.into_iter();
    let mut stored = data.chunks_exact(block_bytes);
    // Neighbouring data blocks go to the current store in one write.
    let mut run: Option<(u64, Vec<u8>, Vec<BlockMeta>)> = None;
    for (&block, version) in blocks.iter().zip(&found) {
        let follows = run.as_ref().is_some_and(|(first, _, metas)| *first + metas.len() as u64 == block);
        let is_data = version.as_ref().is_some_and(|version| matches!(version.data, VersionData::Chunk(_)));
        if !(follows && is_data) {
            if let Some((first, bytes, metas)) = run.take() {
                current.write_blocks(BlockIndex(first), &bytes, &metas)?;
            }
        }
        let Some(version) = version else { continue };
        match version.data {
            VersionData::Chunk(id) => {
                let bytes = stored.next().expect("one stored block per chunk id");
                if crcs.next().expect("one CRC per chunk id") != version.crc32c {
                    return Err(corrupt(format!("block {block}: chunk {} does not match its version's CRC", id.0)));
                }
                let meta = BlockMeta { state: BlockState::Data, crc32c: version.crc32c, timestamp: version.timestamp };
                let (_, run_bytes, metas) = run.get_or_insert_with(|| (block, Vec::new(), Vec::new()));
                run_bytes.extend_from_slice(bytes);
                metas.push(meta);
            }
            VersionData::Zero => {
                let meta = BlockMeta { state: BlockState::Zero, crc32c: version.crc32c, timestamp: version.timestamp };
                current.zero_blocks(BlockIndex(block), &[meta])?;
            }
            VersionData::Journal { .. } => {
                return Err(corrupt(format!("block {block}: an archived run names a journal version")));
            }
        }
        written += 1;
    }
    if let Some((first, bytes, metas)) = run.take() {
        current.write_blocks(BlockIndex(first), &bytes, &metas)?;
    }
    Ok(written)
}
