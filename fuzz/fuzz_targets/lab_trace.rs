//! Every trace reader of the lab — csv, fio, blkparse, msr, the binary
//! vscsi and oracle-general, and telling them apart — on fuzzed bytes, with
//! a device size and a request limit chosen by the first bytes.
//!
//! Properties: no panic; memory follows the bytes given (a line is never
//! held past `MAX_LINE_BYTES`, a length or count field never sizes an
//! allocation); every request read is in time order, within the request
//! limit and the device, and its blocks are countable without overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, Cursor};
use rewind_lab::trace::{read_all, Format, Op, ReadOptions, MAX_LINE_BYTES};

const FORMATS: [Option<Format>; 7] = [
    None,
    Some(Format::Csv),
    Some(Format::Fio),
    Some(Format::Blkparse),
    Some(Format::Msr),
    Some(Format::Vscsi),
    Some(Format::OracleGeneral),
];

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let format = FORMATS[usize::from(input.u8()) % FORMATS.len()];
    let limits = input.u8();
    let capacity_bytes = (limits & 1 == 1).then(|| input.u64() >> (input.u8() % 64));
    let max_request_bytes = 1u64 << (limits >> 2) % 48;
    let untyped_op = if limits & 2 == 0 { Op::Write } else { Op::Read };
    let bytes = input.rest();
    let options = ReadOptions { format, capacity_bytes, max_request_bytes, untyped_op, ..ReadOptions::default() };

    let (requests, peak) = peak_heap_bytes(|| read_all(bytes, "fuzz", options));
    // A request is 32 bytes and takes at least 8 of input (`0,W,0,0\n`);
    // the vector may have doubled past it. Slack: a line, its copy, the head.
    assert_heap_follows_input(peak, bytes.len(), 10, 2 * MAX_LINE_BYTES + (16 << 10));
    let Ok(requests) = requests else { return };
    for pair in requests.windows(2) {
        assert!(pair[0].time_nanos <= pair[1].time_nanos, "requests out of time order: {pair:?}");
    }
    for request in &requests {
        assert!(request.length_bytes <= max_request_bytes, "{request:?} longer than {max_request_bytes}");
        let end = request.offset_bytes.checked_add(request.length_bytes).expect("the reader refuses ends past 2^64");
        assert!(capacity_bytes.is_none_or(|capacity| end <= capacity), "{request:?} past {capacity_bytes:?}");
        let blocks = request.blocks(4096);
        assert!(blocks.start < blocks.end, "{request:?} touches no block");
    }
});
