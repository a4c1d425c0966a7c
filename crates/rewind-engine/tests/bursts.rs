//! A burst of writes has the disk (issue 13): while a volume is being
//! written, its destaging, archiving and checkpoints wait, each within a
//! budget, so the burst reaches the disk once at the journal's speed; the
//! second copies follow once the writes pause. Reads right after the burst
//! keep archiving waiting too (a pass under way pauses), for a while, and
//! in the journaled layout small ones keep destaging waiting as well.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rewind_engine::{
    BlockSize, Clock, Durability, Layout, Node, NodeConfig, Reserve, Timestamp, Volume, VolumeName, VolumeSpec,
};
use rewind_io::{SimConfig, SimStorage, Storage};

const MILLI: u64 = 1_000_000;
const BLOCK: usize = 4096;

fn write_blocks(volume: &Volume, at: impl Fn(u64) -> Timestamp, blocks: std::ops::Range<u64>) {
    for block in blocks {
        volume.write(at(block), block * BLOCK as u64, &[(block % 255) as u8 + 1; BLOCK], Durability::Buffered).unwrap();
    }
    volume.flush().unwrap();
}

#[test]
fn background_work_waits_while_a_burst_lasts_and_within_its_budgets() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 5));
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.burst_quiet_nanos = 250 * MILLI;
    // Destaging waits for 32 versions at most, archiving for the burst's
    // first second while the history waiting takes under half the free
    // space (`leave_free`); without a burst, archiving would start at 4
    // blocks. Checkpoints come every 64 KiB of journal, but in a burst
    // destage only the blocks not rewritten since the last one.
    config.volume.overlay_versions_max = 64;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 4 * BLOCK as u64;
    config.volume.burst_archive_wait_nanos = 1_000 * MILLI;
    config.volume.checkpoint_journal_bytes = 64 << 10;
    let node = Node::open(Arc::clone(&storage) as _, config).unwrap();
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
    let leave_free = |blocks: u64| storage.set_capacity(Some(storage.used_bytes() + blocks * BLOCK as u64));

    // 20 blocks (80 KiB of journal), then background work 80 ms later:
    // still the burst, and every budget has room (the history waiting
    // may take 48 blocks); the checkpoint leaves all 20, written since
    // the volume's creation.
    write_blocks(&volume, at, 0..20);
    leave_free(96);
    let stats = work(100);
    assert_eq!(volume.io_stats().current.write_bytes, 0, "destaging waits: {stats:?}");
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (20, 0), "{stats:?}");
    assert_eq!(stats.checkpoints, checkpoints_at_creation + 1, "cut at the creation: {stats:?}");

    // 30 more: 50 waiting is past every budget, so the work goes on
    // during the burst: the destager takes a slice of the 4 blocks written
    // least recently (a sixteenth of the limit), the checkpoint the other
    // 16 written before the one before it, and 30 wait, under half.
    write_blocks(&volume, |block| at(100 + block), 20..50);
    let stats = work(155);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (30, 50), "{stats:?}");
    assert_eq!(stats.checkpoints, checkpoints_at_creation + 2, "{stats:?}");

    // 5 more, 35 waiting: past half, a slice of 4 leaves during the burst;
    // the rest goes once it has paused 250 ms.
    write_blocks(&volume, |block| at(200 + block), 50..55);
    leave_free(96);
    let stats = work(260);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (31, 50), "{stats:?}");
    let stats = work(254 + 250);
    assert_eq!((stats.versions_pending_destage, stats.versions_archived), (0, 55), "{stats:?}");

    // A burst that does not pause keeps archiving waiting for its first
    // second only, however much room the disk has: a block every 100 ms
    // from 1 s on, archived once 4 blocks wait from 2 s on.
    leave_free(1 << 20);
    for block in 55..75 {
        let millis = 1_000 + (block - 55) * 100;
        write_blocks(&volume, |_| at(millis), block..block + 1);
        let archived = work(millis + 1).versions_archived;
        match millis < 2_000 {
            true => assert_eq!(archived, 55, "at {millis} ms, in the burst's first second"),
            false => assert!(archived + 4 > block + 1, "at {millis} ms: {archived} archived of {}", block + 1),
        }
    }

    let mut image = vec![0; 75 * BLOCK];
    volume.read(0, &mut image).unwrap();
    for (block, bytes) in image.chunks(BLOCK).enumerate() {
        assert!(bytes.iter().all(|&byte| byte == block as u8 + 1), "block {block} reads what was written");
    }
}

#[test]
fn a_checkpoint_in_a_burst_leaves_the_blocks_rewritten_since_the_last_and_a_crash_loses_none() {
    // Nothing not synced survives the crash.
    let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 9);
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.checkpoint_journal_bytes = 64 << 10;
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    let at = |millis: u64| start.saturating_add_nanos(1_000 * MILLI + millis * MILLI);
    let pattern = |round: u64, block: u64| [(round * 64 + block) as u8; BLOCK];
    // Writes `round` to `blocks` at `millis`, flushes, and runs maintenance.
    let write = |round: u64, millis: u64, blocks: Vec<u64>| {
        for block in blocks {
            volume.write(at(millis), block * BLOCK as u64, &pattern(round, block), Durability::Buffered).unwrap();
        }
        volume.flush().unwrap();
        node.maintain(at(millis + 1)).unwrap();
        (volume.stats().unwrap(), volume.io_stats().current.write_bytes / BLOCK as u64)
    };

    // Round 1 writes blocks 0..20 (80 KiB of journal): a checkpoint, cut
    // at the creation, leaves them all in the overlay.
    let checkpoints = volume.stats().unwrap().checkpoints;
    let (stats, destaged) = write(1, 10, (0..20).collect());
    assert_eq!((stats.checkpoints, stats.versions_pending_destage, destaged), (checkpoints + 1, 20, 0), "{stats:?}");
    // Round 2 rewrites 0..10 and writes 20..30: the next checkpoint, cut at
    // the first, destages 10..20 alone; the rest stays.
    let (stats, destaged) = write(2, 20, (0..10).chain(20..30).collect());
    assert_eq!((stats.checkpoints, stats.versions_pending_destage, destaged), (checkpoints + 2, 20, 10), "{stats:?}");
    // Power fails. Recovery replays from the first checkpoint's point.
    storage.crash();
    drop(node);
    let node = Node::open(Arc::new(storage.clone()), config).unwrap();
    let volume = node.volume("v").unwrap();
    let mut image = vec![0; 30 * BLOCK];
    volume.read(0, &mut image).unwrap();
    let view = volume.view(at(15)).unwrap();
    let mut before = vec![0; 20 * BLOCK];
    view.read(0, &mut before).unwrap();
    for block in 0..30 {
        let round = if (10..20).contains(&block) { 1 } else { 2 };
        let range = block as usize * BLOCK..(block as usize + 1) * BLOCK;
        assert!(image[range.clone()] == pattern(round, block), "block {block} reads round {round} after the crash");
        if block < 20 {
            assert!(before[range] == pattern(1, block), "block {block} reads round 1 at its time");
        }
    }
}

