//! The JSON wire types of the management API, shared by the server and the
//! CLI (which also builds them itself when it works offline on a data
//! directory). Times are RFC 3339 strings in UTC with their Unix nanoseconds
//! alongside, for scripts.

use jiff::tz::TimeZone;
use rewind_tree::{TreeError, Trees};
use serde::{Deserialize, Serialize};

use rewind_engine::catalog::CatalogStatus;
use rewind_engine::timespec::{
    display_granularity, display_retention, parse_granularity, parse_retention, DisplayTime,
};
use rewind_engine::{
    ratio, BlockSize, Bookmark, ChunkStats, CollectPhase, CollectReport, DamagedVolume, DefragReport, EngineError,
    Group, GroupBookmark, IoStats, Layout, MemberPoint, PolicyChange, PromoteReport, RepairReport, Revert,
    RevertReport, SpaceReport, TierStats, TimelineReport, Timestamp, Volume, VolumeBase, VolumeIoStats, VolumeKind,
    VolumeName, VolumeSpace, VolumeSpec, VolumeStats,
};

pub fn time(at: Timestamp) -> String {
    DisplayTime(at).to_string()
}

/// The NBD export name of a volume's view at `at`.
pub fn view_export(volume: &str, at: Timestamp) -> String {
    format!("{volume}@{}", time(at))
}

/// The export that serves `volume` as it was at `point` (a bookmark's
/// name): NBD's export name for a block volume, the NFS export path for a
/// file tree.
pub fn export_at(volume: &str, kind: VolumeKind, point: &str) -> String {
    match kind {
        VolumeKind::Blocks => format!("{volume}@{point}"),
        VolumeKind::Tree => format!("/{volume}@{point}"),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub layout: String,
    /// The controller cache of split-stream, split-down-stream and checkpointing volumes (0 for the others).
    pub cache_bytes: u64,
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
    /// The most bytes the archived history may take ("none" if no cap).
    pub space_max: String,
    pub space_max_bytes: u64,
    /// The oldest state retention keeps (older history is gone but for
    /// bookmarks), once retention or the space cap has dropped any.
    pub oldest_kept: Option<String>,
    pub oldest_kept_unix_nanos: Option<u64>,
    /// The volume refuses writes after a failed fsync, until the server restarts.
    pub poisoned: bool,
    /// NBD export name of the live, writable volume (a file tree's: the
    /// NFS export `/NAME`).
    pub export: String,
    /// `blocks` (a volume, over NBD) or `tree` (a file tree, over NFS).
    pub kind: String,
    /// `ok`; `damaged` (not served: `rewind volume repair` or `delete`);
    /// `poisoned` (writes refused until restart); `recovering` (recovery
    /// waits for free space: views wait); `failing` (its work meets a
    /// transient error, retried by itself).
    pub state: String,
    /// What is wrong and what to do, unless `ok`.
    pub problem: Option<String>,
    /// What is known to be lost or dropped: damaged history, a journal tail
    /// cut off on opening, what a repair lost.
    pub notes: Vec<String>,
    /// A clone's base: the volume it reads where it has not written, as of
    /// the point it was cloned at.
    pub base: Option<BaseInfo>,
    /// How many times the volume was reverted in place, and the last revert.
    pub revert_count: usize,
    pub last_revert: Option<RevertInfo>,
}

/// The point a clone starts from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BaseInfo {
    pub volume: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// Promoted: the clone reads its own copy of that point, and the base
    /// volume may be deleted (or gone).
    pub copied: bool,
}

impl BaseInfo {
    fn of(base: &VolumeBase) -> BaseInfo {
        BaseInfo {
            volume: base.volume.to_string(),
            at: time(base.at),
            at_unix_nanos: base.at.unix_nanos(),
            copied: base.copied,
        }
    }
}

/// One line of the stream a slow request over one volume answers with
/// (newline-delimited JSON): progress through the volume, then the result
/// `T` or an error.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Streamed<T> {
    Progress { done: u64, total: u64 },
    Done(T),
    Failed { error: String },
}

/// The `POST /v1/volumes/{name}/promote` stream (progress in bytes).
pub type PromoteEvent = Streamed<PromoteSummary>;

/// The `POST /v1/volumes/{name}/defrag` stream (progress in blocks).
pub type DefragEvent = Streamed<DefragSummary>;

/// `POST /v1/volumes/{name}/defrag`: the point whose view to lay out.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DefragVolume {
    /// Any time expression or bookmark of the volume (see `rewind help times`).
    pub at: String,
}

/// What a defrag did (see `rewind_engine::DefragReport`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DefragSummary {
    pub volume: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// Blocks of the view whose version is archived history (read from the
    /// chunk store now, or once the block is written again).
    pub blocks_archived: u64,
    /// The distinct chunks they read, and the runs of neighbouring records
    /// those lay in before.
    pub chunks: u64,
    pub runs_before: u64,
    /// Chunks copied into new packs in block order, and the bytes written.
    pub chunks_moved: u64,
    pub bytes_written: u64,
    /// Chunks whose record failed its check, left where they are.
    pub chunks_damaged: u64,
    /// Blocks passed over unplanned: whole pieces the volume never wrote.
    #[serde(default)]
    pub blocks_skipped: u64,
}

impl DefragSummary {
    pub fn of(volume: &str, at: Timestamp, report: &DefragReport) -> DefragSummary {
        DefragSummary {
            volume: volume.to_owned(),
            at: time(at),
            at_unix_nanos: at.unix_nanos(),
            blocks_archived: report.blocks_archived,
            chunks: report.chunks,
            runs_before: report.runs_before,
            chunks_moved: report.chunks_moved,
            bytes_written: report.bytes_written,
            chunks_damaged: report.chunks_damaged,
            blocks_skipped: report.blocks_skipped,
        }
    }
}

/// What a promote did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromoteSummary {
    pub volume: String,
    /// Where it came from; `copied` now.
    pub base: BaseInfo,
    /// The base point's data copied into the clone.
    pub bytes_copied: u64,
}

impl PromoteSummary {
    pub fn of(volume: &str, report: &PromoteReport) -> PromoteSummary {
        PromoteSummary {
            volume: volume.to_owned(),
            base: BaseInfo::of(&report.base),
            bytes_copied: report.bytes_copied,
        }
    }
}

impl VolumeInfo {
    pub fn of(volume: &Volume) -> VolumeInfo {
        let (state, problem) = volume_state(volume);
        let last = volume.timestamp_last();
        let written = last > volume.created();
        let horizon = volume.retention_horizon();
        let reverts = volume.reverts();
        VolumeInfo {
            name: volume.name().to_string(),
            size_bytes: volume.size_bytes(),
            block_size: volume.block_size().bytes(),
            layout: volume.layout().name().to_owned(),
            cache_bytes: volume.cache_bytes(),
            created: time(volume.created()),
            created_unix_nanos: volume.created().unix_nanos(),
            last_write: written.then(|| time(last)),
            last_write_unix_nanos: written.then(|| last.unix_nanos()),
            bookmark_count: volume.bookmarks().len(),
            granularity: display_granularity(volume.granularity_nanos()),
            granularity_nanos: volume.granularity_nanos(),
            retention: display_retention(&volume.retention()),
            space_max: display_space_max(volume.space_max_bytes()),
            space_max_bytes: volume.space_max_bytes(),
            oldest_kept: horizon.map(time),
            oldest_kept_unix_nanos: horizon.map(Timestamp::unix_nanos),
            poisoned: volume.is_poisoned(),
            export: match volume.kind() {
                VolumeKind::Blocks => volume.name().to_string(),
                VolumeKind::Tree => format!("/{}", volume.name()),
            },
            kind: kind_name(volume.kind()).to_owned(),
            state: state.to_owned(),
            problem,
            notes: volume_notes(volume),
            base: volume.base().as_ref().map(BaseInfo::of),
            revert_count: reverts.len(),
            last_revert: reverts.last().map(RevertInfo::of),
        }
    }

