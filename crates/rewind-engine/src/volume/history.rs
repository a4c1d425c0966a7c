//! The timeline, policies (granularity, retention, the space cap, deleted
//! ranges), stats and resolving points in time: what an operator sees and
//! sets of a volume's history. Bookmarks and pins are in `bookmarks.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use jiff::tz::TimeZone;
use parking_lot::Mutex;
use rewind_format::meta::healed;
use rewind_format::meta::{
    Bookmark, Bookmarks, RetentionTier, Revert, Reverts, TimelineBucket, TimelineFrame, VolumePolicy,
};
use rewind_index::Thinning;
use rewind_io::{read_file, read_file_healing, write_file_atomic, File, OpenMode, Storage};
use rewind_types::{Lsn, Timestamp};

use crate::current::CurrentStore;
use crate::timespec::{display_granularity, display_retention, parse_point_in_time, DisplayTime, PointInTime};
use crate::volume::revert::before_revert_name;
use crate::{EngineError, Volume};

struct TimelineFile {
    path: String,
    file: Arc<dyn File>,
    length: u64,
    buckets: BTreeMap<u64, TimelineBucket>,
    lsn_last: Lsn,
}

pub(crate) struct History {
    policy_path: String,
    pub(crate) policy: Mutex<VolumePolicy>,
    pub(crate) bookmarks_path: String,
    /// Taken before `policy` and `holds` (see `crate::volume::bookmarks`).
    pub(crate) bookmarks: Mutex<Bookmarks>,
    /// Times of open views, with how many: pinned like bookmarks while they
    /// last, so retention never changes what an open view shows.
    pub(crate) holds: Mutex<BTreeMap<Timestamp, usize>>,
    pub(crate) reverts_path: String,
    /// The volume's reverts in place (see `crate::volume::revert`); changed
    /// under `bookmarks` and the write lock.
    pub(crate) reverts: Mutex<Reverts>,
    timeline: Mutex<TimelineFile>,
}

impl History {
    pub fn create(storage: &dyn Storage, dir: &str, policy: VolumePolicy) -> Result<History, EngineError> {
        let policy_path = format!("{dir}/policy");
        write_file_atomic(storage, &policy_path, &policy.encode()).map_err(EngineError::io(&policy_path))?;
        let bookmarks_path = format!("{dir}/bookmarks");
        write_file_atomic(storage, &bookmarks_path, &Bookmarks::default().encode())
            .map_err(EngineError::io(&bookmarks_path))?;
        let path = format!("{dir}/timeline");
        let file = storage.open_file(&path, OpenMode::CreateNew).map_err(EngineError::io(&path))?;
        file.sync_data().map_err(EngineError::io(&path))?;
        storage.sync_dir(dir).map_err(EngineError::io(dir))?;
        let timeline = TimelineFile { path, file, length: 0, buckets: BTreeMap::new(), lsn_last: Lsn::ZERO };
        Ok(History {
            policy_path,
            policy: Mutex::new(policy),
            bookmarks_path,
            bookmarks: Mutex::new(Bookmarks::default()),
            holds: Mutex::new(BTreeMap::new()),
            reverts_path: format!("{dir}/reverts"),
            reverts: Mutex::new(Reverts::default()),
            timeline: Mutex::new(timeline),
        })
    }

