//! `index-bench`: grows a real version index on the real filesystem in
//! stages (10^6, 10^7, 10^8 versions by default) and at each stage measures
//! the insert rate, `find_le` latency and resident memory.
//!
//! It drives the index the way `rewind-engine`'s `Volume` does: one
//! `insert(lsn, versions)` per journal record, `seal()` once the live memtable
//! holds `memtable_versions_max` versions, then `persist(lsn)` and `compact()`
//! until it has nothing left to merge. The engine does the last two on its
//! maintenance thread; here they run inline, so the insert rate is the rate
//! the index sustains including all the work that inserting causes.
//!
//! After the index, the same records go into a `BTreeMap` (the baseline,
//! up to `--baseline-versions-max`), whose answers double as an oracle for
//! the index's.

mod baseline;
mod report;
mod workload;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context};
use clap::Parser;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rewind_index::{IndexConfig, IndexStats, PageCache, Thinning, VersionIndex};
use rewind_io::{OsStorage, Storage};
use rewind_types::{Lsn, Timestamp, Version};

use baseline::BTreeBaseline;
use rewind_bench_common::measure::{self, CacheDrop, DiskUsage, IoCounters, Latency, Resident};
use rewind_bench_common::{parse_count, DataDir};
use workload::{RecordExtent, Workload, TIMESTAMP_FIRST};

/// The index's directory inside the storage root.
const INDEX_DIR: &str = "index";
/// Records remembered for the lookups of recently written blocks.
const RECENT_RECORDS_MAX: usize = 4096;
/// Lookups compared between the index and the baseline, per stage.
const ORACLE_CHECKS_MAX: u64 = 20_000;
const PROBE_BYTES: u64 = 512 << 20;

#[derive(Parser, Debug)]
#[command(about = "Version index microbenchmark: insert rate, find_le latency and memory at 10^6..10^8 versions")]
struct Args {
    /// Data directory on the disk under test; removed at start and end.
    #[arg(long, default_value = "/work/bench-data/index")]
    dir: PathBuf,
    /// Volume size in blocks of 4 KiB (default 2^21 = 8 GiB).
    #[arg(long, default_value_t = 1 << 21)]
    blocks: u64,
    /// Version counts at which to measure, increasing.
    #[arg(long, value_delimiter = ',', value_parser = parse_count, default_value = "1e6,1e7,1e8")]
    stages: Vec<u64>,
    /// Lookups at random blocks and random times over the history, per stage.
    #[arg(long, value_parser = parse_count, default_value = "1e5")]
    lookups: u64,
    /// Lookups of recently written blocks at the newest time, per stage.
    #[arg(long, value_parser = parse_count, default_value = "1e5")]
    lookups_now: u64,
    /// Lookups through a freshly opened index after emptying the OS page cache.
    #[arg(long, value_parser = parse_count, default_value = "2e4")]
    lookups_cold: u64,
    /// Seal the memtable at this many versions (the engine's default).
    #[arg(long, value_parser = parse_count, default_value = "1048576")]
    memtable_versions_max: u64,
    /// Index page cache size (the engine's default is 64 MiB).
    #[arg(long, default_value_t = 64 << 20)]
    page_cache_bytes: u64,
    /// Feed the BTreeMap baseline only for stages up to this many versions (0: no baseline).
    #[arg(long, value_parser = parse_count, default_value = "1e7")]
    baseline_versions_max: u64,
    /// After the last stage, time one retention pass over the whole index:
    /// the oldest quarter of history dropped to its base, windows of this
    /// many milliseconds for the next quarter (0: no pass).
    #[arg(long, default_value_t = 100)]
    retention_window_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per stage on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
}

