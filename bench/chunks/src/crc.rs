//! `chunk-bench crc`: CRC-32C's speed by each implementation Rewind has,
//! on 4 KiB blocks (the size nearly every check is made at: one per block
//! read or written) and on 1 MiB buffers, and which one this machine
//! chose (`rewind_format::crc32c_engine`). The choice is per CPU because
//! the ranking is: crc-fast's carry-less multiply wins where it has AVX-512
//! and falls back elsewhere to a path slower than the CRC instruction.

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

const ENGINES: [Crc32cEngine; 2] = [Crc32cEngine::Carryless, Crc32cEngine::CrcInstruction];

pub fn run(args: &CrcArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.bytes >= 1 << 20 && args.rounds > 0, "--bytes must be at least 1 MiB and --rounds above 0");
    let data: Vec<u8> = (0..args.bytes).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    say(format!("this machine checks with {:?}", crc32c_engine()));
    for piece in [4096, 1 << 20] {
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut sums = [0u32; 2];
        // A round untimed first: the CPU's clock and the caches settle.
        for round in 0..=args.rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for at in order {
                let start = Instant::now();
                let sum = data.chunks_exact(piece).fold(0, |sum, chunk| sum ^ crc32c_with(ENGINES[at], chunk));
                let seconds = start.elapsed().as_secs_f64();
                sums[at] = sum;
                if round > 0 {
                    rates[at].push(args.bytes as f64 / seconds / 1e9);
                }
            }
        }
        anyhow::ensure!(sums[0] == sums[1], "the two implementations disagree on {piece}-byte pieces");
        let spreads = rates.each_mut().map(|rates| {
            rates.sort_by(f64::total_cmp);
            [rates[0], rates[rates.len() / 2], rates[rates.len() - 1]]
        });
        let report: Vec<String> = (0..2)
            .map(|at| {
                let [low, median, high] = spreads[at];
                format!("{:?} {low:.1} / {median:.1} / {high:.1}", ENGINES[at])
            })
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
                    "carryless_gb_s": spreads[0], "crc_instruction_gb_s": spreads[1],
                })
            );
        }
    }
    Ok(())
}
