//! A burst of writes has the disk (issue 13): while a volume is being
//! written, its destaging, archiving and checkpoints wait, each within a
//! budget, so the burst reaches the disk once at the journal's speed; the
//! second copies follow once the writes pause. Reads right after the burst
//! keep it waiting too, for a while.

use std::sync::Arc;

use rewind_engine::{BlockSize, Durability, Node, NodeConfig, Timestamp, Volume, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};

const MILLI: u64 = 1_000_000;
const BLOCK: usize = 4096;

fn write_blocks(volume: &Volume, at: impl Fn(u64) -> Timestamp, blocks: std::ops::Range<u64>) {
    for block in blocks {
        volume.write(at(block), block * BLOCK as u64, &[block as u8 + 1; BLOCK], Durability::Buffered).unwrap();
    }
    volume.flush().unwrap();
}

#[test]
fn background_work_waits_while_a_burst_lasts_and_within_its_budgets() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    // Destaging waits for 32 versions at most, archiving for 48 blocks,
    // checkpoints for 2 × 64 KiB of journal; without a burst, archiving
    // would start at 4 blocks and checkpoints at 64 KiB.
    config.volume.overlay_versions_max = 64;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 4 * BLOCK as u64;
    config.volume.archive_bytes_burst = 48 * BLOCK as u64;
    config.volume.checkpoint_journal_bytes = 64 << 10;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    let checkpoints_at_creation = volume.stats().unwrap().checkpoints;
    // Block n is written at millisecond n.
    let at = |millis: u64| start.saturating_add_nanos(1_000 * MILLI + millis * MILLI);
    let work = |millis: u64| {
        node.maintain(at(millis)).unwrap();
        node.maintain_history(at(millis)).unwrap();
        volume.stats().unwrap()
    };

    // 20 blocks (80 KiB of journal), then background work 80 ms later:
    // still the burst, and every budget has room.
    write_blocks(&volume, at, 0..20);
    let stats = work(100);
    assert_eq!(volume.io_stats().current.write_bytes, 0, "destaging waits: {stats:?}");
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (20, 0), "{stats:?}");
    assert_eq!(stats.checkpoints, checkpoints_at_creation, "the checkpoint waits: {stats:?}");

    // 30 more: 50 waiting is past every budget, so the work goes on
    // during the burst.
    write_blocks(&volume, |block| at(100 + block), 20..50);
    let stats = work(155);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (0, 50), "{stats:?}");
    assert!(stats.checkpoints > checkpoints_at_creation, "{stats:?}");

    // 5 more wait while the burst lasts and go once it has paused 250 ms.
    write_blocks(&volume, |block| at(200 + block), 50..55);
    let stats = work(260);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (5, 50), "{stats:?}");
    let stats = work(254 + 250);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (0, 55), "{stats:?}");

    let mut image = vec![0; 55 * BLOCK];
    volume.read(0, &mut image).unwrap();
    for (block, bytes) in image.chunks(BLOCK).enumerate() {
        assert!(bytes.iter().all(|&byte| byte == block as u8 + 1), "block {block} reads what was written");
    }
}

#[test]
fn reads_right_after_a_burst_keep_background_work_waiting_for_a_while() {
    let storage = SimStorage::new(SimConfig::default(), 6);
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.burst_reads_nanos = 2_000 * MILLI;
    config.volume.overlay_versions_max = 64;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 4 * BLOCK as u64;
    config.volume.archive_bytes_burst = 48 * BLOCK as u64;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    let at = |millis: u64| start.saturating_add_nanos(1_000 * MILLI + millis * MILLI);
    let work = |millis: u64| {
        node.maintain(at(millis)).unwrap();
        node.maintain_history(at(millis)).unwrap();
        volume.stats().unwrap()
    };
    let read = || {
        let mut block = vec![0; BLOCK];
        volume.read(0, &mut block).unwrap();
        assert!(block.iter().all(|&byte| byte == 1), "block 0 reads what was written");
    };

    // 10 blocks written by millisecond 10, then read every 200 ms: past the
    // burst of writes, the reads keep destaging and archiving waiting.
    write_blocks(&volume, at, 0..10);
    work(5);
    for millis in (200..=1_800).step_by(200) {
        read();
        let stats = work(millis);
        assert_eq!((stats.versions_pending_destage, stats.versions_archived), (10, 0), "at {millis} ms: {stats:?}");
    }
    // Reads stop: a quiet 250 ms later the work catches up.
    let stats = work(1_800 + 260);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (0, 10), "{stats:?}");

    // Reads that go on past `burst_reads_nanos` after the last write wait no longer.
    write_blocks(&volume, |block| at(3_000 + block), 10..20);
    for millis in (3_200..=4_800).step_by(200) {
        read();
        let stats = work(millis);
        assert_eq!(stats.versions_pending_destage, 10, "at {millis} ms: {stats:?}");
    }
    read();
    let stats = work(5_100);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (0, 20), "{stats:?}");
}

#[test]
fn random_writes_are_destaged_from_reads_of_the_journal_in_its_own_order() {
    // Blocks written in a scrambled order lie in the journal in that order:
    // read block by block, destaging them took one read each once they had
    // left memory (4 KiB reads from the disk: random writes at queue depth
    // 32 came in faster than they were destaged, and waited for room in
    // the overlay). 128 MiB, twice what the journal keeps in memory.
    const BLOCKS: u64 = 2048;
    const BIG: usize = 64 << 10;
    let storage = SimStorage::new(SimConfig::default(), 9);
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 0;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), BLOCKS * BIG as u64, BlockSize::new(BIG as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    // 389 is prime to 2048: every block once, neighbours far apart.
    let scrambled = |n: u64| n * 389 % BLOCKS;
    for n in 0..BLOCKS {
        let block = scrambled(n);
        let at = start.saturating_add_nanos((n + 1) * MILLI);
        volume.write(at, block * BIG as u64, &[block as u8 ^ 0x5a; BIG], Durability::Buffered).unwrap();
    }
    volume.flush().unwrap();
    let before = volume.io_stats();
    node.maintain(start.saturating_add_nanos(10_000 * MILLI)).unwrap();
    let after = volume.io_stats();
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 0);
    assert!(after.current.write_bytes - before.current.write_bytes >= BLOCKS * BIG as u64, "{after:?}");
    // At least the first 64 MiB come from the file: a megabyte at a time,
    // not a block.
    let (reads, read_bytes) =
        (after.journal.reads - before.journal.reads, after.journal.read_bytes - before.journal.read_bytes);
    assert!(read_bytes >= 64 << 20, "{read_bytes} bytes read: the test needs blocks that left memory");
    assert!(reads <= 2 * (read_bytes >> 20), "{reads} journal reads for {read_bytes} bytes");
    let mut image = vec![0; BIG];
    for block in 0..BLOCKS {
        volume.read(block * BIG as u64, &mut image).unwrap();
        assert!(image.iter().all(|&byte| byte == block as u8 ^ 0x5a), "block {block} reads what was written");
    }
}
