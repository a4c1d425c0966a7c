//! Lineage: a clone starts from another volume as it was at one point (its
//! *base*), sharing everything it has not written since. Nothing is copied.
//! The clone's own journal, index and current store hold only its writes; a
//! read plans each block as any volume does, and where the clone never
//! wrote the block (no version in its index or overlay, an unwritten block
//! in its current store) the plan says `Source::Base` and the block is read
//! from the base's view at the branch point — itself a clone's view, for a
//! clone of a clone. So views, bookmarks, retention, range deletes, the
//! space cap and every layout work on a clone as on any volume.
//!
//! The base keeps the branch point exactly for as long as the clone reads
//! it: the clone holds a view of it (a pin in the base's thinning) from the
//! moment it is opened until it is closed, and the base refuses to delete
//! history around it or to be deleted itself while the clone is there.
//! Until the clone is promoted (`promote`): then it reads its own copy of
//! the branch point, and the base is free to go.

use std::sync::Arc;

use rewind_format::meta::VolumeBase;
use rewind_types::{Timestamp, VolumeName};

use crate::timespec::DisplayTime;
use crate::volume::promote::BaseCopy;
use crate::volume::read::{BlockStatus, View};
use crate::{EngineError, Volume};

/// What a clone reads where it has not written: the base's view at the
/// branch point, lent by the base, or the clone's own copy of it.
pub(crate) enum Base {
    Lent(Lent),
    Copied(BaseCopy),
}

/// A base's view at the branch point, registered with the base for as long
/// as the clone has it.
pub(crate) struct Lent {
    view: View,
    clone: VolumeName,
}

impl Drop for Lent {
    fn drop(&mut self) {
        let removed = self.view.volume().clones.lock().remove(&self.clone);
        assert_eq!(removed, Some(self.view.at()), "a clone is registered with its base once");
    }
}

impl Base {
    /// Where the clone came from, and whether it has its own copy of it.
    pub(crate) fn origin(&self) -> VolumeBase {
        match self {
            Base::Lent(lent) => {
                VolumeBase { volume: lent.view.volume().name().clone(), at: lent.view.at(), copied: false }
            }
            Base::Copied(copy) => copy.origin().clone(),
        }
    }

    /// The base's view, while it is lent.
    pub(crate) fn lent(&self) -> Option<&View> {
        match self {
            Base::Lent(lent) => Some(&lent.view),
            Base::Copied(_) => None,
        }
    }

    /// Reads whole blocks of the branch point at `offset`.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        match self {
            Base::Lent(lent) => lent.view.read(offset, buf),
            Base::Copied(copy) => copy.read(offset, buf),
        }
    }

    /// Allocation status of the branch point from `offset`: may cover less
    /// than `length`, never more.
    pub(crate) fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatus>, EngineError> {
        match self {
            Base::Lent(lent) => lent.view.block_status(offset, length),
            Base::Copied(copy) => copy.block_status(offset, length),
        }
    }
}

impl Volume {
    /// The volume this one was cloned from and the point it starts from
    /// (`copied` once promoted: the volume may be gone).
    pub fn base(&self) -> Option<VolumeBase> {
        self.base_now().map(|base| base.origin())
    }

    /// What this volume reads where it never wrote, now (a promote swaps
    /// it; a read goes on with the one it took).
    pub(crate) fn base_now(&self) -> Option<Arc<Base>> {
        self.base.lock().clone()
    }

    /// The clones open on this volume, with the points they start from.
    pub fn clones(&self) -> Vec<(VolumeName, Timestamp)> {
        self.clones.lock().iter().map(|(name, &at)| (name.clone(), at)).collect()
    }

    /// Lends this volume to the new clone `clone` as it was at exactly `at`
    /// (an exact point), or now — after every write acknowledged so far —
    /// if `None`: the point stays exact while the returned base lives.
    pub(crate) fn lend(
        self: &Arc<Self>,
        clone: &VolumeName,
        at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<Base, EngineError> {
        let view = match at {
            Some(at) => {
                let view = self.hold_exactly(at)?;
                // The point must survive a crash, as the clone will.
                self.flush()?;
                view
            }
            None => View::holding(Arc::clone(self), self.hold_now(now)?),
        };
        Ok(self.register(clone, view))
    }

    /// Lends this volume again to `clone`, being opened, at the point it
    /// was lent at (see [`Volume::hold_again`]).
    pub(crate) fn lend_again(self: &Arc<Self>, clone: &VolumeName, at: Timestamp) -> Base {
        self.hold_again(at);
        // A clone made "now" pinned the clock after the last record; after
        // a restart the clock starts at the last record, and a later write
        // stamped with the branch point would show through to the clone.
        // Clones are opened before anything is written to their base.
        self.advance_clock(at);
        self.register(clone, View::holding(Arc::clone(self), at))
    }

    fn register(&self, clone: &VolumeName, view: View) -> Base {
        let previous = self.clones.lock().insert(clone.clone(), view.at());
        assert!(previous.is_none(), "clone {clone} is opened once");
        Base::Lent(Lent { view, clone: clone.clone() })
    }

    /// Refuses a history delete from `from` until `to` that would take a
    /// point a clone starts from.
    pub(crate) fn check_no_branch_in(&self, from: Timestamp, to: Timestamp) -> Result<(), EngineError> {
        let clones = self.clones.lock();
        match clones.iter().find(|(_, &at)| (from..to).contains(&at)) {
            None => Ok(()),
            Some((clone, &at)) => Err(EngineError::InvalidArgument(format!(
                "clone {clone} starts from volume {} as it was at {}, which lies in the range; delete the clone \
                 first (`rewind volume delete {clone}`) or delete up to that point",
                self.name(),
                DisplayTime(at)
            ))),
        }
    }
}
