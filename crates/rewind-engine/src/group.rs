//! Consistency groups: volumes bookmarked and reverted together, as the
//! disks of one application must be (a database's data and its log).
//!
//! A group bookmark is one instant across the members: their write paths
//! are fenced together (see [`Volume::bookmark_together`]), so a write
//! acknowledged to any member before it is in it and one that begins after
//! is in none. Its commit point is the `groups` file (`rewind_format::groups`),
//! written after the members' states are durable and before their own
//! bookmarks (same name, each member's exact point), which opening the node
//! completes after a crash. A member's share of a group bookmark is deleted
//! with the group bookmark, never alone.
//!
//! A group revert goes to a group bookmark (or undoes each member's last
//! revert) on every member or none: each member is checked first, the
//! intent is recorded in `groups`, then each member is reverted, then the
//! intent is cleared; opening the node finishes an interrupted one.

use std::sync::Arc;

use rewind_format::groups::{Group, GroupBookmark, GroupRevert, Groups, MemberPoint};
use rewind_format::meta::healed;
use rewind_io::{read_file_healing, write_file_atomic};
use rewind_types::{BookmarkName, Timestamp, VolumeName};

use crate::node::Node;
use crate::volume::revert::{RevertReport, Writers};
use crate::{EngineError, Volume};

pub(crate) const GROUPS_FILE: &str = "groups";

/// The node's groups, and what is wrong with the `groups` file if it could
/// not be read (then no group operation runs; volumes are served).
pub(crate) struct GroupState {
    groups: Groups,
    damage: Option<String>,
}

impl GroupState {
    /// The points of volume `name`'s shares of group bookmarks.
    pub(crate) fn points_of(&self, name: &str) -> Vec<Timestamp> {
        self.shares_of(name).map(|(_, point)| point.at).collect()
    }

    fn shares_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a GroupBookmark, &'a MemberPoint)> + 'a {
        self.groups.entries.iter().flat_map(|group| &group.bookmarks).flat_map(move |bookmark| {
            bookmark
                .members
                .iter()
                .filter(move |point| point.volume.as_str() == name)
                .map(move |point| (bookmark, point))
        })
    }

    /// Holds the points of the group bookmarks `volume` lacks its share of
    /// (a crash or a failed save came between the group's commit and the
    /// member's save) once it has opened — its recovery kept them exact
    /// (`points_of`) — until `Node::finish_groups` saves them, and starts
    /// its clock after them, as it would after a bookmark saved.
    pub(crate) fn hold_shares_lacking(&self, volume: &Volume) {
        for (bookmark, point) in self.shares_of(volume.name().as_str()) {
            if volume.lacks_bookmark(&bookmark.name) {
                volume.hold_again(point.at);
                volume.advance_clock(point.at);
            }
        }
    }

    pub(crate) fn open(storage: &dyn rewind_io::Storage) -> Result<GroupState, EngineError> {
        if !storage.exists(GROUPS_FILE).map_err(EngineError::io(GROUPS_FILE))? {
            return Ok(GroupState { groups: Groups::default(), damage: None });
        }
        let bytes = read_file_healing(storage, GROUPS_FILE, healed).map_err(EngineError::io(GROUPS_FILE))?;
        Ok(match Groups::decode(&bytes) {
            Ok(groups) => GroupState { groups, damage: None },
            Err(error) => {
                tracing::error!(%error, "the groups file is damaged: group operations are refused; volumes are served");
                GroupState { groups: Groups::default(), damage: Some(error.to_string()) }
            }
        })
    }
}

/// Where a group revert goes.
#[derive(Clone, Copy, Debug)]
pub enum GroupRevertTo<'a> {
    /// The group bookmark of this name.
    Bookmark(&'a str),
    /// Each member's state just before its last revert.
    Undo,
}

impl Node {
    /// The node's groups.
    pub fn groups(&self) -> Result<Vec<Group>, EngineError> {
        let state = self.groups.lock();
        check_readable(&state)?;
        Ok(state.groups.entries.clone())
    }

    /// The group `name`.
    pub fn group(&self, name: &str) -> Result<Group, EngineError> {
        let state = self.groups.lock();
        check_readable(&state)?;
        state.groups.get(name).cloned().ok_or_else(|| EngineError::GroupNotFound(name.to_owned()))
    }

    /// Whether `name` is a group's (which no volume may take).
    pub(crate) fn is_group(&self, name: &str) -> bool {
        self.groups.lock().groups.get(name).is_some()
    }

