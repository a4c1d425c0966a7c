//! Destaging: the newest durable versions in the overlay go to the current
//! store, as the layout's rules say when (continuously, as the controller
//! cache lets go, at snapshots) and which (the newest, or every version let
//! go), after history has been filed from them where the layout files it at
//! destage (`copy.rs`). Only durable journal records are ever applied.

use super::overlay::DestagePlan;
use super::*;

pub(crate) struct DestageState {
    /// Every durable record up to this LSN is in the current store.
    pub lsn_applied: Lsn,
}

/// The share of the controller cache's pages that may be dirty (IBM §4.1).
pub(super) const CACHE_DIRTY_FRACTION: f64 = 0.03;

/// `versions` (several per block, oldest first) as rounds of at most one per
/// block, sorted by block: the order in which they may be written.
pub(super) fn waves(versions: Vec<Pending>) -> Vec<Vec<Pending>> {
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

impl Volume {
    /// Copies the newest durable version of every overlay block into the
    /// current store and retires what it copied.
    pub(crate) fn destage_durable(&self) -> Result<(), EngineError> {
        self.destage(false)
    }

    /// Destages as [`Volume::destage_durable`] does, but (with
    /// `cached_only`) only the blocks the controller cache has let go —
    /// the least recently written beyond its dirty limit — so overwrites of
    /// the blocks it keeps are absorbed.
    pub(super) fn destage(&self, cached_only: bool) -> Result<(), EngineError> {
        let (lsn_durable, _) = self.journal.durable_point();
        let mut destage = self.destage.lock();
        if self.current.is_none() {
            // Logging: the index is the present; nothing is destaged.
            destage.lsn_applied = destage.lsn_applied.max(lsn_durable);
            self.journal.forget_written(destage.lsn_applied);
            return Ok(());
        }
        if destage.lsn_applied >= lsn_durable && self.overlay_versions.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let DestagePlan { newest, chains } =
            self.write.lock().overlay.plan_destage(lsn_durable, cached_only, self.rules().history_at_destage());
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
            self.journal.forget_written(destage.lsn_applied);
        }
        // Retired before `destage` is let go, so no other pass (a bookmark's
        // merge, a writer's backpressure) applies or files them again.
        let mut state = self.write.lock();
        state.overlay.retire(&newest);
        self.overlay_versions.store(state.overlay.versions(), Ordering::Relaxed);
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
}
