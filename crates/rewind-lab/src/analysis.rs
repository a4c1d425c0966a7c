//! `rewind lab analyze`: a trace replayed at every granularity and cache
//! size asked for, set against the models, with a recommendation.
//!
//! The numbers here are what [`crate::report`] draws and writes; they are
//! also the report's `analysis.json`.

use serde::Serialize;

use crate::cache::CacheConfig;
use crate::model::{ios_per_write, space_blocks, Fractions, SnapshotModel, TemporalDistances};
use crate::replay::{replay_all, Architecture, Census, Convention, Replay, ReplaySetup, TooManyBlocks};
use crate::trace::{Op, Request};

/// What to analyse a trace at.
#[derive(Clone, Debug)]
pub struct AnalyzeConfig {
    /// Granularities in nanoseconds; 0 is every write (`ew`).
    pub granularities_nanos: Vec<u64>,
    pub caches_bytes: Vec<u64>,
    pub block_bytes: u64,
    /// The controller cache's dirty page limit, as a fraction (the IBM paper's 3%).
    pub dirty_fraction: f64,
    /// Addressable bytes (a); by default the end of the highest extent the trace touches.
    pub capacity_bytes: Option<u64>,
    /// Xiao's D and σ: one disk access, and merging one read of a ROW snapshot.
    pub disk_seconds: f64,
    pub merge_seconds: f64,
    pub convention: Convention,
    /// The most distinct blocks written that the lab keeps state for.
    pub max_blocks: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    pub requests: u64,
    pub write_requests: u64,
    pub block_writes: u64,
    pub block_reads: u64,
    /// w: the block writes the convention counts (paper: those with a
    /// subsequent write, block_writes − f).
    pub counted_writes: u64,
    pub duration_nanos: u64,
    pub block_bytes: u64,
    /// a: addressable blocks.
    pub blocks_addressable: u64,
    /// f: distinct blocks written.
    pub blocks_written: u64,
    /// γ: the fraction of requests that are writes.
    pub write_ratio: f64,
}

/// One architecture at one granularity and cache size.
#[derive(Clone, Debug, Serialize)]
pub struct ArchitecturePoint {
    pub architecture: &'static str,
    /// Device I/Os caused by writes, per write counted: replayed, and
    /// Figure 5's with D(g, s), R(g), the replayed c and (COW) m.
    pub ios_per_write: f64,
    pub ios_per_write_model: f64,
    /// Figure 6's space, in bytes, with the replayed retained versions.
    pub space_bytes_model: f64,
    pub current_ios: u64,
    pub current_sequential: u64,
    pub history_ios: u64,
    pub history_sequential: u64,
    /// ROW: the I/Os merging snapshots back (in the stores' counts, not in `ios_per_write`), per block written.
    pub merge_ios_per_write: f64,
}

/// One granularity and cache size.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub granularity_nanos: u64,
    pub cache_bytes: u64,
    /// r: replayed (windows from the trace's start), and R(g) of Claim 3.1.
    pub retained: f64,
    pub retained_model: f64,
    /// c: the fraction of writes the cache lets go before they are overwritten.
    pub evicted: f64,
    /// d: replayed, and D(g, s) of Claim 3.2 at the cache window s that c stands for.
    pub incurred: f64,
    pub incurred_model: f64,
    /// m: the fraction of COW's copies that read the old data from disk.
    pub copy_misses: f64,
    pub architectures: Vec<ArchitecturePoint>,
}

impl Point {
    pub fn architecture(&self, architecture: Architecture) -> &ArchitecturePoint {
        &self.architectures[architecture as usize]
    }
}

/// Xiao's model at one snapshot interval.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotPoint {
    pub interval_nanos: u64,
    pub cow_seconds: f64,
    pub row_seconds: f64,
    pub row_offline_seconds: f64,
    /// The write ratio above which COW is slower than ROW merging offline
    /// (None: never within 0..1).
    pub cow_row_crossover: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    /// Which writes every fraction and per-write figure counts.
    pub convention: Convention,
    pub convention_text: &'static str,
    pub trace: TraceSummary,
    /// T(t) sampled on a logarithmic grid: (t in nanoseconds, T).
    pub temporal_distances: Vec<(u64, f64)>,
    /// R(g) on the same grid.
    pub retained_curve: Vec<(u64, f64)>,
    /// Granularity-major: every cache size for the first granularity, then the next.
    pub points: Vec<Point>,
    pub snapshots: Vec<SnapshotPoint>,
    pub disk_seconds: f64,
    pub merge_seconds: f64,
    pub recommendations: Vec<String>,
}

