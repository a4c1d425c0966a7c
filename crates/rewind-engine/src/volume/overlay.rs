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
//! Such an overlay also keeps the order its versions came in (`recency`),
//! and every pass takes its blocks from the front a part at a time
//! (`plan_front`), so planning a part costs the part, not a look at every
//! block: a pass plans with the write lock held, and at 2^20 blocks that
//! look took 70–200 ms, every writer waiting.
//!
//! Invariants, asserted where they could break: a block's versions are in
//! strictly increasing LSN order and never empty; only the destager removes
//! versions, and overwrites absorbed; what the destager retires is what it
//! applied, which is still there unless a newer durable version absorbed
//! it; a block the cache has let go is in the overlay; the count of versions
//! is the sum over blocks.

use std::collections::VecDeque;

use rewind_cache::ControllerCache;
use rewind_types::block_hash::BlockMap;
use rewind_types::{Lsn, Version};
use rustc_hash::FxHashSet;
use smallvec::SmallVec;

use super::Pending;

pub(crate) struct Overlay {
    /// Keyed so that a large write's blocks take neighbouring slots
    /// (`NeighbourHasher`).
    blocks: BlockMap<SmallVec<[Pending; 1]>>,
    /// The controller cache of the layouts with one: its dirty pages are
    /// the overlay's blocks, and...
    cache: Option<ControllerCache<()>>,
    /// ...the blocks it has let go, for the destager.
    let_go: FxHashSet<u64>,
    versions: usize,
    /// Whether overwrites are absorbed (see the module documentation).
    absorbs: bool,
    /// Where overwrites are absorbed: every version pushed, as its LSN and
    /// block, in LSN order, so the front is the least recently written.
    /// An entry whose version has left (destaged, or absorbed by a newer
    /// one) stays until a slice passes it or the queue is compacted.
    recency: VecDeque<(Lsn, u64)>,
}

/// The most blocks a part of a sweep (`Overlay::plan_sweep`) looks at per
/// block it may take: a pass sweeps only an overlay that holds one block
/// in eight of the volume or more.
pub(crate) const SWEEP_LOOKS_PER_BLOCK: u64 = 16;

/// Which blocks a destage pass takes from the overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// Every block with a durable version.
    Durable,
    /// The blocks the controller cache has let go.
    LetGo,
    /// At most `count` of the blocks not rewritten since `cut`, those
    /// written least recently: with a checkpoint's cut, what it leaves
    /// behind is a hot set (see `Volume::checkpoint_leaving`); a part at a
    /// time, a pass that small reads may stop (`Volume::destage_unless_read`).
    NotRewrittenSince { cut: Lsn, count: usize },
    /// At most this many blocks, those written least recently: a slice, so
    /// that a pass a writer waits for (backpressure) stays short.
    Oldest(usize),
}

