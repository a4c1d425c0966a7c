//! The journal against the simulated disk: what is committed survives any
//! crash, what survives is a prefix, torn tails are cut and corruption is not.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rewind_format::journal::{split_compound_payload, CompoundExtent};
use rewind_format::meta::JournalPosition;
use rewind_io::{OpenMode, SimConfig, SimStorage, Storage};
use rewind_journal::{Journal, JournalConfig, JournalError, RecentMemory, RecoveryReport, SpanBytes};
use rewind_types::{BlockIndex, BlockSize, ChunkId, Lsn, Timestamp, Version, VersionData};

const BLOCK: u32 = 512;

fn block_size() -> BlockSize {
    BlockSize::new(BLOCK).unwrap()
}

/// A journal with the default configuration on `storage`.
fn journal_on(storage: &SimStorage) -> Journal {
    Journal::create(Arc::new(storage.clone()), "journal", block_size(), JournalConfig::default(), Timestamp::MIN)
        .unwrap()
}

fn start() -> JournalPosition {
    JournalPosition { segment: 1, offset: 64 }
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Write { block: u64, data: Vec<u8> },
    Zero { block: u64, count: u32 },
    Copy { versions: Vec<Version> },
    Compound { extents: Vec<CompoundExtent>, data: Vec<u8> },
}

fn append(journal: &Journal, op: &Op, timestamp: u64) -> Lsn {
    let timestamp = Timestamp::from_unix_nanos(timestamp);
    match op {
        Op::Write { block, data } => {
            journal.append_write(timestamp, BlockIndex(*block), data, &mut Vec::new()).unwrap().lsn
        }
        Op::Zero { block, count } => journal.append_zero(timestamp, BlockIndex(*block), *count).unwrap().lsn,
        Op::Copy { versions } => journal.append_copy(versions).unwrap().lsn,
        Op::Compound { extents, data } => {
            let slices = split_compound_payload(extents, data, BLOCK as usize);
            journal.append_compound(timestamp, extents, &slices, &mut Vec::new()).unwrap().lsn
        }
    }
}

fn replay(storage: &SimStorage, config: JournalConfig) -> Result<(Vec<Op>, Journal), JournalError> {
    replay_from(storage, config, (start(), Lsn(1))).map(|(ops, journal, _)| (ops, journal))
}

fn replay_reporting(storage: &SimStorage) -> Result<(Vec<Op>, RecoveryReport), JournalError> {
    replay_from(storage, JournalConfig::default(), (start(), Lsn(1))).map(|(ops, _, report)| (ops, report))
}

/// Recovers the journal from a replay point (where a record starts, and its
/// LSN): the records from there on.
fn replay_from(
    storage: &SimStorage,
    config: JournalConfig,
    (from, lsn_from): (JournalPosition, Lsn),
) -> Result<(Vec<Op>, Journal, RecoveryReport), JournalError> {
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut recovery = Journal::recover(shared, "journal", block_size(), config, from, lsn_from, Timestamp::MIN)?;
    let mut ops = Vec::new();
    while let Some(record) = recovery.next_record()? {
        let block = record.header.block_first.0;
        ops.push(match record.header.kind {
            rewind_format::journal::RecordKind::Write => Op::Write { block, data: record.data.to_vec() },
            rewind_format::journal::RecordKind::Zero => Op::Zero { block, count: record.header.block_count },
            rewind_format::journal::RecordKind::Copy => Op::Copy { versions: record.copies()? },
            rewind_format::journal::RecordKind::Compound => {
                Op::Compound { extents: record.extents()?, data: record.data.to_vec() }
            }
            rewind_format::journal::RecordKind::Vouch | rewind_format::journal::RecordKind::Lost => {
                panic!("recovery keeps these records to itself")
            }
        });
    }
    let (journal, report) = recovery.finish()?;
    Ok((ops, journal, report))
}

/// The segment files of the journal, in order (not the spares).
fn segments(storage: &SimStorage) -> Vec<String> {
    let mut names: Vec<String> =
        storage.list_dir("journal").unwrap().into_iter().filter(|name| name.ends_with(".seg")).collect();
    names.sort();
    names
}

/// The journal's spare segment files, by name.
fn spare_names(storage: &SimStorage) -> Vec<String> {
    let mut names: Vec<String> =
        storage.list_dir("journal").unwrap().into_iter().filter(|name| name.starts_with("spare-")).collect();
    names.sort();
    names
}

/// A compound record of up to four extents over blocks 0..256, some zeroed.
fn random_compound(rng: &mut StdRng, block_bytes: usize) -> Op {
    let mut extents = Vec::new();
    let mut block = rng.random_range(0..64u64);
    for _ in 0..rng.random_range(1..=4) {
        let block_count = rng.random_range(1..=3u32);
        extents.push(CompoundExtent { block_first: BlockIndex(block), block_count, zero: rng.random_bool(0.3) });
        block += u64::from(block_count) + rng.random_range(0..40);
    }
    let data_blocks: u32 = extents.iter().filter(|extent| !extent.zero).map(|extent| extent.block_count).sum();
    let data = (0..data_blocks as usize * block_bytes).map(|_| rng.random()).collect();
    Op::Compound { extents, data }
}

fn random_op(rng: &mut StdRng) -> Op {
    if rng.random_bool(0.1) {
        random_compound(rng, BLOCK as usize)
    } else if rng.random_bool(0.1) {
        let versions = (0..rng.random_range(1..5u64))
            .map(|index| Version {
                block: BlockIndex(index),
                timestamp: Timestamp::from_unix_nanos(rng.random_range(1..1000)),
                data: if rng.random_bool(0.5) { VersionData::Zero } else { VersionData::Chunk(ChunkId(rng.random())) },
                crc32c: rng.random(),
            })
            .collect();
        Op::Copy { versions }
    } else if rng.random_bool(0.8) {
        let blocks = rng.random_range(1..=4usize);
        let fill: u8 = rng.random();
        Op::Write { block: rng.random_range(0..64), data: vec![fill; blocks * BLOCK as usize] }
    } else {
        Op::Zero { block: rng.random_range(0..64), count: rng.random_range(1..100) }
    }
}

#[test]
fn committed_records_survive_every_crash_and_survivors_form_a_prefix() {
    for seed in 0..200u64 {
        println!("seed {seed}");
        // Half on a filesystem that refuses direct I/O: the journal falls back.
        let storage = SimStorage::new(SimConfig { direct_io: seed % 2 == 0, ..SimConfig::default() }, seed);
        let mut rng = StdRng::seed_from_u64(seed);
        // Batches from smaller than one record (each a larger batch, its
        // buffer moved out of alignment) to larger than a segment.
        let config = JournalConfig {
            segment_bytes_max: rng.random_range(2_000..20_000),
            batch_bytes_max: rng.random_range(64..24_000),
            ..JournalConfig::default()
        };
        let journal =
            Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
        let mut appended = Vec::new();
        let mut committed = 0;
        for step in 0..rng.random_range(1..60) {
            let op = random_op(&mut rng);
            let lsn = append(&journal, &op, step);
            assert_eq!(lsn, Lsn(appended.len() as u64 + 1));
            appended.push(op);
            if rng.random_bool(0.2) {
                committed = journal.commit().unwrap().0 as usize;
                if rng.random_bool(0.3) {
                    // Quiet after the commit: vouched for, taking no LSN.
                    journal.vouch().unwrap();
                }
            } else if rng.random_bool(0.2) {
                // Written to the files but not synced: may or may not survive.
                journal.write_out().unwrap();
            }
        }
        drop(journal);
        storage.crash();
        let (survivors, journal) = replay(&storage, config).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert!(survivors.len() >= committed, "seed {seed}: lost committed records");
        assert_eq!(survivors[..], appended[..survivors.len()], "seed {seed}: survivors are not a prefix");
        // The journal continues after the survivors.
        let op = random_op(&mut rng);
        assert_eq!(append(&journal, &op, 1_000), Lsn(survivors.len() as u64 + 1));
        journal.commit().unwrap();
        drop(journal);
        let (again, _) = replay(&storage, config).unwrap();
        assert_eq!(again.len(), survivors.len() + 1, "seed {seed}");
        assert_eq!(again.last(), Some(&op));
    }
}

#[test]
fn reads_see_records_before_and_after_they_reach_the_disk() {
    let storage = SimStorage::new(SimConfig::default(), 1);
    let journal = journal_on(&storage);
    let data: Vec<u8> = (0..BLOCK * 2).map(|i| (i % 251) as u8).collect();
    let appended = journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(7), &data, &mut Vec::new()).unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    let second_block = u64::from(appended.data_offset) + u64::from(BLOCK);
    journal.read(appended.segment, second_block, &mut buf).unwrap();
    assert_eq!(buf, data[BLOCK as usize..]);
    journal.commit().unwrap();
    buf.fill(0);
    journal.read(appended.segment, second_block, &mut buf).unwrap();
    assert_eq!(buf, data[BLOCK as usize..]);
}

#[test]
fn damage_to_an_acknowledged_record_is_corruption_not_a_torn_tail() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let journal = journal_on(&storage);
    let first = journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(0), &[1; 512], &mut Vec::new());
    journal.commit().unwrap();
    journal.append_write(Timestamp::from_unix_nanos(2), BlockIndex(1), &[2; 512], &mut Vec::new()).unwrap();
    journal.commit().unwrap();
    drop(journal);
    storage.corrupt("journal/00000001.seg", u64::from(first.unwrap().data_offset) + 100, 0x01).unwrap();
    match replay(&storage, JournalConfig::default()) {
        Err(JournalError::Corrupt { reason, .. }) => assert!(reason.contains("not a torn write"), "{reason}"),
        Err(other) => panic!("expected corruption, got {other}"),
        Ok((ops, _)) => panic!("expected corruption, replayed {} records", ops.len()),
    }
}

#[test]
fn damage_to_the_unacknowledged_tail_is_cut_off() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let journal = journal_on(&storage);
    journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(0), &[1; 512], &mut Vec::new()).unwrap();
    journal.commit().unwrap();
    let second = journal.append_write(Timestamp::from_unix_nanos(2), BlockIndex(1), &[2; 512], &mut Vec::new());
    let third = journal.append_write(Timestamp::from_unix_nanos(3), BlockIndex(2), &[3; 512], &mut Vec::new());
    journal.commit().unwrap();
    drop(journal);
    // Both later records were sealed before the second commit made the first
    // one's successors durable, so damage to the second reads as a torn write
    // even though the third is intact.
    let _ = third.unwrap();
    storage.corrupt("journal/00000001.seg", u64::from(second.unwrap().data_offset) + 3, 0x80).unwrap();
    let (ops, _) = replay(&storage, JournalConfig::default()).unwrap();
    assert_eq!(ops, vec![Op::Write { block: 0, data: vec![1; 512] }]);
}

