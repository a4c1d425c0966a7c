//! The overlay: per block, its versions not yet in the current store, oldest
//! first — the papers' cache, whose contents are journal records (durable,
//! or about to be). In the layouts with a controller cache, the cache is fed
//! every block written and decides which blocks may leave (`let_go`); in the
//! others every durable version may.
//!
//! In the layouts whose overlay absorbs overwrites
//! (`LayoutRules::overlay_absorbs_overwrites`: history is filed as it is
//! written, the destager writes only the newest), a block keeps only its
//! newest durable version and the ones after it: a durable version a newer
//! durable one supersedes is dropped as the newer arrives. The destager
//! never needed it, and a read of the past finds it in the index.
//!
//! Invariants, asserted where they could break: a block's versions are in
//! strictly increasing LSN order and never empty; only the destager removes
//! versions, and overwrites absorbed; what the destager retires is what it
//! applied, which is still there unless a newer durable version absorbed
//! it; a block the cache has let go is in the overlay; the count of versions
//! is the sum over blocks.

use rewind_cache::ControllerCache;
use rewind_types::{Lsn, Version};
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;

use super::Pending;

pub(crate) struct Overlay {
    blocks: FxHashMap<u64, SmallVec<[Pending; 1]>>,
    /// The controller cache of the layouts with one: its dirty pages are
    /// the overlay's blocks, and...
    cache: Option<ControllerCache<()>>,
    /// ...the blocks it has let go, for the destager.
    let_go: FxHashSet<u64>,
    versions: usize,
    /// Whether overwrites are absorbed (see the module documentation).
    absorbs: bool,
}

/// Which blocks a destage pass takes from the overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// Every block with a durable version.
    Durable,
    /// The blocks the controller cache has let go.
    LetGo,
    /// The blocks not rewritten since this LSN: a checkpoint's cut, which
    /// leaves a hot set in the overlay (see `Volume::checkpoint_leaving`).
    NotRewrittenSince(Lsn),
    /// At most this many blocks, those written least recently: a slice, so
    /// that a pass a writer waits for (backpressure) stays short.
    Oldest(usize),
}

/// What a destage pass takes from the overlay (see [`Overlay::plan_destage`]).
pub(crate) struct DestagePlan {
    /// Per block leaving, its newest durable version, sorted by block.
    pub newest: Vec<Pending>,
    /// Per block leaving, every durable version, oldest first; the chains
    /// sorted by their block. Only when history is filed at destage.
    pub chains: Vec<Vec<Pending>>,
    /// Every durable version up to this LSN leaves, or is superseded by a
    /// durable one that stays (none: only what the cache let go leaves).
    pub through: Option<Lsn>,
}

/// Drops the versions of a block that its newest durable one (through
/// `lsn_durable`) supersedes; returns how many.
fn absorb(entries: &mut SmallVec<[Pending; 1]>, lsn_durable: Lsn) -> usize {
    let newest_durable = entries.iter().rposition(|entry| entry.lsn <= lsn_durable).unwrap_or(0);
    entries.drain(..newest_durable);
    newest_durable
}

impl Overlay {
    /// An overlay holding `pending` (recovered, in LSN order: durable).
    pub(crate) fn new(cache: Option<ControllerCache<()>>, pending: Vec<Pending>, absorbs: bool) -> Overlay {
        assert!(!(absorbs && cache.is_some()), "a controller cache decides what it absorbs");
        let mut overlay =
            Overlay { blocks: FxHashMap::default(), cache, let_go: FxHashSet::default(), versions: 0, absorbs };
        for entry in pending {
            overlay.push(entry, entry.lsn);
        }
        overlay
    }

    pub(crate) fn versions(&self) -> usize {
        self.versions
    }

    /// Whether a version at or before `lsn` is still here. It looks at
    /// every block: for a checkpoint, one every gigabyte of journal or so.
    pub(crate) fn holds_through(&self, lsn: Lsn) -> bool {
        self.blocks.values().any(|entries| entries[0].lsn <= lsn)
    }

    /// The versions of `block` not yet destaged, oldest first.
    pub(crate) fn get(&self, block: u64) -> Option<&[Pending]> {
        self.blocks.get(&block).map(|entries| entries.as_slice())
    }

    /// Adds `entry`; every record up to `lsn_durable` is durable.
    fn push(&mut self, entry: Pending, lsn_durable: Lsn) {
        let entries = self.blocks.entry(entry.version.block.0).or_default();
        if let Some(last) = entries.last() {
            assert!(last.lsn < entry.lsn, "overlay versions of block {} in LSN order", entry.version.block.0);
        }
        entries.push(entry);
        self.versions += 1;
        if self.absorbs {
            // Keeps the newest durable version: the destager may apply
            // only a durable one, and a checkpoint counts on every durable
            // record being in the current store or superseded there.
            self.versions -= absorb(entries, lsn_durable);
        }
    }

    /// Absorbs, in every block, the versions a durable one (through
    /// `lsn_durable`) supersedes: `push` absorbs only as a block is
    /// written again, and a block left behind stays for a while.
    fn absorb_durable(&mut self, lsn_durable: Lsn) {
        for entries in self.blocks.values_mut() {
            self.versions -= absorb(entries, lsn_durable);
        }
    }

