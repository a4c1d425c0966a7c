//! `volume.meta` from fuzzed bytes (`rewind_fuzz::check_envelope` for the
//! shared properties). Also: what decodes names a valid volume whose size is
//! a whole number of blocks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::VolumeMeta;
use rewind_types::VolumeName;

fuzz_target!(|input: &[u8]| {
    let Some((meta, _)) = rewind_fuzz::check_envelope(input, VolumeMeta::decode, VolumeMeta::encode) else { return };
    assert!(VolumeName::new(meta.name.as_str()).is_ok(), "an invalid name accepted");
    assert_eq!(meta.size_bytes % u64::from(meta.block_size.bytes()), 0, "a size of part blocks accepted");
});
