//! The dedup index's runs: one or two run files from fuzzed bytes, listed by
//! a manifest with their headers' entry counts, opened by the real dedup
//! index, looked up, and merged (fan-in 2, as after archiving).
//!
//! The first byte picks whether checksums (header, pages, fence, Bloom
//! filter) are sealed first, and whether page numbers and counts are made
//! consistent with the header, so that the checks behind them are reached.
//!
//! Properties: no panic; memory in proportion to the files, whatever their
//! headers claim; a lookup answers only ids that some page of the runs pairs
//! with the hash looked up; a merge loses no entry that a lookup found.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use rewind_chunks::fuzzing::dedup_lookups_then_merge;
use rewind_chunks::DedupConfig;
use rewind_format::chunks::{
    decode_dedup_page, DedupManifest, DedupRunInfo, DEDUP_ENTRIES_PER_PAGE, DEDUP_ENTRY_BYTES, DEDUP_PAGE_BYTES,
};
use rewind_fuzz::{assert_heap_follows_input, le_u64, peak_heap_bytes, seal_crc, storage_with, Cursor};
use rewind_io::Storage;

const CHECKSUM_OFFSET: usize = DEDUP_PAGE_BYTES - 4;
const TRAILER_OFFSET: usize = DEDUP_ENTRIES_PER_PAGE * DEDUP_ENTRY_BYTES;

/// A byte range of `length` at page `pages` (1 + data pages) plus `extra`,
/// if it lies within `size`.
fn span(start: Option<usize>, length: Option<usize>, size: usize) -> Option<std::ops::Range<usize>> {
    let (start, length) = (start?, length?);
    let end = start.checked_add(length).filter(|&end| end <= size)?;
    Some(start..end)
}

fn seal(run: &mut [u8], normalize: bool) {
    let pages = run.len().saturating_sub(DEDUP_PAGE_BYTES) / DEDUP_PAGE_BYTES;
    if normalize && run.len() >= DEDUP_PAGE_BYTES {
        let entry_count = le_u64(run, 8).unwrap_or(0);
        let data_page_count = entry_count.div_ceil(DEDUP_ENTRIES_PER_PAGE as u64);
        run[16..24].copy_from_slice(&data_page_count.to_le_bytes());
        for page in 0..pages.min(data_page_count as usize) {
            let at = (1 + page) * DEDUP_PAGE_BYTES + TRAILER_OFFSET;
            let count = (entry_count - (page * DEDUP_ENTRIES_PER_PAGE) as u64).min(DEDUP_ENTRIES_PER_PAGE as u64);
            run[at..at + 4].copy_from_slice(&(count as u32).to_le_bytes());
            run[at + 4..at + 12].copy_from_slice(&(page as u64).to_le_bytes());
        }
    }
    for page in 0..pages {
        let at = (1 + page) * DEDUP_PAGE_BYTES;
        seal_crc(run, at..at + CHECKSUM_OFFSET, at + CHECKSUM_OFFSET);
    }
    let data_page_count = le_u64(run, 16).and_then(|count| usize::try_from(count).ok());
    let fence_start = data_page_count.and_then(|count| count.checked_add(1)?.checked_mul(DEDUP_PAGE_BYTES));
    let fence_length = data_page_count.and_then(|count| count.checked_mul(8));
    if let Some(fence) = span(fence_start, fence_length, run.len()) {
        let crc = rewind_format::crc32c(&run[fence.clone()]);
        run[36..40].copy_from_slice(&crc.to_le_bytes());
        let bloom_length = le_u64(run, 24).and_then(|bits| usize::try_from(bits / 8).ok());
        if let Some(bloom) = span(Some(fence.end), bloom_length, run.len()) {
            let crc = rewind_format::crc32c(&run[bloom]);
            run[40..44].copy_from_slice(&crc.to_le_bytes());
        }
    }
    seal_crc(run, 0..CHECKSUM_OFFSET, CHECKSUM_OFFSET);
}

/// Every (hash, id) pair in a page of `run` that decodes.
fn pairs(run: &[u8], into: &mut BTreeSet<([u8; 32], u64)>) {
    let mut entries = Vec::new();
    for (number, page) in run.chunks_exact(DEDUP_PAGE_BYTES).skip(1).enumerate() {
        if decode_dedup_page(page, number as u64, &mut entries).is_ok() {
            into.extend(entries.iter().map(|entry| (entry.hash, entry.id.0)));
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let probes: Vec<[u8; 32]> = (0..2).map(|_| std::array::from_fn(|_| input.u8())).collect();
    let mut runs: Vec<Vec<u8>> = vec![input.until(b"NEXTRUN").to_vec()];
    if mode & 4 != 0 {
        runs.push(input.rest().to_vec());
    }
    if mode & 1 != 0 {
        for run in &mut runs {
            seal(run, mode & 2 != 0);
        }
    }
    // Look up what the pages hold, and the probes.
    let mut present = BTreeSet::new();
    for run in &runs {
        pairs(run, &mut present);
    }
    let mut hashes: Vec<[u8; 32]> = present.iter().map(|(hash, _)| *hash).take(8).collect();
    hashes.extend(probes);
    let manifest = DedupManifest {
        packs_covered: 0,
        run_id_next: runs.len() as u64 + 1,
        runs: runs
            .iter()
            .enumerate()
            .map(|(index, run)| DedupRunInfo { id: index as u64 + 1, entry_count: le_u64(run, 8).unwrap_or(0).max(1) })
            .collect(),
    };
    let manifest = manifest.encode();
    let names: Vec<String> = (1..=runs.len()).map(|id| format!("chunks/dedup/{id:010}.run")).collect();
    let mut files: Vec<(&str, &[u8])> = vec![("chunks/dedup/manifest", &manifest)];
    files.extend(names.iter().map(String::as_str).zip(runs.iter().map(Vec::as_slice)));
    let storage: Arc<dyn Storage> = storage_with(&files);
    let config = DedupConfig { memtable_entries_max: 16, merge_fanin: 2, ..DedupConfig::default() };
    let total: usize = runs.iter().map(Vec::len).sum();
    let (found, peak) =
        peak_heap_bytes(|| dedup_lookups_then_merge(Arc::clone(&storage), "chunks/dedup", config, &hashes));
    // A merge writes a run as large as its inputs, Bloom filter included.
    assert_heap_follows_input(peak, total, 6, 2 << 20);
    let Ok(found) = found else { return };
    for (hash, ids) in hashes.iter().zip(&found) {
        for id in ids {
            assert!(present.contains(&(*hash, id.0)), "looked up an id no page pairs with the hash");
        }
    }
    // After the merge the same lookups find at least the same ids.
    let again = dedup_lookups_then_merge(storage, "chunks/dedup", config, &hashes);
    let again = again.unwrap_or_else(|error| panic!("the index a merge left does not open or look up: {error}"));
    for ((hash, before), after) in hashes.iter().zip(&found).zip(&again) {
        for id in before {
            assert!(after.contains(id), "the merge lost {id:?} for {hash:?}");
        }
    }
});
