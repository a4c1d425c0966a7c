//! The points history must keep exactly: bookmarks (named, saved with the
//! volume), the holds of open views (pins that live as long as the view),
//! and the exact time a point in time stands for under the volume's
//! granularity and retention. Every change of what the index thins is made
//! under the bookmarks lock, and ends in `rethin`.

use std::sync::Arc;

use rewind_format::meta::{Bookmark, Bookmarks};
use rewind_io::write_file_atomic;
use rewind_types::{BookmarkName, Timestamp};

use super::WriteState;
use crate::timespec::{DisplayTime, NOW};
use crate::{EngineError, Volume};

impl Volume {
    pub fn bookmarks(&self) -> Vec<Bookmark> {
        self.history.bookmarks.lock().entries.clone()
    }

    /// The bookmarks' times, ascending (an archive pass lays out the state
    /// they name together: see `layered_order`).
    pub(crate) fn bookmark_times(&self) -> Vec<Timestamp> {
        let mut times: Vec<Timestamp> = self.history.bookmarks.lock().entries.iter().map(|b| b.timestamp).collect();
        times.sort_unstable();
        times
    }

    /// Names a point in time, `at` or (when `None`) now — after every write
    /// acknowledged so far, which this makes durable first.
    pub fn create_bookmark(
        &self,
        name: BookmarkName,
        at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<Bookmark, EngineError> {
        self.check_open()?;
        let mut bookmarks = self.history.bookmarks.lock();
        self.check_bookmark_free(&bookmarks, &name)?;
        let snapshot_now = at.is_none();
        let at = match at {
            // A time in the past is kept exact only if it is already (see `exact_time`).
            Some(at) => {
                let exact = self.exact_time_named(self.check_in_history(at, now)?, &bookmarks)?;
                // As a view's (see `hold_exact_time`): nothing lands inside it later.
                self.keep_writes_after(exact);
                exact
            }
            // Now: pinned before any later write can come in, so no persist or
            // merge can thin away the state it names.
            None => self.advance_clock_pinned(now),
        };
        // The bookmarked state must survive a crash, like the bookmark itself.
        self.flush()?;
        let bookmark = Bookmark { name, timestamp: at };
        self.add_bookmark(&mut bookmarks, bookmark.clone())?;
        drop(bookmarks);
        if snapshot_now && self.rules().destages_at_snapshots() {
            // A bookmark is an on-demand snapshot: ROW merges at each.
            self.destage_durable()?;
        }
        Ok(bookmark)
    }

    pub fn delete_bookmark(&self, name: &str) -> Result<Bookmark, EngineError> {
        self.check_open()?;
        let mut bookmarks = self.history.bookmarks.lock();
        let Some(position) = bookmarks.entries.iter().position(|bookmark| bookmark.name.as_str() == name) else {
            return Err(EngineError::BookmarkNotFound { volume: self.name().to_string(), bookmark: name.to_owned() });
        };
        let doomed = bookmarks.entries[position].timestamp;
        let named_elsewhere = bookmarks.entries.iter().filter(|bookmark| bookmark.timestamp == doomed).count() > 1;
        if let Some(revert) =
            self.history.reverts.lock().entries.iter().find(|revert| revert.before == doomed && !named_elsewhere)
        {
            // The state is kept while the revert stands, and recovery names
            // it again (see `History::open`): deleting would free nothing.
            return Err(EngineError::InvalidArgument(format!(
                "bookmark {name} of volume {} names the state just before the revert at {}; that state is kept \
                 exactly (for `rewind revert --undo` and views) while the revert is in the volume's history, \
                 and so is its bookmark",
                self.name(),
                DisplayTime(revert.at)
            )));
        }
        let mut next = bookmarks.clone();
        let removed = next.entries.remove(position);
        self.save_bookmarks(&next)?;
        *bookmarks = next;
        self.rethin(&self.history.policy.lock(), &bookmarks);
        Ok(removed)
    }

    pub(crate) fn save_bookmarks(&self, bookmarks: &Bookmarks) -> Result<(), EngineError> {
        let path = &self.history.bookmarks_path;
        write_file_atomic(self.storage(), path, &bookmarks.encode()).map_err(EngineError::io(path))
    }

    fn check_bookmark_free(&self, bookmarks: &Bookmarks, name: &BookmarkName) -> Result<(), EngineError> {
        // Times are read before bookmark names, so `VOLUME@now` could never
        // reach a bookmark of that name. (Refused here, not in the name
        // itself, so that a bookmark saved before still decodes.)
        if name.as_str() == NOW {
            return Err(EngineError::InvalidArgument(format!(
                "`{NOW}` names the present (as in {}@{NOW}), so no bookmark can take it; choose another name",
                self.name()
            )));
        }
        if let Some(existing) = bookmarks.entries.iter().find(|bookmark| bookmark.name == *name) {
            return Err(EngineError::BookmarkExists {
                volume: self.name().to_string(),
                bookmark: name.to_string(),
                at: DisplayTime(existing.timestamp).to_string(),
            });
        }
        if bookmarks.entries.len() >= Bookmarks::COUNT_MAX {
            return Err(EngineError::InvalidArgument(format!(
                "volume {} already has {} bookmarks, the most it can hold; delete some first",
                self.name(),
                Bookmarks::COUNT_MAX
            )));
        }
        Ok(())
    }

    /// Saves `bookmark` (its state durable already) among `bookmarks`, whose
    /// lock the caller holds.
    fn add_bookmark(&self, bookmarks: &mut Bookmarks, bookmark: Bookmark) -> Result<(), EngineError> {
        let mut next = bookmarks.clone();
        next.entries.push(bookmark);
        next.entries.sort_by_key(|bookmark| bookmark.timestamp);
        self.save_bookmarks(&next)?;
        *bookmarks = next;
        self.rethin(&self.history.policy.lock(), bookmarks);
        Ok(())
    }

    /// Bookmarks `volumes` (in name order, the order their locks are taken
    /// in) as `name` at one instant: with the writes of all of them held
    /// back at once, each one's clock is advanced to `now` and pinned, so a
    /// write acknowledged to any of them before is in the bookmark and one
    /// that begins after is in none. Their states are made durable, then
    /// `commit` records the points (a group bookmark's commit point), then
    /// each volume saves its bookmark.
    pub(crate) fn bookmark_together(
        volumes: &[Arc<Volume>],
        name: &BookmarkName,
        now: Timestamp,
        commit: impl FnOnce(&[Timestamp]) -> Result<(), EngineError>,
    ) -> Result<Vec<Timestamp>, EngineError> {
        assert!(volumes.windows(2).all(|pair| pair[0].name() < pair[1].name()), "locks are taken in name order");
        let mut held = Vec::with_capacity(volumes.len());
        for volume in volumes {
            volume.check_open()?;
            let bookmarks = volume.history.bookmarks.lock();
            volume.check_bookmark_free(&bookmarks, name)?;
            held.push(bookmarks);
        }
        let times: Vec<Timestamp> = {
            let mut fenced: Vec<_> = volumes.iter().map(|volume| volume.write.lock()).collect();
            volumes.iter().zip(&mut fenced).map(|(volume, state)| volume.pin_clock(state, now)).collect()
        };
        for volume in volumes {
            volume.flush()?;
        }
        commit(&times)?;
        // Committed: a member whose save fails keeps its point held (the
        // pin above goes at the next rethin) until the node opens again and
        // saves it (see `Node::finish_groups`).
        let mut failed = None;
        for ((volume, bookmarks), &timestamp) in volumes.iter().zip(&mut held).zip(&times) {
            if let Err(error) = volume.add_bookmark(bookmarks, Bookmark { name: name.clone(), timestamp }) {
                volume.hold_locked(timestamp, bookmarks);
                failed.get_or_insert(error);
            }
        }
        match failed {
            None => Ok(times),
            Some(error) => Err(error),
        }
    }

    /// Whether the volume lacks bookmark `name`: its share of a group
    /// bookmark that a crash or a failed save left out.
    pub(crate) fn lacks_bookmark(&self, name: &BookmarkName) -> bool {
        !self.history.bookmarks.lock().entries.iter().any(|bookmark| bookmark.name == *name)
    }

    /// Saves bookmark `name` at `at`, a share of a group bookmark recorded
    /// as committed that the volume lacks, and held since it opened (see
    /// `Node::open`), then lets that hold go. Its state was durable when
    /// the group bookmark was committed, and is exact: pinned from then
    /// until the crash or failed save, and held from the volume's recovery
    /// on — the policy alone would not say so under a granularity.
    pub(crate) fn complete_bookmark(&self, name: &BookmarkName, at: Timestamp) -> Result<(), EngineError> {
        let mut bookmarks = self.history.bookmarks.lock();
        assert!(self.history.holds.lock().contains_key(&at), "a share to complete is held");
        self.add_bookmark(&mut bookmarks, Bookmark { name: name.clone(), timestamp: at })?;
        drop(bookmarks);
        self.release_time(at);
        Ok(())
    }

    /// Raises the volume's clock to `now` (so later writes get later times)
    /// and pins that time in the index, atomically with respect to writes.
    pub(crate) fn advance_clock_pinned(&self, now: Timestamp) -> Timestamp {
        self.pin_clock(&mut self.write.lock(), now)
    }

    /// Makes every later write's time after `at`, a point just shown or
    /// named, without moving the time of the last write (which reports show).
    fn keep_writes_after(&self, at: Timestamp) {
        let mut state = self.write.lock();
        state.timestamp_floor = state.timestamp_floor.max(at.next());
    }

    /// Raises the volume's clock to `at`, so later writes are after it.
    pub(crate) fn advance_clock(&self, at: Timestamp) {
        let mut state = self.write.lock();
        state.timestamp_last = state.timestamp_last.max(at);
    }

    /// [`Volume::advance_clock_pinned`] under the write lock the caller holds.
    fn pin_clock(&self, state: &mut WriteState, now: Timestamp) -> Timestamp {
        state.timestamp_last = state.timestamp_last.max(now);
        let mut thinning = self.index.thinning();
        let position = thinning.pins.partition_point(|&pin| pin < state.timestamp_last);
        thinning.pins.insert(position, state.timestamp_last);
        self.index.set_thinning(thinning);
        state.timestamp_last
    }

    /// The latest time at or before `at` whose state the policy keeps exactly:
    /// `at` itself with every-write granularity; otherwise the end of the
    /// last complete window (granularity or retention tier), or a later
    /// bookmark. A time whose history was deleted, or that retention has
    /// dropped, has none.
    pub fn exact_time(&self, at: Timestamp) -> Result<Timestamp, EngineError> {
        self.exact_time_named(at, &self.history.bookmarks.lock())
    }

    /// [`Volume::exact_time`], naming bookmarks from `bookmarks` (the
    /// caller holds their lock: it is not taken twice).
    pub(crate) fn exact_time_named(&self, at: Timestamp, bookmarks: &Bookmarks) -> Result<Timestamp, EngineError> {
        let thinning = self.index.thinning();
        let exact = thinning.exact_at_or_before(at);
        if let Some(horizon) = thinning.horizon.filter(|&horizon| exact < horizon && !thinning.is_pinned(exact)) {
            let before = thinning.pin_before(at.min(horizon)).map_or(String::new(), |pin| {
                let name = bookmarks.entries.iter().find(|bookmark| bookmark.timestamp == pin);
                let name = name.map_or(String::new(), |bookmark| format!(" (bookmark {})", bookmark.name));
                format!(" and {}{name}", DisplayTime(pin))
            });
            return Err(EngineError::HistoryExpired {
                volume: self.name().to_string(),
                requested: DisplayTime(at).to_string(),
                horizon: DisplayTime(horizon).to_string(),
                before,
            });
        }
        match thinning.deleted_range(exact) {
            Some((from, to)) if exact < to => Err(EngineError::HistoryDeleted {
                volume: self.name().to_string(),
                requested: DisplayTime(at).to_string(),
                from: DisplayTime(from).to_string(),
                to: DisplayTime(to).to_string(),
                before: DisplayTime(thinning.exact_at_or_before(from.saturating_sub_nanos(1))).to_string(),
            }),
            _ => Ok(exact),
        }
    }

    /// Pins the exact time at or before `at` for as long as the returned hold
    /// lives (an open view), so no later thinning can change its state.
    pub(crate) fn hold_exact_time(&self, at: Timestamp) -> Result<Timestamp, EngineError> {
        // The bookmarks lock serialises every change of what the index thins.
        let bookmarks = self.history.bookmarks.lock();
        let exact = self.exact_time_named(at, &bookmarks)?;
        // A point after the last write: a write whose caller read the clock
        // before it, then waited for room, would otherwise land inside it.
        self.keep_writes_after(exact);
        self.hold_locked(exact, &bookmarks);
        Ok(exact)
    }

    /// Holds `at`, a point this volume kept exactly until it stopped (a
    /// clone's branch point, held again when the clone is opened): it was
    /// pinned whenever history was thinned, so it is still exact, though
    /// the policy alone may not say so.
    pub(crate) fn hold_again(&self, at: Timestamp) {
        let bookmarks = self.history.bookmarks.lock();
        self.hold_locked(at, &bookmarks);
    }

    /// Holds the state now — after every write acknowledged so far, which
    /// this makes durable — as a bookmark made now would; returns its time.
    pub(crate) fn hold_now(&self, now: Timestamp) -> Result<Timestamp, EngineError> {
        let bookmarks = self.history.bookmarks.lock();
        let at = self.advance_clock_pinned(now);
        self.hold_locked(at, &bookmarks);
        if let Err(error) = self.flush() {
            drop(bookmarks);
            self.release_time(at);
            return Err(error);
        }
        Ok(at)
    }

    pub(crate) fn hold_locked(&self, at: Timestamp, bookmarks: &Bookmarks) {
        *self.history.holds.lock().entry(at).or_insert(0) += 1;
        self.rethin(&self.history.policy.lock(), bookmarks);
    }

    pub(crate) fn release_time(&self, at: Timestamp) {
        let bookmarks = self.history.bookmarks.lock();
        {
            let mut holds = self.history.holds.lock();
            let count = holds.get_mut(&at).expect("a released time is held");
            *count -= 1;
            if *count == 0 {
                holds.remove(&at);
            }
        }
        self.rethin(&self.history.policy.lock(), &bookmarks);
    }

    pub(crate) fn check_in_history(&self, at: Timestamp, now: Timestamp) -> Result<Timestamp, EngineError> {
        if at > now {
            return Err(EngineError::InFuture {
                requested: DisplayTime(at).to_string(),
                now: DisplayTime(now).to_string(),
            });
        }
        if at < self.created() {
            return Err(EngineError::BeforeHistory {
                volume: self.name().to_string(),
                requested: DisplayTime(at).to_string(),
                earliest: DisplayTime(self.created()).to_string(),
            });
        }
        Ok(at)
    }
}
