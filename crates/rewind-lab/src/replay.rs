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
//! formulas): a page is an extent is a block; I/Os are counted per block,
//! never merged; reads are counted apart from the I/Os incurred by writes,
//! as the paper does; the trace ends at a window end, and the cache is
//! flushed. Which writes are counted, and what the fractions are of, is the
//! [`Convention`]: the IBM paper's counts only writes that have a subsequent
//! write (and every I/O is charged to the version it moves), Rewind's steady
//! state counts every write, each block's last one and the state before the
//! trace as retained points. Either way replay and model count the same
//! events, so Figure 5's formulas hold exactly for the replayed r, c and d.

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

/// Which writes the fractions r, c, d and the I/Os per write count, and
/// what they divide by. With w writes to f blocks, n = w − f of them have a
/// subsequent write; a figure X per write converts as
/// X_steady = (n·X_paper + k·f) / w, where k is what a block's last write
/// and the state before the trace cost together: 1 for r, c, d, Logging and
/// ROW, 2 for SplitStream and SplitDownStream, 3 for Checkpointing, and for
/// COW 2 plus the share of its first copies that read the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Convention {
    /// The IBM paper's (§3.1, footnote 3): only writes that have a
    /// subsequent write to their block are counted, and an I/O is charged to
    /// the version it writes or preserves, so the I/Os of each block's last
    /// write and the copies of the state before the trace are not counted.
    /// T(t) reaches 1.
    Paper,
    /// Rewind's: every write is counted; each block's last write is
    /// retained (the trace ends at a window end) and the state before the
    /// trace is a retained point that Checkpointing and COW copy once. T(t)
    /// levels off at the fraction of writes that are overwritten.
    SteadyState,
}

impl Convention {
    pub fn parse(name: &str) -> Result<Convention, String> {
        match name {
            "paper" => Ok(Convention::Paper),
            "steady-state" => Ok(Convention::SteadyState),
            other => Err(format!("unknown convention {other:?}: paper or steady-state")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Convention::Paper => "paper",
            Convention::SteadyState => "steady-state",
        }
    }

    /// What the convention counts, in a sentence for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Convention::Paper => {
                "the IBM paper's (footnote 3): only writes that have a subsequent write to their block are \
                 counted, and every fraction is of those"
            }
            Convention::SteadyState => {
                "steady state: every write is counted; each block's last write and the state before the trace \
                 are retained points"
            }
        }
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
    pub convention: Convention,
}

/// What all architectures share in one replay.
#[derive(Clone, Copy, Debug)]
pub struct ReplaySetup {
    pub granularity_nanos: u64,
    pub offset_nanos: u64,
    pub cache: CacheConfig,
    pub block_bytes: u64,
    pub convention: Convention,
}

/// The most blocks a lab run keeps state for, unless told otherwise: about
/// 150 bytes each across the replay and the model, so 2.5 GB.
pub const MAX_BLOCKS_DEFAULT: u64 = 1 << 24;

#[derive(Debug, thiserror::Error)]
#[error(
    "the trace writes more than {limit} distinct blocks of {block_bytes} bytes; the lab keeps state for each \
     (about 150 bytes): raise --max-blocks if this machine has the memory, or replay with a larger --block-size"
)]
pub struct TooManyBlocks {
    pub limit: u64,
    pub block_bytes: u64,
}

/// Where each block's writes end: what a replay needs to know of the
/// future (under the paper's convention, a block's last write is not
/// counted), found in one pass before it. Shared by every replay of a
/// trace; a bit per block write.
#[derive(Clone, Debug)]
pub struct Census {
    block_bytes: u64,
    /// Bit i: the trace's i-th block write is its block's last.
    last_writes: Vec<u64>,
    blocks_written: u64,
}

