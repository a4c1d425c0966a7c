//! The `checkpoint` file from fuzzed bytes (`rewind_fuzz::check_envelope`
//! for the properties).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::Checkpoint;

fuzz_target!(|input: &[u8]| {
    rewind_fuzz::check_envelope(input, Checkpoint::decode, Checkpoint::encode);
});
