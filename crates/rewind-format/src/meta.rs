//! Small metadata files (`docs/format/metadata.md`): each holds its
//! contents twice — two identical copies of one envelope (magic, format
//! version, payload length, CRC-32C of all of it, payload) — written whole
//! and atomically. One damaged copy costs nothing: the other is read, and
//! the file can be rewritten from it ([`healed`]); only both copies damaged
//! makes the file unreadable (ZFS keeps its metadata twice for the same
//! reason). The timeline is the exception: an append-only file of
//! self-checking frames, derived statistics that are not worth two copies.

use rewind_types::{BlockSize, BookmarkName, Lsn, Timestamp, VolumeName};

use crate::{crc32c, crc32c_append, verify_crc, FormatError, Reader, Writer};

pub const FORMAT_VERSION: u32 = 1;
/// Bytes of one copy's envelope header: magic, version, length, checksum.
const ENVELOPE_BYTES: usize = 16;

pub(crate) fn seal_envelope(magic: [u8; 4], payload: Writer) -> Vec<u8> {
    let payload = payload.into_bytes();
    let mut writer = Writer::new();
    writer
        .u32(u32::from_le_bytes(magic))
        .u32(FORMAT_VERSION)
        .u32(u32::try_from(payload.len()).expect("metadata is small"));
    let mut copy = writer.into_bytes();
    let checksum = crc32c_append(crc32c(&copy), &payload);
    copy.extend_from_slice(&checksum.to_le_bytes());
    copy.extend_from_slice(&payload);
    let mut bytes = copy.clone();
    bytes.extend_from_slice(&copy);
    bytes
}

/// The two copies of a metadata file: its two halves.
fn copies<'a>(what: &'static str, bytes: &'a [u8]) -> Result<[&'a [u8]; 2], FormatError> {
    if bytes.len() < 2 * ENVELOPE_BYTES {
        return Err(FormatError::Truncated { what, available: bytes.len(), needed: 2 * ENVELOPE_BYTES });
    }
    if !bytes.len().is_multiple_of(2) {
        return Err(FormatError::Damaged {
            what,
            reason: format!("{} bytes cannot be two equal copies: cut short or extended", bytes.len()),
        });
    }
    let (first, second) = bytes.split_at(bytes.len() / 2);
    Ok([first, second])
}

/// Verifies one copy and returns its payload. The checksum covers the
/// header too, and is checked first: a flipped length field reads as
/// damage, not as a short file.
fn open_copy<'a>(what: &'static str, magic: [u8; 4], copy: &'a [u8]) -> Result<&'a [u8], FormatError> {
    let (header, payload) = copy.split_at(ENVELOPE_BYTES);
    let stored = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
    verify_crc(what, stored, crc32c_append(crc32c(&header[..12]), payload))?;
    let mut reader = Reader::new(what, header);
    let found = reader.u32()?;
    if found != u32::from_le_bytes(magic) {
        return Err(FormatError::BadMagic { what, found });
    }
    let version = reader.u32()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion { what, found: version, supported: FORMAT_VERSION });
    }
    let length = reader.u32()? as usize;
    if length != payload.len() {
        return Err(reader.invalid(format!("payload of {} bytes where the header says {length}", payload.len())));
    }
    Ok(payload)
}

pub(crate) fn open_envelope<'a>(
    what: &'static str,
    magic: [u8; 4],
    bytes: &'a [u8],
) -> Result<Reader<'a>, FormatError> {
    let [first, second] = copies(what, bytes)?;
    match open_copy(what, magic, first) {
        Ok(payload) => Ok(Reader::new(what, payload)),
        Err(first_error) => match open_copy(what, magic, second) {
            Ok(payload) => Ok(Reader::new(what, payload)),
            Err(second_error) if first_error == second_error => Err(first_error),
            Err(second_error) => Err(FormatError::Damaged {
                what,
                reason: format!("both copies are unreadable (first: {first_error}; second: {second_error})"),
            }),
        },
    }
}

/// If exactly one copy of a metadata file is damaged and the other is
/// intact, the bytes to rewrite it with (the intact copy, twice) and what
/// was wrong; `None` when both copies are intact (or neither is).
pub fn healed(bytes: &[u8]) -> Option<(Vec<u8>, String)> {
    let intact = |copy: &[u8]| -> Result<(), FormatError> {
        let magic = copy[..4].try_into().expect("4 bytes");
        open_copy("metadata copy", magic, copy).map(|_| ())
    };
    let [first, second] = copies("metadata file", bytes).ok()?;
    let (good, bad, damage) = match (intact(first), intact(second)) {
        (Ok(()), Err(error)) => (first, "second", error),
        (Err(error), Ok(())) => (second, "first", error),
        _ => return None,
    };
    Some(([good, good].concat(), format!("its {bad} copy was damaged ({damage}) and is rewritten from the other")))
}

/// Whether `bytes` is a well-formed envelope of `magic` (for tests
/// building files field by field).
#[cfg(test)]
pub(crate) fn open_envelope_for_tests(bytes: &[u8], magic: [u8; 4]) -> bool {
    open_envelope("test", magic, bytes).is_ok()
}

