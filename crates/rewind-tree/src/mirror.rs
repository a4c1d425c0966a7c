//! A tree whose present is another server's: a proxy forwards clients to
//! that upstream server and records each update it applies into the tree
//! (`rewind_nfs::Proxy`). The tree only knows it is one, and how the proxy
//! is doing, for whoever asks (the API).

use std::time::Duration;

/// What keeps a tree in step with an upstream server.
pub trait Mirror: Send + Sync {
    fn status(&self) -> MirrorStatus;
}

/// How a mirror is doing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorStatus {
    /// The upstream server and export.
    pub upstream: String,
    /// Updates are answered before they are recorded (UCDP-A).
    pub asynchronous: bool,
    /// Calls forwarded to the upstream.
    pub forwarded: u64,
    /// Updates recorded.
    pub recorded: u64,
    /// Updates the upstream applied that could not be recorded as steps of
    /// their own (the tree was brought in step by comparing it instead).
    pub unrecorded: u64,
    /// Comparisons of the whole tree with the upstream begun (one at every
    /// start; while the tree cannot record, retried after growing pauses).
    pub resyncs: u64,
    /// False while updates go unrecorded until a comparison succeeds (the
    /// tree's disk is full, say).
    pub in_step: bool,
    /// How far behind the upstream the tree is (asynchronous mirrors).
    pub lag: Option<MirrorLag>,
}

/// How far an asynchronous mirror is behind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorLag {
    pub pending_updates: usize,
    pub pending_bytes: usize,
    /// Clients waiting for room in the queue (the bound at work).
    pub waiting_clients: usize,
    /// Age of the oldest update not yet recorded.
    pub behind: Duration,
    /// Of the times from an update's answer to its record:
    pub recorded: u64,
    pub mean: Duration,
    /// The upper end of the power-of-two bucket the 99th percentile is in.
    pub p99: Duration,
    pub max: Duration,
}
