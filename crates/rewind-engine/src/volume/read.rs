//! Reading a volume: the present, and views of the past.
//!
//! A read first *plans* where each block comes from, then reads. In the
//! Logging layout, which has no current store, every block comes from the
//! version index, the present as well as the past. Otherwise, for the
//! present, a block comes from the overlay (its newest version is not in the
//! current store yet: read it from the journal) or from the current store. For
//! a view at `T`, the same holds for every block whose newest version is at or
//! before `T` — which the current store's per-block times tell without
//! touching the index — and the rest come from the version index. So opening
//! a view costs nothing, and reading one costs index lookups only for blocks
//! changed since `T`.
//!
//! The current store is read without locks. Should the destager rewrite a
//! block between our reading its metadata and its data, the block fails its
//! CRC check; the read is then planned and done again under the destage lock,
//! and only a second failure is reported as corruption. A read under the
//! write lock (a read-modify-write) needs no second try: the destager writes
//! only blocks in the overlay, and none leaves it meanwhile. Journal bytes never
//! change, so a journal block that fails its check is corruption at once.
//! Archived versions come from the chunk store, which checks the chunk's
//! hash; the version's own CRC is checked too. A journal segment reclaimed
//! between planning and reading (its versions were just archived) makes
//! the read plan again: the index already points at the archived copies.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rewind_format::current::{BlockMeta, BlockState};
use rewind_format::meta::Revert;
use rewind_journal::JournalError;
use rewind_types::{BlockIndex, ChunkId, Timestamp, Version, VersionData};

use crate::timespec::DisplayTime;
use crate::volume::WriteState;
use crate::{EngineError, Volume};

/// A read-only view of a volume as it was at one point in time.
pub struct View {
    volume: Arc<Volume>,
    at: Timestamp,
}

/// A second view of the same point: held again, as each view releases its
/// hold when dropped.
impl Clone for View {
    fn clone(&self) -> View {
        self.volume.hold_again(self.at);
        View { volume: Arc::clone(&self.volume), at: self.at }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.volume.release_time(self.at);
    }
}

impl View {
    /// A view at `at`, which the caller has just held (see `hold_exact_time`).
    pub(crate) fn holding(volume: Arc<Volume>, at: Timestamp) -> View {
        View { volume, at }
    }

    pub fn at(&self) -> Timestamp {
        self.at
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.volume.read_at(Some(self.at), offset, buf)
    }

    pub fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatus>, EngineError> {
        self.volume.block_status_at(Some(self.at), offset, length)
    }
}

/// One extent of allocation status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockStatus {
    pub length: u64,
    /// Data is stored for the extent (otherwise it is a hole).
    pub allocated: bool,
    /// The extent reads as zeros.
    pub zero: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Zero,
    /// Never written in this volume: a clone reads its base there.
    Base,
    Current {
        crc32c: u32,
    },
    Journal {
        segment: u32,
        offset: u32,
        crc32c: u32,
    },
    Chunk {
        id: ChunkId,
        crc32c: u32,
    },
}

impl Source {
    fn of_version(version: &Version) -> Source {
        match version.data {
            VersionData::Zero => Source::Zero,
            VersionData::Journal { segment, offset } => Source::Journal { segment, offset, crc32c: version.crc32c },
            VersionData::Chunk(id) => Source::Chunk { id, crc32c: version.crc32c },
        }
    }

    /// A current-store block that was written (an unwritten one is the
    /// base's, or zeros).
    fn of_meta(meta: &BlockMeta) -> Source {
        match meta.state {
            BlockState::Unwritten => unreachable!("an unwritten block has no source of its own"),
            BlockState::Zero => Source::Zero,
            BlockState::Data => Source::Current { crc32c: meta.crc32c },
        }
    }
}

/// See [`Volume::stretches`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Stretch {
    /// Bytes this volume never wrote: zeros, or a clone's base.
    Unwritten(u64),
    /// Blocks to plan: the first and how many.
    Plan(BlockIndex, u64),
}

/// The most looks ahead one block status or changes request takes
/// ([`Volume::stretches`]): each costs a few `lseek`s, and written blocks
/// scattered one in a hole would otherwise take one per block.
const LOOKS_MAX: usize = 1024;

