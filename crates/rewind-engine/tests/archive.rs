//! Archiving and granularity (IBM §3.1): with a granularity `g`, only each
//! block's last write in a window of `g` is history, and the writes it
//! supersedes never reach the chunk store — archiving waits for a window to
//! close. Every write is archived when `g` is 0.

use std::sync::Arc;

use rewind_engine::{
    BlockSize, Durability, Layout, LayoutRules, Node, NodeConfig, Timestamp, Volume, VolumeName, VolumeSpec,
};
use rewind_io::{SimConfig, SimStorage, Storage};
use rewind_types::BlockIndex;

const SECOND: u64 = 1_000_000_000;

/// A node whose archive passes run whenever asked, up to `archive_age_nanos`
/// before the time they run at, and on it a 1 MiB volume `v` created at
/// 1000 s with `granularity_nanos`: (node, volume, creation time).
fn archiving_node(archive_age_nanos: u64, granularity_nanos: u64) -> (Node, Arc<Volume>, Timestamp) {
    archiving_node_of(1 << 20, 4096, archive_age_nanos, granularity_nanos)
}

fn archiving_node_of(
    size_bytes: u64,
    block_bytes: u32,
    archive_age_nanos: u64,
    granularity_nanos: u64,
) -> (Node, Arc<Volume>, Timestamp) {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let mut config = NodeConfig::default();
    config.volume.archive_age_nanos = archive_age_nanos;
    config.volume.archive_interval_nanos = 1;
    // Archiving right after the last write, not once writes pause.
    config.volume.burst_quiet_nanos = 0;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = VolumeSpec {
        granularity_nanos,
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), size_bytes, BlockSize::new(block_bytes).unwrap())
    };
    let volume = node.create_volume(spec, start).unwrap();
    (node, volume, start)
}

/// Writes block 0 ten times within one second, then once more two seconds
/// later, and archives; returns the chunks written and what the view at
/// the end of the first second shows.
fn archive_ten_writes(granularity_nanos: u64) -> (u64, Vec<u8>) {
    let (node, volume, start) = archiving_node(0, granularity_nanos);
    for write in 1..=10u8 {
        let at = start.saturating_add_nanos(SECOND + u64::from(write) * 1_000);
        volume.write(at, 0, &[write; 4096], Durability::Buffered).unwrap();
    }
    let later = start.saturating_add_nanos(3 * SECOND);
    volume.write(later, 0, &[11; 4096], Durability::Fua).unwrap();
    node.maintain(later).unwrap();
    node.maintain_history(later.saturating_add_nanos(1)).unwrap();
    let stats = volume.stats().unwrap();
    assert!(stats.archived_before > start.saturating_add_nanos(2 * SECOND), "{stats:?}");
    let mut block = vec![0; 4096];
    let window_end = start.saturating_add_nanos(2 * SECOND - 1);
    volume.view(window_end).unwrap().read(0, &mut block).unwrap();
    (node.chunk_stats().chunks_written, block)
}

#[test]
fn superseded_writes_in_a_window_never_reach_the_chunk_store() {
    let (chunks, block) = archive_ten_writes(SECOND);
    assert_eq!(chunks, 1, "only the first window's last write: the last write's window is still open");
    assert_eq!(block, vec![10; 4096]);
}

#[test]
fn every_write_is_archived_without_a_granularity() {
    let (chunks, block) = archive_ten_writes(0);
    assert_eq!(chunks, 11, "the ten and the one after");
    assert_eq!(block, vec![10; 4096]);
}

/// An archive pass stops only at a point whose state the volume keeps: a
/// node rebuilt from its bucket takes the newest archived version of each
/// block for the state just before `archived_before`. Here history from 1.5 s
/// to 2.5 s is deleted, which keeps each block's last version in the range
/// only: block 0's at 1.8 s goes (the one at 2.4 s stays), block 1's at 2.1 s
/// stays. An archive up to 2.2 s would file block 0 as it was at 1 s beside
/// block 1 as it was at 2.1 s, a state the volume was never in.
#[test]
fn archiving_stops_only_where_the_state_is_kept() {
    // Maintained at 3.5 s, archiving would go up to 2.2 s.
    let (node, volume, start) = archiving_node(1_300_000_000, 0);
    let at = |millis: u64| start.saturating_add_nanos(millis * 1_000_000);
    for (millis, offset, byte) in [(1_000, 0, 1), (1_800, 0, 2), (2_100, 4096, 9), (2_400, 0, 4), (3_000, 0, 3)] {
        volume.write(at(millis), offset, &[byte; 4096], Durability::Fua).unwrap();
    }
    volume.delete_history(at(1_500), at(2_500), at(3_000)).unwrap();
    node.maintain(at(3_500)).unwrap();
    node.maintain_history(at(3_500)).unwrap();
    let archived_before = volume.stats().unwrap().archived_before;
    assert!(archived_before > at(1_000), "block 0's first version is archived: {archived_before:?}");
    let last = Timestamp::from_unix_nanos(archived_before.unix_nanos() - 1);
    assert_eq!(volume.exact_time(last).ok(), Some(last), "archived up to {archived_before:?}");
    let mut block = vec![0; 8192];
    volume.view(last).unwrap().read(0, &mut block).unwrap();
    assert_eq!((block[0], block[4096]), (1, 0), "the state before the deleted range");
}

/// The two background threads of a server (quick maintenance and the slow
/// work on history), a writer and a reader of views, all at once on small
/// journal segments: archiving, checkpoints and reclaiming race each other,
/// and every result must still be right. In every layout, with bookmarks
/// made meanwhile (ROW merges at each).
#[test]
fn background_work_runs_concurrently_with_writes_and_views() {
    for layout in Layout::ALL {
        println!("layout {}", layout.name());
        concurrently(layout);
    }
}

