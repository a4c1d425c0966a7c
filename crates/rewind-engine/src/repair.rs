//! `rewind volume repair`: bringing a damaged volume back, rebuilding what
//! is derived and saying exactly what cannot be.
//!
//! A volume is damaged when it does not open (see [`Node::open`]). Repair
//! tries to open it; each failure names a file, and what can be done about
//! it depends on what the file is derived from:
//!
//! | damaged | rebuilt from | lost |
//! |---|---|---|
//! | `checkpoint` | the oldest journal segment: recovery replays all of it | nothing |
//! | a recent index run (history still in the journal) | the journal, the index's redo log | nothing |
//! | an archived index run | its pages that verify | the versions on the others (blocks and times reported) |
//! | acknowledged journal records | — (replaced by a *lost* record; every intact record after them is kept) | those writes |
//! | `policy` | defaults; if history was ever thinned, nothing before the repair can be shown exactly any more | the retention policy, views of older times |
//! | `bookmarks` | empty | the bookmarks |
//! | `volume.meta` (both copies) | — | the volume: delete it |
//!
//! (Metadata files keep two copies, so one damaged copy never gets here.)
//! Each round fixes the first problem the open meets and tries again, so a
//! plan ([`RepairMode::Plan`]) shows the first problem only. Once the volume
//! opens, every page of its index is read (as the node does on start), the
//! chunk store counts its references again, and what was lost is noted in
//! the volume's history damage ([`Volume::history_damage`]).

use std::sync::Arc;

use rewind_format::meta::{Bookmarks, Checkpoint, IndexManifest, VolumeMeta, VolumePolicy};
use rewind_index::IndexError;
use rewind_io::write_file_atomic;
use rewind_journal::{Journal, JournalError};
use rewind_types::{Lsn, Timestamp};

use crate::node::{base_set_aside, branch_points, hold_damaged_branch_points, lend_base, volume_dir, DamagedVolume};
use crate::timespec::DisplayTime;
use crate::{EngineError, InUse, Node, Volume};

/// Whether a repair only says what it would do, or does it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairMode {
    Plan,
    Apply,
}

/// What a repair found and did (or would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairReport {
    pub volume: String,
    /// In the order found.
    pub steps: Vec<RepairStep>,
    /// The volume is open and served.
    pub repaired: bool,
    /// Why it cannot be repaired, if it cannot: it can only be deleted.
    pub unrepairable: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairStep {
    pub problem: String,
    pub action: String,
    /// What the action loses, if anything.
    pub loss: Option<String>,
}

/// What to do about one problem.
enum Fix {
    Checkpoint,
    RecentIndex,
    SalvageRun(u64),
    Journal,
    Policy,
    Bookmarks,
}

/// The most problems one repair fixes before giving up.
const REPAIR_ROUNDS_MAX: usize = 16;

impl Node {
    /// Repairs volume `name` (see the module documentation). A volume that
    /// is open is checked first (every page of its index read); if that
    /// fails, it is closed — refused while clients use it, unless forced —
    /// and repaired like one that did not open.
    pub fn repair_volume(
        &self,
        name: &str,
        mode: RepairMode,
        in_use: InUse,
        now: Timestamp,
    ) -> Result<RepairReport, EngineError> {
        let _admin = self.admin.lock();
        let mut report = RepairReport { volume: name.to_owned(), ..RepairReport::default() };
        // Not `if let Some(..) = self.volumes.read()...`: the guard would
        // live through the block, and setting the volume aside takes the
        // lock for writing.
        let open = self.volumes.read().get(name).cloned();
        if let Some(volume) = open {
            match volume.mark_chunks(&mut |_, _| {}) {
                Ok(()) => {
                    report.repaired = true;
                    return Ok(report);
                }
                Err(error) if mode == RepairMode::Apply => {
                    let clients = volume.clients();
                    if !clients.is_empty() && in_use == InUse::Refuse {
                        return Err(EngineError::InUse { volume: name.to_owned(), clients });
                    }
                    volume.close();
                    self.set_aside(&volume, &error);
                }
                Err(error) => {
                    report.steps.push(self.plan_step(name, &error)?.1);
                    return Ok(report);
                }
            }
        }
        if !self.damaged.read().contains_key(name) {
            return Err(EngineError::VolumeNotFound(name.to_owned()));
        }
        let dir = volume_dir(name);
        for _ in 0..REPAIR_ROUNDS_MAX {
            let error = match self.open_and_verify(&dir) {
                Ok(volume) => {
                    self.bring_back(volume, &report)?;
                    report.repaired = true;
                    return Ok(report);
                }
                Err(error) => error,
            };
            let (fix, step) = match self.plan_step(name, &error) {
                Ok(planned) => planned,
                Err(unrepairable) => {
                    report.unrepairable = Some(unrepairable.to_string());
                    return Ok(report);
                }
            };
            report.steps.push(step);
            if mode == RepairMode::Plan {
                return Ok(report);
            }
            let loss = self.apply(&dir, fix, now)?;
            if let Some(loss) = loss {
                report.steps.last_mut().expect("pushed above").loss = Some(loss);
            }
        }
        report.unrepairable = Some(format!("still damaged after {REPAIR_ROUNDS_MAX} repairs"));
        Ok(report)
    }

