//! Rewind's storage engine: volumes whose every write is kept, readable as of
//! any moment.
//!
//! A [`Node`] is a data directory of [`Volume`]s. A volume's write goes to its
//! journal (durable at FLUSH/FUA through group commit), into its version index,
//! and — once durable — into its current store. Reads of the present come from
//! the current store; a [`View`] reads the volume as it was at a time `T`,
//! taking each block from the current store when it has not changed since `T`
//! and from its historical version otherwise.
//!
//! **Architecture Invariant:** nothing here reads a clock, opens a socket,
//! starts a thread or uses a global random number generator. Time comes in as
//! a [`Timestamp`] argument; background work happens when the embedder calls
//! [`Node::maintain`] (the server does so from a thread, the simulator from its
//! event loop).

pub mod catalog;
mod current;
mod device_io;
mod error;
mod group;
mod layout;
mod node;
pub mod pool;
mod repair;
mod reserve;
pub mod timespec;
mod volume;

pub use device_io::VolumeIoStats;
pub use error::EngineError;
pub use group::GroupRevertTo;
pub use layout::{CurrentWrites, Destage, HistorySource, Indexing, LayoutRules};
pub use node::{Bucket, Clones, DamagedVolume, Node, NodeConfig, VolumeSpec, WorkSignal};
pub use repair::{RepairMode, RepairReport, RepairStep};
pub use reserve::{Reserve, SpaceReport, SpaceState};
pub use rewind_chunks::retention::{Retention, RetentionReport};
pub use rewind_chunks::tiered::{TierConfig, TierStats};
pub use rewind_chunks::{
    ChunkError, ChunkStats, ChunkStoreConfig, CollectPhase, CollectReport, DedupConfig, PackStore,
};
pub use rewind_format::groups::{Group, GroupBookmark, MemberPoint};
pub use rewind_format::meta::{Bookmark, Layout, RetentionTier, Revert, TimelineBucket, VolumeBase, VolumeKind};
pub use rewind_io::IoStats;
pub use volume::clients::{Attachment, HangUp, InUse, Role};
pub use volume::compound::{Change, CompoundWritten, COMPOUND_BLOCKS_MAX, COMPOUND_BYTES_MAX};
pub use volume::defrag::DefragReport;
pub use volume::diff::ChangeExtent;
pub use volume::history::{PolicyChange, TimelineReport, VolumeStats};
pub use volume::import::ImportReport;
pub use volume::promote::PromoteReport;
pub use volume::read::{BlockStatus, View};
pub use volume::revert::{RevertReport, Writers};
pub use volume::revert_copy::RevertCopyStatus;
pub use volume::space::{ratio, VolumeSpace};
pub use volume::writes::{WriteExtent, WriteExtents, WriteHistory};
pub use volume::{Clock, Durability, Volume, VolumeConfig, ZeroMode};

pub use rewind_journal::DroppedTail;
pub use rewind_types::{BlockSize, BookmarkName, Timestamp, VolumeName};
