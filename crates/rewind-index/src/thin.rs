//! Thinning: protection granularity (IBM §3.1). With a granularity `g`, only
//! the last version of a block in each window `[k·g, (k+1)·g)` of Unix time is
//! history; the versions it supersedes are dropped when a memtable is
//! persisted or runs are merged. Every window end stays an exact point in
//! time, and so does every *pin* (a bookmark, the volume's creation): a
//! version that is a block's newest at or before a pin is kept.
//!
//! A *deleted range* `[from, to]` (MYCDP's version delete, seed 004 §3.3.3)
//! keeps, per block, only the last version inside it: every time before
//! `from` and from `to` on reads exactly as before; times in `[from, to)` are
//! gone.
//!
//! *Retention* (seed 002 §3.1 applied with age) coarsens older history:
//! tiers of longer windows, each applying to windows that end before a time
//! (its age ago); windows nest, so a version only ever moves to coarser
//! windows as it ages, and thinning more later never contradicts thinning
//! done earlier. Before the *horizon* each block keeps only its last version
//! (the base), like a deleted range from the beginning of time.
//!
//! Dropping needs only the next version of the same block, which a stream
//! sorted by `(block, time)` delivers right after it. A merge sees a subset
//! of a block's versions; whatever it finds later in the same window
//! supersedes, so merging in any grouping converges to the same history.

use rewind_types::{Timestamp, Version, VersionData};

use crate::{IndexError, ReleaseHook};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Thinning {
    /// Window length in nanoseconds; 0 keeps every version.
    pub granularity_nanos: u64,
    /// Coarser windows for older history: `(interval, until)` applies to
    /// every window of `interval` that ends at or before `until`; the
    /// coarsest that applies wins. Any two intervals (and the granularity)
    /// divide one another, so windows nest.
    pub tiers: Vec<(u64, Timestamp)>,
    /// Before this time each block keeps only its last version at or before
    /// it. A window end of every interval, so no window straddles it.
    pub horizon: Option<Timestamp>,
    /// Times whose state must stay exact, sorted.
    pub pins: Vec<Timestamp>,
    /// Deleted ranges `[from, to]`, sorted and disjoint.
    pub deleted: Vec<(Timestamp, Timestamp)>,
}

impl Thinning {
    /// Whether `next` (the following version of the same block or of
    /// another) makes `version` superfluous history.
    pub fn supersedes(&self, version: &Version, next: &Version) -> bool {
        if version.block != next.block {
            return false;
        }
        let expired = self.horizon.is_some_and(|horizon| next.timestamp <= horizon);
        let deleted = self.deleted_range(version.timestamp).is_some_and(|(_, to)| next.timestamp <= to);
        let window = self.window_nanos(version.timestamp);
        let same_window =
            window != 0 && version.timestamp.unix_nanos() / window == next.timestamp.unix_nanos() / window;
        if !expired && !deleted && !same_window {
            return false;
        }
        let first_pin_at_or_after = self.pins.partition_point(|&pin| pin < version.timestamp);
        self.pins.get(first_pin_at_or_after).is_none_or(|&pin| pin >= next.timestamp)
    }

    /// The window length that applies at `at`: the coarsest tier whose
    /// window around `at` ends early enough, else the granularity.
    pub fn window_nanos(&self, at: Timestamp) -> u64 {
        let applies = |&&(interval, until): &&(u64, Timestamp)| {
            let window_end = (at.unix_nanos() / interval).saturating_add(1).saturating_mul(interval) - 1;
            window_end <= until.unix_nanos()
        };
        let coarsest = self.tiers.iter().filter(applies).map(|&(interval, _)| interval).max();
        coarsest.unwrap_or(0).max(self.granularity_nanos)
    }

    /// The deleted range `[from, to]` that holds `at`, if any.
    pub fn deleted_range(&self, at: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let after = self.deleted.partition_point(|&(from, _)| from <= at);
        after.checked_sub(1).map(|index| self.deleted[index]).filter(|&(_, to)| at <= to)
    }