#[test]
fn a_writer_at_the_overlays_limit_destages_a_slice_of_the_least_recently_written_blocks() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 10));
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.overlay_versions_max = 64;
    let (_node, volume, at) = node_with_volume(&storage, config);

    // No maintenance: 64 blocks fill the overlay, and each block after
    // them finds it full and destages the one written least recently
    // (a 128th of the limit, at least one), not all 64.
    write_blocks(&volume, at, 0..80);
    let pending = volume.stats().unwrap().versions_pending_destage;
    let destaged = volume.io_stats().current.write_bytes / BLOCK as u64;
    assert_eq!(pending + destaged, 80, "every block pending or destaged once");
    assert!((60..=64).contains(&pending), "the overlay stays near its limit: {pending} pending");
    // What left is the least recently written: blocks 0 to `destaged`
    // are in the current store, the others not yet.
    let current = rewind_io::read_file(&*storage, "volumes/v/current.img").unwrap();
    for block in 0..80 {
        let bytes = &current[block as usize * BLOCK..(block as usize + 1) * BLOCK];
        let left = bytes.iter().all(|&byte| byte == (block % 255) as u8 + 1);
        assert_eq!(left, block < destaged, "block {block} in the current store: {left}");
    }

    let mut image = vec![0; 80 * BLOCK];
    volume.read(0, &mut image).unwrap();
    for (block, bytes) in image.chunks(BLOCK).enumerate() {
        assert!(bytes.iter().all(|&byte| byte == (block % 255) as u8 + 1), "block {block} reads what was written");
    }
}

/// The journal reaches the disk on a thread of its own
/// (`Node::write_out_journals`), woken by the writer that leaves a commit's
/// worth of bytes waiting, not by maintenance, which may be destaging for
/// seconds while writers fill the journal's buffer.
#[test]
fn the_journals_writer_writes_out_a_commits_worth_once_a_writer_leaves_it_waiting() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 11));
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.commit_bytes_soft = 16 * BLOCK as u64;
    let node = Node::open(Arc::clone(&storage) as _, config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    let signal = node.journal_signal();
    signal.wait(Duration::ZERO);
    let write = |block: u64| {
        volume.write(start, block * BLOCK as u64, &[7; BLOCK], Durability::Buffered).unwrap();
    };
    let journal = || volume.io_stats().journal;
    let before = journal();

    // 15 blocks wait: under a commit's worth, nothing is woken or written.
    (0..15).for_each(write);
    assert!(!signal.wait(Duration::ZERO), "no writer woke the journal's writer");
    assert!(!node.write_out_journals(start).unwrap());
    assert_eq!(journal().write_bytes, before.write_bytes, "nothing written out");
    // The 16th: its writer wakes it, and the 16 blocks reach the disk,
    // unsynced (a commit syncs).
    write(15);
    assert!(signal.wait(Duration::ZERO), "the writer that left a commit's worth woke the journal's writer");
    assert!(node.write_out_journals(start).unwrap());
    let after = journal();
    assert!(after.write_bytes >= before.write_bytes + 16 * BLOCK as u64, "{before:?} -> {after:?}");
    assert_eq!(after.syncs, before.syncs, "written out, not committed");
    assert!(!node.write_out_journals(start).unwrap(), "nothing left waiting");
}

