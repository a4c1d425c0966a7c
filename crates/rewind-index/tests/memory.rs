//! The memory of memtables written as runs is reused by the next while
//! versions keep coming, and given back once they slow to a trickle.

use std::sync::Arc;

use rewind_index::{IndexConfig, PageCache, VersionIndex};
use rewind_io::{SimConfig, SimStorage, Storage};
use rewind_types::{BlockIndex, Lsn, Timestamp, Version, VersionData};

/// Inserts `count` versions of blocks from 0 at time `lsn`, as record `lsn`.
fn insert(index: &VersionIndex, lsn: u64, count: u64) {
    let versions: Vec<Version> = (0..count)
        .map(|block| Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(lsn),
            data: VersionData::Zero,
            crc32c: 0,
        })
        .collect();
    index.insert(Lsn(lsn), &versions);
}

fn seal_and_persist(index: &VersionIndex, lsn: u64) {
    index.seal();
    assert_eq!(index.persist(Lsn(lsn)).unwrap(), 1);
}

#[test]
fn a_written_memtable_serves_the_next_and_a_quiet_index_lets_it_go() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 1));
    let index = VersionIndex::create(storage, "index", IndexConfig::default(), PageCache::new(1 << 20)).unwrap();
    let memory = || index.stats().memory_bytes;
    const FULL: u64 = 10_000;
    insert(&index, 1, FULL);
    let one_memtable = memory();
    seal_and_persist(&index, 1);
    assert!(memory() >= one_memtable, "the written memtable is kept: {} < {one_memtable}", memory());
    insert(&index, 2, FULL);
    let two_memtables = memory();
    assert!(two_memtables >= 2 * one_memtable, "{two_memtables} for the spare and the active memtable");
    // From here on, full memtables take turns in the same memory.
    for lsn in 3..8 {
        seal_and_persist(&index, lsn - 1);
        insert(&index, lsn, FULL);
        // Beyond the runs' fences, a few bytes each.
        let grown = memory() - two_memtables;
        assert!(grown < one_memtable / 10, "record {lsn} took {grown} bytes of new memory");
    }
    assert_eq!(index.find_le(FULL - 1, Timestamp::MAX).unwrap().unwrap().timestamp, Timestamp::from_unix_nanos(7));
    // A trickle: checkpoints of a few versions let the large memtables go.
    for lsn in 8..11 {
        seal_and_persist(&index, lsn - 1);
        insert(&index, lsn, 3);
    }
    assert!(memory() < one_memtable / 4, "{} still held by a quiet index", memory());
}