    /// A volume that does not open: what is known of it, and what is wrong.
    pub fn damaged(damaged: &DamagedVolume) -> VolumeInfo {
        let meta = damaged.meta.as_ref();
        let created = meta.map_or(Timestamp::MIN, |meta| meta.created);
        VolumeInfo {
            name: damaged.name.clone(),
            size_bytes: meta.map_or(0, |meta| meta.size_bytes),
            block_size: meta.map_or(0, |meta| meta.block_size.bytes()),
            layout: meta.map_or("unknown".to_owned(), |meta| meta.layout.name().to_owned()),
            cache_bytes: meta.map_or(0, |meta| meta.cache_bytes),
            created: time(created),
            created_unix_nanos: created.unix_nanos(),
            last_write: None,
            last_write_unix_nanos: None,
            bookmark_count: 0,
            granularity: String::new(),
            granularity_nanos: 0,
            retention: String::new(),
            space_max: String::new(),
            space_max_bytes: 0,
            oldest_kept: None,
            oldest_kept_unix_nanos: None,
            poisoned: false,
            export: damaged.name.clone(),
            kind: kind_name(meta.map_or(VolumeKind::Blocks, |meta| meta.kind)).to_owned(),
            state: "damaged".to_owned(),
            problem: Some(
                EngineError::Damaged { volume: damaged.name.clone(), problem: damaged.problem.clone() }.to_string(),
            ),
            notes: Vec::new(),
            base: meta.and_then(|meta| meta.base.as_ref()).map(BaseInfo::of),
            revert_count: 0,
            last_revert: None,
        }
    }
}

fn kind_name(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::Blocks => "blocks",
        VolumeKind::Tree => "tree",
    }
}

/// Every volume of `node` that `visible` lets through, damaged ones too,
/// by name (the API's and the offline CLI's `volume list`).
pub fn volume_list(node: &rewind_engine::Node, visible: impl Fn(&str) -> bool) -> Vec<VolumeInfo> {
    let mut listed: Vec<VolumeInfo> = node
        .volumes()
        .iter()
        .filter(|volume| visible(volume.name().as_str()))
        .map(|volume| VolumeInfo::of(volume))
        .collect();
    let damaged = node.damaged_volumes();
    listed.extend(damaged.iter().filter(|damaged| visible(&damaged.name)).map(VolumeInfo::damaged));
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    listed
}

/// A volume's state for people and scripts: the word and what is wrong.
fn volume_state(volume: &Volume) -> (&'static str, Option<String>) {
    if let Some(cause) = volume.poison_cause() {
        let error = EngineError::Poisoned { volume: volume.name().to_string(), cause };
        return ("poisoned", Some(error.to_string()));
    }
    if !volume.is_settled() {
        return ("recovering", Some(EngineError::RecoveryPending { volume: volume.name().to_string() }.to_string()));
    }
    match volume.fault() {
        Some((what, since)) => ("failing", Some(format!("since {}: {what}; retried by itself", time(since)))),
        None => ("ok", None),
    }
}

/// What is known to be lost or dropped in a volume's history.
fn volume_notes(volume: &Volume) -> Vec<String> {
    let mut notes = volume.history_damage();
    if let Some(dropped) = volume.journal_tail_dropped() {
        let kind = match dropped.whole {
            true => "a record there was whole but failed its checksum, which could be a torn write or damage",
            false => "a torn write",
        };
        notes.push(format!(
            "on opening, dropped the last {} bytes of the journal (from LSN {}, after the write at {}): {kind}; \
             nothing later vouched for it",
            dropped.bytes,
            dropped.lsn_first,
            time(dropped.after)
        ));
    }
    notes
}

/// A space cap as people write it: `none` or a size like `200GiB`.
pub fn display_space_max(bytes: u64) -> String {
    if bytes == 0 {
        "none".to_owned()
    } else {
        human_bytes(bytes)
    }
}

/// Parses a space cap: `none` (or `0`) for no cap, or a size like `200GiB`.
pub fn parse_space_max(text: &str) -> Result<u64, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|error| format!("cannot read the space cap {text:?} ({error}); write it like 200GiB, 500GB or none"))
}

/// Parses a controller cache size like `64MiB`.
fn parse_cache(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .ok()
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("cannot read the cache size {text:?}; write it like 64MiB or 4GiB"))
}

/// Bytes in binary units with one decimal: `1.5 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
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
    /// Kept versions archived (in the chunk store, or zeros), and those
    /// whose data is still in the journal.
    pub versions_archived: u64,
    pub versions_in_journal: u64,
    pub journal_bytes: u64,
    /// Journal bytes holding only archived history, given back at the next
    /// checkpoint.
    pub journal_bytes_reclaimable: u64,
    /// Spare journal files still to be written at a quiet moment, for those
    /// the chunk store adopted: the next burst writes faster once they are.
    pub journal_spares_owed: u64,
    /// Bytes of zeros written into those spares since the volume was opened.
    pub journal_spare_bytes_written: u64,
    pub current_bytes: u64,
    pub lsn_last: u64,
    pub lsn_durable: u64,
    /// The last LSN a vouch record vouches for: damage to records up to it
    /// is told from a torn write after a crash.
    pub lsn_vouched: u64,
    pub versions_pending_destage: u64,
    /// Writers waiting now for destaging to make room in the overlay.
    #[serde(default)]
    pub writers_waiting_for_room: u64,
    /// Blocks the background copy after a revert put back into the current
    /// store since the server started.
    #[serde(default)]
    pub revert_blocks_copied: u64,
    /// Blocks the background copy after the last revert has yet to look
    /// at (0 once it is finished, or if there is none).
    #[serde(default)]
    pub revert_copy_blocks_left: u64,
    /// Archive passes since the server started, and how many of them
    /// paused for a burst of writes or for reads right after one
    /// (`--burst-reads`).
    #[serde(default)]
    pub archive_passes: u64,
    #[serde(default)]
    pub archive_pauses: u64,
    /// Bookmarks whose history is archived and waits to be laid out in
    /// block order in the background (while the volume is neither written
    /// nor read), and the bytes of packs that has written.
    #[serde(default)]
    pub bookmarks_awaiting_layout: u64,
    #[serde(default)]
    pub layout_bytes_written: u64,
    /// Parts after which a pass that reads right after a burst did not
    /// hold (its history did not fit the free space) waited, to take at
    /// most a sixteenth of the time beside them.
    #[serde(default)]
    pub archive_yields: u64,
    /// Destage passes stopped part-way for small reads right after a
    /// burst of writes, to go on once they pause (`--burst-reads`).
    #[serde(default)]
    pub destage_stops: u64,
    /// The archive pass under way: the versions it merges (0: none under
    /// way) and how many it has been through. Those it archives leave
    /// `versions_in_journal` only as it ends.
    #[serde(default)]
    pub versions_archiving: u64,
    #[serde(default)]
    pub versions_archiving_done: u64,
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
            retained_fraction: ratio(kept, written),
            index_runs: stats.index_runs,
            index_memory_bytes: stats.index_memory_bytes,
            versions_archived: stats.versions_archived,
            versions_in_journal: kept - stats.versions_archived,
            journal_bytes: stats.journal_bytes,
            journal_bytes_reclaimable: stats.journal_bytes_reclaimable,
            journal_spares_owed: stats.journal_spares_owed,
            journal_spare_bytes_written: stats.journal_spare_bytes_written,
            current_bytes: stats.current_bytes,
            lsn_last: stats.lsn_last,
            lsn_durable: stats.lsn_durable,
            lsn_vouched: stats.lsn_vouched,
            versions_pending_destage: stats.versions_pending_destage,
            writers_waiting_for_room: stats.writers_waiting_for_room,
            revert_blocks_copied: stats.revert_blocks_copied,
            revert_copy_blocks_left: stats
                .revert_copy
                .map_or(0, |copy| copy.blocks_total.saturating_sub(copy.blocks_done)),
            archive_passes: stats.archive_passes,
            archive_pauses: stats.archive_pauses,
            bookmarks_awaiting_layout: stats.bookmarks_awaiting_layout,
            layout_bytes_written: stats.layout_bytes_written,
            archive_yields: stats.archive_yields,
            destage_stops: stats.destage_stops,
            versions_archiving: stats.archive_progress.map_or(0, |(_, total)| total),
            versions_archiving_done: stats.archive_progress.map_or(0, |(done, _)| done),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VolumeDetail {
    #[serde(flatten)]
    pub info: VolumeInfo,
    pub stats: Stats,
}

