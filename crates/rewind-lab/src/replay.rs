//! Replaying a trace through the CDP architectures in accounting mode: no
//! data moves, every device I/O a layout would issue is counted per store.
//!
//! The architectures (IBM §2.4–2.7, Xiao §2 and §4), each behind the same
//! controller cache ([`crate::cache`]):
//!
//! - **Logging**: one store, the history; a version the cache lets go is
//!   appended to it; reads that miss the cache read it through the map.
//! - **SplitStream**: writes are split above the cache into a current store
//!   (its own cache, which absorbs every overwrite) and a history store (a
//!   cache that keeps what the granularity retains).
//! - **SplitDownStream**: one cache; each version it lets go is written to
//!   both stores.
//! - **Checkpointing**: one cache; a version it lets go is written in place
//!   in the current store, and the version it overwrites there, if the
//!   granularity retains it, is first copied to the history store (a read
//!   and a write).
//! - **COW** (copy-on-write snapshots): at the first write to a block after
//!   a snapshot its data is copied to the snapshot store (history) before
//!   the write; the write then goes through the cache in place.
//! - **ROW** (redirect-on-write snapshots): writes go to the snapshot store
//!   (history) through a cache; at each snapshot the blocks written since
//!   the one before are merged back into the source (current) store, a read
//!   and a write each; reads of a block redirected since the last merge come
//!   from the snapshot store.
//!
//! Granularity: windows of `g` starting at `offset + k·g`; with `g = 0`
//! every write is its own window. For COW and ROW a snapshot is taken at
//! every window boundary. A version is *retained* if it is the last write of
//! its block in its window.
//!
//! Modelling conventions (so the counts can be set against the paper's
//! formulas): a page is an extent is a block; the state before the trace is
//! a retained point (the volume's creation), so its first overwrite is
//! copied by Checkpointing and COW; the trace ends at a window end, so each
//! block's last write is retained, and the cache is flushed; I/Os are counted
//! per block, never merged; reads are counted apart from the I/Os incurred
//! by writes, as the paper does.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::cache::{CacheConfig, ControllerCache};
use crate::trace::{Op, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Architecture {
    Logging,
    SplitStream,
    SplitDownStream,
    Checkpointing,
    Cow,
    Row,
}

impl Architecture {
    pub const ALL: [Architecture; 6] = [
        Architecture::Logging,
        Architecture::SplitStream,
        Architecture::SplitDownStream,
        Architecture::Checkpointing,
        Architecture::Cow,
        Architecture::Row,
    ];

    /// The four architectures of the IBM paper.
    pub const IBM: [Architecture; 4] =
        [Architecture::Logging, Architecture::SplitStream, Architecture::SplitDownStream, Architecture::Checkpointing];

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Logging => "logging",
            Architecture::SplitStream => "split-stream",
            Architecture::SplitDownStream => "split-down-stream",
            Architecture::Checkpointing => "checkpointing",
            Architecture::Cow => "cow",
            Architecture::Row => "row",
        }
    }

    pub fn parse(name: &str) -> Result<Architecture, String> {
        Architecture::ALL.into_iter().find(|architecture| architecture.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Architecture::ALL.iter().map(|architecture| architecture.name()).collect();
            format!("unknown layout {name:?}: one of {}", names.join(", "))
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ReplayConfig {
    pub architecture: Architecture,
    /// Window length (and, for COW and ROW, snapshot interval); 0: every write.
    pub granularity_nanos: u64,
    /// Where the first window starts.
    pub offset_nanos: u64,
    pub cache: CacheConfig,
    pub block_bytes: u64,
}

/// Device I/Os of one store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreIo {
    /// Reads that serve read requests (cache misses).
    pub reads: u64,
    /// Reads that writes cause (copies before overwriting, merges).
    pub reads_for_writes: u64,
    pub writes: u64,
    /// Of all the I/Os, those to the block after the previous one's.
    pub sequential: u64,
    last_block: Option<u64>,
}

impl StoreIo {
    fn io(&mut self, block: u64) {
        if self.last_block.is_some_and(|last| last + 1 == block) {
            self.sequential += 1;
        }
        self.last_block = Some(block);
    }

    fn read(&mut self, block: u64) {
        self.reads += 1;
        self.io(block);
    }

    fn read_for_write(&mut self, block: u64) {
        self.reads_for_writes += 1;
        self.io(block);
    }

    fn write(&mut self, block: u64) {
        self.writes += 1;
        self.io(block);
    }

    pub fn all(&self) -> u64 {
        self.reads + self.reads_for_writes + self.writes
    }
}

/// What a replay counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub requests: u64,
    pub write_requests: u64,
    /// Blocks written and read by the trace.
    pub block_writes: u64,
    pub block_reads: u64,
    pub current: StoreIo,
    pub history: StoreIo,
    /// Writes the granularity retains (r·w).
    pub retained: u64,
    /// Writes the cache destaged before they were overwritten (c·w).
    pub evicted: u64,
    /// Versions the (history) cache let go, to a store: d·w.
    pub incurred: u64,
    /// Of the I/Os, those ROW spends merging snapshots back (in `current` and `history`).
    pub merge_ios: u64,
    /// Snapshots taken (COW and ROW).
    pub snapshots: u64,
}