/// A current-store block failed its check: maybe a race with the destager.
pub(super) struct Mismatch(pub(super) BlockIndex);

/// How a plan sees the overlay.
#[derive(Clone, Copy)]
pub(super) enum OverlayAccess<'a> {
    /// Take the write lock to look (if the overlay is not empty).
    Lock,
    /// The caller holds the write lock.
    Held(&'a WriteState),
}

/// How a plan takes the blocks a revert's background copy wrote, stamped
/// with the revert's time (see `revert_copy.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Copies {
    /// Where they are: in the current store (or the journal), like the
    /// present they are.
    Read,
    /// As the versions they copy, planned at the point the revert went
    /// back to: two plans then name the same version wherever the contents
    /// are the same, copied or not (changed-block tracking).
    Traced,
}

/// The most blocks one status request answers for (the reply may cover less
/// than was asked, as NBD allows).
pub(super) const STATUS_BLOCKS_MAX: u64 = 1 << 18;

/// A block's versions in the overlay, as a read at some time sees them.
#[derive(Clone, Copy)]
enum InOverlay {
    /// None: the block is in the current store (or history).
    No,
    /// Only versions after the time read.
    NoneVisible,
    /// The newest at or before it.
    Newest(Version),
}

impl Volume {
    /// A read-only view of the volume as it was at the latest exact point at
    /// or before `at` (see [`Volume::exact_time`]). Its state is pinned while
    /// it lives: retention and merges cannot change what it shows.
    ///
    /// `at` is at or before now (as [`Volume::parse_time`] makes sure):
    /// opening the view raises the volume's clock to it.
    pub fn view(self: &Arc<Self>, at: Timestamp) -> Result<View, EngineError> {
        self.check_settled()?;
        Ok(View::holding(Arc::clone(self), self.hold_exact_time(at)?))
    }

    /// A view at exactly `at`, a time some earlier view resolved to (work
    /// done a piece at a time, like a restore over the API): refused if
    /// `at` is no longer an exact point, rather than showing another. `at`
    /// comes from outside (an API query, a file handle), so one after `now`
    /// is refused too: opening a view raises the volume's clock to it.
    pub fn view_exactly(self: &Arc<Self>, at: Timestamp, now: Timestamp) -> Result<View, EngineError> {
        self.check_settled()?;
        self.check_in_history(at, now)?;
        self.hold_exactly(at)
    }

    /// [`Volume::view_exactly`] whether or not the volume has settled since
    /// a crash: a clone holds its base so from the start (its reads of the
    /// base wait for that, as views do).
    pub(crate) fn hold_exactly(self: &Arc<Self>, at: Timestamp) -> Result<View, EngineError> {
        let view = View::holding(Arc::clone(self), self.hold_exact_time(at)?);
        if view.at() != at {
            return Err(EngineError::InvalidArgument(format!(
                "volume {} no longer keeps {} exactly (retention, the space cap or a history delete changed it \
                 since it was chosen); choose a point that is kept, such as a bookmark",
                self.name(),
                DisplayTime(at)
            )));
        }
        Ok(view)
    }

