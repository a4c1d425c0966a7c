//! What distinguishes the layouts, counted in device I/O per store:
//! Logging never has a current store and reads the present through the
//! map; ROW leaves the current store (the source) as of the last snapshot
//! and merges the redirected blocks at the next one — a window end or a
//! bookmark; COW copies a block out of the current store at its first
//! overwrite after a snapshot; Checkpointing does too, behind a controller
//! cache that keeps the most recently written blocks. All read exactly what
//! was written, before and after a restart.

use std::sync::Arc;

use rewind_engine::{
    BlockSize, BookmarkName, Durability, Layout, Node, NodeConfig, Timestamp, Volume, VolumeName, VolumeSpec,
};
use rewind_io::{SimConfig, SimStorage, Storage};

const SECOND: u64 = 1_000_000_000;

fn create(storage: &SimStorage, layout: Layout, granularity_nanos: u64, start: Timestamp) -> (Node, Arc<Volume>) {
    create_with_cache(storage, layout, granularity_nanos, start, 0)
}

fn create_with_cache(
    storage: &SimStorage,
    layout: Layout,
    granularity_nanos: u64,
    start: Timestamp,
    cache_bytes: u64,
) -> (Node, Arc<Volume>) {
    let mut config = NodeConfig::default();
    // The layouts' own rules, alone: background work does not wait for bursts.
    config.volume.burst_quiet_nanos = 0;
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let spec = VolumeSpec {
        granularity_nanos,
        layout,
        cache_bytes,
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
    };
    let volume = node.create_volume(spec, start).unwrap();
    (node, volume)
}

fn read(volume: &Volume, offset: u64) -> Vec<u8> {
    let mut block = vec![0; 4096];
    volume.read(offset, &mut block).unwrap();
    block
}

#[test]
fn logging_keeps_no_current_store_and_reads_the_present_through_the_map() {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let (node, volume) = create(&storage, Layout::Logging, 0, start);
    assert!(!storage.exists("volumes/v/current.img").unwrap(), "no current store");
    let first = start.saturating_add_nanos(SECOND);
    volume.write(first, 0, &[1; 8192], Durability::Fua).unwrap();
    volume.write(first.saturating_add_nanos(1), 4096, &[2; 4096], Durability::Fua).unwrap();
    node.maintain(start.saturating_add_nanos(60 * SECOND)).unwrap();
    node.checkpoint_all(start.saturating_add_nanos(61 * SECOND)).unwrap();
    assert_eq!(
        (read(&volume, 0), read(&volume, 4096), read(&volume, 8192)),
        (vec![1; 4096], vec![2; 4096], vec![0; 4096])
    );
    let io = volume.io_stats();
    assert_eq!((io.current.reads, io.current.writes), (0, 0), "{io:?}");
    assert!(io.journal.reads >= 2, "the present comes from the history: {io:?}");
    let mut view = vec![0; 4096];
    volume.view(first).unwrap().read(4096, &mut view).unwrap();
    assert_eq!(view, vec![1; 4096]);
    assert_eq!(volume.stats().unwrap().current_bytes, 0);

    drop((volume, node));
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.volume("v").unwrap();
    assert_eq!(volume.layout(), Layout::Logging);
    assert_eq!((read(&volume, 0), read(&volume, 4096)), (vec![1; 4096], vec![2; 4096]));
}

#[test]
fn row_merges_redirected_blocks_into_the_source_only_at_snapshots() {
    let storage = SimStorage::new(SimConfig::default(), 2);
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    // Snapshots every minute (the granularity's window ends).
    let (node, volume) = create(&storage, Layout::Row, 60 * SECOND, start);
    let written = start.saturating_add_nanos(SECOND);
    volume.write(written, 0, &[7; 4096], Durability::Fua).unwrap();
    node.maintain(start.saturating_add_nanos(10 * SECOND)).unwrap();
    let io = volume.io_stats();
    assert_eq!(io.current.writes, 0, "before the window ends the write stays redirected: {io:?}");
    assert_eq!(read(&volume, 0), vec![7; 4096], "read through the redirection");
    // From the history (the journal's batch, still in memory), not the source.
    let io = volume.io_stats();
    assert!(io.current.read_bytes < 4096, "{io:?}");

    node.maintain(start.saturating_add_nanos(61 * SECOND)).unwrap();
    let merged = volume.io_stats().current.writes;
    assert!(merged > 0, "the window's end merges the redirected block");
    let current_reads = volume.io_stats().current.reads;
    assert_eq!(read(&volume, 0), vec![7; 4096]);
    assert!(volume.io_stats().current.reads > current_reads, "now read from the source");

    // A bookmark is an on-demand snapshot: it merges at once.
    let again = start.saturating_add_nanos(62 * SECOND);
    volume.write(again, 4096, &[8; 4096], Durability::Buffered).unwrap();
    volume.create_bookmark(BookmarkName::new("snap").unwrap(), None, again.saturating_add_nanos(1)).unwrap();
    assert!(volume.io_stats().current.writes > merged, "the bookmark merged the new block");

    volume.write(start.saturating_add_nanos(63 * SECOND), 0, &[9; 4096], Durability::Fua).unwrap();
    drop((volume, node));
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.volume("v").unwrap();
    assert_eq!((read(&volume, 0), read(&volume, 4096)), (vec![9; 4096], vec![8; 4096]));
    let mut view = vec![0; 4096];
    volume.view(again.saturating_add_nanos(1)).unwrap().read(0, &mut view).unwrap();
    assert_eq!(view, vec![7; 4096], "the bookmarked snapshot");
}