pub(crate) fn finish(reader: Reader<'_>) -> Result<(), FormatError> {
    if reader.remaining() == 0 {
        Ok(())
    } else {
        Err(reader.invalid(format!("{} unexpected trailing bytes", reader.remaining())))
    }
}

pub use rewind_types::Layout;

/// `volume.meta`: what a volume is. Written once at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMeta {
    pub name: VolumeName,
    pub size_bytes: u64,
    pub block_size: BlockSize,
    /// When protection began: no view exists before this time.
    pub created: Timestamp,
    pub layout: Layout,
    /// Checkpointing: the controller cache's size in bytes (3% of its pages
    /// may be dirty); 0 for the other layouts.
    pub cache_bytes: u64,
    /// A clone's base: what it reads where it has not been written.
    pub base: Option<VolumeBase>,
    /// What the volume holds.
    pub kind: VolumeKind,
}

/// What a volume holds: a disk's blocks, served over NBD, or a file tree
/// (`tree.md`), served over NFS and never as blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeKind {
    #[default]
    Blocks,
    Tree,
}

/// The point a clone starts from: another volume as it was at one time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeBase {
    pub volume: VolumeName,
    /// An exact point of the base, pinned there while the clone reads it.
    pub at: Timestamp,
    /// The clone was promoted: it reads its own copy of the base point
    /// (`base.img`, `base.meta`) and no longer needs the base volume, which
    /// may be gone.
    pub copied: bool,
}

impl VolumeMeta {
    const MAGIC: [u8; 4] = *b"RWVM";
    const WHAT: &'static str = "volume metadata";
    /// Follows the base of a promoted clone.
    const BASE_COPIED: u8 = 1;
    /// Set in the layout byte of a file tree's volume.
    const LAYOUT_TREE: u8 = 0x80;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload
            .str(self.name.as_str())
            .u64(self.size_bytes)
            .u32(self.block_size.bytes())
            .u64(self.created.unix_nanos())
            .u8(match self.kind {
                VolumeKind::Blocks => self.layout as u8,
                VolumeKind::Tree => self.layout as u8 | Self::LAYOUT_TREE,
            })
            .u64(self.cache_bytes);
        if let Some(base) = &self.base {
            payload.str(base.volume.as_str()).u64(base.at.unix_nanos());
            // Absent (not 0) when not copied: metadata of clones made before
            // promotion existed reads the same.
            if base.copied {
                payload.u8(Self::BASE_COPIED);
            }
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let name = VolumeName::new(reader.str()?).map_err(|error| reader.invalid(error.to_string()))?;
        let size_bytes = reader.u64()?;
        let block_size = BlockSize::new(reader.u32()?).map_err(|error| reader.invalid(error.to_string()))?;
        let created = Timestamp::from_unix_nanos(reader.u64()?);
        let code = reader.u8()?;
        let kind = match code & Self::LAYOUT_TREE {
            0 => VolumeKind::Blocks,
            _ => VolumeKind::Tree,
        };
        let code = code & !Self::LAYOUT_TREE;
        let layout = Layout::from_code(code).ok_or_else(|| reader.invalid(format!("unknown layout {code}")))?;
        // Absent in metadata written before Checkpointing existed.
        let cache_bytes = if reader.remaining() > 0 { reader.u64()? } else { 0 };
        // Absent in metadata of volumes that are not clones.
        let base = match reader.remaining() {
            0 => None,
            _ => {
                let volume = VolumeName::new(reader.str()?).map_err(|error| reader.invalid(error.to_string()))?;
                let at = Timestamp::from_unix_nanos(reader.u64()?);
                if volume == name {
                    return Err(reader.invalid("a volume cannot be its own base"));
                }
                if at > created {
                    return Err(reader.invalid("a clone's base point is after the clone was created"));
                }
                let copied = match reader.remaining() {
                    0 => false,
                    _ => match reader.u8()? {
                        Self::BASE_COPIED => true,
                        other => return Err(reader.invalid(format!("unknown base marker {other}"))),
                    },
                };
                Some(VolumeBase { volume, at, copied })
            }
        };
        if size_bytes % u64::from(block_size.bytes()) != 0 {
            return Err(reader.invalid("size is not a whole number of blocks"));
        }
        finish(reader)?;
        Ok(VolumeMeta { name, size_bytes, block_size, created, layout, cache_bytes, base, kind })
    }

    /// The volume this one reads where it has not written, while it does
    /// (a promoted clone has its own copy and needs none).
    pub fn lent_base(&self) -> Option<&VolumeBase> {
        self.base.as_ref().filter(|base| !base.copied)
    }
}

/// A position in a volume's journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct JournalPosition {
    pub segment: u32,
    pub offset: u64,
}

/// `checkpoint`: how much of the journal is durably reflected in everything
/// derived from it, so recovery replays only what comes after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Every record up to and including this LSN is durably in the current
    /// store (or superseded there by a durable record after it, which
    /// recovery re-applies), the version index runs and the timeline.
    pub lsn: Lsn,
    /// Where the record after `lsn` starts (or will start).
    pub replay_from: JournalPosition,
    /// Time of record `lsn` (the volume's creation time if none), so that
    /// version times keep increasing across restarts.
    pub timestamp_last: Timestamp,
}

