use std::io;

use rewind_chunks::ChunkError;
use rewind_index::IndexError;
use rewind_journal::JournalError;

use crate::timespec::TimeSpecError;

/// Everything that can go wrong in the engine. Front ends map these to NBD
/// errors, HTTP statuses and CLI messages; each message says what to do next
/// where there is something to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("no volume named {0:?}; `rewind volume list` shows the volumes")]
    VolumeNotFound(String),
    #[error("no group named {0:?}; `rewind group list` shows the groups")]
    GroupNotFound(String),
    #[error("volume {0:?} already exists")]
    VolumeExists(String),
    #[error("volume {volume} has no bookmark {bookmark:?}; `rewind bookmark list {volume}` shows its bookmarks")]
    BookmarkNotFound { volume: String, bookmark: String },
    #[error("volume {volume} already has a bookmark {bookmark:?} (at {at}); delete it first or pick another name")]
    BookmarkExists { volume: String, bookmark: String, at: String },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{length} bytes at offset {offset} lie outside volume {volume}, which has {size_bytes} bytes")]
    OutOfRange { volume: String, offset: u64, length: u64, size_bytes: u64 },
    #[error("volume {volume} has no history before {earliest}, when its protection began; {requested} is earlier")]
    BeforeHistory { volume: String, requested: String, earliest: String },
    #[error(
        "the history of volume {volume} from {from} until {to} was deleted, so {requested} cannot be shown; \
         the nearest points kept are {before} and {to}"
    )]
    HistoryDeleted { volume: String, requested: String, from: String, to: String, before: String },
    #[error(
        "volume {volume} keeps no history before {horizon} (its retention policy), so {requested} cannot be \
         shown; the nearest points kept are {horizon} (the oldest state){before}"
    )]
    HistoryExpired { volume: String, requested: String, horizon: String, before: String },
    #[error("{requested} is in the future (it is now {now}); a view shows a time that has already happened")]
    InFuture { requested: String, now: String },
    #[error(transparent)]
    TimeSpec(#[from] TimeSpecError),
    #[error(
        "volume {volume} stopped accepting writes after a failed write or fsync ({cause}); \
         restart the server to recover it from its journal"
    )]
    Poisoned { volume: String, cause: String },
    #[error(
        "volume {volume} is in use by {}: {}; disconnect them first, or force it (`--force`), \
         which ends their sessions with errors",
        if clients.len() == 1 { "a client".to_owned() } else { format!("{} clients", clients.len()) },
        clients.join(", ")
    )]
    InUse { volume: String, clients: Vec<String> },
    #[error(
        "volume {volume} has {}: {}; delete {} first, or with it (`--with-clones`)",
        if clones.len() == 1 { "a clone that reads from it".to_owned() } else { format!("{} clones that read from it", clones.len()) },
        clones.join(", "),
        if clones.len() == 1 { "it" } else { "them" }
    )]
    HasClones { volume: String, clones: Vec<String> },
    #[error(
        "volume {volume} is open for writing by {}: {}; a revert would change the data under {}: disconnect {} \
         first, or pass --disconnect, which cuts {} off (every request fails from then on, so they reconnect)",
        if clients.len() == 1 { "a client".to_owned() } else { format!("{} clients", clients.len()) },
        clients.join(", "),
        if clients.len() == 1 { "it" } else { "them" },
        if clients.len() == 1 { "it" } else { "them" },
        if clients.len() == 1 { "it" } else { "them" }
    )]
    WritersConnected { volume: String, clients: Vec<String> },
    #[error("volume {volume} was reverted and this client cut off: its requests fail from now on; reconnect")]
    CutOff { volume: String },
    #[error(
        "volume {volume} is damaged and not served: {problem}; `rewind volume repair {volume}` rebuilds what can \
         be rebuilt and says what cannot, `rewind volume delete {volume}` removes it"
    )]
    Damaged { volume: String, problem: String },
    #[error(
        "garbage collection waits while {} damaged ({}): the chunks their history refers to are not counted; \
         repair or delete {}",
        if volumes.len() == 1 { "a volume is" } else { "volumes are" },
        volumes.join(", "),
        if volumes.len() == 1 { "it" } else { "them" }
    )]
    CollectionWaits { volumes: Vec<String> },
    #[error(
        "volume {volume} cannot take more data now: {detail}; writes resume by themselves once there is room — \
         free some with `rewind history delete`, a shorter `--retention`, `rewind gc` or `rewind volume delete`"
    )]
    NoSpace { volume: String, detail: String },
    #[error(
        "volume {volume} has not finished recovering from a crash: that needs free space on the data \
         directory's filesystem; its present is served, views of its past wait until then"
    )]
    RecoveryPending { volume: String },
    #[error("volume {0} has been deleted")]
    Closed(String),
    #[error("data corruption in volume {volume}: {detail}")]
    Corrupt { volume: String, detail: String },
    #[error("I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Chunks(#[from] ChunkError),
}

impl EngineError {
    pub(crate) fn io(path: &str) -> impl FnOnce(io::Error) -> EngineError + '_ {
        move |source| EngineError::Io { path: path.to_owned(), source }
    }

    /// The I/O error underneath, if this is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            EngineError::Io { source, .. }
            | EngineError::Journal(JournalError::Io { source, .. })
            | EngineError::Index(IndexError::Io { source, .. })
            | EngineError::Chunks(ChunkError::Io { source, .. }) => Some(source),
            _ => None,
        }
    }

    /// Whether this is a condition that passes — a full disk or quota, no
    /// file descriptors or memory left — which fails the request that met
    /// it and poisons nothing (see `rewind_io::is_transient`).
    pub fn is_transient(&self) -> bool {
        matches!(self, EngineError::NoSpace { .. }) || self.io_error().is_some_and(rewind_io::is_transient)
    }

    /// Whether the disk (or quota) is full: NBD clients are told ENOSPC.
    pub fn is_no_space(&self) -> bool {
        matches!(self, EngineError::NoSpace { .. })
            || self
                .io_error()
                .is_some_and(|error| matches!(error.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
    }

    /// Whether stored data failed a check (as opposed to a bad request or an
    /// I/O failure).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            EngineError::Corrupt { .. }
                | EngineError::Journal(JournalError::Corrupt { .. })
                | EngineError::Index(IndexError::Corrupt { .. })
                | EngineError::Chunks(ChunkError::Corrupt { .. } | ChunkError::Missing { .. })
        )
    }
}
