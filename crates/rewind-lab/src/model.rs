//! The analytical models the lab sets replays against.
//!
//! From the IBM paper (seed 002 §3): the temporal distance distribution
//! T(t) — the fraction of writes whose block is written again within t —;
//! the retained fraction R(g) = 1 − (1/g)∫₀^g T(t)dt (Claim 3.1); the
//! incurred fraction D(g, s) with the cache window s, where c = 1 − T(s)
//! (Claim 3.2); the I/Os per write of each architecture (Figure 5) and their
//! space (Figure 6). From Xiao et al. (seed 003 §3): the two-state Markov
//! model of a block under periodic snapshots and the response times of COW
//! and ROW (equations 1–3).

use crate::replay::{Architecture, Convention};

/// The temporal distances of a trace's block writes.
#[derive(Clone, Debug)]
pub struct TemporalDistances {
    /// Finite distances, in nanoseconds, sorted.
    sorted: Vec<u64>,
    /// Writes never followed by another write of their block.
    last_writes: u64,
    /// Whether those count (as writes with an infinite distance) or not.
    convention: Convention,
}

impl TemporalDistances {
    /// From block writes `(time, block)` in time order.
    pub fn of(writes: impl IntoIterator<Item = (u64, u64)>, convention: Convention) -> TemporalDistances {
        let mut previous: rustc_hash::FxHashMap<u64, u64> = rustc_hash::FxHashMap::default();
        let mut sorted = Vec::new();
        for (time, block) in writes {
            if let Some(before) = previous.insert(block, time) {
                sorted.push(time - before);
            }
        }
        sorted.sort_unstable();
        TemporalDistances { sorted, last_writes: previous.len() as u64, convention }
    }

    /// Block writes counted: n, the denominator of T, R and D.
    pub fn writes(&self) -> u64 {
        match self.convention {
            Convention::Paper => self.sorted.len() as u64,
            Convention::SteadyState => self.sorted.len() as u64 + self.last_writes,
        }
    }

    /// Distinct blocks written.
    pub fn blocks(&self) -> u64 {
        self.last_writes
    }

    /// T(t): the fraction of writes whose block is written again within `t`.
    pub fn cdf(&self, t: u64) -> f64 {
        self.sorted.partition_point(|&distance| distance <= t) as f64 / self.writes().max(1) as f64
    }

    /// R(g) of Claim 3.1: (1/n) Σ min(aᵢ/g, 1), the expected retained
    /// fraction over the offset of the windows. 1 at every write (g = 0).
    pub fn retained(&self, g: u64) -> f64 {
        if g == 0 {
            return 1.0;
        }
        let within = self.sorted.partition_point(|&distance| distance < g);
        // Summed when asked (a few dozen times a report) rather than kept as
        // prefix sums: 8 bytes a write less. In f64: 10^8 distances overflow u64 nanoseconds.
        let below: f64 = self.sorted[..within].iter().map(|&distance| distance as f64).sum();
        let sum = below / g as f64 + (self.writes() - within as u64) as f64;
        sum / self.writes().max(1) as f64
    }

    /// c for a cache window `s`: the fraction of writes not overwritten within s.
    pub fn evicted(&self, s: u64) -> f64 {
        1.0 - self.cdf(s)
    }

    /// The cache window s a measured c stands for: the least s with
    /// T(s) ≥ 1 − c (u64::MAX when c = 0 and some writes are never
    /// overwritten, that is when the cache holds everything).
    pub fn cache_window(&self, c: f64) -> u64 {
        let wanted = ((1.0 - c) * self.writes() as f64).ceil() as usize;
        match wanted {
            0 => 0,
            wanted if wanted > self.sorted.len() => u64::MAX,
            wanted => self.sorted[wanted - 1],
        }
    }

    /// D(g, s) of Claim 3.2: the fraction of writes incurred (retained, or
    /// let go by the cache before being overwritten).
    pub fn incurred(&self, g: u64, s: u64) -> f64 {
        if g == 0 {
            return 1.0;
        }
        if s >= g {
            return self.retained(g);
        }
        let (s_f, g_f) = (s as f64, g as f64);
        s_f / g_f * self.retained(s) + self.evicted(s) * (1.0 - s_f / g_f)
    }
}