#[test]
fn cow_copies_a_block_out_of_the_current_store_at_its_first_overwrite_after_a_snapshot() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    // Snapshots every minute.
    let (node, volume) = create(&storage, Layout::Cow, 60 * SECOND, start);
    let at = |seconds: u64| start.saturating_add_nanos(seconds * SECOND);
    volume.write(at(1), 0, &[1; 4096], Durability::Fua).unwrap();
    node.maintain(at(2)).unwrap();
    let before = volume.io_stats();
    assert!(before.current.writes > 0, "written in place");
    // Overwritten within the same window: nothing to keep, nothing copied.
    volume.write(at(3), 0, &[2; 4096], Durability::Fua).unwrap();
    node.maintain(at(4)).unwrap();
    assert_eq!(node.chunk_stats().chunks_written, 0);
    // (The destager looks at the block's metadata, but not at its data.)
    let data_read = |io: rewind_engine::VolumeIoStats| io.current.read_bytes - before.current.read_bytes;
    assert!(data_read(volume.io_stats()) < 4096, "no copy read");
    // The first overwrite after the window's end copies the snapshot's block out first.
    volume.write(at(61), 0, &[3; 4096], Durability::Fua).unwrap();
    node.maintain(at(62)).unwrap();
    assert_eq!(node.chunk_stats().chunks_written, 1);
    let io = volume.io_stats();
    assert!(data_read(io) >= 4096, "the copy read the old block in place: {io:?}");
    // Once more in the new window: no copy.
    volume.write(at(63), 0, &[4; 4096], Durability::Fua).unwrap();
    node.maintain(at(64)).unwrap();
    assert_eq!(node.chunk_stats().chunks_written, 1);
    assert_eq!(read(&volume, 0), vec![4; 4096]);
    let mut view = vec![0; 4096];
    volume.view(at(60)).unwrap().read(0, &mut view).unwrap();
    assert_eq!(view, vec![2; 4096], "the snapshot at the window's end");

    drop((volume, node));
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.volume("v").unwrap();
    volume.view(at(60)).unwrap().read(0, &mut view).unwrap();
    assert_eq!((read(&volume, 0), view), (vec![4; 4096], vec![2; 4096]));
}

#[test]
fn checkpointing_destages_the_least_recently_written_beyond_its_dirty_limit() {
    let storage = SimStorage::new(SimConfig::default(), 4);
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    // 100 pages of 4 KiB: 3 may be dirty.
    let (node, volume) = create_with_cache(&storage, Layout::Checkpointing, 60 * SECOND, start, 100 * 4096);
    let at = |millis: u64| start.saturating_add_nanos(SECOND + millis * 1_000_000);
    for block in 0..10u8 {
        volume.write(at(u64::from(block)), u64::from(block) * 4096, &[block + 1; 4096], Durability::Buffered).unwrap();
    }
    // Block 0 is hot: rewritten last, many times.
    for round in 0..20u8 {
        volume.write(at(100 + u64::from(round)), 0, &[round + 100; 4096], Durability::Buffered).unwrap();
    }
    volume.flush().unwrap();
    node.maintain(at(200)).unwrap();
    let io = volume.io_stats();
    // The seven least recently written blocks (1..=7) left; 8, 9 and hot 0 stay cached.
    assert_eq!(io.current.write_bytes, 7 * 4096 + 7 * 16, "{io:?}");
    assert_eq!(read(&volume, 0), vec![119; 4096], "the hot block from the cache");
    // A checkpoint flushes the cache; the view at creation still reads zeros.
    node.checkpoint_all(at(300)).unwrap();
    assert_eq!(volume.io_stats().current.write_bytes, 10 * 4096 + 10 * 16);
    assert_eq!(read(&volume, 9 * 4096), vec![10; 4096]);
    let mut view = vec![1; 4096];
    volume.view(start).unwrap().read(0, &mut view).unwrap();
    assert_eq!(view, vec![0; 4096]);
}