    pub fn open(storage: &dyn Storage, dir: &str) -> Result<History, EngineError> {
        let corrupt = |path: &str, error: rewind_format::FormatError| EngineError::Corrupt {
            volume: dir.rsplit('/').next().unwrap_or(dir).to_owned(),
            detail: format!("{path}: {error}"),
        };
        let policy_path = format!("{dir}/policy");
        let bytes = read_file_healing(storage, &policy_path, healed).map_err(EngineError::io(&policy_path))?;
        let policy = VolumePolicy::decode(&bytes).map_err(|error| corrupt(&policy_path, error))?;
        let bookmarks_path = format!("{dir}/bookmarks");
        let bytes = read_file_healing(storage, &bookmarks_path, healed).map_err(EngineError::io(&bookmarks_path))?;
        let bookmarks = Bookmarks::decode(&bytes).map_err(|error| corrupt(&bookmarks_path, error))?;
        // Absent until the first revert.
        let reverts_path = format!("{dir}/reverts");
        let reverts = match storage.exists(&reverts_path).map_err(EngineError::io(&reverts_path))? {
            false => Reverts::default(),
            true => {
                let bytes =
                    read_file_healing(storage, &reverts_path, healed).map_err(EngineError::io(&reverts_path))?;
                Reverts::decode(&bytes).map_err(|error| corrupt(&reverts_path, error))?
            }
        };
        let bookmarks = bookmark_every_revert(storage, &bookmarks_path, bookmarks, &reverts)?;
        let path = format!("{dir}/timeline");
        let file = storage.open_file(&path, OpenMode::Existing).map_err(EngineError::io(&path))?;
        let bytes = read_file(storage, &path).map_err(EngineError::io(&path))?;
        let (frames, valid) = TimelineFrame::decode_all(&bytes);
        if valid < bytes.len() {
            // A frame torn by a crash; its records are replayed from the journal.
            file.set_len(valid as u64).map_err(EngineError::io(&path))?;
            file.sync_data().map_err(EngineError::io(&path))?;
        }
        let mut timeline =
            TimelineFile { path, file, length: valid as u64, buckets: BTreeMap::new(), lsn_last: Lsn::ZERO };
        for frame in frames {
            merge_buckets(&mut timeline.buckets, frame.buckets.into_iter().map(|bucket| (bucket.minute, bucket)));
            timeline.lsn_last = timeline.lsn_last.max(frame.lsn_last);
        }
        Ok(History {
            policy_path,
            policy: Mutex::new(policy),
            bookmarks_path,
            bookmarks: Mutex::new(bookmarks),
            holds: Mutex::new(BTreeMap::new()),
            reverts_path,
            reverts: Mutex::new(reverts),
            timeline: Mutex::new(timeline),
        })
    }

    /// What the index may thin: the policy's granularity and retention,
    /// with the volume's creation (its base state, until retention passes
    /// it), every bookmark and every open view kept exact.
    pub fn thinning(&self, created: Timestamp) -> Thinning {
        self.thinning_pinning(created, &[])
    }

    /// [`History::thinning`], keeping `pins` exact too.
    pub fn thinning_pinning(&self, created: Timestamp, pins: &[Timestamp]) -> Thinning {
        let mut thinning =
            thinning_of(&self.policy.lock(), created, &self.bookmarks.lock(), &self.holds.lock(), &self.reverts.lock());
        thinning.pins.extend_from_slice(pins);
        thinning.pins.sort_unstable();
        thinning.pins.dedup();
        thinning
    }

    /// The time retention was last applied as of.
    pub fn retention_clock(&self) -> Timestamp {
        self.policy.lock().retention_clock
    }

    /// The timeline file covers the journal up to this LSN.
    pub fn timeline_lsn(&self) -> Lsn {
        self.timeline.lock().lsn_last
    }

    /// Durably appends the activity of the records up to `lsn`.
    pub fn save_timeline(&self, lsn: Lsn, delta: &BTreeMap<u64, TimelineBucket>) -> Result<(), EngineError> {
        if delta.is_empty() {
            return Ok(());
        }
        let mut timeline = self.timeline.lock();
        let frame = TimelineFrame { lsn_last: lsn, buckets: delta.values().copied().collect() };
        let bytes = frame.encode();
        let path = timeline.path.clone();
        rewind_io::write_reserved(&*timeline.file, &bytes, timeline.length).map_err(EngineError::io(&path))?;
        timeline.file.sync_data().map_err(EngineError::io(&path))?;
        timeline.length += bytes.len() as u64;
        timeline.lsn_last = lsn;
        merge_buckets(&mut timeline.buckets, delta.iter().map(|(&minute, &bucket)| (minute, bucket)));
        Ok(())
    }
}

pub(crate) fn merge_buckets(
    into: &mut BTreeMap<u64, TimelineBucket>,
    from: impl IntoIterator<Item = (u64, TimelineBucket)>,
) {
    for (minute, bucket) in from {
        let total = into.entry(minute).or_insert(TimelineBucket { minute, ..TimelineBucket::default() });
        total.write_count += bucket.write_count;
        total.write_bytes += bucket.write_bytes;
        total.zero_count += bucket.zero_count;
        total.zero_bytes += bucket.zero_bytes;
    }
}

