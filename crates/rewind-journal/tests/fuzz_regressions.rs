//! Journals the `journal_record` fuzz target made (inputs kept in
//! `fuzz/regressions/journal_record/`): recovering or repairing one is an
//! answer or an error, never a panic.

use std::sync::Arc;

use rewind_format::journal::{append_write_record, append_zero_record, RecordStamp, SegmentHeader};
use rewind_format::meta::JournalPosition;
use rewind_io::{OpenMode, SimConfig, SimStorage, Storage};
use rewind_journal::{Journal, JournalConfig, JournalError};
use rewind_types::{BlockIndex, BlockSize, Lsn, Timestamp};

fn file(storage: &dyn Storage, path: &str, bytes: &[u8]) {
    let file = storage.open_file(path, OpenMode::CreateNew).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file.sync_data().unwrap();
}

#[test]
fn a_damaged_tail_of_part_of_an_8_byte_unit_is_not_repaired_by_a_panic() {
    let block_size = BlockSize::new(512).unwrap();
    let stamp = |lsn: u64, lsn_committed: u64| RecordStamp {
        block_size,
        lsn: Lsn(lsn),
        lsn_committed: Lsn(lsn_committed),
        timestamp: Timestamp::from_unix_nanos(lsn),
        block_first: BlockIndex(0),
        revert: None,
    };
    let header = |segment, lsn_first| {
        SegmentHeader {
            segment,
            block_size,
            lsn_first: Lsn(lsn_first),
            timestamp_before: Timestamp::MIN,
            recycled: false,
            written_ahead: false,
        }
        .encode()
    };
    // Segment 1: record 1, damaged, then 7 more bytes: 95 bytes after the
    // segment header, not whole 8-byte units.
    let mut first = header(1, 1).to_vec();
    append_write_record(&mut first, &mut Vec::new(), stamp(1, 0), &[7; 512]);
    first[100] ^= 1;
    first.truncate(64 + 88);
    first.extend_from_slice(&[0xAB; 7]);
    // Segment 2 starts at LSN 2 with an intact record that says LSN 1 was
    // durable: record 1 was acknowledged, so repair (not truncation) it is.
    let mut second = header(2, 2).to_vec();
    append_zero_record(&mut second, stamp(2, 1), 1);
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 1));
    storage.create_dir_all("journal").unwrap();
    file(&*storage, "journal/00000001.seg", &first);
    file(&*storage, "journal/00000002.seg", &second);

    let from = JournalPosition { segment: 1, offset: 64 };
    let config = JournalConfig::default();
    let recovery =
        Journal::recover(Arc::clone(&storage), "journal", block_size, config, from, Lsn(1), Timestamp::MIN).unwrap();
    let mut recovery = recovery.repairing();
    let error = loop {
        match recovery.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a damaged acknowledged record recovered without a word"),
            Err(error) => break error,
        }
    };
    assert!(matches!(error, JournalError::Corrupt { .. }), "{error}");
    assert!(error.to_string().contains("cannot be replaced by a lost record"), "{error}");
}
