//! An SPC-1-like workload generator (IBM §4.2.1).
//!
//! What the paper fixes: each Business Scaling Unit (BSU) issues 50 I/Os per
//! second; storage is split into three Application Storage Units — ASU-1
//! "data store" 45% of the capacity and 59.6% of the I/Os, ASU-2 "user
//! store" 45% and 12.3%, ASU-3 "log" 10% and 28.1% — and every I/O is 4 KiB
//! and 4 KiB-aligned. What it leaves open, and this generator chooses (the
//! full SPC-1 specification is not public): arrivals are a Poisson process;
//! ASU-1 is 50% writes, ASU-2 30%, ASU-3 all writes (about 62% writes in
//! all, as in SPC-1); in ASU-1 and ASU-2 70% of the I/Os go to a hot set of
//! 10% of the ASU's blocks (scattered over it) and the rest anywhere in it,
//! uniformly; ASU-3 writes sequentially, wrapping around. So, as in the
//! paper, more BSUs on the same capacity means shorter temporal distances.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::{Op, Request};

pub const BLOCK_BYTES: u64 = 4096;
pub const IOPS_PER_BSU: f64 = 50.0;

#[derive(Clone, Copy, Debug)]
pub struct Spc1 {
    pub bsu: u32,
    pub capacity_bytes: u64,
    pub duration_nanos: u64,
    pub seed: u64,
}

/// One ASU: where it lies, its share of the I/Os and how it writes.
struct Asu {
    first_block: u64,
    blocks: u64,
    io_share: f64,
    write_share: f64,
    sequential: bool,
}

/// The hot set's share of an ASU's random I/Os, and of its blocks.
const HOT_IO_SHARE: f64 = 0.7;
const HOT_BLOCK_SHARE: f64 = 0.1;

impl Spc1 {
    pub fn check(&self) -> Result<(), String> {
        if self.bsu == 0 {
            return Err("--bsu must be at least 1".into());
        }
        if self.capacity_bytes < 100 * BLOCK_BYTES {
            return Err("--capacity must be at least 400 KiB (100 blocks of 4 KiB)".into());
        }
        if self.duration_nanos == 0 {
            return Err("--duration must be positive".into());
        }
        Ok(())
    }

    fn asus(&self) -> [Asu; 3] {
        let blocks = self.capacity_bytes / BLOCK_BYTES;
        let first = blocks * 45 / 100;
        let second = blocks * 45 / 100;
        [
            Asu { first_block: 0, blocks: first, io_share: 0.596, write_share: 0.5, sequential: false },
            Asu { first_block: first, blocks: second, io_share: 0.123, write_share: 0.3, sequential: false },
            Asu {
                first_block: first + second,
                blocks: blocks - first - second,
                io_share: 0.281,
                write_share: 1.0,
                sequential: true,
            },
        ]
    }

    /// The workload's requests, in time order.
    pub fn requests(&self) -> impl Iterator<Item = Request> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let asus = self.asus();
        let mean_gap_nanos = 1e9 / (IOPS_PER_BSU * f64::from(self.bsu));
        let duration = self.duration_nanos;
        let mut time = 0.0f64;
        let mut log_cursor = 0u64;
        std::iter::from_fn(move || {
            time += -mean_gap_nanos * (1.0 - rng.random::<f64>()).ln();
            if time >= duration as f64 {
                return None;
            }
            let pick: f64 = rng.random();
            let asu = if pick < asus[0].io_share {
                &asus[0]
            } else if pick < asus[0].io_share + asus[1].io_share {
                &asus[1]
            } else {
                &asus[2]
            };
            let op = if rng.random::<f64>() < asu.write_share { Op::Write } else { Op::Read };
            let block = if asu.sequential {
                log_cursor = (log_cursor + 1) % asu.blocks;
                log_cursor
            } else if rng.random::<f64>() < HOT_IO_SHARE {
                let hot = ((asu.blocks as f64 * HOT_BLOCK_SHARE) as u64).max(1);
                // Scatter the hot set over the ASU (an odd multiplier permutes it).
                rng.random_range(0..hot).wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1) % asu.blocks
            } else {
                rng.random_range(0..asu.blocks)
            };
            Some(Request {
                time_nanos: time as u64,
                op,
                offset_bytes: (asu.first_block + block) * BLOCK_BYTES,
                length_bytes: BLOCK_BYTES,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_shares_and_seeds() {
        let spc1 = Spc1 { bsu: 20, capacity_bytes: 1 << 30, duration_nanos: 60_000_000_000, seed: 7 };
        let requests: Vec<Request> = spc1.requests().collect();
        // 20 BSU × 50 IOPS × 60 s = 60,000 expected.
        assert!((57_000..63_000).contains(&requests.len()), "{}", requests.len());
        let writes = requests.iter().filter(|request| request.op == Op::Write).count() as f64;
        let share = writes / requests.len() as f64;
        assert!((0.59..0.64).contains(&share), "write share {share}");
        let log_start = (1u64 << 30) / BLOCK_BYTES * 90 / 100 * BLOCK_BYTES;
        let log = requests.iter().filter(|request| request.offset_bytes >= log_start).count() as f64;
        assert!((0.27..0.29).contains(&(log / requests.len() as f64)));
        assert!(requests.windows(2).all(|pair| pair[0].time_nanos <= pair[1].time_nanos));
        assert!(requests.iter().all(|request| request.offset_bytes.is_multiple_of(4096)));
        let again: Vec<Request> = spc1.requests().take(100).collect();
        assert_eq!(again[..], requests[..100], "the same seed gives the same trace");
    }
}