    /// Opens the volume in `dir` and reads every page of its index.
    fn open_and_verify(&self, dir: &str) -> Result<Arc<Volume>, EngineError> {
        let lend = |meta: &VolumeMeta| lend_base(&self.volumes.read(), &self.damaged.read(), meta);
        // Its clones, damaged while it was, are opened after it (see `Volume::open`).
        let name = dir.rsplit('/').next().unwrap_or(dir);
        let branch_points = branch_points(name, self.damaged.read().values().filter_map(|damage| damage.meta.as_ref()));
        let volume =
            Volume::open(Arc::clone(&self.storage), dir, self.config.volume, &self.shared, &lend, &branch_points)?;
        volume.mark_chunks(&mut |_, _| {})?;
        Ok(volume)
    }

    /// Serves a repaired volume: counts its chunk references (and every
    /// other volume's) and notes what the repair lost.
    fn bring_back(&self, volume: Arc<Volume>, report: &RepairReport) -> Result<(), EngineError> {
        let name = volume.name().to_string();
        // Until counted, what it releases must not be taken for double releases.
        self.shared.chunks.request_recount(format!("volume {name} was repaired"));
        for loss in report.steps.iter().filter_map(|step| step.loss.as_ref()) {
            volume.note_history_damage(&format!("repair: {loss}"));
        }
        self.volumes.write().insert(name.clone(), volume);
        let volumes = self.volumes.read();
        let mut damaged = self.damaged.write();
        if let Some(mut damage) = damaged.remove(&name) {
            // It holds its branch point as an open clone now.
            damage.release_branch_point(&volumes);
        }
        // A repaired base holds its damaged clones' branch points again.
        hold_damaged_branch_points(&volumes, &mut damaged);
        drop((volumes, damaged));
        self.recount_chunks()
    }

    /// Takes an open volume out of service as damaged.
    fn set_aside(&self, volume: &Volume, error: &EngineError) {
        let name = volume.name().to_string();
        let problem = error.to_string();
        tracing::error!(volume = %name, %problem, "volume set aside for repair");
        self.volumes.write().remove(&name);
        let volumes = self.volumes.read();
        let mut damaged = self.damaged.write();
        base_set_aside(&name, &mut damaged);
        damaged.insert(name.clone(), DamagedVolume::of(volume, problem));
        hold_damaged_branch_points(&volumes, &mut damaged);
    }