fn concurrently(layout: Layout) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::thread;

    let storage = SimStorage::new(SimConfig::default(), 2);
    let mut config = NodeConfig::default();
    config.volume.journal.segment_bytes_max = 64 << 10;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    config.volume.checkpoint_interval_nanos = 1;
    config.collect_interval_nanos = 1;
    // The writer never pauses: background work must not wait for it to.
    config.volume.burst_quiet_nanos = 0;
    let node = Arc::new(Node::open(Arc::new(storage), config).unwrap());
    let clock = Arc::new(AtomicU64::new(1_000 * SECOND));
    let now = {
        let clock = Arc::clone(&clock);
        move || Timestamp::from_unix_nanos(clock.fetch_add(1_000, Ordering::Relaxed))
    };
    let spec = VolumeSpec {
        layout,
        // 8 dirty pages.
        cache_bytes: if LayoutRules::of(layout).has_controller_cache() { 280 * 4096 } else { 0 },
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 64 * 4096, BlockSize::new(4096).unwrap())
    };
    let volume = node.create_volume(spec, now()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let background = |work: fn(&Node, Timestamp) -> Result<bool, rewind_engine::EngineError>| {
        let (node, stop, now) = (Arc::clone(&node), Arc::clone(&stop), now.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                work(&node, now()).unwrap();
            }
        })
    };
    let maintenance = background(Node::maintain);
    let history = background(Node::maintain_history);
    // Writes of 1–4 blocks, each block stamped with the write's number.
    let mut written = Vec::new();
    for write in 0..3_000u32 {
        let block = u64::from(write * 7 % 61);
        let blocks = 1 + write as usize % 4;
        let data: Vec<u8> = (0..blocks * 4096).map(|at| (write as usize + at / 4096) as u8).collect();
        volume.write(now(), block * 4096, &data, Durability::Buffered).unwrap();
        if write % 100 == 0 {
            volume.flush().unwrap();
            written.push((volume.timestamp_last(), {
                let mut image = vec![0; 64 * 4096];
                volume.read(0, &mut image).unwrap();
                image
            }));
            // An earlier time, read through a view while the background runs.
            let (at, image) = &written[write as usize / 100 / 2];
            let mut view = vec![0; 64 * 4096];
            volume.view(*at).unwrap().read(0, &mut view).unwrap();
            assert!(&view == image, "{}: the view at write {write}'s earlier point differs", layout.name());
            volume.stats().unwrap();
            // A bookmark: for ROW a merge, on this thread, while maintenance merges too.
            let name = rewind_engine::BookmarkName::new(&format!("b{write}")).unwrap();
            volume.create_bookmark(name, None, now()).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    maintenance.join().unwrap();
    history.join().unwrap();
    let stats = volume.stats().unwrap();
    // Layouts that file history as it leaves the overlay archive nothing.
    let archived = stats.versions_archived > 0 || LayoutRules::of(layout).history_at_destage();
    assert!(archived && stats.journal_bytes_reclaimed > 0, "{}: {stats:?}", layout.name());
}

/// A view of a time retention dropped, with a bookmark before it, is
/// refused naming the bookmark (naming it once locked the bookmarks twice:
/// the view never returned, and every later bookmark waited forever).
#[test]
fn an_expired_view_names_the_bookmark_before_it_and_returns() {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let mut config = NodeConfig::default();
    config.volume.retention_interval_nanos = 1;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = VolumeSpec {
        retention: vec![rewind_engine::RetentionTier { interval_nanos: 0, age_nanos: 10 * SECOND }],
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
    };
    let volume = node.create_volume(spec, start).unwrap();
    volume.write(start.saturating_add_nanos(SECOND), 0, &[1; 4096], Durability::Fua).unwrap();
    let name = rewind_engine::BookmarkName::new("kept").unwrap();
    volume.create_bookmark(name, None, start.saturating_add_nanos(2 * SECOND)).unwrap();
    volume.write(start.saturating_add_nanos(3 * SECOND), 0, &[2; 4096], Durability::Fua).unwrap();
    let later = start.saturating_add_nanos(60 * SECOND);
    volume.write(later, 0, &[3; 4096], Durability::Fua).unwrap();
    node.maintain_history(later.saturating_add_nanos(1)).unwrap();
    let Err(error) = volume.view(start.saturating_add_nanos(4 * SECOND)) else { panic!("retention dropped that time") };
    assert!(error.to_string().contains("(bookmark kept)"), "{error}");
    volume.create_bookmark(rewind_engine::BookmarkName::new("after").unwrap(), None, later).unwrap();
}

/// A node's settings for archive passes that run whenever asked and take
/// everything written before the time they run at.
fn archiving_at_once() -> NodeConfig {
    let mut config = NodeConfig::default();
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    config
}

/// Writes blocks 0..8 of volume `v` from `at` on, block b holding `fill(b)`,
/// and archives them a second later.
fn write_eight_and_archive(node: &Node, at: Timestamp, fill: impl Fn(u64) -> u8) {
    let volume = node.volume("v").unwrap();
    for block in 0..8u64 {
        volume.write(at.saturating_add_nanos(block), block * 4096, &[fill(block); 4096], Durability::Fua).unwrap();
    }
    node.maintain(at.saturating_add_nanos(SECOND)).unwrap();
    node.maintain_history(at.saturating_add_nanos(SECOND)).unwrap();
}

/// A clean shutdown saves the chunk store's reference counts and the next
/// start takes them back instead of reading every run to count them; after
/// a crash they are counted again, whatever was saved before.
#[test]
fn reference_counts_survive_a_clean_shutdown_and_never_a_crash() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let config = archiving_at_once();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let at = |second: u64| start.saturating_add_nanos(second * SECOND);
    let write_and_archive =
        |node: &Node, second: u64| write_eight_and_archive(node, at(second), |block| (second * 16 + block + 1) as u8);
    let counted = |stats: rewind_engine::ChunkStats| (stats.chunks_live, stats.chunks_dead, stats.references);

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    node.create_volume(spec, start).unwrap();
    write_and_archive(&node, 1);
    write_and_archive(&node, 2);
    let before = counted(node.chunk_stats());
    assert_eq!(before.2, 16, "two archived versions of eight blocks");
    node.shut_down(at(3)).unwrap();
    drop(node);

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    assert!(node.chunk_stats().counts_restored, "the clean shutdown's counts are taken back");
    assert_eq!(counted(node.chunk_stats()), before);
    let mut block = vec![0; 4096];
    node.volume("v").unwrap().view(at(1).saturating_add_nanos(10)).unwrap().read(3 * 4096, &mut block).unwrap();
    assert_eq!(block, vec![16 + 3 + 1; 4096], "archived history reads back");
    write_and_archive(&node, 4);
    let after = counted(node.chunk_stats());
    assert_eq!(after.2, 24);
    drop(node);
    storage.crash();

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    assert!(!node.chunk_stats().counts_restored, "after a crash the counts are counted");
    assert_eq!(counted(node.chunk_stats()), after);
}

