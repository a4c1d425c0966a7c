//! Runs whose checksums all hold but whose parts disagree, as the
//! `index_run` fuzz target made them (inputs kept in
//! `fuzz/regressions/index_run/`): opening or reading one is corruption,
//! never a panic or an allocation the file cannot back.

use std::sync::Arc;

use rewind_format::index::PAGE_BYTES;
use rewind_format::meta::{IndexManifest, RunInfo};
use rewind_index::{IndexConfig, IndexError, PageCache, VersionIndex};
use rewind_io::{read_file, write_file_atomic, SimConfig, SimStorage, Storage};
use rewind_types::{BlockIndex, Lsn, Timestamp, Version, VersionData};

const RUN: &str = "index/0000000001.run";

/// An index with one run of three pages (300 versions, two per block).
fn index_with_one_run() -> Arc<dyn Storage> {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 1));
    let index =
        VersionIndex::create(Arc::clone(&storage), "index", IndexConfig::default(), PageCache::new(1 << 20)).unwrap();
    for i in 0..300u64 {
        let version = Version {
            block: BlockIndex(i / 2),
            timestamp: Timestamp::from_unix_nanos(1000 + i),
            data: VersionData::Zero,
            crc32c: 0,
        };
        index.insert(Lsn(i + 1), &[version]);
    }
    index.seal();
    index.persist(Lsn(300)).unwrap();
    storage
}

fn seal(run: &mut [u8], range: std::ops::Range<usize>, at: usize) {
    let crc = rewind_format::crc32c(&run[range]);
    run[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn open(storage: &Arc<dyn Storage>) -> Result<VersionIndex, IndexError> {
    VersionIndex::open(Arc::clone(storage), "index", IndexConfig::default(), PageCache::new(1 << 20))
}

#[test]
fn a_page_that_disagrees_with_its_fence_is_corruption() {
    let storage = index_with_one_run();
    let mut run = read_file(&*storage, RUN).unwrap();
    // The fence says page 1 starts one nanosecond before it does.
    let page_1 = 2 * PAGE_BYTES;
    let (block, time) = (u64_at(&run, page_1), u64_at(&run, page_1 + 8));
    let fence_key_1 = 4 * PAGE_BYTES + 16;
    run[fence_key_1 + 8..fence_key_1 + 16].copy_from_slice(&(time - 1).to_le_bytes());
    seal(&mut run, 4 * PAGE_BYTES..4 * PAGE_BYTES + 48, 40);
    seal(&mut run, 0..PAGE_BYTES - 4, PAGE_BYTES - 4);
    write_file_atomic(&*storage, RUN, &run).unwrap();

    let index = open(&storage).expect("every checksum holds");
    let error = index.find_le(block, Timestamp::from_unix_nanos(time - 1)).unwrap_err();
    assert!(error.to_string().contains("the fence says"), "{error}");
}

#[test]
fn a_header_counting_more_pages_than_the_file_holds_is_corruption() {
    let storage = index_with_one_run();
    let mut run = read_file(&*storage, RUN).unwrap();
    let entry_count = 1u64 << 50;
    run[8..16].copy_from_slice(&entry_count.to_le_bytes());
    run[16..24].copy_from_slice(&entry_count.div_ceil(127).to_le_bytes());
    seal(&mut run, 0..PAGE_BYTES - 4, PAGE_BYTES - 4);
    write_file_atomic(&*storage, RUN, &run).unwrap();
    // The manifest agrees with the header, so the run is read.
    let mut manifest = IndexManifest::decode(&read_file(&*storage, "index/manifest").unwrap()).unwrap();
    manifest.runs = vec![RunInfo { entry_count, ..manifest.runs[0] }];
    write_file_atomic(&*storage, "index/manifest", &manifest.encode()).unwrap();

    let error = open(&storage).err().expect("a run that cannot be");
    assert!(error.to_string().contains("cannot hold the"), "{error}");
}
