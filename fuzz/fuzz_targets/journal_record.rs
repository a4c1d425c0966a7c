//! The journal's bytes: a record (header, CRC area, copy entries, blocks), a
//! segment header, and the recovery scan over whole segment files.
//!
//! The first byte picks what the rest is, and whether checksums are sealed
//! first (so the fuzzer gets past them to the checks behind) or left as
//! they are (so it tries to get damage accepted).
//!
//! Properties: decoding never panics and holds memory in proportion to the
//! input; what is accepted decodes again the same after re-encoding, and any
//! one flipped bit of an accepted record or header is rejected; recovery
//! (or a repair, which replaces damaged acknowledged records by lost ones)
//! either replays records in LSN order and cuts a torn tail, or reports
//! corruption — and a second recovery of what the first left replays the
//! same records and cuts nothing.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use rewind_format::journal::{
    append_compound_record, append_copy_record, append_vouch_record, append_write_record, append_zero_record,
    compound_extents, copy_entries, encode_lost_record, split_compound_payload, RecordHeader, RecordKind, RecordStamp,
    SegmentHeader, RECORD_HEADER_BYTES, RECORD_MAGIC, SEGMENT_HEADER_BYTES,
};
use rewind_format::meta::JournalPosition;
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, seal_crc, storage_with, Cursor};
use rewind_io::Storage;
use rewind_journal::{Journal, JournalConfig, JournalError};
use rewind_types::{BlockSize, Lsn, Timestamp};

const CHECKSUM_OFFSET: usize = 60;

