//! A version index run opened from fuzzed bytes through the real index:
//! `VersionIndex::open` over in-memory storage holding the run and a manifest
//! that lists it (with the header's own counts, so the run is read, not
//! refused by the manifest), then lookups and a full scan.
//!
//! The first byte picks whether checksums (header page, data pages, fence)
//! are sealed first — and page numbers and counts made consistent — so that
//! the checks behind them are reached, and whether the index takes late
//! entries (the COW layout). The next bytes choose the lookups.
//!
//! Properties: no panic; memory in proportion to the file, whatever its
//! header claims; a lookup answers only with a version of the block asked
//! for, at or before the time asked for; a run whose every checksum holds
//! and whose pages the header describes scans without error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_format::index::{ENTRIES_PER_PAGE, ENTRY_BYTES, FENCE_KEY_BYTES, PAGE_BYTES};
use rewind_format::meta::{IndexManifest, RunInfo};
use rewind_fuzz::{assert_heap_follows_input, le_u64, peak_heap_bytes, seal_crc, storage_with, Cursor};
use rewind_index::{IndexConfig, PageCache, VersionIndex};
use rewind_io::Storage;
use rewind_types::{Lsn, Timestamp};

const CHECKSUM_OFFSET: usize = PAGE_BYTES - 4;
const TRAILER_OFFSET: usize = ENTRIES_PER_PAGE * ENTRY_BYTES;

/// Seals the run's checksums; with `normalize`, first makes the header's page
/// count and each page's number and count agree with the bytes there are.
fn seal(run: &mut [u8], normalize: bool) {
    let pages = run.len().saturating_sub(PAGE_BYTES) / PAGE_BYTES;
    if normalize && run.len() >= PAGE_BYTES {
        let entry_count = le_u64(run, 8).unwrap_or(0);
        let data_page_count = entry_count.div_ceil(ENTRIES_PER_PAGE as u64);
        run[16..24].copy_from_slice(&data_page_count.to_le_bytes());
        for page in 0..pages.min(data_page_count as usize) {
            let at = (1 + page) * PAGE_BYTES;
            let left = entry_count - (page * ENTRIES_PER_PAGE) as u64;
            let count = left.min(ENTRIES_PER_PAGE as u64) as u32;
            run[at + TRAILER_OFFSET..at + TRAILER_OFFSET + 4].copy_from_slice(&count.to_le_bytes());
            run[at + TRAILER_OFFSET + 8..at + TRAILER_OFFSET + 16].copy_from_slice(&(page as u64).to_le_bytes());
        }
    }
    for page in 0..pages {
        let at = (1 + page) * PAGE_BYTES;
        seal_crc(run, at..at + CHECKSUM_OFFSET, at + CHECKSUM_OFFSET);
    }
    // The fence follows the data pages the header counts.
    if let Some(data_page_count) = le_u64(run, 16) {
        let fence = usize::try_from(data_page_count)
            .ok()
            .and_then(|count| count.checked_add(1)?.checked_mul(PAGE_BYTES))
            .zip(usize::try_from(data_page_count).ok().and_then(|count| count.checked_mul(FENCE_KEY_BYTES)));
        if let Some((start, length)) = fence {
            if let Some(end) = start.checked_add(length).filter(|&end| end <= run.len()) {
                let crc = rewind_format::crc32c(&run[start..end]);
                run[40..44].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }
    seal_crc(run, 0..CHECKSUM_OFFSET, CHECKSUM_OFFSET);
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let late_entries = mode & 4 != 0;
    let lookups: Vec<(u64, u64)> = (0..4).map(|_| (u64::from(input.u16()), input.u64())).collect();
    let mut run = input.rest().to_vec();
    if mode & 1 != 0 {
        seal(&mut run, mode & 2 != 0);
    }
    // The manifest lists the run with what its header says.
    let field = |at| le_u64(&run, at).unwrap_or(0);
    let info = RunInfo {
        id: 1,
        entry_count: field(8),
        timestamp_min: Timestamp::from_unix_nanos(field(24)),
        timestamp_max: Timestamp::from_unix_nanos(field(32)),
    };
    let manifest = IndexManifest {
        lsn_indexed: Lsn(1),
        run_id_next: 2,
        versions_thinned: 0,
        archived_before: Timestamp::MIN,
        runs: vec![info],
        late_entries,
    };
    let storage = storage_with(&[("index/manifest", &manifest.encode()), ("index/0000000001.run", &run)]);
    let config = IndexConfig { late_entries, ..IndexConfig::default() };
    let (result, peak) = peak_heap_bytes(|| {
        let index = VersionIndex::open(storage.clone(), "index", config, PageCache::new(1 << 20))?;
        let mut answers = Vec::new();
        for &(block, at) in &lookups {
            let blocks = [block / 2, block, block + 1];
            let at = Timestamp::from_unix_nanos(at);
            answers.push((blocks, at, index.find_le_many(&blocks, at)));
        }
        let mut scanned = 0u64;
        let scan = index.for_each_version(&mut |_| {
            scanned += 1;
            Ok(())
        });
        Ok::<_, rewind_index::IndexError>((answers, scan.map(|_chunk_epoch| scanned)))
    });
    // The page cache holds at most 16 pages here; the rest follows the file.
    assert_heap_follows_input(peak, run.len(), 3, 256 << 10);
    let Ok((answers, scan)) = result else { return };
    for (blocks, at, found) in answers {
        let Ok(found) = found else { continue };
        for (block, version) in blocks.iter().zip(found) {
            if let Some(version) = version {
                assert_eq!(version.block.0, *block, "a lookup of block {block} answered another block");
                assert!(version.timestamp <= at, "a lookup at {at:?} answered a later version");
            }
        }
    }
    if let Ok(scanned) = scan {
        assert!(scanned <= field(16).saturating_mul(ENTRIES_PER_PAGE as u64), "more versions than pages hold");
    }
    let _ = storage.exists("index/manifest");
});