impl Analysis {
    pub fn point(&self, granularity_nanos: u64, cache_bytes: u64) -> &Point {
        self.points
            .iter()
            .find(|point| point.granularity_nanos == granularity_nanos && point.cache_bytes == cache_bytes)
            .expect("analysed at every granularity and cache size")
    }

    pub fn granularities(&self) -> Vec<u64> {
        let mut granularities: Vec<u64> = self.points.iter().map(|point| point.granularity_nanos).collect();
        granularities.dedup();
        granularities
    }

    pub fn caches(&self) -> Vec<u64> {
        let first = self.points.first().map_or(0, |point| point.granularity_nanos);
        self.points.iter().filter(|point| point.granularity_nanos == first).map(|point| point.cache_bytes).collect()
    }
}

/// Replays `requests` at every granularity and cache size (one pass each,
/// all architectures at once), calling `progress(done,
/// total)` after each. Refuses a trace that writes more distinct blocks
/// than `config.max_blocks`, before it holds state for them.
pub fn analyze(
    requests: &[Request],
    config: &AnalyzeConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Analysis, TooManyBlocks> {
    let block_bytes = config.block_bytes;
    let census = Census::of(requests, block_bytes, config.max_blocks)?;
    let writes = requests
        .iter()
        .filter(|request| request.op == Op::Write)
        .flat_map(move |request| request.blocks(block_bytes).map(move |block| (request.time_nanos, block)));
    let distances = TemporalDistances::of(writes, config.convention);
    let trace = summarize(requests, config, &distances, &census);
    let setups: Vec<(u64, u64)> = config
        .granularities_nanos
        .iter()
        .flat_map(|&g| config.caches_bytes.iter().map(move |&cache_bytes| (g, cache_bytes)))
        .collect();
    let total = setups.len() as u64;
    let replay_at = |&(g, cache_bytes): &(u64, u64)| {
        let setup = ReplaySetup {
            granularity_nanos: g,
            offset_nanos: 0,
            cache: CacheConfig::new(cache_bytes, block_bytes, config.dirty_fraction),
            block_bytes,
            convention: config.convention,
        };
        point(g, cache_bytes, &replay_all(requests, setup, &census), &distances, &trace)
    };
    // One replay at a time: replays in parallel would each hold their own
    // state for every block (CloudPhysics: 94 MB on two cores against 43 MB).
    let mut points = Vec::with_capacity(setups.len());
    for setup in &setups {
        points.push(replay_at(setup));
        progress(points.len() as u64, total);
    }
    let grid = log_grid(trace.duration_nanos);
    let snapshots = snapshot_points(&trace, config);
    let mut analysis = Analysis {
        convention: config.convention,
        convention_text: config.convention.describe(),
        temporal_distances: grid.iter().map(|&t| (t, distances.cdf(t))).collect(),
        retained_curve: grid.iter().map(|&g| (g, distances.retained(g))).collect(),
        trace,
        points,
        snapshots,
        disk_seconds: config.disk_seconds,
        merge_seconds: config.merge_seconds,
        recommendations: Vec::new(),
    };
    analysis.recommendations = recommend(&analysis);
    Ok(analysis)
}

fn summarize(
    requests: &[Request],
    config: &AnalyzeConfig,
    distances: &TemporalDistances,
    census: &Census,
) -> TraceSummary {
    let block_bytes = config.block_bytes;
    let count_blocks = |op: Op| -> u64 {
        requests
            .iter()
            .filter(|request| request.op == op)
            .map(|request| request.blocks(block_bytes).count() as u64)
            .sum()
    };
    let end = requests.iter().map(|request| request.offset_bytes + request.length_bytes).max().unwrap_or(0);
    let write_requests = requests.iter().filter(|request| request.op == Op::Write).count() as u64;
    let capacity = config.capacity_bytes.unwrap_or(end).max(end);
    let block_writes = count_blocks(Op::Write);
    assert_eq!(distances.blocks(), census.blocks_written(), "the model and the census see the same writes");
    TraceSummary {
        requests: requests.len() as u64,
        write_requests,
        block_writes,
        block_reads: count_blocks(Op::Read),
        counted_writes: distances.writes(),
        duration_nanos: requests.last().map_or(0, |last| last.time_nanos),
        block_bytes,
        blocks_addressable: capacity.div_ceil(block_bytes),
        blocks_written: census.blocks_written(),
        write_ratio: write_requests as f64 / requests.len().max(1) as f64,
    }
}

fn point(
    g: u64,
    cache_bytes: u64,
    replays: &[Replay; 6],
    distances: &TemporalDistances,
    trace: &TraceSummary,
) -> Point {
    let logging = &replays[Architecture::Logging as usize];
    assert_eq!(logging.counted_writes, trace.counted_writes, "replay and model count the same writes");
    let (r, c) = (logging.retained_fraction(), logging.evicted_fraction());
    let copy_misses = replays[Architecture::Cow as usize].copy_miss_fraction();
    let d_model = distances.incurred(g, distances.cache_window(c));
    let model = Fractions { incurred: d_model, retained: distances.retained(g), evicted: c, copy_misses };
    // Figure 6 counts the retained versions with each block's last one (the
    // steady state's r·w); the paper's convention leaves those f out of r.
    let retained_versions = match logging.convention {
        Convention::Paper => logging.retained + trace.blocks_written,
        Convention::SteadyState => logging.retained,
    };
    let architectures = Architecture::ALL
        .iter()
        .zip(replays)
        .map(|(&architecture, replay)| ArchitecturePoint {
            architecture: architecture.name(),
            ios_per_write: replay.write_ios_per_write(),
            ios_per_write_model: ios_per_write(architecture, model),
            space_bytes_model: space_blocks(
                architecture,
                retained_versions,
                trace.blocks_addressable,
                trace.blocks_written,
            ) * trace.block_bytes as f64,
            current_ios: replay.current.all(),
            current_sequential: replay.current.sequential,
            history_ios: replay.history.all(),
            history_sequential: replay.history.sequential,
            merge_ios_per_write: replay.merge_ios_per_write(),
        })
        .collect();
    Point {
        granularity_nanos: g,
        cache_bytes,
        retained: r,
        retained_model: model.retained,
        evicted: c,
        incurred: logging.incurred_fraction(),
        incurred_model: d_model,
        copy_misses,
        architectures,
    }
}

/// 1 ms to the trace's duration, ten points a decade.
fn log_grid(duration_nanos: u64) -> Vec<u64> {
    let end = (duration_nanos.max(1_000_000_000) as f64).log10();
    let start = 6.0;
    let steps = ((end - start) * 10.0).ceil() as u32;
    (0..=steps).map(|step| 10f64.powf(start + (end - start) * f64::from(step) / f64::from(steps)) as u64).collect()
}

/// Xiao's model with the trace's rate and write ratio, N the blocks it
/// writes (the model spreads writes uniformly over N), a snapshot every g.
pub fn snapshot_model(
    trace: &TraceSummary,
    interval_nanos: u64,
    write_ratio: f64,
    config: (f64, f64),
) -> SnapshotModel {
    let seconds = trace.duration_nanos.max(1) as f64 / 1e9;
    SnapshotModel {
        blocks: trace.blocks_written.max(1) as f64,
        requests_per_second: trace.requests as f64 / seconds,
        write_ratio,
        snapshots_per_second: 1e9 / interval_nanos as f64,
        disk_seconds: config.0,
        merge_seconds: config.1,
    }
}

fn snapshot_points(trace: &TraceSummary, config: &AnalyzeConfig) -> Vec<SnapshotPoint> {
    let parameters = (config.disk_seconds, config.merge_seconds);
    config
        .granularities_nanos
        .iter()
        .filter(|&&g| g > 0)
        .map(|&g| {
            let model = snapshot_model(trace, g, trace.write_ratio, parameters);
            let cow_slower = |gamma: f64| {
                let model = snapshot_model(trace, g, gamma, parameters);
                model.cow_seconds() > model.row_offline_seconds()
            };
            SnapshotPoint {
                interval_nanos: g,
                cow_seconds: model.cow_seconds(),
                row_seconds: model.row_seconds(),
                row_offline_seconds: model.row_offline_seconds(),
                cow_row_crossover: crossover(cow_slower),
            }
        })
        .collect()
}

/// The least γ in (0, 1] at which `holds` becomes true, by bisection
/// (None: it does not hold even at 1; Some(0) if it holds from the start).
fn crossover(holds: impl Fn(f64) -> bool) -> Option<f64> {
    if !holds(1.0) {
        return None;
    }
    if holds(0.0) {
        return Some(0.0);
    }
    let (mut low, mut high) = (0.0, 1.0);
    for _ in 0..40 {
        let middle = (low + high) / 2.0;
        if holds(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    Some(high)
}

/// What the numbers say, one sentence each.
fn recommend(analysis: &Analysis) -> Vec<String> {
    let trace = &analysis.trace;
    if trace.block_writes == 0 {
        return vec!["the trace has no writes: there is nothing for a CDP layout to keep, and every layout \
                     serves its reads alike"
            .to_owned()];
    }
    if trace.counted_writes == 0 {
        return vec!["no write in the trace has a subsequent write to its block, so the paper's convention \
                     counts nothing: every layout's cost is that of the writes' first copy; see \
                     --convention steady-state"
            .to_owned()];
    }
    let mut lines = Vec::new();
    // Logging (and ROW) never cost more write I/O than the others; what they
    // give up is a current store (reads of the present go through the map).
    let with_current = [Architecture::SplitStream, Architecture::SplitDownStream, Architecture::Checkpointing];
    for cache in analysis.caches() {
        let mut best_before: Option<Vec<Architecture>> = None;
        for g in analysis.granularities() {
            let point = analysis.point(g, cache);
            let cost = |architecture: Architecture| point.architecture(architecture).ios_per_write;
            let least = with_current.iter().map(|&architecture| cost(architecture)).fold(f64::INFINITY, f64::min);
            // Ties (SplitStream and SplitDownStream without a cache) name every layout in them.
            let best: Vec<Architecture> = with_current
                .into_iter()
                .filter(|&architecture| cost(architecture) - least <= 1e-9 * least.max(1.0))
                .collect();
            if best_before.as_ref() != Some(&best) {
                let verb = if best_before.is_none() { "from" } else { "crossover: from" };
                let names: Vec<&str> = best.iter().map(|architecture| architecture.name()).collect();
                let (subject, verb_be) = if best.len() == 1 {
                    ("the cheapest layout", "is")
                } else {
                    ("the cheapest layouts", "are, tied,")
                };
                lines.push(format!(
                    "cache {}: {verb} g = {} {subject} with a current store {verb_be} {} ({:.3} I/Os per write; \
                     Logging {:.3}, c = {:.3}, 2r = {:.3})",
                    format_bytes(cache),
                    format_granularity(g),
                    names.join(" and "),
                    least,
                    point.architecture(Architecture::Logging).ios_per_write,
                    point.evicted,
                    2.0 * point.retained,
                ));
            }
            best_before = Some(best);
        }
    }
    if let Some(snapshot) = analysis.snapshots.get(analysis.snapshots.len() / 2) {
        let gamma = analysis.trace.write_ratio;
        let line = match snapshot.cow_row_crossover {
            Some(crossover) => format!(
                "snapshots every {}: COW is slower than ROW (offline merge) above a write ratio of {:.2}; \
                 this trace's is {:.2}, so {}",
                format_granularity(snapshot.interval_nanos),
                crossover,
                gamma,
                if gamma > crossover { "ROW" } else { "COW" }
            ),
            None => format!(
                "snapshots every {}: COW answers faster than ROW at every write ratio",
                format_granularity(snapshot.interval_nanos)
            ),
        };
        lines.push(line);
    }
    lines
}

/// `ew` for every write, else the shortest of ms, s, m, h that is whole.
pub fn format_granularity(nanos: u64) -> String {
    const UNITS: [(u64, &str); 5] =
        [(3_600_000_000_000, "h"), (60_000_000_000, "m"), (1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs")];
    if nanos == 0 {
        return "ew".to_owned();
    }
    for (unit, name) in UNITS {
        if nanos.is_multiple_of(unit) {
            return format!("{}{name}", nanos / unit);
        }
    }
    let (unit, name) = UNITS.iter().find(|(unit, _)| nanos >= *unit).copied().unwrap_or((1, "ns"));
    format!("{:.3}{name}", nanos as f64 / unit as f64)
}

/// Binary units, the largest that gives at least 1.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value}{}", UNITS[unit])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IBM paper's cache (3% dirty), D and σ as the CLI's defaults, its convention.
    fn config(granularities_nanos: Vec<u64>, caches_bytes: Vec<u64>, max_blocks: u64) -> AnalyzeConfig {
        AnalyzeConfig {
            granularities_nanos,
            caches_bytes,
            block_bytes: 4096,
            dirty_fraction: 0.03,
            capacity_bytes: None,
            disk_seconds: 0.005,
            merge_seconds: 0.0005,
            convention: Convention::Paper,
            max_blocks,
        }
    }

    #[test]
    fn granularities_and_sizes_print_as_typed() {
        assert_eq!(format_granularity(0), "ew");
        assert_eq!(format_granularity(60_000_000_000), "1m");
        assert_eq!(format_granularity(10_000_000_000), "10s");
        assert_eq!(format_granularity(1_500_000_000), "1500ms");
        assert_eq!(format_bytes(64 << 20), "64MiB");
        assert_eq!(format_bytes(1536), "1.5KiB");
    }

    #[test]
    fn the_crossover_is_where_the_condition_starts_to_hold() {
        let found = crossover(|gamma| gamma > 0.3).expect("holds at 1");
        assert!((found - 0.3).abs() < 1e-9);
        assert_eq!(crossover(|_| false), None);
        assert_eq!(crossover(|_| true), Some(0.0));
    }

    #[test]
    fn an_analysis_names_the_checkpointing_split_stream_crossover() {
        // 1000 blocks written round robin, each every 10 s, past a cache too
        // small to hold a dirty page: every write is let go (c = 1), and
        // windows of a minute retain a sixth (2r = 1/3 < c), so
        // Checkpointing (d + 2r) beats SplitStream (d + c) there.
        let requests: Vec<Request> = (0..20_000u64)
            .map(|index| Request {
                time_nanos: index * 10_000_000,
                op: Op::Write,
                offset_bytes: index % 1000 * 4096,
                length_bytes: 4096,
            })
            .collect();
        let config = config(vec![0, 1_000_000_000, 60_000_000_000], vec![64 << 10], 1000);
        let mut calls = 0;
        let analysis = analyze(&requests, &config, &mut |done, total| {
            calls += 1;
            assert_eq!((done, total), (calls, 3));
        })
        .expect("1000 blocks are allowed");
        assert_eq!(analysis.points.len(), 3);
        let every_write = analysis.point(0, 64 << 10);
        let ios: Vec<f64> = Architecture::IBM
            .iter()
            .map(|&architecture| every_write.architecture(architecture).ios_per_write)
            .collect();
        assert_eq!(ios, vec![1.0, 2.0, 2.0, 3.0]);
        let crossover = analysis.recommendations.iter().find(|line| line.contains("crossover"));
        assert!(
            crossover.is_some_and(|line| line.contains("g = 1m") && line.contains("checkpointing")),
            "{:#?}",
            analysis.recommendations
        );
        assert_eq!(analysis.snapshots.len(), 2);
        // Without a cache SplitStream and SplitDownStream cost the same at every write: both named.
        assert!(
            analysis.recommendations[0].contains("split-stream and split-down-stream"),
            "{:#?}",
            analysis.recommendations
        );
        // One block more than allowed is refused before any replay.
        let error =
            analyze(&requests, &AnalyzeConfig { max_blocks: 999, ..config.clone() }, &mut |_, _| {}).unwrap_err();
        assert!(
            error.to_string().starts_with("the trace writes more than 999 distinct blocks of 4096 bytes"),
            "{error}"
        );
    }

    #[test]
    fn a_trace_without_writes_says_so() {
        let requests: Vec<Request> = (0..10u64)
            .map(|index| Request { time_nanos: index, op: Op::Read, offset_bytes: index * 4096, length_bytes: 4096 })
            .collect();
        let config = config(vec![0], vec![0], 10);
        let analysis = analyze(&requests, &config, &mut |_, _| {}).expect("no writes, no blocks");
        assert_eq!(analysis.recommendations.len(), 1);
        assert!(analysis.recommendations[0].starts_with("the trace has no writes"), "{:?}", analysis.recommendations);
    }
}