#[test]
fn a_failed_fsync_poisons_the_journal() {
    let storage = SimStorage::new(SimConfig::default(), 9);
    let journal = journal_on(&storage);
    journal.append_zero(Timestamp::from_unix_nanos(1), BlockIndex(0), 1).unwrap();
    storage.fail_syncs(1);
    assert!(matches!(journal.commit(), Err(JournalError::Io { .. })));
    assert!(journal.is_poisoned());
    assert!(matches!(journal.commit(), Err(JournalError::Poisoned)));
    assert!(matches!(
        journal.append_zero(Timestamp::from_unix_nanos(2), BlockIndex(0), 1),
        Err(JournalError::Poisoned)
    ));
}

#[test]
fn reclaim_deletes_only_old_segments_before_the_replay_point() {
    let storage = SimStorage::new(SimConfig::default(), 9);
    let config = JournalConfig { segment_bytes_max: 4_000, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    // Three 512-byte blocks per record: two records per segment.
    let mut appended = Vec::new();
    for step in 1..=12u64 {
        let data = vec![step as u8; 3 * BLOCK as usize];
        let record = journal.append_write(Timestamp::from_unix_nanos(step * 10), BlockIndex(0), &data, &mut Vec::new());
        appended.push(record.unwrap());
    }
    journal.commit().unwrap();
    let segment_of = |step: usize| appended[step - 1].segment;
    assert_eq!((segment_of(1), segment_of(3), segment_of(12)), (1, 2, 6));
    // Nothing before the replay point may go, however old.
    assert_eq!(journal.reclaim(1, Timestamp::MAX, Timestamp::MIN).unwrap(), 0);
    // Segment 2 holds records 3 and 4 (times 30, 40): not all older than 35.
    let freed = journal.reclaim(5, Timestamp::from_unix_nanos(35), Timestamp::MIN).unwrap();
    assert!(freed > 0);
    let names = storage.list_dir("journal").unwrap();
    assert_eq!(segments(&storage).first().map(String::as_str), Some("00000002.seg"), "{names:?}");
    assert!(names.contains(&"spare-0".to_owned()), "kept for reuse: {names:?}");
    let mut buf = vec![0; BLOCK as usize];
    let error = journal.read(1, u64::from(appended[0].data_offset), &mut buf).unwrap_err();
    assert!(matches!(error, JournalError::Reclaimed { segment: 1 }), "{error}");
    journal.read(2, u64::from(appended[2].data_offset), &mut buf).unwrap();
    assert_eq!(buf, vec![3; BLOCK as usize]);
    // Up to the replay point when everything is archived, an hour after
    // the reclaim before.
    let hour_later = Timestamp::from_unix_nanos(3_600 * Timestamp::NANOS_PER_SECOND);
    journal.reclaim(5, Timestamp::MAX, hour_later).unwrap();
    assert_eq!(segments(&storage).first().map(String::as_str), Some("00000005.seg"));
    // No segment was started since the reclaim before, whose demand is an
    // hour old: two kept (as many as are written ahead), the other segments
    // deleted.
    assert_eq!(spare_names(&storage).len(), 2);
    drop(journal);
    // Recovery from the replay point does not miss the deleted segments.
    let from = JournalPosition { segment: 5, offset: 64 };
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut recovery =
        Journal::recover(shared, "journal", block_size(), config, from, Lsn(9), Timestamp::from_unix_nanos(80))
            .unwrap();
    let mut replayed = 0;
    while recovery.next_record().unwrap().is_some() {
        replayed += 1;
    }
    assert_eq!(replayed, 4);
    let (journal, _) = recovery.finish().unwrap();
    let error = journal.read(3, 64, &mut buf).unwrap_err();
    assert!(matches!(error, JournalError::Reclaimed { segment: 3 }), "{error}");
}

#[test]
fn damage_to_the_last_acknowledged_record_is_corruption_once_a_vouch_covers_it() {
    for vouched in [false, true] {
        let storage = SimStorage::new(SimConfig::default(), 5);
        let journal = journal_on(&storage);
        journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(0), &[1; 512], &mut Vec::new()).unwrap();
        let last =
            journal.append_write(Timestamp::from_unix_nanos(2), BlockIndex(1), &[2; 1024], &mut Vec::new()).unwrap();
        journal.commit().unwrap();
        if vouched {
            assert!(journal.vouch().unwrap(), "two durable records to vouch for");
            assert_eq!(journal.lsn_vouched(), Lsn(2));
            assert!(!journal.vouch().unwrap(), "nothing new to vouch for");
        }
        drop(journal);
        storage.crash();
        // One flipped byte in the last record's blocks: the record is whole.
        storage.corrupt("journal/00000001.seg", u64::from(last.data_offset) + 700, 0x10).unwrap();
        match (vouched, replay_reporting(&storage)) {
            (true, Err(JournalError::Corrupt { reason, .. })) => {
                assert!(reason.contains("not a torn write"), "{reason}")
            }
            (false, Ok((ops, report))) => {
                // Nothing vouches: cut off, but said so, with what and how much.
                assert_eq!(ops.len(), 1);
                let dropped = report.dropped.expect("the tail is reported");
                assert_eq!((dropped.lsn_first, dropped.whole), (Lsn(2), true));
                // The record: past it, the new segment file holds zeros
                // written ahead, which are no record's.
                assert_eq!(dropped.bytes, 64 + 8 + 1024);
                assert!(dropped.reason.contains("damaged"), "{}", dropped.reason);
            }
            (vouched, other) => panic!("vouched {vouched}: unexpected {:?}", other.map(|(ops, _)| ops.len())),
        }
    }
}

/// Issue 13: a direct write torn at any sector boundary. The batch's write
/// starts in the sector where the committed records end (writing their
/// bytes again) and spans many sectors; whatever prefix of its sectors
/// reached the disk, recovery keeps every committed record, then a prefix
/// of the batch's records, never a damaged one, and carries on after it.
#[test]
fn a_direct_write_torn_at_every_sector_boundary_loses_nothing_committed() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    // Odd sizes, so neither the committed records nor the batch end on a sector.
    let ops = |count: usize, rng: &mut StdRng| -> Vec<Op> {
        (0..count)
            .map(|_| {
                if rng.random_bool(0.3) {
                    // Atomic as any record: a torn one is cut off whole.
                    return random_compound(rng, 512);
                }
                let blocks = rng.random_range(1..=9usize);
                Op::Write { block: rng.random_range(0..64), data: vec![rng.random_range(1..=255); blocks * 512] }
            })
            .collect()
    };
    let (committed, batch) = (ops(3, &mut rng), ops(12, &mut rng));
    let config = SimConfig { sector_bytes: 512, ..SimConfig::default() };
    for recycled in [false, true] {
        let (mut sectors, mut tears) = (u64::MAX, 0);
        let mut kept_before = 0;
        while tears <= sectors {
            let what = format!("{} segment torn after {tears} sectors", if recycled { "a recycled" } else { "a new" });
            let storage = SimStorage::new(config, seed);
            let (journal, path, from) = journal_ready(&storage, recycled);
            for (step, op) in committed.iter().enumerate() {
                append(&journal, op, 1_000 + step as u64);
            }
            journal.commit().unwrap();
            let committed_end = journal.position_next().offset.next_multiple_of(4096);
            for (step, op) in batch.iter().enumerate() {
                append(&journal, op, 2_000 + step as u64);
            }
            // Written with one direct write, and not synced: the crash tears it.
            journal.write_out().unwrap();
            let written_end = journal.position_next().offset.next_multiple_of(4096);
            assert_eq!(journal.position_next().segment, from.0.segment, "one segment");
            sectors = (written_end - (committed_end - 4096)) / 512;
            drop(journal);
            storage.crash_tearing_last_write(&path, tears).unwrap();
            let (survivors, journal, _) =
                replay_from(&storage, JournalConfig::default(), from).unwrap_or_else(|error| panic!("{what}: {error}"));
            assert!(survivors.len() >= committed.len(), "{what}: lost committed records");
            let all: Vec<Op> = committed.iter().chain(&batch).cloned().collect();
            assert_eq!(survivors[..], all[..survivors.len()], "{what}: not a prefix");
            assert!(survivors.len() >= kept_before, "{what}: more sectors written never keep fewer records");
            kept_before = survivors.len();
            // The journal carries on after what it kept.
            let op = Op::Zero { block: 1, count: 2 };
            assert_eq!(append(&journal, &op, 3_000), Lsn(from.1 .0 + survivors.len() as u64), "{what}");
            journal.commit().unwrap();
            drop(journal);
            let (again, _, _) = replay_from(&storage, JournalConfig::default(), from).unwrap();
            assert_eq!(again.len(), survivors.len() + 1, "{what}");
            tears += 1;
        }
        assert_eq!(kept_before, committed.len() + batch.len(), "the whole write keeps every record");
        assert!(sectors > 16, "the batch spans many sectors: {sectors}");
    }
}