/// `POST /v1/volumes`. Unknown fields are refused, naming the field: a
/// misspelt `"layuot"` must not quietly create a volume of the default
/// layout. (The policy fields are spelt out rather than a flattened
/// `Policy`: serde's `deny_unknown_fields` does not work with `flatten`.)
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    /// Defaults to 4096.
    pub block_size: Option<u32>,
    /// journaled (the default), logging, checkpointing, cow or row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// The controller cache of split-stream, split-down-stream and checkpointing, e.g. `64MiB` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// See [`Policy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_max: Option<String>,
    /// A file tree (served over NFS) rather than a block volume: its
    /// volume's size, block size and layout are fixed, and not given.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tree: bool,
}

impl CreateVolume {
    /// What history the new volume keeps.
    pub fn policy(&self) -> Policy {
        Policy {
            granularity: self.granularity.clone(),
            retention: self.retention.clone(),
            space_max: self.space_max.clone(),
        }
    }

    /// The engine's spec: 4 KiB blocks, every write and all history kept,
    /// unless asked otherwise.
    pub fn spec(&self) -> Result<VolumeSpec, String> {
        let policy = self.policy().parse()?;
        if self.tree {
            if self.size_bytes != 0 || self.block_size.is_some() || self.layout.is_some() || self.cache.is_some() {
                return Err("a file tree has no size, block size, layout or cache to choose: leave them out".into());
            }
            let name = VolumeName::new(&self.name).map_err(|error| error.to_string())?;
            return Ok(VolumeSpec {
                granularity_nanos: policy.granularity_nanos.unwrap_or(0),
                retention: policy.retention.unwrap_or_default(),
                space_max_bytes: policy.space_max_bytes.unwrap_or(0),
                ..VolumeSpec::tree(name)
            });
        }
        Ok(VolumeSpec {
            name: VolumeName::new(&self.name).map_err(|error| error.to_string())?,
            size_bytes: self.size_bytes,
            block_size: self
                .block_size
                .map_or(Ok(BlockSize::DEFAULT), BlockSize::new)
                .map_err(|error| error.to_string())?,
            granularity_nanos: policy.granularity_nanos.unwrap_or(0),
            retention: policy.retention.unwrap_or_default(),
            space_max_bytes: policy.space_max_bytes.unwrap_or(0),
            layout: self.layout.as_deref().map_or(Ok(Layout::Journaled), Layout::parse)?,
            cache_bytes: self.cache.as_deref().map_or(Ok(0), parse_cache)?,
            kind: rewind_engine::VolumeKind::Blocks,
        })
    }
}

/// What history a volume keeps, as people write it; what is absent stays
/// as it is (or takes the default).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// `0` (every write, the default) or a duration like `5m`.
    pub granularity: Option<String>,
    /// Tiers like `all:2h, 1m:24h, 1h:7d`, or `forever` (the default).
    pub retention: Option<String>,
    /// The most bytes the archived history may take, like `200GiB`, or
    /// `none` (the default).
    pub space_max: Option<String>,
}

impl Policy {
    /// What the request changes.
    pub fn parse(&self) -> Result<PolicyChange, String> {
        Ok(PolicyChange {
            granularity_nanos: self.granularity.as_deref().map(parse_granularity).transpose()?,
            retention: self.retention.as_deref().map(parse_retention).transpose()?,
            space_max_bytes: self.space_max.as_deref().map(parse_space_max).transpose()?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.granularity.is_none() && self.retention.is_none() && self.space_max.is_none()
    }
}

/// `PATCH /v1/volumes/{name}`: what to change. At least one field; the
/// server refuses fields that are not here, naming them, and says so
/// plainly for those fixed at creation ([`FIXED_AT_CREATION`]).
pub type UpdateVolume = Policy;

/// Fields of [`CreateVolume`] that no PATCH can change.
pub const FIXED_AT_CREATION: [&str; 5] = ["name", "size_bytes", "block_size", "layout", "cache"];

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BookmarkInfo {
    pub name: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// The export of the view at the bookmark (NBD's name, or for a file
    /// tree the NFS export path).
    pub export: String,
}

impl BookmarkInfo {
    pub fn of(volume: &str, kind: VolumeKind, bookmark: &Bookmark) -> BookmarkInfo {
        BookmarkInfo {
            name: bookmark.name.to_string(),
            at: time(bookmark.timestamp),
            at_unix_nanos: bookmark.timestamp.unix_nanos(),
            export: export_at(volume, kind, bookmark.name.as_str()),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateBookmark {
    pub name: String,
    /// Any time expression (see `rewind help times`); now if absent.
    pub at: Option<String>,
}

/// `POST /v1/volumes/{name}/clones`: a writable clone of the volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateClone {
    /// The clone's name: a new volume.
    pub name: String,
    /// Any time expression or bookmark of the source (see `rewind help
    /// times`); now if absent.
    pub at: Option<String>,
}

/// One write a volume's history keeps — `[unix nanoseconds, offset bytes,
/// length bytes]` — as `GET /v1/volumes/{name}/writes` streams them:
/// newline-delimited JSON, one per line, oldest first (what `rewind trace
/// export` writes as a trace). A long history holds millions.
pub type KeptWrite = [u64; 3];

pub fn kept_write(write: &rewind_engine::WriteExtent) -> KeptWrite {
    [write.time.unix_nanos(), write.offset_bytes, write.length_bytes]
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
    /// Reverts in place, oldest first.
    pub reverts: Vec<RevertInfo>,
}

/// A revert in place: an event on a volume's timeline.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RevertInfo {
    /// When it happened.
    pub at: String,
    pub at_unix_nanos: u64,
    /// The point the volume went back to.
    pub to: String,
    pub to_unix_nanos: u64,
    /// The state just before it (`revert --undo` goes back there).
    pub before_unix_nanos: u64,
}

impl RevertInfo {
    pub fn of(revert: &Revert) -> RevertInfo {
        RevertInfo {
            at: time(revert.at),
            at_unix_nanos: revert.at.unix_nanos(),
            to: time(revert.to),
            to_unix_nanos: revert.to.unix_nanos(),
            before_unix_nanos: revert.before.unix_nanos(),
        }
    }
}

/// `POST /v1/volumes/{name}/revert`: put the volume back to a point in time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RevertVolume {
    /// Any time expression or bookmark (see `rewind help times`); absent
    /// with `undo`.
    pub to: Option<String>,
    /// Go back to the state just before the last revert.
    #[serde(default)]
    pub undo: bool,
    /// Cut off clients writing to the volume instead of refusing.
    #[serde(default)]
    pub disconnect: bool,
}

/// What a revert did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RevertSummary {
    pub volume: String,
    pub revert: RevertInfo,
    /// The bookmark naming the state just before the revert.
    pub bookmark: String,
    /// The writers cut off (`disconnect`).
    pub disconnected: Vec<String>,
}

impl RevertSummary {
    pub fn of(volume: &str, report: &RevertReport) -> RevertSummary {
        RevertSummary {
            volume: volume.to_owned(),
            revert: RevertInfo::of(&report.revert),
            bookmark: report.bookmark.to_string(),
            disconnected: report.disconnected.clone(),
        }
    }
}

/// `POST /v1/groups`: a consistency group of volumes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateGroup {
    pub name: String,
    #[serde(default)]
    pub members: Vec<String>,
}

/// `PATCH /v1/groups/{name}`: volumes to add and to remove.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ChangeGroup {
    #[serde(default)]
    pub add: Vec<String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A consistency group: volumes bookmarked and reverted together.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupInfo {
    pub name: String,
    pub members: Vec<String>,
    pub bookmarks: Vec<GroupBookmarkInfo>,
    /// A group revert a crash interrupted, finished when the server starts.
    pub revert_unfinished: bool,
}

