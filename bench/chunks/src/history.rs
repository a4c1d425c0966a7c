//! `chunk-bench history`: retention and garbage collection over N archived
//! versions of one volume, through the engine on the real filesystem.
//!
//! Writes of 1–16 blocks at random places, each version distinct (half its
//! bytes random, half compressible), 1 ms of simulated time apart; the
//! history is archived as it grows, as maintenance does. Then retention is
//! set to drop the older half of the history (each block keeps its state at
//! the horizon), one retention pass runs, and a garbage collection frees
//! the chunks nothing refers to any more. Before retention, the trace of
//! the kept writes is exported (`rewind trace export`) and its memory
//! measured. `--zeroes` writes zeros instead (versions without data), to
//! reach 10^8 versions for the export without 36 GiB of packs.

use std::path::Path;
use std::sync::Arc;

use anyhow::ensure;
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use rewind_bench_common::{measure, parse_count, DataDir};
use rewind_engine::{
    BlockSize, Durability, Node, NodeConfig, PolicyChange, RetentionTier, Timestamp, VolumeName, VolumeSpec, ZeroMode,
};
use rewind_io::OsStorage;
use serde_json::json;

use crate::{mib, say, timed};

#[derive(Args)]
pub struct HistoryArgs {
    /// Versions to write (and archive).
    #[arg(long, value_parser = parse_count, default_value = "1e7")]
    versions: u64,
    /// Block size of the volume.
    #[arg(long, default_value_t = 512)]
    block_bytes: u32,
    /// Blocks in the volume (a twentieth of the versions: each block is
    /// rewritten about twenty times).
    #[arg(long, value_parser = parse_count, default_value = "524288")]
    blocks: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write zeros (versions without data, no chunks).
    #[arg(long)]
    zeroes: bool,
}

const MILLISECOND: u64 = 1_000_000;

