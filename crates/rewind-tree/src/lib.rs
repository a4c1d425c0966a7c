//! File trees: a file system kept in a volume, so that every change to a
//! file or a directory is a point in time of the tree.
//!
//! A tree is a logging-layout volume of 2^60 bytes holding the format of
//! `rewind_format::tree` (`docs/format/tree.md`): a superblock, an inode
//! bitmap, one block per inode, and each file's data at a fixed place.
//! Every operation — a write with the file's new size and times, a create
//! with the new inode, the directory block naming it and the bitmap, a
//! rename with both directories — is one compound write of the volume
//! (`Volume::write_compound`): one journal record, one point in time, all
//! or none. So the engine keeps the tree's history as it keeps a disk's:
//! durably, deduplicated and compressed, under the same retention,
//! granularity, bookmarks and tiering; and the tree as it was at any time
//! T is the same format read from the volume's view at T ([`TreeView`]),
//! opened instantly at any age.
//!
//! ```text
//!  front end (NFS) ──▶ Tree (present: caches, one transaction at a time) ──▶ Volume::write_compound
//!                 └──▶ TreeView (the past: read-only)                     ──▶ View::read
//! ```
//!
//! The protocol code knows inodes, names and attributes, not journals; this
//! crate knows no protocol.

mod error;
mod history;
mod mirror;
mod namespace;
mod present;
mod registry;
mod revert;
mod view;

pub use error::TreeError;
pub use history::{walk, FileVersion};
pub use mirror::{Mirror, MirrorLag, MirrorStatus};
pub use namespace::{Access, Attributes, Caller, DirEntryPlus, Handle, Namespace, ReadDir};
pub use present::{CreateHow, SetAttributes, SetTime, Stability, Tree, Wcc};
pub use registry::{tree_id, OpenTree, Trees, VIEW_IDLE_SWEEPS};
pub use revert::RevertReport;
pub use rewind_format::tree::{Author, FileKind, FILE_BYTES_MAX, NAME_BYTES_MAX, ROOT_INODE, SYMLINK_TARGET_BYTES_MAX};
pub use view::TreeView;