/// What to change of a volume's policy; `None` leaves it as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyChange {
    pub granularity_nanos: Option<u64>,
    pub retention: Option<Vec<RetentionTier>>,
    pub space_max_bytes: Option<u64>,
}

/// A volume's history at a glance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineReport {
    /// When protection began.
    pub created: Timestamp,
    /// Time of the newest version.
    pub timestamp_last: Timestamp,
    /// Write activity per minute, oldest first; minutes without writes are absent.
    pub buckets: Vec<TimelineBucket>,
    pub bookmarks: Vec<Bookmark>,
    /// Reverts in place, oldest first: events on the timeline.
    pub reverts: Vec<Revert>,
}

/// Counters and sizes of one volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroes: u64,
    pub zero_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub flushes: u64,
    pub checkpoints: u64,
    pub versions_in_memory: u64,
    pub versions_in_runs: u64,
    /// Versions dropped by the granularity since creation: versions written
    /// = kept (in memory + in runs) + thinned.
    pub versions_thinned: u64,
    pub index_runs: u64,
    pub index_memory_bytes: u64,
    /// Kept versions whose data is archived (in the chunk store, or zeros)
    /// rather than in the journal: every version older than `archived_before`.
    pub versions_archived: u64,
    pub archived_before: Timestamp,
    pub archive_passes: u64,
    /// Bookmarks whose history is archived and waits to be laid out in the
    /// background, and the bytes of packs that has written (see
    /// `Volume::lay_out_bookmarks`).
    pub bookmarks_awaiting_layout: u64,
    pub layout_bytes_written: u64,
    /// The archive pass under way: versions it has been through, of how
    /// many (see `VersionIndex::archive_progress`).
    pub archive_progress: Option<(u64, u64)>,
    /// Times an archive pass paused for a burst of writes, or for reads
    /// right after one (see `VolumeConfig::burst_archive_wait_nanos`,
    /// `VolumeConfig::burst_reads_nanos`).
    pub archive_pauses: u64,
    /// Parts after which an archive pass that reads went on beside, unheld
    /// (its history did not fit the room they would keep it waiting in),
    /// waited to keep to its share of the time (see
    /// `Volume::pause_before_part`).
    pub archive_yields: u64,
    /// Destage passes stopped part-way for small reads right after a
    /// burst of writes (see `Volume::destage_unless_read`).
    pub destage_stops: u64,
    /// Journal bytes given back since the volume was opened.
    pub journal_bytes_reclaimed: u64,
    pub journal_bytes: u64,
    /// Journal bytes holding only archived history: given back at the next
    /// checkpoint.
    pub journal_bytes_reclaimable: u64,
    /// Spare segment files the journal still writes ahead at a quiet
    /// moment, for those the chunk store adopted (`Journal::prepare_spare`).
    pub journal_spares_owed: u64,
    /// Bytes of zeros the journal wrote into spares ahead of need since the
    /// volume was opened (counted in the journal's bytes written as well).
    pub journal_spare_bytes_written: u64,
    /// The current store's files (sparse: unwritten blocks take no disk).
    pub current_bytes: u64,
    pub lsn_last: u64,
    pub lsn_durable: u64,
    /// See `rewind_journal::Journal::vouch`.
    pub lsn_vouched: u64,
    pub versions_pending_destage: u64,
    /// Writers waiting now for the overlay to make room (`make_room`):
    /// backpressure from destaging.
    pub writers_waiting_for_room: u64,
    /// Blocks the background copy after a revert has put back into the
    /// current store since the volume was opened (see `revert_copy.rs`).
    pub revert_blocks_copied: u64,
    /// The background copy after the last revert, while it is unfinished.
    pub revert_copy: Option<crate::RevertCopyStatus>,
    pub poisoned: bool,
}

