//! The NBD server's transmission phase, stateful: a valid handshake chosen by
//! the first byte (export, structured replies, base:allocation, a dirty
//! bitmap, GO or EXPORT_NAME, NO_ZEROES), then requests — the input's bytes as they are, or
//! requests built from it so that most of them are framed right — served by
//! the real connection code with its validation, window, workers and
//! replies, under limits chosen by the second byte. Every complete request
//! must get exactly one well-formed reply (a READ exactly its bytes), the
//! export must only see ranges the server validated (it asserts that), and
//! memory must stay within the per-connection bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_fuzz::{nbd, peak_heap_bytes, Cursor};
use rewind_nbd::fuzzing::serve_connection;
use rewind_nbd::protocol as p;
use rewind_nbd::ServerConfig;

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&p::IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn string(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// A handshake a well-behaved client would send.
fn handshake(choice: u8) -> (Vec<u8>, &'static nbd::ExportShape) {
    let export = &nbd::EXPORTS[usize::from(choice & 3)];
    let structured = choice & 4 != 0;
    let base_allocation = choice & 8 != 0;
    let go = choice & 16 != 0;
    let no_zeroes = choice & 32 != 0;
    let dirty_bitmap = choice & 64 != 0;
    let mut out = Vec::new();
    let flags = p::FLAG_C_FIXED_NEWSTYLE | if no_zeroes { p::FLAG_C_NO_ZEROES } else { 0 };
    out.extend_from_slice(&flags.to_be_bytes());
    if structured {
        option(&mut out, p::OPT_STRUCTURED_REPLY, &[]);
    }
    let bitmap = format!("{}{}", p::META_DIRTY_BITMAP_PREFIX, nbd::DIRTY_BITMAP);
    let contexts: Vec<&str> = [(base_allocation, p::META_BASE_ALLOCATION), (dirty_bitmap, bitmap.as_str())]
        .into_iter()
        .filter_map(|(chosen, context)| chosen.then_some(context))
        .collect();
    if !contexts.is_empty() {
        let mut data = Vec::new();
        string(&mut data, export.name);
        data.extend_from_slice(&(contexts.len() as u32).to_be_bytes());
        for context in contexts {
            string(&mut data, context);
        }
        option(&mut out, p::OPT_SET_META_CONTEXT, &data);
    }
    if go {
        let mut data = Vec::new();
        string(&mut data, export.name);
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&p::INFO_BLOCK_SIZE.to_be_bytes());
        option(&mut out, p::OPT_GO, &data);
    } else {
        option(&mut out, p::OPT_EXPORT_NAME, export.name.as_bytes());
    }
    (out, export)
}

/// Requests built from the input, 12 bytes each: mostly framed right and
/// mostly in range, so that the fuzzer spends its time past validation.
fn requests(input: &mut Cursor<'_>, export: &nbd::ExportShape, out: &mut Vec<u8>) {
    while !input.is_empty() {
        let command = input.u8();
        let flags = input.u8();
        let offset = u64::from(input.u32());
        let length = input.u32();
        // Low bits: one of the commands; high bits: anything at all.
        let command = if command & 0x80 == 0 { u16::from(command & 7) } else { u16::from(command) << 4 };
        let offset = if flags & 0x80 == 0 { offset % (export.size_bytes + 4096) } else { offset << 20 };
        // Writes carry their payload in the stream, so they stay small
        // (building megabytes per input was most of the time per input);
        // reads may be as large as the export, past INLINE_BYTES_MAX.
        let length_max = if command == p::CMD_WRITE { 16 << 10 } else { (256 << 10) + 4096 };
        let length = if flags & 0x40 == 0 { length % length_max } else { length };
        let length = if command == p::CMD_FLUSH && flags & 0x20 == 0 { 0 } else { length };
        let offset = if command == p::CMD_FLUSH && flags & 0x20 == 0 { 0 } else { offset };
        out.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&u16::from(flags & 0x1f).to_be_bytes());
        out.extend_from_slice(&command.to_be_bytes());
        out.extend_from_slice(&0u64.to_be_bytes()); // the handle, numbered by the model
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&length.to_be_bytes());
        if command == p::CMD_WRITE && length <= 64 << 10 {
            out.extend((0..length).map(|index| (index as u8) ^ flags));
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let (mut stream, export) = handshake(input.u8());
    let limits = input.u8();
    let config = ServerConfig {
        workers_per_connection_max: 1 + usize::from(limits & 3),
        requests_in_flight_max: [1, 2, 8, 64][usize::from(limits >> 2 & 3)],
        ..ServerConfig::default()
    };
    // A client that stops reading after a while, or one that reads everything.
    let output_bytes_max = [16 << 20, 16 << 20, 300, 70_000][usize::from(limits >> 4 & 3)];
    if limits & 0x80 == 0 {
        requests(&mut input, export, &mut stream);
    } else {
        stream.extend_from_slice(input.rest());
    }
    let (stream, plan) = nbd::plan(&stream);
    let (exchange, peak) = peak_heap_bytes(|| serve_connection(nbd::catalog(), config, &stream, output_bytes_max));
    nbd::check(&plan, &exchange.output, exchange.output_refused);
    let bound = rewind_nbd::server::BUFFER_BYTES_PER_CONNECTION_MAX + (4 << 20) + exchange.output.capacity();
    assert!(peak <= bound, "{peak} heap bytes for one connection (bound {bound})");
});