impl GroupInfo {
    /// `node` says which members are file trees (their exports differ).
    pub fn of(group: &Group, node: &rewind_engine::Node) -> GroupInfo {
        GroupInfo {
            name: group.name.to_string(),
            members: group.members.iter().map(ToString::to_string).collect(),
            bookmarks: group.bookmarks.iter().map(|bookmark| GroupBookmarkInfo::of(bookmark, node)).collect(),
            revert_unfinished: group.revert.is_some(),
        }
    }
}

/// One instant across a group: each member's bookmark of that name.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupBookmarkInfo {
    pub name: String,
    /// Each member's bookmark (`export` is its view).
    pub members: Vec<MemberBookmark>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberBookmark {
    pub volume: String,
    #[serde(flatten)]
    pub bookmark: BookmarkInfo,
}

impl GroupBookmarkInfo {
    /// `node` says which members are file trees (their exports differ).
    pub fn of(bookmark: &GroupBookmark, node: &rewind_engine::Node) -> GroupBookmarkInfo {
        let member = |point: &MemberPoint| MemberBookmark {
            volume: point.volume.to_string(),
            bookmark: BookmarkInfo::of(
                point.volume.as_str(),
                node.volume(point.volume.as_str()).map_or(VolumeKind::Blocks, |volume| volume.kind()),
                &Bookmark { name: bookmark.name.clone(), timestamp: point.at },
            ),
        };
        GroupBookmarkInfo { name: bookmark.name.to_string(), members: bookmark.members.iter().map(member).collect() }
    }
}

/// What a group revert did, member by member.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupRevertSummary {
    pub group: String,
    pub members: Vec<RevertSummary>,
}

impl Timeline {
    /// Aggregates per-minute activity into buckets of `bucket_seconds` (a
    /// multiple of 60).
    pub fn of(volume: &str, kind: VolumeKind, report: &TimelineReport, bucket_seconds: u64) -> Timeline {
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
            bookmarks: report.bookmarks.iter().map(|bookmark| BookmarkInfo::of(volume, kind, bookmark)).collect(),
            reverts: report.reverts.iter().map(RevertInfo::of).collect(),
        }
    }
}

/// What changed between two points of a volume (`rewind diff`,
/// `GET /v1/volumes/{name}/changes?from=T1[&to=T2]`): the byte ranges that
/// read differently, from the version index (see `rewind_engine`'s
/// changed-block tracking).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Changes {
    pub volume: String,
    pub from: String,
    pub from_unix_nanos: u64,
    /// The later point; the present when the request named none.
    pub to: String,
    pub to_unix_nanos: u64,
    pub to_present: bool,
    pub size_bytes: u64,
    pub changed_bytes: u64,
    pub ranges: Vec<ChangedRange>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangedRange {
    pub offset: u64,
    pub length: u64,
}

impl Changes {
    /// The changes of `volume` from the view `earlier` to `later` (the
    /// present if `None`), read through the engine.
    pub fn between(
        volume: &std::sync::Arc<rewind_engine::Volume>,
        earlier: &rewind_engine::View,
        later: Option<&rewind_engine::View>,
    ) -> Result<Changes, rewind_engine::EngineError> {
        let to = later.map_or_else(|| volume.timestamp_last(), rewind_engine::View::at);
        let ranges: Vec<ChangedRange> = volume
            .changed_ranges(earlier, later)?
            .into_iter()
            .map(|(offset, length)| ChangedRange { offset, length })
            .collect();
        Ok(Changes {
            volume: volume.name().to_string(),
            from: time(earlier.at()),
            from_unix_nanos: earlier.at().unix_nanos(),
            to: time(to),
            to_unix_nanos: to.unix_nanos(),
            to_present: later.is_none(),
            size_bytes: volume.size_bytes(),
            changed_bytes: ranges.iter().map(|range| range.length).sum(),
            ranges,
        })
    }
}

/// One extent of a volume's allocation at a point (`GET
/// /v1/volumes/{name}/allocation`), in order from the offset asked.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AllocationExtent {
    pub length: u64,
    /// Data is stored; otherwise the extent reads as zeros.
    pub allocated: bool,
}

/// The most bytes one `GET /v1/volumes/{name}/data` returns.
pub const DATA_BYTES_MAX: u64 = 32 << 20;

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
    /// Stable, machine-readable kind: not_found, conflict, invalid,
    /// unavailable, corrupt, io, or busy (a limit on concurrent work, such
    /// as imports, is reached: try again later).
    pub kind: String,
}

/// `POST /v1/tokens`: the new token, shown this once (only its hash is kept).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub info: rewind_access::TokenInfo,
    pub token: String,
}

/// `DELETE /v1/access?volume=V&identity=I`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RevokeGrant {
    pub volume: String,
    pub identity: String,
}

/// A piece of slow work the server runs for a client: `GET /v1/jobs`,
/// `GET /v1/jobs/{id}`. Imports are jobs: a few run at once
/// (`rewind serve --imports-max`), more wait their turn.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobInfo {
    pub id: u64,
    /// `import`.
    pub kind: String,
    pub volume: String,
    /// `waiting`, `running`, `done` or `failed`.
    pub state: String,
    /// While waiting: how many jobs of its kind wait ahead of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_behind: Option<u64>,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// When it was asked for.
    pub submitted: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub volumes: usize,
    /// Where the server's NBD exports are, e.g. `127.0.0.1:10809`.
    pub nbd_address: Option<String>,
    /// The server's data directory (absolute).
    #[serde(default)]
    pub data_dir: Option<String>,
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

/// `GET /v1/volumes/{name}/stats` (and part of `GET /v1/stats`): a volume's
/// history, measured when asked.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VolumeReport {
    pub volume: String,
    /// Versions written since creation, kept, and dropped by granularity,
    /// retention, the space cap and history deletes.
    pub versions_written: u64,
    pub versions_kept: u64,
    pub versions_thinned: u64,
    /// r = kept / written (IBM §3.1).
    pub retained_fraction: f64,
    pub versions_archived: u64,
    pub versions_in_journal: u64,
    /// Archived versions that refer to chunks, times the block size: their
    /// size without deduplication or compression.
    pub logical_bytes: u64,
    /// The distinct chunks they refer to (shared ones count for every volume
    /// that refers to them), before and after compression.
    pub unique_chunks: u64,
    pub unique_raw_bytes: u64,
    pub pack_bytes: u64,
    /// logical / unique raw, and unique raw / stored.
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub journal_bytes: u64,
    pub journal_bytes_reclaimable: u64,
    pub current_bytes: u64,
    pub space_max: String,
    pub space_max_bytes: u64,
    pub oldest_kept: Option<String>,
    pub measured_at: String,
    /// Device I/O by store since the server started.
    pub io: StoreIo,
}

/// Device I/O of one store since the server started.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceIo {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Reads and writes that began where the store's previous one ended, and the rest.
    pub sequential: u64,
    pub random: u64,
    pub syncs: u64,
}

impl From<IoStats> for DeviceIo {
    fn from(io: IoStats) -> DeviceIo {
        DeviceIo {
            reads: io.reads,
            read_bytes: io.read_bytes,
            writes: io.writes,
            write_bytes: io.write_bytes,
            sequential: io.sequential,
            random: io.random(),
            syncs: io.syncs,
        }
    }
}

/// Device I/O by store. History is the index (its map) and the chunk store
/// (its data, shared by the node's volumes); versions not yet archived are
/// read from the journal.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreIo {
    pub journal: DeviceIo,
    pub current: DeviceIo,
    pub index: DeviceIo,
    /// Node reports only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<DeviceIo>,
}

impl StoreIo {
    fn of(io: VolumeIoStats) -> StoreIo {
        StoreIo { journal: io.journal.into(), current: io.current.into(), index: io.index.into(), chunks: None }
    }
}