impl Volume {
    /// Deletes the history from `from` until `to` (MYCDP §3.3.3): each block
    /// keeps only its last version in the range, so every time before `from`
    /// and from `to` on reads exactly as before; views in between are refused.
    /// Bookmarks in the range must be deleted first. Rewrites the version
    /// index before returning.
    pub fn delete_history(&self, from: Timestamp, to: Timestamp, now: Timestamp) -> Result<(), EngineError> {
        self.check_open()?;
        let from = self.check_in_history(from, now)?;
        let to = self.check_in_history(to, now)?;
        if from >= to {
            return Err(EngineError::InvalidArgument(format!(
                "nothing to delete: the range must start before it ends ({} is not before {})",
                DisplayTime(from),
                DisplayTime(to)
            )));
        }
        self.check_no_branch_in(from, to)?;
        self.check_no_revert_in(from, to)?;
        // Its rewrite waits for an archive pass to end.
        let _wanted = self.passes_wanted.hold();
        {
            let bookmarks = self.history.bookmarks.lock();
            if let Some(inside) = bookmarks.entries.iter().find(|bookmark| (from..to).contains(&bookmark.timestamp)) {
                return Err(EngineError::InvalidArgument(format!(
                    "bookmark {} of volume {} ({}) lies in the range; delete it first \
                     (`rewind bookmark delete {} {}`) or delete up to it",
                    inside.name,
                    self.name(),
                    DisplayTime(inside.timestamp),
                    self.name(),
                    inside.name
                )));
            }
            self.change_policy(&bookmarks, |policy| policy.deleted = merge_ranges(&policy.deleted, (from, to)))?;
        }
        // Versions still in memory are thinned as they are persisted; those in
        // runs by rewriting them all.
        self.flush()?;
        self.index.seal();
        self.persist_index(self.journal.lsn_durable())?;
        self.releasing(|| self.index.rewrite_all())?;
        Ok(())
    }

    pub fn granularity_nanos(&self) -> u64 {
        self.history.policy.lock().granularity_nanos
    }

    pub fn retention(&self) -> Vec<RetentionTier> {
        self.history.policy.lock().retention.clone()
    }

    /// The oldest time whose state retention keeps (history before it is
    /// gone but for bookmarks), if retention has dropped any.
    pub fn retention_horizon(&self) -> Option<Timestamp> {
        self.index.thinning().horizon
    }

    /// The most bytes the volume's history may take (0: no cap).
    pub fn space_max_bytes(&self) -> u64 {
        self.history.policy.lock().space_max_bytes
    }

    /// Changes the protection granularity, the retention tiers (empty: keep
    /// history forever) and/or the space cap. History already thinned stays
    /// thinned; from now on persists and merges thin to the new windows, and
    /// retention and the cap are applied by the next maintenance pass.
    pub fn set_policy(&self, change: PolicyChange) -> Result<(), EngineError> {
        self.check_open()?;
        let bookmarks = self.history.bookmarks.lock();
        // Writes held back until the new policy is in force: every version
        // the old one may thin is at or before `newest`, so the floor below
        // covers it (read before the locks, a write and a persist between
        // could thin a later window under the old granularity, unrecorded).
        let writes = self.write.lock();
        let newest = writes.timestamp_last;
        let current = self.history.policy.lock().clone();
        let mut next = current.clone();
        let change_sets_windows = change.granularity_nanos.is_some() || change.retention.is_some();
        next.granularity_nanos = change.granularity_nanos.unwrap_or(current.granularity_nanos);
        next.retention = change.retention.unwrap_or(current.retention.clone());
        next.space_max_bytes = change.space_max_bytes.unwrap_or(current.space_max_bytes);
        let described = format!(
            "granularity {} with retention {}",
            display_granularity(next.granularity_nanos),
            display_retention(&next.retention)
        );
        let refuse = |reason: String| EngineError::InvalidArgument(format!("{described} does not fit: {reason}"));
        // The bound on window lengths for what is being set, not for what a
        // policy saved before it already had.
        match change_sets_windows {
            true => RetentionTier::check_new(&next.retention, next.granularity_nanos),
            false => RetentionTier::check(&next.retention, next.granularity_nanos),
        }
        .map_err(refuse)?;
        // What the old policy may already have thinned stays thinned.
        let (tiers, horizon) = retention_windows(&current);
        if current.granularity_nanos > 0 {
            let granularity = current.granularity_nanos;
            let window_end = (newest.unix_nanos() / granularity + 1).saturating_mul(granularity) - 1;
            next.floors.push((granularity, Timestamp::from_unix_nanos(window_end)));
        }
        next.floors.extend(tiers);
        next.horizon_floor = next.horizon_floor.max(horizon.unwrap_or(Timestamp::MIN));
        prune_floors(&mut next);
        if next.floors.len() > VolumePolicy::FLOORS_MAX {
            return Err(refuse(format!("history would have more than {} window sizes", VolumePolicy::FLOORS_MAX)));
        }
        let intervals =
            std::iter::once(next.granularity_nanos).chain(next.retention.iter().map(|tier| tier.interval_nanos));
        for interval in intervals.filter(|&interval| interval > 0) {
            if let Some(&(floor, until)) = next
                .floors
                .iter()
                .find(|&&(floor, _)| !floor.is_multiple_of(interval) && !interval.is_multiple_of(floor))
            {
                return Err(refuse(format!(
                    "history until {} already has windows of {}, and {} neither divides nor is a multiple of that",
                    DisplayTime(until),
                    display_granularity(floor),
                    display_granularity(interval)
                )));
            }
        }
        self.change_policy(&bookmarks, |policy| *policy = next)?;
        drop(writes);
        Ok(())
    }

