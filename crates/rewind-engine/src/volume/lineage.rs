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
//! The base keeps the branch point exactly for as long as the clone exists:
//! the clone holds a view of it (a pin in the base's thinning) from the
//! moment it is opened until it is closed, and the base refuses to delete
//! history around it or to be deleted itself while the clone is there.

use std::ops::Deref;
use std::sync::Arc;

use rewind_types::{Timestamp, VolumeName};

use crate::timespec::DisplayTime;
use crate::volume::read::View;
use crate::{EngineError, Volume};

/// What a clone reads where it has not written: its base's view at the
/// branch point, registered with the base for as long as the clone has it.
pub(crate) struct Base {
    view: View,
    clone: VolumeName,
}

impl Deref for Base {
    type Target = View;

    fn deref(&self) -> &View {
        &self.view
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let removed = self.view.volume().clones.lock().remove(&self.clone);
        assert_eq!(removed, Some(self.view.at()), "a clone is registered with its base once");
    }
}

impl Volume {
    /// The volume this one was cloned from and the point it starts from.
    pub fn base(&self) -> Option<(&VolumeName, Timestamp)> {
        self.meta().base.as_ref().map(|base| (&base.volume, base.at))
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
        self.register(clone, View::holding(Arc::clone(self), at))
    }

    fn register(&self, clone: &VolumeName, view: View) -> Base {
        let previous = self.clones.lock().insert(clone.clone(), view.at());
        assert!(previous.is_none(), "clone {clone} is opened once");
        Base { view, clone: clone.clone() }
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