impl VolumeReport {
    pub fn of(volume: &Volume, space: &VolumeSpace) -> Result<VolumeReport, EngineError> {
        let stats: Stats = volume.stats()?.into();
        let block_bytes = volume.block_size().bytes();
        Ok(VolumeReport {
            volume: volume.name().to_string(),
            versions_written: stats.versions_written,
            versions_kept: stats.versions,
            versions_thinned: stats.versions_written - stats.versions,
            retained_fraction: stats.retained_fraction,
            versions_archived: stats.versions_archived,
            versions_in_journal: stats.versions_in_journal,
            logical_bytes: space.logical_bytes(block_bytes),
            unique_chunks: space.chunks,
            unique_raw_bytes: space.chunk_raw_bytes,
            pack_bytes: space.chunk_stored_bytes,
            dedup_ratio: space.dedup_ratio(block_bytes),
            compression_ratio: space.compression_ratio(),
            journal_bytes: stats.journal_bytes,
            journal_bytes_reclaimable: stats.journal_bytes_reclaimable,
            current_bytes: stats.current_bytes,
            space_max: display_space_max(volume.space_max_bytes()),
            space_max_bytes: volume.space_max_bytes(),
            oldest_kept: volume.retention_horizon().map(time),
            measured_at: time(space.measured_at),
            io: StoreIo::of(volume.io_stats()),
        })
    }
}

/// `GET /v1/stats`: the node's chunk store and every volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    /// Chunks history refers to, and those nothing refers to any more that
    /// garbage collection has not freed yet.
    pub chunks_live: u64,
    pub chunks_dead: u64,
    pub references: u64,
    /// What the archived versions would take without deduplication or
    /// compression, what their distinct chunks take raw, and stored.
    pub logical_bytes: u64,
    pub unique_raw_bytes: u64,
    pub unique_stored_bytes: u64,
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub pack_count: u64,
    pub pack_bytes: u64,
    /// Pack bytes garbage collection can give back.
    pub reclaimable_bytes: u64,
    pub chunk_table_bytes: u64,
    pub dedup_index_entries: u64,
    /// Heap memory of reference counts and the dedup index's filters.
    pub chunk_memory_bytes: u64,
    pub journal_bytes: u64,
    pub journal_bytes_reclaimable: u64,
    pub current_bytes: u64,
    pub versions_written: u64,
    pub versions_kept: u64,
    pub retained_fraction: f64,
    /// Since the server started.
    pub chunks_written: u64,
    /// Of them, left where they lay in a journal segment the chunk store
    /// adopted (history kept without a second copy), and their bytes.
    pub chunks_adopted: u64,
    pub adopted_bytes: u64,
    pub dedup_hits: u64,
    pub collections: u64,
    pub chunks_freed: u64,
    /// Chunks copied by defrags to lay views out in block order.
    pub chunks_relocated: u64,
    /// Why archiving and collection stopped, if they did.
    pub chunk_store_poisoned: Option<String>,
    /// Why garbage collection waits (a recount of references, damaged volumes), if it does.
    pub collection_waits: Option<String>,
    /// Chunks history refers to that are damaged or missing, and packs
    /// read through the chunk table because their footer is damaged.
    pub chunks_missing: u64,
    pub packs_footer_damaged: u64,
    /// The data directory's filesystem: size, free, the reserve client
    /// writes leave alone, and `ok`, `low` (under twice the reserve) or
    /// `exhausted` (under the reserve: writes get ENOSPC).
    pub disk_total_bytes: u64,
    pub disk_free_bytes: u64,
    pub disk_reserve_bytes: u64,
    pub disk_state: String,
    /// Volumes that do not open.
    pub volumes_damaged: Vec<VolumeInfo>,
    /// Device I/O by store, all volumes summed, and the chunk store's.
    pub io: StoreIo,
    /// The packs' local tier and bucket, when history goes to one.
    #[serde(default)]
    pub bucket: Option<BucketReport>,
    pub volumes: Vec<VolumeReport>,
}

/// Where packs are when they go to a bucket (`rewind serve --bucket`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BucketReport {
    pub local_packs: u64,
    pub local_bytes: u64,
    pub bucket_packs: u64,
    pub bucket_bytes: u64,
    /// Sealed here and not yet in the bucket: what losing this disk now
    /// would lose of the archived history.
    pub upload_waiting_packs: u64,
    pub upload_waiting_bytes: u64,
    /// How long the oldest of them has waited (0 when none waits).
    pub upload_lag_seconds: f64,
    /// Set when history has waited for the bucket longer than
    /// `--upload-alert-after`: what to look at.
    pub alert: Option<String>,
    /// Since the server started.
    pub uploads: u64,
    pub uploaded_bytes: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Pack reads served by the local disk, by memory, by the bucket; the
    /// share not sent to the bucket.
    pub local_reads: u64,
    pub memory_reads: u64,
    pub bucket_reads: u64,
    pub bucket_read_bytes: u64,
    pub cache_hit_ratio: f64,
    /// Packs deleted here whose bucket copies wait: for a catalog taken
    /// after their deletion, or for other nodes sharing the bucket to let
    /// them go.
    #[serde(default)]
    pub retired_packs: u64,
    /// Packs kept on this disk whatever `--cache-max`: those the present of
    /// a `logging` volume reads.
    #[serde(default)]
    pub kept_packs: u64,
    /// The newest catalog in the bucket: what `rewind node recover` rebuilds
    /// the node from. `None` until one is published.
    pub catalog: Option<CatalogReport>,
}

/// The newest catalog the node published (see `rewind_engine::catalog`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CatalogReport {
    pub generation: u64,
    pub taken: String,
    /// Since the node last found it current (it publishes a new one once
    /// archived history changes, every `--upload-interval`).
    pub age_seconds: f64,
    /// Per volume, the point a recovery from it rebuilds: the RPO is what
    /// was written after it.
    pub volumes: Vec<CatalogVolume>,
    /// Older catalogs the bucket's object lock keeps (`node recover --as-of`).
    pub held_catalogs: usize,
    /// The bucket's object lock (`--lock`), if any.
    pub lock: Option<LockReport>,
    /// The other nodes sharing the bucket (`--node-name`), if any.
    #[serde(default)]
    pub pool: Option<PoolReport>,
}

/// This node among the nodes sharing its bucket (`rewind_engine::pool`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PoolReport {
    pub node_name: String,
    pub node_number: u16,
    pub other_nodes: Vec<PoolPeer>,
    /// When the other nodes' catalogs were last read.
    pub read_at: Option<String>,
    /// Chunks the other nodes' tables lend.
    pub chunks_lendable: u64,
    /// Chunks of this node's history kept in other nodes' packs, their
    /// stored bytes, and how many were found there since the start.
    pub chunks_borrowed: u64,
    pub bytes_borrowed: u64,
    pub borrowed_since_start: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PoolPeer {
    pub name: String,
    pub number: u16,
    /// Its newest catalog, if it has published one.
    pub catalog_generation: Option<u64>,
    pub catalog_taken: Option<String>,
}

/// What the bucket's object lock holds (`rewind_chunks::retention`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LockReport {
    pub period_seconds: u64,
    /// Objects held, and extended while wanted.
    pub held: u64,
    /// Objects deleted while held: they go once their hold runs out.
    pub waiting_to_expire: u64,
    /// Objects written whose hold is not set yet (retried).
    pub pending: u64,
    pub earliest_end: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CatalogVolume {
    pub name: String,
    pub recoverable_to: String,
    pub recoverable_to_unix_nanos: u64,
    /// How far behind the present that point is.
    pub rpo_seconds: f64,
}