/// A journal whose next record starts a new segment file, or (`recycled`)
/// goes into a file reused from an earlier segment, still full of that
/// segment's records: the journal, its active segment's path, and the
/// replay point there (the next record's position and LSN).
fn journal_ready(storage: &SimStorage, recycled: bool) -> (Journal, String, (JournalPosition, Lsn)) {
    let config = JournalConfig { segment_bytes_max: 256 << 10, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    if !recycled {
        return (journal, "journal/00000001.seg".to_owned(), (start(), Lsn(1)));
    }
    // Segments 1 and 2 full of records of 0xEE, reclaimed once segment 3 is
    // started (spare-0 and spare-1); segment 4 then reuses segment 1's file.
    let filler = Op::Write { block: 0, data: vec![0xEE; 8 * BLOCK as usize] };
    let mut step = 0;
    while journal.position_next().segment < 4 {
        step += 1;
        append(&journal, &filler, step);
        if journal.position_next().segment == 3 && segments(storage).len() == 3 {
            journal.commit().unwrap();
            assert!(journal.reclaim(3, Timestamp::MAX, Timestamp::MIN).unwrap() > 0);
        }
    }
    journal.commit().unwrap();
    let from = (journal.position_next(), journal.lsn_next());
    assert!(from.0.offset > 64 && from.0.offset < 16 << 10, "{from:?}");
    let names = storage.list_dir("journal").unwrap();
    assert!(names.contains(&"spare-1".to_owned()) && !names.contains(&"spare-0".to_owned()), "{names:?}");
    (journal, "journal/00000004.seg".to_owned(), from)
}

/// Reclaimed segments kept as spares and reused: every committed record
/// survives any crash, what survives is a prefix, and no record a reused
/// file held before is ever taken for one of the journal's, nor reported as
/// a torn write after a clean stop.
#[test]
fn recycled_segments_keep_every_committed_record_and_replay_none_of_their_old_ones() {
    let mut recycled_seen = 0;
    for seed in 0..300u64 {
        let (storage, mut rng, config, journal) = recycling_journal(seed, 3_000..12_000);
        let mut appended = Vec::new();
        let mut committed = 0;
        // The replay point of the last checkpoint.
        let mut from = (start(), Lsn(1));
        let mut clean = false;
        for step in 0..rng.random_range(20..200) {
            let op = random_op(&mut rng);
            append(&journal, &op, step);
            appended.push(op);
            clean = false;
            if rng.random_bool(0.2) {
                committed = journal.commit().unwrap().0 as usize;
                clean = rng.random_bool(0.5);
                if rng.random_bool(0.3) {
                    journal.vouch().unwrap();
                }
            } else if rng.random_bool(0.2) {
                journal.write_out().unwrap();
            }
            reclaim_or_prepare_now_and_then(&journal, &mut rng, &mut from);
        }
        let recycled = segments(&storage).iter().filter(|name| segment_is_recycled(&storage, name)).count();
        recycled_seen += recycled;
        drop(journal);
        storage.crash();
        let (survivors, journal, report) =
            replay_from(&storage, config, from).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        let skipped = from.1 .0 as usize - 1;
        assert!(skipped + survivors.len() >= committed, "seed {seed}: lost committed records");
        assert_eq!(survivors[..], appended[skipped..skipped + survivors.len()], "seed {seed}: not a prefix");
        if clean {
            // Nothing was appended after the last commit.
            assert_eq!(report.dropped, None, "seed {seed}: a clean stop");
        }
        let op = random_op(&mut rng);
        assert_eq!(append(&journal, &op, 1_000), Lsn(from.1 .0 + survivors.len() as u64), "seed {seed}");
        journal.commit().unwrap();
        drop(journal);
        let (again, _, _) = replay_from(&storage, config, from).unwrap();
        assert_eq!(again.len(), survivors.len() + 1, "seed {seed}");
        assert_eq!(again.last(), Some(&op), "seed {seed}");
    }
    assert!(recycled_seen > 100, "segments were reused: {recycled_seen}");
}

/// The test above through several crashes: each recovery hands out the LSNs
/// of what the crash lost again, and no record lost in one crash may come
/// back in a later one (through a segment file reused since, a spare, or a
/// reclaim whose renaming the crash undid).
#[test]
fn records_lost_in_one_crash_stay_lost_through_the_next() {
    for seed in 0..3000u64 {
        let (storage, mut rng, config, mut journal) = recycling_journal(seed, 3_000..8_000);
        // Every record of the journal's history as recovery last left it,
        // from LSN 1.
        let mut history: Vec<Op> = Vec::new();
        let mut committed = 0;
        let mut from = (start(), Lsn(1));
        let mut step = 0;
        for crash in 0..rng.random_range(3..9) {
            for _ in 0..rng.random_range(5..80) {
                step += 1;
                let op = random_op(&mut rng);
                assert_eq!(append(&journal, &op, step).0 as usize, history.len() + 1, "seed {seed}");
                history.push(op);
                if rng.random_bool(0.25) {
                    committed = journal.commit().unwrap().0 as usize;
                    if rng.random_bool(0.3) {
                        journal.vouch().unwrap();
                    }
                } else if rng.random_bool(0.5) {
                    journal.write_out().unwrap();
                }
                reclaim_or_prepare_now_and_then(&journal, &mut rng, &mut from);
            }
            drop(journal);
            storage.crash();
            let (survivors, recovered, _) = replay_from(&storage, config, from)
                .unwrap_or_else(|error| panic!("seed {seed} crash {crash}: {error}"));
            let skipped = from.1 .0 as usize - 1;
            assert!(skipped + survivors.len() >= committed, "seed {seed} crash {crash}: lost committed records");
            assert!(
                survivors[..] == history[skipped..skipped + survivors.len()],
                "seed {seed} crash {crash}: replayed records that are not the history's ({} survivors)",
                survivors.len()
            );
            history.truncate(skipped + survivors.len());
            committed = history.len();
            journal = recovered;
        }
    }
}

/// A seeded journal that reuses segment files: segments of a size in
/// `segment_bytes`, batches of any size, spares kept and written ahead.
fn recycling_journal(seed: u64, segment_bytes: std::ops::Range<u64>) -> (SimStorage, StdRng, JournalConfig, Journal) {
    println!("seed {seed}");
    let storage = SimStorage::new(SimConfig { direct_io: seed.is_multiple_of(2), ..SimConfig::default() }, seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let config = JournalConfig {
        segment_bytes_max: rng.random_range(segment_bytes),
        batch_bytes_max: rng.random_range(64..24_000),
        spare_segments_max: rng.random_range(1..=3),
        spare_after_commits: rng.random_range(0..4),
        ..JournalConfig::default()
    };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    (storage, rng, config, journal)
}

/// Now and then a checkpoint at the durable point, everything before it
/// archived (its segments are reclaimed: `from` moves there); now and then
/// spares written ahead (new segments start in files of zeros).
fn reclaim_or_prepare_now_and_then(journal: &Journal, rng: &mut StdRng, from: &mut (JournalPosition, Lsn)) {
    if rng.random_bool(0.1) {
        let (lsn, position) = journal.durable_point();
        *from = (position, lsn.next());
        journal.reclaim(position.segment, Timestamp::MAX, Timestamp::MIN).unwrap();
    }
    if rng.random_bool(0.1) {
        journal.prepare_spare().unwrap();
    }
}

/// Whether the segment file `name` says it reuses an earlier segment's file.
fn segment_is_recycled(storage: &SimStorage, name: &str) -> bool {
    let file = storage.open_file(&format!("journal/{name}"), rewind_io::OpenMode::Existing).unwrap();
    let mut header = [0; 64];
    file.read_exact_at(&mut header, 0).is_ok()
        && rewind_format::journal::SegmentHeader::decode(&header).is_ok_and(|header| header.recycled)
}

/// Batches written with direct I/O are read from memory until the destager
/// says it has read them; after that from the file, the same bytes. Each
/// commit here writes a batch of its own, so memory holds many, small ones
/// (kept as copies of their records): every read finds its own.
#[test]
fn written_batches_are_read_from_memory_until_forgotten() {
    let storage = Arc::new(rewind_io::CountingStorage::new(Arc::new(SimStorage::new(SimConfig::default(), 9))));
    let shared: Arc<dyn Storage> = Arc::clone(&storage) as Arc<dyn Storage>;
    let journal = Journal::create(shared, "journal", block_size(), JournalConfig::default(), Timestamp::MIN).unwrap();
    let appended: Vec<_> = (0..40u8)
        .map(|i| {
            let data = [i; 1024];
            let appended = journal.append_write(
                Timestamp::from_unix_nanos(1 + u64::from(i)),
                BlockIndex(0),
                &data,
                &mut Vec::new(),
            );
            journal.commit().unwrap();
            appended.unwrap()
        })
        .collect();
    let reads = || storage.counters().stats().reads;
    let read = |i: usize| {
        let mut block = vec![0; 1024];
        journal.read(appended[i].segment, u64::from(appended[i].data_offset), &mut block).unwrap();
        assert_eq!(block, [i as u8; 1024], "record {i}");
    };
    let before = reads();
    (0..appended.len()).rev().for_each(read);
    assert_eq!(reads(), before, "read from memory");
    journal.forget_written(appended[19].lsn);
    (20..appended.len()).for_each(read);
    assert_eq!(reads(), before, "the batches not forgotten are still read from memory");
    (0..20).for_each(read);
    assert_eq!(reads(), before + 20, "the forgotten ones are read from the file");
}

/// Journals that share their memory for written batches keep, together,
/// what it allows: one that writes lets its own oldest go, the others'
/// stay, and a journal dropped gives back what it kept.
#[test]
fn journals_sharing_memory_keep_what_it_allows_together() {
    const BATCH: u64 = 1024;
    let storage = Arc::new(rewind_io::CountingStorage::new(Arc::new(SimStorage::new(SimConfig::default(), 11))));
    let shared: Arc<dyn Storage> = Arc::clone(&storage) as Arc<dyn Storage>;
    // Room for the records of about ten one-block commits.
    let memory = RecentMemory::new(10 * (BATCH + 128));
    let open = |dir: &str| {
        Journal::create(Arc::clone(&shared), dir, block_size(), JournalConfig::default(), Timestamp::MIN)
            .unwrap()
            .sharing_recent_memory(Arc::clone(&memory))
    };
    let write = |journal: &Journal, count: u8| -> Vec<_> {
        (0..count)
            .map(|i| {
                let at = Timestamp::from_unix_nanos(1 + u64::from(i));
                let appended = journal.append_write(at, BlockIndex(0), &[i; BATCH as usize], &mut Vec::new());
                journal.commit().unwrap();
                appended.unwrap()
            })
            .collect()
    };
    let reads = || storage.counters().stats().reads;
    let from_memory = |journal: &Journal, appended: &[rewind_journal::Appended]| {
        let before = reads();
        for (i, appended) in appended.iter().enumerate() {
            let mut block = vec![0; BATCH as usize];
            journal.read(appended.segment, u64::from(appended.data_offset), &mut block).unwrap();
            assert_eq!(block, [i as u8; BATCH as usize], "record {i}");
        }
        appended.len() as u64 - (reads() - before)
    };
    let first = open("first");
    let first_written = write(&first, 6);
    assert_eq!(from_memory(&first, &first_written), 6, "all six kept");
    let second = open("second");
    let second_written = write(&second, 8);
    assert!(memory.used() <= 10 * (BATCH + 128), "within the limit: {}", memory.used());
    assert_eq!(from_memory(&first, &first_written), 6, "the first journal's stay: the second let its own go");
    let kept = from_memory(&second, &second_written);
    assert!((2..=4).contains(&kept), "the second keeps what the first left room for: {kept}");
    drop(first);
    assert!(memory.used() < 5 * (BATCH + 128), "the dropped journal gave its share back: {}", memory.used());
    let third_written = write(&second, 6);
    assert_eq!(from_memory(&second, &third_written), 6, "room again");
    let nothing = RecentMemory::new(0);
    let none = Journal::create(Arc::clone(&shared), "none", block_size(), JournalConfig::default(), Timestamp::MIN)
        .unwrap()
        .sharing_recent_memory(Arc::clone(&nothing));
    let none_written = write(&none, 3);
    assert_eq!(from_memory(&none, &none_written), 0, "no memory: every read from the file");
    assert_eq!(nothing.used(), 0);
}

/// Batches of large writes take at most an eighth of the memory, the
/// oldest leaving first, while batches of small writes written before them
/// stay: read back from the disk, a large write costs one sequential read,
/// a small one a random read each. Whatever left memory reads the same from
/// the file, and `holds_in_memory` says which is which.
#[test]
fn batches_of_large_writes_take_at_most_an_eighth_of_the_memory() {
    const SMALL: usize = BLOCK as usize;
    const LARGE: usize = 64 << 10;
    // A large record and its header, padded: an eighth holds four.
    const LARGE_HELD: u64 = LARGE as u64 + 1024;
    let storage = Arc::new(rewind_io::CountingStorage::new(Arc::new(SimStorage::new(SimConfig::default(), 13))));
    let shared: Arc<dyn Storage> = Arc::clone(&storage) as Arc<dyn Storage>;
    let memory = RecentMemory::new(8 * 4 * LARGE_HELD);
    let journal = Journal::create(shared, "journal", block_size(), JournalConfig::default(), Timestamp::MIN)
        .unwrap()
        .sharing_recent_memory(Arc::clone(&memory));
    // One write a commit, so one batch a write: 40 small ones, then 12 large.
    let sizes: Vec<usize> = [SMALL; 40].into_iter().chain([LARGE; 12]).collect();
    let appended: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let at = Timestamp::from_unix_nanos(1 + i as u64);
            let block = BlockIndex(i as u64 * (LARGE / SMALL) as u64);
            let appended = journal.append_write(at, block, &vec![i as u8; size], &mut Vec::new());
            journal.commit().unwrap();
            appended.unwrap()
        })
        .collect();
    assert!(memory.used() <= 8 * 4 * LARGE_HELD, "within the limit: {}", memory.used());
    let reads = || storage.counters().stats().reads;
    let from_memory: Vec<bool> = appended
        .iter()
        .zip(&sizes)
        .enumerate()
        .map(|(i, (appended, &size))| {
            let before = reads();
            let mut data = vec![0; size];
            journal.read(appended.segment, u64::from(appended.data_offset), &mut data).unwrap();
            assert!(data.iter().all(|&byte| byte == i as u8), "write {i} reads back");
            let held = reads() == before;
            assert_eq!(journal.holds_in_memory(appended.segment, u64::from(appended.data_offset)), held, "write {i}");
            held
        })
        .collect();
    assert!(from_memory[..40].iter().all(|&held| held), "the small writes stay: {from_memory:?}");
    let large_held: Vec<bool> = from_memory[40..].to_vec();
    let kept = large_held.iter().filter(|&&held| held).count();
    assert!((3..=4).contains(&kept), "an eighth holds three or four large writes: {large_held:?}");
    assert!(large_held[12 - kept..].iter().all(|&held| held), "the newest stay: {large_held:?}");
    // The destager's reads of a large write that left memory: the same bytes, from the disk.
    let mut buffer = Vec::new();
    let span =
        journal.read_span(appended[40].segment, u64::from(appended[40].data_offset), LARGE, &mut buffer).unwrap();
    assert!(matches!(span, SpanBytes::Buffer(_)), "read from the file");
    assert!(span.iter().all(|&byte| byte == 40));
    drop(journal);
    assert_eq!(memory.used(), 0, "the dropped journal gave back all it kept");
}