    /// The latest time at or before `at` that thinning keeps exact: the end
    /// of the last complete window that applies there, or a later pin. (In
    /// the first window of Unix time, with no pin, there is none: `at` itself
    /// is returned.) Whether history at that time still exists at all (the
    /// horizon, deleted ranges) is the caller's question.
    pub fn exact_at_or_before(&self, at: Timestamp) -> Timestamp {
        let window = self.window_nanos(at);
        if window == 0 {
            return at;
        }
        let window_end = match (at.unix_nanos() + 1) / window * window {
            0 => at,
            window_start => Timestamp::from_unix_nanos(window_start - 1),
        };
        let pins_at_or_before = self.pins.partition_point(|&pin| pin <= at);
        let pin = pins_at_or_before.checked_sub(1).map(|index| self.pins[index]);
        pin.map_or(window_end, |pin| pin.max(window_end))
    }

    /// Whether `at` is a pin.
    pub fn is_pinned(&self, at: Timestamp) -> bool {
        self.pins.binary_search(&at).is_ok()
    }

    /// The latest pin before `at`, if any.
    pub fn pin_before(&self, at: Timestamp) -> Option<Timestamp> {
        let before = self.pins.partition_point(|&pin| pin < at);
        before.checked_sub(1).map(|index| self.pins[index])
    }
}

/// Drops, from versions in key order, those the thinning supersedes, and
/// tells `release` of the archived ones.
pub(crate) struct Thin<'a, I> {
    versions: I,
    thinning: &'a Thinning,
    release: Option<&'a dyn ReleaseHook>,
    pending: Option<Version>,
    pub(crate) dropped: u64,
    /// Of them, those whose data is in the chunk store.
    pub(crate) chunks_dropped: u64,
}

impl<'a, I: Iterator<Item = Result<Version, IndexError>>> Thin<'a, I> {
    pub(crate) fn new(versions: I, thinning: &'a Thinning, release: Option<&'a dyn ReleaseHook>) -> Self {
        Thin { versions, thinning, release, pending: None, dropped: 0, chunks_dropped: 0 }
    }
}