impl CatalogReport {
    pub fn of(status: &CatalogStatus, now: Timestamp) -> CatalogReport {
        let since = |at: Timestamp| now.unix_nanos().saturating_sub(at.unix_nanos()) as f64 / 1e9;
        CatalogReport {
            generation: status.generation,
            taken: DisplayTime(status.taken).to_string(),
            age_seconds: since(status.current_at),
            volumes: status
                .volumes
                .iter()
                .map(|(name, at)| CatalogVolume {
                    name: name.clone(),
                    recoverable_to: DisplayTime(*at).to_string(),
                    recoverable_to_unix_nanos: at.unix_nanos(),
                    rpo_seconds: since(*at),
                })
                .collect(),
            held_catalogs: status.held_catalogs,
            lock: status.lock.as_ref().map(|lock| LockReport {
                period_seconds: lock.period_seconds,
                held: lock.held,
                waiting_to_expire: lock.given_up,
                pending: lock.pending,
                earliest_end: lock.earliest_end_unix_seconds.map(|at| {
                    DisplayTime(Timestamp::from_unix_nanos(at.saturating_mul(Timestamp::NANOS_PER_SECOND))).to_string()
                }),
            }),
            pool: status.pool.as_ref().map(|pool| PoolReport {
                node_name: pool.name.clone(),
                node_number: pool.number,
                other_nodes: pool
                    .peers
                    .iter()
                    .map(|peer| PoolPeer {
                        name: peer.name.clone(),
                        number: peer.number,
                        catalog_generation: peer.generation,
                        catalog_taken: peer.generation.map(|_| DisplayTime(peer.taken).to_string()),
                    })
                    .collect(),
                read_at: pool.read_at.map(|at| DisplayTime(at).to_string()),
                chunks_lendable: pool.chunks_lendable,
                chunks_borrowed: pool.chunks_borrowed,
                bytes_borrowed: pool.bytes_borrowed,
                borrowed_since_start: pool.borrowed_since_start,
            }),
        }
    }
}

impl BucketReport {
    pub fn of(
        stats: &TierStats,
        upload_lag_nanos: u64,
        alert: Option<String>,
        catalog: Option<CatalogReport>,
    ) -> BucketReport {
        let hits = stats.local_reads + stats.memory_reads;
        BucketReport {
            local_packs: stats.local_packs,
            local_bytes: stats.local_bytes,
            bucket_packs: stats.remote_packs,
            bucket_bytes: stats.remote_bytes,
            upload_waiting_packs: stats.upload_waiting_packs,
            upload_waiting_bytes: stats.upload_waiting_bytes,
            upload_lag_seconds: upload_lag_nanos as f64 / 1e9,
            alert,
            uploads: stats.uploads,
            uploaded_bytes: stats.uploaded_bytes,
            evictions: stats.evictions,
            evicted_bytes: stats.evicted_bytes,
            local_reads: stats.local_reads,
            memory_reads: stats.memory_reads,
            bucket_reads: stats.remote_reads,
            bucket_read_bytes: stats.remote_read_bytes,
            cache_hit_ratio: ratio(hits, hits + stats.remote_reads),
            retired_packs: stats.retired_packs,
            kept_packs: stats.kept_packs,
            catalog,
        }
    }
}

impl NodeReport {
    /// Measures every volume (see [`Volume::measure_space`]) and the store.
    pub fn measure(node: &rewind_engine::Node, now: Timestamp) -> Result<NodeReport, EngineError> {
        let volumes = node
            .volumes()
            .iter()
            .map(|volume| VolumeReport::of(volume, &volume.measure_space(now)?))
            .collect::<Result<Vec<_>, EngineError>>()?;
        let io_all = node.volumes().iter().fold(VolumeIoStats::default(), |sum, volume| {
            let io = volume.io_stats();
            VolumeIoStats {
                journal: sum.journal + io.journal,
                current: sum.current + io.current,
                index: sum.index + io.index,
            }
        });
        let io = StoreIo { chunks: Some(node.chunk_io_stats().into()), ..StoreIo::of(io_all) };
        let damaged: Vec<VolumeInfo> = node.damaged_volumes().iter().map(VolumeInfo::damaged).collect();
        let collection_waits = match damaged.is_empty() {
            true => node.chunk_stats().recount_pending,
            false => Some(
                EngineError::CollectionWaits { volumes: damaged.iter().map(|info| info.name.clone()).collect() }
                    .to_string(),
            ),
        };
        let report = NodeReport::of(&node.chunk_stats(), io, volumes);
        let lag = node.bucket_upload_lag_nanos(now).unwrap_or(0);
        let catalog = node.catalog_status().map(|status| CatalogReport::of(&status, now));
        let alert = node.bucket_alert(now);
        let bucket = node.bucket_stats().map(|stats| BucketReport::of(&stats, lag, alert, catalog));
        Ok(NodeReport { collection_waits, volumes_damaged: damaged, bucket, ..report.with_space(node.space()) })
    }

    fn with_space(self, space: SpaceReport) -> NodeReport {
        NodeReport {
            disk_total_bytes: space.total_bytes,
            disk_free_bytes: space.free_bytes,
            disk_reserve_bytes: space.reserve_bytes,
            disk_state: space.state.name().to_owned(),
            ..self
        }
    }

    pub fn of(chunks: &ChunkStats, io: StoreIo, volumes: Vec<VolumeReport>) -> NodeReport {
        let sum = |field: fn(&VolumeReport) -> u64| volumes.iter().map(field).sum::<u64>();
        let (written, kept) = (sum(|report| report.versions_written), sum(|report| report.versions_kept));
        NodeReport {
            chunks_live: chunks.chunks_live,
            chunks_dead: chunks.chunks_dead,
            references: chunks.references,
            logical_bytes: chunks.logical_bytes,
            unique_raw_bytes: chunks.unique_raw_bytes,
            unique_stored_bytes: chunks.unique_stored_bytes,
            dedup_ratio: ratio(chunks.logical_bytes, chunks.unique_raw_bytes),
            compression_ratio: ratio(chunks.unique_raw_bytes, chunks.unique_stored_bytes),
            pack_count: chunks.pack_count,
            pack_bytes: chunks.pack_bytes,
            reclaimable_bytes: chunks.reclaimable_bytes,
            chunk_table_bytes: chunks.table_bytes,
            dedup_index_entries: chunks.dedup_entries,
            chunk_memory_bytes: chunks.memory_bytes,
            journal_bytes: sum(|report| report.journal_bytes),
            journal_bytes_reclaimable: sum(|report| report.journal_bytes_reclaimable),
            current_bytes: sum(|report| report.current_bytes),
            versions_written: written,
            versions_kept: kept,
            retained_fraction: ratio(kept, written),
            chunks_written: chunks.chunks_written,
            chunks_adopted: chunks.chunks_adopted,
            adopted_bytes: chunks.adopted_bytes,
            dedup_hits: chunks.dedup_hits,
            collections: chunks.collections,
            chunks_freed: chunks.chunks_freed,
            chunks_relocated: chunks.chunks_relocated,
            chunk_store_poisoned: chunks.poisoned.clone(),
            collection_waits: chunks.recount_pending.clone(),
            chunks_missing: chunks.chunks_missing,
            packs_footer_damaged: chunks.packs_footer_damaged,
            disk_total_bytes: 0,
            disk_free_bytes: 0,
            disk_reserve_bytes: 0,
            disk_state: String::new(),
            volumes_damaged: Vec::new(),
            io,
            bucket: None,
            volumes,
        }
    }
}

/// One line of the `POST /v1/gc` stream (newline-delimited JSON): progress,
/// then the result or an error.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GcEvent {
    Progress { phase: String, done: u64, total: u64 },
    Done(GcReport),
    Failed { error: String },
}

impl GcEvent {
    pub fn progress(phase: CollectPhase, done: u64, total: u64) -> GcEvent {
        let phase = match phase {
            CollectPhase::Sweep => "freeing unreferenced chunks",
            CollectPhase::Repack => "rewriting packs",
        };
        GcEvent::Progress { phase: phase.to_owned(), done, total }
    }
}

/// What a garbage collection did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GcReport {
    pub chunks_freed: u64,
    pub packs_deleted: u64,
    pub packs_rewritten: u64,
    pub packs_written: u64,
    pub chunks_moved: u64,
    pub bytes_reclaimed: u64,
}

impl From<CollectReport> for GcReport {
    fn from(report: CollectReport) -> Self {
        GcReport {
            chunks_freed: report.chunks_freed,
            packs_deleted: report.packs_deleted,
            packs_rewritten: report.packs_rewritten,
            packs_written: report.packs_written,
            chunks_moved: report.chunks_moved,
            bytes_reclaimed: report.bytes_reclaimed,
        }
    }
}