/// The buffers of batches let go serve the next batches of any journal
/// sharing the memory (their pages are already faulted in), within the
/// memory's limit, and those no batch took between two releases are given
/// back, so an idle node does not hold a burst's memory.
#[test]
fn spare_batch_buffers_serve_every_journal_and_idle_ones_are_given_back() {
    // Large enough that a written batch is kept whole, not copied small.
    const BATCH: usize = 64 << 10;
    // A batch's buffer: its records and less than a sector of each padding
    // (and, at most, as much again when its vector grew for them).
    const BUFFER: u64 = BATCH as u64 + 3 * 4096;
    const BUFFER_MAX: u64 = BUFFER + 3 * 4096;
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 12));
    let config = JournalConfig { batch_bytes_max: BATCH, ..JournalConfig::default() };
    let memory = RecentMemory::new(64 * BUFFER_MAX);
    let open = |dir: &str| {
        Journal::create(Arc::clone(&storage), dir, block_size(), config, Timestamp::MIN)
            .unwrap()
            .sharing_recent_memory(Arc::clone(&memory))
    };
    // Full batches, written and kept until forgotten.
    let burst = |journal: &Journal, batches: usize| -> Lsn {
        let records = batches * BATCH / (2 * BLOCK as usize);
        let last = (0..records)
            .map(|i| {
                let at = Timestamp::from_unix_nanos(1 + i as u64);
                journal.append_write(at, BlockIndex(2 * i as u64), &[i as u8; 2 * BLOCK as usize], &mut Vec::new())
            })
            .last()
            .unwrap()
            .unwrap();
        journal.commit().unwrap();
        last.lsn
    };
    let first = open("first");
    let lsn = burst(&first, 10);
    assert_eq!(memory.spare_bytes(), 0, "the burst's batches are all kept");
    first.forget_written(lsn);
    let spare = memory.spare_bytes();
    assert!(spare >= 9 * BUFFER, "the buffers of the burst are kept for reuse: {spare}");
    memory.release_idle_spares();
    assert_eq!(memory.spare_bytes(), spare, "none has waited a whole interval yet");
    let second = open("second");
    burst(&second, 4);
    let taken = spare - memory.spare_bytes();
    assert!(taken >= 3 * BUFFER, "another journal's batches took them: {taken} of {spare}");
    memory.release_idle_spares();
    let left = memory.spare_bytes();
    assert!(left < spare - taken, "what no batch took in the interval is given back: {left}");
    assert!(left > 0, "a few stay: {left}");
    second.forget_written(Lsn(u64::MAX));
    assert!(memory.spare_bytes() > left, "the second journal's batches are spares now");
    memory.release_idle_spares();
    memory.release_idle_spares();
    let kept = memory.spare_bytes();
    assert!((1..=4 * BUFFER_MAX).contains(&kept), "a few buffers stay however idle: {kept}");
    // Within the limit: a journal whose memory keeps nothing keeps no more
    // than a few spares.
    let nothing = RecentMemory::new(0);
    let none = Journal::create(Arc::clone(&storage), "none", block_size(), config, Timestamp::MIN)
        .unwrap()
        .sharing_recent_memory(Arc::clone(&nothing));
    let lsn = burst(&none, 10);
    none.forget_written(lsn);
    assert!(nothing.spare_bytes() <= 4 * BUFFER_MAX, "the limit holds: {}", nothing.spare_bytes());
}

#[test]
fn a_tail_cut_short_is_reported_as_torn() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let journal = journal_on(&storage);
    journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(0), &[1; 512], &mut Vec::new()).unwrap();
    let last = journal.append_write(Timestamp::from_unix_nanos(2), BlockIndex(1), &[2; 512], &mut Vec::new());
    journal.commit().unwrap();
    drop(journal);
    let file = storage.open_file("journal/00000001.seg", rewind_io::OpenMode::Existing).unwrap();
    file.set_len(u64::from(last.unwrap().data_offset) + 100).unwrap();
    file.sync_data().unwrap();
    let (ops, report) = replay_reporting(&storage).unwrap();
    assert_eq!(ops.len(), 1);
    let dropped = report.dropped.expect("reported");
    assert!(!dropped.whole && dropped.reason.contains("past the end"), "{dropped:?}");
}

#[test]
fn a_full_disk_fails_the_append_that_needs_a_segment_and_nothing_else() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let config = JournalConfig { segment_bytes_max: 8_192, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    // The first segment is allocated whole: its appends never need space.
    storage.set_capacity(Some(storage.used_bytes()));
    let data = vec![7; 3 * BLOCK as usize];
    let mut appended = 0;
    let error = loop {
        match journal.append_write(Timestamp::from_unix_nanos(appended + 1), BlockIndex(0), &data, &mut Vec::new()) {
            Ok(_) => appended += 1,
            Err(error) => break error,
        }
    };
    assert!(appended >= 4, "the allocated segment took {appended} records");
    assert!(error.is_transient() && !journal.is_poisoned(), "{error}");
    journal.commit().unwrap();
    assert!(storage.list_dir("journal").unwrap().len() == 1, "no half-made segment is left");
    storage.set_capacity(None);
    journal.append_write(Timestamp::from_unix_nanos(100), BlockIndex(0), &data, &mut Vec::new()).unwrap();
    journal.commit().unwrap();
    drop(journal);
    let (ops, _) = replay(&storage, config).unwrap();
    assert_eq!(ops.len() as u64, appended + 1, "every acknowledged record, in order");
}

#[test]
fn a_repair_replaces_damaged_acknowledged_records_and_keeps_the_ones_after() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let config = JournalConfig { segment_bytes_max: 4_000, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    // Two records per segment: damage one in the middle of segment 2 and
    // the header of segment 4.
    let mut appended = Vec::new();
    for step in 1..=8u64 {
        let data = vec![step as u8; 3 * BLOCK as usize];
        let record =
            journal.append_write(Timestamp::from_unix_nanos(step * 10), BlockIndex(step), &data, &mut Vec::new());
        appended.push(record.unwrap());
        journal.commit().unwrap();
    }
    drop(journal);
    storage.corrupt("journal/00000002.seg", u64::from(appended[2].data_offset) + 5, 0x04).unwrap();
    storage.corrupt("journal/00000004.seg", 20, 0x01).unwrap();
    assert!(matches!(replay(&storage, config), Err(JournalError::Corrupt { .. })), "damage is an error until repaired");
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut recovery =
        Journal::recover(shared, "journal", block_size(), config, start(), Lsn(1), Timestamp::MIN).unwrap().repairing();
    let mut blocks = Vec::new();
    while let Some(record) = recovery.next_record().unwrap() {
        blocks.push(record.header.block_first.0);
    }
    let (_, report) = recovery.finish().unwrap();
    assert_eq!(blocks, vec![1, 2, 4, 5, 6, 7, 8], "record 3 is lost, every other kept");
    assert_eq!(report.lost.len(), 1, "{:?}", report.lost);
    let lost = &report.lost[0];
    assert_eq!((lost.lsn_first, lost.lsn_count), (Lsn(3), 1));
    assert_eq!((lost.after, lost.before), (Timestamp::from_unix_nanos(20), Timestamp::from_unix_nanos(40)));
    // Repaired for good: the next recovery reads the lost record without a word.
    let (ops, _) = replay(&storage, config).unwrap();
    assert_eq!(ops.len(), 7);
}

