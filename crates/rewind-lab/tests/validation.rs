//! The lab against the IBM paper's analysis, on seeded synthetic traces
//! (Poisson arrivals, Zipf block popularity, so that temporal distances
//! span seconds to hours):
//!
//! - replayed I/O counts agree with the analytic model within 2%;
//! - with no cache at every-write granularity the I/Os per write are
//!   1 : 2 : 2 : 3 (Logging : SplitStream : SplitDownStream : Checkpointing);
//! - Checkpointing costs more than SplitStream exactly when 2r > c;
//! - the retained fraction averaged over window offsets matches R(g).
//!
//! The analytic side takes only what the model takes: the trace's temporal
//! distances, and the cache window s that the replay's measured c stands for
//! (c = 1 − T(s)). Each case prints its seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rewind_lab::cache::CacheConfig;
use rewind_lab::model::{checkpointing_beats_split_stream, ios_per_write, TemporalDistances};
use rewind_lab::replay::{replay, Architecture, Replay, ReplayConfig};
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

fn distances(trace: &[Request]) -> TemporalDistances {
    TemporalDistances::of(trace.iter().map(|request| (request.time_nanos, request.offset_bytes / 4096)))
}

fn run(trace: &[Request], architecture: Architecture, g: u64, offset: u64, pages: u64) -> Replay {
    let config = ReplayConfig {
        architecture,
        granularity_nanos: g,
        offset_nanos: offset,
        cache: CacheConfig { pages, dirty_fraction: 0.03 },
        block_bytes: 4096,
    };
    replay(trace.iter().copied(), config)
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
        let model = distances(&trace);
        // Caches of 3% dirty pages: 1,000 and 10,000 pages hold ~30 and ~300 dirty.
        for pages in [1_000u64, 10_000] {
            for g in [0, SECOND, 10 * SECOND, 60 * SECOND, 600 * SECOND] {
                let logging = |offset| run(&trace, Architecture::Logging, g, offset, pages);
                let c = over_offsets(g, 8, |offset| logging(offset).evicted_fraction());
                let d = over_offsets(g, 8, |offset| logging(offset).incurred_fraction());
                let s = model.cache_window(c);
                let (d_model, r_model) = (model.incurred(g, s), model.retained(g));
                println!("  pages {pages} g {g}: c {c:.4} s {:.1}s d {d:.4} vs D(g,s) {d_model:.4}", s as f64 / 1e9);
                assert!(relative_error(d, d_model) < 0.02, "seed {seed} pages {pages} g {g}: d {d} vs {d_model}");
                for architecture in Architecture::IBM {
                    let ios =
                        over_offsets(g, 8, |offset| run(&trace, architecture, g, offset, pages).write_ios_per_write());
                    let expected = ios_per_write(architecture, d_model, r_model, c);
                    assert!(
                        relative_error(ios, expected) < 0.02,
                        "seed {seed} pages {pages} g {g} {}: {ios} I/Os per write vs {expected}",
                        architecture.name()
                    );
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
        let model = distances(&trace);
        for g in [SECOND, 10 * SECOND, 60 * SECOND, 600 * SECOND, 1800 * SECOND] {
            let r = over_offsets(g, 16, |offset| run(&trace, Architecture::Logging, g, offset, 0).retained_fraction());
            let expected = model.retained(g);
            println!("  g {g}: r {r:.4} vs R(g) {expected:.4}");
            assert!(relative_error(r, expected) < 0.01, "seed {seed} g {g}: {r} vs {expected}");
        }
    }
}
