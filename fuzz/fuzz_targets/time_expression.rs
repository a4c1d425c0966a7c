//! Time expressions as operators type them (`-10m`, `10 minutes ago`, RFC
//! 3339, a local date and time, a time of day, Unix time, `now`, bookmark
//! names) and granularities, read with a `now` and a time zone chosen by the
//! input (UTC, a fixed offset, or a zone with daylight saving time).
//!
//! Properties: no panic; a time read back from its RFC 3339 display is the
//! same time; a relative time is never after `now`; a bookmark is read only
//! from a valid bookmark name, the trimmed input; a granularity read back
//! from its display is the same.
#![no_main]

use jiff::tz::{Offset, TimeZone};
use libfuzzer_sys::fuzz_target;
use rewind_engine::timespec::{display_granularity, parse_granularity, parse_point_in_time, DisplayTime, PointInTime};
use rewind_fuzz::Cursor;
use rewind_types::{BookmarkName, Timestamp};

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let now = Timestamp::from_unix_nanos(input.u64());
    let zone = match input.u8() % 3 {
        0 => TimeZone::UTC,
        1 => TimeZone::fixed(Offset::from_seconds(i32::from(input.u16() as i16) * 2).unwrap_or(Offset::UTC)),
        _ => TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").expect("a valid POSIX zone"),
    };
    let Ok(text) = std::str::from_utf8(input.rest()) else { return };

    match parse_point_in_time(text, now, &zone) {
        Ok(PointInTime::At(at)) => {
            let shown = DisplayTime(at).to_string();
            assert_eq!(
                parse_point_in_time(&shown, now, &zone),
                Ok(PointInTime::At(at)),
                "{text:?} read as {shown}, which reads back differently"
            );
            let trimmed = text.trim();
            if trimmed.starts_with('-') || trimmed.ends_with("ago") {
                assert!(at <= now, "the relative time {text:?} lies after now");
            }
        }
        Ok(PointInTime::Bookmark(name)) => {
            assert_eq!(name.as_str(), text.trim(), "a bookmark name other than the input");
            assert_eq!(BookmarkName::new(text.trim()), Ok(name));
        }
        Err(error) => assert!(error.to_string().contains("RFC 3339"), "an error that does not say what works"),
    }

    if let Ok(nanos) = parse_granularity(text) {
        if nanos > 0 {
            let shown = display_granularity(nanos);
            assert_eq!(parse_granularity(&shown), Ok(nanos), "granularity {text:?} shown as {shown}");
        }
    }
});