/// The journal's writer also commits what has waited undurable for
/// `commit_interval_nanos`, the bound on what a power loss takes from writes
/// never flushed: maintenance, which did alone, may be destaging for seconds.
#[test]
fn the_journals_writer_commits_what_waited_undurable_for_a_commit_interval() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 12));
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.commit_interval_nanos = 50 * MILLI;
    let node = Node::open(Arc::clone(&storage) as _, config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let after = |millis: u64| Timestamp::from_unix_nanos(start.unix_nanos() + millis * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    let durable_before = volume.lsn_durable();
    for block in 0..3u64 {
        volume.write(start, block * BLOCK as u64, &[9; BLOCK], Durability::Buffered).unwrap();
    }
    let syncs = volume.io_stats().journal.syncs;

    assert!(!node.write_out_journals(start).unwrap(), "first seen undurable: not due");
    assert!(!node.write_out_journals(after(49)).unwrap(), "49 ms: not due");
    assert_eq!((volume.lsn_durable(), volume.io_stats().journal.syncs), (durable_before, syncs));
    assert!(node.write_out_journals(after(50)).unwrap(), "50 ms: committed");
    assert!(volume.lsn_durable() > durable_before, "the three writes are durable");
    assert_eq!(volume.io_stats().journal.syncs, syncs + 1);
    assert!(!node.write_out_journals(after(200)).unwrap(), "nothing left undurable");
}

#[test]
fn reads_right_after_a_burst_keep_archiving_waiting_while_the_disk_has_room() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 6));
    // Room for the index runs maintenance writes meanwhile.
    const RESERVE: u64 = 256 * BLOCK as u64;
    let mut config = NodeConfig { reserve: Reserve::Bytes(RESERVE), ..NodeConfig::default() };
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.burst_reads_nanos = 2_000 * MILLI;
    config.volume.overlay_versions_max = 64;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 4 * BLOCK as u64;
    let (node, volume, at) = node_with_volume(&storage, config);
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
    // burst of writes, the reads keep archiving waiting (and, small,
    // destaging: see the test below).
    write_blocks(&volume, at, 0..10);
    work(5);
    for millis in (200..=1_800).step_by(200) {
        read();
        let stats = work(millis);
        assert_eq!(stats.versions_archived, 0, "at {millis} ms: {stats:?}");
    }
    // Reads stop: a quiet 250 ms later archiving catches up.
    let stats = work(1_800 + 260);
    assert_eq!((stats.versions_archived, stats.versions_pending_destage), (10, 0), "{stats:?}");

    // Reads that go on past `burst_reads_nanos` after the last write keep
    // it waiting no longer.
    write_blocks(&volume, |block| at(3_000 + block), 10..20);
    for millis in (3_400..=4_800).step_by(200) {
        read();
        assert_eq!(work(millis).versions_archived, 10, "at {millis} ms");
    }
    read();
    assert_eq!(work(5_100).versions_archived, 20);

    // Only while the passes of all the history waiting on the node fit the
    // disk's free space above twice the reserve: 10 blocks wait
    // here and 3 on another volume (too few for its own pass to be due),
    // with room for 15, then for 12 — where this volume's 10 alone would fit.
    let spec = VolumeSpec::new(VolumeName::new("w").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let other = node.create_volume(spec, at(5_900)).unwrap();
    write_blocks(&other, |block| at(6_000 + block), 0..3);
    write_blocks(&volume, |block| at(6_000 + block), 20..30);
    // The node measures the disk first in its round, before it writes.
    let room_for = |blocks: u64| storage.set_capacity(Some(storage.used_bytes() + 2 * RESERVE + blocks * BLOCK as u64));
    room_for(15);
    read();
    assert_eq!(work(6_400).versions_archived, 20, "waiting while there is room");
    assert_eq!(other.stats().unwrap().versions_archived, 0, "the other volume's history waits too");
    room_for(12);
    read();
    assert_eq!(work(6_600).versions_archived, 30, "archived although read");
}

#[test]
fn a_pass_whose_history_does_not_fit_the_room_goes_on_beside_reads_by_budget() {
    // Two parts of a pass (32 MiB each) and a little more.
    const BLOCKS: u64 = (32 << 20) / BLOCK as u64 + 64;
    // Free space enough for the pass's packs, not for reads to hold it.
    const RESERVE: u64 = 16 << 20;
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 12));
    let mut config = NodeConfig { reserve: Reserve::Bytes(RESERVE), ..NodeConfig::default() };
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.burst_reads_nanos = 3_600_000 * MILLI;
    config.volume.burst_archive_wait_nanos = 0;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 8 * BLOCK as u64;
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let (node, clock, volume) = clocked_volume(Arc::clone(&storage), config, start, BLOCKS * BLOCK as u64);
    let reader = Client::reader(&volume);
    // Each round writes every block (a microsecond apart, from its second),
    // then runs a pass past the burst, with the history waiting twice what
    // fits the room above twice the reserve. (The node's round first takes
    // the room back, and sees the reads so far.)
    let pass = |round: u64| {
        storage.set_capacity(None);
        node.maintain(clock.now()).unwrap();
        let at = |block: u64| start.saturating_add_nanos((1 + 10 * round) * 1_000 * MILLI + block * 1_000);
        write_blocks(&volume, at, 0..BLOCKS);
        let now = at(BLOCKS - 1).saturating_add_nanos(250 * MILLI + 1);
        clock.set(now);
        storage.set_capacity(Some(storage.used_bytes() + 2 * RESERVE + BLOCKS / 2 * BLOCK as u64));
        // The node measures the disk and the history waiting in its round.
        node.maintain(now).unwrap();
        let volume = Arc::clone(&volume);
        pass_in_background(move || assert!(volume.maintain_history(now).unwrap(), "the pass archived"))
    };

    // Read beside it: after its first part the pass waits fifteen times as
    // long, then goes on though the reads do.
    let reads_before = reader.count();
    wait_for("a read", || reader.count() > reads_before);
    let pass_ended = pass(0);
    wait_for("the pass to wait after its first part", || volume.stats().unwrap().archive_yields == 1);
    let stats = volume.stats().unwrap();
    assert_eq!(stats.versions_archived, 0, "{stats:?}");
    pass_ended.recv_timeout(Duration::from_secs(60)).expect("the pass ended beside the reads");
    let stats = volume.stats().unwrap();
    assert_eq!((stats.versions_archived, stats.archive_pauses, stats.archive_yields), (BLOCKS, 0, 1), "{stats:?}");
    assert!(reader.count() > reads_before + 1, "the reads went on meanwhile");

    // Without reads, a pass goes on at once after each part.
    reader.stop();
    reader.join();
    pass(1).recv_timeout(Duration::from_secs(60)).expect("the pass ended");
    let stats = volume.stats().unwrap();
    assert_eq!((stats.versions_archived, stats.archive_pauses, stats.archive_yields), (2 * BLOCKS, 0, 1), "{stats:?}");
}

