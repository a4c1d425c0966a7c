//! Copy-on-write (the COW layout, Xiao et al. §2): the current store is
//! written in place, and history is what is copied out of it before it is
//! overwritten.
//!
//! When the destager is about to overwrite a block, it looks at the block's
//! versions in order: the one in the current store, then those waiting in
//! the overlay. Each that history keeps — not superseded, under the volume's
//! thinning, by the next (it is the last of its window, or a bookmark's) —
//! is copied into the chunk store: from the current store (the read and the
//! write that make COW's first write after a snapshot cost three I/Os) or,
//! if it never reached the current store, from the journal. With a
//! granularity g a snapshot is every window end, so a block is copied at
//! most once per window; at every-write granularity every overwrite copies.
//!
//! The write-ahead rule for history: the chunks are made durable, then a
//! copy record naming them is appended to the journal and committed, and
//! only then is the current store overwritten. Recovery files the copy
//! records' versions in the index again; a copy already filed (the crash
//! came between the record and the overwrite) is not made twice.

use rewind_format::current::{BlockMeta, BlockState};
use rewind_types::{BlockIndex, Version, VersionData};

use crate::volume::Pending;
use crate::{EngineError, Volume};

/// Where a version to copy is now.
#[derive(Clone, Copy)]
enum Origin {
    Current,
    Journal { segment: u32, offset: u32 },
    Zero,
}

/// Versions one copy record lists at most.
const COPY_RECORD_VERSIONS_MAX: usize = 1 << 14;

impl Volume {
    /// Copies what history keeps of the blocks about to be overwritten;
    /// `chains` holds, per block, its durable overlay versions, oldest first.
    pub(crate) fn copy_before_overwrite(&self, chains: &[Vec<Pending>]) -> Result<(), EngineError> {
        let wanted = self.versions_to_copy(chains)?;
        if wanted.is_empty() {
            return Ok(());
        }
        let copies = {
            let _gate = self.chunks.hold_references();
            let mut session = self.chunks.session()?;
            let mut copies = Vec::with_capacity(wanted.len());
            let mut block = vec![0u8; self.block_size().bytes() as usize];
            for (version, origin) in wanted {
                let already = self.index.find_le(version.block.0, version.timestamp)?;
                if already.is_some_and(|filed| filed.timestamp == version.timestamp) {
                    continue;
                }
                let data = match origin {
                    Origin::Zero => VersionData::Zero,
                    Origin::Current | Origin::Journal { .. } => {
                        self.read_for_copy(&version, origin, &mut block)?;
                        match block.iter().all(|&byte| byte == 0) {
                            true => VersionData::Zero,
                            false => VersionData::Chunk(session.put(&block)?),
                        }
                    }
                };
                copies.push(Version { data, ..version });
            }
            session.finish()?;
            copies
        };
        {
            // Appended and filed together: a checkpoint (which seals the
            // memtable under this lock) covers both or neither.
            let _state = self.write.lock();
            for batch in copies.chunks(COPY_RECORD_VERSIONS_MAX) {
                let appended = self.journal.append_copy(batch)?;
                self.index.insert(appended.lsn, batch);
            }
        }
        self.journal.commit()?;
        Ok(())
    }

    /// The versions of `chains`' blocks that history keeps and that are
    /// about to leave: every one but each block's newest.
    fn versions_to_copy(&self, chains: &[Vec<Pending>]) -> Result<Vec<(Version, Origin)>, EngineError> {
        let current = self.current.as_ref().expect("COW has a current store");
        let thinning = self.index.thinning();
        let mut wanted = Vec::new();
        let mut metas = Vec::new();
        let mut sequence: Vec<(Version, Origin)> = Vec::new();
        for chain in chains {
            let block = chain.first().expect("chains are not empty").version.block;
            if let Err(index) = current.read_meta(block, 1, &mut metas)? {
                return Err(self.corrupt_current(BlockIndex(block.0 + index)));
            }
            let meta: BlockMeta = metas[0];
            sequence.clear();
            // The current store's version comes before the overlay's, unless
            // the destager wrote an overlay version there before a crash:
            // then what it holds was never synced, and the journal speaks for
            // it (the version it replaced was filed, if kept, before that).
            let oldest_pending = chain.first().expect("chains are not empty").version.timestamp;
            if meta.timestamp < oldest_pending {
                let in_current =
                    Version { block, timestamp: meta.timestamp, data: VersionData::Zero, crc32c: meta.crc32c };
                match meta.state {
                    BlockState::Unwritten => {}
                    BlockState::Zero => sequence.push((in_current, Origin::Zero)),
                    BlockState::Data => sequence.push((in_current, Origin::Current)),
                }
            }
            for pending in chain {
                let origin = match pending.version.data {
                    VersionData::Journal { segment, offset } => Origin::Journal { segment, offset },
                    VersionData::Zero => Origin::Zero,
                    VersionData::Chunk(_) => unreachable!("the overlay holds versions in the journal"),
                };
                sequence.push((pending.version, origin));
            }
            for pair in sequence.windows(2) {
                if !thinning.supersedes(&pair[0].0, &pair[1].0) {
                    wanted.push(pair[0]);
                }
            }
        }
        Ok(wanted)
    }

    fn read_for_copy(&self, version: &Version, origin: Origin, block: &mut [u8]) -> Result<(), EngineError> {
        let place = match origin {
            Origin::Current => {
                self.current.as_ref().expect("COW has a current store").read_data(version.block, block)?;
                "the current store".to_owned()
            }
            Origin::Journal { segment, offset } => {
                self.journal.read(segment, u64::from(offset), block)?;
                format!("journal segment {segment}, byte {offset}")
            }
            Origin::Zero => unreachable!("zeros are not read"),
        };
        if rewind_format::crc32c(block) != version.crc32c {
            return Err(EngineError::Corrupt {
                volume: self.name().to_string(),
                detail: format!(
                    "block {} written at {} ({place}) fails its checksum while being copied to history",
                    version.block,
                    crate::timespec::DisplayTime(version.timestamp)
                ),
            });
        }
        Ok(())
    }
}