/// Seals one record at the start of `bytes` if its header decodes and it
/// fits: each block's CRC, then the header's. Returns its length.
fn seal_record(bytes: &mut [u8]) -> Option<usize> {
    let header = RecordHeader::decode(bytes).ok()?;
    let length = usize::try_from(header.record_bytes()).ok().filter(|&length| length <= bytes.len())?;
    if matches!(header.kind, RecordKind::Write | RecordKind::Compound) {
        let block_bytes = header.block_size.bytes() as usize;
        let crcs = RECORD_HEADER_BYTES + header.block_crcs_offset();
        for index in 0..header.block_count as usize {
            let at = header.data_offset() + index * block_bytes;
            seal_crc(bytes, at..at + block_bytes, crcs + 4 * index);
        }
    }
    let crc = rewind_format::crc32c_append(
        rewind_format::crc32c(&bytes[..CHECKSUM_OFFSET]),
        &bytes[RECORD_HEADER_BYTES..header.data_offset()],
    );
    bytes[CHECKSUM_OFFSET..RECORD_HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Some(length)
}

fn stamp(header: &RecordHeader) -> RecordStamp {
    RecordStamp {
        block_size: header.block_size,
        lsn: header.lsn,
        lsn_committed: header.lsn_committed,
        timestamp: header.timestamp,
        block_first: header.block_first,
        revert: header.revert,
    }
}

/// Decodes one record fully (header, checksum, copy entries, blocks).
fn decode_record(bytes: &[u8]) -> Option<RecordHeader> {
    let header = RecordHeader::decode(bytes).ok()?;
    let area = bytes.get(RECORD_HEADER_BYTES..header.data_offset())?;
    RecordHeader::verify(&bytes[..RECORD_HEADER_BYTES], area).ok()?;
    match header.kind {
        RecordKind::Copy => _ = copy_entries(area).ok()?,
        RecordKind::Compound => _ = compound_extents(&header, area).ok()?,
        _ => {}
    }
    Some(header)
}

fn record(bytes: &[u8]) {
    let (header, peak) = peak_heap_bytes(|| decode_record(bytes));
    assert_heap_follows_input(peak, bytes.len(), 2, 1024);
    let Some(header) = header else { return };
    let area = &bytes[RECORD_HEADER_BYTES..header.data_offset()];
    // Re-encoding what was accepted gives a record that decodes the same.
    let mut encoded = Vec::new();
    match header.kind {
        RecordKind::Zero => append_zero_record(&mut encoded, stamp(&header), header.block_count),
        RecordKind::Copy => append_copy_record(&mut encoded, stamp(&header), &copy_entries(area).expect("decoded")),
        RecordKind::Vouch => append_vouch_record(&mut encoded, stamp(&header)),
        RecordKind::Lost => {
            let stamp = RecordStamp { block_first: rewind_types::BlockIndex(0), ..stamp(&header) };
            encoded = encode_lost_record(stamp, header.block_count, header.record_bytes());
        }
        RecordKind::Write => {
            let Some(data) = bytes.get(header.data_offset()..header.record_bytes() as usize) else { return };
            append_write_record(&mut encoded, &mut Vec::new(), stamp(&header), data);
        }
        RecordKind::Compound => {
            let Some(data) = bytes.get(header.data_offset()..header.record_bytes() as usize) else { return };
            let extents = compound_extents(&header, area).expect("decoded");
            let slices = split_compound_payload(&extents, data, header.block_size.bytes() as usize);
            append_compound_record(&mut encoded, &mut Vec::new(), stamp(&header), &extents, &slices);
        }
    }
    assert_eq!(decode_record(&encoded), Some(header), "re-encoded record decodes differently");
    if header.kind == RecordKind::Copy {
        let again = copy_entries(&encoded[RECORD_HEADER_BYTES..header.data_offset()]).expect("re-encoded");
        assert_eq!(again, copy_entries(area).expect("decoded"), "copy entries changed in a round trip");
    }
    // A single flipped bit of the checksummed part is caught. Not in the
    // kind, block size, block count or (a lost record's padding) first
    // block: those move where the CRC area ends, and the fuzzer, seeing the
    // CRC compared, learns to fit one there.
    let framing = [4, 5, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35];
    let flippable: Vec<usize> = (0..header.data_offset()).filter(|byte| !framing.contains(byte)).collect();
    let byte = flippable[(header.lsn.0 as usize) % flippable.len()];
    let mut damaged = bytes.to_vec();
    damaged[byte] ^= 1 << (header.lsn.0 % 8);
    assert!(decode_record(&damaged).is_none(), "byte {byte} flipped and the record still decodes");
}

fn segment_header(bytes: &[u8]) {
    let Ok(header) = SegmentHeader::decode(bytes) else { return };
    assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header), "segment header round trip");
    let bit = (header.lsn_first.0 as usize) % (SEGMENT_HEADER_BYTES * 8);
    let mut damaged = bytes.to_vec();
    damaged[bit / 8] ^= 1 << (bit % 8);
    assert!(SegmentHeader::decode(&damaged).is_err(), "bit {bit} flipped and the header still decodes");
}

/// Seals the segment header and every record found by walking from it, and
/// (if `renumber`) gives the records consecutive LSNs, so recovery gets past
/// checksums and sequencing to torn tails, vouchers and segment changes.
fn seal_segment(bytes: &mut [u8], segment: u32, lsn_first: u64, renumber: bool) -> u64 {
    if bytes.len() >= SEGMENT_HEADER_BYTES {
        bytes[8..12].copy_from_slice(&segment.to_le_bytes());
        if renumber {
            bytes[16..24].copy_from_slice(&lsn_first.to_le_bytes());
        }
        seal_crc(bytes, 0..CHECKSUM_OFFSET, CHECKSUM_OFFSET);
    }
    let mut lsn = lsn_first;
    let mut offset = SEGMENT_HEADER_BYTES;
    while offset + RECORD_HEADER_BYTES <= bytes.len() && bytes[offset..offset + 4] == RECORD_MAGIC.to_le_bytes() {
        // A vouch record takes the LSN of the record before it and vouches
        // for it; a lost record takes as many LSNs as it counts blocks.
        let kind = bytes[offset + 4];
        let (lsn_record, lsn_committed) =
            if kind == RecordKind::Vouch as u8 { (lsn - 1, lsn - 1) } else { (lsn, lsn - 1) };
        // (LSNs read from unsealed headers may be anything.)
        if renumber {
            bytes[offset + 8..offset + 16].copy_from_slice(&lsn_record.to_le_bytes());
            bytes[offset + 36..offset + 44].copy_from_slice(&lsn_committed.to_le_bytes());
        }
        let Some(length) = seal_record(&mut bytes[offset..]) else { break };
        let header = RecordHeader::decode(&bytes[offset..]).expect("sealed");
        offset += length;
        lsn = match header.kind {
            RecordKind::Vouch => lsn,
            RecordKind::Lost => header.lsn.0.saturating_add(u64::from(header.block_count)),
            _ => header.lsn.0.saturating_add(1),
        }
        .max(1);
    }
    lsn
}