/// What `POST /v1/volumes/{name}/repair` found and did (or would do).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepairSummary {
    pub volume: String,
    pub steps: Vec<RepairStepInfo>,
    /// The volume opens and is served now.
    pub repaired: bool,
    /// Why it cannot be repaired, if it cannot: it can only be deleted.
    pub unrepairable: Option<String>,
    /// Whether this was a plan only (nothing was changed).
    pub planned_only: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepairStepInfo {
    pub problem: String,
    pub action: String,
    pub loss: Option<String>,
}

impl RepairSummary {
    pub fn of(report: &RepairReport, planned_only: bool) -> RepairSummary {
        RepairSummary {
            volume: report.volume.clone(),
            steps: report
                .steps
                .iter()
                .map(|step| RepairStepInfo {
                    problem: step.problem.clone(),
                    action: step.action.clone(),
                    loss: step.loss.clone(),
                })
                .collect(),
            repaired: report.repaired,
            unrepairable: report.unrepairable.clone(),
            planned_only,
        }
    }
}

/// `GET /v1/trees/{name}/history?path=PATH[&at=TIME][&limit=N]`: the
/// versions of one file of a tree, newest first. `at` finds `path` in the
/// tree as it was then (a file since removed); without it, in the present.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TreeHistoryQuery {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `GET /v1/trees/{name}/mirror`: how the proxy that keeps a tree in step
/// with an upstream NFS server is doing (`rewind proxy`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeMirror {
    pub tree: String,
    pub upstream: String,
    /// Updates are answered before they are recorded (UCDP-A).
    pub asynchronous: bool,
    pub forwarded: u64,
    pub recorded: u64,
    /// Updates the upstream applied that went unrecorded as steps of their
    /// own (the tree was brought in step by comparison instead).
    pub unrecorded: u64,
    /// Comparisons of the whole tree with the upstream begun.
    pub resyncs: u64,
    /// False while updates go unrecorded until a comparison succeeds.
    pub in_step: bool,
    /// Asynchronous mirrors: how far behind the upstream the tree is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<TreeMirrorLag>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeMirrorLag {
    pub pending_updates: u64,
    pub pending_bytes: u64,
    /// Clients waiting for room in the queue (the bound at work).
    pub waiting_clients: u64,
    /// Age of the oldest update not yet recorded.
    pub behind_nanos: u64,
    /// Of the times from an update's answer to its record:
    pub recorded: u64,
    pub mean_nanos: u64,
    /// The upper end of the power-of-two bucket holding the 99th percentile.
    pub p99_nanos: u64,
    pub max_nanos: u64,
}

impl TreeMirror {
    pub fn of(trees: &Trees, name: String, now: Timestamp) -> Result<TreeMirror, EngineError> {
        let tree = trees.by_name(&name, now).map_err(|error| tree_error(&name, error))?;
        let mirror = tree.mirror().ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "{name} is not a mirror: `rewind proxy --upstream HOST:PORT --tree {name}` makes it one"
            ))
        })?;
        let status = mirror.status();
        let nanos = |duration: std::time::Duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Ok(TreeMirror {
            tree: name,
            upstream: status.upstream,
            asynchronous: status.asynchronous,
            forwarded: status.forwarded,
            recorded: status.recorded,
            unrecorded: status.unrecorded,
            resyncs: status.resyncs,
            in_step: status.in_step,
            lag: status.lag.map(|lag| TreeMirrorLag {
                pending_updates: lag.pending_updates as u64,
                pending_bytes: lag.pending_bytes as u64,
                waiting_clients: lag.waiting_clients as u64,
                behind_nanos: nanos(lag.behind),
                recorded: lag.recorded,
                mean_nanos: nanos(lag.mean),
                p99_nanos: nanos(lag.p99),
                max_nanos: nanos(lag.max),
            }),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeHistory {
    pub tree: String,
    pub path: String,
    /// Newest first.
    pub versions: Vec<FileVersionInfo>,
}

impl TreeHistory {
    /// Finds `query.path` (now, or at `query.at`) in tree `name` and lists its versions.
    pub fn of(
        trees: &Trees,
        name: String,
        query: TreeHistoryQuery,
        now: Timestamp,
    ) -> Result<TreeHistory, EngineError> {
        let tree = trees.by_name(&name, now).map_err(|error| tree_error(&name, error))?;
        let found = match &query.at {
            Some(at) => {
                let at = tree.resolve(at, now, &TimeZone::system()).map_err(|error| tree_error(&name, error))?;
                rewind_tree::walk(&*tree.view(at, now).map_err(|error| tree_error(&name, error))?, &query.path)
            }
            None => rewind_tree::walk(&tree.tree, &query.path),
        };
        let found = found.map_err(|error| match error {
            TreeError::NotFound => EngineError::InvalidArgument(format!(
                "{name} has no {} {}: give a path from the tree's root (with --at TIME for a file since removed)",
                query.path,
                if query.at.is_some() { "then" } else { "now" }
            )),
            error => tree_error(&name, error),
        })?;
        let limit = query.limit.unwrap_or(10_000);
        let versions = tree.tree.history(found.handle, limit).map_err(|error| tree_error(&name, error))?;
        Ok(TreeHistory { tree: name, path: query.path, versions: versions.iter().map(FileVersionInfo::of).collect() })
    }
}

/// A tree's error as the engine's: its own as they are, the rest as bad input.
fn tree_error(name: &str, error: TreeError) -> EngineError {
    match error {
        TreeError::Engine(error) => error,
        TreeError::NotFound => EngineError::VolumeNotFound(name.to_owned()),
        error => EngineError::InvalidArgument(format!("tree {name}: {error}")),
    }
}

/// A file as one change left it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileVersionInfo {
    /// The point in time that shows this version (`TREE/.rewind/AT`).
    pub at: String,
    pub at_unix_nanos: u64,
    /// `file`, `directory`, `symlink`, `char-device`, `block-device`, `socket`, `fifo`.
    pub kind: String,
    pub size_bytes: u64,
    /// Permission bits, in octal.
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub modified: String,
    /// Who made the change: the client's address and port, and the user it said it was.
    pub client: String,
    pub client_uid: u32,
}

impl FileVersionInfo {
    pub fn of(version: &rewind_tree::FileVersion) -> FileVersionInfo {
        let attributes = &version.attributes;
        let address = std::net::Ipv6Addr::from(attributes.author.address);
        let address = match address.to_ipv4_mapped() {
            Some(v4) => std::net::SocketAddr::from((v4, attributes.author.port)),
            None => std::net::SocketAddr::from((address, attributes.author.port)),
        };
        FileVersionInfo {
            at: time(version.at),
            at_unix_nanos: version.at.unix_nanos(),
            kind: kind_of(attributes.kind).to_owned(),
            size_bytes: attributes.size,
            mode: format!("{:04o}", attributes.mode),
            uid: attributes.uid,
            gid: attributes.gid,
            modified: time(attributes.mtime),
            client: address.to_string(),
            client_uid: attributes.author.uid,
        }
    }
}

/// `GET /v1/trees/{name}/listing?path=PATH[&at=TIME]`: everything under
/// `path` (a directory, or one file) in the tree as it was at `at` (the
/// present if left out), resolved to one exact point, for a restore.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TreeListingQuery {
    #[serde(default)]
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeListing {
    pub tree: String,
    pub path: String,
    pub at: String,
    pub at_unix_nanos: u64,
    /// Parents before their children; the first is `path` itself (path "").
    pub entries: Vec<TreeEntry>,
    /// The regular files' bytes, all told (hard links counted once).
    pub file_bytes: u64,
}

/// One file, directory, link or special file of a listing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeEntry {
    /// Relative to the listing's path, `/`-separated ("" for that path).
    pub path: String,
    /// As in [`FileVersionInfo::kind`].
    pub kind: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    pub nlink: u32,
    pub atime_unix_nanos: u64,
    pub mtime_unix_nanos: u64,
    /// Symlinks: the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Devices: major and minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<(u32, u32)>,
    /// The inode and its generation: what `files/{ino}` reads, and what hard links share.
    pub ino: u64,
    pub generation: u32,
}