    /// Moves retention's clock to `now` (durably, before any index run is
    /// thinned with it) and rewrites the runs it thins further. Called by
    /// maintenance every `retention_interval_nanos`.
    pub(crate) fn apply_retention(&self, now: Timestamp) -> Result<bool, EngineError> {
        let thins_until = {
            let bookmarks = self.history.bookmarks.lock();
            {
                let policy = self.history.policy.lock();
                if policy.retention.is_empty() || now <= policy.retention_clock {
                    return Ok(false);
                }
            }
            self.change_policy(&bookmarks, |policy| {
                policy.retention_clock = now;
                prune_floors(policy);
            })?;
            let (tiers, horizon) = retention_windows(&self.history.policy.lock());
            tiers.iter().map(|&(_, until)| until).chain(horizon).max()
        };
        let Some(thins_until) = thins_until else { return Ok(false) };
        // Versions in memory are thinned as they are persisted; of the runs,
        // only those with history in windows retention now reaches.
        self.index.seal();
        self.persist_index(self.journal.lsn_durable())?;
        let rewritten = self.releasing(|| self.index.rewrite_before(thins_until))?;
        Ok(rewritten > 0)
    }

    /// Moves the horizon forward if the archived history is over the space
    /// cap (see [`crate::volume::space`]), and rewrites the runs that lets it thin.
    /// Called by maintenance every `retention_interval_nanos`.
    pub(crate) fn apply_space_cap(&self, now: Timestamp) -> Result<bool, EngineError> {
        let Some(wanted) = self.horizon_for_space_cap(now)? else { return Ok(false) };
        let clock = self.timestamp_last();
        let horizon = {
            let bookmarks = self.history.bookmarks.lock();
            let policy = self.history.policy.lock().clone();
            // A window end of every interval history has, so none straddles it.
            let coarsest = std::iter::once(policy.granularity_nanos)
                .chain(policy.retention.iter().map(|tier| tier.interval_nanos))
                .chain(policy.floors.iter().map(|&(interval, _)| interval))
                .max()
                .unwrap_or(0)
                .max(1);
            // The end of the window holding `wanted`, once no write can land
            // in it (a little more history goes than the cap asks); else
            // the end of the window before. Always the one before: with
            // windows longer than the timeline's minutes, the horizon never
            // moved while `wanted` stayed inside the first of them.
            let wanted = wanted.unix_nanos();
            let window_end = (wanted / coarsest).saturating_add(1).saturating_mul(coarsest) - 1;
            let horizon = match window_end < clock.unix_nanos() {
                true => window_end,
                false => match ((wanted + 1) / coarsest * coarsest).checked_sub(1) {
                    Some(before) => before,
                    None => return Ok(false),
                },
            };
            let horizon = Timestamp::from_unix_nanos(horizon);
            if self.retention_horizon().is_some_and(|current| current >= horizon) || horizon <= self.created() {
                return Ok(false);
            }
            self.change_policy(&bookmarks, |policy| {
                policy.horizon_floor = policy.horizon_floor.max(horizon);
                prune_floors(policy);
            })?;
            horizon
        };
        self.index.seal();
        self.persist_index(self.journal.lsn_durable())?;
        let rewritten = self.releasing(|| self.index.rewrite_before(horizon))?;
        Ok(rewritten > 0)
    }

