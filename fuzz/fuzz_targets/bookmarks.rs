//! The `bookmarks` file from fuzzed bytes (`rewind_fuzz::check_envelope` for
//! the shared properties). Also: at most `COUNT_MAX` bookmarks, each with a
//! valid name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::Bookmarks;
use rewind_types::BookmarkName;

fuzz_target!(|input: &[u8]| {
    let Some((bookmarks, _)) = rewind_fuzz::check_envelope(input, Bookmarks::decode, Bookmarks::encode) else { return };
    assert!(bookmarks.entries.len() <= Bookmarks::COUNT_MAX);
    for bookmark in &bookmarks.entries {
        assert!(BookmarkName::new(bookmark.name.as_str()).is_ok(), "an invalid bookmark name accepted");
    }
});