fn kind_of(kind: rewind_tree::FileKind) -> &'static str {
    match kind {
        rewind_tree::FileKind::Regular => "file",
        rewind_tree::FileKind::Directory => "directory",
        rewind_tree::FileKind::Symlink => "symlink",
        rewind_tree::FileKind::CharDevice => "char-device",
        rewind_tree::FileKind::BlockDevice => "block-device",
        rewind_tree::FileKind::Socket => "socket",
        rewind_tree::FileKind::Fifo => "fifo",
    }
}

/// Names a listing can carry (JSON strings): UTF-8.
fn utf8_name(name: &[u8], within: &str) -> Result<String, EngineError> {
    String::from_utf8(name.to_vec()).map_err(|_| {
        EngineError::InvalidArgument(format!(
            "{within} holds a name that is not UTF-8 ({}); copy it out over NFS instead",
            String::from_utf8_lossy(name)
        ))
    })
}

/// Entries a listing reads from a directory at a time.
const LISTING_PAGE_ENTRIES: usize = 1024;

impl TreeListing {
    pub fn of(
        trees: &Trees,
        name: String,
        query: TreeListingQuery,
        now: Timestamp,
    ) -> Result<TreeListing, EngineError> {
        use rewind_tree::Namespace;
        let tree = trees.by_name(&name, now).map_err(|error| tree_error(&name, error))?;
        let at = match &query.at {
            Some(at) => tree.resolve(at, now, &TimeZone::system()),
            None => Ok(tree.tree.changed_at()),
        }
        .map_err(|error| tree_error(&name, error))?;
        // The tree's own time of its present may be after `now` (a write
        // since `now` was read, a clock stepped back): not a time from outside.
        let view = tree.view(at, now.max(at)).map_err(|error| tree_error(&name, error))?;
        let start = rewind_tree::walk(&*view, &query.path).map_err(|error| match error {
            TreeError::NotFound => {
                EngineError::InvalidArgument(format!("{name} had no {} at {}", query.path, time(at)))
            }
            error => tree_error(&name, error),
        })?;
        let root = rewind_tree::Caller::root([0; 16], 0);
        let entry = |path: String, attributes: &rewind_tree::Attributes| -> Result<TreeEntry, EngineError> {
            let target = match attributes.kind {
                rewind_tree::FileKind::Symlink => {
                    let target = view.readlink(attributes.handle).map_err(|error| tree_error(&name, error))?;
                    Some(utf8_name(&target, &path)?)
                }
                _ => None,
            };
            let device =
                matches!(attributes.kind, rewind_tree::FileKind::CharDevice | rewind_tree::FileKind::BlockDevice);
            Ok(TreeEntry {
                path,
                kind: kind_of(attributes.kind).to_owned(),
                mode: attributes.mode,
                uid: attributes.uid,
                gid: attributes.gid,
                size_bytes: attributes.size,
                nlink: attributes.nlink,
                atime_unix_nanos: attributes.atime.unix_nanos(),
                mtime_unix_nanos: attributes.mtime.unix_nanos(),
                target,
                rdev: device.then_some(attributes.rdev),
                ino: attributes.handle.ino,
                generation: attributes.handle.generation,
            })
        };
        let mut entries = vec![entry(String::new(), &start)?];
        let mut stack = vec![(String::new(), start.clone())];
        while let Some((path, dir)) = stack.pop() {
            if dir.kind != rewind_tree::FileKind::Directory {
                continue;
            }
            let mut cookie = 0;
            loop {
                let page = view
                    .readdir(dir.handle, cookie, LISTING_PAGE_ENTRIES, &root)
                    .map_err(|error| tree_error(&name, error))?;
                for found in &page.entries {
                    cookie = found.cookie;
                    if found.name == b"." || found.name == b".." {
                        continue;
                    }
                    let child_name = utf8_name(&found.name, &path)?;
                    let child = if path.is_empty() { child_name } else { format!("{path}/{child_name}") };
                    entries.push(entry(child.clone(), &found.attributes)?);
                    stack.push((child, found.attributes.clone()));
                }
                if page.eof {
                    break;
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        let file_bytes = entries
            .iter()
            .filter(|entry| entry.kind == "file" && seen.insert(entry.ino))
            .map(|entry| entry.size_bytes)
            .sum();
        Ok(TreeListing {
            tree: name,
            path: query.path,
            at: time(at),
            at_unix_nanos: at.unix_nanos(),
            entries,
            file_bytes,
        })
    }
}

/// `GET /v1/trees/{name}/files/{ino}?generation=G&at=NANOS&offset=O&length=L`:
/// bytes of one file of a tree at an exact point a listing resolved.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TreeFileQuery {
    pub generation: u32,
    pub at: u64,
    pub offset: u64,
    pub length: u64,
}

/// The bytes [`TreeFileQuery`] asks for (fewer at the end of the file).
pub fn tree_file_bytes(
    trees: &Trees,
    name: &str,
    ino: u64,
    query: &TreeFileQuery,
    now: Timestamp,
) -> Result<Vec<u8>, EngineError> {
    use rewind_tree::Namespace;
    if query.length > DATA_BYTES_MAX {
        return Err(EngineError::InvalidArgument(format!(
            "at most {DATA_BYTES_MAX} bytes at a time, not {}",
            query.length
        )));
    }
    let tree = trees.by_name(name, now).map_err(|error| tree_error(name, error))?;
    let view = tree.view(Timestamp::from_unix_nanos(query.at), now).map_err(|error| tree_error(name, error))?;
    let handle = rewind_tree::Handle { ino, generation: query.generation };
    let root = rewind_tree::Caller::root([0; 16], 0);
    let mut bytes = Vec::with_capacity(query.length as usize);
    while (bytes.len() as u64) < query.length {
        let want = (query.length - bytes.len() as u64).min(1 << 20) as u32;
        let (chunk, eof) = view
            .read(handle, query.offset + bytes.len() as u64, want, &root)
            .map_err(|error| tree_error(name, error))?;
        bytes.extend_from_slice(&chunk);
        if eof || chunk.is_empty() {
            break;
        }
    }
    Ok(bytes)
}

/// `POST /v1/trees/{name}/revert`: put one path (a file, a directory with
/// everything in it, or "" for the whole tree) back as it was at `to`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RevertTreePath {
    pub path: String,
    pub to: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeRevertSummary {
    pub tree: String,
    pub path: String,
    /// The point the path went back to.
    pub to: String,
    pub to_unix_nanos: u64,
    /// The tree just before: reverting the path to it (or to the bookmark) undoes this.
    pub before: String,
    pub before_unix_nanos: u64,
    pub bookmark: String,
    /// Files, directories and links removed from the present, and what was copied back.
    pub removed: u64,
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
}

impl TreeRevertSummary {
    pub fn of(
        trees: &Trees,
        name: String,
        request: RevertTreePath,
        now: Timestamp,
    ) -> Result<TreeRevertSummary, EngineError> {
        let tree = trees.by_name(&name, now).map_err(|error| tree_error(&name, error))?;
        if let Some(mirror) = tree.mirror() {
            let upstream = mirror.status().upstream;
            return Err(EngineError::InvalidArgument(format!(
                "{name} mirrors {upstream} through `rewind proxy`: its present is the upstream's, so it is not \
                 reverted here; copy the past back through the proxy (`rewind tree restore {name}@TIME/PATH --to \
                 DIR`, then into the export)"
            )));
        }
        let to = tree.resolve(&request.to, now, &TimeZone::system()).map_err(|error| tree_error(&name, error))?;
        let past = tree.view(to, now).map_err(|error| tree_error(&name, error))?;
        let caller = rewind_tree::Caller::root([0; 16], 0);
        let report =
            tree.tree.revert_path(&request.path, &past, &caller, now).map_err(|error| tree_error(&name, error))?;
        Ok(TreeRevertSummary {
            tree: name,
            path: request.path,
            to: time(to),
            to_unix_nanos: to.unix_nanos(),
            before: time(report.before),
            before_unix_nanos: report.before.unix_nanos(),
            bookmark: report.bookmark,
            removed: report.removed,
            files: report.files,
            directories: report.directories,
            bytes: report.bytes,
        })
    }
}