    pub fn create_group(&self, name: VolumeName, members: &[VolumeName]) -> Result<Group, EngineError> {
        let _admin = self.admin.lock();
        if self.volumes.read().contains_key(name.as_str()) || self.damaged.read().contains_key(name.as_str()) {
            return Err(EngineError::InvalidArgument(format!(
                "a volume is named {name}; a group needs a name of its own"
            )));
        }
        self.change_groups(|groups| {
            if groups.get(name.as_str()).is_some() {
                return Err(EngineError::InvalidArgument(format!("group {name} already exists")));
            }
            if groups.entries.len() >= Groups::COUNT_MAX {
                return Err(EngineError::InvalidArgument(format!(
                    "the node has {} groups, the most",
                    Groups::COUNT_MAX
                )));
            }
            groups.entries.push(Group { name: name.clone(), members: Vec::new(), bookmarks: Vec::new(), revert: None });
            Ok(())
        })?;
        self.change_members(name.as_str(), members, &[])
    }

    /// Adds `add` to group `name` and removes `remove` from it. A member
    /// removed leaves the group's bookmarks (its own bookmarks stay).
    pub fn change_group(&self, name: &str, add: &[VolumeName], remove: &[VolumeName]) -> Result<Group, EngineError> {
        let _admin = self.admin.lock();
        self.change_members(name, add, remove)
    }

    /// [`Node::change_group`] under the admin lock (no volume comes or goes).
    fn change_members(&self, name: &str, add: &[VolumeName], remove: &[VolumeName]) -> Result<Group, EngineError> {
        let volumes = self.volumes.read().clone();
        self.change_groups(|groups| {
            for volume in add {
                if !volumes.contains_key(volume.as_str()) {
                    return Err(EngineError::VolumeNotFound(volume.to_string()));
                }
                if let Some(other) = groups.of_member(volume.as_str()) {
                    return Err(EngineError::InvalidArgument(format!(
                        "volume {volume} is in group {} already; a volume is in one group at most",
                        other.name
                    )));
                }
            }
            let group = group_mut(groups, name)?;
            if group.revert.is_some() {
                return Err(unfinished_revert(name));
            }
            for volume in remove {
                if !group.members.contains(volume) {
                    return Err(EngineError::InvalidArgument(format!("volume {volume} is not in group {name}")));
                }
            }
            if group.members.len() + add.len() > Groups::MEMBERS_MAX {
                return Err(EngineError::InvalidArgument(format!(
                    "a group has {} members at most",
                    Groups::MEMBERS_MAX
                )));
            }
            for volume in add {
                if !group.members.contains(volume) {
                    group.members.push(volume.clone());
                }
            }
            group.members.retain(|member| !remove.contains(member));
            group.members.sort();
            for bookmark in &mut group.bookmarks {
                bookmark.members.retain(|point| !remove.contains(&point.volume));
            }
            Ok(())
        })?;
        self.group(name)
    }

    /// Deletes group `name`; its members and their bookmarks stay.
    pub fn delete_group(&self, name: &str) -> Result<Group, EngineError> {
        let mut deleted = None;
        self.change_groups(|groups| {
            let index = groups.entries.iter().position(|group| group.name.as_str() == name);
            let index = index.ok_or_else(|| EngineError::GroupNotFound(name.to_owned()))?;
            if groups.entries[index].revert.is_some() {
                return Err(unfinished_revert(name));
            }
            deleted = Some(groups.entries.remove(index));
            Ok(())
        })?;
        Ok(deleted.expect("removed"))
    }

    /// Takes group bookmark `bookmark` on every member of group `name` at
    /// one instant (see [`Volume::bookmark_together`]).
    pub fn bookmark_group(
        &self,
        name: &str,
        bookmark: BookmarkName,
        now: Timestamp,
    ) -> Result<GroupBookmark, EngineError> {
        let mut state = self.groups.lock();
        check_readable(&state)?;
        let group = state.groups.get(name).ok_or_else(|| EngineError::GroupNotFound(name.to_owned()))?;
        if group.bookmark(bookmark.as_str()).is_some() {
            return Err(EngineError::InvalidArgument(format!("group {name} already has a bookmark {bookmark}")));
        }
        if group.bookmarks.len() >= Groups::BOOKMARKS_MAX {
            return Err(EngineError::InvalidArgument(format!(
                "group {name} has {} bookmarks, the most",
                Groups::BOOKMARKS_MAX
            )));
        }
        if group.members.is_empty() {
            return Err(EngineError::InvalidArgument(format!("group {name} has no members to bookmark")));
        }
        let members = self.members(group)?;
        let mut taken = None;
        Volume::bookmark_together(&members, &bookmark, now, |times| {
            let points = members
                .iter()
                .zip(times)
                .map(|(volume, &at)| MemberPoint { volume: volume.name().clone(), at })
                .collect();
            let mut next = state.groups.clone();
            let recorded = GroupBookmark { name: bookmark.clone(), members: points };
            group_mut(&mut next, name)?.bookmarks.push(recorded.clone());
            self.save_groups(&next)?;
            state.groups = next;
            taken = Some(recorded);
            Ok(())
        })?;
        let taken = taken.expect("committed");
        tracing::info!(group = name, bookmark = %bookmark, members = taken.members.len(), "bookmarked a group");
        Ok(taken)
    }

