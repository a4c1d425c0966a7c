//! Everything that differs between the layouts, in one place: each layout's
//! rules are one entry of [`LayoutRules::of`], and the rest of the engine
//! asks the rules, never the layout's name. A new layout is a new entry
//! there (and a name in `rewind_types::Layout`); what its rules combine is
//! already built.
//!
//! The three rules, after the papers (IBM §2.4–2.7, Xiao et al. §2):
//!
//! - **indexing** — when a version enters the version index: as it is
//!   written (the journal is history until it is archived), or as it
//!   leaves the overlay, the papers' cache (the journal is then only the
//!   write-ahead log and the index takes late entries). It also decides
//!   recovery: an index filed at write covers the checkpoint's LSN and is
//!   checkpointed at once after a replay; one filed at destage gets its
//!   replayed writes back in the overlay, destaged once the chunk store has
//!   counted its references.
//! - **destage** — when versions go from the overlay to the current store:
//!   never (no current store), continuously, as a controller cache lets them
//!   go, or at snapshots (ROW's merge).
//! - **current writes** — which of a block's versions the current store
//!   receives at destage: the newest, or every one the cache let go
//!   (SplitDownStream).

use rewind_types::Layout;

/// When a version enters the version index, and what history keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Indexing {
    /// As it is written; the journal holds it until it is archived.
    AtWrite,
    /// As it leaves the overlay, from `source`.
    AtDestage(HistorySource),
}

/// What history receives as versions leave the overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistorySource {
    /// Each version the cache lets go that the granularity keeps.
    VersionsLetGo,
    /// The version in the current store, copied before it is overwritten
    /// if the granularity keeps it (copy-on-write).
    CurrentVersion,
}

/// When the overlay is destaged into the current store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destage {
    /// There is no current store: the present is read through the index.
    Never,
    /// Every durable version, as soon as maintenance gets to it.
    Continuously,
    /// Only the blocks the controller cache lets go — the least recently
    /// written beyond its dirty limit — so overwrites of the others are
    /// absorbed.
    ControllerCache,
    /// At snapshots: each window end and each bookmark.
    AtSnapshots,
}

/// Which versions of a block the current store receives at destage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentWrites {
    Newest,
    /// Every version the cache let go, in order, then the newest.
    EveryVersionLetGo,
}

/// A layout's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutRules {
    pub indexing: Indexing,
    pub destage: Destage,
    pub current_writes: CurrentWrites,
}

impl LayoutRules {
    pub const fn of(layout: Layout) -> LayoutRules {
        use CurrentWrites::*;
        use Destage::*;
        use HistorySource::*;
        use Indexing::*;
        let (indexing, destage, current_writes) = match layout {
            Layout::Journaled => (AtWrite, Continuously, Newest),
            Layout::Logging => (AtWrite, Never, Newest),
            Layout::SplitStream => (AtDestage(VersionsLetGo), ControllerCache, Newest),
            Layout::SplitDownStream => (AtDestage(VersionsLetGo), ControllerCache, EveryVersionLetGo),
            Layout::Checkpointing => (AtDestage(CurrentVersion), ControllerCache, Newest),
            Layout::Cow => (AtDestage(CurrentVersion), Continuously, Newest),
            Layout::Row => (AtWrite, AtSnapshots, Newest),
        };
        LayoutRules { indexing, destage, current_writes }
    }

    /// Whether the layout keeps the present in a current store.
    pub fn has_current_store(self) -> bool {
        self.destage != Destage::Never
    }

    /// Whether history is filed as versions leave the overlay.
    pub fn history_at_destage(self) -> bool {
        matches!(self.indexing, Indexing::AtDestage(_))
    }

    /// Whether the version in the current store is copied to history before
    /// it is overwritten.
    pub fn copies_current_version(self) -> bool {
        self.indexing == Indexing::AtDestage(HistorySource::CurrentVersion)
    }

    /// Whether the overlay keeps, per block, only its newest durable version
    /// and the ones after it: history is filed as it is written (the
    /// superseded versions live on in the index), and the destager writes
    /// only the newest, continuously. Overwrites are then absorbed in memory
    /// and count once against the overlay's budget, as blocks rather than
    /// versions. ROW merges at snapshots and the layouts that file history
    /// at destage need every version until it leaves.
    pub fn overlay_absorbs_overwrites(self) -> bool {
        self.indexing == Indexing::AtWrite && self.destage == Destage::Continuously
    }

    pub fn has_controller_cache(self) -> bool {
        self.destage == Destage::ControllerCache
    }

    /// Whether the overlay is destaged only at snapshots.
    pub fn destages_at_snapshots(self) -> bool {
        self.destage == Destage::AtSnapshots
    }

    /// The names of the layouts whose rules satisfy `rule`, for messages.
    pub fn names_where(rule: fn(LayoutRules) -> bool) -> String {
        let names: Vec<&str> =
            Layout::ALL.into_iter().filter(|&layout| rule(LayoutRules::of(layout))).map(Layout::name).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_that_needs_a_current_store_has_one() {
        for layout in Layout::ALL {
            let rules = LayoutRules::of(layout);
            if rules.history_at_destage() || rules.current_writes == CurrentWrites::EveryVersionLetGo {
                assert!(rules.has_current_store(), "{}: history at destage needs something to destage", layout.name());
            }
            if rules.current_writes == CurrentWrites::EveryVersionLetGo {
                assert!(rules.has_controller_cache(), "{}: only a cache lets versions go", layout.name());
            }
        }
    }

    #[test]
    fn the_controller_cache_layouts_are_named_for_messages() {
        assert_eq!(
            LayoutRules::names_where(LayoutRules::has_controller_cache),
            "split-stream, split-down-stream, checkpointing"
        );
    }
}