/// What a destage pass takes from the overlay (see [`Overlay::plan_destage`], [`Overlay::plan_front`]).
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
    /// An overlay holding `pending` (recovered, in LSN order: durable),
    /// with room for `blocks_max` blocks made now. A table grows by moving
    /// every entry, under the volume's write lock that every writer waits
    /// for: growing past half a million blocks took tens of milliseconds.
    /// The room is reserved address space; its pages are touched as blocks
    /// arrive (at random, most of them after a few tens of thousands of
    /// blocks), so a volume that has written that many holds the memory a
    /// burst to the overlay's limit would have left it anyway.
    pub(crate) fn new(
        cache: Option<ControllerCache<()>>,
        pending: Vec<Pending>,
        absorbs: bool,
        blocks_max: usize,
    ) -> Overlay {
        assert!(!(absorbs && cache.is_some()), "a controller cache decides what it absorbs");
        let mut overlay = Overlay {
            blocks: BlockMap::with_capacity_and_hasher(blocks_max, Default::default()),
            cache,
            let_go: FxHashSet::default(),
            versions: 0,
            absorbs,
            recency: VecDeque::with_capacity(if absorbs { Overlay::recency_max(blocks_max) } else { 0 }),
        };
        for entry in pending {
            overlay.push(entry, entry.lsn);
        }
        overlay
    }

    pub(crate) fn versions(&self) -> usize {
        self.versions
    }

    /// What the overlay holds against its budget (`overlay_versions_max`):
    /// its blocks where it absorbs overwrites, its versions elsewhere. An
    /// absorbing overlay drops a version only once a newer one is durable
    /// when it arrives, so a block rewritten in a loop keeps two (the one
    /// before the last commit and the one after): counted as versions, a
    /// volume of half the budget's blocks filled it to half, where a burst
    /// stops waiting and destages slices of blocks about to be rewritten.
    pub(crate) fn held(&self) -> usize {
        match self.absorbs {
            true => self.blocks.len(),
            false => self.versions,
        }
    }

    /// Whether a version at or before `lsn` is still here. It looks at
    /// every block: for a checkpoint, one every gigabyte of journal or so.
    pub(crate) fn holds_through(&mut self, lsn: Lsn) -> bool {
        if !self.absorbs {
            return self.blocks.values().any(|entries| entries[0].lsn <= lsn);
        }
        self.oldest().is_some_and(|oldest| oldest.lsn <= lsn)
    }

    /// The oldest version here, where overwrites are absorbed: the first
    /// entry of `recency` whose version is still here (no pass is under
    /// way: see `requeue`). The entries before it are dropped.
    pub(crate) fn oldest(&mut self) -> Option<Pending> {
        assert!(self.absorbs, "only an absorbing overlay keeps its order");
        while let Some(&(oldest, block)) = self.recency.front() {
            let still_here =
                self.blocks.get(&block).and_then(|entries| entries.iter().find(|entry| entry.lsn == oldest));
            if let Some(&pending) = still_here {
                return Some(pending);
            }
            self.recency.pop_front();
        }
        None
    }

    /// Blocks with versions here.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The lowest block of `first..end` with versions here: a look at each
    /// of those blocks or at every block held, whichever are fewer.
    pub(crate) fn first_block_in(&self, first: u64, end: u64) -> Option<u64> {
        match end.saturating_sub(first) <= self.blocks.len() as u64 {
            true => (first..end).find(|block| self.blocks.contains_key(block)),
            false => self.blocks.keys().copied().filter(|held| (first..end).contains(held)).min(),
        }
    }

    /// The first block from `block` on, up to `limit`, without versions
    /// here: where the stretch held from `block` ends.
    pub(crate) fn held_until(&self, block: u64, limit: u64) -> u64 {
        (block..limit).find(|held| !self.blocks.contains_key(held)).unwrap_or(limit)
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
            if let Some(&(last, _)) = self.recency.back() {
                assert!(last <= entry.lsn, "versions come to the overlay in LSN order");
            }
            self.recency.push_back((entry.lsn, entry.version.block.0));
            if self.recency.len() >= Overlay::recency_max(self.versions) {
                self.compact_recency();
            }
        }
    }

    /// How long `recency` grows with `versions` here before it is compacted.
    fn recency_max(versions: usize) -> usize {
        2 * versions + 1024
    }

    /// Drops the entries of `recency` whose versions have left: at most
    /// once per as many pushes as there are versions, so pushes stay O(1).
    fn compact_recency(&mut self) {
        let blocks = &self.blocks;
        self.recency.retain(|&(lsn, block)| {
            blocks.get(&block).is_some_and(|entries| entries.iter().any(|entry| entry.lsn == lsn))
        });
    }

    /// At most `count` blocks whose newest durable version (through
    /// `lsn_durable`) is the oldest, up to `bound` (at most `lsn_durable`),
    /// from the front of `recency`: the entries it passes are taken or have
    /// left, so every durable version before the first one it leaves behind
    /// (or through `bound`, when it took all there were) leaves or is
    /// superseded — a pass part by part, a checkpoint's among them. A pass
    /// that fails before it retires what it took puts it back (`requeue`).
    pub(crate) fn plan_front(&mut self, lsn_durable: Lsn, bound: Lsn, count: usize) -> DestagePlan {
        assert!(self.absorbs, "only an overlay that absorbs overwrites leaves blocks behind");
        assert!(count > 0, "a part takes a block at least");
        assert!(bound <= lsn_durable, "only durable versions leave");
        let mut newest = Vec::with_capacity(count.min(self.blocks.len()));
        let through = loop {
            let Some(&(lsn, block)) = self.recency.front() else { break bound };
            if lsn > bound {
                break bound;
            }
            // A block left behind may keep a superseded version no longer.
            let newest_durable = self.blocks.get_mut(&block).map(|entries| {
                self.versions -= absorb(entries, lsn_durable);
                entries[0]
            });
            match newest_durable {
                Some(pending) if pending.lsn == lsn => {
                    if newest.len() == count {
                        break Lsn(lsn.0 - 1);
                    }
                    newest.push(pending);
                }
                // Destaged, or absorbed by a newer durable version.
                _ => {}
            }
            self.recency.pop_front();
        };
        newest.sort_unstable_by_key(|pending| pending.version.block);
        DestagePlan { newest, chains: Vec::new(), through: Some(through) }
    }

    /// Puts the entries of `planned` (taken by `plan_front`) whose versions
    /// are still here back at the front of `recency`: a pass that failed
    /// (a full disk) retired only some, and the rest must stay where the
    /// next pass, and a checkpoint's `holds_through`, find them.
    /// At most `count` blocks whose newest durable version (through
    /// `lsn_durable`) is at or before `bound`, in block
    /// order from `*next` on, wrapping at `blocks_total`; it looks at
    /// `SWEEP_LOOKS_PER_BLOCK` blocks per block it may take at most, and
    /// leaves `*next` where the next part goes on. Unlike a part from the
    /// front, it says nothing of what is left behind (`through` is `None`):
    /// the pass asks `holds_through` once it has retired the part; and it
    /// takes nothing out of `recency`, so a pass that fails has nothing to
    /// put back.
    pub(crate) fn plan_sweep(
        &mut self,
        (lsn_durable, bound): (Lsn, Lsn),
        count: usize,
        (next, blocks_total): (&mut u64, u64),
    ) -> DestagePlan {
        assert!(self.absorbs, "only an overlay that absorbs overwrites leaves blocks behind");
        assert!(bound <= lsn_durable, "only durable versions leave");
        assert!(*next < blocks_total, "the sweep goes on inside the volume");
        let looks = (count as u64).saturating_mul(SWEEP_LOOKS_PER_BLOCK).min(blocks_total);
        let mut newest = Vec::with_capacity(count.min(self.blocks.len()));
        for _ in 0..looks {
            if newest.len() == count {
                break;
            }
            let block = *next;
            *next = (block + 1) % blocks_total;
            let Some(entries) = self.blocks.get_mut(&block) else { continue };
            self.versions -= absorb(entries, lsn_durable);
            // The newest durable version, if the block has one.
            let first = entries[0];
            if first.lsn <= bound {
                newest.push(first);
            }
        }
        newest.sort_unstable_by_key(|pending| pending.version.block);
        DestagePlan { newest, chains: Vec::new(), through: None }
    }

    pub(crate) fn requeue(&mut self, planned: &[Pending]) {
        let mut left: Vec<(Lsn, u64)> = planned
            .iter()
            .filter(|pending| {
                let block = pending.version.block.0;
                self.blocks.get(&block).is_some_and(|entries| entries.iter().any(|entry| entry.lsn == pending.lsn))
            })
            .map(|pending| (pending.lsn, pending.version.block.0))
            .collect();
        left.sort_unstable();
        for &entry in left.iter().rev() {
            if let Some(&front) = self.recency.front() {
                assert!(entry.0 <= front.0, "a part is taken from the front: what it took is older");
            }
            self.recency.push_front(entry);
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
    /// `lsn_durable`, where overwrites are not absorbed: every block with
    /// one, or those the controller cache let go ([`Leaving::LetGo`]).
    /// Unless only those leave, the cache is clean again.
    pub(crate) fn plan_destage(&mut self, lsn_durable: Lsn, leaving: Leaving, with_chains: bool) -> DestagePlan {
        assert!(!self.absorbs, "an overlay that absorbs overwrites is planned from its front (`plan_front`)");
        let cached_only = match leaving {
            Leaving::Durable => false,
            Leaving::LetGo => true,
            Leaving::NotRewrittenSince { .. } | Leaving::Oldest(_) => {
                unreachable!("only an overlay that absorbs overwrites leaves blocks behind")
            }
        };
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
            .collect();
        let mut chains: Vec<Vec<Pending>> = match with_chains {
            true => blocks
                .iter()
                .map(|entries| entries.iter().take_while(|entry| entry.lsn <= lsn_durable).copied().collect())
                .filter(|chain: &Vec<Pending>| !chain.is_empty())
                .collect(),
            false => Vec::new(),
        };
        let through = match cached_only {
            true => None,
            false => Some(lsn_durable),
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
        if self.blocks.is_empty() {
            self.recency.clear();
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

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rewind_types::{BlockIndex, Timestamp, VersionData};

    use super::*;

    /// A version of `block` written at LSN `lsn` (its time too), in the journal.
    fn written(block: u64, lsn: u64) -> Version {
        Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(lsn),
            data: VersionData::Journal { segment: 0, offset: 0 },
            crc32c: 0,
        }
    }

    /// Per block, its newest version through `lsn_durable`, as the
    /// overlay's blocks hold them.
    fn newest_durable(overlay: &Overlay, lsn_durable: Lsn) -> Vec<Pending> {
        let newest = overlay.blocks.values().filter_map(|entries| entries.iter().rev().find(|e| e.lsn <= lsn_durable));
        newest.copied().collect()
    }

    /// The first block held in a range, and the end of a stretch held,
    /// are the same whether the range is probed block by block or the
    /// blocks held are scanned.
    #[test]
    fn the_first_block_held_in_a_range_is_found_either_way() {
        let seed = 11;
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut overlay = Overlay::new(None, Vec::new(), false, 1024);
        let held: Vec<u64> = (0..200).map(|_| rng.random_range(0..10_000)).collect();
        for (lsn, &block) in (1..).zip(&held) {
            overlay.record(Lsn(lsn), &[written(block, lsn)], true, Lsn(lsn));
        }
        for _ in 0..1000 {
            let first = rng.random_range(0..10_100);
            // Ranges shorter and longer than the 200 or fewer blocks held.
            let longest = if rng.random_bool(0.5) { 100 } else { 20_000 };
            let end = first + rng.random_range(0..longest);
            let expected = held.iter().copied().filter(|block| (first..end).contains(block)).min();
            assert_eq!(overlay.first_block_in(first, end), expected, "seed {seed}: {first}..{end}");
            let until = overlay.held_until(first, end);
            assert!((first..until).all(|block| held.contains(&block)), "seed {seed}: held from {first} to {until}");
            assert!(until == end || !held.contains(&until), "seed {seed}: the stretch from {first} goes on at {until}");
        }
    }

    /// The table and the recency queue never grow while writes fill the
    /// room made at opening: a growth moves every entry under the volume's
    /// write lock, which every writer then waits for. Overwrites of the
    /// blocks (absorbed) in two more rounds keep it so.
    #[test]
    fn an_overlay_holds_its_most_blocks_without_growing() {
        let blocks_max = 50_000;
        let mut overlay = Overlay::new(None, Vec::new(), true, blocks_max);
        let (table, queue) = (overlay.blocks.capacity(), overlay.recency.capacity());
        assert!(table >= blocks_max && queue >= Overlay::recency_max(blocks_max), "room: {table}, {queue}");
        let mut lsn = 0;
        for _round in 0..3 {
            for block in 0..blocks_max as u64 {
                lsn += 1;
                overlay.record(Lsn(lsn), &[written(block, lsn)], true, Lsn(lsn));
            }
        }
        assert_eq!(overlay.versions(), blocks_max);
        assert_eq!(overlay.blocks.capacity(), table, "the table grew");
        assert_eq!(overlay.recency.capacity(), queue, "the recency queue grew");
    }

    /// A volume rewritten in a loop, each round committed only after the
    /// next began (a commit every 50 ms under sustained writes): every block
    /// keeps two versions, the one before the commit and the one after, and
    /// what the absorbing overlay holds against its budget is its blocks.
    /// One that does not absorb holds every version.
    #[test]
    fn an_absorbing_overlay_holds_its_blocks_against_the_budget() {
        const BLOCKS: u64 = 1000;
        let mut absorbing = Overlay::new(None, Vec::new(), true, BLOCKS as usize);
        let mut keeping = Overlay::new(None, Vec::new(), false, BLOCKS as usize);
        let (mut lsn, mut lsn_durable) = (0, Lsn::ZERO);
        for _round in 0..4 {
            for block in 0..BLOCKS {
                lsn += 1;
                absorbing.record(Lsn(lsn), &[written(block, lsn)], true, lsn_durable);
                keeping.record(Lsn(lsn), &[written(block, lsn)], true, lsn_durable);
            }
            // Committed by the time the next round rewrites it.
            lsn_durable = Lsn(lsn);
        }
        assert_eq!(absorbing.versions(), 2 * BLOCKS as usize, "the newest durable version and the one after");
        assert_eq!(absorbing.held(), BLOCKS as usize);
        assert_eq!(keeping.held(), 4 * BLOCKS as usize);
        assert_eq!(keeping.held(), keeping.versions());
    }

    /// A part taken from the front of the recency queue is the one a look
    /// at every block would take: of the blocks whose newest durable
    /// version is at or before the bound (`lsn_durable`, or a checkpoint's
    /// cut), the `count` oldest, each its block's newest durable one, and
    /// the LSN through which every durable version leaves or is superseded
    /// — through writes of several blocks at one LSN, versions not yet
    /// durable, parts that fail and are put back (`requeue`), and
    /// compactions; and `holds_through` answers as a look at every block.
    #[test]
    fn a_part_from_the_recency_queue_is_the_oldest_blocks_a_full_look_would_take() {
        for seed in 0..20u64 {
            println!("seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed);
            let mut overlay = Overlay::new(None, Vec::new(), true, 1024);
            let (mut lsn_next, mut lsn_durable) = (1u64, Lsn::ZERO);
            let blocks = rng.random_range(8..200u64);
            for step in 0..20_000 {
                match rng.random_range(0..100) {
                    0..78 => {
                        let (first, count) = (rng.random_range(0..blocks), rng.random_range(1..4u64));
                        let versions: Vec<Version> =
                            (first..(first + count).min(blocks)).map(|block| written(block, lsn_next)).collect();
                        overlay.record(Lsn(lsn_next), &versions, true, lsn_durable);
                        lsn_next += 1;
                    }
                    78..88 => lsn_durable = Lsn(rng.random_range(lsn_durable.0..lsn_next)),
                    88..96 => {
                        let lsn = Lsn(rng.random_range(0..lsn_next));
                        let expected = overlay.blocks.values().any(|entries| entries[0].lsn <= lsn);
                        assert_eq!(overlay.holds_through(lsn), expected, "seed {seed} step {step}");
                    }
                    _ => {
                        let bound = match rng.random_bool(0.5) {
                            true => lsn_durable,
                            false => Lsn(rng.random_range(0..=lsn_durable.0)),
                        };
                        let count = match rng.random_bool(0.2) {
                            true => usize::MAX,
                            false => rng.random_range(1..=blocks as usize),
                        };
                        let mut expected: Vec<Pending> =
                            newest_durable(&overlay, lsn_durable).into_iter().filter(|n| n.lsn <= bound).collect();
                        expected.sort_unstable_by_key(|pending| pending.lsn);
                        let through = match expected.get(count) {
                            Some(first_staying) => Lsn(first_staying.lsn.0 - 1),
                            None => bound,
                        };
                        expected.truncate(count);
                        let plan = overlay.plan_front(lsn_durable, bound, count);
                        assert_eq!(plan.through, Some(through), "seed {seed} step {step}");
                        let lsns = |pendings: &[Pending]| {
                            let mut lsns: Vec<Lsn> = pendings.iter().map(|pending| pending.lsn).collect();
                            lsns.sort_unstable();
                            lsns
                        };
                        assert_eq!(lsns(&plan.newest), lsns(&expected), "seed {seed} step {step}");
                        let newest = newest_durable(&overlay, lsn_durable);
                        for taken in &plan.newest {
                            let is_newest =
                                newest.iter().any(|n| n.lsn == taken.lsn && n.version.block == taken.version.block);
                            assert!(is_newest, "seed {seed} step {step}: {taken:?} is its block's newest");
                        }
                        // A part that fails after retiring some of what it took.
                        let retired = match rng.random_bool(0.2) {
                            true => rng.random_range(0..=plan.newest.len()),
                            false => plan.newest.len(),
                        };
                        overlay.retire(&plan.newest[..retired]);
                        overlay.requeue(&plan.newest[retired..]);
                    }
                }
                assert!(overlay.recency.len() <= 2 * overlay.versions + 1024, "seed {seed} step {step}: compacted");
            }
        }
    }

    #[test]
    fn a_sweep_takes_the_blocks_in_order_from_where_it_left_off_and_a_whole_one_leaves_nothing_behind() {
        for seed in 0..20u64 {
            println!("seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed);
            let mut overlay = Overlay::new(None, Vec::new(), true, 1024);
            let (mut lsn_next, mut lsn_durable) = (1u64, Lsn::ZERO);
            let blocks_total = rng.random_range(8..300u64);
            let mut next = rng.random_range(0..blocks_total);
            for step in 0..5_000 {
                match rng.random_range(0..100) {
                    0..80 => {
                        let block = rng.random_range(0..blocks_total);
                        overlay.record(Lsn(lsn_next), &[written(block, lsn_next)], true, lsn_durable);
                        lsn_next += 1;
                    }
                    80..90 => lsn_durable = Lsn(rng.random_range(lsn_durable.0..lsn_next)),
                    _ => {
                        let bound = Lsn(rng.random_range(0..=lsn_durable.0));
                        let whole = rng.random_bool(0.3);
                        let count = if whole { usize::MAX } else { rng.random_range(1..=blocks_total as usize) };
                        // What a look at each block in turn from `next` takes.
                        let newest = newest_durable(&overlay, lsn_durable);
                        let mut expected = Vec::new();
                        let mut expected_next = next;
                        let looks = (count as u64).saturating_mul(SWEEP_LOOKS_PER_BLOCK).min(blocks_total);
                        for _ in 0..looks {
                            if expected.len() == count {
                                break;
                            }
                            let block = expected_next;
                            expected_next = (block + 1) % blocks_total;
                            let found = newest.iter().find(|pending| pending.version.block.0 == block);
                            if let Some(&pending) = found.filter(|pending| pending.lsn <= bound) {
                                expected.push(pending);
                            }
                        }
                        expected.sort_unstable_by_key(|pending| pending.version.block);
                        let plan = overlay.plan_sweep((lsn_durable, bound), count, (&mut next, blocks_total));
                        assert_eq!(plan.through, None, "seed {seed} step {step}");
                        assert_eq!(next, expected_next, "seed {seed} step {step}: where the sweep goes on");
                        let keys = |pendings: &[Pending]| -> Vec<(u64, Lsn)> {
                            pendings.iter().map(|pending| (pending.version.block.0, pending.lsn)).collect()
                        };
                        assert_eq!(keys(&plan.newest), keys(&expected), "seed {seed} step {step}");
                        overlay.retire(&plan.newest);
                        if whole {
                            assert!(!overlay.holds_through(bound), "seed {seed} step {step}: a whole sweep left some");
                        }
                    }
                }
            }
        }
    }
}