pub fn run(dir: &Path, args: &HistoryArgs, json: bool) -> anyhow::Result<()> {
    ensure!(args.blocks >= 16, "--blocks must be at least 16");
    let data_dir = DataDir::fresh(dir)?;
    let mut config = NodeConfig::default();
    // Maintenance is driven here, on simulated time: archive at every call,
    // retention only when asked.
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    config.volume.retention_interval_nanos = 1;
    config.collect_interval_nanos = u64::MAX;
    let node = Node::open(Arc::new(OsStorage::new(data_dir.path())?), config)?;
    let created = Timestamp::from_unix_nanos(1_700_000_000 * 1_000_000_000);
    let spec = VolumeSpec::new(
        VolumeName::new("history")?,
        args.blocks * u64::from(args.block_bytes),
        BlockSize::new(args.block_bytes).map_err(|error| anyhow::anyhow!("{error}"))?,
    );
    let volume = node.create_volume(spec, created)?;
    let block_bytes = args.block_bytes as usize;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut data = vec![0u8; 16 * block_bytes];
    let mut written = 0u64;
    let mut now = created;
    say(format!("writing {} versions of {} B blocks (archived as they come)", args.versions, args.block_bytes));
    let ((), write_seconds, write_peak) = timed(|| {
        let mut next_report = args.versions / 10;
        while written < args.versions {
            let count = rng.random_range(1..=16u64).min(args.versions - written);
            let block = rng.random_range(0..=args.blocks - count);
            let bytes = &mut data[..count as usize * block_bytes];
            for (index, version) in bytes.chunks_exact_mut(block_bytes).enumerate() {
                // Distinct versions: half random, half a compressible pattern.
                version[..8].copy_from_slice(&(written + index as u64).to_le_bytes());
                rng.fill_bytes(&mut version[8..block_bytes / 2]);
                version[block_bytes / 2..].fill((written % 251) as u8);
            }
            now = now.saturating_add_nanos(MILLISECOND);
            let offset = block * u64::from(args.block_bytes);
            if args.zeroes {
                volume.zero(now, offset, bytes.len() as u64, ZeroMode::Deallocate, Durability::Buffered)?;
            } else {
                volume.write(now, offset, bytes, Durability::Buffered)?;
            }
            written += count;
            if written % 100_000 < count {
                node.maintain(now)?;
            }
            if written >= next_report {
                node.maintain_history(now)?;
                say(format!("  {written} versions, {:.0} MiB resident", mib(measure::resident()?.rss_bytes)));
                next_report += args.versions / 10;
            }
        }
        volume.flush()?;
        let later = now.saturating_add_nanos(MILLISECOND);
        node.maintain(later)?;
        node.maintain_history(later)?;
        Ok(())
    })?;
    let stats = volume.stats()?;
    ensure!(stats.versions_archived == args.versions, "every version is archived: {stats:?}");
    let chunks = node.chunk_stats();
    say(format!(
        "written and archived {} versions in {write_seconds:.1} s ({:.0} versions/s); {} chunks, {:.0} MiB in packs; \
         peak resident {:.0} MiB",
        args.versions,
        args.versions as f64 / write_seconds,
        chunks.chunks_live,
        mib(chunks.pack_bytes),
        mib(write_peak.unwrap_or(0))
    ));

    // The trace of every kept write, oldest first (what `rewind trace
    // export` writes), read to the end.
    let ((extents, blocks), export_seconds, export_peak) = timed(|| {
        let (mut extents, mut blocks) = (0u64, 0u64);
        for write in volume.write_history()? {
            extents += 1;
            blocks += write?.length_bytes / u64::from(args.block_bytes);
        }
        Ok((extents, blocks))
    })?;
    ensure!(blocks == args.versions, "the trace holds every version: {blocks} of {}", args.versions);
    say(format!(
        "trace export: {extents} writes ({blocks} versions) in {export_seconds:.1} s; peak resident {:.0} MiB",
        mib(export_peak.unwrap_or(0))
    ));

    // Retention: keep every write of the newer half, drop the older half.
    let span = now.unix_nanos() - created.unix_nanos();
    let tiers = vec![RetentionTier { interval_nanos: 0, age_nanos: span / 2 }];
    volume.set_policy(PolicyChange { retention: Some(tiers), ..PolicyChange::default() })?;
    let at = now.saturating_add_nanos(2 * MILLISECOND);
    let ((), retention_seconds, retention_peak) = timed(|| Ok(node.maintain_history(at).map(|_| ())?))?;
    let after = volume.stats()?;
    let kept = after.versions_in_runs + after.versions_in_memory;
    let released = chunks.references - node.chunk_stats().references;
    say(format!(
        "retention pass over {} versions: {kept} kept, {released} chunk references released, in \
         {retention_seconds:.1} s ({:.0} versions/s); peak resident {:.0} MiB",
        args.versions,
        args.versions as f64 / retention_seconds,
        mib(retention_peak.unwrap_or(0))
    ));
    let (report, collect_seconds, collect_peak) = timed(|| Ok(node.collect(&mut |_, _, _| {})?))?;
    let final_chunks = node.chunk_stats();
    say(format!(
        "collect: freed {} chunks, deleted {} packs, rewrote {} into {}, gave back {:.0} MiB in \
         {collect_seconds:.1} s; peak resident {:.0} MiB; {} chunks left, {:.0} MiB in packs",
        report.chunks_freed,
        report.packs_deleted,
        report.packs_rewritten,
        report.packs_written,
        mib(report.bytes_reclaimed),
        mib(collect_peak.unwrap_or(0)),
        final_chunks.chunks_live,
        mib(final_chunks.pack_bytes)
    ));
    if json {
        println!(
            "{}",
            json!({
                "bench": "history",
                "versions": args.versions,
                "block_bytes": args.block_bytes,
                "write_and_archive_seconds": write_seconds,
                "chunks": chunks.chunks_live,
                "pack_bytes": chunks.pack_bytes,
                "zeroes": args.zeroes,
                "trace_export_seconds": export_seconds,
                "trace_export_peak_resident_bytes": export_peak,
                "trace_export_writes": extents,
                "retention_seconds": retention_seconds,
                "retention_peak_resident_bytes": retention_peak,
                "versions_kept": kept,
                "references_released": released,
                "collect_seconds": collect_seconds,
                "collect_peak_resident_bytes": collect_peak,
                "chunks_freed": report.chunks_freed,
                "bytes_reclaimed": report.bytes_reclaimed,
                "pack_bytes_after": final_chunks.pack_bytes,
            })
        );
    }
    Ok(())
}