    /// What to do about `error`, met opening volume `name`; an error if
    /// nothing can be done.
    fn plan_step(&self, name: &str, error: &EngineError) -> Result<(Fix, RepairStep), EngineError> {
        let step = |problem: String, action: &str, loss: Option<&str>| RepairStep {
            problem,
            action: action.to_owned(),
            loss: loss.map(str::to_owned),
        };
        let unrepairable = |why: String| EngineError::Damaged { volume: name.to_owned(), problem: why };
        let dir = volume_dir(name);
        let planned = match error {
            EngineError::Journal(JournalError::Corrupt { path, offset, reason }) => (
                Fix::Journal,
                step(
                    format!("the journal is damaged in {path} at byte {offset}: {reason}"),
                    "replace the damaged records by a lost record, keep every intact record after them, and file \
                     the journal's history in the index again",
                    Some("the writes in the damaged records"),
                ),
            ),
            EngineError::Index(IndexError::Corrupt { path, reason }) => {
                let Some(id) = rewind_index::repair::run_id_of(path) else {
                    return Err(unrepairable(format!("{path} is damaged beyond repair: {reason}")));
                };
                let archived = rewind_index::repair::run_is_archived(&*self.storage, &format!("{dir}/index"), id)?;
                let problem = format!("index run {path} is damaged: {reason}");
                match archived {
                    Some(true) => (
                        Fix::SalvageRun(id),
                        step(
                            problem,
                            "rewrite the run from its pages that verify",
                            Some("the archived versions on its damaged pages"),
                        ),
                    ),
                    _ if self.late_entries(&dir)? => {
                        return Err(unrepairable(format!("{problem}, and this layout's index cannot be rebuilt")))
                    }
                    _ => (
                        Fix::RecentIndex,
                        step(
                            problem,
                            "drop the runs of history still in the journal and file it again from there",
                            None,
                        ),
                    ),
                }
            }
            EngineError::Corrupt { detail, .. } => {
                let file = detail.split(':').next().unwrap_or_default();
                match file.rsplit('/').next().unwrap_or_default() {
                    "checkpoint" => (
                        Fix::Checkpoint,
                        step(detail.clone(), "rebuild it: replay the whole journal still present", None),
                    ),
                    "policy" => (
                        Fix::Policy,
                        step(
                            detail.clone(),
                            "write the default policy (every write, forever); if history was ever thinned, \
                             times before now can no longer be shown exactly",
                            Some("the retention policy"),
                        ),
                    ),
                    "bookmarks" => {
                        (Fix::Bookmarks, step(detail.clone(), "start with no bookmarks", Some("the bookmarks")))
                    }
                    _ if detail.contains("the version index covers") => {
                        (Fix::RecentIndex, step(detail.clone(), "file the journal's history in the index again", None))
                    }
                    _ => return Err(unrepairable(format!("{detail}; only `rewind volume delete {name}` helps"))),
                }
            }
            other => {
                return Err(unrepairable(format!(
                    "{other}; this is not damage repair can mend (if it passes, a repair or restart opens it)"
                )))
            }
        };
        Ok(planned)
    }

    /// Whether the index in volume dir `dir` takes late entries (the layouts
    /// that file history as it leaves the overlay).
    fn late_entries(&self, dir: &str) -> Result<bool, EngineError> {
        let path = format!("{dir}/index/manifest");
        let bytes = rewind_io::read_file(&*self.storage, &path).map_err(EngineError::io(&path))?;
        Ok(IndexManifest::decode(&bytes).is_ok_and(|manifest| manifest.late_entries))
    }

