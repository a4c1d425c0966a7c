//! History filed as versions leave the overlay — the layouts in which the
//! journal is only the write-ahead log (the papers' non-volatile cache) and
//! history is written to the chunk store as the destager lets versions go:
//!
//! - **COW** (Xiao et al. §2) and **Checkpointing** (IBM §2.7): before the
//!   destager overwrites a block, it looks at the block's versions in
//!   order: the one in the current store, then those waiting in the
//!   overlay. Each that history keeps — not superseded, under the volume's
//!   thinning, by the next (it is the last of its window, or a bookmark's)
//!   — is copied into the chunk store: from the current store (the read and
//!   the write that make COW's first write after a snapshot cost three
//!   I/Os) or, if it never reached the current store, from the journal.
//!   With a granularity g a snapshot is every window end, so a block is
//!   copied at most once per window; at every-write granularity every
//!   overwrite copies.
//! - **SplitStream** and **SplitDownStream** (IBM §2.5–2.6): every version
//!   the destager lets go — each the overlay supersedes that history keeps,
//!   and the one it destages — is written to the chunk store from the
//!   journal (or left there: `Volume::put_version`); the current
//!   store's version is already there. (Versions the
//!   window later supersedes are dropped by thinning: that is the paper's
//!   d ≥ r.) SplitDownStream writes the kept superseded ones to the current
//!   store too, in order, before the newest.
//!
//! The write-ahead rule for history: the chunks are made durable, then a
//! copy record naming them is appended to the journal and committed, and
//! only then is the current store overwritten. Recovery files the copy
//! records' versions in the index again; a copy already filed (the crash
//! came between the record and the overwrite) is not made twice.

use rewind_format::current::{BlockMeta, BlockState};
use rewind_types::{ChunkId, Timestamp, Version, VersionData};

use crate::volume::archive::{in_journal_runs, SealedSegments};
use crate::volume::Pending;
use crate::{EngineError, Volume};

/// Where a version to copy is now.
#[derive(Clone, Copy)]
enum Origin {
    Current,
    Journal { segment: u32, offset: u32 },
    Zero,
}

/// What a destage files in history.
struct Filing {
    /// The versions to file, and where their bytes are now.
    wanted: Vec<(Version, Origin)>,
    /// Of them, those from the overlay that a newer one supersedes.
    let_go: Vec<Pending>,
}

/// Versions one copy record lists at most.
const COPY_RECORD_VERSIONS_MAX: usize = 1 << 14;

impl Volume {
    /// Files in history what the layout keeps of the blocks about to be
    /// destaged; `chains` holds, per block, its durable overlay versions,
    /// oldest first. Returns the superseded overlay versions it kept (for
    /// SplitDownStream to write down too), oldest first per block.
    pub(super) fn file_history(&self, chains: &[Vec<Pending>]) -> Result<Vec<Pending>, EngineError> {
        let Filing { wanted, let_go } = self.versions_to_file(chains)?;
        if wanted.is_empty() {
            return Ok(let_go);
        }
        let copies = {
            let _gate = self.chunks.hold_references();
            // The one session may be held by another volume's archive pass,
            // paused for reads: it goes on at once instead, since writers at
            // the overlay's limit may be waiting for this destage.
            let mut session = {
                let _wanted = self.passes_wanted.hold();
                self.chunks.session()?
            };
            let mut copies = Vec::with_capacity(wanted.len());
            let mut block = vec![0u8; self.block_size().bytes() as usize];
            let in_runs = in_journal_runs(wanted.iter().map(|(version, _)| version.data), block.len());
            let mut sealed = SealedSegments::default();
            for ((version, origin), in_run) in wanted.into_iter().zip(in_runs) {
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
                            false => VersionData::Chunk(self.put_version(
                                &mut session,
                                &version,
                                &block,
                                in_run,
                                &mut sealed,
                            )?),
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
                if let Some(step) = self.index.insert(appended.lsn, batch) {
                    let added: Vec<ChunkId> = batch
                        .iter()
                        .filter_map(|version| match version.data {
                            VersionData::Chunk(id) => Some(id),
                            _ => None,
                        })
                        .collect();
                    self.tally_added(step, &added);
                }
            }
        }
        self.journal.commit()?;
        Ok(let_go)
    }

    /// What to file in history of `chains`' blocks (see the module documentation).
    fn versions_to_file(&self, chains: &[Vec<Pending>]) -> Result<Filing, EngineError> {
        let current = self.current.as_ref().expect("these layouts have a current store");
        let copies_current = self.rules().copies_current_version();
        let thinning = self.index.thinning();
        // A revert's copy (stamped with the revert's time) is not history:
        // the versions it copies are (see `revert_copy.rs`).
        let revert_times: Vec<Timestamp> = self.reverts().iter().map(|revert| revert.at).collect();
        let is_history = |version: &Version| !revert_times.contains(&version.timestamp);
        let mut wanted = Vec::new();
        let mut let_go = Vec::new();
        let mut metas = Vec::new();
        let mut sequence: Vec<(Version, Origin)> = Vec::new();
        for chain in chains {
            let block = chain.first().expect("chains are not empty").version.block;
            sequence.clear();
            if copies_current {
                current.read_meta(block, 1, &mut metas)?;
                // The destager (this thread) is the only writer of the entry.
                let meta: BlockMeta = metas[0].ok_or_else(|| self.corrupt_current(block))?;
                // The current store's version comes before the overlay's,
                // unless the destager wrote an overlay version there before a
                // crash: then what it holds was never synced, and the journal
                // speaks for it (the version it replaced was filed, if kept,
                // before that).
                if meta.timestamp < chain.first().expect("chains are not empty").version.timestamp {
                    let in_current =
                        Version { block, timestamp: meta.timestamp, data: VersionData::Zero, crc32c: meta.crc32c };
                    match meta.state {
                        BlockState::Unwritten => {}
                        BlockState::Zero => sequence.push((in_current, Origin::Zero)),
                        BlockState::Data => sequence.push((in_current, Origin::Current)),
                    }
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
            let from_overlay = sequence.len() - chain.len();
            for (index, pair) in sequence.windows(2).enumerate() {
                if is_history(&pair[0].0) && !thinning.supersedes(&pair[0].0, &pair[1].0) {
                    wanted.push(pair[0]);
                    if index >= from_overlay {
                        let_go.push(chain[index - from_overlay]);
                    }
                }
            }
            let newest = *sequence.last().expect("chains are not empty");
            if !copies_current && is_history(&newest.0) {
                // The version destaged leaves the cache for both stores.
                wanted.push(newest);
            }
        }
        Ok(Filing { wanted, let_go })
    }

    fn read_for_copy(&self, version: &Version, origin: Origin, block: &mut [u8]) -> Result<(), EngineError> {
        let place = match origin {
            Origin::Current => {
                self.current.as_ref().expect("these layouts have a current store").read_data(version.block, block)?;
                "the current store".to_owned()
            }
            Origin::Journal { segment, offset } => {
                self.journal.read(segment, u64::from(offset), block)?;
                format!("journal segment {segment}, byte {offset}")
            }
            Origin::Zero => unreachable!("zeros are not read"),
        };
        self.check_version_bytes(version, block, &place, "being copied to history")
    }
}
