//! The NBD server's option phase, stateful: the input is everything a
//! client sends (flags, options, and requests if it gets that far), served
//! by the real connection code over an in-memory stream. The server must
//! not panic or hang, must answer every complete option with well-formed
//! replies that end in an ACK or an error, must enter transmission exactly
//! when the spec and the catalog say, and must keep its memory within the
//! per-connection bound whatever the lengths in the options claim.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_fuzz::{nbd, peak_heap_bytes};
use rewind_nbd::fuzzing::serve_connection;
use rewind_nbd::ServerConfig;

/// Replies a client takes before it stops reading.
const OUTPUT_BYTES_MAX: usize = 4 << 20;

fuzz_target!(|input: &[u8]| {
    let (stream, plan) = nbd::plan(input);
    let (exchange, peak) =
        peak_heap_bytes(|| serve_connection(nbd::catalog(), ServerConfig::default(), &stream, OUTPUT_BYTES_MAX));
    nbd::check(&plan, &exchange.output, exchange.output_refused);
    // The stated bound: payload buffers, the read buffer, the outbox and the
    // largest option, plus the export's own bytes and what was written back.
    let bound = rewind_nbd::server::BUFFER_BYTES_PER_CONNECTION_MAX + (4 << 20) + exchange.output.capacity();
    assert!(peak <= bound, "{peak} heap bytes for one connection (bound {bound})");
});
