//! What the NBD server serves: a catalog of named exports, each a byte-addressed
//! block device. The protocol code knows nothing else about Rewind; the adapter
//! from engine volumes and views to these traits lives in `crate::engine`.
//!
//! Contracts every implementation keeps:
//! - Ranges passed to `Export` methods have already been validated by the server
//!   (`offset + len <= size_bytes()`, `len > 0`, and writes only on writable exports),
//!   but implementations assert it again rather than trusting the caller.
//! - Methods may be called concurrently from many connections; overlapping
//!   concurrent requests have unspecified (but never corrupting) results, as in NBD.
//! - `flush` makes every write that completed before it was called, on any
//!   connection to the same export name, durable. That is what makes
//!   `can_multi_conn` honest.

use std::fmt;
use std::sync::Arc;

/// One entry of `NBD_OPT_LIST`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportListing {
    pub name: String,
    pub description: String,
}

/// Why an export could not be opened; sent to the client as an NBD option error
/// (`NBD_REP_ERR_UNKNOWN` for `NotFound`/`BadName`, `NBD_REP_ERR_INVALID` ...)
/// with `message` as the human-readable string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenError {
    pub kind: OpenErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenErrorKind {
    /// No export by that name (`NBD_REP_ERR_UNKNOWN`).
    NotFound,
    /// The name is malformed, e.g. a view time that cannot be parsed or lies
    /// outside the volume's history (`NBD_REP_ERR_UNKNOWN`, message says why).
    BadName,
    /// The export exists but cannot be served right now (`NBD_REP_ERR_SHUTDOWN`
    /// while the server stops, otherwise `NBD_REP_ERR_UNKNOWN`).
    Unavailable,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// An error from an export operation, mapped by the server to an NBD errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportError {
    pub kind: ExportErrorKind,
    pub message: String,
}

impl ExportError {
    pub fn new(kind: ExportErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportErrorKind {
    /// `NBD_EIO`: the device failed, or stored data failed its checksum.
    Io,
    /// `NBD_EPERM`: write to a read-only export (views).
    ReadOnly,
    /// `NBD_EINVAL`: request the export cannot honour as asked.
    Invalid,
    /// `NBD_ENOSPC`: out of space.
    NoSpace,
    /// `NBD_ENOTSUP`: e.g. `NBD_CMD_FLAG_FAST_ZERO` when zeroing would be slow.
    NotSupported,
    /// `NBD_ESHUTDOWN`: the server is stopping, or the volume is poisoned
    /// after a failed fsync and refuses further writes until restart.
    Shutdown,
}

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    pub maximum: u32,
}

impl BlockSizes {
    /// What a plain byte-addressed export with no alignment needs: any
    /// length, 4 KiB preferred, no limit beyond the server's own.
    pub const UNCONSTRAINED: BlockSizes = BlockSizes { minimum: 1, preferred: 4096, maximum: u32::MAX };

    /// Checks the rules the NBD spec sets for advertised block sizes
    /// ("Block size constraints"); the server refuses to open an export that
    /// breaks them rather than advertise nonsense. `maximum == u32::MAX`
    /// means no limit of the export's own.
    pub fn check(&self) -> Result<(), &'static str> {
        let BlockSizes { minimum, preferred, maximum } = *self;
        if !minimum.is_power_of_two() || minimum > 64 * 1024 {
            return Err("minimum block size must be a power of two no larger than 64 KiB");
        }
        if !preferred.is_power_of_two() || preferred < minimum.max(512) {
            return Err("preferred block size must be a power of two, at least 512 and the minimum");
        }
        if maximum != u32::MAX && (maximum % minimum != 0 || maximum < preferred) {
            return Err("maximum block size must be a multiple of the minimum and at least the preferred size");
        }
        Ok(())
    }
}

/// One extent of a `base:allocation` block status reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// `NBD_STATE_HOLE` (bit 0): no data stored for this range.
    pub hole: bool,
    /// `NBD_STATE_ZERO` (bit 1): the range reads as zeros.
    pub zero: bool,
}

impl Extent {
    /// The status word of its descriptor.
    pub fn status(&self) -> u32 {
        (u32::from(self.hole) * crate::protocol::STATE_HOLE) | (u32::from(self.zero) * crate::protocol::STATE_ZERO)
    }
}

