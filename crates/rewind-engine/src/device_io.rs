//! Device I/O per store, counted as it happens: what `rewind stats` and
//! `/metrics` show next to the lab's replayed counts.

use std::sync::Arc;

use rewind_io::{CountingStorage, IoStats, Storage};

/// The counting storages a volume's stores go through.
pub(crate) struct VolumeIo {
    journal: Arc<CountingStorage>,
    current: Arc<CountingStorage>,
    index: Arc<CountingStorage>,
}

/// A volume's device I/O since it was opened, by store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeIoStats {
    /// The write-ahead journal: appends, group-commit syncs, and the reads
    /// of recovery, views and the archive pass of versions still in it.
    pub journal: IoStats,
    /// The current store: the present, written in place.
    pub current: IoStats,
    /// The version index: the history's map.
    pub index: IoStats,
}

impl VolumeIo {
    pub fn new(storage: &Arc<dyn Storage>) -> VolumeIo {
        let counting = || Arc::new(CountingStorage::new(Arc::clone(storage)));
        VolumeIo { journal: counting(), current: counting(), index: counting() }
    }

    pub fn journal(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.journal) as Arc<dyn Storage>
    }

    pub fn current(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.current) as Arc<dyn Storage>
    }

    pub fn index(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.index) as Arc<dyn Storage>
    }

    pub fn stats(&self) -> VolumeIoStats {
        VolumeIoStats {
            journal: self.journal.counters().stats(),
            current: self.current.counters().stats(),
            index: self.index.counters().stats(),
        }
    }
}
