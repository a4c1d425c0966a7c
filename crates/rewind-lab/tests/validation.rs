//! The lab against the IBM paper's analysis, on seeded synthetic traces
//! (Poisson arrivals, Zipf block popularity, so that temporal distances
//! span seconds to hours):
//!
//! - replayed I/O counts agree with the analytic model within 2%;
//! - with no cache at every-write granularity the I/Os per write are
//!   1 : 2 : 2 : 3 (Logging : SplitStream : SplitDownStream : Checkpointing);
//! - Checkpointing costs more than SplitStream exactly when 2r > c;
//! - the retained fraction averaged over window offsets matches R(g);
//! - on thousands of random small traces, under both conventions, the
//!   replayed I/Os per write are exactly Figure 5's formulas at the replayed
//!   r, c and d (replay and model count the same events), and Checkpointing
//!   beats SplitStream exactly when c > 2r.
//!
//! The analytic side takes only what the model takes: the trace's temporal
//! distances, and the cache window s that the replay's measured c stands for
//! (c = 1 − T(s)). Each case prints its seed; `REWIND_SEED=<n>` runs the
//! random traces from that seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rewind_lab::cache::CacheConfig;
use rewind_lab::model::{checkpointing_beats_split_stream, ios_per_write, Fractions, TemporalDistances};
use rewind_lab::replay::{replay_all, Architecture, Census, Convention, Replay, ReplaySetup};
use rewind_lab::trace::{Op, Request};

const SECOND: u64 = 1_000_000_000;

/// `writes` single-block writes over `duration` to `blocks` blocks, Zipf(1.1).
fn synthetic(seed: u64, writes: u64, blocks: u64, duration: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cumulative = Vec::with_capacity(blocks as usize);
    let mut total = 0.0;
    for rank in 1..=blocks {
        total += 1.0 / (rank as f64).powf(1.1);
        cumulative.push(total);
    }
    let gap = duration as f64 / writes as f64;
    let mut time = 0.0f64;
    (0..writes)
        .map(|_| {
            time += -gap * (1.0 - rng.random::<f64>()).ln();
            let pick = rng.random::<f64>() * total;
            let block = cumulative.partition_point(|&weight| weight < pick).min(blocks as usize - 1) as u64;
            Request { time_nanos: time as u64, op: Op::Write, offset_bytes: block * 4096, length_bytes: 4096 }
        })
        .collect()
}

const CONVENTIONS: [Convention; 2] = [Convention::Paper, Convention::SteadyState];

fn distances(trace: &[Request], convention: Convention) -> TemporalDistances {
    let writes = trace.iter().filter(|request| request.op == Op::Write);
    TemporalDistances::of(writes.map(|request| (request.time_nanos, request.offset_bytes / 4096)), convention)
}

/// Every architecture's replay, in `Architecture::ALL` order.
fn run_all(trace: &[Request], convention: Convention, g: u64, offset: u64, pages: u64) -> [Replay; 6] {
    let setup = ReplaySetup {
        granularity_nanos: g,
        offset_nanos: offset,
        cache: CacheConfig { pages, dirty_fraction: 0.03 },
        block_bytes: 4096,
        convention,
    };
    replay_all(trace, setup, &Census::of(trace, 4096, u64::MAX).expect("no limit"))
}

fn run(trace: &[Request], architecture: Architecture, g: u64, offset: u64, pages: u64) -> Replay {
    run_all(trace, Convention::SteadyState, g, offset, pages)[architecture as usize].clone()
}

/// The mean of `measure` over `offsets` window offsets spread over g.
fn over_offsets(g: u64, offsets: u64, measure: impl Fn(u64) -> f64) -> f64 {
    let offsets = if g == 0 { 1 } else { offsets };
    (0..offsets).map(|index| measure(g * index / offsets)).sum::<f64>() / offsets as f64
}

fn relative_error(measured: f64, expected: f64) -> f64 {
    (measured - expected).abs() / expected
}

