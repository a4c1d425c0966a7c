//! Rewind's engine as NBD exports: `NAME` is the live, writable volume;
//! `NAME@TIME` is a read-only view of it at TIME, where TIME is anything
//! `rewind_engine::timespec` reads (RFC 3339, Unix time, `-10m`,
//! `10 minutes ago`, a bookmark name). A relative TIME is resolved when the
//! client connects.
//!
//! Who may open what is [`AccessPolicy`]: everything for everyone, or the
//! node's grants (`rewind access grant`).
//!
//! Changed-block tracking is the metadata context
//! `qemu:dirty-bitmap:since-POINT` (POINT again anything a view name takes;
//! LIST names one per bookmark): on a volume, what changed from POINT to
//! the present; on a view, from POINT to the view's time. It is computed
//! from the version index on every BLOCK_STATUS (`View::changes_since`), so
//! unlike qemu's in-memory bitmaps nothing is lost in a crash.
//!
//! This is the one place engine errors become NBD errors.

use std::sync::Arc;
use std::time::SystemTime;

use jiff::tz::TimeZone;
use rewind_access::{Access, Grants};
use rewind_engine::timespec::DisplayTime;
use rewind_engine::{Attachment, Durability, EngineError, Node, Role, Timestamp, View, Volume, VolumeKind, ZeroMode};

use crate::{
    BlockSizes, Catalog, Client, DirtyBitmap, DirtyExtent, Export, ExportError, ExportErrorKind, ExportListing, Extent,
    OpenError, OpenErrorKind, ZeroFlags,
};

/// Dirty bitmap leaves: `since-POINT`.
const SINCE: &str = "since-";

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn export_error(error: EngineError) -> ExportError {
    let kind = match &error {
        EngineError::Poisoned { .. } | EngineError::Closed(_) | EngineError::CutOff { .. } => ExportErrorKind::Shutdown,
        EngineError::OutOfRange { .. } | EngineError::InvalidArgument(_) => ExportErrorKind::Invalid,
        // A full disk (or the node's reserve reached): the client's own error.
        error if error.is_no_space() => ExportErrorKind::NoSpace,
        _ => ExportErrorKind::Io,
    };
    // Not logged here: the server logs failed requests within the client's
    // log budget (a client rereading a damaged block must not flood the
    // log), and the engine reports transient failures once itself.
    ExportError::new(kind, error.to_string())
}

/// Who may open which export.
pub enum AccessPolicy {
    /// Every client opens every export, writable (Rewind before grants; tests).
    Open,
    /// The node's grants decide, except for a client on this machine (loopback
    /// or the Unix socket) that has no certificate when certificates are not
    /// required: it opens everything, as anyone who can reach a local socket
    /// could before. With `client_certificates_required` every client is
    /// decided by grants, local or not; a client without a certificate then
    /// matches only grants to `*`.
    Grants { grants: Arc<Grants>, client_certificates_required: bool },
}

impl AccessPolicy {
    fn access(&self, volume: &str, client: &Client) -> Option<Access> {
        match self {
            AccessPolicy::Open => Some(Access::ReadWrite),
            AccessPolicy::Grants { grants, client_certificates_required } => {
                if client.local && client.identity.is_none() && !client_certificates_required {
                    return Some(Access::ReadWrite);
                }
                grants.lookup(volume, client.identity.as_deref())
            }
        }
    }
}

pub struct EngineCatalog {
    node: Arc<Node>,
    zone: TimeZone,
    policy: AccessPolicy,
}

impl EngineCatalog {
    /// Every client may open every export.
    pub fn new(node: Arc<Node>) -> Self {
        EngineCatalog::with_policy(node, AccessPolicy::Open)
    }

    pub fn with_policy(node: Arc<Node>, policy: AccessPolicy) -> Self {
        EngineCatalog { node, zone: TimeZone::system(), policy }
    }
}

impl Catalog for EngineCatalog {
    /// What `client` may open: volumes it has no access to are not listed.
    fn list(&self, client: &Client) -> Vec<ExportListing> {
        let mut listings = Vec::new();
        for volume in self.node.volumes().into_iter().filter(|volume| volume.kind() == VolumeKind::Blocks) {
            let Some(access) = self.policy.access(volume.name().as_str(), client) else { continue };
            listings.push(ExportListing {
                name: volume.name().to_string(),
                description: match access {
                    Access::ReadWrite => "live volume, writable; NAME@TIME opens it as of TIME",
                    Access::ReadOnly => "live volume, read-only for you; NAME@TIME opens it as of TIME",
                }
                .to_string(),
            });
            for bookmark in volume.bookmarks() {
                listings.push(ExportListing {
                    name: format!("{}@{}", volume.name(), bookmark.name),
                    description: format!(
                        "read-only view at bookmark {} ({})",
                        bookmark.name,
                        DisplayTime(bookmark.timestamp)
                    ),
                });
            }
        }
        listings
    }