impl Census {
    /// Refuses a trace that writes more than `max_blocks` distinct blocks.
    pub fn of(requests: &[Request], block_bytes: u64, max_blocks: u64) -> Result<Census, TooManyBlocks> {
        assert!(block_bytes > 0);
        let mut last_write: FxHashMap<u64, u64> = FxHashMap::default();
        let mut ordinal = 0u64;
        for request in requests.iter().filter(|request| request.op == Op::Write) {
            for block in request.blocks(block_bytes) {
                last_write.insert(block, ordinal);
                ordinal += 1;
                if last_write.len() as u64 > max_blocks {
                    return Err(TooManyBlocks { limit: max_blocks, block_bytes });
                }
            }
        }
        let mut last_writes = vec![0u64; ordinal.div_ceil(64) as usize];
        for &last in last_write.values() {
            last_writes[(last / 64) as usize] |= 1 << (last % 64);
        }
        Ok(Census { block_bytes, last_writes, blocks_written: last_write.len() as u64 })
    }

    /// f: the distinct blocks written.
    pub fn blocks_written(&self) -> u64 {
        self.blocks_written
    }

    fn is_last(&self, ordinal: u64) -> bool {
        self.last_writes[(ordinal / 64) as usize] & (1 << (ordinal % 64)) != 0
    }
}

/// Device I/Os of one store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreIo {
    /// Reads that serve read requests (cache misses).
    pub reads: u64,
    /// Reads that writes cause (copies before overwriting, merges).
    pub reads_for_writes: u64,
    pub writes: u64,
    /// Of the I/Os counted, those to the block after the previous I/O's.
    pub sequential: u64,
    #[serde(skip)]
    last_block: Option<u64>,
}

/// Whether an I/O is counted under the replay's convention (it always
/// moves the disk head, so it always counts for sequentiality).
type Counted = bool;

impl StoreIo {
    fn io(&mut self, block: u64, counted: Counted) -> bool {
        let sequential = self.last_block.is_some_and(|last| last + 1 == block);
        self.last_block = Some(block);
        self.sequential += u64::from(counted && sequential);
        counted
    }

    fn read(&mut self, block: u64) {
        self.reads += u64::from(self.io(block, true));
    }

    fn read_for_write(&mut self, block: u64, counted: Counted) {
        self.reads_for_writes += u64::from(self.io(block, counted));
    }

    fn write(&mut self, block: u64, counted: Counted) {
        self.writes += u64::from(self.io(block, counted));
    }

    pub fn all(&self) -> u64 {
        self.reads + self.reads_for_writes + self.writes
    }
}

/// What a replay counted for one architecture.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Replay {
    pub convention: Convention,
    pub requests: u64,
    pub write_requests: u64,
    /// Blocks written and read by the trace.
    pub block_writes: u64,
    pub block_reads: u64,
    /// w: the block writes the convention counts, which the fractions and
    /// the I/Os per write divide by (paper: those with a subsequent write).
    pub counted_writes: u64,
    pub current: StoreIo,
    pub history: StoreIo,
    /// Writes the granularity retains (r·w).
    pub retained: u64,
    /// Writes the cache destaged (or flushed at the end) before they were overwritten (c·w).
    pub evicted: u64,
    /// Versions the (history) cache let go, to a store: d·w.
    pub incurred: u64,
    /// Of the I/Os, those ROW spends merging snapshots back (in `current`
    /// and `history`; all of them, whatever the convention).
    pub merge_ios: u64,
    /// Snapshots taken (COW and ROW).
    pub snapshots: u64,
}

impl Replay {
    fn new(convention: Convention) -> Replay {
        Replay {
            convention,
            requests: 0,
            write_requests: 0,
            block_writes: 0,
            block_reads: 0,
            counted_writes: 0,
            current: StoreIo::default(),
            history: StoreIo::default(),
            retained: 0,
            evicted: 0,
            incurred: 0,
            merge_ios: 0,
            snapshots: 0,
        }
    }

    /// Device I/Os that writes cause, per write counted (the paper's
    /// measure); ROW's merges are counted apart ([`Replay::merge_ios_per_write`]).
    pub fn write_ios_per_write(&self) -> f64 {
        let ios =
            self.current.writes + self.current.reads_for_writes + self.history.writes + self.history.reads_for_writes;
        (ios - self.merge_ios) as f64 / self.counted_writes.max(1) as f64
    }