/// A node whose maintenance archives, and applies retention and space
/// caps, at every pass.
fn space_capping_node() -> Node {
    let mut config = NodeConfig::default();
    (config.volume.archive_age_nanos, config.volume.archive_interval_nanos) = (0, 1);
    config.volume.retention_interval_nanos = 1;
    config.volume.burst_quiet_nanos = 0;
    Node::open(Arc::new(SimStorage::new(SimConfig::default(), 1)), config).unwrap()
}

/// `bytes` of data like no other (a linear congruential stream from `state`).
fn unlike(state: &mut u64, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|_| {
            *state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (*state >> 56) as u8
        })
        .collect()
}

/// A space cap moves the horizon a whole minute of the timeline at a time.
/// When the minute it stopped at last pass did not free enough (a bookmark
/// keeps most of it), the next pass goes on into the following minutes: it
/// used to count that minute again, stop at its end once more, and keep
/// the history over the cap for good.
#[test]
fn a_space_cap_goes_on_past_a_minute_it_has_already_dropped() {
    let node = space_capping_node();
    // Minute 16 of the timeline is 960 s to 1020 s, minute 17 to 1080 s.
    let second = |seconds: u64| Timestamp::from_unix_nanos(seconds * SECOND);
    let blocks = 32usize;
    let generation_bytes = (blocks * 4096) as u64;
    let spec = VolumeSpec {
        space_max_bytes: generation_bytes * 5 / 2,
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
    };
    let volume = node.create_volume(spec, second(1_000)).unwrap();
    // Four generations of the same blocks, nothing alike: two in minute 16
    // (the first bookmarked), two in minute 17.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut first = Vec::new();
    for (generation, at) in [(0, 1_005), (1, 1_010), (2, 1_025), (3, 1_030)] {
        let data = unlike(&mut state, blocks * 4096);
        volume.write(second(at), 0, &data, Durability::Fua).unwrap();
        if generation == 0 {
            first = data[..4096].to_vec();
            let name = rewind_engine::BookmarkName::new("first").unwrap();
            volume.create_bookmark(name, None, second(at + 1)).unwrap();
        }
    }
    for pass in 0..6 {
        let now = second(1_040 + pass);
        node.maintain(now).unwrap();
        node.maintain_history(now).unwrap();
    }
    let used = volume.measure_space(second(1_050)).unwrap().chunk_stored_bytes;
    let horizon = volume.retention_horizon().expect("the cap moved the horizon");
    assert!(horizon >= second(1_025), "the cap stopped at {horizon:?}, {used} bytes kept");
    assert!(used <= generation_bytes * 5 / 2, "{used} bytes kept, over the cap");
    let mut block = vec![0; 4096];
    volume.view(second(1_006)).unwrap().read(0, &mut block).unwrap();
    assert!(block == first, "the bookmark stays");
    assert!(volume.view(second(1_012)).is_err(), "the second generation went");
}