/// Spares are written ahead only for a journal that takes many commits per
/// segment, up to the most kept, and only with direct I/O; the segment
/// started next takes one, and a crash before its first batch is durable
/// drops nothing.
#[test]
fn spares_are_written_ahead_for_journals_that_commit_often() {
    for direct_io in [true, false] {
        let storage = SimStorage::new(SimConfig { direct_io, ..SimConfig::default() }, 4);
        let config = JournalConfig { segment_bytes_max: 64 << 10, spare_after_commits: 8, ..JournalConfig::default() };
        let journal =
            Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
        let spares = || spare_names(&storage).len();
        let write = |step: u64| {
            journal.append_write(
                Timestamp::from_unix_nanos(step),
                BlockIndex(step),
                &[step as u8; 512],
                &mut Vec::new(),
            )
        };
        for step in 1..8 {
            write(step).unwrap();
            journal.commit().unwrap();
        }
        assert!(!journal.prepare_spare().unwrap(), "seven commits are not enough");
        write(8).unwrap();
        journal.commit().unwrap();
        assert_eq!(journal.prepare_spare().unwrap(), direct_io, "direct I/O: {direct_io}");
        assert_eq!(spares(), usize::from(direct_io));
        if !direct_io {
            continue;
        }
        let spare = storage.open_file("journal/spare-0", rewind_io::OpenMode::Existing).unwrap();
        let mut bytes = vec![1; 64 << 10];
        spare.read_exact_at(&mut bytes, 0).unwrap();
        assert!(bytes.iter().all(|&byte| byte == 0), "a whole segment of zeros");
        assert!(journal.prepare_spare().unwrap());
        assert!(!journal.prepare_spare().unwrap(), "two spares written ahead at most");
        assert_eq!(spares(), 2);
        // Segment 1, a new file that took eight commits, is left at once for
        // segment 2 in a spare; then a crash before its first batch is durable.
        write(9).unwrap();
        assert_eq!(journal.position_next().segment, 2, "a new segment is left early for a spare");
        let step = 10;
        assert_eq!(spares(), 1);
        assert!(segment_is_recycled_after_write(&journal, &storage));
        drop(journal);
        storage.crash();
        let (ops, _, report) = replay_from(&storage, config, (start(), Lsn(1))).unwrap();
        assert!(ops.len() >= 8, "every committed record: {}", ops.len());
        if ops.len() < step as usize - 1 {
            // What the crash cut short is all that is reported dropped.
            let dropped = report.dropped.map_or(0, |dropped| dropped.bytes);
            assert!(dropped < 64 << 10, "the spare's zeros are not a dropped tail: {dropped}");
        }
    }
}

/// Writes the journal out and says whether its newest segment's header has
/// the recycled flag.
fn segment_is_recycled_after_write(journal: &Journal, storage: &SimStorage) -> bool {
    journal.write_out().unwrap();
    let newest = segments(storage).pop().unwrap();
    segment_is_recycled(storage, &newest)
}

/// A reclaim keeps as many spares as the journal started segments between
/// two reclaims in the last hour (up to `spare_segments_max`), and gives
/// the rest back once the demand is older than that, or space runs low.
#[test]
fn reclaim_keeps_as_many_spares_as_the_journal_lately_started_segments() {
    let storage = SimStorage::new(SimConfig::default(), 21);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 4, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let spares = || spare_names(&storage).len();
    // Three 512-byte blocks per record: two records per segment.
    let mut step = 0;
    let minutes = |minutes: u64| Timestamp::from_unix_nanos(minutes * 60 * Timestamp::NANOS_PER_SECOND);
    let mut fill_to = |segment: u32, now: Timestamp| {
        while journal.position_next().segment < segment {
            step += 1;
            let data = vec![step as u8; 3 * BLOCK as usize];
            journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
        }
        journal.commit().unwrap();
        let segment = journal.position_next().segment;
        journal.reclaim(segment, Timestamp::MAX, now).unwrap();
    };
    // Six segments started (2 to 7): four kept, the cap.
    fill_to(7, minutes(0));
    assert_eq!(spares(), 4);
    // Four more, each reusing a spare: four kept again.
    fill_to(11, minutes(1));
    assert_eq!((spares(), segments(&storage).len()), (4, 1));
    // One more, within the hour: the burst's demand still stands.
    fill_to(12, minutes(59));
    assert_eq!(spares(), 4);
    // One more, an hour after the last demand as large: the demand fell to
    // one, and two are kept (as many as are written ahead).
    fill_to(13, minutes(61));
    assert_eq!(spares(), 2);
    // A burst again, then the free space runs low: the spares beyond those
    // written ahead are given back, and the demand forgotten.
    fill_to(17, minutes(62));
    assert_eq!(spares(), 4);
    assert_eq!(journal.give_back_spares().unwrap(), 2 * 4_096);
    assert_eq!(spares(), 2);
    fill_to(18, minutes(63));
    assert_eq!(spares(), 2);
}

/// Spares outlive a restart, crash or not, but not their bytes: recovery
/// makes each read as zeros before any is reused, so no record one held can
/// come back. The first segments after it take them, written ahead as new
/// files are (their blocks are unwritten again); and they stand for the
/// demand until an hour after the first reclaim, which a small burst then
/// does not bring down.
#[test]
fn spares_outlive_a_restart_as_zeros_and_stand_for_the_demand_an_hour() {
    let storage = SimStorage::new(SimConfig::default(), 23);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 8, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let spares = || spare_names(&storage);
    let minutes = |minutes: u64| Timestamp::from_unix_nanos(minutes * 60 * Timestamp::NANOS_PER_SECOND);
    // Three 512-byte blocks per record: two records per segment.
    let mut step = 0;
    let mut fill_to = |journal: &Journal, segment: u32| {
        while journal.position_next().segment < segment {
            step += 1;
            let data = vec![step as u8; 3 * BLOCK as usize];
            journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
        }
        journal.commit().unwrap();
    };
    // Six segments started (2 to 7), reclaimed: six spares, full of records.
    fill_to(&journal, 7);
    journal.reclaim(7, Timestamp::MAX, minutes(0)).unwrap();
    assert_eq!(spares().len(), 6);
    let from = (journal.position_next(), journal.lsn_next());
    drop(journal);
    storage.crash();
    let (replayed, journal, _) = replay_from(&storage, config, from).unwrap();
    assert!(replayed.is_empty(), "nothing after the replay point: {replayed:?}");
    // Durably so, before any reuse: a crash right after recovery finds them
    // zeros.
    drop(journal);
    storage.crash();
    assert_eq!(spares().len(), 6, "kept through the restart");
    for name in spares() {
        let file = storage.open_file(&format!("journal/{name}"), rewind_io::OpenMode::Existing).unwrap();
        let mut bytes = vec![0xFF; file.size_bytes().unwrap() as usize];
        assert!(bytes.len() >= 4_000, "{name}: a whole segment");
        file.read_exact_at(&mut bytes, 0).unwrap();
        assert!(bytes.iter().all(|&byte| byte == 0), "{name} reads as zeros");
    }
    let (_, journal, _) = replay_from(&storage, config, from).unwrap();
    // A small burst after the restart (segments 8 and 9) takes two of them,
    // each written ahead; its reclaim keeps all six.
    fill_to(&journal, 9);
    assert_eq!(spares().len(), 4);
    for name in ["00000008.seg", "00000009.seg"] {
        let file = storage.open_file(&format!("journal/{name}"), rewind_io::OpenMode::Existing).unwrap();
        let mut bytes = [0; 64];
        file.read_exact_at(&mut bytes, 0).unwrap();
        let header = rewind_format::journal::SegmentHeader::decode(&bytes).unwrap();
        assert!(header.recycled && header.written_ahead, "{name}: {header:?}");
    }
    journal.reclaim(9, Timestamp::MAX, minutes(100)).unwrap();
    assert_eq!(spares().len(), 6, "the spares found at opening are the demand");
    // Within the hour after that reclaim the demand stands; past it, a
    // burst of one segment brings it down to the two written ahead.
    fill_to(&journal, 10);
    journal.reclaim(10, Timestamp::MAX, minutes(159)).unwrap();
    assert_eq!(spares().len(), 6);
    fill_to(&journal, 11);
    journal.reclaim(11, Timestamp::MAX, minutes(161)).unwrap();
    assert_eq!(spares().len(), 2);
}

/// A spare that cannot be wiped at opening (the disk is full) is deleted
/// instead: the journal opens, with the others kept.
#[test]
fn a_spare_that_cannot_be_wiped_is_deleted_and_the_journal_opens() {
    let storage = SimStorage::new(SimConfig::default(), 24);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 8, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let spares = || spare_names(&storage).len();
    for step in 1..=10u64 {
        let data = vec![step as u8; 3 * BLOCK as usize];
        journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
    }
    journal.commit().unwrap();
    let segment = journal.position_next().segment;
    journal.reclaim(segment, Timestamp::MAX, Timestamp::MIN).unwrap();
    let before = spares();
    assert!(before >= 3, "spares kept: {before}");
    let from = (journal.position_next(), journal.lsn_next());
    drop(journal);
    storage.fail_writes_as_full(1);
    let (replayed, _journal, _) = replay_from(&storage, config, from).unwrap();
    assert!(replayed.is_empty());
    assert_eq!(spares(), before - 1, "the one the full disk refused to zero is deleted");
}

/// A segment is offered for adoption only once nothing will change it: a
/// later segment has a durable record. A reclaim then deletes the
/// journal's name of an adopted file and never keeps it as a spare, nor
/// counts its bytes as freed; the spare the journal wanted in its place is
/// written ahead, once (unless `spares_for_adopted` is off, or the journal
/// writes without direct I/O).
#[test]
fn a_sealed_segment_is_offered_once_settled_and_an_adopted_one_is_never_a_spare() {
    for (spares_for_adopted, direct_io) in [(true, true), (false, true), (true, false)] {
        println!("spares for adopted {spares_for_adopted}, direct I/O {direct_io}");
        offered_once_settled_and_never_a_spare(spares_for_adopted, direct_io);
    }
}