    /// Reads the present contents at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.read_at(None, offset, buf)
    }

    /// Allocation status of the present contents.
    pub fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatus>, EngineError> {
        self.block_status_at(None, offset, length)
    }

    pub(crate) fn read_at(&self, at: Option<Timestamp>, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.read_with(at, OverlayAccess::Lock, offset, buf)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the present while the caller holds the write lock (read-modify-write).
    pub(super) fn read_locked(&self, state: &WriteState, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.read_with(None, OverlayAccess::Held(state), offset, buf)
    }

    pub(super) fn read_with(
        &self,
        at: Option<Timestamp>,
        overlay: OverlayAccess<'_>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        self.check_open()?;
        self.check_range(offset, buf.len() as u64)?;
        if at.is_some() {
            self.check_settled()?;
        }
        if buf.is_empty() {
            return Ok(());
        }
        let block_size = self.block_size();
        let block_bytes = u64::from(block_size.bytes());
        let first = block_size.block_of(offset);
        let end = offset + buf.len() as u64;
        let count = end.div_ceil(block_bytes) - first.0;
        let aligned = offset.is_multiple_of(block_bytes) && end.is_multiple_of(block_bytes);
        let mut scratch = Vec::new();
        let target: &mut [u8] = if aligned {
            buf
        } else {
            scratch.resize((count * block_bytes) as usize, 0);
            &mut scratch
        };
        if let Err(Mismatch(block)) = self.read_blocks_replanning(at, overlay, first, count, target)? {
            if let OverlayAccess::Held(_) = overlay {
                // Under the write lock no block leaves the overlay, and the
                // destager writes only blocks in it: this one is not being
                // rewritten. (Waiting for the destager here, which takes the
                // write lock while it holds its own, could deadlock.)
                return Err(self.corrupt_current(block));
            }
            let _no_destage = self.destage_lock();
            if let Err(Mismatch(block)) = self.read_blocks_replanning(at, overlay, first, count, target)? {
                return Err(self.corrupt_current(block));
            }
        }
        if !aligned {
            let skip = (offset - block_size.offset_of(first)) as usize;
            buf.copy_from_slice(&scratch[skip..skip + buf.len()]);
        }
        Ok(())
    }

    /// The outcome of `plan`, made again under the destage lock if a
    /// current-store entry failed its check (the destager may have been
    /// rewriting it); a second failure is corruption. The caller holds
    /// neither the destage lock nor the write lock.
    pub(super) fn planned_or_corrupt<T>(
        &self,
        plan: impl Fn() -> Result<Result<T, Mismatch>, EngineError>,
    ) -> Result<T, EngineError> {
        if let Ok(planned) = plan()? {
            return Ok(planned);
        }
        let _no_destage = self.destage_lock();
        plan()?.map_err(|Mismatch(block)| self.corrupt_current(block))
    }

    pub(crate) fn corrupt_current(&self, block: BlockIndex) -> EngineError {
        EngineError::Corrupt {
            volume: self.name().to_string(),
            detail: format!("block {block} in the current store fails its checksum"),
        }
    }

    /// [`Volume::read_blocks`], planned again if the journal segment a
    /// version was planned from is reclaimed meanwhile.
    fn read_blocks_replanning(
        &self,
        at: Option<Timestamp>,
        overlay: OverlayAccess<'_>,
        first: BlockIndex,
        count: u64,
        target: &mut [u8],
    ) -> Result<Result<(), Mismatch>, EngineError> {
        const ATTEMPTS: usize = 3;
        for attempt in 1.. {
            match self.read_blocks(at, overlay, first, count, target) {
                Err(EngineError::Journal(JournalError::Reclaimed { .. })) if attempt < ATTEMPTS => continue,
                other => return other,
            }
        }
        unreachable!("the last attempt returns")
    }

    fn read_blocks(
        &self,
        at: Option<Timestamp>,
        overlay: OverlayAccess<'_>,
        first: BlockIndex,
        count: u64,
        target: &mut [u8],
    ) -> Result<Result<(), Mismatch>, EngineError> {
        let sources = match self.plan(at, overlay, Copies::Read, first, count)? {
            Ok(sources) => sources,
            Err(mismatch) => return Ok(Err(mismatch)),
        };
        let block_bytes = self.block_size().bytes() as usize;
        self.read_chunk_blocks(at, first, &sources, &mut target[..sources.len() * block_bytes])?;
        let mut start = 0;
        while start < sources.len() {
            let mut end = start + 1;
            let bytes = |end: usize| start * block_bytes..end * block_bytes;
            match sources[start] {
                Source::Zero => {
                    while end < sources.len() && matches!(sources[end], Source::Zero) {
                        end += 1;
                    }
                    target[bytes(end)].fill(0);
                }
                Source::Base => {
                    while end < sources.len() && matches!(sources[end], Source::Base) {
                        end += 1;
                    }
                    let base = self.base_now().expect("planned from the base");
                    let offset = self.block_size().offset_of(BlockIndex(first.0 + start as u64));
                    base.read(offset, &mut target[bytes(end)])?;
                }
                Source::Current { .. } => {
                    while end < sources.len() && matches!(sources[end], Source::Current { .. }) {
                        end += 1;
                    }
                    let range = bytes(end);
                    let current = self.current.as_ref().expect("planned from the current store");
                    current.read_data(BlockIndex(first.0 + start as u64), &mut target[range.clone()])?;
                    for (index, block) in target[range].chunks_exact(block_bytes).enumerate() {
                        let Source::Current { crc32c } = sources[start + index] else { unreachable!() };
                        if rewind_format::crc32c(block) != crc32c {
                            return Ok(Err(Mismatch(BlockIndex(first.0 + (start + index) as u64))));
                        }
                    }
                }
                // Read above, with the request's other chunk blocks.
                Source::Chunk { .. } => {
                    while end < sources.len() && matches!(sources[end], Source::Chunk { .. }) {
                        end += 1;
                    }
                }
                Source::Journal { segment, offset, .. } => {
                    while end < sources.len() {
                        let Source::Journal { segment: next_segment, offset: next_offset, .. } = sources[end] else {
                            break;
                        };
                        let expected = u64::from(offset) + ((end - start) * block_bytes) as u64;
                        if next_segment != segment || u64::from(next_offset) != expected {
                            break;
                        }
                        end += 1;
                    }
                    let range = bytes(end);
                    self.journal.read(segment, u64::from(offset), &mut target[range.clone()])?;
                    for (index, block) in target[range].chunks_exact(block_bytes).enumerate() {
                        let Source::Journal { crc32c, offset, .. } = sources[start + index] else { unreachable!() };
                        if rewind_format::crc32c(block) != crc32c {
                            return Err(EngineError::Corrupt {
                                volume: self.name().to_string(),
                                detail: format!(
                                    "block {} as of {} (journal segment {segment}, byte {offset}) fails its checksum",
                                    first.0 + (start + index) as u64,
                                    at.map_or("now".to_owned(), |at| DisplayTime(at).to_string()),
                                ),
                            });
                        }
                    }
                }
            }
            start = end;
        }
        Ok(Ok(()))
    }

    /// Reads the blocks of `sources` (from `first`, as of `at`) that are in
    /// the chunk store into their places in `target`, all in one go: a
    /// view of a volume overwritten here and there finds its chunk blocks
    /// between blocks read from elsewhere, and asking for each run of them
    /// in turn read the records of one pack in dozens of reads per MiB
    /// where one would do.
    fn read_chunk_blocks(
        &self,
        at: Option<Timestamp>,
        first: BlockIndex,
        sources: &[Source],
        target: &mut [u8],
    ) -> Result<(), EngineError> {
        // The present's reads find no chunk: they allocate nothing here.
        if !sources.iter().any(|source| matches!(source, Source::Chunk { .. })) {
            return Ok(());
        }
        let rooms: Vec<Option<ChunkId>> = sources
            .iter()
            .map(|source| match source {
                Source::Chunk { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        // The store computed each chunk's CRC-32C as it checked the chunk's
        // record: the bytes are not read again.
        let crcs = self.chunks.read_many_among(&rooms, target)?;
        for (index, (source, read_crc32c)) in sources.iter().zip(crcs).enumerate() {
            let &Source::Chunk { id, crc32c } = source else { continue };
            if read_crc32c != crc32c {
                return Err(EngineError::Corrupt {
                    volume: self.name().to_string(),
                    detail: format!(
                        "block {} as of {} (chunk {id}) fails its checksum",
                        first.0 + index as u64,
                        at.map_or("now".to_owned(), |at| DisplayTime(at).to_string()),
                    ),
                });
            }
        }
        Ok(())
    }

    /// Where each of `count` blocks from `first` comes from, as of `at` (the
    /// present if `None`). After a revert (see `revert.rs`), a block not
    /// written since reads as it did at the point the revert went back to.
    pub(super) fn plan(
        &self,
        at: Option<Timestamp>,
        overlay: OverlayAccess<'_>,
        copies: Copies,
        first: BlockIndex,
        count: u64,
    ) -> Result<Result<Vec<Source>, Mismatch>, EngineError> {
        let planned = match self.plan_newest(at, overlay, first, count)? {
            Ok(planned) => planned,
            Err(mismatch) => return Ok(Err(mismatch)),
        };
        let era = self.history.reverts.lock().era_of(at).copied();
        let mut sources: Vec<Source> = planned.iter().map(|&(source, _)| source).collect();
        // Only the revert's copy is stamped with its time.
        let reverted = |revert: &Revert, written: Timestamp| match copies {
            Copies::Read => written < revert.at,
            Copies::Traced => written <= revert.at,
        };
        let Some(revert) = era.filter(|revert| planned.iter().any(|&(_, written)| reverted(revert, written))) else {
            return Ok(Ok(sources));
        };
        let then = match self.plan(Some(revert.to), overlay, copies, first, count)? {
            Ok(then) => then,
            Err(mismatch) => return Ok(Err(mismatch)),
        };
        for (index, &(_, written)) in planned.iter().enumerate() {
            if reverted(&revert, written) {
                sources[index] = then[index];
            }
        }
        Ok(Ok(sources))
    }

    /// Per block, where its newest version at or before `at` (the present
    /// if `None`) is, and when it was written (`Timestamp::MIN` if never).
    pub(super) fn plan_newest(
        &self,
        at: Option<Timestamp>,
        overlay: OverlayAccess<'_>,
        first: BlockIndex,
        count: u64,
    ) -> Result<Result<Vec<(Source, Timestamp)>, Mismatch>, EngineError> {
        // What a block reads where this volume never wrote it.
        // A clone stays one: a promote swaps its base, never removes it.
        let unwritten = match self.meta.base.is_some() {
            true => (Source::Base, Timestamp::MIN),
            false => (Source::Zero, Timestamp::MIN),
        };
        let of_version = |version: &Version| (Source::of_version(version), version.timestamp);
        let Some(current) = &self.current else {
            // Logging: the map is the only way to the present, too.
            let blocks: Vec<u64> = (first.0..first.0 + count).collect();
            let found = self.index.find_le_many(&blocks, at.unwrap_or(Timestamp::MAX))?;
            return Ok(Ok(found.iter().map(|version| version.as_ref().map_or(unwritten, of_version)).collect()));
        };
        // Per block, its newest overlay version at or before `at`.
        let newest_pending = |state: &WriteState| -> Vec<InOverlay> {
            (first.0..first.0 + count)
                .map(|block| {
                    let Some(pending) = state.overlay.get(block) else { return InOverlay::No };
                    let visible = pending.iter().rev().find(|entry| at.is_none_or(|at| entry.version.timestamp <= at));
                    visible.map_or(InOverlay::NoneVisible, |entry| InOverlay::Newest(entry.version))
                })
                .collect()
        };
        // Where the overlay absorbs overwrites, the version of a block it
        // holds newer ones of may have been dropped from it: the index,
        // which has every version, says which one `at` sees.
        let absorbs = self.rules().overlay_absorbs_overwrites();
        let pending = match overlay {
            OverlayAccess::Held(state) => newest_pending(state),
            OverlayAccess::Lock if self.overlay_versions.load(Ordering::Relaxed) == 0 => Vec::new(),
            OverlayAccess::Lock => newest_pending(&self.write.lock()),
        };
        let mut metas = Vec::with_capacity(count as usize);
        current.read_meta(first, count, &mut metas)?;
        let mut planned = Vec::with_capacity(count as usize);
        let mut from_history = Vec::new();
        for (index, meta) in metas.iter().enumerate() {
            // The overlay's versions are newer than the current store's, and
            // the index's (before them) older: the first that is not after
            // `at` is the one. (In COW the index holds only what was copied
            // out, so versions still in the overlay must be found there.)
            match (pending.get(index).copied().unwrap_or(InOverlay::No), meta) {
                (InOverlay::Newest(version), _) => planned.push(of_version(&version)),
                (InOverlay::NoneVisible, _) if absorbs => {
                    planned.push(unwritten);
                    from_history.push(index);
                }
                (_, None) => return Ok(Err(Mismatch(BlockIndex(first.0 + index as u64)))),
                (_, Some(meta)) if meta.state == BlockState::Unwritten => planned.push(unwritten),
                (_, Some(meta)) if at.is_none_or(|at| meta.timestamp <= at) => {
                    planned.push((Source::of_meta(meta), meta.timestamp));
                }
                (_, Some(_)) => {
                    planned.push(unwritten);
                    from_history.push(index);
                }
            }
        }
        if let Some(at) = at.filter(|_| !from_history.is_empty()) {
            let blocks: Vec<u64> = from_history.iter().map(|&index| first.0 + index as u64).collect();
            let found = self.index.find_le_many(&blocks, at)?;
            for (&index, version) in from_history.iter().zip(found) {
                // No version at or before `at`: the block had not been written yet.
                planned[index] = version.as_ref().map_or(unwritten, of_version);
            }
        }
        Ok(Ok(planned))
    }

    /// How a look at the blocks of `offset..end` goes on (block status,
    /// changes): a stretch this volume never wrote, to be answered whole
    /// without a plan, or a plan of at most `count_max` blocks that stops
    /// where the current store's written stretch ends, so that the blocks
    /// after it are looked at anew. The overlay and the holes of the
    /// current store's metadata file tell which blocks were never written
    /// without reading the metadata: a thin volume of terabytes is a few
    /// looks, not 4 MiB of zeros read and checked per GiB (a restore of a
    /// 1 TiB view with 16 MiB written spent 27 s on them, now 0.03 s). Such
    /// a block reads as zeros, or a clone's base, at every time. Only
    /// where the present has a current store (not logging); there every
    /// look is a plan.
    pub(super) fn look_ahead(&self, offset: u64, end: u64, count_max: u64) -> Result<Stretch, EngineError> {
        let block_size = self.block_size();
        let first = block_size.block_of(offset);
        let Some(current) = &self.current else {
            return Ok(Stretch::Plan(first, count_max));
        };
        let stored = |first| current.next_written(first).map(|block| block.map_or(u64::MAX, |block| block.0));
        // The overlay is looked at only before the store's first written
        // block (a dense volume's is `first` itself: no look, under the
        // write lock, at a large overlay), and the store once more after
        // it: a block destaged meanwhile is in one or the other. Per
        // stretch the overlay holds there: (its first block, its end).
        let stored_before = stored(first)?;
        let in_overlay = match self.overlay_versions.load(Ordering::Relaxed) {
            // Nothing before the store's first written block to look at.
            _ if stored_before <= first.0 => None,
            0 => None,
            _ => {
                let state = self.write.lock();
                let held = state.overlay.first_block_in(first.0, stored_before);
                held.map(|held| (held, state.overlay.held_until(held, held.saturating_add(count_max))))
            }
        };
        let written = in_overlay.map_or(u64::MAX, |(held, _)| held).min(stored_before).min(stored(first)?);
        let unwritten_end = match written {
            u64::MAX => end,
            block => block_size.offset_of(BlockIndex(block)).min(end),
        };
        if unwritten_end > offset {
            return Ok(Stretch::Unwritten(unwritten_end - offset));
        }
        // Up to where both the store's written stretch and the overlay's end.
        let overlay_until = in_overlay.map_or(first.0, |(_, until)| until);
        // (At least `first`, which was written: a plan covers the block it
        // starts at whatever the files say.)
        let until = current.written_until(first)?.0.max(overlay_until).max(first.0 + 1);
        Ok(Stretch::Plan(first, count_max.min(until - first.0)))
    }

    /// `offset..end`, or a prefix of it, as the stretches a block status or
    /// changes request answers ([`Volume::look_ahead`]): at most
    /// [`STATUS_BLOCKS_MAX`] blocks to plan in all, in at most
    /// [`LOOKS_MAX`] looks. The caller asks on from where they end.
    pub(super) fn stretches(&self, offset: u64, end: u64) -> Result<Vec<Stretch>, EngineError> {
        let block_bytes = u64::from(self.block_size().bytes());
        let mut stretches = Vec::new();
        let (mut position, mut planned) = (offset, 0);
        while position < end && planned < STATUS_BLOCKS_MAX && stretches.len() < LOOKS_MAX {
            let first = position / block_bytes;
            let count_max = (end.div_ceil(block_bytes) - first).min(STATUS_BLOCKS_MAX - planned);
            let stretch = self.look_ahead(position, end, count_max)?;
            position = match stretch {
                Stretch::Unwritten(length) => position + length,
                Stretch::Plan(first, count) => {
                    planned += count;
                    ((first.0 + count) * block_bytes).min(end)
                }
            };
            stretches.push(stretch);
        }
        Ok(stretches)
    }

    pub(crate) fn block_status_at(
        &self,
        at: Option<Timestamp>,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatus>, EngineError> {
        self.check_open()?;
        self.check_range(offset, length)?;
        if at.is_some() {
            self.check_settled()?;
        }
        if length == 0 {
            return Ok(Vec::new());
        }
        let block_size = self.block_size();
        let end = offset + length;
        let mut extents: Vec<BlockStatus> = Vec::new();
        let mut push = |length: u64, allocated: bool| match extents.last_mut() {
            Some(last) if last.allocated == allocated => last.length += length,
            _ => extents.push(BlockStatus { length, allocated, zero: !allocated }),
        };
        // A clone's unwritten blocks are as allocated as its base's.
        let unwritten = |push: &mut dyn FnMut(u64, bool), from: u64, to: u64| -> Result<(), EngineError> {
            let Some(base) = self.base_now() else {
                push(to - from, false);
                return Ok(());
            };
            let mut asked = from;
            while asked < to {
                for extent in base.block_status(asked, to - asked)? {
                    push(extent.length, extent.allocated);
                    asked += extent.length;
                }
            }
            Ok(())
        };
        let mut position = offset;
        for stretch in self.stretches(offset, end)? {
            let (first, count) = match stretch {
                Stretch::Unwritten(length) => {
                    unwritten(&mut push, position, position + length)?;
                    position += length;
                    continue;
                }
                Stretch::Plan(first, count) => (first, count),
            };
            let sources = self.planned_or_corrupt(|| self.plan(at, OverlayAccess::Lock, Copies::Read, first, count))?;
            let mut index = 0;
            while index < sources.len() {
                let mut next = index + 1;
                if sources[index] == Source::Base {
                    while next < sources.len() && sources[next] == Source::Base {
                        next += 1;
                    }
                    let run_end = block_size.offset_of(BlockIndex(first.0 + next as u64)).min(end);
                    unwritten(&mut push, position, run_end)?;
                    position = run_end;
                } else {
                    let block_end = block_size.offset_of(BlockIndex(first.0 + next as u64)).min(end);
                    push(block_end - position, sources[index] != Source::Zero);
                    position = block_end;
                }
                index = next;
            }
        }
        Ok(extents)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use rewind_io::{SimConfig, SimStorage};
    use rewind_types::{BlockSize, VolumeName};

    use crate::{Durability, EngineError, Node, NodeConfig, Timestamp, VolumeSpec};

    const SECOND: u64 = 1_000_000_000;

    /// The destager takes the write lock while it holds its own, so a
    /// read-modify-write (under the write lock) that met a bad block and
    /// waited for the destager before calling it corruption could deadlock.
    #[test]
    fn a_partial_write_over_a_corrupt_block_reports_it_without_waiting_for_the_destager() {
        let storage = SimStorage::new(SimConfig::default(), 1);
        let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
        let start = Timestamp::from_unix_nanos(1_000 * SECOND);
        let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
        let volume = node.create_volume(spec, start).unwrap();
        volume.write(start.saturating_add_nanos(SECOND), 0, &[1; 4096], Durability::Fua).unwrap();
        node.checkpoint_all(start.saturating_add_nanos(2 * SECOND)).unwrap();
        storage.corrupt("volumes/v/current.img", 100, 0xff).unwrap();

        let destaging = volume.destage_lock();
        let (sender, receiver) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let written = volume.write(start.saturating_add_nanos(3 * SECOND), 10, &[2; 10], Durability::Buffered);
                sender.send(written).unwrap();
            });
            // A deadline for the failure only: success arrives on the channel.
            let outcome = receiver.recv_timeout(Duration::from_secs(30));
            drop(destaging);
            let written = outcome.expect("the partial write waited for the destager");
            assert!(
                matches!(&written, Err(EngineError::Corrupt { detail, .. }) if detail.contains("block 0 in the current store")),
                "{written:?}"
            );
        });
    }
}