    /// Changes the policy durably, then what the index thins. The caller
    /// holds the bookmarks lock, which serialises every change of either.
    fn change_policy(&self, bookmarks: &Bookmarks, change: impl FnOnce(&mut VolumePolicy)) -> Result<(), EngineError> {
        let mut policy = self.history.policy.lock();
        let mut next = policy.clone();
        change(&mut next);
        let path = &self.history.policy_path;
        write_file_atomic(self.storage(), path, &next.encode()).map_err(EngineError::io(path))?;
        *policy = next;
        self.rethin(&policy, bookmarks);
        Ok(())
    }

    /// Tells the index what it may thin under `policy` and `bookmarks`.
    pub(crate) fn rethin(&self, policy: &VolumePolicy, bookmarks: &Bookmarks) {
        let holds = self.history.holds.lock();
        self.index.set_thinning(thinning_of(policy, self.created(), bookmarks, &holds, &self.history.reverts.lock()));
    }

    /// The time a point names on this volume, checked to lie within its
    /// history, and moved back to the nearest time the policy keeps exact.
    pub fn resolve_time(&self, point: &PointInTime, now: Timestamp) -> Result<Timestamp, EngineError> {
        match point {
            PointInTime::At(at) => self.exact_time(self.check_in_history(*at, now)?),
            PointInTime::Bookmark(name) => {
                let bookmarks = self.history.bookmarks.lock();
                match bookmarks.entries.iter().find(|bookmark| &bookmark.name == name) {
                    Some(bookmark) => Ok(bookmark.timestamp),
                    None => Err(EngineError::BookmarkNotFound {
                        volume: self.name().to_string(),
                        bookmark: name.to_string(),
                    }),
                }
            }
        }
    }

    /// Parses a time expression as a bound of a range to delete: the time
    /// itself (not moved to an exact point), or a bookmark's.
    pub fn parse_bound(&self, input: &str, now: Timestamp, zone: &TimeZone) -> Result<Timestamp, EngineError> {
        match parse_point_in_time(input, now, zone)? {
            PointInTime::At(at) => Ok(at),
            bookmark => self.resolve_time(&bookmark, now),
        }
    }

    /// Parses and resolves a time expression (see [`crate::timespec`]).
    pub fn parse_time(&self, input: &str, now: Timestamp, zone: &TimeZone) -> Result<Timestamp, EngineError> {
        let point = parse_point_in_time(input, now, zone)?;
        self.resolve_time(&point, now)
    }

    /// The times at which block `block` got a version history still keeps,
    /// newest first, at most `limit` of them: a file tree's history of one
    /// inode. (In the layouts that file history late, a version is found
    /// once it is filed.)
    pub fn version_times(&self, block: u64, limit: usize) -> Result<Vec<Timestamp>, EngineError> {
        let block_count = self.meta.size_bytes / u64::from(self.meta.block_size.bytes());
        if block >= block_count {
            return Err(EngineError::InvalidArgument(format!(
                "block {block} is past the end of volume {}",
                self.name()
            )));
        }
        let mut times = Vec::new();
        let mut at = Timestamp::MAX;
        while times.len() < limit {
            let Some(version) = self.index.find_le(block, at)? else { break };
            times.push(version.timestamp);
            match version.timestamp.unix_nanos().checked_sub(1) {
                Some(before) => at = Timestamp::from_unix_nanos(before),
                None => break,
            }
        }
        Ok(times)
    }

    pub fn timeline(&self) -> TimelineReport {
        let unsaved = self.write.lock().timeline_unsaved.clone();
        let mut buckets = self.history.timeline.lock().buckets.clone();
        merge_buckets(&mut buckets, unsaved);
        TimelineReport {
            created: self.created(),
            timestamp_last: self.timestamp_last(),
            buckets: buckets.into_values().collect(),
            bookmarks: self.bookmarks(),
            reverts: self.reverts(),
        }
    }