    fn open(&self, name: &str, client: &Client) -> Result<Arc<dyn Export>, OpenError> {
        let (volume_name, time) = match name.split_once('@') {
            Some((volume, time)) => (volume, Some(time)),
            None => (name, None),
        };
        // Not allowed reads exactly like not there, so names cannot be probed.
        let not_found = |error: String| {
            let known: Vec<String> = self
                .node
                .volumes()
                .iter()
                .filter(|volume| volume.kind() == VolumeKind::Blocks)
                .map(|volume| volume.name().to_string())
                .filter(|volume| self.policy.access(volume, client).is_some())
                .collect();
            let message = if known.is_empty() && matches!(self.policy, AccessPolicy::Open) {
                format!("{error} (there are none yet: `rewind volume create NAME --size SIZE`)")
            } else if known.is_empty() {
                format!("{error} (none is open to {client}: `rewind access grant VOLUME IDENTITY`)")
            } else {
                format!("{error}; exports here: {}, each also as NAME@TIME", known.join(", "))
            };
            OpenError { kind: OpenErrorKind::NotFound, message }
        };
        let Some(access) = self.policy.access(volume_name, client) else {
            tracing::info!(export = %name, %client, "refused: no access grant");
            return Err(not_found(EngineError::VolumeNotFound(volume_name.to_owned()).to_string()));
        };
        let volume = self.node.volume(volume_name).map_err(|error| match error {
            // Granted, so it may be told what is wrong with it.
            EngineError::Damaged { .. } => OpenError { kind: OpenErrorKind::Unavailable, message: error.to_string() },
            error => not_found(error.to_string()),
        })?;
        if volume.kind() == VolumeKind::Tree {
            let message =
                format!("{volume_name} is a file tree, not a disk: it is served over NFS (nfs://HOST/{volume_name})");
            return Err(OpenError { kind: OpenErrorKind::NotFound, message });
        }
        // Attached while the export lives, so deleting or reverting the volume names this client.
        let role = if time.is_some() { Role::View } else { Role::Live };
        let attachment = Arc::new(volume.attach(format!("nbd {client} ({name})"), role));
        let zone = self.zone.clone();
        let Some(time) = time else {
            let read_only = access == Access::ReadOnly;
            return Ok(Arc::new(VolumeExport { volume, read_only, attachment, zone }));
        };
        let bad_name = |error: EngineError| {
            let kind = match error {
                EngineError::RecoveryPending { .. } => OpenErrorKind::Unavailable,
                _ => OpenErrorKind::BadName,
            };
            OpenError { kind, message: error.to_string() }
        };
        let at = volume.parse_time(time, now(), &self.zone).map_err(bad_name)?;
        Ok(Arc::new(ViewExport { view: volume.view(at).map_err(bad_name)?, _attachment: attachment, zone }))
    }
}

fn block_sizes(volume: &Volume) -> BlockSizes {
    // Requests need no alignment (partial blocks are read, patched and
    // written whole), but whole, aligned blocks avoid that work.
    BlockSizes {
        minimum: 1,
        preferred: volume.block_size().bytes().max(4096),
        maximum: crate::protocol::PAYLOAD_BYTES_MAX,
    }
}

fn extents(statuses: Vec<rewind_engine::BlockStatus>) -> Vec<Extent> {
    statuses
        .into_iter()
        .map(|status| Extent { length: status.length, hole: !status.allocated, zero: status.zero })
        .collect()
}

/// Refuses every request once a revert cut the connection off: what it
/// has cached of the volume is no longer what the volume holds.
fn connected(attachment: &Attachment) -> Result<(), ExportError> {
    if attachment.is_cut_off() {
        return Err(ExportError::new(
            ExportErrorKind::Shutdown,
            "the volume was reverted and this connection cut off; reconnect",
        ));
    }
    Ok(())
}

/// The dirty bitmaps LIST names: one per bookmark.
fn bookmark_bitmaps(volume: &Volume) -> Vec<String> {
    volume.bookmarks().iter().map(|bookmark| format!("{SINCE}{}", bookmark.name)).collect()
}

/// The view at the POINT of a `since-POINT` leaf, if it names one.
fn since(volume: &Arc<Volume>, leaf: &str, zone: &TimeZone) -> Option<View> {
    let point = leaf.strip_prefix(SINCE)?;
    volume.view(volume.parse_time(point, now(), zone).ok()?).ok()
}

/// `qemu:dirty-bitmap:since-POINT`: the blocks that read differently than
/// at POINT.
struct ChangesSince {
    since: View,
    until: Until,
}

enum Until {
    /// The live volume, until a revert cuts the connection off.
    Present {
        volume: Arc<Volume>,
        attachment: Arc<Attachment>,
    },
    View(View),
}

