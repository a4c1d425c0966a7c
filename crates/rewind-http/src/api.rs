//! The JSON wire types of the management API, shared by the server and the
//! CLI (which also builds them itself when it works offline on a data
//! directory). Times are RFC 3339 strings in UTC with their Unix nanoseconds
//! alongside, for scripts.

use serde::{Deserialize, Serialize};

use rewind_engine::timespec::{
    display_granularity, display_retention, parse_granularity, parse_retention, DisplayTime,
};
use rewind_engine::{
    BlockSize, Bookmark, EngineError, RetentionTier, TimelineReport, Timestamp, Volume, VolumeName, VolumeSpec,
    VolumeStats,
};

pub fn time(at: Timestamp) -> String {
    DisplayTime(at).to_string()
}

/// The NBD export name of a volume's view at `at`.
pub fn view_export(volume: &str, at: Timestamp) -> String {
    format!("{volume}@{}", time(at))
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub layout: String,
    /// When protection began: the earliest time a view can show.
    pub created: String,
    pub created_unix_nanos: u64,
    /// Time of the newest version, if anything was written.
    pub last_write: Option<String>,
    pub last_write_unix_nanos: Option<u64>,
    pub bookmark_count: usize,
    /// Protection granularity: per block, only the last write in each window
    /// of this length is history ("every write" for 0).
    pub granularity: String,
    pub granularity_nanos: u64,
    /// Retention tiers `interval:age`, youngest first ("forever" if none).
    pub retention: String,
    /// The oldest state retention keeps (older history is gone but for
    /// bookmarks), once retention has dropped any.
    pub oldest_kept: Option<String>,
    pub oldest_kept_unix_nanos: Option<u64>,
    /// The volume refuses writes after a failed fsync, until the server restarts.
    pub poisoned: bool,
    /// NBD export name of the live, writable volume.
    pub export: String,
}