    pub fn stats(&self) -> Result<VolumeStats, EngineError> {
        let counter = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
        let counters = &self.counters;
        let index = self.index.stats();
        Ok(VolumeStats {
            writes: counter(&counters.writes),
            write_bytes: counter(&counters.write_bytes),
            zeroes: counter(&counters.zeroes),
            zero_bytes: counter(&counters.zero_bytes),
            reads: counter(&counters.reads),
            read_bytes: counter(&counters.read_bytes),
            flushes: counter(&counters.flushes),
            checkpoints: counter(&counters.checkpoints),
            versions_in_memory: index.versions_in_memory,
            versions_thinned: self.index.versions_thinned(),
            versions_in_runs: index.versions_in_runs,
            index_runs: index.run_count,
            index_memory_bytes: index.memory_bytes,
            versions_archived: (index.versions_in_runs + index.versions_in_memory)
                .saturating_sub(self.index.versions_unarchived()),
            archived_before: self.index.archived_before(),
            archive_passes: counter(&counters.archive_passes),
            bookmarks_awaiting_layout: self.bookmarks_awaiting_layout(),
            layout_bytes_written: counter(&counters.layout_bytes_written),
            archive_progress: self.index.archive_progress(),
            archive_pauses: counter(&counters.archive_pauses),
            archive_yields: counter(&counters.archive_yields),
            destage_stops: counter(&counters.destage_stops),
            journal_bytes_reclaimed: counter(&counters.journal_bytes_reclaimed),
            journal_bytes: self.journal.size_bytes()?,
            journal_bytes_reclaimable: self.journal.reclaimable_bytes(self.index.archived_before())?,
            journal_spares_owed: self.journal.spares_owed() as u64,
            journal_spare_bytes_written: self.journal.spare_bytes_written(),
            current_bytes: self.current.as_ref().map_or(0, CurrentStore::size_bytes),
            lsn_last: self.journal.lsn_next().0 - 1,
            lsn_durable: self.journal.lsn_durable().0,
            lsn_vouched: self.journal.lsn_vouched().0,
            versions_pending_destage: self.overlay_versions.load(Ordering::Relaxed) as u64,
            writers_waiting_for_room: self.writers_waiting_for_room.load(Ordering::Relaxed) as u64,
            revert_blocks_copied: counter(&counters.revert_blocks_copied),
            revert_copy: self.revert_copy_status(),
            poisoned: self.is_poisoned(),
        })
    }
}

fn thinning_of(
    policy: &VolumePolicy,
    created: Timestamp,
    bookmarks: &Bookmarks,
    holds: &BTreeMap<Timestamp, usize>,
    reverts: &Reverts,
) -> Thinning {
    let (mut tiers, horizon) = retention_windows(policy);
    tiers.extend_from_slice(&policy.floors);
    let horizon = horizon.max(Some(policy.horizon_floor)).filter(|&horizon| horizon > created);
    // The creation is the base state until retention moves the base past it.
    let base = horizon.is_none().then_some(created);
    let mut pins: Vec<Timestamp> = base
        .into_iter()
        .chain(bookmarks.entries.iter().map(|bookmark| bookmark.timestamp))
        .chain(holds.keys().copied())
        // What a revert went back to, and what it left: both stay readable.
        .chain(reverts.entries.iter().flat_map(|revert| [revert.to, revert.before]))
        .collect();
    pins.sort_unstable();
    pins.dedup();
    Thinning { granularity_nanos: policy.granularity_nanos, tiers, horizon, pins, deleted: policy.deleted.clone() }
}

/// Retention's windows as of its clock: each tier coarser than the one
/// before applies to windows ending before the previous tier's age; the
/// horizon is the last tier's age, moved back to a window end of the
/// coarsest interval so no window straddles it.
fn retention_windows(policy: &VolumePolicy) -> (Vec<(u64, Timestamp)>, Option<Timestamp>) {
    let clock = policy.retention_clock;
    let mut tiers = Vec::new();
    let mut interval = policy.granularity_nanos;
    let mut age_before = 0;
    for tier in &policy.retention {
        if tier.interval_nanos > interval {
            interval = tier.interval_nanos;
            tiers.push((interval, clock.saturating_sub_nanos(age_before)));
        }
        age_before = tier.age_nanos;
    }
    let horizon = policy.retention.last().and_then(|last| {
        let horizon = clock.unix_nanos().checked_sub(last.age_nanos)?;
        let aligned = match (horizon + 1).checked_div(interval) {
            None => Some(horizon),
            Some(windows) => (windows * interval).checked_sub(1),
        };
        aligned.map(Timestamp::from_unix_nanos)
    });
    (tiers, horizon)
}