/// Accepts `1000000`, `1e6` and `2.5e7`.
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(!args.stages.is_empty(), "--stages is empty");
    ensure!(args.stages.windows(2).all(|pair| pair[0] < pair[1]), "--stages must increase");
    ensure!(args.stages[0] > 0, "stages must be positive");
    ensure!(args.blocks >= workload::RECORD_BLOCKS_MAX, "--blocks must be at least {}", workload::RECORD_BLOCKS_MAX);
    ensure!(args.lookups > 0 && args.lookups_now > 0, "lookup counts must be positive");
    let memtable_versions_max = usize::try_from(args.memtable_versions_max)?;
    ensure!(memtable_versions_max > 0, "--memtable-versions-max must be positive");

    let data_dir = DataDir::fresh(&args.dir)?;
    let start = Instant::now();
    let out = report::Out::new(args.json);
    out.header(&args_summary(&args));

    let disk_bytes_per_second = measure::disk_write_bytes_per_second(data_dir.path(), PROBE_BYTES)?;
    out.progress(&format!(
        "disk: {} sequential write+fdatasync ({} MiB in 1 MiB pwrites)",
        report::rate_bytes(disk_bytes_per_second),
        PROBE_BYTES >> 20
    ));

    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(data_dir.path())?);
    let index = VersionIndex::create(
        Arc::clone(&storage),
        INDEX_DIR,
        IndexConfig::default(),
        PageCache::new(args.page_cache_bytes),
    )?;
    let mut ingest = Ingest::new(Workload::new(args.seed, args.blocks), index, memtable_versions_max);
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x6c6f_6f6b_7570); // "lookup"
    let mut stages = Vec::new();
    for &target in &args.stages {
        // VmHWM then covers this stage's ingest and warm lookups only, not the
        // previous stage's cold index handle.
        let peak_reset = measure::reset_peak_resident();
        let grown = ingest.grow_to(target)?;
        out.progress(&format!(
            "grew to {} versions in {:.1} s ({}/s)",
            report::count(ingest.version_count),
            grown.seconds_total,
            report::count_f(grown.versions_per_second())
        ));
        // The previous stage's cold step emptied the OS page cache, and runs
        // no merge has touched since would otherwise still be on disk only.
        let warm_start = Instant::now();
        let warmed_bytes = measure::warm_os_cache(&data_dir.path().join(INDEX_DIR))?;
        out.progress(&format!(
            "read {} of index files into the OS page cache in {:.1} s",
            report::bytes(warmed_bytes),
            warm_start.elapsed().as_secs_f64()
        ));
        let history = ingest.lookups_history(&mut rng, args.lookups, args.blocks)?;
        let now = ingest.lookups_now(&mut rng, args.lookups_now)?;
        let resident = measure::resident()?;
        let index_stats = ingest.index.stats();
        let cache_pages = ingest.index.page_cache().stats().pages;
        let disk = measure::disk_usage(&data_dir.path().join(INDEX_DIR))?;
        let cold = match ingest.timestamp_persisted {
            Some(persisted) if args.lookups_cold > 0 => {
                Some(cold_lookups(&storage, &data_dir, &args, &mut rng, persisted)?)
            }
            _ => None,
        };
        let stage = StageReport {
            target,
            version_count: ingest.version_count,
            record_count: ingest.record_count,
            grown,
            io_total: ingest.io_total,
            history,
            now,
            cold,
            resident,
            peak_reset,
            index_stats,
            cache_pages,
            disk,
            disk_bytes_per_second,
            baseline: None,
        };
        out.progress(&stage.one_line());
        stages.push(stage);
    }

    if args.baseline_versions_max > 0 {
        run_baseline(&args, &ingest.index, &mut stages, &out)?;
    }
    if args.retention_window_ms > 0 {
        let last = ingest.timestamp_persisted.context("no run was written")?;
        retention_pass(&ingest.index, last, args.retention_window_ms * 1_000_000, &out)?;
    }
    drop(ingest);
    out.finish(&args_summary(&args), &stages, start.elapsed().as_secs_f64());
    drop(data_dir);
    Ok(())
}

fn args_summary(args: &Args) -> report::Config {
    report::Config {
        blocks: args.blocks,
        memtable_versions_max: args.memtable_versions_max,
        page_cache_bytes: args.page_cache_bytes,
        seed: args.seed,
        dir: args.dir.display().to_string(),
        index_config: IndexConfig::default(),
    }
}

