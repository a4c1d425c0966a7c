//! The version index manifest: decoded from fuzzed bytes (envelope sealed
//! first, or not, by the first byte), then opened through the real index.
//!
//! Properties: no panic; memory in proportion to the input, never to the run
//! count it claims; what is accepted re-encodes to something that decodes
//! the same; one flipped bit of an accepted manifest is rejected; the index
//! opens a manifest it accepts or says why not (the runs it lists are not
//! there), without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::IndexManifest;
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, seal_envelope, storage_with, Cursor};
use rewind_index::{IndexConfig, PageCache, VersionIndex};

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let mut bytes = input.rest().to_vec();
    if mode & 1 != 0 {
        seal_envelope(&mut bytes);
    }
    let (decoded, peak) = peak_heap_bytes(|| IndexManifest::decode(&bytes));
    assert_heap_follows_input(peak, bytes.len(), 4, 1024);
    let Ok(manifest) = decoded else { return };
    assert_eq!(IndexManifest::decode(&manifest.encode()).as_ref(), Ok(&manifest), "round trip");
    let bit = (manifest.run_id_next as usize) % (bytes.len() * 8);
    let mut damaged = bytes.clone();
    damaged[bit / 8] ^= 1 << (bit % 8);
    assert!(IndexManifest::decode(&damaged).is_err(), "bit {bit} flipped and the manifest still decodes");

    let storage = storage_with(&[("index/manifest", &bytes)]);
    let config = IndexConfig { late_entries: manifest.late_entries, ..IndexConfig::default() };
    let opened = VersionIndex::open(storage, "index", config, PageCache::new(1 << 20));
    assert_eq!(opened.is_ok(), manifest.runs.is_empty(), "opened with runs that are not there, or refused none");
});
