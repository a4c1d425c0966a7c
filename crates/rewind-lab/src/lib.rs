//! Rewind's CDP architectures lab: where to put a write, decided by the
//! numbers.
//!
//! Two of Rewind's research sources study *where* a CDP system should put a
//! write: the IBM paper's four controller architectures (Logging,
//! SplitStream, SplitDownStream, Checkpointing) and Xiao et al.'s
//! copy-on-write and redirect-on-write snapshots. The lab replays block
//! traces ([`trace`], [`spc1`]) through each of them in accounting mode —
//! behind the controller cache the paper models ([`cache`]), counting every
//! device I/O per store ([`replay`]) — and sets the counts against the
//! papers' analytical models ([`model`]); [`report`] turns it all into a
//! Markdown report with plots and a recommendation.
//!
//! Pure computation and files: no engine, no network.

/// The controller cache, shared with the engine's cached layouts.
pub use rewind_cache as cache;

pub mod analysis;
pub mod model;
pub mod replay;
pub mod report;
pub mod spc1;
pub mod trace;
