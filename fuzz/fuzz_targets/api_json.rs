//! The HTTP API's JSON request bodies — `CreateVolume`, `UpdateVolume` (a
//! policy change), `CreateBookmark`, `CreateClone`, `RevertVolume`,
//! `CreateGroup`, `ChangeGroup` (its members), and the
//! door's `TokenSpec` and `GrantInfo` — deserialised from arbitrary bytes,
//! as axum's `Json` extractor does, then turned into what the engine is
//! given (`spec()`, `parse()`, the bookmark's name and time).
//!
//! Properties: no panic; memory in proportion to the body; what
//! deserialises serialises to JSON that deserialises the same; a spec that
//! validates names a valid volume with a valid block size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_access::{GrantInfo, TokenSpec};
use rewind_engine::timespec::parse_point_in_time;
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, Cursor};
use rewind_http::api::{
    ChangeGroup, CreateBookmark, CreateClone, CreateGroup, CreateVolume, RevertVolume, UpdateVolume,
};
use rewind_types::{BookmarkName, Timestamp, VolumeName};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn round_trip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(body: &[u8]) -> Option<T> {
    let (value, peak) = peak_heap_bytes(|| serde_json::from_slice::<T>(body));
    // serde_json grows strings and error messages as it goes.
    assert_heap_follows_input(peak, body.len(), 32, 64 << 10);
    let value = value.ok()?;
    let json = serde_json::to_vec(&value).expect("request bodies serialise");
    assert_eq!(serde_json::from_slice::<T>(&json).ok().as_ref(), Some(&value), "JSON round trip");
    Some(value)
}

/// A request's time, parsed as the server parses it.
fn parse_at(at: Option<&str>) {
    if let Some(at) = at {
        let now = Timestamp::from_unix_nanos(1_763_805_792_000_000_000);
        let _ = parse_point_in_time(at, now, &jiff::tz::TimeZone::UTC);
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let kind = input.u8();
    let body = input.rest();
    match kind % 9 {
        0 => {
            let Some(request) = round_trip::<CreateVolume>(body) else { return };
            if let Ok(spec) = request.spec() {
                assert_eq!(spec.name.as_str(), request.name, "the spec names another volume");
                assert_eq!(spec.size_bytes, request.size_bytes);
            }
        }
        1 => {
            let Some(request) = round_trip::<UpdateVolume>(body) else { return };
            let _ = request.parse();
        }
        3 => {
            round_trip::<TokenSpec>(body);
        }
        4 => {
            round_trip::<GrantInfo>(body);
        }
        5 => {
            let Some(request) = round_trip::<CreateClone>(body) else { return };
            let _ = VolumeName::new(&request.name);
            parse_at(request.at.as_deref());
        }
        6 => {
            let Some(request) = round_trip::<RevertVolume>(body) else { return };
            parse_at(request.to.as_deref());
        }
        7 => {
            let Some(request) = round_trip::<CreateGroup>(body) else { return };
            let _ = VolumeName::new(&request.name);
            for member in &request.members {
                let _ = VolumeName::new(member);
            }
        }
        8 => {
            let Some(request) = round_trip::<ChangeGroup>(body) else { return };
            for member in request.add.iter().chain(&request.remove) {
                let _ = VolumeName::new(member);
            }
        }
        _ => {
            let Some(request) = round_trip::<CreateBookmark>(body) else { return };
            let _ = BookmarkName::new(&request.name);
            parse_at(request.at.as_deref());
        }
    }
});