/// Block 0 written three times at every-write granularity, then a flush of
/// the cache: (chunks written, current store bytes written, current store
/// data bytes read).
fn three_versions_through_the_cache(layout: Layout) -> (u64, u64, u64) {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let (node, volume) = create_with_cache(&storage, layout, 0, start, 100 * 4096);
    for round in 1..=3u8 {
        let at = start.saturating_add_nanos(u64::from(round) * SECOND);
        volume.write(at, 0, &[round; 4096], Durability::Fua).unwrap();
    }
    node.maintain(start.saturating_add_nanos(10 * SECOND)).unwrap();
    assert_eq!(volume.io_stats().current.write_bytes, 0, "{}: the cache holds the block", layout.name());
    node.checkpoint_all(start.saturating_add_nanos(11 * SECOND)).unwrap();
    let io = volume.io_stats();
    for round in 1..=3u8 {
        let mut view = vec![0; 4096];
        volume.view(start.saturating_add_nanos(u64::from(round) * SECOND)).unwrap().read(0, &mut view).unwrap();
        assert_eq!(view, vec![round; 4096], "{}", layout.name());
    }
    (node.chunk_stats().chunks_written, io.current.write_bytes, io.current.read_bytes)
}

#[test]
fn split_stream_writes_the_newest_down_and_split_down_stream_every_version_let_go() {
    // Each version let go goes to history from the journal; nothing is read back.
    let meta = 16; // bytes of block metadata per block written
    assert_eq!(three_versions_through_the_cache(Layout::SplitStream), (3, 4096 + meta, 0));
    assert_eq!(three_versions_through_the_cache(Layout::SplitDownStream), (3, 3 * (4096 + meta), 0));
    // Checkpointing copies too: the two the cache supersedes, from the journal
    // (the creation's zeros in the current store are no version to copy).
    assert_eq!(three_versions_through_the_cache(Layout::Checkpointing), (2, 4096 + meta, 16));
}

/// A volume keeps its last measurement of the space its history takes and
/// adds to it what archive passes and history filed at destage bring (see
/// `space.rs`): in every layout that equals a full scan's figures, the
/// measurement of the node opened again.
#[test]
fn space_kept_between_measurements_equals_a_full_scan_in_every_layout() {
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let at = |second: u64| start.saturating_add_nanos(second * SECOND);
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 0;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    for layout in Layout::ALL {
        let storage = SimStorage::new(SimConfig::default(), 7);
        let node = Node::open(Arc::new(storage.clone()), config).unwrap();
        let spec = VolumeSpec {
            layout,
            ..VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap())
        };
        let volume = node.create_volume(spec, start).unwrap();
        let measure = |volume: &Volume, second: u64| {
            let space = volume.measure_space(at(second)).unwrap();
            (space.chunk_references, space.chunks, space.chunk_raw_bytes, space.chunk_stored_bytes)
        };
        // Blocks 0..8 three times; the third time blocks 0..4 as the first.
        for (round, second) in [1, 3, 5].into_iter().enumerate() {
            for block in 0..8u64 {
                let fill = if round == 2 && block < 4 { block } else { round as u64 * 16 + block };
                let at = at(second).saturating_add_nanos(block);
                volume.write(at, block * 4096, &[fill as u8 + 1; 4096], Durability::Fua).unwrap();
            }
            node.maintain(at(second + 1)).unwrap();
            node.checkpoint_all(at(second + 1)).unwrap();
            node.maintain_history(at(second + 1)).unwrap();
            measure(&volume, second + 1);
        }
        let kept = measure(&volume, 7);
        assert!(kept.0 >= 8, "{}: history in the chunk store: {kept:?}", layout.name());
        node.shut_down(at(8)).unwrap();
        drop((node, volume));
        let node = Node::open(Arc::new(storage.clone()), config).unwrap();
        assert_eq!(measure(&node.volume("v").unwrap(), 9), kept, "{}", layout.name());
    }
}