impl Checkpoint {
    const MAGIC: [u8; 4] = *b"RWCK";
    const WHAT: &'static str = "checkpoint";

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload
            .u64(self.lsn.0)
            .u32(self.replay_from.segment)
            .u64(self.replay_from.offset)
            .u64(self.timestamp_last.unix_nanos());
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let checkpoint = Checkpoint {
            lsn: Lsn(reader.u64()?),
            replay_from: JournalPosition { segment: reader.u32()?, offset: reader.u64()? },
            timestamp_last: Timestamp::from_unix_nanos(reader.u64()?),
        };
        finish(reader)?;
        Ok(checkpoint)
    }
}

/// One immutable run of the version index, as listed in the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunInfo {
    pub id: u64,
    pub entry_count: u64,
    pub timestamp_min: Timestamp,
    pub timestamp_max: Timestamp,
}

/// `index/manifest`: the runs that make up the durable part of a version index.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IndexManifest {
    /// Every journal record up to and including this LSN is in the runs.
    pub lsn_indexed: Lsn,
    pub run_id_next: u64,
    /// Versions dropped by thinning (granularity) since the volume was created.
    pub versions_thinned: u64,
    /// Every version older than this is archived: its data is in the chunk
    /// store (or it is a zero), not in the journal. Each run lies wholly
    /// before it (an archived run) or wholly at or after it (a recent run).
    pub archived_before: Timestamp,
    /// Oldest first; the time ranges of runs do not overlap, unless
    /// `late_entries`.
    pub runs: Vec<RunInfo>,
    /// The index takes versions late (the COW layout files them when they
    /// are copied): runs overlap in time, and none refers to the journal.
    pub late_entries: bool,
}

impl IndexManifest {
    const MAGIC: [u8; 4] = *b"RWIM";
    const WHAT: &'static str = "index manifest";
    const RUNS_MAX: usize = 1 << 16;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload
            .u64(self.lsn_indexed.0)
            .u64(self.run_id_next)
            .u64(self.versions_thinned)
            .u64(self.archived_before.unix_nanos())
            .u32(self.runs.len() as u32);
        for run in &self.runs {
            payload
                .u64(run.id)
                .u64(run.entry_count)
                .u64(run.timestamp_min.unix_nanos())
                .u64(run.timestamp_max.unix_nanos());
        }
        payload.u8(u8::from(self.late_entries));
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let lsn_indexed = Lsn(reader.u64()?);
        let run_id_next = reader.u64()?;
        let versions_thinned = reader.u64()?;
        let archived_before = Timestamp::from_unix_nanos(reader.u64()?);
        let count = reader.u32()? as usize;
        if count > Self::RUNS_MAX {
            return Err(reader.invalid(format!("{count} runs")));
        }
        let mut runs = Vec::with_capacity(reader.capacity_for(count, 32));
        for _ in 0..count {
            runs.push(RunInfo {
                id: reader.u64()?,
                entry_count: reader.u64()?,
                timestamp_min: Timestamp::from_unix_nanos(reader.u64()?),
                timestamp_max: Timestamp::from_unix_nanos(reader.u64()?),
            });
        }
        // Absent in manifests written before COW existed.
        let late_entries = match reader.remaining() {
            0 => false,
            _ => match reader.u8()? {
                0 => false,
                1 => true,
                other => return Err(reader.invalid(format!("late entries flag {other}"))),
            },
        };
        finish(reader)?;
        let ordered = late_entries || runs.windows(2).all(|pair| pair[0].timestamp_max < pair[1].timestamp_min);
        if !ordered || runs.iter().any(|run| run.id >= run_id_next || run.timestamp_min > run.timestamp_max) {
            return Err(FormatError::Invalid { what: Self::WHAT, reason: "runs are not in time order".into() });
        }
        let straddles = |run: &RunInfo| {
            !late_entries && run.timestamp_min < archived_before && run.timestamp_max >= archived_before
        };
        if let Some(run) = runs.iter().find(|run| straddles(run)) {
            return Err(FormatError::Invalid {
                what: Self::WHAT,
                reason: format!("run {} straddles the archive boundary {}", run.id, archived_before.unix_nanos()),
            });
        }
        Ok(IndexManifest { lsn_indexed, run_id_next, versions_thinned, archived_before, runs, late_entries })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bookmark {
    pub name: BookmarkName,
    /// The point in time the bookmark names.
    pub timestamp: Timestamp,
}

/// `bookmarks`: a volume's named points in time.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Bookmarks {
    pub entries: Vec<Bookmark>,
    /// Bookmarked times whose history the server has laid out in block
    /// order (`rewind_engine`'s `lay_out_bookmarks`), ascending: a trailing
    /// section that files written before it lack.
    pub laid_out: Vec<Timestamp>,
}