impl Replay {
    /// Device I/Os that writes cause, per block written (the paper's measure).
    pub fn write_ios_per_write(&self) -> f64 {
        let ios =
            self.current.writes + self.current.reads_for_writes + self.history.writes + self.history.reads_for_writes;
        ios as f64 / self.block_writes.max(1) as f64
    }

    pub fn retained_fraction(&self) -> f64 {
        self.retained as f64 / self.block_writes.max(1) as f64
    }

    pub fn evicted_fraction(&self) -> f64 {
        self.evicted as f64 / self.block_writes.max(1) as f64
    }

    pub fn incurred_fraction(&self) -> f64 {
        self.incurred as f64 / self.block_writes.max(1) as f64
    }
}

/// A cached version: the window it was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    window: u64,
}

struct Replayer {
    config: ReplayConfig,
    result: Replay,
    /// The main cache (the only one but for SplitStream's history cache).
    cache: ControllerCache<Version>,
    /// SplitStream: the history side's cache.
    history_cache: ControllerCache<Version>,
    /// The window of each block's last write (for `retained`).
    last_window: FxHashMap<u64, u64>,
    /// The window of the version the current store holds (absent: the
    /// state before the trace).
    current_window: FxHashMap<u64, u64>,
    /// COW: the window in which each block was last copied to history.
    copied_window: FxHashMap<u64, u64>,
    /// ROW: blocks written since the last merge.
    redirected: FxHashSet<u64>,
    window_now: Option<u64>,
    writes_so_far: u64,
}

impl Replayer {
    fn window(&self, time_nanos: u64) -> u64 {
        match self.config.granularity_nanos {
            0 => self.writes_so_far,
            granularity => (time_nanos + granularity - self.config.offset_nanos % granularity) / granularity,
        }
    }