    /// Carries out `fix` on the volume in `dir`; returns what it lost, in words.
    fn apply(&self, dir: &str, fix: Fix, now: Timestamp) -> Result<Option<String>, EngineError> {
        let storage = &*self.storage;
        match fix {
            Fix::Checkpoint => {
                self.replay_everything(dir)?;
                Ok(None)
            }
            Fix::RecentIndex => {
                let (_, lsn_first, _) = self.replay_everything(dir)?;
                rewind_index::repair::drop_recent_runs(storage, &format!("{dir}/index"), Lsn(lsn_first.0 - 1))?;
                Ok(None)
            }
            Fix::SalvageRun(id) => {
                let salvage = rewind_index::repair::salvage_run(storage, &format!("{dir}/index"), id)?;
                let pages = match salvage.lost_from.as_slice() {
                    [] => format!(
                        "written from {} to {}",
                        DisplayTime(salvage.timestamp_min),
                        DisplayTime(salvage.timestamp_max)
                    ),
                    [(block, at), ..] => format!("from block {block} as of {} on", DisplayTime(*at)),
                };
                Ok(Some(format!(
                    "{} archived versions ({} pages; {pages}) were lost, {} kept",
                    salvage.lost, salvage.pages_lost, salvage.kept
                )))
            }
            Fix::Journal => {
                let lost = self.repair_journal(dir)?;
                // Index entries may point into the records lost: file again.
                if !self.late_entries(dir)? {
                    let (_, lsn_first, _) = self.replay_everything(dir)?;
                    rewind_index::repair::drop_recent_runs(storage, &format!("{dir}/index"), Lsn(lsn_first.0 - 1))?;
                }
                Ok(Some(lost))
            }
            Fix::Policy => {
                let path = format!("{dir}/index/manifest");
                let thinned = rewind_io::read_file(storage, &path)
                    .ok()
                    .and_then(|bytes| IndexManifest::decode(&bytes).ok())
                    .is_none_or(|manifest| manifest.versions_thinned > 0);
                let horizon_floor = if thinned { now } else { Timestamp::MIN };
                let policy = VolumePolicy { retention_clock: now, horizon_floor, ..VolumePolicy::default() };
                let path = format!("{dir}/policy");
                write_file_atomic(storage, &path, &policy.encode()).map_err(EngineError::io(&path))?;
                Ok(Some(match thinned {
                    true => format!("the retention policy, and views of times before {}", DisplayTime(now)),
                    false => "the retention policy (nothing had been thinned: all history still shows)".to_owned(),
                }))
            }
            Fix::Bookmarks => {
                let path = format!("{dir}/bookmarks");
                write_file_atomic(storage, &path, &Bookmarks::default().encode()).map_err(EngineError::io(&path))?;
                Ok(Some("every bookmark".to_owned()))
            }
        }
    }

    /// Points the checkpoint at the oldest journal segment, so recovery
    /// replays (and files again) everything the journal still holds.
    fn replay_everything(
        &self,
        dir: &str,
    ) -> Result<(rewind_format::meta::JournalPosition, Lsn, Timestamp), EngineError> {
        let start = Journal::oldest_start(&*self.storage, &format!("{dir}/journal"))?;
        let (replay_from, lsn_first, timestamp_last) = start;
        let checkpoint = Checkpoint { lsn: Lsn(lsn_first.0 - 1), replay_from, timestamp_last };
        let path = format!("{dir}/checkpoint");
        write_file_atomic(&*self.storage, &path, &checkpoint.encode()).map_err(EngineError::io(&path))?;
        Ok(start)
    }

    /// Replaces the damaged acknowledged records of the journal by lost
    /// records (see `rewind_journal::Recovery::repairing`); returns what
    /// was lost, in words.
    fn repair_journal(&self, dir: &str) -> Result<String, EngineError> {
        let path = format!("{dir}/checkpoint");
        let bytes = rewind_io::read_file(&*self.storage, &path).map_err(EngineError::io(&path))?;
        let checkpoint = Checkpoint::decode(&bytes)
            .map_err(|error| EngineError::Corrupt { volume: dir.to_owned(), detail: format!("{path}: {error}") })?;
        let meta_path = format!("{dir}/volume.meta");
        let bytes = rewind_io::read_file(&*self.storage, &meta_path).map_err(EngineError::io(&meta_path))?;
        let meta = rewind_format::meta::VolumeMeta::decode(&bytes).map_err(|error| EngineError::Corrupt {
            volume: dir.to_owned(),
            detail: format!("{meta_path}: {error}"),
        })?;
        let mut recovery = Journal::recover(
            Arc::clone(&self.storage),
            &format!("{dir}/journal"),
            meta.block_size,
            self.config.volume.journal,
            checkpoint.replay_from,
            checkpoint.lsn.next(),
            checkpoint.timestamp_last,
        )?
        .repairing();
        while recovery.next_record()?.is_some() {}
        let (_, report) = recovery.finish()?;
        let spans: Vec<String> = report
            .lost
            .iter()
            .map(|span| {
                format!(
                    "{} writes from LSN {} (between {} and {}; {} bytes of {} at byte {})",
                    span.lsn_count,
                    span.lsn_first,
                    DisplayTime(span.after),
                    DisplayTime(span.before),
                    span.bytes,
                    span.path,
                    span.offset
                )
            })
            .collect();
        Ok(match spans.is_empty() {
            true => "nothing (the damage was in a segment header, rewritten)".to_owned(),
            false => spans.join("; "),
        })
    }
}