/// Replays the journal in `storage` (replacing damaged acknowledged records
/// by lost records, with `repair`): the LSNs handed out, and the bytes cut.
fn replay(storage: &Arc<dyn Storage>, block_size: BlockSize, repair: bool) -> Result<(Vec<u64>, u64), JournalError> {
    let from = JournalPosition { segment: 1, offset: SEGMENT_HEADER_BYTES as u64 };
    let config = JournalConfig::default();
    let mut recovery =
        Journal::recover(Arc::clone(storage), "journal", block_size, config, from, Lsn(1), Timestamp::MIN)?;
    if repair {
        recovery = recovery.repairing();
    }
    let mut lsns: Vec<u64> = Vec::new();
    while let Some(record) = recovery.next_record()? {
        // Lost records take LSNs without being handed out.
        assert!(lsns.last().is_none_or(|&last| record.header.lsn.0 > last), "records replayed out of order");
        assert_eq!(record.data.len() as u64, record.header.data_bytes(), "record data length");
        if record.header.kind == RecordKind::Copy {
            record.copies()?;
        }
        lsns.push(record.header.lsn.0);
    }
    let (journal, report) = recovery.finish()?;
    assert_eq!(report.records_replayed, lsns.len() as u64);
    assert!(lsns.last().is_none_or(|&last| journal.lsn_next().0 > last), "the journal goes on after the last record");
    Ok((lsns, report.truncated_bytes))
}

fn recovery(input: &mut Cursor<'_>, sealed: bool, renumber: bool, repair: bool) {
    let mut first = input.until(b"NEXTSEGMENT").to_vec();
    let mut second = input.rest().to_vec();
    if sealed {
        let lsn_next = seal_segment(&mut first, 1, 1, renumber);
        seal_segment(&mut second, 2, lsn_next, renumber);
    }
    let block_size = SegmentHeader::decode(&first).map_or(BlockSize::DEFAULT, |header| header.block_size);
    let mut files = vec![("journal/00000001.seg", &first[..])];
    if !second.is_empty() {
        files.push(("journal/00000002.seg", &second[..]));
    }
    let storage: Arc<dyn Storage> = storage_with(&files);
    let (first_replay, peak) = peak_heap_bytes(|| replay(&storage, block_size, repair));
    // Records are read into one buffer no larger than the segment, and the
    // voucher search reads a window of at most the segment or 1 MiB.
    assert_heap_follows_input(peak, first.len() + second.len(), 4, 64 << 10);
    let Ok((lsns, _)) = first_replay else { return };
    // What a recovery (or a repair) leaves recovers as it is.
    let (again, truncated) = replay(&storage, block_size, false).expect("a journal recovery left must recover");
    assert_eq!(again, lsns, "a second recovery replays other records");
    assert_eq!(truncated, 0, "a second recovery cuts more off");
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let sealed = mode & 0x10 != 0;
    match mode & 3 {
        0 => {
            let mut bytes = input.rest().to_vec();
            if sealed {
                seal_record(&mut bytes);
            }
            record(&bytes);
        }
        1 => {
            let mut bytes = input.rest().to_vec();
            if sealed {
                seal_crc(&mut bytes, 0..CHECKSUM_OFFSET, CHECKSUM_OFFSET);
            }
            segment_header(&bytes);
        }
        _ => recovery(&mut input, sealed, mode & 0x20 != 0, mode & 0x40 != 0),
    }
});