impl Bookmarks {
    const MAGIC: [u8; 4] = *b"RWBM";
    const WHAT: &'static str = "bookmarks";
    pub const COUNT_MAX: usize = 1 << 16;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u32(self.entries.len() as u32);
        for bookmark in &self.entries {
            payload.str(bookmark.name.as_str()).u64(bookmark.timestamp.unix_nanos());
        }
        payload.u32(self.laid_out.len() as u32);
        for at in &self.laid_out {
            payload.u64(at.unix_nanos());
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let count = reader.u32()? as usize;
        if count > Self::COUNT_MAX {
            return Err(reader.invalid(format!("{count} bookmarks")));
        }
        // Each bookmark takes at least a name length and a time.
        let mut entries = Vec::with_capacity(reader.capacity_for(count, 2 + 8));
        for _ in 0..count {
            let name = BookmarkName::new(reader.str()?).map_err(|error| reader.invalid(error.to_string()))?;
            entries.push(Bookmark { name, timestamp: Timestamp::from_unix_nanos(reader.u64()?) });
        }
        let mut laid_out = Vec::new();
        if reader.remaining() > 0 {
            let count = reader.u32()? as usize;
            if count > Self::COUNT_MAX {
                return Err(reader.invalid(format!("{count} bookmarks laid out")));
            }
            laid_out.reserve(reader.capacity_for(count, 8));
            for _ in 0..count {
                let at = Timestamp::from_unix_nanos(reader.u64()?);
                if laid_out.last().is_some_and(|&last| last >= at) {
                    return Err(reader.invalid("bookmarks laid out not in ascending order"));
                }
                laid_out.push(at);
            }
        }
        finish(reader)?;
        Ok(Bookmarks { entries, laid_out })
    }
}

/// One revert in place: from `at` on, the volume reads as it did at `to`
/// where it has not been written since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revert {
    /// When the revert happened: after every write before it, before every
    /// write after it.
    pub at: Timestamp,
    /// The exact point the volume was reverted to (before `at`).
    pub to: Timestamp,
    /// The state just before the revert (`at` less 1 ns), kept exactly so
    /// that the revert can be undone.
    pub before: Timestamp,
}

/// `reverts`: a volume's reverts in place, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Reverts {
    pub entries: Vec<Revert>,
}

impl Reverts {
    const MAGIC: [u8; 4] = *b"RWRV";
    const WHAT: &'static str = "reverts";
    pub const COUNT_MAX: usize = 1 << 16;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u32(self.entries.len() as u32);
        for revert in &self.entries {
            payload.u64(revert.at.unix_nanos()).u64(revert.to.unix_nanos()).u64(revert.before.unix_nanos());
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let count = reader.u32()? as usize;
        if count > Self::COUNT_MAX {
            return Err(reader.invalid(format!("{count} reverts")));
        }
        let mut entries: Vec<Revert> = Vec::with_capacity(reader.capacity_for(count, 3 * 8));
        for _ in 0..count {
            let at = Timestamp::from_unix_nanos(reader.u64()?);
            let to = Timestamp::from_unix_nanos(reader.u64()?);
            let before = Timestamp::from_unix_nanos(reader.u64()?);
            if !(to <= before && before < at) {
                return Err(reader.invalid("a revert that is not to a point before it"));
            }
            if entries.last().is_some_and(|last| last.at >= at) {
                return Err(reader.invalid("reverts out of order"));
            }
            entries.push(Revert { at, to, before });
        }
        finish(reader)?;
        Ok(Reverts { entries })
    }

    /// The revert whose era `at` falls in (the present if `None`): the last
    /// at or before it.
    pub fn era_of(&self, at: Option<Timestamp>) -> Option<&Revert> {
        match at {
            None => self.entries.last(),
            Some(at) => self.entries[..self.entries.partition_point(|revert| revert.at <= at)].last(),
        }
    }
}

/// `revert-copy`: how far the background copy after a volume's last revert
/// has come (see `docs/format/metadata.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevertCopyProgress {
    /// The time of the revert copied for.
    pub revert_at: Timestamp,
    /// Every block before this one reads from where the copy put it, or
    /// never needed copying.
    pub block_next: u64,
}

impl RevertCopyProgress {
    const MAGIC: [u8; 4] = *b"RWRC";
    const WHAT: &'static str = "revert copy progress";

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u64(self.revert_at.unix_nanos()).u64(self.block_next);
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let progress =
            RevertCopyProgress { revert_at: Timestamp::from_unix_nanos(reader.u64()?), block_next: reader.u64()? };
        finish(reader)?;
        Ok(progress)
    }
}