#[test]
fn a_pass_whose_history_outgrows_half_the_room_goes_on_beside_a_burst_by_a_share_that_grows_with_it() {
    // Two parts of a pass (32 MiB each) and a little more.
    const BLOCKS: u64 = (32 << 20) / BLOCK as u64 + 64;
    const RESERVE: u64 = 16 << 20;
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 13));
    let mut config = NodeConfig { reserve: Reserve::Bytes(RESERVE), ..NodeConfig::default() };
    // A burst the writes below keep going however slowly a loaded machine
    // runs their thread, with a budget that outlasts the test: only the
    // room decides.
    config.volume.burst_quiet_nanos = 2_000 * MILLI;
    config.volume.burst_archive_wait_nanos = 3_600_000 * MILLI;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 8 * BLOCK as u64;
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let (node, clock, volume) = clocked_volume(Arc::clone(&storage), config, start, (BLOCKS + 64) * BLOCK as u64);
    // Each round writes every block (a microsecond apart, from its second)
    // with `room` bytes free above twice the reserve, and runs a pass while
    // the burst goes on: a write every 20 ms past the blocks, at the clock's
    // time, a handful beside the pass's thousands.
    let pass = |round: u64, room: u64| {
        storage.set_capacity(None);
        let at = |block: u64| start.saturating_add_nanos((1 + 10 * round) * 1_000 * MILLI + block * 1_000);
        write_blocks(&volume, at, 0..BLOCKS);
        let now = at(BLOCKS).saturating_add_nanos(MILLI);
        clock.set(now);
        // Their versions in runs, which a pass archives (the writes to come
        // stay in memory).
        volume.checkpoint(now).unwrap();
        let writer = {
            let clock = Arc::clone(&clock);
            Client::start(&volume, move |volume, n| {
                if n > 0 {
                    clock.sleep(20 * MILLI);
                }
                let block = BLOCKS + n % 64;
                volume.write(clock.now(), block * BLOCK as u64, &[1; BLOCK], Durability::Buffered).unwrap();
            })
        };
        wait_for("the burst's next write", || writer.count() > 0);
        storage.set_capacity(Some(storage.used_bytes() + 2 * RESERVE + room));
        // The node measures the disk and the history waiting in its round.
        node.maintain(now).unwrap();
        let archived_before = volume.stats().unwrap().versions_archived;
        let passing = Arc::clone(&volume);
        let pass_ended =
            pass_in_background(move || assert!(passing.maintain_history(now).unwrap(), "the pass archived"));
        pass_ended.recv_timeout(Duration::from_secs(60)).expect("the pass ended in the burst");
        writer.stop();
        writer.join();
        (volume.stats().unwrap(), archived_before)
    };
    let waiting = BLOCKS * BLOCK as u64;

    // The history waiting takes five eighths of the room: half way from
    // half, where the burst would keep it waiting, to three quarters, the
    // pass takes half the time: after its first part it waits as long.
    let (stats, archived_before) = pass(0, waiting / 5 * 8);
    assert!(stats.versions_archived >= archived_before + BLOCKS, "{stats:?}");
    assert_eq!((stats.archive_pauses, stats.archive_yields), (0, 1), "{stats:?}");

    // Three quarters of the room or more: at full speed.
    let (stats, archived_before) = pass(1, waiting / 3 * 4);
    assert!(stats.versions_archived >= archived_before + BLOCKS, "{stats:?}");
    assert_eq!((stats.archive_pauses, stats.archive_yields), (0, 1), "no pause, no more yields: {stats:?}");
}

#[test]
fn small_reads_right_after_a_burst_keep_destaging_and_checkpoints_waiting_and_large_ones_do_not() {
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.burst_reads_nanos = 2_000 * MILLI;
    // A checkpoint in the first burst, then one due by time after the
    // second, which destages the blocks the first left behind.
    config.volume.checkpoint_journal_bytes = 16 * BLOCK as u64;
    config.volume.checkpoint_interval_nanos = 500 * MILLI;
    let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 9)), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    assert_eq!(volume.layout(), Layout::Journaled, "the layout whose overlay absorbs overwrites");
    let at = |millis: u64| start.saturating_add_nanos(1_000 * MILLI + millis * MILLI);
    let work = |millis: u64| {
        node.maintain(at(millis)).unwrap();
        volume.stats().unwrap()
    };
    let read = |blocks: usize| {
        let mut data = vec![0; blocks * BLOCK];
        volume.read(0, &mut data).unwrap();
        assert!(data.chunks(BLOCK).enumerate().all(|(block, data)| data[0] == block as u8 + 1), "read back");
    };

    // 16 blocks by millisecond 15: a checkpoint (a journal's worth) leaves
    // them behind; 8 more by millisecond 123.
    write_blocks(&volume, at, 0..16);
    let stats = work(20);
    let checkpoints = stats.checkpoints;
    assert_eq!((checkpoints, stats.versions_pending_destage), (1, 16), "{stats:?}");
    write_blocks(&volume, |block| at(100 + block), 16..24);
    // Then a 4 KiB read every 100 ms: the bursts' blocks stay in the
    // overlay, and the checkpoint due from millisecond 520 waits.
    for millis in (400..=1_500).step_by(100) {
        read(1);
        let stats = work(millis);
        assert_eq!(stats.versions_pending_destage, 24, "at {millis} ms: {stats:?}");
        assert_eq!(stats.checkpoints, checkpoints, "at {millis} ms: {stats:?}");
    }
    // The reads stop: 250 ms later both go on.
    let stats = work(1_500 + 260);
    assert_eq!(stats.versions_pending_destage, 0, "{stats:?}");
    assert_eq!(stats.checkpoints, checkpoints + 1, "{stats:?}");

    // A burst again, read 128 KiB at a time: the reads need the
    // volume in block order, and destaging goes on beside them.
    write_blocks(&volume, |block| at(3_000 + block), 0..32);
    assert_eq!(work(3_040).versions_pending_destage, 32);
    read(32);
    let stats = work(3_300);
    assert_eq!(stats.versions_pending_destage, 0, "{stats:?}");
    assert_eq!(stats.destage_stops, 0, "no pass stopped part-way: {stats:?}");

    // Small reads that go on past `burst_reads_nanos` after the last write
    // keep it waiting no longer.
    write_blocks(&volume, |block| at(5_000 + block), 0..32);
    read(1);
    assert_eq!(work(5_300).versions_pending_destage, 32);
    read(1);
    assert_eq!(work(7_100).versions_pending_destage, 0);
}

