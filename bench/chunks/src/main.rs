//! `chunk-bench`: the chunk store and archived history at scale, on the real
//! filesystem.
//!
//! - `store`: N distinct chunks put into a chunk store (10^8 with small
//!   chunks is the design point): put rate, dedup lookups that hit and miss,
//!   resident memory, the time to open and count the store again, and a
//!   garbage collection after half of the references are released.
//! - `history`: the engine with N archived versions of one volume: the time
//!   and peak memory of archiving them, of one retention pass that thins the
//!   older half, and of the garbage collection that follows.
//! - `space`: one seeded workload replayed at several protection
//!   granularities: the retained fraction r measured against R(g) from the
//!   workload's temporal distances (IBM Claim 3.1), and the space history
//!   takes against the IBM Figure 6 model (Logging: r·w).
//! - `lineage`: clone and revert-in-place time against volume size and
//!   history length (flat: metadata only).
//! - `compress`: the compressor's time per chunk, beside zstd alone.
//! - `savings`: what zstd saves on real files chunk by chunk, and what
//!   reading each band back costs.
//! - `crc`: CRC-32C's speed by each implementation, and which one this
//!   machine chose.
//!
//! Each prints a table on stderr and, with `--json`, one JSON object per
//! measurement on stdout.

mod compress;
mod crc;
mod history;
mod lineage;
mod savings;
mod space;
mod store;

use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, Subcommand};
use rewind_bench_common::measure;

#[derive(Parser)]
#[command(about = "Chunk store and archived-history benchmarks")]
struct Args {
    /// Data directory on the disk under test; removed at start and end.
    #[arg(long, default_value = "/work/bench-data/chunks", global = true)]
    dir: PathBuf,
    /// Also print JSON lines on stdout.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Distinct chunks into a chunk store: speed and memory.
    Store(store::StoreArgs),
    /// Retention and garbage collection over an archived history.
    History(history::HistoryArgs),
    /// Space at several granularities against the IBM model.
    Space(space::SpaceArgs),
    /// Clone and revert time against volume size and history length.
    Lineage(lineage::LineageArgs),
    /// The compressor's time per chunk, beside zstd alone.
    Compress(compress::CompressArgs),
    /// What zstd saves on real files, chunk by chunk, and what reading it back costs.
    Savings(savings::SavingsArgs),
    /// CRC-32C's speed by each implementation, and the one this machine chose.
    Crc(crc::CrcArgs),
}

/// Prints a line of the human report.
fn say(text: impl AsRef<str>) {
    eprintln!("[chunk-bench] {}", text.as_ref());
}

/// Runs `work`, returning its result, its seconds, and the peak resident
/// memory while it ran (if the kernel lets the peak be reset).
fn timed<T>(work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, f64, Option<u64>)> {
    let peak_reset = measure::reset_peak_resident();
    let start = Instant::now();
    let value = work()?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = peak_reset.then(|| measure::resident().map(|resident| resident.hwm_bytes)).transpose()?;
    Ok((value, seconds, peak))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Store(store) => store::run(&args.dir, &store, args.json),
        Command::History(history) => history::run(&args.dir, &history, args.json),
        Command::Space(space) => space::run(&args.dir, &space, args.json),
        Command::Lineage(lineage) => lineage::run(&args.dir, &lineage, args.json),
        Command::Compress(compress) => compress::run(&compress, args.json),
        Command::Savings(savings) => savings::run(&savings, args.json),
        Command::Crc(crc) => crc::run(&crc, args.json),
    }
}