/// The fractions of the counted writes that Figure 5 takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fractions {
    /// d: incurred (let go by the cache to a store).
    pub incurred: f64,
    /// r: retained by the granularity.
    pub retained: f64,
    /// c: evicted (destaged before being overwritten).
    pub evicted: f64,
    /// m: COW's copies that must read the old data from disk; the rest find
    /// it in the cache. 1 without a cache; measured by the replay, as c is.
    pub copy_misses: f64,
}

/// Figure 5: device I/Os per write of each architecture. COW and ROW as
/// their cached counterparts: COW copies each retained version at its
/// overwrite (a write to the snapshot store, and a read unless the old data
/// is cached: r(1 + m)) and writes what the cache destages (c); the paper's
/// c + 2r is m = 1. ROW writes d to the snapshot store and merges back
/// later (counted apart).
pub fn ios_per_write(architecture: Architecture, fractions: Fractions) -> f64 {
    let Fractions { incurred: d, retained: r, evicted: c, copy_misses: m } = fractions;
    match architecture {
        Architecture::Logging => d,
        Architecture::SplitStream => d + c,
        Architecture::SplitDownStream => 2.0 * d,
        Architecture::Checkpointing => d + 2.0 * r,
        Architecture::Cow => c + r * (1.0 + m),
        Architecture::Row => d,
    }
}

/// Figure 5's crossover: Checkpointing costs less than SplitStream when
/// c > 2r, more when c < 2r.
pub fn checkpointing_beats_split_stream(r: f64, c: f64) -> bool {
    c > 2.0 * r
}

/// Figure 6: space of each architecture in blocks, from the retained
/// versions r·w (each block's last version among them, as the figure's
/// a + rw − f for Checkpointing implies: its history holds all but the
/// current one), a addressable blocks and f blocks addressed.
pub fn space_blocks(architecture: Architecture, retained_versions: u64, a: u64, f: u64) -> f64 {
    let history = retained_versions as f64;
    match architecture {
        Architecture::Logging | Architecture::Row => history,
        Architecture::SplitStream | Architecture::SplitDownStream => a as f64 + history,
        Architecture::Checkpointing | Architecture::Cow => a as f64 + history - f as f64,
    }
}

/// Xiao et al.'s model (§3): N blocks accessed uniformly at λ requests per
/// second, a fraction γ of them writes, snapshots every 1/μ seconds on
/// average, a disk access of D seconds and σ seconds to merge a read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SnapshotModel {
    pub blocks: f64,
    pub requests_per_second: f64,
    pub write_ratio: f64,
    pub snapshots_per_second: f64,
    pub disk_seconds: f64,
    pub merge_seconds: f64,
}

impl SnapshotModel {
    /// (P0, P1): the steady-state probabilities that a block has not, or
    /// has, been written since the last snapshot.
    pub fn states(&self) -> (f64, f64) {
        let rate = self.write_ratio * self.requests_per_second / self.blocks;
        let p0 = self.snapshots_per_second / (self.snapshots_per_second + rate);
        (p0, 1.0 - p0)
    }

    /// Equation 1: COW's mean response time.
    pub fn cow_seconds(&self) -> f64 {
        let (p0, p1) = self.states();
        let (gamma, d) = (self.write_ratio, self.disk_seconds);
        (1.0 - gamma) * d + gamma * (p1 * d + p0 * 3.0 * d)
    }

    /// Equation 2: ROW's, merging at runtime before the next snapshot, in
    /// its per-I/O form. Taken literally the merge term N·P1·2D·μ is disk
    /// time per second of wall time (dimensionless), not time per I/O;
    /// divided by the λ I/Os of that second it is the merge work each I/O
    /// carries, which is what a response time can add.
    pub fn row_seconds(&self) -> f64 {
        let (_, p1) = self.states();
        let merge_per_second = self.blocks * p1 * 2.0 * self.disk_seconds * self.snapshots_per_second;
        self.row_offline_seconds() + merge_per_second / self.requests_per_second
    }