/// A client of a volume on a thread of its own: one operation after
/// another (given how many it did before) until stopped, counted.
struct Client {
    going: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    thread: thread::JoinHandle<()>,
}

impl Client {
    fn start(volume: &Arc<Volume>, operation: impl Fn(&Volume, u64) + Send + 'static) -> Client {
        let (going, done) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
        let thread = {
            let (volume, going, done) = (Arc::clone(volume), Arc::clone(&going), Arc::clone(&done));
            thread::spawn(move || {
                while going.load(Ordering::Acquire) {
                    operation(&volume, done.load(Ordering::Acquire));
                    done.fetch_add(1, Ordering::Release);
                }
            })
        };
        Client { going, done, thread }
    }

    /// Reads block 0, again and again.
    fn reader(volume: &Arc<Volume>) -> Client {
        Client::start(volume, |volume, _| volume.read(0, &mut [0; BLOCK]).unwrap())
    }

    fn count(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.going.store(false, Ordering::Release);
    }

    fn join(self) {
        self.thread.join().unwrap();
    }
}

/// The archive pass `archive` starts on its own thread, and the channel that
/// says it ended.
fn pass_in_background(archive: impl FnOnce() + Send + 'static) -> mpsc::Receiver<()> {
    let (ended, pass_ended) = mpsc::channel();
    thread::spawn(move || {
        archive();
        let _ = ended.send(());
    });
    pass_ended
}

/// Waits (a minute at most) until `done`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "still waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The embedder's clock in a simulation: it reads `set`'s time, plus the
/// time the machine's clock has run since.
struct TestClock(Mutex<(Timestamp, Instant)>);

impl TestClock {
    fn set(&self, now: Timestamp) {
        *self.0.lock().unwrap() = (now, Instant::now());
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        let (at, set) = *self.0.lock().unwrap();
        at.saturating_add_nanos(set.elapsed().as_nanos() as u64)
    }

    fn sleep(&self, nanos: u64) {
        thread::sleep(Duration::from_nanos(nanos));
    }
}

/// A node on `storage` with a 1 MiB volume `v` created at a fixed start,
/// and the time `millis` milliseconds after the second that follows it.
fn node_with_volume(
    storage: &Arc<SimStorage>,
    config: NodeConfig,
) -> (Node, Arc<Volume>, impl Fn(u64) -> Timestamp + Copy) {
    let node = Node::open(Arc::clone(storage) as _, config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    (node, volume, move |millis: u64| start.saturating_add_nanos(1_000 * MILLI + millis * MILLI))
}

/// A node on `storage` whose clock is a [`TestClock`] set to `start`, the
/// clock, and a volume `v` of `bytes` created at `start`.
fn clocked_volume(
    storage: Arc<SimStorage>,
    config: NodeConfig,
    start: Timestamp,
    bytes: u64,
) -> (Node, Arc<TestClock>, Arc<Volume>) {
    let node = Node::open(storage, config).unwrap();
    let clock = Arc::new(TestClock(Mutex::new((start, Instant::now()))));
    node.set_clock(Arc::clone(&clock) as _);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), bytes, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    (node, clock, volume)
}

/// Runs `work` on a thread of its own and waits (a minute at most) for its
/// answer: work an archive pass must not keep waiting while it pauses.
fn goes_on_at_once<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (answer, answered) = mpsc::channel();
    thread::spawn(move || answer.send(work()));
    answered.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} waited for the reads"))
}

#[test]
fn an_archive_pass_under_way_pauses_for_a_burst_within_its_budget_as_for_reads() {
    const BLOCKS: u64 = 64;
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.burst_reads_nanos = 3_600_000 * MILLI;
    config.volume.burst_archive_wait_nanos = 2_000 * MILLI;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_bytes_soft = 8 * BLOCK as u64;
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 11));
    let (_node, clock, volume) = clocked_volume(storage, config, start, 2 << 20);
    // Writes of blocks from 100 on at the clock's time, until stopped.
    let writer = || {
        let clock = Arc::clone(&clock);
        Client::start(&volume, move |volume, n| {
            volume.write(clock.now(), (100 + n % 64) * BLOCK as u64, &[0; BLOCK], Durability::Buffered).unwrap();
        })
    };
    let stop = |client: Client| {
        client.stop();
        client.join();
    };

    // A burst of 64 blocks over 2.5 s, past its 2 s budget, and reads after
    // it: the pass starts in the burst a nanosecond before it ends, and
    // pauses for the reads as it looks.
    let at = |block: u64| start.saturating_add_nanos(1_000 * MILLI + block * 40 * MILLI);
    write_blocks(&volume, at, 0..BLOCKS);
    let reader = Client::reader(&volume);
    wait_for("a read after the writes", || reader.count() > 0);
    let pass_ended = {
        let volume = Arc::clone(&volume);
        let now = at(BLOCKS - 1).saturating_add_nanos(250 * MILLI - 1);
        clock.set(now);
        pass_in_background(move || assert!(volume.maintain_history(now).unwrap(), "the pass archived"))
    };
    wait_for("the pass to pause", || volume.stats().unwrap().archive_pauses == 1);

    // A new burst begins, the reads end and 300 ms pass: the burst, within
    // its budget, keeps the pass paused. The clock moves in three steps, each
    // shorter than the burst's quiet time and followed by writes at its new
    // time: one step of 300 ms would leave the pass a moment, before the
    // writer's next write, in which the burst looks paused.
    let writer = writer();
    wait_for("a write of the new burst", || writer.count() > 0);
    stop(reader);
    for _ in 0..3 {
        clock.set(clock.now().saturating_add_nanos(100 * MILLI));
        let written = writer.count();
        wait_for("writes after the clock moved", || writer.count() > written + 100);
    }
    assert!(pass_ended.recv_timeout(Duration::from_millis(200)).is_err(), "the pass waits for the burst");
    let stats = volume.stats().unwrap();
    assert_eq!((stats.versions_archived, stats.archive_progress), (0, Some((0, BLOCKS))), "{stats:?}");

    // The writes pause for 250 ms: the pass goes on, paused once.
    stop(writer);
    clock.set(clock.now().saturating_add_nanos(300 * MILLI));
    pass_ended.recv_timeout(Duration::from_secs(60)).expect("the pass ended once the burst paused");
    let stats = volume.stats().unwrap();
    assert_eq!((stats.versions_archived, stats.archive_pauses), (BLOCKS, 1), "{stats:?}");
}

