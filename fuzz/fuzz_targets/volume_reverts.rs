//! The `reverts` file from fuzzed bytes (`rewind_fuzz::check_envelope` for
//! the shared properties). Also: at most `COUNT_MAX` reverts, in increasing
//! time, each to a point before it, and the era of any time is the last
//! revert at or before it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::Reverts;

fuzz_target!(|input: &[u8]| {
    let Some((reverts, _)) = rewind_fuzz::check_envelope(input, Reverts::decode, Reverts::encode) else { return };
    assert!(reverts.entries.len() <= Reverts::COUNT_MAX);
    for pair in reverts.entries.windows(2) {
        assert!(pair[0].at < pair[1].at, "reverts out of order accepted");
    }
    for revert in &reverts.entries {
        assert!(revert.to <= revert.before && revert.before < revert.at, "a revert to its future accepted");
        assert_eq!(reverts.era_of(Some(revert.at)), Some(revert), "a revert's own time is in its era");
        assert_ne!(reverts.era_of(Some(revert.before)), Some(revert), "the state before is not");
    }
    assert_eq!(reverts.era_of(None), reverts.entries.last());
});
