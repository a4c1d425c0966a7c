//! Retention policies as operators type them (`all:2h, 1m:24h, 1h:7d`,
//! `forever`).
//!
//! Properties: no panic; what parses is at most `TIERS_MAX` tiers, and reads
//! back the same from its display (parse, display, parse); checking it
//! against a granularity chosen by the input never panics; a policy that
//! passes the check survives the `policy` file's encoding unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_engine::timespec::{display_retention, parse_retention};
use rewind_format::meta::{RetentionTier, VolumePolicy};
use rewind_fuzz::Cursor;

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let granularity_nanos = match input.u8() & 3 {
        0 => 0,
        1 => 1_000_000_000,
        2 => 60_000_000_000,
        _ => u64::from(input.u32()),
    };
    let Ok(text) = std::str::from_utf8(input.rest()) else { return };
    let Ok(tiers) = parse_retention(text) else { return };
    assert!(tiers.len() <= VolumePolicy::TIERS_MAX);
    let shown = display_retention(&tiers);
    assert_eq!(parse_retention(&shown), Ok(tiers.clone()), "{text:?} shown as {shown:?} reads back differently");
    if RetentionTier::check(&tiers, granularity_nanos).is_ok() {
        let policy = VolumePolicy { granularity_nanos, retention: tiers, ..VolumePolicy::default() };
        assert_eq!(VolumePolicy::decode(&policy.encode()), Ok(policy), "a checked policy does not survive its file");
    }
});