#[test]
fn replayed_io_counts_agree_with_the_analytic_model_within_2_percent() {
    for seed in [1u64, 2, 3] {
        println!("seed {seed}");
        let trace = synthetic(seed, 200_000, 20_000, 3600 * SECOND);
        for convention in CONVENTIONS {
            let model = distances(&trace, convention);
            // Caches of 3% dirty pages: 1,000 and 10,000 pages hold ~30 and ~300 dirty.
            for pages in [1_000u64, 10_000] {
                for g in [0, SECOND, 10 * SECOND, 60 * SECOND, 600 * SECOND] {
                    let offsets = if g == 0 { 1 } else { 8 };
                    let replays: Vec<[Replay; 6]> =
                        (0..offsets).map(|index| run_all(&trace, convention, g, g * index / offsets, pages)).collect();
                    let mean = |measure: &dyn Fn(&[Replay; 6]) -> f64| {
                        replays.iter().map(measure).sum::<f64>() / replays.len() as f64
                    };
                    let logging = Architecture::Logging as usize;
                    let c = mean(&|replays| replays[logging].evicted_fraction());
                    let d = mean(&|replays| replays[logging].incurred_fraction());
                    let copy_misses = mean(&|replays| replays[Architecture::Cow as usize].copy_miss_fraction());
                    let s = model.cache_window(c);
                    let fractions = Fractions {
                        incurred: model.incurred(g, s),
                        retained: model.retained(g),
                        evicted: c,
                        copy_misses,
                    };
                    println!(
                        "  {} pages {pages} g {g}: c {c:.4} s {:.1}s d {d:.4} vs D(g,s) {:.4}",
                        convention.name(),
                        s as f64 / 1e9,
                        fractions.incurred
                    );
                    let case = format!("seed {seed} {} pages {pages} g {g}", convention.name());
                    assert!(relative_error(d, fractions.incurred) < 0.02, "{case}: d {d} vs {}", fractions.incurred);
                    for architecture in Architecture::ALL {
                        let ios = mean(&|replays| replays[architecture as usize].write_ios_per_write());
                        let expected = ios_per_write(architecture, fractions);
                        assert!(
                            relative_error(ios, expected) < 0.02,
                            "{case} {}: {ios} I/Os per write vs {expected}",
                            architecture.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn without_a_cache_at_every_write_the_ratio_is_1_2_2_3() {
    let trace = synthetic(4, 20_000, 5_000, 60 * SECOND);
    let ios: Vec<f64> = Architecture::IBM
        .iter()
        .map(|&architecture| run(&trace, architecture, 0, 0, 0).write_ios_per_write())
        .collect();
    assert_eq!(ios, vec![1.0, 2.0, 2.0, 3.0]);
}

#[test]
fn checkpointing_costs_more_than_split_stream_exactly_when_2r_exceeds_c() {
    let trace = synthetic(5, 100_000, 10_000, 3600 * SECOND);
    let mut seen = [false; 2];
    for pages in [0u64, 1_000, 30_000, 300_000] {
        for g in [0, SECOND, 30 * SECOND, 300 * SECOND, 1800 * SECOND] {
            let checkpointing = run(&trace, Architecture::Checkpointing, g, 0, pages);
            let split_stream = run(&trace, Architecture::SplitStream, g, 0, pages);
            let (r, c) = (checkpointing.retained_fraction(), checkpointing.evicted_fraction());
            if (2.0 * r - c).abs() < 0.01 {
                continue; // Too close to the crossover to tell.
            }
            let cheaper = checkpointing.write_ios_per_write() < split_stream.write_ios_per_write();
            assert_eq!(cheaper, checkpointing_beats_split_stream(r, c), "pages {pages} g {g}: r {r} c {c}");
            seen[usize::from(cheaper)] = true;
        }
    }
    assert_eq!(seen, [true, true], "both sides of the crossover are exercised");
}

#[test]
fn the_retained_fraction_averaged_over_window_offsets_matches_claim_3_1() {
    for seed in [6u64, 7] {
        println!("seed {seed}");
        let trace = synthetic(seed, 100_000, 10_000, 3600 * SECOND);
        for convention in CONVENTIONS {
            let model = distances(&trace, convention);
            for g in [SECOND, 10 * SECOND, 60 * SECOND, 600 * SECOND, 1800 * SECOND] {
                let retained = |offset| run_all(&trace, convention, g, offset, 0)[0].retained_fraction();
                let r = over_offsets(g, 16, retained);
                let expected = model.retained(g);
                println!("  {} g {g}: r {r:.4} vs R(g) {expected:.4}", convention.name());
                assert!(
                    relative_error(r, expected) < 0.01,
                    "seed {seed} {} g {g}: {r} vs {expected}",
                    convention.name()
                );
            }
        }
    }
}

/// A few dozen requests, reads among them, over a handful of blocks, at
/// times that bunch and spread: the small traces on which an accounting
/// slip shows (one block's last write, the flush at the end, a copy of the
/// state before the trace).
fn small_random_trace(rng: &mut ChaCha8Rng) -> Vec<Request> {
    let blocks = rng.random_range(1..=12u64);
    let requests = rng.random_range(1..=60);
    let mut time = 0u64;
    (0..requests)
        .map(|_| {
            time += if rng.random_bool(0.3) { 0 } else { rng.random_range(0..20 * SECOND) };
            let length = rng.random_range(1..=3u64) * 4096;
            Request {
                time_nanos: time,
                op: if rng.random_bool(0.2) { Op::Read } else { Op::Write },
                offset_bytes: rng.random_range(0..blocks) * 4096,
                length_bytes: length,
            }
        })
        .collect()
}

#[test]
fn on_random_small_traces_the_replay_is_figure_5_exactly_and_the_crossover_is_c_equals_2r() {
    let first = std::env::var("REWIND_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_nanos() as u64
    });
    let cases = 3_000u64;
    println!("seeds {first}..{} (REWIND_SEED={first} draws the same traces)", first.wrapping_add(cases));
    let mut sides = [0u64; 3];
    for case in 0..cases {
        let seed = first.wrapping_add(case);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let trace = small_random_trace(&mut rng);
        let pages = [0u64, 1, 2, 4, 8, 64][rng.random_range(0..6)];
        let g = [0, SECOND, 5 * SECOND, 30 * SECOND, 300 * SECOND][rng.random_range(0..5)];
        let offset = if g == 0 { 0 } else { rng.random_range(0..g) };
        for convention in CONVENTIONS {
            let setup = ReplaySetup {
                granularity_nanos: g,
                offset_nanos: offset,
                cache: CacheConfig { pages, dirty_fraction: [0.03, 0.5, 1.0][rng.random_range(0..3)] },
                block_bytes: 4096,
                convention,
            };
            let replays = replay_all(&trace, setup, &Census::of(&trace, 4096, u64::MAX).expect("no limit"));
            let logging = &replays[Architecture::Logging as usize];
            let fractions = Fractions {
                incurred: logging.incurred_fraction(),
                retained: logging.retained_fraction(),
                evicted: logging.evicted_fraction(),
                copy_misses: replays[Architecture::Cow as usize].copy_miss_fraction(),
            };
            let case = format!("seed {seed} {} pages {pages} g {g} offset {offset}: {trace:?}", convention.name());
            for architecture in Architecture::ALL {
                let replayed = replays[architecture as usize].write_ios_per_write();
                let formula = ios_per_write(architecture, fractions);
                assert!(
                    (replayed - formula).abs() < 1e-9,
                    "{case}\n{}: replayed {replayed} vs {formula}",
                    architecture.name()
                );
            }
            // Checkpointing − SplitStream = 2r − c, in whole I/Os.
            let ios = |architecture: Architecture| {
                let replay = &replays[architecture as usize];
                replay.current.writes
                    + replay.current.reads_for_writes
                    + replay.history.writes
                    + replay.history.reads_for_writes
            };
            let (checkpointing, split_stream) = (ios(Architecture::Checkpointing), ios(Architecture::SplitStream));
            let (twice_retained, evicted) = (2 * logging.retained, logging.evicted);
            assert_eq!(checkpointing.cmp(&split_stream), twice_retained.cmp(&evicted), "{case}");
            if logging.counted_writes > 0 {
                let beats = checkpointing < split_stream;
                assert_eq!(beats, checkpointing_beats_split_stream(fractions.retained, fractions.evicted), "{case}");
            }
            sides[(twice_retained.cmp(&evicted) as i8 + 1) as usize] += 1;
        }
    }
    println!("2r < c, 2r = c, 2r > c: {sides:?}");
    assert!(sides.iter().all(|&side| side > 0), "every side of the crossover is drawn: {sides:?}");
}
