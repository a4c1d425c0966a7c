use rewind_engine::EngineError;
use rewind_format::FormatError;

/// What a tree operation can fail with. Front ends map these to their
/// protocol's errors (NFS3ERR_NOENT, NFS3ERR_STALE, …).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    #[error("no such file or directory")]
    NotFound,
    #[error("the name exists already")]
    Exists,
    #[error("not a directory")]
    NotDirectory,
    #[error("is a directory")]
    IsDirectory,
    #[error("the directory is not empty")]
    NotEmpty,
    #[error("a name of {0} bytes is longer than the 255 a name may have")]
    NameTooLong(usize),
    #[error("invalid: {0}")]
    Invalid(String),
    /// The handle names an inode that has been removed (or reused since).
    #[error("stale file handle")]
    Stale,
    #[error("a file may be at most 64 GiB")]
    FileTooLarge,
    #[error("the tree has no free inode left")]
    NoInodes,
    #[error("the past is read-only")]
    ReadOnly,
    /// Permissions refuse the caller.
    #[error("permission denied")]
    AccessDenied,
    /// Only the owner (or root) may do this.
    #[error("operation not permitted")]
    NotPermitted,
    #[error("not a symbolic link")]
    NotSymlink,
    /// SETATTR's guard: the ctime the caller expected is not the inode's.
    #[error("the attributes changed since the guard was read")]
    NotSync,
    /// The tree's own structures are damaged: reported, never skipped.
    #[error("the tree is damaged: {0}")]
    Damaged(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl TreeError {
    pub(crate) fn damaged(what: impl std::fmt::Display, error: FormatError) -> TreeError {
        TreeError::Damaged(format!("{what}: {error}"))
    }
}
