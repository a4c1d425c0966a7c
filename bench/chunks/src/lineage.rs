//! `chunk-bench lineage`: how long a clone and a revert in place take,
//! against the volume's size and the length of its history — both should be
//! flat (metadata only, nothing copied) — through the engine on the real
//! filesystem.
//!
//! For each size and history length: a volume of 4 KiB blocks gets that
//! many versions (zeroing records of 1–1024 blocks at random places, so
//! history is long without filling the disk, and one data write in 64),
//! 1 ms of simulated time apart, with maintenance as it goes. Then, `--repeat`
//! times each: a clone of the volume as it was halfway through its history,
//! and a revert of the volume to that point — with half of the history,
//! and most of its blocks, changed since.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rewind_bench_common::{parse_count, DataDir};
use rewind_engine::{BlockSize, Durability, Node, NodeConfig, Timestamp, VolumeName, VolumeSpec, Writers, ZeroMode};
use rewind_io::OsStorage;
use serde_json::json;

use crate::say;

#[derive(Args)]
pub struct LineageArgs {
    /// Volume sizes in GiB (sparse), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,1024")]
    sizes_gib: Vec<u64>,
    /// History lengths in versions, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_count, default_value = "1e5,1e6,1e7")]
    versions: Vec<u64>,
    /// Clones and reverts timed per case.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const BLOCK_BYTES: u64 = 4096;
const MILLISECOND: u64 = 1_000_000;

pub fn run(dir: &Path, args: &LineageArgs, json: bool) -> anyhow::Result<()> {
    for size in args.sizes_gib.iter().map(|gib| gib << 30) {
        for &versions in &args.versions {
            let case = one_case(dir, size, versions, args)?;
            say(format!(
                "{:>6} GiB, {versions:>9} versions ({} blocks changed since the point): clone {:.2} / {:.2} / {:.2} ms, \
                 revert {:.2} / {:.2} / {:.2} ms (min / median / max)",
                size >> 30,
                case.changed_blocks,
                case.clone_ms[0],
                case.clone_ms[case.clone_ms.len() / 2],
                case.clone_ms[case.clone_ms.len() - 1],
                case.revert_ms[0],
                case.revert_ms[case.revert_ms.len() / 2],
                case.revert_ms[case.revert_ms.len() - 1],
            ));
            if json {
                println!(
                    "{}",
                    json!({
                        "benchmark": "lineage",
                        "size_bytes": size,
                        "versions": versions,
                        "changed_blocks": case.changed_blocks,
                        "clone_ms": case.clone_ms,
                        "revert_ms": case.revert_ms,
                    })
                );
            }
        }
    }
    Ok(())
}

struct Case {
    changed_blocks: u64,
    /// Sorted.
    clone_ms: Vec<f64>,
    /// Sorted.
    revert_ms: Vec<f64>,
}

fn one_case(dir: &Path, size: u64, versions: u64, args: &LineageArgs) -> anyhow::Result<Case> {
    let data_dir = DataDir::fresh(dir)?;
    let node = Node::open(Arc::new(OsStorage::new(data_dir.path())?), NodeConfig::default())?;
    let created = Timestamp::from_unix_nanos(1_700_000_000 * 1_000_000_000);
    let block_size = BlockSize::new(BLOCK_BYTES as u32).map_err(|error| anyhow::anyhow!("{error}"))?;
    let volume = node.create_volume(VolumeSpec::new(VolumeName::new("origin")?, size, block_size), created)?;
    let blocks = size / BLOCK_BYTES;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut now = created;
    let mut written = 0;
    let mut middle = None;
    // Blocks written since the middle, one bit each (32 MiB for 1 TiB).
    let mut changed = vec![0u64; blocks.div_ceil(64) as usize];
    let mut mark = |from: u64, count: u64| {
        for block in from..from + count {
            changed[(block / 64) as usize] |= 1 << (block % 64);
        }
    };
    while written < versions {
        now = now.saturating_add_nanos(MILLISECOND);
        if rng.random_range(0..64) == 0 {
            let block = rng.random_range(0..blocks);
            volume.write(now, block * BLOCK_BYTES, &[written as u8; BLOCK_BYTES as usize], Durability::Buffered)?;
            written += 1;
            if middle.is_some() {
                mark(block, 1);
            }
        } else {
            let count = rng.random_range(1..=1024).min(versions - written).min(blocks);
            let block = rng.random_range(0..=blocks - count);
            volume.zero(now, block * BLOCK_BYTES, count * BLOCK_BYTES, ZeroMode::Deallocate, Durability::Buffered)?;
            written += count;
            if middle.is_some() {
                mark(block, count);
            }
        }
        if middle.is_none() && written >= versions / 2 {
            middle = Some(now);
        }
        if written % (1 << 16) < 1024 {
            node.maintain(now)?;
        }
    }
    node.maintain(now)?;
    let middle = middle.expect("the history has a middle");
    let mut clone_ms = Vec::new();
    let mut revert_ms = Vec::new();
    for round in 0..args.repeat {
        now = now.saturating_add_nanos(MILLISECOND);
        let name = VolumeName::new(&format!("clone{round}"))?;
        let start = Instant::now();
        node.clone_volume("origin", Some(middle), name, now)?;
        clone_ms.push(start.elapsed().as_secs_f64() * 1e3);
        now = now.saturating_add_nanos(MILLISECOND);
        let start = Instant::now();
        volume.revert(middle, now, Writers::Refuse)?;
        revert_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    clone_ms.sort_by(f64::total_cmp);
    revert_ms.sort_by(f64::total_cmp);
    let changed_blocks = changed.iter().map(|word| u64::from(word.count_ones())).sum();
    Ok(Case { changed_blocks, clone_ms, revert_ms })
}