/// Drops the window floors the policy's own windows (as of its clock) or
/// horizon make redundant, and joins floors of the same interval.
fn prune_floors(policy: &mut VolumePolicy) {
    let (tiers, horizon) = retention_windows(policy);
    let horizon = horizon.max(Some(policy.horizon_floor));
    let granularity = policy.granularity_nanos;
    let mut floors = std::mem::take(&mut policy.floors);
    floors.sort_unstable_by_key(|&(interval, until)| (interval, std::cmp::Reverse(until)));
    floors.dedup_by_key(|&mut (interval, _)| interval);
    // A tier thins only the windows that end by its `later`: the coarser
    // window holding `until` must too, or the floor's finer windows in it
    // would be taken for exact points while they hold thinned history.
    let window_end =
        |at: Timestamp, window: u64| (at.unix_nanos() / window).saturating_add(1).saturating_mul(window) - 1;
    floors.retain(|&(interval, until)| {
        let covered = interval <= granularity
            || tiers
                .iter()
                .any(|&(coarser, later)| coarser >= interval && window_end(until, coarser) <= later.unix_nanos())
            || horizon.is_some_and(|horizon| until <= horizon);
        !covered
    });
    policy.floors = floors;
}

/// `ranges` with `added` joined in: sorted, overlapping ones merged.
fn merge_ranges(ranges: &[(Timestamp, Timestamp)], added: (Timestamp, Timestamp)) -> Vec<(Timestamp, Timestamp)> {
    let mut all: Vec<_> = ranges.iter().copied().chain(std::iter::once(added)).collect();
    all.sort_unstable();
    let mut merged: Vec<(Timestamp, Timestamp)> = Vec::with_capacity(all.len());
    for (from, to) in all {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// A revert is made durable (the `reverts` file) before the bookmark of the
/// state just before it is saved: a crash between the two leaves a revert
/// without its `before-revert-…` bookmark, which is added here. (Such a
/// bookmark cannot be deleted while its revert stands — see
/// `Volume::delete_bookmark` — so one missing was never saved.)
fn bookmark_every_revert(
    storage: &dyn Storage,
    path: &str,
    bookmarks: Bookmarks,
    reverts: &Reverts,
) -> Result<Bookmarks, EngineError> {
    let unnamed: Vec<&Revert> = reverts
        .entries
        .iter()
        .filter(|revert| !bookmarks.entries.iter().any(|bookmark| bookmark.timestamp == revert.before))
        .collect();
    if unnamed.is_empty() {
        return Ok(bookmarks);
    }
    let mut next = bookmarks;
    for revert in unnamed {
        let name = before_revert_name(revert, |name| next.entries.iter().any(|bookmark| bookmark.name == *name));
        tracing::info!(
            path, at = %DisplayTime(revert.at), bookmark = %name,
            "a crash came between a revert and its bookmark: bookmarked the state before it"
        );
        next.entries.push(Bookmark { name, timestamp: revert.before });
    }
    next.entries.sort_by_key(|bookmark| bookmark.timestamp);
    write_file_atomic(storage, path, &next.encode()).map_err(EngineError::io(path))?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000_000_000;

    /// A floor of minute windows up to 10:40, under a new policy of hour
    /// windows as of 10:40: the hour holding 10:40 ends at 10:59:59, past
    /// what that tier thins, so the floor stays (dropped, 10:15:30 read as
    /// exact while its minute was thinned). One ending at 10:00 is covered.
    #[test]
    fn a_floor_stays_unless_a_coarser_tier_thins_the_whole_window_holding_its_end() {
        let at = |minutes: u64| Timestamp::from_unix_nanos(minutes * MINUTE);
        let policy = |until| VolumePolicy {
            retention: vec![RetentionTier { interval_nanos: 60 * MINUTE, age_nanos: 24 * 60 * MINUTE }],
            retention_clock: at(10 * 60 + 40),
            floors: vec![(MINUTE, until)],
            ..VolumePolicy::default()
        };
        let mut partial = policy(at(10 * 60 + 40));
        prune_floors(&mut partial);
        assert_eq!(partial.floors, [(MINUTE, at(10 * 60 + 40))]);
        let mut whole = policy(at(10 * 60).saturating_sub_nanos(1));
        prune_floors(&mut whole);
        assert_eq!(whole.floors, []);
    }
}