impl VolumeInfo {
    pub fn of(volume: &Volume) -> VolumeInfo {
        let last = volume.timestamp_last();
        let written = last > volume.created();
        let horizon = volume.retention_horizon();
        VolumeInfo {
            name: volume.name().to_string(),
            size_bytes: volume.size_bytes(),
            block_size: volume.block_size().bytes(),
            layout: "journaled".to_owned(),
            created: time(volume.created()),
            created_unix_nanos: volume.created().unix_nanos(),
            last_write: written.then(|| time(last)),
            last_write_unix_nanos: written.then(|| last.unix_nanos()),
            bookmark_count: volume.bookmarks().len(),
            granularity: display_granularity(volume.granularity_nanos()),
            granularity_nanos: volume.granularity_nanos(),
            retention: display_retention(&volume.retention()),
            oldest_kept: horizon.map(time),
            oldest_kept_unix_nanos: horizon.map(Timestamp::unix_nanos),
            poisoned: volume.is_poisoned(),
            export: volume.name().to_string(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroes: u64,
    pub zero_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub flushes: u64,
    pub checkpoints: u64,
    /// Versions kept as history.
    pub versions: u64,
    pub versions_in_memory: u64,
    /// Versions written since creation (kept + thinned by the granularity).
    pub versions_written: u64,
    /// The retained fraction r = kept / written (1 with every-write granularity).
    pub retained_fraction: f64,
    pub index_runs: u64,
    pub index_memory_bytes: u64,
    pub journal_bytes: u64,
    pub lsn_last: u64,
    pub lsn_durable: u64,
    pub versions_pending_destage: u64,
}

impl From<VolumeStats> for Stats {
    fn from(stats: VolumeStats) -> Self {
        let kept = stats.versions_in_memory + stats.versions_in_runs;
        let written = kept + stats.versions_thinned;
        Stats {
            writes: stats.writes,
            write_bytes: stats.write_bytes,
            zeroes: stats.zeroes,
            zero_bytes: stats.zero_bytes,
            reads: stats.reads,
            read_bytes: stats.read_bytes,
            flushes: stats.flushes,
            checkpoints: stats.checkpoints,
            versions: kept,
            versions_in_memory: stats.versions_in_memory,
            versions_written: written,
            retained_fraction: if written == 0 { 1.0 } else { kept as f64 / written as f64 },
            index_runs: stats.index_runs,
            index_memory_bytes: stats.index_memory_bytes,
            journal_bytes: stats.journal_bytes,
            lsn_last: stats.lsn_last,
            lsn_durable: stats.lsn_durable,
            versions_pending_destage: stats.versions_pending_destage,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VolumeDetail {
    #[serde(flatten)]
    pub info: VolumeInfo,
    pub stats: Stats,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    /// Defaults to 4096.
    pub block_size: Option<u32>,
    #[serde(flatten)]
    pub policy: Policy,
}

impl CreateVolume {
    /// The engine's spec: 4 KiB blocks, every write and all history kept,
    /// unless asked otherwise.
    pub fn spec(&self) -> Result<VolumeSpec, String> {
        let (granularity_nanos, retention) = self.policy.parse()?;
        Ok(VolumeSpec {
            name: VolumeName::new(&self.name).map_err(|error| error.to_string())?,
            size_bytes: self.size_bytes,
            block_size: self
                .block_size
                .map_or(Ok(BlockSize::DEFAULT), BlockSize::new)
                .map_err(|error| error.to_string())?,
            granularity_nanos: granularity_nanos.unwrap_or(0),
            retention: retention.unwrap_or_default(),
        })
    }
}

/// What history a volume keeps, as people write it; what is absent stays
/// as it is (or takes the default).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Policy {
    /// `0` (every write, the default) or a duration like `5m`.
    pub granularity: Option<String>,
    /// Tiers like `all:2h, 1m:24h, 1h:7d`, or `forever` (the default).
    pub retention: Option<String>,
}

impl Policy {
    /// Granularity in nanoseconds and retention tiers, each if given.
    pub fn parse(&self) -> Result<(Option<u64>, Option<Vec<RetentionTier>>), String> {
        let granularity_nanos = self.granularity.as_deref().map(parse_granularity).transpose()?;
        let retention = self.retention.as_deref().map(parse_retention).transpose()?;
        Ok((granularity_nanos, retention))
    }
}

/// `PATCH /v1/volumes/{name}`: what to change.
pub type UpdateVolume = Policy;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BookmarkInfo {
    pub name: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// NBD export name of the view at the bookmark.
    pub export: String,
}

impl BookmarkInfo {
    pub fn of(volume: &str, bookmark: &Bookmark) -> BookmarkInfo {
        BookmarkInfo {
            name: bookmark.name.to_string(),
            at: time(bookmark.timestamp),
            at_unix_nanos: bookmark.timestamp.unix_nanos(),
            export: format!("{volume}@{}", bookmark.name),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CreateBookmark {
    pub name: String,
    /// Any time expression (see `rewind help times`); now if absent.
    pub at: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TimelineBucket {
    pub start: String,
    pub start_unix_seconds: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroes: u64,
    pub zero_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Timeline {
    pub volume: String,
    pub created: String,
    pub last_write: Option<String>,
    pub bucket_seconds: u64,
    /// Buckets with activity, oldest first.
    pub buckets: Vec<TimelineBucket>,
    pub bookmarks: Vec<BookmarkInfo>,
}

impl Timeline {
    /// Aggregates per-minute activity into buckets of `bucket_seconds` (a
    /// multiple of 60).
    pub fn of(volume: &str, report: &TimelineReport, bucket_seconds: u64) -> Timeline {
        assert!(bucket_seconds >= 60 && bucket_seconds.is_multiple_of(60));
        let mut buckets: Vec<TimelineBucket> = Vec::new();
        for minute in &report.buckets {
            let start = minute.minute * 60 / bucket_seconds * bucket_seconds;
            if buckets.last().is_none_or(|last| last.start_unix_seconds != start) {
                buckets.push(TimelineBucket {
                    start: time(Timestamp::from_unix_nanos(start * Timestamp::NANOS_PER_SECOND)),
                    start_unix_seconds: start,
                    writes: 0,
                    write_bytes: 0,
                    zeroes: 0,
                    zero_bytes: 0,
                });
            }
            let bucket = buckets.last_mut().expect("just pushed");
            bucket.writes += minute.write_count;
            bucket.write_bytes += minute.write_bytes;
            bucket.zeroes += minute.zero_count;
            bucket.zero_bytes += minute.zero_bytes;
        }
        let written = report.timestamp_last > report.created;
        Timeline {
            volume: volume.to_owned(),
            created: time(report.created),
            last_write: written.then(|| time(report.timestamp_last)),
            bucket_seconds,
            buckets,
            bookmarks: report.bookmarks.iter().map(|bookmark| BookmarkInfo::of(volume, bookmark)).collect(),
        }
    }
}

/// A view resolved: what `NAME@TIME` means right now.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ViewInfo {
    pub volume: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// NBD export name that opens exactly this point in time.
    pub export: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportSummary {
    pub volume: VolumeInfo,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    /// Stable, machine-readable kind: not_found, conflict, invalid, unavailable, corrupt, io.
    pub kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub volumes: usize,
    /// Where the server's NBD exports are, e.g. `127.0.0.1:10809`.
    pub nbd_address: Option<String>,
}

/// `DELETE /v1/volumes/{name}/history?from=TIME&to=TIME`: what was deleted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeletedHistory {
    pub volume: String,
    pub from: String,
    pub from_unix_nanos: u64,
    pub to: String,
    pub to_unix_nanos: u64,
    /// Versions kept afterwards, and dropped so far by thinning in all.
    pub versions: u64,
    pub versions_thinned: u64,
}

impl DeletedHistory {
    /// Deletes the history of `volume` between the times `from` and `to` name.
    pub fn delete(volume: &Volume, from: &str, to: &str, now: Timestamp) -> Result<DeletedHistory, EngineError> {
        let zone = jiff::tz::TimeZone::system();
        let from = volume.parse_bound(from, now, &zone)?;
        let to = volume.parse_bound(to, now, &zone)?;
        volume.delete_history(from, to, now)?;
        let stats = volume.stats()?;
        Ok(DeletedHistory {
            volume: volume.name().to_string(),
            from: time(from),
            from_unix_nanos: from.unix_nanos(),
            to: time(to),
            to_unix_nanos: to.unix_nanos(),
            versions: stats.versions_in_memory + stats.versions_in_runs,
            versions_thinned: stats.versions_thinned,
        })
    }
}
