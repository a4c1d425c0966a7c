//! The append-only `timeline` file from fuzzed bytes: frames decoded until
//! the first that does not check out (a torn append).
//!
//! The first byte says whether to seal each frame's CRC first (walking the
//! frames by their bucket counts), so that runs of valid frames are common.
//!
//! Properties: no panic; memory in proportion to the input, never to a
//! bucket count; the valid prefix re-encodes byte for byte from the frames
//! decoded, and decoding just that prefix gives the same frames; one flipped
//! bit of a frame's checked bytes shortens it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::meta::TimelineFrame;
use rewind_fuzz::{assert_heap_follows_input, le_u32, peak_heap_bytes, seal_crc, Cursor};

const BUCKET_BYTES: usize = 40;

fn seal(bytes: &mut [u8]) {
    let mut at = 0;
    while let Some(count) = le_u32(bytes, at + 12) {
        let Some(end) = (count as usize).checked_mul(BUCKET_BYTES).map(|buckets| at + 16 + buckets) else { return };
        if end + 4 > bytes.len() {
            return;
        }
        seal_crc(bytes, at..end, end);
        at = end + 4;
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let mut bytes = input.rest().to_vec();
    if mode & 1 != 0 {
        seal(&mut bytes);
    }
    let ((frames, valid), peak) = peak_heap_bytes(|| TimelineFrame::decode_all(&bytes));
    assert_heap_follows_input(peak, bytes.len(), 4, 1024);
    assert!(valid <= bytes.len());
    let encoded: Vec<u8> = frames.iter().flat_map(TimelineFrame::encode).collect();
    assert_eq!(encoded, bytes[..valid], "the valid prefix is not the frames decoded");
    assert_eq!(TimelineFrame::decode_all(&bytes[..valid]), (frames.clone(), valid), "decoding the prefix again");
    if let Some(first) = frames.first() {
        // A flip in the first frame's LSN, buckets or CRC. Not its bucket
        // count: that moves where the CRC is read, and the fuzzer, seeing
        // the CRC compared, learns to put a valid one there.
        let length = 16 + first.buckets.len() * BUCKET_BYTES + 4;
        let bytes_flippable: Vec<usize> = (4..12).chain(16..length).collect();
        let byte = bytes_flippable[usize::from(mode) * 7919 % bytes_flippable.len()];
        let mut damaged = bytes.clone();
        damaged[byte] ^= 1 << (mode % 8);
        assert!(TimelineFrame::decode_all(&damaged).1 < valid, "byte {byte} flipped and every frame still checks out");
    }
});
