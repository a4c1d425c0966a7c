//! `groups`: the node's consistency groups (`docs/format/metadata.md`), a
//! metadata file of two copies like a volume's. A group names volumes that
//! are bookmarked and reverted together. A group bookmark records the exact
//! point of each member it was taken on; it is the commit point of the
//! bookmark (the members' own bookmarks are written after it, and opening
//! the node writes any a crash left out). A group revert is recorded here
//! before any member is reverted and cleared when all are: opening the node
//! finishes one a crash interrupted, so it happens on every member or none.

use rewind_types::{BookmarkName, Timestamp, VolumeName};

use crate::meta::{finish, open_envelope, seal_envelope};
use crate::{FormatError, Reader, Writer};

/// One member's exact point in a group bookmark or revert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPoint {
    pub volume: VolumeName,
    pub at: Timestamp,
}

/// One instant across the members it was taken on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupBookmark {
    pub name: BookmarkName,
    pub members: Vec<MemberPoint>,
}

/// A group revert begun (`began`, the node's clock) and not yet done on
/// every member: each member goes to its point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRevert {
    pub began: Timestamp,
    pub members: Vec<MemberPoint>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Shares the volumes' namespace: no volume has a group's name.
    pub name: VolumeName,
    pub members: Vec<VolumeName>,
    pub bookmarks: Vec<GroupBookmark>,
    pub revert: Option<GroupRevert>,
}

