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
//! Dropping needs only the next version of the same block, which a stream
//! sorted by `(block, time)` delivers right after it. A merge sees a subset
//! of a block's versions; whatever it finds later in the same window
//! supersedes, so merging in any grouping converges to the same history.

use rewind_types::{Timestamp, Version};

use crate::IndexError;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Thinning {
    /// Window length in nanoseconds; 0 keeps every version.
    pub granularity_nanos: u64,
    /// Times whose state must stay exact, sorted.
    pub pins: Vec<Timestamp>,
    /// Deleted ranges `[from, to]`, sorted and disjoint.
    pub deleted: Vec<(Timestamp, Timestamp)>,
}

impl Thinning {
    /// Whether `next` (the following version of the same block or of
    /// another) makes `version` superfluous history.
    fn supersedes(&self, version: &Version, next: &Version) -> bool {
        if version.block != next.block {
            return false;
        }
        let deleted = self.deleted_range(version.timestamp).is_some_and(|(_, to)| next.timestamp <= to);
        let granularity = self.granularity_nanos;
        let same_window = granularity != 0
            && version.timestamp.unix_nanos() / granularity == next.timestamp.unix_nanos() / granularity;
        if !deleted && !same_window {
            return false;
        }
        let first_pin_at_or_after = self.pins.partition_point(|&pin| pin < version.timestamp);
        self.pins.get(first_pin_at_or_after).is_none_or(|&pin| pin >= next.timestamp)
    }

    /// The deleted range `[from, to]` that holds `at`, if any.
    pub fn deleted_range(&self, at: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let after = self.deleted.partition_point(|&(from, _)| from <= at);
        after.checked_sub(1).map(|index| self.deleted[index]).filter(|&(_, to)| at <= to)
    }

    /// The latest time at or before `at` that thinning keeps exact: the end
    /// of the last complete window, or a later pin. (In the first window of
    /// Unix time, with no pin, there is none: `at` itself is returned.)
    pub fn exact_at_or_before(&self, at: Timestamp) -> Timestamp {
        let granularity = self.granularity_nanos;
        if granularity == 0 {
            return at;
        }
        let window_end = match (at.unix_nanos() + 1) / granularity * granularity {
            0 => at,
            window_start => Timestamp::from_unix_nanos(window_start - 1),
        };
        let pins_at_or_before = self.pins.partition_point(|&pin| pin <= at);
        let pin = pins_at_or_before.checked_sub(1).map(|index| self.pins[index]);
        pin.map_or(window_end, |pin| pin.max(window_end))
    }
}

/// Drops, from versions in key order, those the thinning supersedes.
pub(crate) struct Thin<'a, I> {
    versions: I,
    thinning: &'a Thinning,
    pending: Option<Version>,
    pub(crate) dropped: u64,
}

impl<'a, I: Iterator<Item = Result<Version, IndexError>>> Thin<'a, I> {
    pub(crate) fn new(versions: I, thinning: &'a Thinning) -> Self {
        Thin { versions, thinning, pending: None, dropped: 0 }
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
                Some(previous) if self.thinning.supersedes(&previous, &next) => self.dropped += 1,
                Some(previous) => return Some(Ok(previous)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rewind_types::{BlockIndex, VersionData};

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
        let mut thin = Thin::new(versions.iter().copied().map(Ok), thinning);
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