/// One extent of a `qemu:dirty-bitmap:` block status reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyExtent {
    pub length: u64,
    /// `NBD_STATE_DIRTY` (bit 0): the range changed since the bitmap's point.
    pub dirty: bool,
}

impl DirtyExtent {
    /// The status word of its descriptor.
    pub fn status(&self) -> u32 {
        u32::from(self.dirty) * crate::protocol::STATE_DIRTY
    }
}

/// Changed-block tracking as an NBD metadata context
/// (`qemu:dirty-bitmap:LEAF`, the form qemu's incremental backups read).
pub trait DirtyBitmap: Send + Sync {
    /// Extents as [`Export::block_status`] reports them: covering at least
    /// the first byte of the range and at most the range, in order.
    fn extents(&self, offset: u64, length: u64) -> Result<Vec<DirtyExtent>, ExportError>;
}

/// How `write_zeroes` may satisfy the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroFlags {
    /// `NBD_CMD_FLAG_FUA`.
    pub fua: bool,
    /// `NBD_CMD_FLAG_NO_HOLE`: the client wants allocated zeros.
    pub no_hole: bool,
    /// `NBD_CMD_FLAG_FAST_ZERO`: fail with `NotSupported` rather than be slow.
    pub fast: bool,
}

/// A named block device served over NBD.
pub trait Export: Send + Sync {
    fn size_bytes(&self) -> u64;
    fn block_sizes(&self) -> BlockSizes;
    fn is_read_only(&self) -> bool;
    /// True when `flush` on one connection covers writes from all connections.
    fn can_multi_conn(&self) -> bool;
    /// True when `write_zeroes` with `fast` set can succeed (zeroing is cheap).
    fn can_fast_zero(&self) -> bool;
    /// Text for humans, sent as `NBD_INFO_DESCRIPTION` when a client asks
    /// (`nbdinfo` shows it); empty means none.
    fn description(&self) -> String {
        String::new()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    fn flush(&self) -> Result<(), ExportError>;
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError>;
    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), ExportError>;
    /// Extents covering at least the first byte of `offset..offset+length` and at
    /// most that range, in order, each with `length > 0` (and, when
    /// `block_sizes().minimum > 1`, a multiple of it, as the spec requires).
    /// The server merges neighbours with equal status and sends at most
    /// `protocol::EXTENTS_PER_REPLY_MAX` of them; clients ask again for the rest.
    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError>;

    /// Called once the connection is in transmission with a way to end it
    /// (`hang_up` stops reading requests; those in flight are answered and
    /// the connection closes), for an export that may need to end its
    /// clients' connections itself (a volume reverted under them).
    fn when_cut_off(&self, _hang_up: Box<dyn FnOnce() + Send>) {}

    /// The leaves of the `qemu:dirty-bitmap:` contexts a LIST names
    /// (a SET may select others that [`Export::dirty_bitmap`] understands).
    fn dirty_bitmaps(&self) -> Vec<String> {
        Vec::new()
    }

    /// The dirty bitmap `qemu:dirty-bitmap:LEAF`, if this export has one by
    /// that name; it answers for this export's contents as long as it lives.
    fn dirty_bitmap(&self, _leaf: &str) -> Option<Arc<dyn DirtyBitmap>> {
        None
    }
}

/// The set of exports a server offers. Opening resolves a name at connect time,
/// so a view name like `db@-10m` means ten minutes before that client connected.
pub trait Catalog: Send + Sync {
    /// The exports `client` may open.
    fn list(&self, client: &Client) -> Vec<ExportListing>;
    fn open(&self, name: &str, client: &Client) -> Result<Arc<dyn Export>, OpenError>;
}

/// Who is asking: what the catalog may decide access by, and how the
/// client is named to people (logs, `rewind volume delete`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    /// `127.0.0.1:51234` for TCP, `unix` for a Unix socket.
    pub peer: String,
    /// The client is on this machine: a loopback address or the Unix socket.
    pub local: bool,
    /// Who the client proved to be (its TLS certificate's subject), if anyone.
    pub identity: Option<String>,
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.identity {
            Some(identity) => write!(f, "{identity} at {}", self.peer),
            None => f.write_str(&self.peer),
        }
    }
}