/// Measuring a volume's space scans every archived index entry; a monitor
/// asking every few seconds must not pay that each time. A measurement is
/// kept while the history in the chunk store stays as it was, takes in
/// what archive passes add (deduplicated blocks included) without a scan,
/// and scans again after thinning drops archived versions. Each figure
/// equals a full scan's: the measurement of the node opened again.
#[test]
fn space_is_measured_again_only_where_history_in_the_chunk_store_changed() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let config = archiving_at_once();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let at = |second: u64| start.saturating_add_nanos(second * SECOND);
    // A measurement, and how many index reads it made.
    let measure = |volume: &Volume, second: u64| {
        let reads = volume.io_stats().index.reads;
        let space = volume.measure_space(at(second)).unwrap();
        let figures = (space.chunk_references, space.chunks, space.chunk_raw_bytes, space.chunk_stored_bytes);
        (figures, volume.io_stats().index.reads - reads)
    };
    let measured_afresh = |second: u64| {
        let node = Node::open(Arc::new(storage.clone()), config).unwrap();
        let (figures, reads) = measure(&node.volume("v").unwrap(), second);
        assert!(reads > 0, "a node opened again scans");
        figures
    };

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    write_eight_and_archive(&node, at(1), |block| block as u8 + 1);
    let (first, reads) = measure(&volume, 2);
    assert!(reads > 0, "the first measurement scans the index");
    assert_eq!((first.0, first.1, first.2), (8, 8, 8 * 4096), "eight archived blocks, all different");
    assert_eq!(measure(&volume, 3), (first, 0), "nothing changed: no scan");

    // Blocks 0..4 as before (deduplicated), 4..8 new.
    write_eight_and_archive(&node, at(4), |block| if block < 4 { block as u8 + 1 } else { block as u8 + 101 });
    let (second, reads) = measure(&volume, 6);
    assert_eq!(reads, 0, "an archive pass is taken in without a scan");
    assert_eq!((second.0, second.1, second.2), (16, 12, 12 * 4096), "sixteen references to twelve chunks");
    node.shut_down(at(7)).unwrap();
    drop((node, volume));
    assert_eq!(measured_afresh(8), second);

    // Both passes in a deleted range, whose last versions it keeps: thinning
    // drops the first pass's archived versions.
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let volume = node.volume("v").unwrap();
    measure(&volume, 9);
    volume.delete_history(at(1), at(6), at(10)).unwrap();
    node.maintain_history(at(11)).unwrap();
    let (thinned, reads) = measure(&volume, 12);
    assert!(reads > 0, "thinning has the measurement scan again");
    assert_eq!((thinned.0, thinned.1), (8, 8), "the second pass's versions alone count");
    node.shut_down(at(13)).unwrap();
    drop((node, volume));
    assert_eq!(measured_afresh(14), thinned);
}