    fn write(&mut self, block: u64, time_nanos: u64) {
        self.writes_so_far += 1;
        let window = self.window(time_nanos);
        self.snapshots_until(window);
        self.result.block_writes += 1;
        if let Some(previous) = self.last_window.insert(block, window) {
            if previous != window {
                self.result.retained += 1;
            }
        }
        let version = Version { window };
        match self.config.architecture {
            Architecture::Logging | Architecture::SplitDownStream | Architecture::Checkpointing => {
                let outcome = self.cache.write(block, version);
                if let Some(replaced) = outcome.replaced {
                    if replaced.window != window {
                        self.incurred(block, replaced);
                    }
                }
                for (block, version) in outcome.destaged {
                    self.result.evicted += 1;
                    self.incurred(block, version);
                }
            }
            Architecture::SplitStream => {
                // The current side absorbs every overwrite.
                for (block, _) in self.cache.write(block, version).destaged {
                    self.result.evicted += 1;
                    self.result.current.write(block);
                }
                let outcome = self.history_cache.write(block, version);
                if let Some(replaced) = outcome.replaced.filter(|replaced| replaced.window != window) {
                    self.incurred(block, replaced);
                }
                for (block, version) in outcome.destaged {
                    self.incurred(block, version);
                }
            }
            Architecture::Cow => {
                if self.copied_window.insert(block, window) != Some(window) {
                    // The first write since the snapshot: keep what it overwrites.
                    if !self.cache.holds(block) {
                        self.result.current.read_for_write(block);
                    }
                    self.result.history.write(block);
                }
                for (block, _) in self.cache.write(block, version).destaged {
                    self.result.evicted += 1;
                    self.result.current.write(block);
                }
            }
            Architecture::Row => {
                self.redirected.insert(block);
                let outcome = self.cache.write(block, version);
                if let Some(replaced) = outcome.replaced.filter(|replaced| replaced.window != window) {
                    self.incurred(block, replaced);
                }
                for (block, version) in outcome.destaged {
                    self.result.evicted += 1;
                    self.incurred(block, version);
                }
            }
        }
    }

    /// A version leaves the (history) cache for the stores.
    fn incurred(&mut self, block: u64, version: Version) {
        self.result.incurred += 1;
        match self.config.architecture {
            Architecture::Logging | Architecture::SplitStream | Architecture::Row => self.result.history.write(block),
            Architecture::SplitDownStream => {
                self.result.current.write(block);
                self.result.history.write(block);
            }
            Architecture::Checkpointing => {
                let overwritten = self.current_window.insert(block, version.window);
                if overwritten != Some(version.window) {
                    // What the current store held is retained: copy it first.
                    self.result.current.read_for_write(block);
                    self.result.history.write(block);
                }
                self.result.current.write(block);
            }
            Architecture::Cow => unreachable!("COW's cache writes in place"),
        }
    }

    /// COW and ROW take a snapshot at each window boundary; ROW merges the
    /// blocks redirected since the last one back into the source.
    fn snapshots_until(&mut self, window: u64) {
        let Some(previous) = self.window_now.replace(window) else { return };
        if previous == window || !matches!(self.config.architecture, Architecture::Cow | Architecture::Row) {
            return;
        }
        self.result.snapshots += window - previous;
        if self.config.architecture == Architecture::Row {
            self.merge();
        }
    }

    /// ROW: copies every block written since the last merge from the
    /// snapshot store (or the cache) into the source.
    fn merge(&mut self) {
        let mut blocks: Vec<u64> = self.redirected.drain().collect();
        blocks.sort_unstable();
        for block in blocks {
            if !self.cache.holds(block) {
                self.result.history.read_for_write(block);
                self.result.merge_ios += 1;
            }
            self.result.current.write(block);
            self.result.merge_ios += 1;
        }
    }

    fn read(&mut self, block: u64, time_nanos: u64) {
        let window = self.window(time_nanos);
        self.snapshots_until(window);
        self.result.block_reads += 1;
        if self.cache.read(block) {
            return;
        }
        match self.config.architecture {
            Architecture::Logging => self.result.history.read(block),
            Architecture::Row if self.redirected.contains(&block) => self.result.history.read(block),
            _ => self.result.current.read(block),
        }
    }

    fn finish(mut self) -> Replay {
        let flushed = self.cache.flush();
        for (block, version) in flushed {
            match self.config.architecture {
                Architecture::SplitStream | Architecture::Cow => self.result.current.write(block),
                _ => self.incurred(block, version),
            }
        }
        for (block, version) in self.history_cache.flush() {
            self.incurred(block, version);
        }
        if self.config.architecture == Architecture::Row {
            self.merge();
        }
        // Each block's last write is retained: the trace ends at a window end.
        self.result.retained += self.last_window.len() as u64;
        self.result
    }
}