    /// ROW: the I/Os of merging snapshots back, per write counted.
    pub fn merge_ios_per_write(&self) -> f64 {
        self.merge_ios as f64 / self.counted_writes.max(1) as f64
    }

    pub fn retained_fraction(&self) -> f64 {
        self.retained as f64 / self.counted_writes.max(1) as f64
    }

    pub fn evicted_fraction(&self) -> f64 {
        self.evicted as f64 / self.counted_writes.max(1) as f64
    }

    pub fn incurred_fraction(&self) -> f64 {
        self.incurred as f64 / self.counted_writes.max(1) as f64
    }

    /// COW: the fraction of its copies whose old data had to be read from
    /// the current store (the rest were in the cache). 1 without a cache.
    pub fn copy_miss_fraction(&self) -> f64 {
        if self.history.writes == 0 {
            return 1.0;
        }
        self.current.reads_for_writes as f64 / self.history.writes as f64
    }
}

/// A cached version: the window it was written in, and whether it is its
/// block's last write (which the paper's convention does not count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    window: u64,
    last: bool,
}

/// One pass of a trace through the cache, counting for every architecture
/// at once: the cache behaves the same for all of them (a write to a dirty
/// page replaces its data, whatever becomes of the replaced version); only
/// what each does with the versions it lets go differs.
struct Replayer<'a> {
    setup: ReplaySetup,
    census: &'a Census,
    /// Counts by architecture, in `Architecture::ALL` order.
    results: [Replay; 6],
    cache: ControllerCache<Version>,
    /// What each block written so far needs remembered.
    blocks: FxHashMap<u64, BlockState>,
    /// ROW: blocks written since the last merge.
    redirected: FxHashSet<u64>,
    window_now: Option<u64>,
    writes_so_far: u64,
}

/// A window, or none: 8 bytes (it is kept for every block written).
#[derive(Clone, Copy, Debug)]
struct Window(Option<std::num::NonZeroU64>);

impl Window {
    /// Stores `window` (below 2^64 − 1) and returns what was there.
    fn replace(&mut self, window: u64) -> Option<u64> {
        let stored = std::num::NonZeroU64::new(window + 1).expect("windows stay below 2^64 - 1");
        self.0.replace(stored).map(|previous| previous.get() - 1)
    }
}

/// A block written by the trace.
#[derive(Clone, Copy, Debug)]
struct BlockState {
    /// The window of its last write so far (for `retained`, and COW's first
    /// write of a window).
    last_window: Window,
    /// Checkpointing: the window of the version the current store holds
    /// (`None`: the state before the trace).
    current_window: Window,
}

fn at(architecture: Architecture) -> usize {
    architecture as usize
}

