//! Promotion: a clone gets its own copy of its base's branch point, so the
//! base can go (`zfs promote` answers the same need by moving snapshots;
//! Rewind copies, and the clone's history is untouched).
//!
//! The copy is a store of the current store's format beside the clone's
//! own (`base.img`, `base.meta`: one checksummed entry per block, holes for
//! blocks the base point never held), written in the background while the
//! clone serves reads and writes from the lent base as before. Only when it
//! is complete and synced does `volume.meta` say so (rewritten atomically,
//! its base marked `copied`); then the clone swaps the lent view for the
//! copy, which releases the base's pin. A crash before that leaves an
//! unfinished copy, removed on opening: the clone is still a clone of its
//! base. After it, the clone opens with its copy and never asks for the base.
//!
//! What is copied is the whole branch point as the base holds it: every
//! block the base had data for there. A clone's view at its creation reads
//! all of them, and the copy must answer every read the lent view did.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rewind_format::current::{BlockMeta, BlockState};
use rewind_format::meta::{VolumeBase, VolumeMeta};
use rewind_io::{write_file_atomic, OpenMode, Storage, WriteBehind};
use rewind_types::{BlockIndex, BlockSize};

use crate::current::CurrentStore;
use crate::timespec::DisplayTime;
use crate::volume::lineage::Base;
use crate::volume::read::{BlockStatus, STATUS_BLOCKS_MAX};
use crate::{EngineError, Volume};

/// The copy's files are `{dir}/base.img` and `{dir}/base.meta`.
const STEM: &str = "base";

/// How much of the base one step of the copy reads at most.
const PIECE_BYTES: u64 = 8 << 20;

/// A promoted clone's own copy of the point it was cloned from.
pub(crate) struct BaseCopy {
    store: CurrentStore,
    origin: VolumeBase,
    clone: String,
    block_size: BlockSize,
}

/// What a promote did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromoteReport {
    /// Where the clone came from (now `copied`).
    pub base: VolumeBase,
    /// The base point's data, now the clone's own.
    pub bytes_copied: u64,
}

/// Marks a promote of one volume as running; cleared when dropped.
pub(crate) struct Promoting<'a>(&'a Volume);

impl Drop for Promoting<'_> {
    fn drop(&mut self) {
        self.0.promoting.store(false, Ordering::Release);
    }
}

impl BaseCopy {
    /// Opens the copy a promote made of the base `meta` names.
    pub(crate) fn open(storage: &Arc<dyn Storage>, dir: &str, meta: &VolumeMeta) -> Result<BaseCopy, EngineError> {
        let origin = meta.base.clone().expect("a promoted clone names its base");
        assert!(origin.copied, "only a promoted clone has a copy of its base");
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let store = CurrentStore::open_named(&**storage, dir, STEM, meta.block_size, block_count, OpenMode::Existing)
            .map_err(|error| EngineError::Corrupt {
            volume: meta.name.to_string(),
            detail: format!(
                "it was promoted, but its copy of volume {} as it was at {} cannot be opened: {error}",
                origin.volume,
                DisplayTime(origin.at)
            ),
        })?;
        Ok(BaseCopy { store, origin, clone: meta.name.to_string(), block_size: meta.block_size })
    }

    /// Removes what a promote that did not finish left in `dir`.
    pub(crate) fn remove_unfinished(storage: &dyn Storage, dir: &str) -> Result<(), EngineError> {
        for path in [format!("{dir}/{STEM}.img"), format!("{dir}/{STEM}.meta")] {
            if storage.exists(&path).map_err(EngineError::io(&path))? {
                storage.remove_file(&path).map_err(EngineError::io(&path))?;
            }
        }
        Ok(())
    }

    pub(crate) fn origin(&self) -> &VolumeBase {
        &self.origin
    }

    fn metas(&self, first: BlockIndex, count: u64) -> Result<Vec<BlockMeta>, EngineError> {
        let mut metas = Vec::new();
        self.store.read_meta(first, count, &mut metas)?;
        // The copy is never written once made: a bad entry is damage.
        let index = |offset: usize| first.0 + offset as u64;
        metas
            .into_iter()
            .enumerate()
            .map(|(offset, meta)| meta.ok_or_else(|| self.corrupt(index(offset), "its metadata entry")))
            .collect()
    }

