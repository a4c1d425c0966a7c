//! The `policy` file from fuzzed bytes (`rewind_fuzz::check_envelope` for the
//! shared properties). Also: what decodes is a policy the engine may rely
//! on — retention tiers that nest and age, within `TIERS_MAX`; window floors
//! of a positive interval; deleted ranges sorted, disjoint, non-empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::{RetentionTier, VolumePolicy};

fuzz_target!(|input: &[u8]| {
    let Some((policy, _)) = rewind_fuzz::check_envelope(input, VolumePolicy::decode, VolumePolicy::encode) else {
        return;
    };
    assert!(policy.retention.len() <= VolumePolicy::TIERS_MAX);
    assert_eq!(RetentionTier::check(&policy.retention, policy.granularity_nanos), Ok(()));
    assert!(policy.floors.len() <= VolumePolicy::FLOORS_MAX);
    assert!(policy.floors.iter().all(|&(interval, _)| interval > 0));
    assert!(policy.deleted.iter().all(|(from, to)| from < to));
    assert!(policy.deleted.windows(2).all(|pair| pair[0].1 < pair[1].0));
});
