//! Archiving and granularity (IBM §3.1): with a granularity `g`, only each
//! block's last write in a window of `g` is history, and the writes it
//! supersedes never reach the chunk store — archiving waits for a window to
//! close. Every write is archived when `g` is 0.

use std::sync::Arc;

use rewind_engine::{BlockSize, Durability, Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};

const SECOND: u64 = 1_000_000_000;

/// Writes block 0 ten times within one second, then once more two seconds
/// later, and archives; returns the chunks written and what the view at
/// the end of the first second shows.
fn archive_ten_writes(granularity_nanos: u64) -> (u64, Vec<u8>) {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let mut config = NodeConfig::default();
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = VolumeSpec {
        name: VolumeName::new("v").unwrap(),
        size_bytes: 1 << 20,
        block_size: BlockSize::new(4096).unwrap(),
        granularity_nanos,
        retention: Vec::new(),
        space_max_bytes: 0,
    };
    let volume = node.create_volume(spec, start).unwrap();
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