    fn corrupt(&self, block: u64, what: &str) -> EngineError {
        EngineError::Corrupt {
            volume: self.clone.clone(),
            detail: format!(
                "block {block} of its copy of volume {} as it was at {} ({}) fails its checksum ({what})",
                self.origin.volume,
                DisplayTime(self.origin.at),
                self.store.data_path()
            ),
        }
    }

    /// Reads whole blocks at `offset`, checking each against its checksum.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        let block_bytes = self.block_size.bytes() as usize;
        assert!(offset.is_multiple_of(block_bytes as u64) && buf.len().is_multiple_of(block_bytes));
        let first = self.block_size.block_of(offset);
        let metas = self.metas(first, (buf.len() / block_bytes) as u64)?;
        let mut start = 0;
        while start < metas.len() {
            let holds_data = metas[start].state == BlockState::Data;
            let mut end = start + 1;
            while end < metas.len() && (metas[end].state == BlockState::Data) == holds_data {
                end += 1;
            }
            let range = &mut buf[start * block_bytes..end * block_bytes];
            if holds_data {
                self.store.read_data(BlockIndex(first.0 + start as u64), range)?;
                for (index, block) in range.chunks_exact(block_bytes).enumerate() {
                    if rewind_format::crc32c(block) != metas[start + index].crc32c {
                        return Err(self.corrupt(first.0 + (start + index) as u64, "its data"));
                    }
                }
            } else {
                range.fill(0);
            }
            start = end;
        }
        Ok(())
    }

    /// Allocation status from `offset`, as the lent view answered it.
    pub(crate) fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatus>, EngineError> {
        let block_bytes = u64::from(self.block_size.bytes());
        let first = self.block_size.block_of(offset);
        let end = offset + length;
        let count = (end.div_ceil(block_bytes) - first.0).min(STATUS_BLOCKS_MAX);
        let mut extents: Vec<BlockStatus> = Vec::new();
        let mut position = offset;
        for (index, meta) in self.metas(first, count)?.iter().enumerate() {
            let block_end = self.block_size.offset_of(BlockIndex(first.0 + index as u64 + 1)).min(end);
            let allocated = meta.state == BlockState::Data;
            match extents.last_mut() {
                Some(last) if last.allocated == allocated => last.length += block_end - position,
                _ => extents.push(BlockStatus { length: block_end - position, allocated, zero: !allocated }),
            }
            position = block_end;
        }
        Ok(extents)
    }
}

impl Volume {
    /// Refuses a promote of a volume that is not a clone, was promoted
    /// already, or is being promoted.
    pub fn check_promotable(&self) -> Result<(), EngineError> {
        if self.promoting.load(Ordering::Acquire) {
            return Err(self.promoting_already());
        }
        self.check_lent_base()
    }