/// Work done while growing the index by one stage.
/// One retention pass as the engine's maintenance runs it (thinning set,
/// every run rewritten), over all history up to `last`: prints versions kept,
/// time and the peak RSS of the pass.
fn retention_pass(index: &VersionIndex, last: Timestamp, window_nanos: u64, out: &report::Out) -> anyhow::Result<()> {
    let span = last.unix_nanos() - TIMESTAMP_FIRST.unix_nanos();
    let align = |nanos: u64| Timestamp::from_unix_nanos(((nanos + 1) / window_nanos * window_nanos).saturating_sub(1));
    let horizon = align(TIMESTAMP_FIRST.unix_nanos() + span / 4);
    let until = align(TIMESTAMP_FIRST.unix_nanos() + span / 2);
    index.set_thinning(Thinning { tiers: vec![(window_nanos, until)], horizon: Some(horizon), ..Thinning::default() });
    let before = index.stats().versions_in_runs;
    let peak_reset = measure::reset_peak_resident();
    let start = Instant::now();
    index.rewrite_all()?;
    let seconds = start.elapsed().as_secs_f64();
    let after = index.stats().versions_in_runs;
    let resident = measure::resident()?;
    out.progress(&format!(
        "retention pass over {} versions (oldest quarter to its base, {} ms windows for the next): kept {} \
         (r = {:.3}) in {seconds:.1} s ({}/s), peak RSS {}{}",
        report::count(before),
        window_nanos / 1_000_000,
        report::count(after),
        after as f64 / before as f64,
        report::count_f(before as f64 / seconds),
        report::bytes(resident.hwm_bytes),
        if peak_reset { " (during the pass)" } else { " (whole process)" }
    ));
    Ok(())
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Grown {
    pub version_count: u64,
    pub record_count: u64,
    pub seconds_total: f64,
    pub seconds_seal: f64,
    pub seconds_persist: f64,
    pub seconds_compact: f64,
    /// Longest single `persist()` call (one memtable written as a run).
    pub seconds_persist_max: f64,
    /// Longest single merge (one `compact()` call that returned true).
    pub seconds_merge_max: f64,
    pub runs_written: u64,
    pub merges: u64,
    pub io_persist: IoCounters,
    pub io_compact: IoCounters,
}

impl Grown {
    pub fn versions_per_second(&self) -> f64 {
        self.version_count as f64 / self.seconds_total
    }

    /// Time not spent sealing, persisting or merging: `insert` itself and
    /// generating the records.
    pub fn seconds_insert(&self) -> f64 {
        self.seconds_total - self.seconds_seal - self.seconds_persist - self.seconds_compact
    }
}

/// Cumulative I/O of persisting and merging since the start.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoTotal {
    pub persist: IoCounters,
    pub compact: IoCounters,
}

struct Ingest {
    workload: Workload,
    index: VersionIndex,
    memtable_versions_max: usize,
    versions: Vec<Version>,
    version_count: u64,
    record_count: u64,
    recent: VecDeque<RecordExtent>,
    /// Newest time in the runs (what a reopened index knows).
    timestamp_persisted: Option<Timestamp>,
    io_total: IoTotal,
}

impl Ingest {
    fn new(workload: Workload, index: VersionIndex, memtable_versions_max: usize) -> Ingest {
        Ingest {
            workload,
            index,
            memtable_versions_max,
            versions: Vec::with_capacity(workload::RECORD_BLOCKS_MAX as usize),
            version_count: 0,
            record_count: 0,
            recent: VecDeque::with_capacity(RECENT_RECORDS_MAX),
            timestamp_persisted: None,
            io_total: IoTotal::default(),
        }
    }

    /// Inserts records until the index holds at least `target` versions.
    fn grow_to(&mut self, target: u64) -> anyhow::Result<Grown> {
        let mut grown = Grown::default();
        let start = Instant::now();
        while self.version_count < target {
            let (lsn, extent) = self.workload.next_record(&mut self.versions);
            self.index.insert(lsn, &self.versions);
            self.version_count += self.versions.len() as u64;
            self.record_count += 1;
            grown.version_count += self.versions.len() as u64;
            grown.record_count += 1;
            if self.recent.len() == RECENT_RECORDS_MAX {
                self.recent.pop_front();
            }
            self.recent.push_back(extent);
            if self.index.active_len() >= self.memtable_versions_max {
                self.maintain(lsn, extent.timestamp, &mut grown)?;
            }
        }
        grown.seconds_total = start.elapsed().as_secs_f64();
        self.io_total.persist = add(self.io_total.persist, grown.io_persist);
        self.io_total.compact = add(self.io_total.compact, grown.io_compact);
        Ok(grown)
    }

    /// What `Volume::after_write` and `Volume::maintain` do once the memtable
    /// is full, with every record durable.
    fn maintain(&mut self, lsn: Lsn, timestamp: Timestamp, grown: &mut Grown) -> anyhow::Result<()> {
        let start = Instant::now();
        self.index.seal();
        let sealed = Instant::now();
        let io_before = measure::io_counters();
        grown.runs_written += self.index.persist(lsn)? as u64;
        let persisted = Instant::now();
        let io_persisted = measure::io_counters();
        let mut merge_start = persisted;
        while self.index.compact()? {
            let merged = Instant::now();
            grown.merges += 1;
            grown.seconds_merge_max = grown.seconds_merge_max.max((merged - merge_start).as_secs_f64());
            merge_start = merged;
        }
        let compacted = Instant::now();
        let io_compacted = measure::io_counters();
        grown.seconds_seal += (sealed - start).as_secs_f64();
        grown.seconds_persist += (persisted - sealed).as_secs_f64();
        grown.seconds_persist_max = grown.seconds_persist_max.max((persisted - sealed).as_secs_f64());
        grown.seconds_compact += (compacted - persisted).as_secs_f64();
        grown.io_persist = add(grown.io_persist, io_persisted.since(io_before));
        grown.io_compact = add(grown.io_compact, io_compacted.since(io_persisted));
        assert_eq!(self.index.lsn_indexed(), lsn, "every sealed record is in the runs");
        self.timestamp_persisted = Some(timestamp);
        Ok(())
    }

