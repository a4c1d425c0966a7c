//! Revert in place (IBM §2.2, "revert the LPMap structure to a previous point
//! in time"): from the revert on, the volume reads as it did at the point
//! reverted to, wherever it has not been written since. It is metadata only
//! — one small file, written under the write lock — so it takes the same
//! time whatever changed since that point, and nothing is lost: every
//! version stays in history, the state just before the revert is kept
//! exactly (and bookmarked `before-revert-…`), and a later revert (`undo`)
//! can go back to it.
//!
//! A revert is an era of the volume's timeline. The read plan finds, for
//! the time it reads, the era it falls in; a block whose newest version at
//! that time is from before the era began reads as it did at the point the
//! era went back to — planned at that point, through any earlier revert.
//! Views before the revert see what was then, the discarded future too.
//!
//! Atomic under a crash: the `reverts` file is replaced under the write
//! lock, so no write after the revert reaches the journal before it is
//! durable; after a restart the volume is wholly before or after it. The
//! volume's clock is kept past the last revert, so every later write is
//! after it.

use rewind_format::meta::{Bookmark, Bookmarks, Revert};
use rewind_io::write_file_atomic;
use rewind_types::{BookmarkName, Timestamp};

use crate::timespec::DisplayTime;
use crate::volume::clients::CutOff;
use crate::{EngineError, Volume};

/// What to do about clients writing to the live volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// Refuse the revert, naming them.
    Refuse,
    /// Cut them off: their requests fail from then on, so they reconnect
    /// to the reverted volume.
    Disconnect,
}

/// What a revert did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevertReport {
    pub revert: Revert,
    /// The bookmark naming the state just before the revert.
    pub bookmark: BookmarkName,
    /// The writers cut off.
    pub disconnected: Vec<String>,
}

impl Volume {
    /// The volume's reverts in place, oldest first.
    pub fn reverts(&self) -> Vec<Revert> {
        self.history.reverts.lock().entries.clone()
    }

    /// Reverts the volume in place to `to`, an exact point of its history
    /// (see [`Volume::resolve_time`]): from now on it reads as it did then.
    pub fn revert(&self, to: Timestamp, now: Timestamp, writers: Writers) -> Result<RevertReport, EngineError> {
        self.check_writers(writers)?;
        // Every acknowledged write is in the state the revert leaves.
        self.flush()?;
        let mut bookmarks = self.history.bookmarks.lock();
        self.check_revert_point(to, now, &bookmarks)?;
        let (revert, cut_off) = {
            let mut state = self.write.lock();
            // Again under the write lock: a writer that attached since the
            // check is refused too (one attaching later sees the revert).
            if writers == Writers::Refuse {
                self.check_writers(writers)?;
            }
            // After the point it goes back to, even when that is now (`--to
            // now` on a volume idle since before it): a revert to its own
            // instant made every read of the present plan itself for ever.
            let at = Volume::next_timestamp(&mut state, now.max(to.next()));
            let revert = Revert { at, to, before: at.saturating_sub_nanos(1) };
            assert!(revert.to <= revert.before && revert.before < revert.at, "{revert:?}");
            let mut next = self.history.reverts.lock().clone();
            next.entries.push(revert);
            let path = &self.history.reverts_path;
            // Durable before any later write is appended: all or nothing.
            write_file_atomic(self.storage(), path, &next.encode()).map_err(EngineError::io(path))?;
            *self.history.reverts.lock() = next;
            // Both ends pinned before any later write can be thinned against them.
            self.rethin(&self.history.policy.lock(), &bookmarks);
            self.start_revert_copy(revert);
            // Under the write lock: a write of theirs waiting for it fails.
            let cut_off = match writers {
                Writers::Disconnect => self.cut_off_live_clients(),
                Writers::Refuse => CutOff::default(),
            };
            (revert, cut_off)
        };
        let disconnected = cut_off.hang_up();
        // The writes that came in while it was made are before it, and kept.
        self.flush()?;
        let bookmark = before_revert_name(&revert, |name| bookmarks.entries.iter().any(|entry| entry.name == *name));
        let mut next = bookmarks.clone();
        next.entries.push(Bookmark { name: bookmark.clone(), timestamp: revert.before });
        next.entries.sort_by_key(|bookmark| bookmark.timestamp);
        self.save_bookmarks(&next)?;
        *bookmarks = next;
        self.rethin(&self.history.policy.lock(), &bookmarks);
        tracing::info!(
            volume = %self.name(), to = %DisplayTime(to), before = %bookmark, disconnected = disconnected.len(),
            "reverted in place"
        );
        Ok(RevertReport { revert, bookmark, disconnected })
    }