/// `policy`: how much of a volume's history is kept. Changeable at any time.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct VolumePolicy {
    /// Protection granularity in nanoseconds (IBM §3.1): per block, only the
    /// last write in each window of this length is history. 0 keeps every write.
    pub granularity_nanos: u64,
    /// Retention tiers, youngest first: history younger than a tier's age is
    /// kept at its interval; history older than the last tier's age is gone
    /// but for the state at that age (the base). Empty: kept forever.
    pub retention: Vec<RetentionTier>,
    /// The time retention was last applied as of. Thinning only ever gets
    /// coarser as this advances, and it is made durable before any index run
    /// is thinned with it, so after a crash views never claim more than the
    /// index holds.
    pub retention_clock: Timestamp,
    /// Windows history already has from earlier policies: `(interval,
    /// until)` — every window of `interval` ending at or before `until` was
    /// (or may have been) thinned to its last version. A finer policy cannot
    /// bring those versions back, so they stay part of what the index thins.
    pub floors: Vec<(u64, Timestamp)>,
    /// History before this was dropped by an earlier retention policy.
    pub horizon_floor: Timestamp,
    /// Deleted history (MYCDP §3.3.3): ranges `[from, to]` in which each block
    /// keeps only its last version. Sorted, disjoint.
    pub deleted: Vec<(Timestamp, Timestamp)>,
    /// The most bytes the volume's history may take (0: no cap). Past it,
    /// the oldest history goes first: the horizon floor moves forward.
    pub space_max_bytes: u64,
}

impl VolumePolicy {
    /// The policy of a volume created at `created`: no history kept from
    /// earlier policies, nothing deleted.
    pub fn new(
        granularity_nanos: u64,
        retention: Vec<RetentionTier>,
        space_max_bytes: u64,
        created: Timestamp,
    ) -> VolumePolicy {
        VolumePolicy {
            granularity_nanos,
            retention,
            retention_clock: created,
            floors: Vec::new(),
            horizon_floor: Timestamp::MIN,
            deleted: Vec::new(),
            space_max_bytes,
        }
    }
}

/// One retention tier: keep one version per block per `interval_nanos`
/// (0: every version the granularity keeps) until history is `age_nanos` old.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionTier {
    pub interval_nanos: u64,
    pub age_nanos: u64,
}

impl RetentionTier {
    /// The longest granularity or tier interval: 10 years (of 365.25 days).
    pub const INTERVAL_NANOS_MAX: u64 = 36_525 * 86_400 * 1_000_000_000 / 10;

    /// [`RetentionTier::check`] for a policy being set, which also has no
    /// window longer than [`Self::INTERVAL_NANOS_MAX`]. (Not asked of one
    /// saved before that bound: it still opens.)
    pub fn check_new(tiers: &[RetentionTier], granularity_nanos: u64) -> Result<(), String> {
        let intervals = std::iter::once(granularity_nanos).chain(tiers.iter().map(|tier| tier.interval_nanos));
        if let Some(long) = intervals.into_iter().find(|&interval| interval > Self::INTERVAL_NANOS_MAX) {
            return Err(format!(
                "a granularity or interval of {long}ns is longer than the most, 10 years: windows are counted \
                 from 1970, and one that long would hold today's time in the first"
            ));
        }
        Self::check(tiers, granularity_nanos)
    }

    /// Why `tiers` cannot be a retention policy under `granularity_nanos`,
    /// if they cannot: ages must grow, and each interval must be a multiple
    /// of the granularity and of the interval before it (so windows nest and
    /// history only ever gets coarser as it ages).
    pub fn check(tiers: &[RetentionTier], granularity_nanos: u64) -> Result<(), String> {
        let mut interval_last = granularity_nanos;
        let mut age_last = 0;
        for tier in tiers {
            if tier.age_nanos <= age_last {
                return Err("each tier must keep history longer than the one before it".into());
            }
            if tier.interval_nanos != 0 {
                if interval_last != 0 && !tier.interval_nanos.is_multiple_of(interval_last) {
                    return Err(format!(
                        "each interval must be a multiple of the granularity and of the interval before it \
                         ({}ns is not a multiple of {}ns)",
                        tier.interval_nanos, interval_last
                    ));
                }
                interval_last = tier.interval_nanos;
            } else if interval_last != granularity_nanos {
                return Err("`all` must come before any coarser tier".into());
            }
            age_last = tier.age_nanos;
        }
        Ok(())
    }
}