/// One archive pass over a fill and a random overwrite of every block
/// stores the fill's versions together and the overwrite's together (each
/// block's first version in the pass, then its second), as two passes would
/// have: a view before the overwrite then reads its chunks in one sweep,
/// not every other record of the packs.
#[test]
fn a_view_before_an_overwrite_archived_in_the_same_pass_reads_only_its_own_chunks() {
    const BLOCKS: u64 = 64;
    let (node, volume, start) = archiving_node(0, 0);
    let block_bytes = |block: u64, round: u64| {
        // Distinct, incompressible: every version is a chunk of its own.
        let mut state = (block * 2 + round + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut bytes = vec![0u8; 4096];
        for byte in &mut bytes {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        bytes
    };
    let filled = start.saturating_add_nanos(SECOND);
    let fill: Vec<u8> = (0..BLOCKS).flat_map(|block| block_bytes(block, 0)).collect();
    volume.write(filled, 0, &fill, Durability::Fua).unwrap();
    // Overwritten in a scattered order (7 and 64 are coprime).
    for (nth, block) in (0..BLOCKS).map(|nth| (nth, nth * 7 % BLOCKS)) {
        let at = filled.saturating_add_nanos(SECOND + nth);
        volume.write(at, block * 4096, &block_bytes(block, 1), Durability::Fua).unwrap();
    }
    let later = filled.saturating_add_nanos(3 * SECOND);
    node.maintain(later).unwrap();
    node.maintain_history(later).unwrap();
    assert_eq!(volume.stats().unwrap().versions_archived, 2 * BLOCKS, "both in one pass");

    let read_bytes = node.chunk_io_stats().read_bytes;
    let mut view = vec![0u8; fill.len()];
    volume.view(filled).unwrap().read(0, &mut view).unwrap();
    assert!(view == fill, "the view reads the fill");
    let read = node.chunk_io_stats().read_bytes - read_bytes;
    // The records' headers and footers on top of the blocks, not the
    // overwrite's records between them.
    assert!(read < BLOCKS * 4096 * 5 / 4, "{read} bytes read for {} bytes of view", BLOCKS * 4096);
}

/// A node told it is stopping gives up an archive pass at its next part
/// rather than keeping the stop waiting for it (a pass over what a burst
/// left takes minutes): the pass archives nothing, reports no failure, and
/// the next start archives those versions whole.
#[test]
fn a_stopping_node_gives_up_its_archive_pass_and_the_next_start_archives_it() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let config = archiving_at_once();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let at = |second: u64| start.saturating_add_nanos(second * SECOND);

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    node.create_volume(spec, start).unwrap();
    node.stop_passes();
    write_eight_and_archive(&node, at(1), |block| block as u8 + 1);
    let volume = node.volume("v").unwrap();
    let stats = volume.stats().unwrap();
    assert_eq!((stats.versions_archived, stats.archive_passes), (0, 0), "the pass gave up: {stats:?}");
    assert_eq!((stats.versions_in_runs, stats.archived_before), (8, Timestamp::from_unix_nanos(0)));
    assert_eq!(volume.fault(), None, "giving up is no failure");
    assert_eq!(node.chunk_stats().references, 0);
    node.shut_down(at(3)).unwrap();
    drop((volume, node));

    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    node.maintain_history(at(4)).unwrap();
    let volume = node.volume("v").unwrap();
    assert_eq!(volume.stats().unwrap().versions_archived, 8, "the next start archives them");
    assert_eq!(node.chunk_stats().references, 8);
    let mut block = vec![0; 4096];
    volume.view(at(2)).unwrap().read(5 * 4096, &mut block).unwrap();
    assert_eq!(block, vec![6; 4096], "archived history reads back");
}

/// Under a granularity longer than the timeline's minutes, a space cap
/// moves the horizon to the end of the window holding the point it wants
/// once that window is complete. It rounded down to the window before, so
/// while the point it wanted lay in the first window the horizon never
/// moved, and the history stayed over the cap for good.
#[test]
fn a_space_cap_under_a_coarse_granularity_moves_the_horizon() {
    let node = space_capping_node();
    let second = |seconds: u64| Timestamp::from_unix_nanos(seconds * SECOND);
    let blocks = 32usize;
    let generation_bytes = (blocks * 4096) as u64;
    // Windows of 10 minutes: 600 s to 1200 s, 1200 s to 1800 s.
    let spec = VolumeSpec {
        space_max_bytes: generation_bytes * 3 / 2,
        granularity_nanos: 600 * SECOND,
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
    };
    let volume = node.create_volume(spec, second(1_000)).unwrap();
    // Four generations of the same blocks, nothing alike, two per window:
    // each window keeps its last.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut last = Vec::new();
    for at in [1_005, 1_010, 1_205, 1_210] {
        let data = unlike(&mut state, blocks * 4096);
        volume.write(second(at), 0, &data, Durability::Fua).unwrap();
        last = data;
    }
    for pass in 0..6 {
        let now = second(1_810 + pass);
        // The clock past the second window: a write elsewhere, at the end.
        volume.write(now, 1 << 19, &[1; 4096], Durability::Fua).unwrap();
        node.maintain(now).unwrap();
        node.maintain_history(now).unwrap();
    }
    let used = volume.measure_space(second(1_820)).unwrap().chunk_stored_bytes;
    let horizon = volume.retention_horizon().expect("the cap moved the horizon");
    assert!(horizon >= second(1_210), "the cap stopped at {horizon:?}, {used} bytes kept");
    assert!(used <= generation_bytes * 3 / 2, "{used} bytes kept, over the cap");
    let mut image = vec![0; blocks * 4096];
    volume.read(0, &mut image).unwrap();
    assert!(image == last, "the present stays");
}

/// 4 KiB that do not compress, different for every block and round (up
/// to 3 rounds).
fn incompressible(block: u64, round: u64) -> Vec<u8> {
    rewind_chunks::conformance::noise(block * 3 + round + 1, 4096)
}

/// A view of a point that later passes rewrote half of finds its blocks in
/// two packs, every other record of one and a run of the other: read in
/// block order it reads half as much again as it returns. A defrag of it
/// copies its chunks into a pack in block order: the view then reads about
/// what it returns, the same bytes; a second defrag leaves them be; the
/// present and the view after the rewrite read as before.
/// Writes `rounds` rounds over the first `blocks` blocks (in each, the
/// blocks `written` picks, each with `contents(block, round)`), each round
/// archived in a pass of its own; returns the time of each round's last write.
fn write_archived_rounds(
    node: &Node,
    volume: &Volume,
    start: Timestamp,
    blocks: u64,
    rounds: u64,
    written: impl Fn(u64, u64) -> bool,
    contents: impl Fn(u64, u64) -> Vec<u8>,
) -> Vec<Timestamp> {
    let mut at = start;
    let mut ends = Vec::new();
    for round in 0..rounds {
        for block in (0..blocks).filter(|&block| written(block, round)) {
            at = at.saturating_add_nanos(1_000);
            let offset = volume.block_size().offset_of(BlockIndex(block));
            volume.write(at, offset, &contents(block, round), Durability::Fua).unwrap();
        }
        ends.push(at);
        at = at.saturating_add_nanos(SECOND);
        node.maintain(at).unwrap();
        node.maintain_history(at).unwrap();
    }
    ends
}

/// A view of a point after which every other block was written again
/// reads those blocks' history from the chunk store and the rest from the
/// current store: the chunk blocks of one read are asked for together, so
/// their neighbouring records share reads instead of one each.
#[test]
fn a_view_reads_its_chunk_blocks_between_current_ones_together() {
    const BLOCKS: u64 = 64;
    let (node, volume, start) = archiving_node(0, 0);
    let contents = |block: u64, round: u64| -> Vec<u8> {
        (0..4096u64).map(|at| (at.wrapping_mul(block * 2 + round + 1) >> 3) as u8 ^ block as u8).collect()
    };
    // Round 0 fills every block, round 1 rewrites the even ones.
    let ends =
        write_archived_rounds(&node, &volume, start, BLOCKS, 2, |block, round| round == 0 || block % 2 == 0, contents);
    let expected: Vec<u8> = (0..BLOCKS).flat_map(|block| contents(block, 0)).collect();
    let view = volume.view(ends[0]).unwrap();
    let mut bytes = vec![0u8; expected.len()];
    view.read(0, &mut bytes).unwrap();
    assert!(bytes == expected, "the view reads the fill");
    let before = node.chunk_io_stats().reads;
    view.read(0, &mut bytes).unwrap();
    let reads = node.chunk_io_stats().reads - before;
    assert!(bytes == expected, "the view reads the fill");
    // One read of the table slots and one of the records (with the odd
    // blocks' records between them read through), not two per even block.
    assert!(reads <= 2, "{reads} chunk store reads for {} chunk blocks among current ones", BLOCKS / 2);
}

#[test]
fn a_defrag_lays_out_the_history_a_view_reads_in_block_order() {
    const BLOCKS: u64 = 64;
    let (node, volume, start) = archiving_node(0, 0);
    let contents = incompressible;
    // Round 0 fills every block, round 1 rewrites the odd ones, round 2
    // every block again.
    let ends =
        write_archived_rounds(&node, &volume, start, BLOCKS, 3, |block, round| round != 1 || block % 2 == 1, contents);
    assert_eq!(volume.stats().unwrap().versions_archived, 5 * BLOCKS / 2, "every version archived");
    let expected: Vec<u8> = (0..BLOCKS).flat_map(|block| contents(block, if block % 2 == 1 { 1 } else { 0 })).collect();
    let view = volume.view(ends[1]).unwrap();
    let read_view = || {
        let mut bytes = vec![0u8; expected.len()];
        view.read(0, &mut bytes).unwrap();
        assert!(bytes == expected, "the view reads the state after round 1");
        let before = node.chunk_io_stats().read_bytes;
        view.read(0, &mut bytes).unwrap();
        assert!(bytes == expected, "the view reads the state after round 1");
        node.chunk_io_stats().read_bytes - before
    };
    let view_bytes = BLOCKS * 4096;
    let scattered = read_view();
    assert!(scattered > view_bytes * 7 / 5, "{scattered} bytes read for {view_bytes} before the defrag");

    let mut progress = Vec::new();
    let report = view.defrag(&mut |done, total| progress.push((done, total))).unwrap();
    // The volume's 256 blocks, of which the first 64 were ever written.
    assert_eq!(progress.last(), Some(&(256, 256)), "progress ends at the volume's end");
    assert_eq!((report.blocks_archived, report.chunks, report.runs_before), (BLOCKS, BLOCKS, BLOCKS));
    assert_eq!((report.chunks_moved, report.chunks_damaged), (BLOCKS, 0));
    let laid_out = read_view();
    assert!(laid_out < view_bytes * 21 / 20, "{laid_out} bytes read for {view_bytes} after the defrag");

    let again = view.defrag(&mut |_, _| {}).unwrap();
    assert_eq!((again.runs_before, again.chunks_moved), (1, 0), "laid out already");
    let mut present = vec![0u8; expected.len()];
    volume.read(0, &mut present).unwrap();
    assert!(present == (0..BLOCKS).flat_map(|block| contents(block, 2)).collect::<Vec<u8>>(), "the present");
    volume.view(ends[0]).unwrap().read(0, &mut present).unwrap();
    assert!(present == (0..BLOCKS).flat_map(|block| contents(block, 0)).collect::<Vec<u8>>(), "the fill");
}

/// A defrag plans 8192 blocks at a time, and passes over those the volume
/// never wrote: of a volume of eight such pieces written in the first and
/// in the middle of the sixth, it plans those two, lays out all the
/// history the view reads, and reports the six others skipped. (Blocks of
/// 512 bytes keep the simulated volume at 32 MiB: with 4 KiB blocks its
/// 256 MiB starved the test of background work beside it.)
#[test]
fn a_defrag_passes_over_the_pieces_a_volume_never_wrote() {
    const PIECE: u64 = 8192;
    const BLOCK: usize = 512;
    let incompressible = |block: u64, round: u64| rewind_chunks::conformance::noise(block * 3 + round + 1, BLOCK);
    let (node, volume, start) = archiving_node_of(8 * PIECE * BLOCK as u64, BLOCK as u32, 0, 0);
    let far = 5 * PIECE + 100;
    let written_blocks = |block: u64| block < 16 || (far..far + 16).contains(&block);
    // Round 0 writes those blocks, round 1 the odd ones again.
    let ends = write_archived_rounds(
        &node,
        &volume,
        start,
        far + 16,
        2,
        |block, round| written_blocks(block) && (round == 0 || block % 2 == 1),
        incompressible,
    );
    let view = volume.view(ends[0]).unwrap();
    let mut progress = Vec::new();
    let report = view.defrag(&mut |done, total| progress.push((done, total))).unwrap();
    assert_eq!(report.blocks_skipped, 6 * PIECE, "pieces 1-4, 6 and 7 were never written");
    assert_eq!((report.blocks_archived, report.chunks_damaged), (32, 0), "every written block's fill is history");
    assert_eq!(progress.last(), Some(&(8 * PIECE, 8 * PIECE)), "progress ends at the volume's end");
    for block in (0..16).chain(far..far + 16) {
        let mut bytes = vec![0u8; BLOCK];
        view.read(block * BLOCK as u64, &mut bytes).unwrap();
        assert!(bytes == incompressible(block, 0), "block {block} reads its fill");
    }
}

/// A bookmark's history is laid out in block order in the background once
/// it is archived, while the volume is neither written nor read — the
/// blocks the bookmark reads from the current store too, since a view
/// reads their archived versions once they are written again.
#[test]
fn a_bookmark_is_laid_out_in_the_background_once_archived() {
    const BLOCKS: u64 = 64;
    let (storage, config, node, volume, start) = layout_node();
    let contents = incompressible;
    // Round 0 fills every block, round 1 rewrites the odd ones: the state
    // after it lies in two passes' packs, every other record of each.
    let ends =
        write_archived_rounds(&node, &volume, start, BLOCKS, 2, |block, round| round == 0 || block % 2 == 1, contents);
    let mut now = ends[1].saturating_add_nanos(2 * SECOND);
    volume.create_bookmark(rewind_engine::BookmarkName::new("before").unwrap(), Some(ends[1]), now).unwrap();
    let stats = volume.stats().unwrap();
    assert_eq!((stats.bookmarks_awaiting_layout, stats.layout_bytes_written), (1, 0), "{stats:?}");

    // Written a moment ago: the layout waits.
    volume.write(now, BLOCKS * 4096, &[7; 4096], Durability::Fua).unwrap();
    now = now.saturating_add_nanos(LAYOUT_QUIET / 2);
    node.maintain_history(now).unwrap();
    let stats = volume.stats().unwrap();
    assert_eq!((stats.bookmarks_awaiting_layout, stats.layout_bytes_written), (1, 0), "{stats:?}");

    // Quiet: laid out, every block's chunk, though each reads from the current store now.
    now = now.saturating_add_nanos(LAYOUT_QUIET);
    node.maintain_history(now).unwrap();
    let stats = volume.stats().unwrap();
    assert_eq!(stats.bookmarks_awaiting_layout, 0, "{stats:?}");
    assert!(stats.layout_bytes_written >= BLOCKS * 4096, "{stats:?}");
    node.maintain_history(now.saturating_add_nanos(SECOND)).unwrap();
    assert_eq!(volume.stats().unwrap().layout_bytes_written, stats.layout_bytes_written, "laid out once");

    // Round 2 rewrites every block: the view now reads them all from the
    // chunk store, in one sweep of the laid-out records.
    write_archived_rounds(&node, &volume, now.saturating_add_nanos(SECOND), BLOCKS, 1, |_, _| true, contents);
    let expected: Vec<u8> = (0..BLOCKS).flat_map(|block| contents(block, block % 2)).collect();
    let view = volume.view(ends[1]).unwrap();
    let mut bytes = vec![0u8; expected.len()];
    view.read(0, &mut bytes).unwrap();
    assert!(bytes == expected, "the view reads the state after round 1");
    // Read again, as the table's slots are then known.
    let before = node.chunk_io_stats().read_bytes;
    view.read(0, &mut bytes).unwrap();
    let read = node.chunk_io_stats().read_bytes - before;
    assert!(bytes == expected, "the view reads the state after round 1");
    let view_bytes = BLOCKS * 4096;
    assert!(read < view_bytes * 21 / 20, "{read} bytes read for {view_bytes}: not laid out");

    // Saved with the bookmarks: a restart does not plan it again.
    drop((view, volume));
    drop(node);
    let node = Node::open(Arc::new(storage), config).unwrap();
    let volume = node.volume("v").unwrap();
    assert_eq!(volume.stats().unwrap().bookmarks_awaiting_layout, 0, "laid out before the restart");
}

/// The quiet spell after which `layout_node`'s volume is laid out.
const LAYOUT_QUIET: u64 = SECOND / 10;

/// A node that archives at once, and lays out bookmarks once its volume
/// `v` (1 MiB, created at 1000 s) is quiet for `LAYOUT_QUIET`: (storage,
/// config, node, volume, creation time).
fn layout_node() -> (SimStorage, NodeConfig, Node, Arc<Volume>, Timestamp) {
    let mut config = archiving_at_once();
    config.volume.burst_quiet_nanos = LAYOUT_QUIET;
    // Archiving does not wait for bursts here: only the layout does.
    config.volume.burst_archive_wait_nanos = 0;
    let storage = SimStorage::new(SimConfig::default(), 1);
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    (storage, config, node, volume, start)
}

/// Damage met while laying out a bookmark leaves it as archived, with a
/// warning, instead of failing the volume's history work at every pass;
/// the view reports the damage where it reads it.
#[test]
fn damage_met_laying_out_a_bookmark_fails_no_pass() {
    let (storage, _, node, volume, start) = layout_node();
    for block in 0..8u64 {
        volume
            .write(start.saturating_add_nanos(block), block * 4096, &[block as u8 + 1; 4096], Durability::Fua)
            .unwrap();
    }
    let mut now = start.saturating_add_nanos(SECOND);
    node.maintain(now).unwrap();
    volume.create_bookmark(rewind_engine::BookmarkName::new("b").unwrap(), None, now).unwrap();
    // Written a moment before the pass: archived, not laid out yet.
    now = now.saturating_add_nanos(SECOND);
    volume.write(now, 9 * 4096, &[9; 4096], Durability::Fua).unwrap();
    node.maintain_history(now.saturating_add_nanos(LAYOUT_QUIET / 2)).unwrap();
    assert_eq!(volume.stats().unwrap().bookmarks_awaiting_layout, 1, "archived, not yet laid out");
    // Block 5's entry in the current store's metadata.
    storage.corrupt("volumes/v/current.meta", 5 * 16 + 2, 0x20).unwrap();
    for _ in 0..2 {
        now = now.saturating_add_nanos(SECOND);
        node.maintain_history(now).expect("the pass goes on past the damage");
    }
    let stats = volume.stats().unwrap();
    assert_eq!((stats.bookmarks_awaiting_layout, stats.layout_bytes_written), (0, 0), "{stats:?}");
    let view = volume.view(volume.bookmarks()[0].timestamp).unwrap();
    let error = view.read(5 * 4096, &mut [0; 4096]).unwrap_err();
    assert!(error.is_corruption(), "{error}");
}

/// Garbage collection waits while a volume is written or read (its
/// repack takes the disk from them), for one more interval at most.
#[test]
fn collection_waits_for_writes_one_interval_at_most() {
    const INTERVAL: u64 = 10 * SECOND;
    let mut config = archiving_at_once();
    config.volume.burst_quiet_nanos = LAYOUT_QUIET;
    config.volume.burst_archive_wait_nanos = 0;
    config.volume.lay_out_bookmarks = false;
    config.collect_interval_nanos = INTERVAL;
    let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 3)), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    // Round 1 rewrites the odd blocks; a defrag of the state after it moves
    // its chunks, leaving their old records dead.
    let contents = |block: u64, round: u64| vec![(block * 7 + round * 3 + 1) as u8; 4096];
    let ends =
        write_archived_rounds(&node, &volume, start, 64, 2, |block, round| round == 0 || block % 2 == 1, contents);
    assert!(volume.view(ends[1]).unwrap().defrag(&mut |_, _| {}).unwrap().chunks_moved > 0);
    let collections = || node.chunk_stats().collections;
    let before = collections();

    // Due, but the volume was written a moment ago: it waits...
    let mut now = start.saturating_add_nanos(INTERVAL + 5 * SECOND);
    let write_then_maintain = |now: Timestamp| {
        volume.write(now, 100 * 4096, &[1; 4096], Durability::Fua).unwrap();
        node.maintain_history(now.saturating_add_nanos(LAYOUT_QUIET / 2)).unwrap();
    };
    write_then_maintain(now);
    assert_eq!(collections(), before, "collection waits for the writes");
    // ...until the volume is quiet.
    node.maintain_history(now.saturating_add_nanos(2 * LAYOUT_QUIET)).unwrap();
    assert_eq!(collections(), before + 1, "collected once quiet");

    // Written without pause: it waits one more interval, no longer.
    assert!(volume.view(ends[0]).unwrap().defrag(&mut |_, _| {}).unwrap().chunks_moved > 0, "more dead records");
    now = now.saturating_add_nanos(INTERVAL + SECOND);
    write_then_maintain(now);
    assert_eq!(collections(), before + 1, "waits while written");
    now = now.saturating_add_nanos(INTERVAL);
    write_then_maintain(now);
    assert_eq!(collections(), before + 2, "collected after two intervals, written or not");
}