    /// Marks a promote of this clone as running (see [`Volume::check_promotable`]).
    pub(crate) fn start_promote(&self) -> Result<Promoting<'_>, EngineError> {
        if self.promoting.swap(true, Ordering::AcqRel) {
            return Err(self.promoting_already());
        }
        let promoting = Promoting(self);
        // Checked with the mark set: a promote that just finished has
        // adopted its copy by now.
        self.check_lent_base()?;
        Ok(promoting)
    }

    fn promoting_already(&self) -> EngineError {
        EngineError::InvalidArgument(format!(
            "volume {} is being promoted already; wait for that to finish",
            self.name()
        ))
    }

    fn check_lent_base(&self) -> Result<(), EngineError> {
        let refuse = |why: String| Err(EngineError::InvalidArgument(why));
        let Some(base) = self.base_now() else {
            return refuse(format!("volume {} is not a clone: it reads nothing from another volume", self.name()));
        };
        let origin = base.origin();
        if origin.copied {
            return refuse(format!(
                "volume {} was promoted already: it has its own copy of volume {} as it was at {}",
                self.name(),
                origin.volume,
                DisplayTime(origin.at)
            ));
        }
        Ok(())
    }

    /// Copies the base's branch point into the clone's directory, reporting
    /// progress as (bytes of the volume gone through, its size). The clone
    /// serves as before meanwhile; the copy is not used until adopted.
    pub(crate) fn copy_base(
        &self,
        _promoting: &Promoting<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(BaseCopy, u64), EngineError> {
        let base = self.base_now().expect("a promote starts with a clone");
        let view = base.lent().expect("a promote starts with a lent base");
        let origin = VolumeBase { copied: true, ..base.origin() };
        BaseCopy::remove_unfinished(&*self.storage, &self.dir)?;
        let (block_size, size_bytes) = (self.block_size(), self.size_bytes());
        let block_count = size_bytes / u64::from(block_size.bytes());
        let store =
            CurrentStore::open_named(&*self.storage, &self.dir, STEM, block_size, block_count, OpenMode::CreateNew)?;
        let copy = BaseCopy { store, origin, clone: self.name().to_string(), block_size };
        match self.fill(&copy, view, progress) {
            Ok(bytes_copied) => Ok((copy, bytes_copied)),
            Err(error) => {
                drop(copy);
                if let Err(cleanup) = BaseCopy::remove_unfinished(&*self.storage, &self.dir) {
                    tracing::warn!(volume = %self.name(), %cleanup, "cannot remove an unfinished copy of a base");
                }
                Err(error)
            }
        }
    }

    /// Writes every block the base point holds data for into `copy`, then
    /// makes it durable; returns the bytes copied.
    fn fill(
        &self,
        copy: &BaseCopy,
        view: &crate::View,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<u64, EngineError> {
        let (block_size, size_bytes) = (self.block_size(), self.size_bytes());
        let mut buf = vec![0u8; PIECE_BYTES as usize];
        let mut bytes_copied = 0;
        let mut position = 0;
        // Written back as it goes: the copy is not read again soon, and a
        // page cache filled with it would cost more than it saves.
        let mut behind = WriteBehind::new(copy.store.data_file());
        progress(0, size_bytes);
        while position < size_bytes {
            // Deleted meanwhile, or the disk is nearly full: stop here.
            self.check_open()?;
            if let Some(refusal) = self.disk.refusal() {
                return Err(EngineError::NoSpace { volume: self.name().to_string(), detail: refusal });
            }
            let piece_end = (position + PIECE_BYTES).min(size_bytes);
            for extent in view.block_status(position, piece_end - position)? {
                assert!(extent.length.is_multiple_of(u64::from(block_size.bytes())), "a view answers whole blocks");
                if extent.allocated {
                    let data = &mut buf[..extent.length as usize];
                    view.read(position, data)?;
                    let metas: Vec<BlockMeta> = data
                        .chunks_exact(block_size.bytes() as usize)
                        .map(|block| BlockMeta {
                            state: BlockState::Data,
                            crc32c: rewind_format::crc32c(block),
                            timestamp: copy.origin.at,
                        })
                        .collect();
                    copy.store.write_blocks(block_size.block_of(position), data, &metas)?;
                    behind.written(position, extent.length).map_err(EngineError::io(copy.store.data_path()))?;
                    bytes_copied += extent.length;
                }
                position += extent.length;
            }
            progress(position, size_bytes);
        }
        copy.store.sync()?;
        self.storage.sync_dir(&self.dir).map_err(EngineError::io(&self.dir))?;
        Ok(bytes_copied)
    }

    /// Makes the finished `copy` the clone's base: `volume.meta` says so
    /// first (atomically), then reads go to it and the lent view goes back.
    pub(crate) fn adopt_base_copy(&self, _promoting: &Promoting<'_>, copy: BaseCopy) -> Result<(), EngineError> {
        self.check_open()?;
        let meta = VolumeMeta { base: Some(copy.origin.clone()), ..self.meta() };
        let path = format!("{}/volume.meta", self.dir);
        write_file_atomic(&*self.storage, &path, &meta.encode()).map_err(EngineError::io(&path))?;
        let lent = self.base.lock().replace(Arc::new(Base::Copied(copy)));
        // Dropped here or by the last read still using it: either way the
        // base's pin on the branch point goes with it.
        drop(lent);
        Ok(())
    }
}
