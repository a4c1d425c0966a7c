//! The node's `groups` file from fuzzed bytes (`rewind_fuzz::check_envelope`
//! for the shared properties). Also: within the limits, no volume in two
//! groups or named like a group, and every point of a group bookmark or
//! revert is of a member, once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::groups::{Groups, MemberPoint};

fuzz_target!(|input: &[u8]| {
    let Some((groups, _)) = rewind_fuzz::check_envelope(input, Groups::decode, Groups::encode) else { return };
    assert!(groups.entries.len() <= Groups::COUNT_MAX);
    let mut names = std::collections::HashSet::new();
    for group in &groups.entries {
        assert!(group.members.len() <= Groups::MEMBERS_MAX && group.bookmarks.len() <= Groups::BOOKMARKS_MAX);
        for name in std::iter::once(&group.name).chain(&group.members) {
            assert!(names.insert(name.clone()), "{name} is a group or a member twice");
        }
        let points_of_members = |points: &[MemberPoint]| {
            let mut seen = std::collections::HashSet::new();
            points.iter().all(|point| group.members.contains(&point.volume) && seen.insert(&point.volume))
        };
        for bookmark in &group.bookmarks {
            assert!(points_of_members(&bookmark.members), "a bookmark point of a stranger accepted");
            assert_eq!(group.bookmark(bookmark.name.as_str()), Some(bookmark), "bookmark names are unique");
        }
        if let Some(revert) = &group.revert {
            assert!(points_of_members(&revert.members), "a revert point of a stranger accepted");
        }
    }
});