/// History written in runs is archived where it lies in the journal: the
/// chunk store adopts a sealed segment, its new blocks that do not compress
/// staying there as bare chunks, and the journal then only lets its own
/// name go. Random 4 KiB writes and history that compresses are stored in
/// packs as before. Every view reads what was written, before and after a
/// crash, and after a collection. In every layout whose history comes from
/// the journal: by archive passes, or filed at destage (split-stream,
/// split-down-stream, where the segments are sealed by then).
#[test]
fn history_written_in_runs_is_archived_where_it_lies_in_the_journal() {
    for layout in [Layout::Journaled, Layout::Logging, Layout::Row, Layout::SplitStream, Layout::SplitDownStream] {
        println!("layout {}", layout.name());
        archived_where_it_lies(layout);
    }
}

fn archived_where_it_lies(layout: Layout) {
    const BLOCK: usize = 4096;
    const RUN: usize = 128 << 10;
    let storage = SimStorage::new(SimConfig::default(), 5);
    let mut config = archiving_at_once();
    config.volume.journal.segment_bytes_max = 1 << 20;
    config.volume.burst_quiet_nanos = 0;
    // A checkpoint at every pass, so that the journal reclaims what it no
    // longer needs.
    config.volume.checkpoint_interval_nanos = 1;
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec {
        layout,
        // Destaged (and filed) as the writes go on, in the layouts that
        // file at destage.
        cache_bytes: if LayoutRules::of(layout).has_controller_cache() { 1 << 20 } else { 0 },
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 8 << 20, BlockSize::new(BLOCK as u32).unwrap())
    };
    let volume = node.create_volume(spec, start).unwrap();
    // 4 MiB in runs of noise; 256 random 4 KiB overwrites of noise; 1 MiB
    // in runs that compress. Each phase's writes, and the state after it.
    let fill = rewind_chunks::conformance::noise(1, 4 << 20);
    let text: Vec<u8> = (0..RUN).map(|index| b"history that compresses "[index % 24]).collect();
    let phases: [Vec<(usize, Vec<u8>)>; 3] = [
        (0..fill.len() / RUN).map(|run| (run * RUN, fill[run * RUN..(run + 1) * RUN].to_vec())).collect(),
        (0..256)
            .map(|index| ((index * 7919 % 1024) * BLOCK, rewind_chunks::conformance::noise(100 + index as u64, BLOCK)))
            .collect(),
        (0..8).map(|run| ((4 << 20) + run * RUN, text.clone())).collect(),
    ];
    let mut model = vec![0u8; 8 << 20];
    let mut at = start;
    let mut states = Vec::new();
    for phase in phases {
        for (offset, bytes) in phase {
            at = at.saturating_add_nanos(1_000);
            volume.write(at, offset as u64, &bytes, Durability::Fua).unwrap();
            model[offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        states.push((at, model.clone()));
    }
    let later = at.saturating_add_nanos(SECOND);
    node.maintain(later).unwrap();
    node.maintain_history(later).unwrap();
    if !LayoutRules::of(layout).history_at_destage() {
        assert!(volume.stats().unwrap().archived_before > at, "everything is archived");
    }
    let stats = node.chunk_stats();
    println!("{stats:?}");
    // The last segment's are copied (a later one has not started), and so
    // are the overwrites and the text.
    assert!((512..=1024).contains(&stats.chunks_adopted), "of the 1024 blocks of noise in runs: {stats:?}");
    assert_eq!(stats.adopted_bytes, stats.chunks_adopted * BLOCK as u64);
    assert!(stats.chunks_written >= stats.chunks_adopted + 256, "the overwrites are stored: {stats:?}");
    let check = |volume: &Arc<Volume>, when: &str| {
        for (time, expected) in &states {
            let mut bytes = vec![0; expected.len()];
            volume.view(*time).unwrap().read(0, &mut bytes).unwrap();
            assert!(bytes == *expected, "{when}: the view at {time:?} reads what was written");
        }
    };
    check(&volume, "archived");
    // The journal reclaims what it no longer needs; a crash; a collection.
    node.maintain(later.saturating_add_nanos(SECOND)).unwrap();
    node.maintain_history(later.saturating_add_nanos(SECOND)).unwrap();
    // The adopted files are never reused: spares are written in their
    // place, the volume being quiet, for the next burst.
    let journal = storage.list_dir("volumes/v/journal").unwrap();
    let spares = journal.iter().filter(|name| name.starts_with("spare-")).count();
    println!("journal after reclaiming: {journal:?}");
    assert_eq!(volume.stats().unwrap().journal_spares_owed, 0, "written ahead at once");
    // Segments 1..=6 were let go, two or more adopted (512 or more chunks).
    assert_eq!(spares, 6, "one per segment reclaimed, reused or written ahead: {journal:?}");
    drop(volume);
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let volume = node.volume("v").unwrap();
    check(&volume, "after a crash");
    node.collect(&mut |_, _, _| {}).unwrap();
    check(&volume, "after a collection");
}