fn offered_once_settled_and_never_a_spare(spares_for_adopted: bool, direct_io: bool) {
    let storage = SimStorage::new(SimConfig::default(), 22);
    storage.create_dir_all("packs").unwrap();
    let config = JournalConfig {
        segment_bytes_max: 4_000,
        spare_segments_max: 4,
        spares_for_adopted,
        direct_io,
        ..JournalConfig::default()
    };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let at = Timestamp::from_unix_nanos;
    // Three 512-byte blocks per record: two records per segment.
    let write = |step: u64| {
        let data = vec![step as u8; 3 * BLOCK as usize];
        journal.append_write(at(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
    };
    (1..=2).for_each(write);
    assert_eq!(journal.sealed_segment(1).unwrap(), None, "the active segment");
    write(3);
    assert_eq!(journal.position_next().segment, 2);
    assert_eq!(journal.sealed_segment(1).unwrap(), None, "segment 2 has no durable record yet");
    journal.commit().unwrap();
    let path = journal.sealed_segment(1).unwrap().expect("a later segment has a durable record");
    assert_eq!(path, "journal/00000001.seg");
    assert_eq!(journal.sealed_segment(2).unwrap(), None, "the active segment");
    (4..=6).for_each(write);
    journal.commit().unwrap();
    storage.hard_link(&path, "packs/adopted").unwrap();
    let size_bytes = storage.open_file(&path, OpenMode::Existing).unwrap().size_bytes().unwrap();
    // Segments 1 and 2 reclaimed: 2 becomes a spare, 1 only loses its name.
    let freed = journal.reclaim(3, Timestamp::MAX, Timestamp::MIN).unwrap();
    assert_eq!(freed, size_bytes, "segment 2's bytes alone");
    let names = storage.list_dir("journal").unwrap();
    assert_eq!(names.iter().filter(|name| name.starts_with("spare-")).count(), 1, "{names:?}");
    assert!(!names.contains(&"00000001.seg".to_owned()), "{names:?}");
    assert_eq!(storage.link_count("packs/adopted").unwrap(), 1);
    assert_eq!(journal.sealed_segment(1).unwrap(), None, "reclaimed");
    assert_eq!(journal.segment_first(), 3);
    // Two segments were started since the journal began, so two spares
    // are wanted: the adopted file's is written ahead, once (where the
    // journal writes with direct I/O: without it, a new file costs nothing
    // more).
    let spares = |storage: &SimStorage| spare_names(storage).len();
    let owed = spares_for_adopted && direct_io;
    assert_eq!(journal.spares_owed(), usize::from(owed));
    assert_eq!(journal.prepare_spare().unwrap(), owed);
    assert_eq!(journal.spares_owed(), 0);
    assert!(!journal.prepare_spare().unwrap(), "nothing more is owed");
    assert_eq!(spares(&storage), 1 + usize::from(owed));
    // The spare is taken by the next segment; the adopted file keeps its
    // records.
    (7..=8).for_each(write);
    journal.commit().unwrap();
    let mut header = [0; 64];
    storage.open_file("packs/adopted", OpenMode::Existing).unwrap().read_exact_at(&mut header, 0).unwrap();
    let header = rewind_format::journal::SegmentHeader::decode(&header).unwrap();
    assert_eq!((header.segment, header.lsn_first), (1, Lsn(1)));
}

/// Writing a spare ahead meets a full disk: an error that passes, nothing
/// poisoned, no half-written file left, and it works once space is back;
/// what a crash left of an earlier attempt is removed first.
#[test]
fn a_spare_written_ahead_fails_cleanly_on_a_full_disk() {
    let storage = SimStorage::new(SimConfig::default(), 8);
    let config = JournalConfig { segment_bytes_max: 64 << 10, spare_after_commits: 0, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    journal.append_write(Timestamp::from_unix_nanos(1), BlockIndex(0), &[1; 512], &mut Vec::new()).unwrap();
    journal.commit().unwrap();
    // A crash in an earlier attempt left its file.
    let leftover = storage.open_file("journal/spare.preparing", rewind_io::OpenMode::CreateNew).unwrap();
    leftover.write_all_at(&[7; 4096], 0).unwrap();
    drop(leftover);
    storage.set_capacity(Some(storage.used_bytes()));
    let error = journal.prepare_spare().unwrap_err();
    assert!(error.is_transient() && !journal.is_poisoned(), "{error}");
    let names = storage.list_dir("journal").unwrap();
    assert_eq!(segments(&storage).len(), 1);
    assert!(names.iter().all(|name| !name.starts_with("spare")), "nothing half-written is left: {names:?}");
    // The journal goes on.
    journal.append_write(Timestamp::from_unix_nanos(2), BlockIndex(1), &[2; 512], &mut Vec::new()).unwrap();
    journal.commit().unwrap();
    storage.set_capacity(None);
    assert!(journal.prepare_spare().unwrap());
    let names = storage.list_dir("journal").unwrap();
    assert!(names.contains(&"spare-0".to_owned()) && !names.contains(&"spare.preparing".to_owned()), "{names:?}");
}

/// Measuring the journal (a volume's stats) while its writer takes spares
/// for new segments: a spare listed and then taken is no error.
#[test]
fn the_journal_is_measured_while_spares_are_taken() {
    let storage = SimStorage::new(SimConfig::default(), 22);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 4, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let measured = scope.spawn(|| {
            let mut measured = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                journal.size_bytes().unwrap();
                measured += 1;
            }
            measured
        });
        // Three 512-byte blocks per record: two records per segment. Each
        // reclaim turns the segments written into spares, which the next
        // segments take.
        for step in 1..=20_000u64 {
            let data = vec![step as u8; 3 * BLOCK as usize];
            journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
            if step % 16 == 0 {
                journal.commit().unwrap();
                journal.reclaim(journal.position_next().segment, Timestamp::MAX, Timestamp::MIN).unwrap();
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(measured.join().unwrap() > 0);
    });
}

/// A vouch record in the last, partial sector of a segment whose size is
/// not a whole number of sectors, after recovery cut the segment short (a
/// torn tail), on a full disk: its direct write goes to the sector's end,
/// which the segment reserved, and a commit leaves everything appended
/// durable — a checkpoint's replay position is the journal's end and must
/// be on disk. (The engine's model found a checkpoint past the end of the
/// file after a crash: the vouch's write went past the space reserved and
/// failed, and the commit after it, seeing no new record, wrote nothing.)
#[test]
fn a_vouch_record_in_a_segments_last_sector_is_durable_after_a_commit() {
    let storage = SimStorage::new(SimConfig { sector_bytes: 512, ..SimConfig::default() }, 24);
    let config = JournalConfig { segment_bytes_max: 84_000, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let from = (journal.position_next(), Lsn(1));
    let write = |journal: &Journal, step: u64| {
        journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(step), &[step as u8; 512], &mut Vec::new())
    };
    let mut step = 0;
    while journal.position_next().offset < 82_000 {
        step += 1;
        write(&journal, step).unwrap();
        journal.commit().unwrap();
    }
    let committed = step;
    // Written and not synced: the crash tears it, and recovery cuts it off
    // inside the segment's last sector.
    step += 1;
    write(&journal, step).unwrap();
    journal.write_out().unwrap();
    drop(journal);
    storage.crash_tearing_last_write("journal/00000001.seg", 2).unwrap();
    let (survivors, journal, report) = replay_from(&storage, config, from).unwrap();
    assert!(report.truncated_bytes > 0 && survivors.len() == committed as usize, "{report:?}");
    assert!(journal.position_next().offset > 81_920, "in the last sector: {:?}", journal.position_next());
    storage.set_capacity(Some(storage.used_bytes()));
    let vouched = journal.vouch();
    assert!(matches!(vouched, Ok(true)), "the segment reserved its last sector: {vouched:?}");
    journal.commit().unwrap();
    let end = journal.position_next();
    assert_eq!(journal.durable_point().1, end, "everything appended is durable");
    drop(journal);
    storage.crash();
    replay_from(&storage, config, (end, Lsn(committed + 1))).unwrap();
}

/// Three 512-byte blocks per record: two records per segment of 4000 bytes.
fn write_two_per_segment(journal: &Journal, step: u64) {
    let data = vec![step as u8; 3 * BLOCK as usize];
    journal.append_write(Timestamp::from_unix_nanos(step), BlockIndex(0), &data, &mut Vec::new()).unwrap();
}

/// A journal of four records in segments 1 and 2, segment 1 kept as a
/// spare, whose next records start segment 3 in it: the journal and the
/// replay position after record 4.
fn journal_with_a_spare(storage: &SimStorage, config: JournalConfig) -> (Journal, (JournalPosition, Lsn)) {
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    for step in 1..=4 {
        write_two_per_segment(&journal, step);
    }
    journal.commit().unwrap();
    journal.reclaim(2, Timestamp::MAX, Timestamp::MIN).unwrap();
    assert_eq!(spare_names(storage).len(), 1);
    let from = (journal.position_next(), Lsn(5));
    (journal, from)
}

/// A segment started in a spare has its name on disk before any of its
/// records: a crash after they reached the disk finds them under it.
#[test]
fn a_segment_started_in_a_spare_is_named_on_disk_before_its_records() {
    let storage = SimStorage::new(SimConfig { write_survival: 1.0, torn_write: 0.0, ..SimConfig::default() }, 25);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 4, ..JournalConfig::default() };
    let (journal, from) = journal_with_a_spare(&storage, config);
    write_two_per_segment(&journal, 5);
    write_two_per_segment(&journal, 6);
    // Written, not committed.
    journal.write_out().unwrap();
    assert_eq!(journal.position_next().segment, 3);
    drop(journal);
    storage.crash();
    assert_eq!(segments(&storage).last().map(String::as_str), Some("00000003.seg"), "{:?}", segments(&storage));
    let (replayed, _, _) = replay_from(&storage, config, from).unwrap();
    assert_eq!(replayed.len(), 2, "the records that reached the disk are found");
}

/// A spare holding a segment a crash lost (started in it, and its renaming
/// undone, as by a filesystem that does not keep the order above): its
/// records have the LSNs the journal hands out again. Were it taken for
/// that segment once more, and the new records lost in a second crash
/// while the renaming survived, the first crash's lost records would be
/// replayed as written (found by the engine's lineage model, seed 4305:
/// writes lost in one crash came back after the next). Recovery deletes
/// the spares, which nothing tells apart from such a file.
#[test]
fn records_a_crash_lost_never_come_back_from_a_spare() {
    let storage = SimStorage::new(SimConfig { write_survival: 1.0, torn_write: 0.0, ..SimConfig::default() }, 25);
    let config = JournalConfig { segment_bytes_max: 4_000, spare_segments_max: 4, ..JournalConfig::default() };
    let (journal, from) = journal_with_a_spare(&storage, config);
    write_two_per_segment(&journal, 5);
    write_two_per_segment(&journal, 6);
    journal.write_out().unwrap();
    drop(journal);
    storage.crash();
    // The renaming undone.
    storage.rename("journal/00000003.seg", "journal/spare-0").unwrap();
    storage.sync_dir("journal").unwrap();
    let (replayed, journal, _) = replay_from(&storage, config, from).unwrap();
    assert!(replayed.is_empty(), "records 5 and 6 are lost with their segment");
    // The journal hands out LSN 5 again, in segment 3 again; the directory
    // entry is made durable, the records are not.
    write_two_per_segment(&journal, 7);
    journal.write_out().unwrap();
    assert_eq!(journal.position_next().segment, 3);
    drop(journal);
    storage.crash_tearing_last_write("journal/00000003.seg", 0).unwrap();
    let (replayed, _, _) = replay_from(&storage, config, from).unwrap();
    assert!(replayed.is_empty(), "no record lost in a crash comes back: {} replayed", replayed.len());
}

/// A writer that finds too many bytes waiting writes out the oldest batch
/// only (`write_out_oldest`), so it waits for one batch's write rather than
/// for a commit of them all: the bytes waiting drop by one batch, nothing
/// becomes durable, and batch by batch everything reaches the file in
/// order and reads back; a commit then makes it durable.
#[test]
fn a_writer_waiting_for_room_writes_out_the_oldest_batch_only() {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 12));
    let config = JournalConfig { batch_bytes_max: 8 << 10, ..JournalConfig::default() };
    let journal = Journal::create(Arc::clone(&storage) as _, "journal", block_size(), config, Timestamp::MIN).unwrap();
    let appended: Vec<_> = (0..40u8)
        .map(|i| {
            let data = [i; 2 * BLOCK as usize];
            let timestamp = Timestamp::from_unix_nanos(1 + u64::from(i));
            journal.append_write(timestamp, BlockIndex(u64::from(i)), &data, &mut Vec::new()).unwrap()
        })
        .collect();
    let waiting = journal.bytes_unwritten();
    assert!(waiting > 4 * (8 << 10), "several batches wait: {waiting}");

    journal.write_out_oldest().unwrap();
    let after = journal.bytes_unwritten();
    assert!(after < waiting && waiting - after <= 8 << 10, "one batch written out: {waiting} -> {after}");
    assert_eq!(journal.lsn_durable(), Lsn(0), "written out, not committed");
    let mut rounds = 1;
    while journal.bytes_unwritten() > 0 {
        journal.write_out_oldest().unwrap();
        rounds += 1;
        assert!(rounds < 100, "each round writes a batch out");
    }
    assert!(rounds > 4, "batch by batch: {rounds}");
    assert_eq!(journal.lsn_durable(), Lsn(0));
    journal.forget_written(appended.last().unwrap().lsn);
    for (i, record) in appended.iter().enumerate() {
        let mut block = vec![0; 2 * BLOCK as usize];
        journal.read(record.segment, u64::from(record.data_offset), &mut block).unwrap();
        assert!(block.iter().all(|&byte| byte == i as u8), "record {i} reads back from the file");
    }
    assert_eq!(journal.commit().unwrap(), appended.last().unwrap().lsn);
    let (ops, _) = replay(&storage, JournalConfig::default()).unwrap();
    assert_eq!(ops.len(), appended.len(), "every record replays after the commit");
}