impl Group {
    /// A bookmark of this group by name.
    pub fn bookmark(&self, name: &str) -> Option<&GroupBookmark> {
        self.bookmarks.iter().find(|bookmark| bookmark.name.as_str() == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Groups {
    pub entries: Vec<Group>,
}

impl Groups {
    const MAGIC: [u8; 4] = *b"RWGR";
    const WHAT: &'static str = "groups";
    pub const COUNT_MAX: usize = 1 << 12;
    pub const MEMBERS_MAX: usize = 256;
    pub const BOOKMARKS_MAX: usize = 1 << 16;

    /// The group `volume` is a member of.
    pub fn of_member(&self, volume: &str) -> Option<&Group> {
        self.entries.iter().find(|group| group.members.iter().any(|member| member.as_str() == volume))
    }

    pub fn get(&self, name: &str) -> Option<&Group> {
        self.entries.iter().find(|group| group.name.as_str() == name)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u32(self.entries.len() as u32);
        for group in &self.entries {
            payload.str(group.name.as_str()).u32(group.members.len() as u32);
            for member in &group.members {
                payload.str(member.as_str());
            }
            payload.u32(group.bookmarks.len() as u32);
            for bookmark in &group.bookmarks {
                payload.str(bookmark.name.as_str());
                encode_points(&mut payload, &bookmark.members);
            }
            match &group.revert {
                None => {
                    payload.u8(0);
                }
                Some(revert) => {
                    payload.u8(1).u64(revert.began.unix_nanos());
                    encode_points(&mut payload, &revert.members);
                }
            }
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let count = reader.u32()? as usize;
        if count > Self::COUNT_MAX {
            return Err(reader.invalid(format!("{count} groups")));
        }
        // A group takes at least a name length and three counts.
        let mut entries: Vec<Group> = Vec::with_capacity(reader.capacity_for(count, 2 + 4 + 4 + 1));
        for _ in 0..count {
            let name = volume_name(&mut reader)?;
            let members = reader.u32()? as usize;
            if members > Self::MEMBERS_MAX {
                return Err(reader.invalid(format!("group {name} has {members} members")));
            }
            let mut group_members: Vec<VolumeName> = Vec::with_capacity(reader.capacity_for(members, 2));
            for _ in 0..members {
                let member = volume_name(&mut reader)?;
                let taken = group_members.contains(&member)
                    || entries.iter().any(|group| group.name == member || group.members.contains(&member));
                if taken || member == name {
                    return Err(reader.invalid(format!("volume {member} is in more than one group, or twice")));
                }
                group_members.push(member);
            }
            if entries.iter().any(|group| group.name == name || group.members.contains(&name)) {
                return Err(reader.invalid(format!("group {name} is named twice")));
            }
            let bookmark_count = reader.u32()? as usize;
            if bookmark_count > Self::BOOKMARKS_MAX {
                return Err(reader.invalid(format!("group {name} has {bookmark_count} bookmarks")));
            }
            let mut bookmarks: Vec<GroupBookmark> = Vec::with_capacity(reader.capacity_for(bookmark_count, 2 + 4));
            for _ in 0..bookmark_count {
                let bookmark = BookmarkName::new(reader.str()?).map_err(|error| reader.invalid(error.to_string()))?;
                if bookmarks.iter().any(|existing| existing.name == bookmark) {
                    return Err(reader.invalid(format!("group {name} has bookmark {bookmark} twice")));
                }
                let points = decode_points(&mut reader, &group_members)?;
                bookmarks.push(GroupBookmark { name: bookmark, members: points });
            }
            let revert = match reader.u8()? {
                0 => None,
                1 => {
                    let began = Timestamp::from_unix_nanos(reader.u64()?);
                    Some(GroupRevert { began, members: decode_points(&mut reader, &group_members)? })
                }
                other => return Err(reader.invalid(format!("revert marker {other}"))),
            };
            entries.push(Group { name, members: group_members, bookmarks, revert });
        }
        finish(reader)?;
        Ok(Groups { entries })
    }
}

fn volume_name(reader: &mut Reader<'_>) -> Result<VolumeName, FormatError> {
    VolumeName::new(reader.str()?).map_err(|error| reader.invalid(error.to_string()))
}

fn encode_points(payload: &mut Writer, points: &[MemberPoint]) {
    payload.u32(points.len() as u32);
    for point in points {
        payload.str(point.volume.as_str()).u64(point.at.unix_nanos());
    }
}

/// Points of distinct volumes among `members`.
fn decode_points(reader: &mut Reader<'_>, members: &[VolumeName]) -> Result<Vec<MemberPoint>, FormatError> {
    let count = reader.u32()? as usize;
    if count > members.len() {
        return Err(reader.invalid(format!("{count} points for {} members", members.len())));
    }
    let mut points: Vec<MemberPoint> = Vec::with_capacity(count);
    for _ in 0..count {
        let volume = volume_name(reader)?;
        if !members.contains(&volume) || points.iter().any(|point| point.volume == volume) {
            return Err(reader.invalid(format!("a point of {volume}, which is not a member or has one already")));
        }
        points.push(MemberPoint { volume, at: Timestamp::from_unix_nanos(reader.u64()?) });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> VolumeName {
        VolumeName::new(text).unwrap()
    }

    fn sample() -> Groups {
        let point = |volume: &str, at: u64| MemberPoint { volume: name(volume), at: Timestamp::from_unix_nanos(at) };
        Groups {
            entries: vec![
                Group {
                    name: name("shop"),
                    members: vec![name("db"), name("logs")],
                    bookmarks: vec![GroupBookmark {
                        name: BookmarkName::new("before-migration").unwrap(),
                        members: vec![point("db", 10), point("logs", 11)],
                    }],
                    revert: Some(GroupRevert { began: Timestamp::from_unix_nanos(20), members: vec![point("db", 10)] }),
                },
                Group { name: name("empty"), members: Vec::new(), bookmarks: Vec::new(), revert: None },
            ],
        }
    }

    #[test]
    fn groups_round_trip_and_refuse_a_volume_in_two_groups() {
        let groups = sample();
        assert_eq!(Groups::decode(&groups.encode()).unwrap(), groups);
        assert_eq!(Groups::decode(&Groups::default().encode()).unwrap(), Groups::default());
        let mut twice = sample();
        twice.entries[1].members.push(name("db"));
        let error = Groups::decode(&twice.encode()).unwrap_err().to_string();
        assert!(error.contains("more than one group"), "{error}");
        let mut stranger = sample();
        stranger.entries[0].bookmarks[0].members[1].volume = name("other");
        let error = Groups::decode(&stranger.encode()).unwrap_err().to_string();
        assert!(error.contains("not a member"), "{error}");
    }
}