impl VolumePolicy {
    const MAGIC: [u8; 4] = *b"RWPO";
    const WHAT: &'static str = "volume policy";
    pub const DELETED_MAX: usize = 1 << 16;
    pub const TIERS_MAX: usize = 64;
    pub const FLOORS_MAX: usize = 256;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u64(self.granularity_nanos).u64(self.retention_clock.unix_nanos()).u32(self.retention.len() as u32);
        for tier in &self.retention {
            payload.u64(tier.interval_nanos).u64(tier.age_nanos);
        }
        payload.u64(self.horizon_floor.unix_nanos()).u32(self.floors.len() as u32);
        for (interval, until) in &self.floors {
            payload.u64(*interval).u64(until.unix_nanos());
        }
        payload.u32(self.deleted.len() as u32);
        for (from, to) in &self.deleted {
            payload.u64(from.unix_nanos()).u64(to.unix_nanos());
        }
        payload.u64(self.space_max_bytes);
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let granularity_nanos = reader.u64()?;
        let retention_clock = Timestamp::from_unix_nanos(reader.u64()?);
        let count = reader.u32()? as usize;
        if count > Self::TIERS_MAX {
            return Err(reader.invalid(format!("{count} retention tiers")));
        }
        let mut retention = Vec::with_capacity(reader.capacity_for(count, 16));
        for _ in 0..count {
            retention.push(RetentionTier { interval_nanos: reader.u64()?, age_nanos: reader.u64()? });
        }
        RetentionTier::check(&retention, granularity_nanos).map_err(|reason| reader.invalid(reason))?;
        let horizon_floor = Timestamp::from_unix_nanos(reader.u64()?);
        let count = reader.u32()? as usize;
        if count > Self::FLOORS_MAX {
            return Err(reader.invalid(format!("{count} window floors")));
        }
        let mut floors = Vec::with_capacity(reader.capacity_for(count, 16));
        for _ in 0..count {
            let interval = reader.u64()?;
            if interval == 0 {
                return Err(reader.invalid("a window floor of 0 ns"));
            }
            floors.push((interval, Timestamp::from_unix_nanos(reader.u64()?)));
        }
        let count = reader.u32()? as usize;
        if count > Self::DELETED_MAX {
            return Err(reader.invalid(format!("{count} deleted ranges")));
        }
        let mut deleted = Vec::with_capacity(reader.capacity_for(count, 16));
        for _ in 0..count {
            let from = Timestamp::from_unix_nanos(reader.u64()?);
            let to = Timestamp::from_unix_nanos(reader.u64()?);
            deleted.push((from, to));
        }
        let space_max_bytes = reader.u64()?;
        finish(reader)?;
        let ordered =
            deleted.iter().all(|(from, to)| from < to) && deleted.windows(2).all(|pair| pair[0].1 < pair[1].0);
        if !ordered {
            return Err(FormatError::Invalid {
                what: Self::WHAT,
                reason: "deleted ranges overlap or are out of order".into(),
            });
        }
        Ok(VolumePolicy {
            granularity_nanos,
            retention,
            retention_clock,
            floors,
            horizon_floor,
            deleted,
            space_max_bytes,
        })
    }
}

/// Write activity of a volume during one minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TimelineBucket {
    /// Minutes since the Unix epoch.
    pub minute: u64,
    pub write_count: u64,
    pub write_bytes: u64,
    pub zero_count: u64,
    pub zero_bytes: u64,
}

/// One frame of the append-only `timeline` file: the activity of the journal
/// records up to `lsn_last` not covered by earlier frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineFrame {
    pub lsn_last: Lsn,
    pub buckets: Vec<TimelineBucket>,
}