/// The destager's and the archiver's spans (`Journal::read_span`):
/// borrowed from the journal's memory while it keeps their batches, then,
/// once only in the file, read with direct I/O — the sectors around them
/// into an aligned part of the buffer — and buffered where the filesystem
/// refuses direct I/O or the file ends mid-sector (a segment cut at a torn
/// tail): the same bytes as `Journal::read` every way. Records of three
/// 512-byte blocks straddle the 4 KiB sectors.
#[test]
fn spans_only_in_the_file_are_read_with_direct_io_and_read_the_same_bytes_every_way() {
    const RECORD: usize = 3 * BLOCK as usize;
    for direct_io in [true, false] {
        let storage = SimStorage::new(SimConfig { direct_io, ..SimConfig::default() }, 21);
        let journal = journal_on(&storage);
        let appended: Vec<_> = (0..64u8)
            .map(|i| {
                let timestamp = Timestamp::from_unix_nanos(1 + u64::from(i));
                journal.append_write(timestamp, BlockIndex(3 * u64::from(i)), &[i; RECORD], &mut Vec::new()).unwrap()
            })
            .collect();
        journal.commit().unwrap();
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Found {
            InMemory,
            Direct,
            Buffered,
        }
        let check = |records: std::ops::Range<usize>, found: Found| {
            let mut buffer = Vec::new();
            for first in records.clone() {
                let last = (first + 2).min(records.end - 1);
                let segment = appended[first].segment;
                assert_eq!(appended[last].segment, segment, "one segment");
                let start = u64::from(appended[first].data_offset);
                let len = (u64::from(appended[last].data_offset) - start) as usize + RECORD;
                let mut expected = vec![0; len];
                journal.read(segment, start, &mut expected).unwrap();
                let span = journal.read_span(segment, start, len, &mut buffer).unwrap();
                assert_eq!(&span[..], &expected[..], "records {first}..={last}, {found:?}");
                assert_eq!(&span[..RECORD], &[first as u8; RECORD][..]);
                let (in_memory, at) = (matches!(span, SpanBytes::Memory(_)), span.as_ptr());
                drop(span);
                let how = match in_memory {
                    true => Found::InMemory,
                    // Direct: the span lies inside the aligned sectors read.
                    false if at != buffer.as_ptr() => Found::Direct,
                    false => Found::Buffered,
                };
                if !start.is_multiple_of(4096) || how == Found::InMemory {
                    assert_eq!(how, found, "records {first}..={last}");
                }
            }
        };
        // Written with direct I/O, the batches stay in memory; written
        // buffered, the page cache keeps them instead.
        check(0..appended.len(), if direct_io { Found::InMemory } else { Found::Buffered });
        journal.forget_written(appended.last().unwrap().lsn);
        check(0..appended.len(), if direct_io { Found::Direct } else { Found::Buffered });
        // The file cut after the last record's data, mid-sector.
        let end = u64::from(appended.last().unwrap().data_offset) + RECORD as u64;
        assert!(!end.is_multiple_of(4096), "the cut falls inside a sector");
        let file = storage.open_file("journal/00000001.seg", rewind_io::OpenMode::Existing).unwrap();
        file.set_len(end).unwrap();
        check(appended.len() - 2..appended.len(), Found::Buffered);
    }
}

/// After kill -9 the page cache still holds what the journal wrote and did
/// not sync, in any number of segments; recovery replays it and builds on
/// it, so it makes every segment it replays durable, not only the last. A
/// power loss after that recovery finds every record it replayed.
#[test]
fn what_recovery_replays_after_a_kill_survives_a_power_loss() {
    let config = SimConfig { write_survival: 0.0, torn_write: 0.0, direct_io: false, ..SimConfig::default() };
    let storage = SimStorage::new(config, 17);
    let config = JournalConfig { segment_bytes_max: 4_000, ..JournalConfig::default() };
    let journal = Journal::create(Arc::new(storage.clone()), "journal", block_size(), config, Timestamp::MIN).unwrap();
    let ops: Vec<Op> =
        (0..24u64).map(|block| Op::Write { block, data: vec![block as u8 + 1; BLOCK as usize] }).collect();
    for (step, op) in ops.iter().enumerate() {
        append(&journal, op, step as u64 + 1);
        journal.write_out().unwrap();
    }
    assert!(segments(&storage).len() >= 3, "{:?}", segments(&storage));
    drop(journal);

    // kill -9: nothing synced, all of it in the page cache.
    let (replayed, recovered, _) = replay_from(&storage, config, (start(), Lsn(1))).unwrap();
    assert_eq!(replayed, ops);
    // Power lost after recovery.
    drop(recovered);
    storage.crash();
    let (replayed, _, _) = replay_from(&storage, config, (start(), Lsn(1))).unwrap();
    assert_eq!(replayed, ops, "what the first recovery replayed is on the disk");
}

/// Starts committing `journal` on a thread of its own, once `storage` holds
/// syncs and `block` is appended: returns the commit's thread once its sync
/// waits at the disk, and the LSN it commits.
fn commit_waiting_at_the_disk(storage: &SimStorage, journal: &Arc<Journal>, block: u64) -> (Committing, Lsn) {
    let lsn = append(journal, &Op::Write { block, data: vec![block as u8; BLOCK as usize] }, block + 1);
    let committing = Arc::clone(journal);
    let commit = std::thread::spawn(move || committing.commit());
    assert!(storage.wait_while_syncs_held(1, 0, Duration::from_secs(30)), "the commit reaches its sync");
    (commit, lsn)
}

type Committing = std::thread::JoinHandle<Result<Lsn, JournalError>>;

/// Holds syncs and starts two commits: the first waits at the disk, and the
/// second has written its batch meanwhile (asserted). Each with its LSN.
fn two_commits_with_the_second_written(
    storage: &SimStorage,
    journal: &Arc<Journal>,
) -> (Committing, Lsn, Committing, Lsn) {
    storage.hold_syncs();
    let (first, first_lsn) = commit_waiting_at_the_disk(storage, journal, 1);
    let writes = storage.writes();
    let second_lsn = append(journal, &Op::Write { block: 2, data: vec![2; BLOCK as usize] }, 3);
    let committing = Arc::clone(journal);
    let second = std::thread::spawn(move || committing.commit());
    assert!(
        storage.wait_while_syncs_held(1, writes + 1, Duration::from_secs(30)),
        "the second batch is written while the first sync waits"
    );
    (first, first_lsn, second, second_lsn)
}

/// A commit that comes while another's sync waits for the disk writes its
/// batch meanwhile, and is durable only with a sync of its own.
#[test]
fn a_commit_writes_its_batch_while_the_sync_before_it_waits_for_the_disk() {
    let storage = SimStorage::new(SimConfig::default(), 21);
    let journal = Arc::new(journal_on(&storage));
    let (first, first_lsn, second, second_lsn) = two_commits_with_the_second_written(&storage, &journal);
    assert!(journal.lsn_durable() < first_lsn, "nothing is durable before its sync returns");
    // (That the second batch is written is the storage's count of writes:
    // the journal lets the batch go from its tail just after the write
    // returns, so `bytes_unwritten` may not be 0 yet.)
    storage.release_syncs();
    assert!(first.join().unwrap().unwrap() >= first_lsn);
    assert!(second.join().unwrap().unwrap() >= second_lsn);
    assert_eq!(journal.lsn_durable(), second_lsn);
    drop(journal);
    storage.crash();
    let (ops, _) = replay(&storage, JournalConfig::default()).unwrap();
    assert_eq!(ops.len(), 2, "both committed records survive the crash");
}

/// A batch written while a sync that then fails waited is not durable
/// either: its commit fails on the poisoned journal.
#[test]
fn a_commit_behind_a_sync_that_fails_fails_too() {
    let storage = SimStorage::new(SimConfig::default(), 22);
    let journal = Arc::new(journal_on(&storage));
    let (first, _, second, _) = two_commits_with_the_second_written(&storage, &journal);
    storage.fail_syncs(1);
    storage.release_syncs();
    assert!(matches!(first.join().unwrap(), Err(JournalError::Io { .. })));
    assert!(matches!(second.join().unwrap(), Err(JournalError::Poisoned)));
    assert_eq!(journal.lsn_durable(), Lsn::ZERO);
}

