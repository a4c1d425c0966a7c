//! The version index manifest: decoded from a metadata file made of fuzzed
//! bytes (`rewind_fuzz::check_envelope`: one or two copies, sealed or not),
//! then opened through the real index.
//!
//! Properties: those of every metadata file (no panic; memory in proportion
//! to the input, never to the run count it claims; round trip; one damaged
//! copy read from the other and healed, both damaged rejected); and the
//! index opens a manifest it accepts when it lists no runs, and otherwise
//! says why not (the runs it lists are not there), without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::IndexManifest;
use rewind_fuzz::storage_with;
use rewind_index::{IndexConfig, PageCache, VersionIndex};

fuzz_target!(|input: &[u8]| {
    let Some((manifest, bytes)) = rewind_fuzz::check_envelope(input, IndexManifest::decode, IndexManifest::encode)
    else {
        return;
    };
    let storage = storage_with(&[("index/manifest", &bytes)]);
    let config = IndexConfig { late_entries: manifest.late_entries, ..IndexConfig::default() };
    let opened = VersionIndex::open(storage, "index", config, PageCache::new(1 << 20));
    assert_eq!(opened.is_ok(), manifest.runs.is_empty(), "opened with runs that are not there, or refused none");
});
