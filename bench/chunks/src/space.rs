//! `chunk-bench space`: the space history takes at several protection
//! granularities, against the IBM paper's model (seed 002 §3.3–3.4).
//!
//! One seeded workload — single-block writes at Poisson times, to blocks
//! drawn from a Zipf distribution, so that hot blocks are rewritten within
//! seconds and cold ones after hours — is replayed through the engine once
//! per granularity `g`, then archived to the end. For each `g` it reports:
//!
//! - r, the retained fraction Rewind kept (versions kept / written), against
//!   R(g) = 1 − (1/g)∫₀^g T(t)dt (Claim 3.1), computed from the workload's
//!   temporal distances as (1/n) Σ min(aᵢ/g, 1) — the expectation over the
//!   offset of the first window, which Rewind fixes (windows start at
//!   multiples of g in Unix time);
//! - the Logging model's history space r·w (Figure 6), w the bytes written;
//! - what Rewind's history takes: the logical bytes of the kept versions
//!   (which *is* r·w: Rewind's history store is a log of retained versions),
//!   and the bytes it stores for them after deduplication and compression.
//!
//! Rewind's total is Figure 6's Split(Down)Stream shape, a + r·w: the
//! current store (a) beside the history.

use std::path::Path;
use std::sync::Arc;

use anyhow::ensure;
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use rewind_bench_common::{parse_count, DataDir};
use rewind_engine::timespec::{display_granularity, parse_granularity};
use rewind_engine::{BlockSize, Durability, Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::OsStorage;
use serde_json::json;

use crate::{mib, say};

#[derive(Args)]
pub struct SpaceArgs {
    /// Granularities to replay the workload at (0: every write).
    #[arg(long, value_delimiter = ',', default_value = "0,1s,10s,1m,5m,30m")]
    granularities: Vec<String>,
    /// Single-block writes in the workload.
    #[arg(long, value_parser = parse_count, default_value = "1e6")]
    writes: u64,
    /// Blocks of 4 KiB in the volume.
    #[arg(long, value_parser = parse_count, default_value = "262144")]
    blocks: u64,
    /// Simulated time the workload spans.
    #[arg(long, default_value = "2h")]
    duration: String,
    /// Zipf exponent of the block popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const BLOCK_BYTES: u64 = 4096;

/// The workload: (nanoseconds after the start, block) in time order.
fn workload(args: &SpaceArgs, duration_nanos: u64) -> Vec<(u64, u64)> {
    let mut rng = SmallRng::seed_from_u64(args.seed);
    // Zipf by inverse transform over the cumulative weights; ranks are
    // scattered over the volume so hot blocks are not neighbours.
    let mut cumulative = Vec::with_capacity(args.blocks as usize);
    let mut total = 0.0;
    for rank in 1..=args.blocks {
        total += 1.0 / (rank as f64).powf(args.zipf);
        cumulative.push(total);
    }
    let mut placement: Vec<u64> = (0..args.blocks).collect();
    for index in (1..placement.len()).rev() {
        placement.swap(index, rng.random_range(0..=index));
    }
    let mean_gap = duration_nanos as f64 / args.writes as f64;
    let mut time = 0.0f64;
    (0..args.writes)
        .map(|_| {
            time += -mean_gap * (1.0 - rng.random::<f64>()).ln();
            let pick = rng.random::<f64>() * total;
            let rank = cumulative.partition_point(|&weight| weight < pick).min(args.blocks as usize - 1);
            (time as u64, placement[rank])
        })
        .collect()
}

/// Each write's temporal distance to the next write of its block (IBM §3.4),
/// `None` for the last write of a block.
fn temporal_distances(writes: &[(u64, u64)]) -> Vec<Option<u64>> {
    let mut next_write: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut distances = vec![None; writes.len()];
    for (index, &(time, block)) in writes.iter().enumerate().rev() {
        distances[index] = next_write.insert(block, time).map(|next| next - time);
    }
    distances
}

/// R(g) of Claim 3.1 from the distances: (1/n) Σ min(aᵢ/g, 1).
fn expected_retained(distances: &[Option<u64>], granularity: u64) -> f64 {
    if granularity == 0 {
        return 1.0;
    }
    let sum: f64 = distances
        .iter()
        .map(|distance| distance.map_or(1.0, |distance| (distance as f64 / granularity as f64).min(1.0)))
        .sum();
    sum / distances.len() as f64
}

pub fn run(dir: &Path, args: &SpaceArgs, json: bool) -> anyhow::Result<()> {
    let duration_nanos = parse_granularity(&args.duration).map_err(|error| anyhow::anyhow!(error))?;
    ensure!(duration_nanos > 0 && args.writes > 0 && args.blocks > 0, "an empty workload");
    let writes = workload(args, duration_nanos);
    let distances = temporal_distances(&writes);
    let rewritten = distances.iter().filter(|distance| distance.is_some()).count();
    say(format!(
        "workload: {} writes of 4 KiB over {} to {} blocks (Zipf {}), {:.1}% of them overwritten later",
        args.writes,
        args.duration,
        args.blocks,
        args.zipf,
        100.0 * rewritten as f64 / writes.len() as f64
    ));
    say("g            written     kept  r measured    R(g)  r·w (MiB)  kept logical (MiB)  stored (MiB)  stored ÷ r·w");
    for text in &args.granularities {
        let granularity = parse_granularity(text).map_err(|error| anyhow::anyhow!(error))?;
        let data_dir = DataDir::fresh(&dir.join(format!("g-{text}")))?;
        let mut config = NodeConfig::default();
        config.volume.archive_age_nanos = 0;
        config.volume.archive_interval_nanos = 1;
        config.collect_interval_nanos = u64::MAX;
        let node = Node::open(Arc::new(OsStorage::new(data_dir.path())?), config)?;
        // Windows start at multiples of g; the workload starts at a round hour.
        let start = Timestamp::from_unix_nanos(1_700_000_000 / 3600 * 3600 * 1_000_000_000);
        let spec = VolumeSpec {
            granularity_nanos: granularity,
            ..VolumeSpec::new(VolumeName::new("space")?, args.blocks * BLOCK_BYTES, BlockSize::DEFAULT)
        };
        let volume = node.create_volume(spec, start)?;
        let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x5eed);
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        for (index, &(offset, target)) in writes.iter().enumerate() {
            // Distinct contents, half random and half compressible: what is
            // stored shows compression, not deduplication.
            block[..8].copy_from_slice(&(index as u64).to_le_bytes());
            rng.fill_bytes(&mut block[8..2048]);
            block[2048..].fill((index % 251) as u8);
            let at = start.saturating_add_nanos(offset + 1);
            volume.write(at, target * BLOCK_BYTES, &block, Durability::Buffered)?;
            if index % 50_000 == 49_999 {
                node.maintain(at)?;
                node.maintain_history(at)?;
            }
        }
        volume.flush()?;
        // Past the last window: everything is archived and thinned.
        let end = start.saturating_add_nanos(duration_nanos + 2 * granularity.max(1_000_000_000));
        node.maintain(end)?;
        node.maintain_history(end)?;
        let stats = volume.stats()?;
        ensure!(stats.versions_archived == stats.versions_in_runs + stats.versions_in_memory, "{stats:?}");
        let kept = stats.versions_in_runs + stats.versions_in_memory;
        let written = kept + stats.versions_thinned;
        ensure!(written == args.writes, "every write counted: {written} of {}", args.writes);
        let space = volume.measure_space(end)?;
        let r = kept as f64 / written as f64;
        let expected = expected_retained(&distances, granularity);
        let model_bytes = r * (written * BLOCK_BYTES) as f64;
        let logical = space.logical_bytes(4096);
        say(format!(
            "{:11} {written:8} {kept:8} {r:11.4} {expected:7.4}  {:9.1}  {:18.1}  {:12.1}  {:.3}",
            display_granularity(granularity),
            model_bytes / (1 << 20) as f64,
            mib(logical),
            mib(space.chunk_stored_bytes),
            space.chunk_stored_bytes as f64 / model_bytes
        ));
        if json {
            println!(
                "{}",
                json!({
                    "bench": "space",
                    "granularity": display_granularity(granularity),
                    "granularity_nanos": granularity,
                    "writes": written,
                    "kept": kept,
                    "r": r,
                    "expected_r": expected,
                    "model_logging_bytes": model_bytes,
                    "kept_logical_bytes": logical,
                    "stored_bytes": space.chunk_stored_bytes,
                    "current_store_bytes": stats.current_bytes,
                })
            );
        }
    }
    Ok(())
}