impl DirtyBitmap for ChangesSince {
    fn extents(&self, offset: u64, length: u64) -> Result<Vec<DirtyExtent>, ExportError> {
        let changes = match &self.until {
            Until::Present { volume, attachment } => {
                connected(attachment)?;
                volume.changes_since(&self.since, offset, length)
            }
            Until::View(view) => view.changes_since(&self.since, offset, length),
        };
        let changes = changes.map_err(export_error)?;
        Ok(changes.into_iter().map(|change| DirtyExtent { length: change.length, dirty: change.changed }).collect())
    }
}

struct VolumeExport {
    volume: Arc<Volume>,
    /// Opened through a read-only grant.
    read_only: bool,
    attachment: Arc<Attachment>,
    zone: TimeZone,
}

impl VolumeExport {
    fn connected(&self) -> Result<(), ExportError> {
        connected(&self.attachment)
    }

    fn writable(&self) -> Result<(), ExportError> {
        self.connected()?;
        if self.read_only {
            return Err(ExportError::new(ExportErrorKind::ReadOnly, "your access to this volume is read-only"));
        }
        Ok(())
    }
}

impl Export for VolumeExport {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        block_sizes(&self.volume)
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// A flush commits the volume's whole journal, whichever connection wrote.
    fn can_multi_conn(&self) -> bool {
        true
    }

    /// Zeroing records one journal record per 64 Ki blocks and deallocates.
    fn can_fast_zero(&self) -> bool {
        true
    }

    fn description(&self) -> String {
        format!(
            "Rewind volume {}: every write kept; {}@TIME shows it as of TIME",
            self.volume.name(),
            self.volume.name()
        )
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.connected()?;
        self.volume.read(offset, buf).map_err(export_error)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.writable()?;
        let durability = if fua { Durability::Fua } else { Durability::Buffered };
        self.attachment.write(now(), offset, data, durability).map_err(export_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.connected()?;
        self.volume.flush().map_err(export_error)
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.writable()?;
        let durability = if fua { Durability::Fua } else { Durability::Buffered };
        self.attachment.zero(now(), offset, length, ZeroMode::Deallocate, durability).map_err(export_error)
    }

    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), ExportError> {
        self.writable()?;
        if flags.fast && flags.no_hole {
            // Allocated zeros are written out as data: not fast.
            return Err(ExportError::new(ExportErrorKind::NotSupported, "allocated zeros are not fast"));
        }
        let mode = if flags.no_hole { ZeroMode::Allocate } else { ZeroMode::Deallocate };
        let durability = if flags.fua { Durability::Fua } else { Durability::Buffered };
        self.attachment.zero(now(), offset, length, mode, durability).map_err(export_error)
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        self.connected()?;
        self.volume.block_status(offset, length).map(extents).map_err(export_error)
    }

    /// A revert with `--disconnect` ends the connection.
    fn when_cut_off(&self, hang_up: Box<dyn FnOnce() + Send>) {
        self.attachment.on_cut_off(hang_up);
    }

    fn dirty_bitmaps(&self) -> Vec<String> {
        bookmark_bitmaps(&self.volume)
    }

    fn dirty_bitmap(&self, leaf: &str) -> Option<Arc<dyn DirtyBitmap>> {
        let since = since(&self.volume, leaf, &self.zone)?;
        let until = Until::Present { volume: Arc::clone(&self.volume), attachment: Arc::clone(&self.attachment) };
        Some(Arc::new(ChangesSince { since, until }))
    }
}

struct ViewExport {
    view: View,
    _attachment: Arc<Attachment>,
    zone: TimeZone,
}

impl ViewExport {
    fn read_only() -> ExportError {
        ExportError::new(ExportErrorKind::ReadOnly, "views are read-only; clone a volume to write to its past")
    }
}

impl Export for ViewExport {
    fn size_bytes(&self) -> u64 {
        self.view.volume().size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        block_sizes(self.view.volume())
    }

    fn is_read_only(&self) -> bool {
        true
    }

    /// Nothing changes a view.
    fn can_multi_conn(&self) -> bool {
        true
    }

    fn can_fast_zero(&self) -> bool {
        false
    }

    fn description(&self) -> String {
        format!("Rewind volume {} as of {} (read-only)", self.view.volume().name(), DisplayTime(self.view.at()))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.view.read(offset, buf).map_err(export_error)
    }

    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), ExportError> {
        Err(ViewExport::read_only())
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), ExportError> {
        Err(ViewExport::read_only())
    }

    fn write_zeroes(&self, _offset: u64, _length: u64, _flags: ZeroFlags) -> Result<(), ExportError> {
        Err(ViewExport::read_only())
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        self.view.block_status(offset, length).map(extents).map_err(export_error)
    }

    fn dirty_bitmaps(&self) -> Vec<String> {
        bookmark_bitmaps(self.view.volume())
    }

    fn dirty_bitmap(&self, leaf: &str) -> Option<Arc<dyn DirtyBitmap>> {
        let since = since(self.view.volume(), leaf, &self.zone)?;
        Some(Arc::new(ChangesSince { since, until: Until::View(self.view.clone()) }))
    }
}
