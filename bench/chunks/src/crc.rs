//! `chunk-bench crc`: CRC-32C's speed by each implementation Rewind has,
//! on 4 KiB blocks (the size nearly every check is made at: one per block
//! read or written) and on 1 MiB buffers, and which one this machine
//! chose (`rewind_format::crc32c_engine`). The choice is per CPU because
//! the ranking is: crc-fast's carry-less multiply wins where it has AVX-512
//! and falls back elsewhere to a path slower than the CRC instruction;
//! Rewind's own 256-bit fold wins where there is AVX2 with VPCLMULQDQ.

use std::time::Instant;

use clap::Args;
use rewind_format::{crc32c_engine, crc32c_with, Crc32cEngine};
use serde_json::json;

use crate::say;

#[derive(Args)]
pub struct CrcArgs {
    /// Bytes checksummed per timed round.
    #[arg(long, default_value_t = 256 << 20)]
    bytes: usize,
    /// Timed rounds, alternating between the implementations.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
}

pub fn run(args: &CrcArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.bytes >= 1 << 20 && args.rounds > 0, "--bytes must be at least 1 MiB and --rounds above 0");
    let data: Vec<u8> = (0..args.bytes).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let engines = Crc32cEngine::on_this_cpu();
    say(format!("this machine checks with {:?}; it runs {engines:?}", crc32c_engine()));
    for piece in [4096, 1 << 20] {
        let mut rates = vec![Vec::new(); engines.len()];
        let mut sums = vec![0u32; engines.len()];
        // A round untimed first: the CPU's clock and the caches settle.
        for round in 0..=args.rounds {
            // Each engine first in turn, so none always runs on a cache the other warmed.
            let mut order: Vec<usize> = (0..engines.len()).collect();
            order.rotate_left(round % engines.len());
            for at in order {
                let start = Instant::now();
                let sum = data.chunks_exact(piece).fold(0, |sum, chunk| sum ^ crc32c_with(engines[at], chunk));
                let seconds = start.elapsed().as_secs_f64();
                sums[at] = sum;
                if round > 0 {
                    rates[at].push(args.bytes as f64 / seconds / 1e9);
                }
            }
        }
        anyhow::ensure!(sums.iter().all(|&sum| sum == sums[0]), "the implementations disagree on {piece}-byte pieces");
        let spreads: Vec<[f64; 3]> = rates
            .iter_mut()
            .map(|rates| {
                rates.sort_by(f64::total_cmp);
                [rates[0], rates[rates.len() / 2], rates[rates.len() - 1]]
            })
            .collect();
        let report: Vec<String> = engines
            .iter()
            .zip(&spreads)
            .map(|(engine, [low, median, high])| format!("{engine:?} {low:.1} / {median:.1} / {high:.1}"))
            .collect();
        say(format!(
            "{piece}-byte pieces: GB/s, min / median / max of {} rounds of {} MiB: {}",
            args.rounds,
            args.bytes >> 20,
            report.join(", ")
        ));
        if json {
            println!(
                "{}",
                json!({
                    "measurement": "crc", "piece_bytes": piece, "chosen": format!("{:?}", crc32c_engine()),
                    "gb_s": engines.iter().zip(&spreads)
                        .map(|(engine, spread)| (format!("{engine:?}"), json!(spread)))
                        .collect::<serde_json::Map<_, _>>(),
                })
            );
        }
    }
    Ok(())
}