impl<I: Iterator<Item = Result<Version, IndexError>>> Iterator for Thin<'_, I> {
    type Item = Result<Version, IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let next = match self.versions.next() {
                None => return self.pending.take().map(Ok),
                Some(Err(error)) => return Some(Err(error)),
                Some(Ok(next)) => next,
            };
            match self.pending.replace(next) {
                None => continue,
                Some(previous) if self.thinning.supersedes(&previous, &next) => {
                    self.dropped += 1;
                    if let VersionData::Chunk(_) = previous.data {
                        self.chunks_dropped += 1;
                        if let Some(release) = self.release {
                            release.release(&previous);
                        }
                    }
                }
                Some(previous) => return Some(Ok(previous)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rewind_types::BlockIndex;

    use super::*;

    fn version(block: u64, nanos: u64) -> Version {
        Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(nanos),
            data: VersionData::Zero,
            crc32c: 0,
        }
    }

    fn kept(thinning: &Thinning, versions: &[Version]) -> (Vec<(u64, u64)>, u64) {
        let mut thin = Thin::new(versions.iter().copied().map(Ok), thinning, None);
        let kept = thin.by_ref().map(|version| version.unwrap()).map(|v| (v.block.0, v.timestamp.unix_nanos()));
        let kept: Vec<_> = kept.collect();
        (kept, thin.dropped)
    }

    #[test]
    fn keeps_the_last_version_per_block_and_window() {
        let thinning = Thinning { granularity_nanos: 10, ..Thinning::default() };
        let versions = [version(1, 1), version(1, 5), version(1, 9), version(1, 10), version(1, 25), version(2, 3)];
        assert_eq!(kept(&thinning, &versions), (vec![(1, 9), (1, 10), (1, 25), (2, 3)], 2));
    }

    #[test]
    fn pins_keep_the_state_at_their_time() {
        let thinning =
            Thinning { granularity_nanos: 10, pins: vec![Timestamp::from_unix_nanos(6)], ..Thinning::default() };
        let versions = [version(1, 1), version(1, 5), version(1, 6), version(1, 9)];
        // At pin 6 the block's newest is 6 itself, so 5 may go.
        assert_eq!(kept(&thinning, &versions), (vec![(1, 6), (1, 9)], 2));
        let thinning =
            Thinning { granularity_nanos: 10, pins: vec![Timestamp::from_unix_nanos(7)], ..Thinning::default() };
        assert_eq!(kept(&thinning, &versions), (vec![(1, 6), (1, 9)], 2));
        let thinning =
            Thinning { granularity_nanos: 10, pins: vec![Timestamp::from_unix_nanos(5)], ..Thinning::default() };
        assert_eq!(kept(&thinning, &versions), (vec![(1, 5), (1, 9)], 2));
    }

    #[test]
    fn a_deleted_range_keeps_each_blocks_last_version_in_it() {
        let at = Timestamp::from_unix_nanos;
        let thinning = Thinning { deleted: vec![(at(10), at(20))], ..Thinning::default() };
        let versions = [version(1, 5), version(1, 10), version(1, 15), version(1, 20), version(1, 25), version(2, 12)];
        assert_eq!(kept(&thinning, &versions), (vec![(1, 5), (1, 20), (1, 25), (2, 12)], 2));
        assert_eq!(thinning.deleted_range(at(9)), None);
        assert_eq!(thinning.deleted_range(at(10)), Some((at(10), at(20))));
        assert_eq!(thinning.deleted_range(at(20)), Some((at(10), at(20))));
        assert_eq!(thinning.deleted_range(at(21)), None);
    }

    #[test]
    fn tiers_coarsen_only_whole_windows_old_enough() {
        let at = Timestamp::from_unix_nanos;
        // Windows of 100 for what ends by 1000, of 10 for the rest (granularity 1).
        let thinning =
            Thinning { granularity_nanos: 1, tiers: vec![(10, at(1500)), (100, at(1000))], ..Thinning::default() };
        assert_eq!(thinning.window_nanos(at(950)), 100);
        assert_eq!(thinning.window_nanos(at(1000)), 10, "its 100-window ends after 1000");
        assert_eq!(thinning.window_nanos(at(1495)), 10);
        assert_eq!(thinning.window_nanos(at(1500)), 1, "its 10-window ends after 1500");
        let versions = [version(1, 905), version(1, 990), version(1, 1001), version(1, 1009), version(1, 1500)];
        assert_eq!(kept(&thinning, &versions), (vec![(1, 990), (1, 1009), (1, 1500)], 2));
        assert_eq!(thinning.exact_at_or_before(at(1004)).unix_nanos(), 999);
        assert_eq!(thinning.exact_at_or_before(at(998)).unix_nanos(), 899);
        assert_eq!(thinning.exact_at_or_before(at(1600)).unix_nanos(), 1600);
    }

    #[test]
    fn before_the_horizon_each_block_keeps_its_base_and_pins() {
        let at = Timestamp::from_unix_nanos;
        let thinning = Thinning { horizon: Some(at(99)), pins: vec![at(30)], ..Thinning::default() };
        let versions = [version(1, 10), version(1, 20), version(1, 40), version(1, 50), version(1, 150), version(2, 5)];
        // 20 is the state at the pin 30; 50 the base; 150 is after the horizon.
        assert_eq!(kept(&thinning, &versions), (vec![(1, 20), (1, 50), (1, 150), (2, 5)], 2));
        assert!(thinning.is_pinned(at(30)) && !thinning.is_pinned(at(31)));
        assert_eq!(thinning.pin_before(at(31)), Some(at(30)));
        assert_eq!(thinning.pin_before(at(30)), None);
    }

    #[test]
    fn granularity_zero_keeps_everything() {
        let versions = [version(1, 1), version(1, 2)];
        assert_eq!(kept(&Thinning::default(), &versions), (vec![(1, 1), (1, 2)], 0));
    }

    #[test]
    fn exact_times_are_window_ends_and_pins() {
        let thinning =
            Thinning { granularity_nanos: 10, pins: vec![Timestamp::from_unix_nanos(15)], ..Thinning::default() };
        let exact = |nanos| thinning.exact_at_or_before(Timestamp::from_unix_nanos(nanos)).unix_nanos();
        assert_eq!(exact(19), 19);
        assert_eq!(exact(18), 15, "a pin later than the window end");
        assert_eq!(exact(15), 15);
        assert_eq!(exact(14), 9);
        assert_eq!(exact(10), 9);
        assert_eq!(exact(9), 9);
        assert_eq!(exact(5), 5, "before the first window end there is nothing earlier");
    }
}