    /// Random blocks at random times over the whole history so far.
    fn lookups_history(&self, rng: &mut SmallRng, count: u64, block_count: u64) -> anyhow::Result<Lookups> {
        let now = self.workload.timestamp_last().expect("stages are not empty");
        let probes = (0..count).map(|_| random_probe(rng, block_count, now)).collect();
        lookups(&self.index, probes)
    }

    /// Blocks of the last few thousand records, at the newest time: the
    /// common read of a live volume that misses the engine's overlay.
    fn lookups_now(&self, rng: &mut SmallRng, count: u64) -> anyhow::Result<Lookups> {
        let now = self.workload.timestamp_last().expect("stages are not empty");
        let probes = (0..count)
            .map(|_| {
                let extent = self.recent[rng.random_range(0..self.recent.len())];
                Probe {
                    block: extent.block_first + rng.random_range(0..extent.block_count),
                    at: now,
                    written_at: Some(extent.timestamp),
                }
            })
            .collect();
        lookups(&self.index, probes)
    }
}

fn add(a: IoCounters, b: IoCounters) -> IoCounters {
    IoCounters {
        read_bytes: a.read_bytes + b.read_bytes,
        written_bytes: a.written_bytes + b.written_bytes,
        device_read_bytes: a.device_read_bytes + b.device_read_bytes,
    }
}

fn random_probe(rng: &mut SmallRng, block_count: u64, until: Timestamp) -> Probe {
    let at = rng.random_range(TIMESTAMP_FIRST.unix_nanos()..=until.unix_nanos());
    Probe { block: rng.random_range(0..block_count), at: Timestamp::from_unix_nanos(at), written_at: None }
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    block: u64,
    at: Timestamp,
    /// Known to have been written at this time (so the answer is at least as new).
    written_at: Option<Timestamp>,
}

/// One batch of lookups: latencies, and what they cost the page cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lookups {
    pub latency: Latency,
    pub found: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Bytes the OS had to read from the device during the lookups.
    pub device_read_bytes: u64,
    /// For cold lookups: opening the index (reading manifest and fences).
    pub open_seconds: f64,
}

/// Times `find_le` for each probe, one at a time, then checks the answers.
fn lookups(index: &VersionIndex, probes: Vec<Probe>) -> anyhow::Result<Lookups> {
    let cache_before = index.page_cache().stats();
    let io_before = measure::io_counters();
    let mut samples_ns = Vec::with_capacity(probes.len());
    let mut answers = Vec::with_capacity(probes.len());
    for probe in &probes {
        let start = Instant::now();
        let answer = index.find_le(probe.block, probe.at)?;
        samples_ns.push(start.elapsed().as_nanos() as u64);
        answers.push(answer);
    }
    let cache_after = index.page_cache().stats();
    let device_read_bytes = measure::io_counters().since(io_before).device_read_bytes;
    let mut found = 0;
    for (probe, answer) in probes.iter().zip(&answers) {
        if let Some(version) = answer {
            assert_eq!(version.block.0, probe.block, "{probe:?}");
            assert!(version.timestamp <= probe.at, "{probe:?} found {version:?}");
            found += 1;
        }
        if let Some(written_at) = probe.written_at {
            let version = answer.unwrap_or_else(|| panic!("{probe:?} was written but not found"));
            assert!(version.timestamp >= written_at, "{probe:?} found an older {version:?}");
        }
    }
    Ok(Lookups {
        latency: Latency::of(samples_ns),
        found,
        cache_hits: cache_after.hits - cache_before.hits,
        cache_misses: cache_after.misses - cache_before.misses,
        device_read_bytes,
        open_seconds: 0.0,
    })
}

