//! `chunk-bench compress`: what the chunk store's compressor costs per
//! chunk, beside zstd alone, on 4 KiB chunks of three kinds: random bytes
//! and fio-like buffers (history that does not compress: the compressor is
//! probing, so each chunk gets the cheap look), and text (history that
//! does: no look, level 3). fio's buffers are random bytes laid out in
//! 64-byte lines that begin with a small number and, once in 512 bytes, a
//! run of zeros: about a tenth of their bytes are zero, and zstd's and
//! LZ4's matchers find many short matches in them and keep few, so both
//! take several times as long as on random bytes. The baselines, timed in
//! the same run: zstd's fastest level (the look before this one) and level
//! 3, each into a buffer smaller than the chunk by the share the compressor
//! needs saved, as the compressor calls them. Each also reports how many chunks it stored
//! compressed.

use std::time::Instant;

use clap::Args;
use rewind_chunks::{Compressor, SAVING_SHARE_MIN};
use rewind_format::pack::Codec;
use serde_json::json;

use crate::say;

#[derive(Args)]
pub struct CompressArgs {
    /// Chunks per timed round.
    #[arg(long, default_value_t = 20_000)]
    chunks: usize,
    /// Timed rounds, alternating between the compressor and the baselines.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
}

const CHUNK_BYTES: usize = 4096;

fn random_chunk(seed: u64) -> Vec<u8> {
    let mut chunk = vec![0; CHUNK_BYTES];
    blake3::Hasher::new().update(&seed.to_le_bytes()).finalize_xof().fill(&mut chunk);
    chunk
}

fn fio_like_chunk(seed: u64) -> Vec<u8> {
    let mut chunk = random_chunk(seed);
    for (line, bytes) in chunk.chunks_exact_mut(64).enumerate() {
        let number = ((seed * 64 + line as u64) * 0x1000 % (1 << 24)) << 8;
        bytes[..8].copy_from_slice(&number.to_le_bytes());
        if line % 8 == 0 {
            bytes[48..56].fill(0);
            bytes[60..].fill(0);
        }
    }
    chunk
}

fn text_chunk(seed: u64) -> Vec<u8> {
    format!("row {seed}: the quick brown fox jumps over the lazy dog; ").bytes().cycle().take(CHUNK_BYTES).collect()
}

/// Microseconds per chunk of `work` over `chunks`, and how many of them it
/// stored compressed (`work` says whether it did).
fn per_chunk(chunks: &[Vec<u8>], mut work: impl FnMut(&[u8]) -> bool) -> (f64, usize) {
    let start = Instant::now();
    let compressed = chunks.iter().filter(|chunk| work(chunk)).count();
    (start.elapsed().as_secs_f64() * 1e6 / chunks.len() as f64, compressed)
}

pub fn run(args: &CompressArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.chunks > 0 && args.rounds > 0, "--chunks and --rounds must be above 0");
    type MakeChunk = fn(u64) -> Vec<u8>;
    let kinds: [(&str, MakeChunk); 3] = [("random", random_chunk), ("fio-like", fio_like_chunk), ("text", text_chunk)];
    let names = ["compressor", "zstd level 1", "zstd level 3"];
    for (kind, make) in kinds {
        let chunks: Vec<Vec<u8>> = (0..args.chunks as u64).map(make).collect();
        let mut compressor = Compressor::new()?;
        let mut out = Vec::new();
        let mut limited = vec![0; CHUNK_BYTES - (CHUNK_BYTES as f64 * SAVING_SHARE_MIN) as usize];
        let mut levels = [zstd::bulk::Compressor::new(1)?, zstd::bulk::Compressor::new(3)?];
        let mut timings: [Vec<f64>; 3] = Default::default();
        let mut compressed = [0; 3];
        // A round untimed first: the compressor finds out whether to probe.
        // The order alternates between rounds.
        for round in 0..=args.rounds {
            let mut results = [(0.0, 0); 3];
            let mut order = [0, 1, 2];
            if round % 2 == 1 {
                order.reverse();
            }
            for at in order {
                results[at] = match at {
                    0 => per_chunk(&chunks, |chunk| compressor.compress(chunk, &mut out) == Codec::Zstd),
                    _ => per_chunk(&chunks, |chunk| levels[at - 1].compress_to_buffer(chunk, &mut limited).is_ok()),
                };
            }
            if round > 0 {
                for (at, (us, stored)) in results.into_iter().enumerate() {
                    timings[at].push(us);
                    compressed[at] = stored;
                }
            }
        }
        let spread = |timing: &mut Vec<f64>| {
            timing.sort_by(f64::total_cmp);
            [timing[0], timing[timing.len() / 2], timing[timing.len() - 1]]
        };
        let spreads = timings.each_mut().map(spread);
        let report: Vec<String> = (0..3)
            .map(|at| {
                let [low, median, high] = spreads[at];
                format!("{} {low:.2} / {median:.2} / {high:.2} ({} compressed)", names[at], compressed[at])
            })
            .collect();
        say(format!(
            "{kind}: µs per {CHUNK_BYTES}-byte chunk, min / median / max of {} rounds of {}: {}",
            args.rounds,
            args.chunks,
            report.join(", ")
        ));
        if json {
            println!(
                "{}",
                json!({
                    "measurement": "compress", "kind": kind, "chunk_bytes": CHUNK_BYTES, "chunks": args.chunks,
                    "compressor_us": spreads[0], "zstd_level_1_us": spreads[1], "zstd_level_3_us": spreads[2],
                    "compressed": compressed,
                })
            );
        }
    }
    Ok(())
}