#[test]
fn an_archive_pass_pauses_while_the_volume_is_read_and_goes_on_for_work_that_waits_for_it_or_when_reads_end() {
    const BLOCKS: u64 = 64;
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 8));
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    // Long enough that only the reads ending, or a diff, can end a pause.
    config.volume.burst_reads_nanos = 3_600_000 * MILLI;
    config.volume.archive_age_nanos = 0;
    // The pass starts in the burst: it does not wait for it to pause.
    config.volume.burst_archive_wait_nanos = 0;
    config.volume.archive_bytes_soft = 8 * BLOCK as u64;
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let (node, clock, volume) = clocked_volume(storage, config, start, 2 << 20);
    let node = Arc::new(node);
    // A volume that files history as it destages (COW), which takes the
    // chunk store's one session, the paused pass's: its block 0 is in its
    // current store before the first pass, and overwritten in round 3.
    let cow = {
        let spec = VolumeSpec::new(VolumeName::new("cow").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
        node.create_volume(VolumeSpec { layout: Layout::Cow, ..spec }, start).unwrap()
    };
    cow.write(start.saturating_add_nanos(MILLI), 0, &[1; BLOCK], Durability::Fua).unwrap();
    cow.maintain(start.saturating_add_nanos(500 * MILLI)).unwrap();
    assert_eq!(cow.stats().unwrap().versions_pending_destage, 0);
    let reader = Client::reader(&volume);

    // Each round's pass is ended by something else: a diff, a delete of
    // history, a collection of the chunk store (each waits for archive
    // passes to end, `PassesWanted`), another volume's destaging that files
    // history, then the reads ending.
    for round in 0..5 {
        let first = round * BLOCKS;
        // Block n is written at millisecond n, from the second second (the
        // volume's granularity), each round 10 s after the one before (which
        // archived history up to its time).
        let at = |millis: u64| start.saturating_add_nanos((1 + 10 * round) * 1_000 * MILLI + millis * MILLI);
        write_blocks(&volume, at, first..first + BLOCKS);
        let reads_after_writes = reader.count();
        wait_for("a read after the writes", || reader.count() > reads_after_writes);
        // The pass starts in the burst, over its budget, a nanosecond before
        // the burst ends; it pauses as it looks, the reads going on.
        let pass_ended = {
            let volume = Arc::clone(&volume);
            let now = at(first + BLOCKS - 1).saturating_add_nanos(250 * MILLI - 1);
            clock.set(now);
            pass_in_background(move || assert!(volume.maintain_history(now).unwrap(), "the pass archived"))
        };
        wait_for("the pass to pause", || volume.stats().unwrap().archive_pauses == round + 1);
        assert_eq!(volume.stats().unwrap().versions_archived, first, "nothing archived while paused");
        assert_eq!(volume.stats().unwrap().archive_progress, Some((0, BLOCKS)), "a pass under way, paused");
        // Each goes on at once: the pass resumes though the reads go on,
        // and the work has the history once the pass has ended.
        let pass_ends = |cause: &str| {
            pass_ended.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("the pass ended for {cause}"))
        };
        match round {
            0 => {
                let volume = Arc::clone(&volume);
                let changed = goes_on_at_once("a diff", move || {
                    volume.changed_ranges(&volume.view(start).unwrap(), None).unwrap()
                });
                assert_eq!(changed, vec![(0, BLOCKS * BLOCK as u64)]);
                pass_ends("a diff");
            }
            1 => {
                // Round 0's history, from its first write to its last.
                let (from, to) = (start.saturating_add_nanos(1_000 * MILLI), start.saturating_add_nanos(2_000 * MILLI));
                let deleting = Arc::clone(&volume);
                let now = clock.now();
                goes_on_at_once("a delete of history", move || deleting.delete_history(from, to, now)).unwrap();
                pass_ends("a delete of history");
                let inside = from.saturating_add_nanos(BLOCKS / 2 * MILLI);
                assert!(volume.view(inside).is_err(), "the deleted range is no longer a point to read");
            }
            2 => {
                let collecting = Arc::clone(&node);
                let report = goes_on_at_once("a collection", move || collecting.collect(&mut |_, _, _| {}).unwrap());
                pass_ends("a collection");
                assert_eq!(report.chunks_freed, 0, "history refers to every chunk: {report:?}");
            }
            3 => {
                let cow = Arc::clone(&cow);
                let overwritten = at(0);
                let now = clock.now();
                let filed = goes_on_at_once("a COW volume's destaging", move || {
                    cow.write(overwritten, 0, &[2; BLOCK], Durability::Fua).unwrap();
                    cow.maintain(now).unwrap();
                    cow.stats().unwrap()
                });
                assert_eq!((filed.versions_pending_destage, filed.versions_in_runs), (0, 1), "{filed:?}");
                pass_ends("a COW volume's destaging");
            }
            _ => {
                reader.stop();
                pass_ends("the reads ending");
            }
        }
        assert_eq!(volume.stats().unwrap().versions_archived, first + BLOCKS);
        assert_eq!(volume.stats().unwrap().archive_progress, None, "no pass under way");
    }
    reader.join();
}