/// Empties the OS page cache, opens a second handle on the index with its
/// own empty page cache, and looks up random blocks at random times up to
/// the newest persisted one (the memtable is not on disk).
fn cold_lookups(
    storage: &Arc<dyn Storage>,
    data_dir: &DataDir,
    args: &Args,
    rng: &mut SmallRng,
    persisted: Timestamp,
) -> anyhow::Result<(Lookups, CacheDrop)> {
    let cache_drop = measure::drop_os_cache(&data_dir.path().join(INDEX_DIR))?;
    let start = Instant::now();
    let cold = VersionIndex::open(
        Arc::clone(storage),
        INDEX_DIR,
        IndexConfig::default(),
        PageCache::new(args.page_cache_bytes),
    )?;
    let open_seconds = start.elapsed().as_secs_f64();
    let probes = (0..args.lookups_cold).map(|_| random_probe(rng, args.blocks, persisted)).collect();
    let mut measured = lookups(&cold, probes)?;
    measured.open_seconds = open_seconds;
    Ok((measured, cache_drop))
}

/// The baseline's numbers for one stage.
#[derive(Clone, Copy, Debug, Default)]
pub struct BaselineStage {
    pub version_count: u64,
    pub seconds_insert: f64,
    pub history: Lookups,
    /// Growth of this process's RSS since the baseline started.
    pub rss_growth_bytes: u64,
    pub oracle_checks: u64,
}

/// Replays the same records into a `BTreeMap` up to each stage within
/// `--baseline-versions-max`, measuring it the same way, and checks that
/// the index answers every lookup as the map does.
fn run_baseline(
    args: &Args,
    index: &VersionIndex,
    stages: &mut [StageReport],
    out: &report::Out,
) -> anyhow::Result<()> {
    let mut workload = Workload::new(args.seed, args.blocks);
    let mut baseline = BTreeBaseline::default();
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x6261_7365); // "base"
    let mut versions = Vec::new();
    let rss_before = measure::resident()?.rss_bytes;
    let mut version_count = 0u64;
    for stage in stages.iter_mut().filter(|stage| stage.target <= args.baseline_versions_max) {
        let start = Instant::now();
        while version_count < stage.target {
            workload.next_record(&mut versions);
            baseline.insert(&versions);
            version_count += versions.len() as u64;
        }
        let seconds_insert = start.elapsed().as_secs_f64();
        assert_eq!(baseline.len() as u64, version_count);
        assert_eq!(version_count, stage.version_count, "the same records as the index");
        let now = workload.timestamp_last().expect("stages are not empty");
        let probes: Vec<Probe> = (0..args.lookups).map(|_| random_probe(&mut rng, args.blocks, now)).collect();
        let mut samples_ns = Vec::with_capacity(probes.len());
        let mut found = 0;
        for probe in &probes {
            let start = Instant::now();
            let answer = baseline.find_le(probe.block, probe.at);
            samples_ns.push(start.elapsed().as_nanos() as u64);
            found += u64::from(answer.is_some());
        }
        // The index holds later versions too, but none at or before `now`.
        let mut oracle_checks = 0;
        for probe in probes.iter().take(ORACLE_CHECKS_MAX as usize) {
            let expected = baseline.find_le(probe.block, probe.at);
            assert_eq!(index.find_le(probe.block, probe.at)?, expected, "{probe:?}");
            oracle_checks += 1;
        }
        let rss_growth_bytes = measure::resident()?.rss_bytes.saturating_sub(rss_before);
        let history = Lookups { latency: Latency::of(samples_ns), found, ..Lookups::default() };
        stage.baseline =
            Some(BaselineStage { version_count, seconds_insert, history, rss_growth_bytes, oracle_checks });
        out.progress(&format!(
            "baseline BTreeMap at {} versions: {}/s insert, find_le p50 {} p99 {}, RSS +{}; index agreed on {oracle_checks} lookups",
            report::count(version_count),
            report::count_f(version_count as f64 / seconds_insert),
            report::micros(history.latency.ns_p50),
            report::micros(history.latency.ns_p99),
            report::bytes(rss_growth_bytes),
        ));
    }
    Ok(())
}

/// Everything measured at one stage.
pub struct StageReport {
    pub target: u64,
    pub version_count: u64,
    pub record_count: u64,
    pub grown: Grown,
    pub io_total: IoTotal,
    pub history: Lookups,
    pub now: Lookups,
    pub cold: Option<(Lookups, CacheDrop)>,
    pub resident: Resident,
    /// Whether VmHWM was reset at the start of this stage.
    pub peak_reset: bool,
    pub index_stats: IndexStats,
    pub cache_pages: u64,
    pub disk: DiskUsage,
    pub disk_bytes_per_second: f64,
    pub baseline: Option<BaselineStage>,
}