    /// Equation 3: ROW's, merging offline.
    pub fn row_offline_seconds(&self) -> f64 {
        let (gamma, d) = (self.write_ratio, self.disk_seconds);
        (1.0 - gamma) * (d + self.merge_seconds) + gamma * d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retained_fraction_matches_claim_3_1_by_integration() {
        // Distances 10, 20 and 30 (blocks 1, 2, 3 written twice) and three last writes.
        let writes = [(0, 1), (0, 2), (0, 3), (10, 1), (20, 2), (30, 3)];
        let distances = TemporalDistances::of(writes, Convention::SteadyState);
        assert_eq!((distances.writes(), distances.blocks()), (6, 3));
        assert_eq!(distances.cdf(15), 1.0 / 6.0);
        // R(g) = 1 − (1/g)∫₀^g T(t)dt, integrated numerically.
        for g in [5u64, 15, 25, 40, 1000] {
            let steps = 100_000;
            let integral: f64 = (0..steps).map(|step| distances.cdf(step * g / steps)).sum::<f64>() / steps as f64;
            assert!((distances.retained(g) - (1.0 - integral)).abs() < 1e-3, "g = {g}");
        }
        assert_eq!(distances.retained(0), 1.0);
        // The paper counts the three writes with a subsequent write: T reaches 1.
        let paper = TemporalDistances::of(writes, Convention::Paper);
        assert_eq!((paper.writes(), paper.cdf(15), paper.cdf(30)), (3, 1.0 / 3.0, 1.0));
        assert!((paper.retained(40) - (10.0 + 20.0 + 30.0) / 40.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn incurred_is_retained_once_the_cache_window_reaches_the_granularity() {
        let distances = TemporalDistances::of((0..100).map(|index| (index * 3, index % 7)), Convention::SteadyState);
        assert_eq!(distances.incurred(10, 20), distances.retained(10));
        assert!(distances.incurred(100, 5) >= distances.retained(100));
        assert_eq!(distances.cache_window(distances.evicted(21)), 21);
    }

    #[test]
    fn figure_5_at_every_write_without_a_cache_is_1_2_2_3() {
        let every = Fractions { incurred: 1.0, retained: 1.0, evicted: 1.0, copy_misses: 1.0 };
        let ios: Vec<f64> = Architecture::ALL.iter().map(|&architecture| ios_per_write(architecture, every)).collect();
        assert_eq!(ios, vec![1.0, 2.0, 2.0, 3.0, 3.0, 1.0]);
        assert!(checkpointing_beats_split_stream(0.1, 0.5) && !checkpointing_beats_split_stream(0.4, 0.5));
    }

    #[test]
    fn cow_costs_three_disk_accesses_for_a_first_write() {
        // Snapshots far more often than writes: every write is a first one.
        let model = SnapshotModel {
            blocks: 1000.0,
            requests_per_second: 100.0,
            write_ratio: 1.0,
            snapshots_per_second: 1e6,
            disk_seconds: 0.01,
            merge_seconds: 0.002,
        };
        assert!((model.cow_seconds() - 0.03).abs() < 1e-6);
        assert!((model.row_offline_seconds() - 0.01).abs() < 1e-9);
    }

    #[test]
    fn rows_merge_term_is_per_io() {
        // 1000 blocks, 100 I/Os a second, all writes, a snapshot every 10 s:
        // P1 = (100/1000)/(0.1 + 0.1) = 0.5; each snapshot merges 500 blocks
        // at 2D = 20 ms, 10 s of disk time every 10 s, spread over 1000 I/Os.
        let model = SnapshotModel {
            blocks: 1000.0,
            requests_per_second: 100.0,
            write_ratio: 1.0,
            snapshots_per_second: 0.1,
            disk_seconds: 0.01,
            merge_seconds: 0.002,
        };
        assert!((model.states().1 - 0.5).abs() < 1e-12);
        assert!((model.row_seconds() - (0.01 + 0.01)).abs() < 1e-12, "{}", model.row_seconds());
    }
}