impl TimelineFrame {
    const MAGIC: u32 = u32::from_le_bytes(*b"RWTL");
    const WHAT: &'static str = "timeline frame";
    const BUCKETS_MAX: u32 = 1 << 20;

    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer.u32(Self::MAGIC).u64(self.lsn_last.0).u32(self.buckets.len() as u32);
        for bucket in &self.buckets {
            writer
                .u64(bucket.minute)
                .u64(bucket.write_count)
                .u64(bucket.write_bytes)
                .u64(bucket.zero_count)
                .u64(bucket.zero_bytes);
        }
        let mut bytes = writer.into_bytes();
        let checksum = crc32c(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes consecutive frames. Returns them with the length of the valid
    /// prefix: a frame that does not check out ends the file (a torn append),
    /// and the caller truncates there.
    pub fn decode_all(bytes: &[u8]) -> (Vec<TimelineFrame>, usize) {
        let mut frames = Vec::new();
        let mut valid = 0;
        while valid < bytes.len() {
            match Self::decode_one(&bytes[valid..]) {
                Ok((frame, length)) => {
                    frames.push(frame);
                    valid += length;
                }
                Err(_) => break,
            }
        }
        (frames, valid)
    }

    fn decode_one(bytes: &[u8]) -> Result<(TimelineFrame, usize), FormatError> {
        let mut reader = Reader::new(Self::WHAT, bytes);
        reader.magic(Self::MAGIC)?;
        let lsn_last = Lsn(reader.u64()?);
        let count = reader.u32()?;
        if count > Self::BUCKETS_MAX {
            return Err(reader.invalid(format!("{count} buckets")));
        }
        let mut buckets = Vec::with_capacity(reader.capacity_for(count as usize, 40));
        for _ in 0..count {
            buckets.push(TimelineBucket {
                minute: reader.u64()?,
                write_count: reader.u64()?,
                write_bytes: reader.u64()?,
                zero_count: reader.u64()?,
                zero_bytes: reader.u64()?,
            });
        }
        let length = reader.position();
        let stored = reader.u32()?;
        verify_crc(Self::WHAT, stored, crc32c(&bytes[..length]))?;
        Ok((TimelineFrame { lsn_last, buckets }, length + 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_rejects_damage() {
        let meta = VolumeMeta {
            name: VolumeName::new("db").unwrap(),
            size_bytes: 1 << 30,
            block_size: BlockSize::DEFAULT,
            created: Timestamp::from_unix_nanos(42),
            layout: Layout::Journaled,
            cache_bytes: 0,
            base: None,
            kind: VolumeKind::Blocks,
        };
        let tree = VolumeMeta { layout: Layout::Logging, kind: VolumeKind::Tree, ..meta.clone() };
        assert_eq!(VolumeMeta::decode(&tree.encode()).unwrap(), tree);
        let reverts = Reverts {
            entries: vec![
                Revert {
                    at: Timestamp::from_unix_nanos(50),
                    to: Timestamp::from_unix_nanos(20),
                    before: Timestamp::from_unix_nanos(49),
                },
                Revert {
                    at: Timestamp::from_unix_nanos(90),
                    to: Timestamp::from_unix_nanos(49),
                    before: Timestamp::from_unix_nanos(89),
                },
            ],
        };
        assert_eq!(Reverts::decode(&reverts.encode()).unwrap(), reverts);
        assert_eq!(reverts.era_of(Some(Timestamp::from_unix_nanos(49))), None);
        assert_eq!(reverts.era_of(Some(Timestamp::from_unix_nanos(50))), Some(&reverts.entries[0]));
        assert_eq!(reverts.era_of(None), Some(&reverts.entries[1]));
        let progress = RevertCopyProgress { revert_at: Timestamp::from_unix_nanos(50), block_next: 77 };
        assert_eq!(RevertCopyProgress::decode(&progress.encode()).unwrap(), progress);
        let mut torn = progress.encode();
        torn.pop();
        assert!(RevertCopyProgress::decode(&torn).is_err());
        let backwards = Reverts { entries: vec![reverts.entries[1], reverts.entries[0]] };
        assert!(Reverts::decode(&backwards.encode()).unwrap_err().to_string().contains("out of order"));
        let clone = VolumeMeta {
            name: VolumeName::new("db-debug").unwrap(),
            base: Some(VolumeBase { volume: meta.name.clone(), at: Timestamp::from_unix_nanos(40), copied: false }),
            ..meta.clone()
        };
        assert_eq!(VolumeMeta::decode(&clone.encode()).unwrap(), clone);
        assert_eq!(clone.lent_base(), clone.base.as_ref());
        let mut promoted = clone.clone();
        promoted.base.as_mut().unwrap().copied = true;
        assert_eq!(VolumeMeta::decode(&promoted.encode()).unwrap(), promoted);
        assert_eq!(promoted.lent_base(), None, "a promoted clone needs no base volume");
        let mut marked = Writer::new();
        marked.str("db-debug").u64(1 << 30).u32(BlockSize::DEFAULT.bytes()).u64(42).u8(Layout::Journaled as u8);
        marked.u64(0).str("db").u64(40).u8(7);
        let error = VolumeMeta::decode(&seal_envelope(VolumeMeta::MAGIC, marked)).unwrap_err().to_string();
        assert!(error.contains("unknown base marker 7"), "{error}");
        let own_base = VolumeMeta {
            base: Some(VolumeBase { volume: clone.name.clone(), at: clone.created, copied: false }),
            ..clone
        };
        let error = VolumeMeta::decode(&own_base.encode()).unwrap_err().to_string();
        assert!(error.contains("its own base"), "{error}");
        let bytes = meta.encode();
        assert_eq!(VolumeMeta::decode(&bytes).unwrap(), meta);
        assert_eq!(healed(&bytes), None, "both copies intact");
        let half = bytes.len() / 2;
        for at in [0, 5, 9, 13, 20, half - 1] {
            for copy in [0, half] {
                // One damaged copy: the other is read, and the file can be healed.
                let mut damaged = bytes.clone();
                damaged[copy + at] ^= 0x40;
                assert_eq!(VolumeMeta::decode(&damaged).unwrap(), meta, "flip at {}", copy + at);
                let (rewritten, why) = healed(&damaged).expect("one copy is damaged");
                assert_eq!(rewritten, bytes);
                assert!(why.contains(if copy == 0 { "first" } else { "second" }) && why.contains("damaged"), "{why}");
            }
            // Both damaged: an error that says so, never "truncated".
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            damaged[half + at] ^= 0x04;
            let error = VolumeMeta::decode(&damaged).unwrap_err().to_string();
            assert!(error.contains("damaged") && !error.contains("truncated"), "{error}");
            assert_eq!(healed(&damaged), None);
        }
        assert!(VolumeMeta::decode(&bytes[..bytes.len() - 1]).unwrap_err().to_string().contains("cut short"));
        assert!(VolumeMeta::decode(&bytes[..20]).unwrap_err().to_string().contains("truncated"));

        let checkpoint = Checkpoint {
            lsn: Lsn(5),
            replay_from: JournalPosition { segment: 1, offset: 4160 },
            timestamp_last: Timestamp::from_unix_nanos(9),
        };
        assert_eq!(Checkpoint::decode(&checkpoint.encode()).unwrap(), checkpoint);

        let run = |id, low, high| RunInfo {
            id,
            entry_count: 10,
            timestamp_min: Timestamp::from_unix_nanos(low),
            timestamp_max: Timestamp::from_unix_nanos(high),
        };
        let manifest = IndexManifest {
            lsn_indexed: Lsn(3),
            run_id_next: 3,
            versions_thinned: 7,
            archived_before: Timestamp::from_unix_nanos(6),
            runs: vec![run(1, 1, 5), run(2, 6, 9)],
            late_entries: false,
        };
        assert_eq!(IndexManifest::decode(&manifest.encode()).unwrap(), manifest);
        let overlapping = IndexManifest { runs: vec![run(1, 1, 5), run(2, 5, 9)], ..manifest.clone() };
        assert!(IndexManifest::decode(&overlapping.encode()).is_err());
        // With late entries (COW) runs overlap.
        let late = IndexManifest { late_entries: true, archived_before: Timestamp::MIN, ..overlapping };
        assert_eq!(IndexManifest::decode(&late.encode()).unwrap(), late);
        let straddling = IndexManifest { archived_before: Timestamp::from_unix_nanos(7), ..manifest };
        assert!(IndexManifest::decode(&straddling.encode()).unwrap_err().to_string().contains("straddles"));

        let bookmarks = Bookmarks {
            entries: vec![Bookmark {
                name: BookmarkName::new("before-upgrade").unwrap(),
                timestamp: Timestamp::from_unix_nanos(7),
            }],
            laid_out: vec![Timestamp::from_unix_nanos(7)],
        };
        assert_eq!(Bookmarks::decode(&bookmarks.encode()).unwrap(), bookmarks);
        // Written before the laid-out section: none laid out.
        let mut older = Writer::new();
        older.u32(1).str("before-upgrade").u64(7);
        let older = Bookmarks::decode(&seal_envelope(Bookmarks::MAGIC, older)).unwrap();
        assert_eq!(older, Bookmarks { laid_out: Vec::new(), ..bookmarks.clone() });
        let unordered = Bookmarks { laid_out: vec![Timestamp::from_unix_nanos(7); 2], ..bookmarks };
        assert!(Bookmarks::decode(&unordered.encode()).unwrap_err().to_string().contains("ascending"));

        let at = Timestamp::from_unix_nanos;
        let tier = |interval_nanos, age_nanos| RetentionTier { interval_nanos, age_nanos };
        let policy = VolumePolicy {
            granularity_nanos: 10,
            retention: vec![tier(0, 100), tier(20, 200), tier(60, 900)],
            retention_clock: at(1000),
            floors: vec![(40, at(500))],
            horizon_floor: at(30),
            deleted: vec![(at(1), at(2))],
            space_max_bytes: 200 << 30,
        };
        assert_eq!(VolumePolicy::decode(&policy.encode()).unwrap(), policy);
        let not_nested = VolumePolicy { retention: vec![tier(20, 200), tier(50, 900)], ..policy.clone() };
        assert!(VolumePolicy::decode(&not_nested.encode()).is_err());
        let ages_shrink = VolumePolicy { retention: vec![tier(20, 200), tier(40, 100)], ..policy };
        assert!(VolumePolicy::decode(&ages_shrink.encode()).is_err());
    }

    #[test]
    fn retention_tiers_must_nest_and_age() {
        let tier = |interval_nanos, age_nanos| RetentionTier { interval_nanos, age_nanos };
        assert_eq!(RetentionTier::check(&[tier(0, 10), tier(5, 20), tier(15, 30)], 5), Ok(()));
        assert!(RetentionTier::check(&[tier(5, 20), tier(0, 30)], 5).is_ok(), "all = the granularity");
        assert!(RetentionTier::check(&[tier(10, 20), tier(0, 30)], 5).unwrap_err().contains("`all` must come"));
        assert!(RetentionTier::check(&[tier(7, 20)], 5).unwrap_err().contains("multiple"));
        assert!(RetentionTier::check(&[tier(10, 20), tier(10, 20)], 0).unwrap_err().contains("longer"));
        let ten_years = RetentionTier::INTERVAL_NANOS_MAX;
        assert!(RetentionTier::check_new(&[tier(ten_years, u64::MAX)], 5).is_ok(), "a tier of 10 years");
        assert!(RetentionTier::check_new(&[], ten_years + 1).unwrap_err().contains("10 years"), "granularity");
        assert!(RetentionTier::check_new(&[tier(2 * ten_years, u64::MAX)], 0).unwrap_err().contains("10 years"));
    }

    #[test]
    fn timeline_stops_at_a_torn_frame() {
        let bucket = TimelineBucket { minute: 1, write_count: 2, write_bytes: 3, zero_count: 4, zero_bytes: 5 };
        let first = TimelineFrame { lsn_last: Lsn(10), buckets: vec![bucket] };
        let second = TimelineFrame { lsn_last: Lsn(20), buckets: vec![bucket, bucket] };
        let mut bytes = first.encode();
        let first_length = bytes.len();
        bytes.extend_from_slice(&second.encode());
        let (frames, valid) = TimelineFrame::decode_all(&bytes);
        assert_eq!(frames, vec![first.clone(), second]);
        assert_eq!(valid, bytes.len());
        bytes.truncate(bytes.len() - 3);
        let (frames, valid) = TimelineFrame::decode_all(&bytes);
        assert_eq!(frames, vec![first]);
        assert_eq!(valid, first_length);
    }
}