    /// Takes in the versions of record `lsn`; `to_current` says whether the
    /// layout destages them (one with a current store), `lsn_durable` up
    /// to where records are durable.
    pub(crate) fn record(&mut self, lsn: Lsn, versions: &[Version], to_current: bool, lsn_durable: Lsn) {
        if to_current {
            for version in versions {
                self.push(Pending { lsn, version: *version }, lsn_durable);
            }
        }
        if let Some(cache) = &mut self.cache {
            assert!(to_current, "a controller cache destages into a current store");
            for version in versions {
                let block = version.block.0;
                let outcome = cache.write(block, ());
                // Dirty again: what it was let go with is superseded here.
                self.let_go.remove(&block);
                self.let_go.extend(outcome.destaged.iter().map(|&(destaged, ())| destaged));
            }
        }
    }

    /// What leaves in a destage pass of the versions durable through
    /// `lsn_durable`: the blocks `leaving` names (with
    /// [`Leaving::NotRewrittenSince`], those whose newest durable version
    /// is at or before its LSN; a block rewritten since is left whole).
    /// Unless only the blocks the controller cache let go leave, the cache
    /// is clean again.
    pub(crate) fn plan_destage(&mut self, lsn_durable: Lsn, leaving: Leaving, with_chains: bool) -> DestagePlan {
        let cached_only = leaving == Leaving::LetGo;
        let cut = match leaving {
            Leaving::NotRewrittenSince(cut) => cut.min(lsn_durable),
            Leaving::Durable | Leaving::LetGo | Leaving::Oldest(_) => lsn_durable,
        };
        if let Leaving::NotRewrittenSince(_) | Leaving::Oldest(_) = leaving {
            // A block left behind may keep a superseded version no longer.
            assert!(self.absorbs && !with_chains, "only an overlay that absorbs overwrites leaves blocks behind");
            self.absorb_durable(lsn_durable);
        }
        if !cached_only {
            if let Some(cache) = &mut self.cache {
                cache.flush();
            }
            self.let_go.clear();
        }
        let blocks: Vec<&SmallVec<[Pending; 1]>> = match cached_only {
            true => self
                .let_go
                .iter()
                .map(|block| self.blocks.get(block).expect("a block the cache let go is in the overlay"))
                .collect(),
            false => self.blocks.values().collect(),
        };
        let mut newest: Vec<Pending> = blocks
            .iter()
            .filter_map(|entries| entries.iter().rev().find(|entry| entry.lsn <= lsn_durable).copied())
            .filter(|newest_durable| newest_durable.lsn <= cut)
            .collect();
        let mut chains: Vec<Vec<Pending>> = match with_chains {
            true => blocks
                .iter()
                .map(|entries| entries.iter().take_while(|entry| entry.lsn <= lsn_durable).copied().collect())
                .filter(|chain: &Vec<Pending>| !chain.is_empty())
                .collect(),
            false => Vec::new(),
        };
        let through = match leaving {
            Leaving::LetGo => None,
            Leaving::Oldest(count) if newest.len() > count => {
                // The `count` oldest, and every block as old as the one
                // after them has a version that stays.
                assert!(count > 0, "a slice takes a block at least");
                newest.select_nth_unstable_by_key(count, |pending| pending.lsn);
                let first_staying = newest[count].lsn;
                newest.truncate(count);
                Some(Lsn(first_staying.0 - 1))
            }
            _ => Some(cut),
        };
        newest.sort_unstable_by_key(|pending| pending.version.block);
        chains.sort_unstable_by_key(|chain| chain[0].version.block);
        DestagePlan { newest, chains, through }
    }

    /// Removes, per block of `applied` (each the newest version of its
    /// block a destage pass wrote to the current store), that version and
    /// the ones before it. Returns how many versions left.
    pub(crate) fn retire(&mut self, applied: &[Pending]) -> usize {
        let mut retired = 0;
        for applied in applied {
            let block = applied.version.block.0;
            let entries = self.blocks.get_mut(&block).expect("only the destager removes a block's last entry");
            let keep_from = entries.iter().position(|entry| entry.lsn > applied.lsn).unwrap_or(entries.len());
            assert!(
                (keep_from > 0 && entries[keep_from - 1].lsn == applied.lsn) || (keep_from == 0 && self.absorbs),
                "block {block}: the version destaged (LSN {}) is still in the overlay, or a newer one absorbed it",
                applied.lsn
            );
            retired += keep_from;
            entries.drain(..keep_from);
            if entries.is_empty() {
                self.blocks.remove(&block);
                self.let_go.remove(&block);
            }
        }
        self.versions -= retired;
        self.check_count();
        retired
    }

    /// The count against the blocks: in debug builds, while the overlay is
    /// small enough for a full count to cost nothing noticeable.
    fn check_count(&self) {
        if cfg!(debug_assertions) && self.blocks.len() <= 4096 {
            let counted: usize = self.blocks.values().map(SmallVec::len).sum();
            assert_eq!(counted, self.versions, "overlay versions counted");
        }
    }
}
