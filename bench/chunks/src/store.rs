//! `chunk-bench store`: N distinct chunks into one chunk store.
//!
//! Ids are handed out in order while nothing is freed, so chunk `i` has id
//! `i + 1` and the benchmark keeps no list of them (its own memory would
//! blur what it measures).

use std::path::Path;
use std::sync::Arc;

use anyhow::ensure;
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rewind_bench_common::{measure, parse_count, DataDir};
use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting};
use rewind_io::OsStorage;
use rewind_types::ChunkId;
use serde_json::json;

use crate::{mib, say, timed};

#[derive(Args)]
pub struct StoreArgs {
    /// Distinct chunks to put.
    #[arg(long, value_parser = parse_count, default_value = "1e7")]
    chunks: u64,
    /// Bytes per chunk (small chunks put 10^8 of them within a few GiB of disk).
    #[arg(long, default_value_t = 64)]
    chunk_bytes: usize,
    /// Puts per archive session (the engine's batches are of this order).
    #[arg(long, value_parser = parse_count, default_value = "65536")]
    session_puts: u64,
    /// Dedup lookups measured, hitting and missing.
    #[arg(long, value_parser = parse_count, default_value = "1e5")]
    lookups: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Chunks per run of the "stored together" lookups.
const STREAM_CHUNKS: u64 = 4096;

/// Chunk `index`'s bytes: its number, then a filler that depends on it.
fn contents(index: u64, bytes: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&index.to_le_bytes());
    out.extend((0..bytes.saturating_sub(8)).map(|at| (index as usize).wrapping_mul(31).wrapping_add(at) as u8));
    out.truncate(bytes);
}

/// Puts stored chunks again, in one session: each must be found, not stored.
fn put_again(store: &ChunkStore, indexes: &[u64], chunk_bytes: usize) -> anyhow::Result<()> {
    let mut session = store.session()?;
    let mut bytes = Vec::new();
    for &index in indexes {
        contents(index, chunk_bytes, &mut bytes);
        ensure!(session.put(&bytes)? == ChunkId(index + 1), "a stored chunk is found again");
    }
    Ok(session.finish()?)
}