/// Replays `requests` (in time order) through one architecture.
pub fn replay(requests: impl IntoIterator<Item = Request>, config: ReplayConfig) -> Replay {
    assert!(config.block_bytes > 0);
    let history_cache = match config.architecture {
        Architecture::SplitStream => config.cache,
        _ => CacheConfig { pages: 0, dirty_fraction: 0.0 },
    };
    let mut replayer = Replayer {
        config,
        result: Replay::default(),
        cache: ControllerCache::new(config.cache),
        history_cache: ControllerCache::new(history_cache),
        last_window: FxHashMap::default(),
        current_window: FxHashMap::default(),
        copied_window: FxHashMap::default(),
        redirected: FxHashSet::default(),
        window_now: None,
        writes_so_far: 0,
    };
    for request in requests {
        replayer.result.requests += 1;
        if request.op == Op::Write {
            replayer.result.write_requests += 1;
        }
        for block in request.blocks(config.block_bytes) {
            match request.op {
                Op::Write => replayer.write(block, request.time_nanos),
                Op::Read => replayer.read(block, request.time_nanos),
            }
        }
    }
    replayer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(time_nanos: u64, block: u64) -> Request {
        Request { time_nanos, op: Op::Write, offset_bytes: block * 4096, length_bytes: 4096 }
    }

    fn config(architecture: Architecture, granularity_nanos: u64, pages: u64) -> ReplayConfig {
        ReplayConfig {
            architecture,
            granularity_nanos,
            offset_nanos: 0,
            cache: CacheConfig { pages, dirty_fraction: 1.0 },
            block_bytes: 4096,
        }
    }

    #[test]
    fn without_a_cache_at_every_write_the_ratio_is_1_2_2_3() {
        let trace: Vec<Request> = (0..1000).map(|index| write(index, index * 7 % 31)).collect();
        let ios: Vec<f64> = Architecture::IBM
            .iter()
            .map(|&architecture| replay(trace.iter().copied(), config(architecture, 0, 0)).write_ios_per_write())
            .collect();
        assert_eq!(ios, vec![1.0, 2.0, 2.0, 3.0]);
    }

    #[test]
    fn a_granularity_window_absorbs_overwrites_in_the_cache() {
        // Block 1 written 5 times in window [0, 100), once in [100, 200).
        let trace = [write(1, 1), write(2, 1), write(3, 1), write(4, 1), write(5, 1), write(150, 1)];
        let logging = replay(trace, config(Architecture::Logging, 100, 10));
        assert_eq!((logging.retained, logging.incurred, logging.history.writes), (2, 2, 2));
        let checkpointing = replay(trace, config(Architecture::Checkpointing, 100, 10));
        // Two versions reach the current store; each overwrites a retained one
        // (the state before the trace, then the first window's last write).
        assert_eq!((checkpointing.current.writes, checkpointing.current.reads_for_writes), (2, 2));
        assert_eq!(checkpointing.history.writes, 2);
    }

    #[test]
    fn cow_copies_once_per_block_and_snapshot_and_row_merges() {
        let trace = [write(1, 1), write(2, 1), write(3, 2), write(150, 1)];
        let cow = replay(trace, config(Architecture::Cow, 100, 0));
        assert_eq!((cow.history.writes, cow.current.reads_for_writes, cow.current.writes), (3, 3, 4));
        let row = replay(trace, config(Architecture::Row, 100, 0));
        assert_eq!(row.history.writes, 4, "every write is redirected");
        // Merges at t=150 (blocks 1, 2) and at the end (block 1).
        assert_eq!(row.merge_ios, 6);
        assert_eq!(row.snapshots, 1);
    }
}