    /// Refuses, changing nothing, what [`Volume::revert`] would refuse (so
    /// that a group reverts all its members or none).
    pub(crate) fn check_revert(&self, to: Timestamp, now: Timestamp, writers: Writers) -> Result<(), EngineError> {
        self.check_writers(writers)?;
        self.check_revert_point(to, now, &self.history.bookmarks.lock())
    }

    fn check_writers(&self, writers: Writers) -> Result<(), EngineError> {
        self.check_writable()?;
        let live = self.live_clients();
        if !live.is_empty() && writers == Writers::Refuse {
            return Err(EngineError::WritersConnected { volume: self.name().to_string(), clients: live });
        }
        Ok(())
    }

    fn check_revert_point(&self, to: Timestamp, now: Timestamp, bookmarks: &Bookmarks) -> Result<(), EngineError> {
        // A tree's server keeps its present in memory (caches, the inode
        // bitmap) that a revert of the blocks under it would leave stale.
        if self.kind() == rewind_format::meta::VolumeKind::Tree {
            return Err(EngineError::InvalidArgument(format!(
                "{} is a file tree: a whole tree is not reverted in place (its files and directories are: \
                 `rewind tree revert`); read the past under /{}/.rewind/TIME",
                self.name(),
                self.name()
            )));
        }
        // (The volume's clock may run ahead of `now`: a write is after the last.)
        let latest = now.max(self.timestamp_last());
        if self.exact_time_named(self.check_in_history(to, latest)?, bookmarks)? != to {
            return Err(EngineError::InvalidArgument(format!(
                "volume {} does not keep {} exactly; revert to a point it keeps, such as a bookmark",
                self.name(),
                DisplayTime(to)
            )));
        }
        Ok(())
    }

    /// The point `--undo` goes back to: the state just before the last revert.
    pub fn undo_point(&self) -> Result<Timestamp, EngineError> {
        match self.history.reverts.lock().entries.last() {
            Some(last) => Ok(last.before),
            None => Err(EngineError::InvalidArgument(format!(
                "volume {} has never been reverted: there is nothing to undo",
                self.name()
            ))),
        }
    }

    /// Undoes the last revert: reverts to the state just before it.
    pub fn undo_revert(&self, now: Timestamp, writers: Writers) -> Result<RevertReport, EngineError> {
        self.revert(self.undo_point()?, now, writers)
    }

    /// Whether the volume was reverted to `to` at or after `since`.
    pub(crate) fn reverted_to_since(&self, to: Timestamp, since: Timestamp) -> bool {
        self.history.reverts.lock().entries.iter().any(|revert| revert.to == to && revert.at >= since)
    }

    /// Refuses a history delete from `from` until `to` that would take a
    /// point a revert went back to or left.
    pub(crate) fn check_no_revert_in(&self, from: Timestamp, to: Timestamp) -> Result<(), EngineError> {
        let reverts = self.history.reverts.lock();
        let inside =
            reverts.entries.iter().find(|revert| [revert.to, revert.before].iter().any(|at| (from..to).contains(at)));
        match inside {
            None => Ok(()),
            Some(revert) => Err(EngineError::InvalidArgument(format!(
                "volume {} was reverted at {} to {}; the point it went back to or the state before it lies in \
                 the range, and both are kept: delete up to the earlier of them",
                self.name(),
                DisplayTime(revert.at),
                DisplayTime(revert.to)
            ))),
        }
    }
}

/// `before-revert-<UTC time of the revert>`, made unique among `taken`.
pub(crate) fn before_revert_name(revert: &Revert, taken: impl Fn(&BookmarkName) -> bool) -> BookmarkName {
    let time = jiff::Timestamp::from_nanosecond(i128::from(revert.at.unix_nanos()))
        .map_or_else(|_| revert.at.unix_nanos().to_string(), |time| time.strftime("%Y%m%dT%H%M%S.%6fZ").to_string());
    let base = format!("before-revert-{time}");
    (0..)
        .map(|suffix| match suffix {
            0 => base.clone(),
            suffix => format!("{base}-{suffix}"),
        })
        .map(|name| BookmarkName::new(&name).expect("a valid bookmark name"))
        .find(|name| !taken(name))
        .expect("some suffix is free")
}