#[test]
fn random_writes_are_destaged_from_reads_of_the_journal_in_its_own_order() {
    // Blocks written in a scrambled order lie in the journal in that order:
    // read block by block, destaging them took one read each once they had
    // left memory (4 KiB reads from the disk: random writes at queue depth
    // 32 came in faster than they were destaged, and waited for room in
    // the overlay). 15 MiB, nearly four times what the journal keeps in
    // memory here, in fewer than one block in eight of the volume: an
    // overlay that dense would be swept in block order instead, its reads
    // made many at once (`plan_sweep`, the gather's readers).
    const BLOCKS: u64 = 2048;
    const WRITTEN: u64 = 240;
    const BIG: usize = 64 << 10;
    let storage = SimStorage::new(SimConfig::default(), 9);
    let mut config = NodeConfig { journal_memory_bytes: 4 << 20, ..NodeConfig::default() };
    config.volume.burst_quiet_nanos = 0;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), BLOCKS * BIG as u64, BlockSize::new(BIG as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    // 389 is prime to 2048: each block at most once, neighbours far apart.
    let scrambled = |n: u64| n * 389 % BLOCKS;
    for n in 0..WRITTEN {
        let block = scrambled(n);
        let at = start.saturating_add_nanos((n + 1) * MILLI);
        volume.write(at, block * BIG as u64, &[block as u8 ^ 0x5a; BIG], Durability::Buffered).unwrap();
    }
    volume.flush().unwrap();
    let before = volume.io_stats();
    node.maintain(start.saturating_add_nanos(10_000 * MILLI)).unwrap();
    let after = volume.io_stats();
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 0);
    assert!(after.current.write_bytes - before.current.write_bytes >= WRITTEN * BIG as u64, "{after:?}");
    // At least the first 8 MiB come from the file: a megabyte at a time,
    // not a block.
    let (reads, read_bytes) =
        (after.journal.reads - before.journal.reads, after.journal.read_bytes - before.journal.read_bytes);
    assert!(read_bytes >= 8 << 20, "{read_bytes} bytes read: the test needs blocks that left memory");
    assert!(reads <= 2 * (read_bytes >> 20), "{reads} journal reads for {read_bytes} bytes");
    let mut image = vec![0; BIG];
    for block in (0..WRITTEN).map(scrambled) {
        volume.read(block * BIG as u64, &mut image).unwrap();
        assert!(image.iter().all(|&byte| byte == block as u8 ^ 0x5a), "block {block} reads what was written");
    }
}

#[test]
fn overwrites_in_a_burst_are_absorbed_in_the_overlay_and_every_version_still_reads_back() {
    // 8 blocks written 12 times in a burst: the overlay keeps one version
    // per block (two where a newer one is not yet durable), so destaging
    // waits for blocks, not versions, and writes each block once.
    const BLOCKS: u64 = 8;
    let storage = SimStorage::new(SimConfig::default(), 10);
    let mut config = NodeConfig::default();
    config.volume.burst_quiet_nanos = 250 * MILLI;
    // Destaging waits for 32 versions at most: 12 × 8 would be past it.
    config.volume.overlay_versions_max = 64;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let start = Timestamp::from_unix_nanos(1_000_000 * MILLI);
    let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(BLOCK as u32).unwrap());
    let volume = node.create_volume(spec, start).unwrap();
    // Round r writes block n at millisecond 10 r + n, bytes r + 1.
    let at = |round: u64, block: u64| start.saturating_add_nanos(1_000 * MILLI + (10 * round + block) * MILLI);
    let write_round = |round: u64, durability: Durability| {
        for block in 0..BLOCKS {
            volume.write(at(round, block), block * BLOCK as u64, &[round as u8 + 1; BLOCK], durability).unwrap();
        }
    };
    let current_bytes = || volume.io_stats().current.write_bytes;

    // Round 0 reaches the current store once the burst has paused.
    write_round(0, Durability::Fua);
    node.maintain(at(0, BLOCKS).saturating_add_nanos(300 * MILLI)).unwrap();
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 0);
    let destaged_once = current_bytes();
    assert!(destaged_once >= BLOCKS * BLOCK as u64);

    // Rounds 1 to 10 durable, round 11 not yet: per block the newest
    // durable version and the one after it.
    for round in 1..=10 {
        write_round(round, Durability::Fua);
    }
    write_round(11, Durability::Buffered);
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 2 * BLOCKS);
    node.maintain(at(11, BLOCKS)).unwrap();
    assert_eq!(current_bytes(), destaged_once, "destaging waits: 16 versions pending of 32");

    // Every round reads back at its time, though the current store holds
    // round 0 and the overlay only rounds 10 and 11.
    let mut image = vec![0; (BLOCKS as usize) * BLOCK];
    for round in 0..12 {
        volume.view(at(round, BLOCKS - 1)).unwrap().read(0, &mut image).unwrap();
        assert!(image.iter().all(|&byte| byte == round as u8 + 1), "the view at round {round} reads round {round}");
    }
    volume.read(0, &mut image).unwrap();
    assert!(image.iter().all(|&byte| byte == 12), "the present is round 11");

    // Once the burst pauses, and the small reads just made with it, each
    // block is destaged once more: round 11.
    volume.flush().unwrap();
    node.maintain(at(11, BLOCKS).saturating_add_nanos(300 * MILLI)).unwrap();
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 2 * BLOCKS, "the reads keep it waiting");
    node.maintain(at(11, BLOCKS).saturating_add_nanos(560 * MILLI)).unwrap();
    assert_eq!(volume.stats().unwrap().versions_pending_destage, 0);
    assert!(current_bytes() - destaged_once < 2 * BLOCKS * BLOCK as u64, "one write per block, not one per version");
    volume.read(0, &mut image).unwrap();
    assert!(image.iter().all(|&byte| byte == 12), "the present is round 11");
    volume.view(at(5, BLOCKS - 1)).unwrap().read(0, &mut image).unwrap();
    assert!(image.iter().all(|&byte| byte == 6), "the view at round 5 reads round 5");
}