    /// Deletes group bookmark `bookmark` of group `name`, and each member's.
    pub fn delete_group_bookmark(&self, name: &str, bookmark: &str) -> Result<GroupBookmark, EngineError> {
        let mut state = self.groups.lock();
        check_readable(&state)?;
        let mut next = state.groups.clone();
        let group = group_mut(&mut next, name)?;
        let index = group.bookmarks.iter().position(|taken| taken.name.as_str() == bookmark);
        let index = index.ok_or_else(|| no_bookmark(name, bookmark))?;
        let removed = group.bookmarks.remove(index);
        // First the group's record: a crash after it leaves the members'
        // bookmarks as their own, nothing lost.
        self.save_groups(&next)?;
        state.groups = next;
        for point in &removed.members {
            if let Ok(volume) = self.volume(point.volume.as_str()) {
                match volume.delete_bookmark(bookmark) {
                    Ok(_) | Err(EngineError::BookmarkNotFound { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(removed)
    }

    /// Deletes bookmark `bookmark` of volume `volume`, unless it is the
    /// volume's share of a group bookmark (deleted with the group's).
    pub fn delete_bookmark(&self, volume: &str, bookmark: &str) -> Result<(), EngineError> {
        let state = self.groups.lock();
        let volume_handle = self.volume(volume)?;
        if let Some(group) = state.groups.of_member(volume) {
            let shared = group
                .bookmark(bookmark)
                .is_some_and(|taken| taken.members.iter().any(|point| point.volume.as_str() == volume));
            if shared {
                return Err(EngineError::InvalidArgument(format!(
                    "bookmark {bookmark} of volume {volume} is its part of group {}'s bookmark {bookmark}; delete \
                     that (`rewind bookmark delete {} {bookmark}`), which deletes every member's",
                    group.name, group.name
                )));
            }
        }
        volume_handle.delete_bookmark(bookmark).map(|_| ())
    }

    /// Reverts every member of group `name` to `to`, or none: each is
    /// checked first, then the intent is recorded, then each is reverted.
    /// A member's revert that fails part-way (a full disk) leaves the intent
    /// recorded: the next group revert finishes it first, as opening the
    /// node does.
    pub fn revert_group(
        &self,
        name: &str,
        to: GroupRevertTo<'_>,
        now: Timestamp,
        writers: Writers,
    ) -> Result<Vec<(VolumeName, RevertReport)>, EngineError> {
        let mut state = self.groups.lock();
        check_readable(&state)?;
        let mut group = state.groups.get(name).ok_or_else(|| EngineError::GroupNotFound(name.to_owned()))?.clone();
        if let Some(unfinished) = group.revert.clone() {
            self.finish_revert(&mut state, name, &unfinished, Members::NotYetReverted, writers)?;
            tracing::info!(group = name, "finished a group revert that had failed part-way");
            group.revert = None;
        }
        let members = self.members(&group)?;
        let points: Vec<MemberPoint> = match to {
            GroupRevertTo::Bookmark(bookmark) => {
                let taken = group.bookmark(bookmark).ok_or_else(|| no_bookmark(name, bookmark))?;
                let uncovered: Vec<&str> = group
                    .members
                    .iter()
                    .filter(|member| !taken.members.iter().any(|point| point.volume == **member))
                    .map(VolumeName::as_str)
                    .collect();
                if !uncovered.is_empty() {
                    return Err(EngineError::InvalidArgument(format!(
                        "group bookmark {bookmark} was taken before {} joined group {name}: it has no point to \
                         revert {} to; remove {} from the group first",
                        uncovered.join(", "),
                        if uncovered.len() == 1 { "it" } else { "them" },
                        if uncovered.len() == 1 { "it" } else { "them" },
                    )));
                }
                taken.members.clone()
            }
            GroupRevertTo::Undo => members
                .iter()
                .map(|volume| Ok(MemberPoint { volume: volume.name().clone(), at: volume.undo_point()? }))
                .collect::<Result<_, EngineError>>()?,
        };
        for (volume, point) in members.iter().zip(&points) {
            assert_eq!(volume.name(), &point.volume, "members and points are both in name order");
            volume.check_revert(point.at, now, writers)?;
        }
        let revert = GroupRevert { began: now, members: points };
        let mut next = state.groups.clone();
        group_mut(&mut next, name)?.revert = Some(revert.clone());
        self.save_groups(&next)?;
        state.groups = next;
        let reports = self.finish_revert(&mut state, name, &revert, Members::All, writers)?;
        tracing::info!(group = name, members = reports.len(), "reverted a group");
        Ok(reports)
    }

    /// Reverts each member of group `name` as `revert`, recorded, says —
    /// with `Members::NotYetReverted`, only those it has not reverted yet —
    /// then clears the record. Stops at the first failure, the record kept.
    fn finish_revert(
        &self,
        state: &mut GroupState,
        name: &str,
        revert: &GroupRevert,
        members: Members,
        writers: Writers,
    ) -> Result<Vec<(VolumeName, RevertReport)>, EngineError> {
        let mut reports = Vec::with_capacity(revert.members.len());
        for point in &revert.members {
            let volume = self.volume(point.volume.as_str())?;
            let done = members == Members::NotYetReverted && volume.reverted_to_since(point.at, revert.began);
            if !done {
                reports.push((point.volume.clone(), volume.revert(point.at, revert.began, writers)?));
            }
        }
        let mut next = state.groups.clone();
        group_mut(&mut next, name)?.revert = None;
        self.save_groups(&next)?;
        state.groups = next;
        Ok(reports)
    }

    /// A new group `name` of writable clones of the volumes group bookmark
    /// `bookmark` of group `group` covers, each at its point and named
    /// `<name>-<volume>`: a copy of the application as it was at that one
    /// instant. Nothing is copied (see [`Node::clone_volume`]). The group is
    /// made first and each clone joins it once made, so a crash part-way
    /// leaves the new group with the clones made so far, each exact; a
    /// failure part-way removes what was made.
    pub fn clone_group(
        &self,
        group: &str,
        bookmark: &str,
        name: VolumeName,
        now: Timestamp,
    ) -> Result<Group, EngineError> {
        let source = self.group(group)?;
        let taken = source.bookmark(bookmark).ok_or_else(|| no_bookmark(group, bookmark))?;
        let clones = taken
            .members
            .iter()
            .map(|point| {
                let clone = VolumeName::new(&format!("{name}-{}", point.volume)).map_err(|error| {
                    EngineError::InvalidArgument(format!("the clone of {} cannot be named: {error}", point.volume))
                })?;
                let taken = self.volumes.read().contains_key(clone.as_str())
                    || self.damaged.read().contains_key(clone.as_str())
                    || self.is_group(clone.as_str());
                if taken {
                    return Err(EngineError::VolumeExists(clone.to_string()));
                }
                Ok((point, clone))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        self.create_group(name.clone(), &[])?;
        // Only the clones this call made are removed if it fails: a name
        // taken meanwhile (or set aside as damaged) is someone else's.
        let mut made_here = Vec::new();
        let made = clones.iter().try_for_each(|(point, clone)| {
            self.clone_volume(point.volume.as_str(), Some(point.at), clone.clone(), now)?;
            made_here.push(clone);
            self.change_group(name.as_str(), std::slice::from_ref(clone), &[]).map(|_| ())
        });
        if let Err(error) = made {
            for clone in made_here {
                if let Err(cleanup) = self.delete_volume(clone.as_str(), crate::InUse::Force, crate::Clones::Refuse) {
                    if !matches!(cleanup, EngineError::VolumeNotFound(_)) {
                        tracing::warn!(volume = %clone, %cleanup, "cannot remove a clone of a group clone that failed");
                    }
                }
            }
            if let Err(cleanup) = self.delete_group(name.as_str()) {
                tracing::warn!(group = %name, %cleanup, "cannot remove a group clone that failed");
            }
            return Err(error);
        }
        tracing::info!(group, bookmark, clone = %name, members = clones.len(), "cloned a group");
        self.group(name.as_str())
    }

    /// After opening: finishes a group revert a crash interrupted, and
    /// saves the members' shares of group bookmarks a crash left out.
    pub(crate) fn finish_groups(&self) {
        let mut state = self.groups.lock();
        if state.damage.is_some() {
            return;
        }
        for group in state.groups.entries.clone() {
            for bookmark in &group.bookmarks {
                for point in &bookmark.members {
                    let Ok(volume) = self.volume(point.volume.as_str()) else { continue };
                    if !volume.lacks_bookmark(&bookmark.name) {
                        continue;
                    }
                    match volume.complete_bookmark(&bookmark.name, point.at) {
                        Ok(()) => tracing::info!(
                            group = %group.name, bookmark = %bookmark.name, volume = %point.volume,
                            "a crash or a failed save came between a group bookmark and a member's share of it: \
                             saved it"
                        ),
                        Err(error) => tracing::error!(
                            group = %group.name, bookmark = %bookmark.name, volume = %point.volume, %error,
                            "cannot save a member's share of a group bookmark; its point stays held, and the next \
                             start tries again"
                        ),
                    }
                }
            }
            let Some(revert) = &group.revert else { continue };
            match self.finish_revert(
                &mut state,
                group.name.as_str(),
                revert,
                Members::NotYetReverted,
                Writers::Disconnect,
            ) {
                Ok(_) => tracing::info!(group = %group.name, "finished a group revert a crash interrupted"),
                Err(error) => tracing::error!(
                    group = %group.name, %error,
                    "cannot finish a group revert a crash interrupted; the group waits for it (its volumes are served)"
                ),
            }
        }
    }

    /// Removes `volume`, being deleted under the admin lock, from its group.
    pub(crate) fn leave_group(&self, volume: &str) -> Result<(), EngineError> {
        let Some(group) = self.groups.lock().groups.of_member(volume).map(|group| group.name.clone()) else {
            return Ok(());
        };
        let member = VolumeName::new(volume).map_err(|error| EngineError::InvalidArgument(error.to_string()))?;
        self.change_members(group.as_str(), &[], &[member]).map(|_| ())
    }

    /// The open members of `group`, in name order.
    fn members(&self, group: &Group) -> Result<Vec<Arc<Volume>>, EngineError> {
        group.members.iter().map(|member| self.volume(member.as_str())).collect()
    }

    /// Applies `change` to a copy of the groups and saves it.
    fn change_groups(&self, change: impl FnOnce(&mut Groups) -> Result<(), EngineError>) -> Result<(), EngineError> {
        let mut state = self.groups.lock();
        check_readable(&state)?;
        let mut next = state.groups.clone();
        change(&mut next)?;
        self.save_groups(&next)?;
        state.groups = next;
        Ok(())
    }

    fn save_groups(&self, groups: &Groups) -> Result<(), EngineError> {
        write_file_atomic(&*self.storage, GROUPS_FILE, &groups.encode()).map_err(EngineError::io(GROUPS_FILE))
    }
}

fn check_readable(state: &GroupState) -> Result<(), EngineError> {
    match &state.damage {
        None => Ok(()),
        Some(damage) => Err(EngineError::Corrupt {
            volume: "(groups)".to_owned(),
            detail: format!(
                "the node's groups file is damaged in both its copies ({damage}); groups cannot be used until it \
                 is removed (the file `groups` in the data directory, with the server stopped: the volumes and \
                 their bookmarks stay, the groups are gone and can be made again)"
            ),
        }),
    }
}

fn group_mut<'a>(groups: &'a mut Groups, name: &str) -> Result<&'a mut Group, EngineError> {
    groups
        .entries
        .iter_mut()
        .find(|group| group.name.as_str() == name)
        .ok_or_else(|| EngineError::GroupNotFound(name.to_owned()))
}

fn no_bookmark(group: &str, bookmark: &str) -> EngineError {
    EngineError::InvalidArgument(format!(
        "group {group} has no bookmark {bookmark:?}; `rewind bookmark list {group}` shows them"
    ))
}

/// Which members of a recorded group revert to revert.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Members {
    /// Every one: the revert was recorded just now.
    All,
    /// Those not reverted to their point since it began: finishing one
    /// that failed or was cut short part-way.
    NotYetReverted,
}

fn unfinished_revert(name: &str) -> EngineError {
    EngineError::InvalidArgument(format!(
        "group {name} has a revert that did not finish on every member; revert the group again (`rewind revert \
         {name} …`), which finishes it first, or restart the server"
    ))
}