impl Replayer<'_> {
    fn result(&mut self, architecture: Architecture) -> &mut Replay {
        &mut self.results[at(architecture)]
    }

    fn each(&mut self, count: impl Fn(&mut Replay)) {
        self.results.iter_mut().for_each(count);
    }

    fn window(&self, time_nanos: u64) -> u64 {
        match self.setup.granularity_nanos {
            0 => self.writes_so_far,
            granularity => {
                let (time, granularity) = (u128::from(time_nanos), u128::from(granularity));
                let window = (time + granularity - u128::from(self.setup.offset_nanos) % granularity) / granularity;
                // At most 2^64 − 2, so that `Window` can store it.
                u64::try_from(window).unwrap_or(u64::MAX).min(u64::MAX - 1)
            }
        }
    }

    /// Whether the I/Os of a version are counted: a block's last write is
    /// not, under the paper's convention.
    fn counts(&self, version: Version) -> Counted {
        self.setup.convention == Convention::SteadyState || !version.last
    }

    /// Whether copying the state before the trace is counted: it is no
    /// write of the trace, so only in the steady state.
    fn counts_the_state_before(&self) -> Counted {
        self.setup.convention == Convention::SteadyState
    }

    fn write(&mut self, block: u64, time_nanos: u64) {
        let ordinal = self.writes_so_far;
        self.writes_so_far += 1;
        let window = self.window(time_nanos);
        self.snapshots_until(window);
        let version = Version { window, last: self.census.is_last(ordinal) };
        let counted = u64::from(self.counts(version));
        self.each(|result| {
            result.block_writes += 1;
            result.counted_writes += counted;
        });
        let state =
            self.blocks.entry(block).or_insert(BlockState { last_window: Window(None), current_window: Window(None) });
        let previous = state.last_window.replace(window);
        // The version this one supersedes is retained if its window ended;
        // it had a subsequent write (this one), so both conventions count it.
        if previous.is_some_and(|previous| previous != window) {
            self.each(|result| result.retained += 1);
        }
        // COW: the first write since the snapshot (the first of this window)
        // keeps what it overwrites: the previous version, or the state before the trace.
        if previous != Some(window) {
            let counted = previous.is_some() || self.counts_the_state_before();
            let cached = self.cache.holds(block);
            let cow = self.result(Architecture::Cow);
            if !cached {
                cow.current.read_for_write(block, counted);
            }
            cow.history.write(block, counted);
        }
        self.redirected.insert(block);
        let outcome = self.cache.write(block, version);
        if let Some(replaced) = outcome.replaced.filter(|replaced| replaced.window != window) {
            self.let_go(block, replaced, Departure::Retained);
        }
        for (block, version) in outcome.destaged {
            self.let_go(block, version, Departure::Destaged);
        }
    }

    /// A version leaves the cache: retained when a write of a later window
    /// replaced it in a dirty page, destaged when the cache needed room (or
    /// at the end).
    fn let_go(&mut self, block: u64, version: Version, departure: Departure) {
        let counted = self.counts(version);
        let departed = u64::from(counted);
        if departure == Departure::Destaged {
            self.each(|result| result.evicted += departed);
        }
        for architecture in [Architecture::Logging, Architecture::SplitStream, Architecture::Row] {
            let result = self.result(architecture);
            result.incurred += departed;
            result.history.write(block, counted);
        }
        let split_down_stream = self.result(Architecture::SplitDownStream);
        split_down_stream.incurred += departed;
        split_down_stream.current.write(block, counted);
        split_down_stream.history.write(block, counted);
        let state = self.blocks.get_mut(&block).expect("a block let go was written");
        let overwritten = state.current_window.replace(version.window);
        // The copy preserves the version the current store held: one of the
        // trace's (counted: it has a subsequent write, this one) or the state before it.
        let copy_counted = overwritten.is_some() || self.counts_the_state_before();
        let checkpointing = self.result(Architecture::Checkpointing);
        checkpointing.incurred += departed;
        if overwritten != Some(version.window) {
            // What the current store held is retained: copy it first.
            checkpointing.current.read_for_write(block, copy_counted);
            checkpointing.history.write(block, copy_counted);
        }
        checkpointing.current.write(block, counted);
        // The architectures whose current store absorbs every overwrite
        // write only what the cache destages.
        if departure == Departure::Destaged {
            self.result(Architecture::SplitStream).current.write(block, counted);
            let cow = self.result(Architecture::Cow);
            cow.incurred += departed;
            cow.current.write(block, counted);
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
                row.history.read_for_write(block, true);
                row.merge_ios += 1;
            }
            row.current.write(block, true);
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
        // The cache holds each block's newest version, which now is its last write.
        for (block, version) in self.cache.flush() {
            debug_assert!(version.last, "a flushed version is its block's last write");
            self.let_go(block, version, Departure::Destaged);
        }
        self.merge();
        // Each block's last write is retained: the trace ends at a window end.
        if self.setup.convention == Convention::SteadyState {
            let blocks = self.blocks.len() as u64;
            self.each(|result| result.retained += blocks);
        }
        self.results
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Departure {
    Retained,
    Destaged,
}

/// Replays `requests` (in time order) once, counting for every
/// architecture; the results are in `Architecture::ALL` order. `census`
/// is the trace's ([`Census::of`]), at the same block size.
pub fn replay_all(requests: &[Request], setup: ReplaySetup, census: &Census) -> [Replay; 6] {
    assert_eq!(census.block_bytes, setup.block_bytes, "the census is of the replay's blocks");
    let mut replayer = Replayer {
        setup,
        census,
        results: std::array::from_fn(|_| Replay::new(setup.convention)),
        cache: ControllerCache::new(setup.cache),
        blocks: FxHashMap::default(),
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
pub fn replay(requests: &[Request], config: ReplayConfig) -> Result<Replay, TooManyBlocks> {
    let setup = ReplaySetup {
        granularity_nanos: config.granularity_nanos,
        offset_nanos: config.offset_nanos,
        cache: config.cache,
        block_bytes: config.block_bytes,
        convention: config.convention,
    };
    let census = Census::of(requests, config.block_bytes, MAX_BLOCKS_DEFAULT)?;
    let [logging, split_stream, split_down_stream, checkpointing, cow, row] = replay_all(requests, setup, &census);
    Ok(match config.architecture {
        Architecture::Logging => logging,
        Architecture::SplitStream => split_stream,
        Architecture::SplitDownStream => split_down_stream,
        Architecture::Checkpointing => checkpointing,
        Architecture::Cow => cow,
        Architecture::Row => row,
    })
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
            convention: Convention::SteadyState,
        }
    }

    fn paper(config: ReplayConfig) -> ReplayConfig {
        ReplayConfig { convention: Convention::Paper, ..config }
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
            .map(|&architecture| replay(&trace, config(architecture, 0, 0)).unwrap().write_ios_per_write())
            .collect();
        assert_eq!(ios, vec![1.0, 2.0, 2.0, 3.0]);
    }

    #[test]
    fn a_granularity_window_absorbs_overwrites_in_the_cache() {
        // Block 1 written 5 times in window [0, 100), once in [100, 200).
        let trace = [write(1, 1), write(2, 1), write(3, 1), write(4, 1), write(5, 1), write(150, 1)];
        let logging = replay(&trace, config(Architecture::Logging, 100, 10)).unwrap();
        assert_eq!((logging.retained, logging.incurred, logging.history.writes), (2, 2, 2));
        // The flush at the end lets the last write go: it is evicted (c) too.
        assert_eq!((logging.evicted, logging.counted_writes), (1, 6));
        let checkpointing = replay(&trace, config(Architecture::Checkpointing, 100, 10)).unwrap();
        // Two versions reach the current store; each overwrites a retained one
        // (the state before the trace, then the first window's last write).
        assert_eq!((checkpointing.current.writes, checkpointing.current.reads_for_writes), (2, 2));
        assert_eq!(checkpointing.history.writes, 2);
        // The paper counts the five writes with a subsequent write: the
        // fifth is retained and incurred, the copy of the state before the
        // trace and the last write's I/Os are not counted.
        let logging = replay(&trace, paper(config(Architecture::Logging, 100, 10))).unwrap();
        assert_eq!((logging.counted_writes, logging.retained, logging.incurred, logging.evicted), (5, 1, 1, 0));
        let checkpointing = replay(&trace, paper(config(Architecture::Checkpointing, 100, 10))).unwrap();
        assert_eq!((checkpointing.current.writes, checkpointing.current.reads_for_writes), (1, 1));
        assert_eq!(checkpointing.history.writes, 1);
    }

    #[test]
    fn cow_copies_once_per_block_and_snapshot_and_row_merges() {
        let trace = [write(1, 1), write(2, 1), write(3, 2), write(150, 1)];
        let cow = replay(&trace, config(Architecture::Cow, 100, 0)).unwrap();
        assert_eq!((cow.history.writes, cow.current.reads_for_writes, cow.current.writes), (3, 3, 4));
        let cow = replay(&trace, paper(config(Architecture::Cow, 100, 0))).unwrap();
        // Only block 1's first window is copied from a write of the trace;
        // only the first write of block 1 has a subsequent one.
        assert_eq!((cow.history.writes, cow.current.reads_for_writes, cow.current.writes), (1, 1, 2));
        let row = replay(&trace, config(Architecture::Row, 100, 0)).unwrap();
        assert_eq!(row.history.writes, 4, "every write is redirected");
        // Merges at t=150 (blocks 1, 2) and at the end (block 1).
        assert_eq!(row.merge_ios, 6);
        assert_eq!(row.snapshots, 1);
    }
}
