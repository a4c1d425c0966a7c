//! `volume.meta` from fuzzed bytes (`rewind_fuzz::check_envelope` for the
//! shared properties). Also: what decodes names a valid volume whose size is
//! a whole number of blocks, and a clone's base (lent or copied by a
//! promote) is another volume at or before the clone's creation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::VolumeMeta;
use rewind_types::VolumeName;

fuzz_target!(|input: &[u8]| {
    let Some((meta, _)) = rewind_fuzz::check_envelope(input, VolumeMeta::decode, VolumeMeta::encode) else { return };
    assert!(VolumeName::new(meta.name.as_str()).is_ok(), "an invalid name accepted");
    assert_eq!(meta.size_bytes % u64::from(meta.block_size.bytes()), 0, "a size of part blocks accepted");
    if let Some(base) = &meta.base {
        assert!(base.volume != meta.name && base.at <= meta.created, "a base that cannot be accepted");
        assert_eq!(meta.lent_base().is_some(), !base.copied, "a copied base is not lent");
    }
});