type Writing = std::thread::JoinHandle<Result<(), JournalError>>;

/// Two writers of a journal of 24 records at a held disk
/// (`two_writers_at_a_held_disk`). Returns when both batches' writes wait
/// there (asserted): written at once. Records of three blocks and a header
/// end their batches inside sectors.
fn two_batches_at_the_disk(seed: u64) -> (Arc<SimStorage>, Arc<Journal>, Vec<Op>, Writing, Writing) {
    let ops: Vec<Op> =
        (0..24u64).map(|i| Op::Write { block: i, data: vec![i as u8 + 1; 3 * BLOCK as usize] }).collect();
    let (storage, journal, first, second) = two_writers_at_a_held_disk(seed, &ops);
    assert!(
        storage.wait_for_writes_held(2, Duration::from_secs(30)),
        "the second batch is written while the first is at the disk"
    );
    (storage, journal, ops, first, second)
}

/// Writes held at the disk (`seed`'s), a new journal of `ops` in batches of
/// at most 8 KiB, and two writers: the first writing every batch out
/// (`write_out`), and, once its first batch waits at the disk (asserted),
/// the second writing the oldest it may take (`write_out_oldest`).
fn two_writers_at_a_held_disk(seed: u64, ops: &[Op]) -> (Arc<SimStorage>, Arc<Journal>, Writing, Writing) {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), seed));
    let config = JournalConfig { batch_bytes_max: 8 << 10, ..JournalConfig::default() };
    let journal =
        Arc::new(Journal::create(Arc::clone(&storage) as _, "journal", block_size(), config, Timestamp::MIN).unwrap());
    for (i, op) in ops.iter().enumerate() {
        append(&journal, op, i as u64 + 1);
    }
    storage.hold_writes();
    let writing_out = Arc::clone(&journal);
    let first = std::thread::spawn(move || writing_out.write_out());
    assert!(storage.wait_for_writes_held(1, Duration::from_secs(30)), "the first batch's write reaches the disk");
    let writing_oldest = Arc::clone(&journal);
    let second = std::thread::spawn(move || writing_oldest.write_out_oldest());
    (storage, journal, first, second)
}

/// Lands the held writes newest first until both writers are done, and
/// checks that neither failed.
fn land_newest_first(storage: &SimStorage, first: Writing, second: Writing) {
    while !(first.is_finished() && second.is_finished()) {
        if !storage.release_newest_write() {
            // Bounded: a writer that is done stops nothing here.
            storage.wait_for_writes_held(1, Duration::from_millis(5));
        }
    }
    storage.release_writes();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
}

/// Commits `journal`, crashes `storage` and checks every one of `ops` replays.
fn every_record_replays_after_a_commit(storage: &SimStorage, journal: Arc<Journal>, ops: &[Op]) {
    assert_eq!(journal.commit().unwrap(), Lsn(ops.len() as u64));
    drop(journal);
    storage.crash();
    let (replayed, _) = replay(storage, JournalConfig::default()).unwrap();
    assert_eq!(replayed.len(), ops.len(), "every committed record replays");
    assert!(replayed == ops, "and replays as it was appended");
}

/// Two writers write two batches at once, and the second, which starts in
/// the sector where the first ends, writes that sector only once the first
/// batch's write has landed. The held disk lands the newest write first: a
/// second batch that wrote its first sector at once would have it wiped by
/// the first batch's write of the same sector (its records' end, then
/// zeros), and its records would not replay.
#[test]
fn batches_written_at_once_land_their_shared_sector_in_order() {
    let (storage, journal, ops, first, second) = two_batches_at_the_disk(23);
    land_newest_first(&storage, first, second);
    assert_eq!(journal.bytes_unwritten(), 0, "every batch is written");
    every_record_replays_after_a_commit(&storage, journal, &ops);
}

/// The batch in front of one written at once fails with an error that
/// passes (a full disk): the batch behind it, waiting to write the sector
/// they share, gives up and is handed out again after it, nothing is
/// poisoned, and the next commit writes both and makes every record durable.
#[test]
fn a_batch_behind_one_whose_write_fails_is_written_again_after_it() {
    let (storage, journal, ops, first, second) = two_batches_at_the_disk(24);
    // The second batch's sectors after the shared one land; it then waits
    // for the first, whose write fails.
    let landed = storage.writes();
    assert!(storage.release_newest_write());
    assert!(storage.wait_for_writes(landed + 1, Duration::from_secs(30)), "the second batch's body lands");
    storage.fail_writes_as_full(1);
    assert!(storage.release_newest_write());
    storage.release_writes();
    let failed = first.join().unwrap();
    assert!(
        matches!(&failed, Err(error) if error.is_transient()),
        "the full disk is the first writer's error: {failed:?}"
    );
    second.join().unwrap().unwrap();
    assert!(!journal.is_poisoned(), "an error that passes poisons nothing");
    assert!(journal.bytes_unwritten() > 0, "the first batch is still to write");
    every_record_replays_after_a_commit(&storage, journal, &ops);
}

/// The size of segment 1's file.
fn first_segment_bytes(storage: &SimStorage) -> u64 {
    storage.open_file("journal/00000001.seg", OpenMode::Existing).unwrap().size_bytes().unwrap()
}

/// Small commits into a new segment file find its blocks written ahead of
/// them (zeros, half a mebibyte ahead at least and one and a half and a
/// sector at most), so that the filesystem converts its unwritten blocks once a
/// mebibyte rather than at every commit; large batches have nothing
/// written ahead. After a crash, recovery takes the zeros for the end of
/// the records, not for a torn tail, and the recovered segment goes on
/// being written ahead.
#[test]
fn small_commits_into_a_new_segment_file_find_its_blocks_written_ahead() {
    const AHEAD_MIN: u64 = 512 << 10;
    const AHEAD_MAX: u64 = (3 << 19) + 4096;
    let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, 32);
    let journal = journal_on(&storage);
    let mut ops = Vec::new();
    let commit_small = |journal: &Journal, ops: &mut Vec<Op>| {
        for _ in 0..600 {
            let op = Op::Write { block: ops.len() as u64, data: vec![ops.len() as u8; 8 * BLOCK as usize] };
            append(journal, &op, ops.len() as u64 + 1);
            ops.push(op);
            journal.commit().unwrap();
            let end = journal.position_next().offset;
            let ahead = first_segment_bytes(&storage) - end;
            assert!((AHEAD_MIN..=AHEAD_MAX).contains(&ahead), "{ahead} bytes written ahead of records ending at {end}");
        }
    };
    commit_small(&journal, &mut ops);
    drop(journal);
    storage.crash();
    let (replayed, journal, report) = replay_from(&storage, JournalConfig::default(), (start(), Lsn(1))).unwrap();
    assert!(replayed == ops, "every committed record replays");
    assert!(report.dropped.is_none() && report.truncated_bytes == 0, "the zeros are no torn tail: {report:?}");
    commit_small(&journal, &mut ops);
    drop(journal);
    storage.crash();
    let (replayed, report) = replay_reporting(&storage).unwrap();
    assert!(replayed == ops && report.dropped.is_none(), "and again after the recovered segment took more");

    let storage = SimStorage::new(SimConfig::default(), 33);
    let journal = journal_on(&storage);
    for block in 0..8u64 {
        append(&journal, &Op::Write { block, data: vec![1; 512 * BLOCK as usize] }, block + 1);
        journal.commit().unwrap();
        let end = journal.position_next().offset;
        assert_eq!(first_segment_bytes(&storage), end.next_multiple_of(4096), "large batches: nothing ahead");
    }
}

/// Zeros written ahead never wipe a later batch's records: a batch that
/// reaches them (a large record right after a small one, in a new segment
/// file) is handed out once they land. The held disk lands the newest
/// write first: were that batch written at once, the zeros would land
/// over it.
#[test]
fn a_batch_that_reaches_the_zeros_written_ahead_is_written_after_them() {
    let ops = vec![
        Op::Write { block: 0, data: vec![1; BLOCK as usize] },
        // 200 KiB, in a batch of its own: past the small batch before it
        // by more than the room left before its zeros.
        Op::Write { block: 1, data: vec![2; 400 * BLOCK as usize] },
    ];
    let (storage, journal, first, second) = two_writers_at_a_held_disk(34, &ops);
    // Given the time to reach the disk beside the small batch's write, the
    // large batch's does not: it waits for the zeros, yet to be written.
    assert!(
        !storage.wait_for_writes_held(2, Duration::from_secs(1)),
        "the large batch is written while the zeros ahead of the small one are not"
    );
    land_newest_first(&storage, first, second);
    assert!(first_segment_bytes(&storage) > 1 << 20, "zeros were written ahead of the small batch");
    every_record_replays_after_a_commit(&storage, journal, &ops);
}

/// Small batches' copies are carved out of slabs (spare batches' buffers,
/// or fresh memory without one), and a filled slab is a spare buffer
/// again once its copies are let go (the destager has read them), for the
/// next batches or slabs instead of fresh memory, whose every page costs a
/// fault.
#[test]
fn small_batches_copies_slabs_are_spare_buffers_again_once_the_copies_are_let_go() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 35));
    let memory = RecentMemory::new(64 << 20);
    let journal = Journal::create(storage, "journal", block_size(), JournalConfig::default(), Timestamp::MIN)
        .unwrap()
        .sharing_recent_memory(Arc::clone(&memory));
    // 400 commits of 4 KiB: copies of 1.6 MiB, more than a fresh slab holds.
    let data = |block: u64| vec![block as u8; 8 * BLOCK as usize];
    let appended: Vec<_> = (1..=400)
        .map(|block| {
            let at = Timestamp::from_unix_nanos(block);
            let appended = journal.append_write(at, BlockIndex(block), &data(block), &mut Vec::new()).unwrap();
            journal.commit().unwrap();
            appended
        })
        .collect();
    assert!(memory.used() >= 400 * 8 * u64::from(BLOCK), "the copies are kept: {} bytes", memory.used());
    for (block, appended) in (1..).zip(&appended) {
        let mut read = vec![0; 8 * BLOCK as usize];
        journal.read(appended.segment, u64::from(appended.data_offset), &mut read).unwrap();
        assert!(read == data(block), "copy {block} holds its records");
    }
    let spares_while_kept = memory.spare_bytes();
    journal.forget_written(Lsn(400));
    assert_eq!(memory.used(), 0, "every copy is let go");
    assert!(
        memory.spare_bytes() >= spares_while_kept + (1 << 20),
        "the filled slabs are spare buffers again: {} bytes, {spares_while_kept} before",
        memory.spare_bytes()
    );
}
