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
//!   cache that keeps what the granularity retains). The two caches are the
//!   configured size each and see the same writes, so their pages come and
//!   go together: one cache stands for both.
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

use rewind_types::Layout;
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

    /// The engine layout this architecture models; its name is the layout's.
    pub fn layout(self) -> Layout {
        match self {
            Architecture::Logging => Layout::Logging,
            Architecture::SplitStream => Layout::SplitStream,
            Architecture::SplitDownStream => Layout::SplitDownStream,
            Architecture::Checkpointing => Layout::Checkpointing,
            Architecture::Cow => Layout::Cow,
            Architecture::Row => Layout::Row,
        }
    }

    pub fn name(self) -> &'static str {
        self.layout().name()
    }

    /// The architecture of a layout name. Every layout the papers model has
    /// one; Rewind's own default (journaled) has no model to check.
    pub fn parse(name: &str) -> Result<Architecture, String> {
        let layout = Layout::parse(name)?;
        Architecture::ALL.into_iter().find(|architecture| architecture.layout() == layout).ok_or_else(|| {
            let names: Vec<&str> = Architecture::ALL.iter().map(|architecture| architecture.name()).collect();
            format!("the lab models the papers' layouts ({}); {name} is Rewind's own", names.join(", "))
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

/// What all architectures share in one replay.
#[derive(Clone, Copy, Debug)]
pub struct ReplaySetup {
    pub granularity_nanos: u64,
    pub offset_nanos: u64,
    pub cache: CacheConfig,
    pub block_bytes: u64,
}

/// Device I/Os of one store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreIo {
    /// Reads that serve read requests (cache misses).
    pub reads: u64,
    /// Reads that writes cause (copies before overwriting, merges).
    pub reads_for_writes: u64,
    pub writes: u64,
    /// Of all the I/Os, those to the block after the previous one's.
    pub sequential: u64,
    #[serde(skip)]
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

/// What a replay counted for one architecture.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
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
    /// Device I/Os that writes cause, per block written (the paper's
    /// measure); ROW's merges are counted apart ([`Replay::merge_ios_per_write`]).
    pub fn write_ios_per_write(&self) -> f64 {
        let ios =
            self.current.writes + self.current.reads_for_writes + self.history.writes + self.history.reads_for_writes;
        (ios - self.merge_ios) as f64 / self.block_writes.max(1) as f64
    }

    /// ROW: the I/Os of merging snapshots back, per block written.
    pub fn merge_ios_per_write(&self) -> f64 {
        self.merge_ios as f64 / self.block_writes.max(1) as f64
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

/// One pass of a trace through the cache, counting for every architecture
/// at once: the cache behaves the same for all of them (a write to a dirty
/// page replaces its data, whatever becomes of the replaced version); only
/// what each does with the versions it lets go differs.
struct Replayer {
    setup: ReplaySetup,
    /// Counts by architecture, in `Architecture::ALL` order.
    results: [Replay; 6],
    cache: ControllerCache<Version>,
    /// The window of each block's last write (for `retained`).
    last_window: FxHashMap<u64, u64>,
    /// Checkpointing: the window of the version the current store holds
    /// (absent: the state before the trace).
    current_window: FxHashMap<u64, u64>,
    /// COW: the window in which each block was last copied to history.
    copied_window: FxHashMap<u64, u64>,
    /// ROW: blocks written since the last merge.
    redirected: FxHashSet<u64>,
    window_now: Option<u64>,
    writes_so_far: u64,
}

fn at(architecture: Architecture) -> usize {
    architecture as usize
}

impl Replayer {
    fn result(&mut self, architecture: Architecture) -> &mut Replay {
        &mut self.results[at(architecture)]
    }

    fn each(&mut self, count: impl Fn(&mut Replay)) {
        self.results.iter_mut().for_each(count);
    }

    fn window(&self, time_nanos: u64) -> u64 {
        match self.setup.granularity_nanos {
            0 => self.writes_so_far,
            granularity => (time_nanos + granularity - self.setup.offset_nanos % granularity) / granularity,
        }
    }

    fn write(&mut self, block: u64, time_nanos: u64) {
        self.writes_so_far += 1;
        let window = self.window(time_nanos);
        self.snapshots_until(window);
        self.each(|result| result.block_writes += 1);
        if self.last_window.insert(block, window).is_some_and(|previous| previous != window) {
            self.each(|result| result.retained += 1);
        }
        // COW: the first write since the snapshot keeps what it overwrites.
        if self.copied_window.insert(block, window) != Some(window) {
            let cached = self.cache.holds(block);
            let cow = self.result(Architecture::Cow);
            if !cached {
                cow.current.read_for_write(block);
            }
            cow.history.write(block);
        }
        self.redirected.insert(block);
        let outcome = self.cache.write(block, Version { window });
        if let Some(replaced) = outcome.replaced.filter(|replaced| replaced.window != window) {
            self.let_go(block, replaced, Departure::Retained);
        }
        for (block, version) in outcome.destaged {
            self.each(|result| result.evicted += 1);
            self.let_go(block, version, Departure::Destaged);
        }
    }

    /// A version leaves the cache: retained when a write of a later window
    /// replaced it in a dirty page, destaged when the cache needed room (or
    /// at the end).
    fn let_go(&mut self, block: u64, version: Version, departure: Departure) {
        for architecture in [Architecture::Logging, Architecture::SplitStream, Architecture::Row] {
            let result = self.result(architecture);
            result.incurred += 1;
            result.history.write(block);
        }
        let split_down_stream = self.result(Architecture::SplitDownStream);
        split_down_stream.incurred += 1;
        split_down_stream.current.write(block);
        split_down_stream.history.write(block);
        let overwritten = self.current_window.insert(block, version.window);
        let checkpointing = self.result(Architecture::Checkpointing);
        checkpointing.incurred += 1;
        if overwritten != Some(version.window) {
            // What the current store held is retained: copy it first.
            checkpointing.current.read_for_write(block);
            checkpointing.history.write(block);
        }
        checkpointing.current.write(block);
        // The architectures whose current store absorbs every overwrite
        // write only what the cache destages.
        if departure == Departure::Destaged {
            self.result(Architecture::SplitStream).current.write(block);
            let cow = self.result(Architecture::Cow);
            cow.incurred += 1;
            cow.current.write(block);
        }
    }

    /// COW and ROW take a snapshot at each window boundary; ROW merges the
    /// blocks redirected since the last one back into the source.
    fn snapshots_until(&mut self, window: u64) {
        let Some(previous) = self.window_now.replace(window) else { return };
        if previous == window {
            return;
        }
        for architecture in [Architecture::Cow, Architecture::Row] {
            self.result(architecture).snapshots += window - previous;
        }
        self.merge();
    }

    /// ROW: copies every block written since the last merge from the
    /// snapshot store (or the cache) into the source.
    fn merge(&mut self) {
        let mut blocks: Vec<u64> = self.redirected.drain().collect();
        blocks.sort_unstable();
        for block in blocks {
            let cached = self.cache.holds(block);
            let row = &mut self.results[at(Architecture::Row)];
            if !cached {
                row.history.read_for_write(block);
                row.merge_ios += 1;
            }
            row.current.write(block);
            row.merge_ios += 1;
        }
    }

    fn read(&mut self, block: u64, time_nanos: u64) {
        let window = self.window(time_nanos);
        self.snapshots_until(window);
        self.each(|result| result.block_reads += 1);
        if self.cache.read(block) {
            return;
        }
        for architecture in Architecture::ALL {
            let from_history = match architecture {
                Architecture::Logging => true,
                Architecture::Row => self.redirected.contains(&block),
                _ => false,
            };
            let result = self.result(architecture);
            if from_history {
                result.history.read(block);
            } else {
                result.current.read(block);
            }
        }
    }

    fn finish(mut self) -> [Replay; 6] {
        for (block, version) in self.cache.flush() {
            self.let_go(block, version, Departure::Destaged);
        }
        self.merge();
        // Each block's last write is retained: the trace ends at a window end.
        let blocks = self.last_window.len() as u64;
        self.each(|result| result.retained += blocks);
        self.results
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Departure {
    Retained,
    Destaged,
}

/// Replays `requests` (in time order) once, counting for every
/// architecture; the results are in `Architecture::ALL` order.
pub fn replay_all(requests: impl IntoIterator<Item = Request>, setup: ReplaySetup) -> [Replay; 6] {
    assert!(setup.block_bytes > 0);
    let mut replayer = Replayer {
        setup,
        results: Default::default(),
        cache: ControllerCache::new(setup.cache),
        last_window: FxHashMap::default(),
        current_window: FxHashMap::default(),
        copied_window: FxHashMap::default(),
        redirected: FxHashSet::default(),
        window_now: None,
        writes_so_far: 0,
    };
    for request in requests {
        let is_write = request.op == Op::Write;
        replayer.each(|result| {
            result.requests += 1;
            result.write_requests += u64::from(is_write);
        });
        for block in request.blocks(setup.block_bytes) {
            match request.op {
                Op::Write => replayer.write(block, request.time_nanos),
                Op::Read => replayer.read(block, request.time_nanos),
            }
        }
    }
    replayer.finish()
}

/// Replays `requests` (in time order) through one architecture.
pub fn replay(requests: impl IntoIterator<Item = Request>, config: ReplayConfig) -> Replay {
    let setup = ReplaySetup {
        granularity_nanos: config.granularity_nanos,
        offset_nanos: config.offset_nanos,
        cache: config.cache,
        block_bytes: config.block_bytes,
    };
    let [logging, split_stream, split_down_stream, checkpointing, cow, row] = replay_all(requests, setup);
    match config.architecture {
        Architecture::Logging => logging,
        Architecture::SplitStream => split_stream,
        Architecture::SplitDownStream => split_down_stream,
        Architecture::Checkpointing => checkpointing,
        Architecture::Cow => cow,
        Architecture::Row => row,
    }
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
    fn architectures_are_named_as_the_engine_layouts_they_model() {
        for architecture in Architecture::ALL {
            assert_eq!(Architecture::parse(architecture.layout().name()), Ok(architecture));
        }
        let error = Architecture::parse("journaled").expect_err("the lab has no model of Rewind's own layout");
        assert!(error.contains("Rewind's own") && error.contains("split-down-stream"), "{error}");
        let error = Architecture::parse("lvm").expect_err("no such layout");
        assert!(error.contains("unknown layout \"lvm\""), "{error}");
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