/// A burst is checkpointed once the volume is at rest — destaged, neither
/// written nor read — while recovery would replay from a segment before the
/// journal's current one, not only at the interval (30 s) with writes: the
/// journal gives its segments back, or keeps them as spares, before the
/// next burst. So is a burst whose last checkpoint, fuzzy, left blocks
/// behind and replays from its cut. Writes within one segment wait for the
/// interval, and so does a burst in progress.
#[test]
fn a_burst_is_checkpointed_at_rest_and_its_segments_given_back_before_the_interval() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 15));
    let mut config = NodeConfig { reserve: Reserve::Bytes(0), ..NodeConfig::default() };
    config.volume.journal.segment_bytes_max = 64 << 10;
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    // A checkpoint within the burst, fuzzy: the burst rewrites blocks.
    config.volume.checkpoint_journal_bytes = 512 << 10;
    assert_eq!(config.volume.checkpoint_interval_nanos, 30_000 * MILLI);
    let (node, volume, at) = node_with_volume(&storage, config);
    let work = |millis: u64| {
        node.maintain(at(millis)).unwrap();
        node.maintain_history(at(millis)).unwrap();
    };
    let segments =
        || storage.list_dir("volumes/v/journal").unwrap().iter().filter(|name| name.ends_with(".seg")).count();
    let checkpoints = || volume.stats().unwrap().checkpoints;

    // Less than a segment, then quiet: the interval rules.
    write_blocks(&volume, at, 0..15);
    work(500);
    work(1_000);
    assert_eq!((checkpoints(), segments()), (0, 1), "writes within one segment wait for the interval");
    // 160 blocks of 4 KiB, each of the first 64 twice: ten segments and
    // more. Within the burst, one checkpoint, by the journal's bytes; the
    // overlay holds the blocks rewritten since, so it replays from its cut.
    write_blocks(&volume, |block| at(2_000 + block), 0..64);
    write_blocks(&volume, |block| at(2_100 + block), 0..64);
    work(2_170);
    assert_eq!(checkpoints(), 1, "by the journal's bytes");
    write_blocks(&volume, |block| at(2_100 + block), 64..160);
    let started = segments();
    assert!(started >= 10, "{started}");
    work(2_300);
    assert_eq!((checkpoints(), segments()), (1, started), "a burst in progress is not at rest");
    // At rest, a second after the burst, 29 before the interval.
    work(3_000);
    work(3_100);
    assert_eq!(checkpoints(), 2, "one checkpoint at rest");
    assert!(segments() <= 2, "the burst's segments given back: {started} -> {}", segments());
    work(3_500);
    work(40_000);
    assert_eq!(checkpoints(), 2, "and no more while nothing is written");
}

/// A burst's journal segment files are kept as spares for the next burst,
/// which then writes only into reused files (on this machine's disk, large
/// direct writes into written blocks run at its full speed, into a new
/// file's at three quarters of it: BENCHMARKS.md), and are given back once
/// free space falls below twice the reserve.
#[test]
fn a_bursts_journal_segments_are_kept_for_the_next_and_given_back_when_space_runs_low() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 14));
    const RESERVE: u64 = 256 * BLOCK as u64;
    let mut config = NodeConfig { reserve: Reserve::Bytes(RESERVE), ..NodeConfig::default() };
    config.volume.journal.segment_bytes_max = 64 << 10;
    config.volume.burst_quiet_nanos = 250 * MILLI;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    config.volume.checkpoint_interval_nanos = 1;
    let (node, volume, at) = node_with_volume(&storage, config);
    let work = |millis: u64| {
        node.maintain(at(millis)).unwrap();
        node.maintain_history(at(millis)).unwrap();
    };
    let names = || storage.list_dir("volumes/v/journal").unwrap();
    let spares = || names().iter().filter(|name| name.starts_with("spare-")).count();
    let segments = || names().iter().filter(|name| name.ends_with(".seg")).count();

    // 160 blocks of 4 KiB: ten segments and more. Once the writes pause,
    // their history is archived and the segments before the checkpoint's
    // are reclaimed, every one kept.
    write_blocks(&volume, at, 0..160);
    let started = segments();
    assert!(started >= 10, "{:?}", names());
    work(500);
    work(1_000);
    assert!(segments() <= 2 && spares() >= started - 2, "{:?}", names());
    let kept = spares();
    // The next burst as large takes every one of them (renamed to its
    // segments), and leaves as many again.
    write_blocks(&volume, |block| at(2_000 + block), 0..160);
    assert_eq!(spares(), 0, "{:?}", names());
    work(2_500);
    work(3_000);
    assert!(spares() >= kept, "{:?}", names());
    // More history waits, and free space falls below the reserve: all but
    // the two spares a journal writes ahead are given back.
    write_blocks(&volume, |block| at(3_200 + block), 0..8);
    storage.set_capacity(Some(storage.used_bytes() + RESERVE / 2));
    for work in [Node::maintain, Node::maintain_history] {
        if let Err(error) = work(&node, at(3_500)) {
            assert!(error.is_transient(), "a full disk is no fault: {error}");
        }
    }
    assert_eq!(spares(), 2, "{:?}", names());
    storage.set_capacity(None);
}