pub fn run(dir: &Path, args: &StoreArgs, json: bool) -> anyhow::Result<()> {
    ensure!(args.chunk_bytes >= 8 && args.chunk_bytes <= 65536, "--chunk-bytes must be 8..=65536");
    let data_dir = DataDir::fresh(dir)?;
    let storage = Arc::new(OsStorage::new(data_dir.path())?);
    let config = ChunkStoreConfig::default();
    let store = ChunkStore::open(storage.clone(), "chunks", config)?;
    store.finish_open(Counting::Exact)?;
    let mut bytes = Vec::new();
    say(format!("putting {} distinct chunks of {} B", args.chunks, args.chunk_bytes));
    let ((), put_seconds, put_peak) = timed(|| {
        let mut next = 0;
        while next < args.chunks {
            let mut session = store.session()?;
            let end = (next + args.session_puts).min(args.chunks);
            for index in next..end {
                contents(index, args.chunk_bytes, &mut bytes);
                let id = session.put(&bytes)?;
                ensure!(id == ChunkId(index + 1), "ids are handed out in order while nothing is freed");
            }
            session.finish()?;
            next = end;
            if next % (args.chunks / 10).max(1) < args.session_puts {
                say(format!("  {next} chunks, {:.0} MiB resident", mib(measure::resident()?.rss_bytes)));
            }
        }
        Ok(())
    })?;
    let after_puts = measure::resident()?;
    let stats = store.stats();
    let disk = measure::disk_usage(data_dir.path())?;
    say(format!(
        "put: {:.0} chunks/s ({:.1} s); resident {:.0} MiB (peak {:.0}), of which counts + dedup filters {:.0} MiB; \
         {:.2} GiB on disk",
        args.chunks as f64 / put_seconds,
        put_seconds,
        mib(after_puts.rss_bytes),
        mib(put_peak.unwrap_or(after_puts.hwm_bytes)),
        mib(stats.memory_bytes),
        disk.allocated_bytes as f64 / (1u64 << 30) as f64
    ));

    // Dedup lookups: stored contents (hits, which add a reference each) and
    // new ones (misses, which store a chunk each).
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let hit_indexes: Vec<u64> = (0..args.lookups).map(|_| rng.random_range(0..args.chunks)).collect();
    let ((), hit_seconds, _) = timed(|| put_again(&store, &hit_indexes, args.chunk_bytes))?;
    // Stored contents again in the order they were stored, as a copied
    // image brings them: runs of neighbouring chunks from random places.
    let stream_indexes: Vec<u64> = (0..args.lookups.div_ceil(STREAM_CHUNKS))
        .flat_map(|_| {
            let start = rng.random_range(0..args.chunks.saturating_sub(STREAM_CHUNKS).max(1));
            start..(start + STREAM_CHUNKS).min(args.chunks)
        })
        .take(args.lookups as usize)
        .collect();
    let nearby_before = store.stats().dedup_hits_nearby;
    let ((), stream_seconds, _) = timed(|| put_again(&store, &stream_indexes, args.chunk_bytes))?;
    let nearby = store.stats().dedup_hits_nearby - nearby_before;
    {
        let _gate = store.hold_references();
        for &index in hit_indexes.iter().chain(&stream_indexes) {
            store.release(ChunkId(index + 1), args.chunk_bytes as u32);
        }
    }
    let ((), miss_seconds, _) = timed(|| {
        let mut session = store.session()?;
        for index in args.chunks..args.chunks + args.lookups {
            contents(index, args.chunk_bytes, &mut bytes);
            session.put(&bytes)?;
        }
        Ok(session.finish()?)
    })?;
    let total = args.chunks + args.lookups;
    say(format!(
        "dedup lookups: hits {:.0}/s at random, {:.0}/s in runs of {STREAM_CHUNKS} stored together \
         ({nearby} of {} from the locality cache), misses (stored) {:.0}/s",
        args.lookups as f64 / hit_seconds,
        stream_indexes.len() as f64 / stream_seconds,
        stream_indexes.len(),
        args.lookups as f64 / miss_seconds
    ));

    // Opening again: every id counted from history (here: each once).
    drop(store);
    let (store, open_seconds, open_peak) = timed(|| {
        let store = ChunkStore::open(storage.clone(), "chunks", config)?;
        for index in 0..total {
            store.mark(ChunkId(index + 1), args.chunk_bytes as u32)?;
        }
        store.finish_open(Counting::Exact)?;
        Ok(store)
    })?;
    let after_open = measure::resident()?;
    say(format!(
        "open and count {total} chunks: {open_seconds:.1} s, peak resident {:.0} MiB",
        mib(open_peak.unwrap_or(after_open.hwm_bytes))
    ));

    // A clean shutdown saves the counts; opening again takes them back
    // (the engine describes its runs; here the history is this run's).
    let history = format!("chunk-bench store: {total} chunks, one reference each");
    let (saved, save_seconds, _) = timed(|| Ok(store.save_counts(history.as_bytes())?))?;
    ensure!(saved, "counts that are not in doubt are saved");
    drop(store);
    let (store, resume_seconds, resume_peak) = timed(|| {
        let store = ChunkStore::open(storage.clone(), "chunks", config)?;
        ensure!(store.resume_counts(history.as_bytes()), "the saved counts apply");
        Ok(store)
    })?;
    ensure!(store.stats().references == total, "the counts taken back are the counted ones");
    say(format!(
        "save the counts at shutdown: {save_seconds:.1} s; open taking them back: {resume_seconds:.1} s, \
         peak resident {:.0} MiB",
        mib(resume_peak.unwrap_or(0))
    ));

    // Three chunks in four lose their last reference, spread over every
    // pack; collect.
    {
        let _gate = store.hold_references();
        for index in (0..total).filter(|index| index % 4 != 0) {
            store.release(ChunkId(index + 1), args.chunk_bytes as u32);
        }
    }
    let (report, collect_seconds, collect_peak) = timed(|| Ok(store.collect(&mut |_, _, _| {})?))?;
    let after = store.stats();
    say(format!(
        "collect: freed {} chunks, rewrote {} packs into {}, gave back {:.0} MiB in {collect_seconds:.1} s; \
         peak resident {:.0} MiB",
        report.chunks_freed,
        report.packs_rewritten,
        report.packs_written,
        mib(report.bytes_reclaimed),
        mib(collect_peak.unwrap_or(0))
    ));
    ensure!(after.chunks_live == total.div_ceil(4), "the referenced quarter stays");
    ensure!(report.chunks_freed == total - after.chunks_live, "every unreferenced chunk is freed");
    if json {
        println!(
            "{}",
            json!({
                "bench": "store",
                "chunks": args.chunks,
                "chunk_bytes": args.chunk_bytes,
                "put_chunks_per_second": args.chunks as f64 / put_seconds,
                "resident_bytes_after_puts": after_puts.rss_bytes,
                "peak_resident_bytes_during_puts": put_peak,
                "chunk_memory_bytes": stats.memory_bytes,
                "disk_allocated_bytes": disk.allocated_bytes,
                "dedup_hits_per_second": args.lookups as f64 / hit_seconds,
                "dedup_hits_in_runs_per_second": stream_indexes.len() as f64 / stream_seconds,
                "dedup_hits_in_runs_from_locality_cache": nearby,
                "dedup_misses_per_second": args.lookups as f64 / miss_seconds,
                "open_seconds": open_seconds,
                "peak_resident_bytes_during_open": open_peak,
                "save_counts_seconds": save_seconds,
                "open_with_saved_counts_seconds": resume_seconds,
                "peak_resident_bytes_during_open_with_saved_counts": resume_peak,
                "collect_seconds": collect_seconds,
                "peak_resident_bytes_during_collect": collect_peak,
                "chunks_freed": report.chunks_freed,
                "bytes_reclaimed": report.bytes_reclaimed,
            })
        );
    }
    Ok(())
}
