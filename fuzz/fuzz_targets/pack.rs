//! Packs: the header, records, footer and trailer decoded from fuzzed bytes,
//! and a whole pack file opened and scrubbed by the real `PackReader`.
//!
//! The first byte picks the structure and how much is sealed first: record
//! CRCs (and chunk hashes, for records whose bytes decompress to their raw
//! size), the header CRC, and — in the mode that builds it — a footer listing
//! the records found and a trailer pointing at it, so that the fuzzer's
//! bytes are the records of an otherwise well-formed pack.
//!
//! Properties: no panic; memory in proportion to the pack, whatever sizes
//! the footer claims; what decodes re-encodes to what decodes the same; one
//! flipped bit of a record or trailer is rejected; a built pack scrubs clean
//! exactly when every record in it holds its chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

use rewind_chunks::{pack_name, ChunkError, LocalPackStore, PackReader, PackStore};
use rewind_format::pack::{
    Codec, FooterEntry, PackHeader, PackTrailer, RecordHeader, CHUNK_BYTES_MAX, PACK_HEADER_BYTES, PACK_TRAILER_BYTES,
    RECORD_HEADER_BYTES, RECORD_MAGIC,
};
use rewind_fuzz::{assert_heap_follows_input, le_u32, peak_heap_bytes, seal_crc, storage_with, Cursor};
use rewind_types::ChunkId;

const PACK: u64 = 7;

/// What a record's stored bytes hold once decoded, if they hold
/// `raw_bytes` bytes at all.
fn raw_of(codec: u8, stored: &[u8], raw_bytes: u32) -> Option<Vec<u8>> {
    if raw_bytes > CHUNK_BYTES_MAX {
        return None;
    }
    match codec {
        0 => (stored.len() == raw_bytes as usize).then(|| stored.to_vec()),
        1 => zstd::bulk::decompress(stored, raw_bytes as usize).ok().filter(|raw| raw.len() == raw_bytes as usize),
        _ => None,
    }
}

/// Seals the record at the start of `bytes` (hash of its raw bytes, if they
/// decode, then its CRC). Returns its length, and whether it holds its chunk.
fn seal_record(bytes: &mut [u8]) -> Option<(usize, bool)> {
    if bytes.len() < RECORD_HEADER_BYTES || le_u32(bytes, 0) != Some(RECORD_MAGIC) {
        return None;
    }
    let stored_bytes = le_u32(bytes, 8)? as usize;
    let raw_bytes = le_u32(bytes, 12)?;
    let length = (RECORD_HEADER_BYTES + stored_bytes).next_multiple_of(8);
    if length > bytes.len() {
        return None;
    }
    let stored = &bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + stored_bytes];
    let raw = raw_of(bytes[4], stored, raw_bytes);
    if let Some(raw) = &raw {
        let hash: [u8; 32] = blake3::hash(raw).into();
        bytes[16..48].copy_from_slice(&hash);
    }
    let crc = rewind_format::crc32c_append(
        rewind_format::crc32c(&bytes[..RECORD_HEADER_BYTES - 8]),
        &bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + stored_bytes],
    );
    bytes[48..52].copy_from_slice(&crc.to_le_bytes());
    let holds = raw.is_some() && RecordHeader::decode_record(bytes).is_ok();
    Some((length, holds))
}

/// Seals the header and records of `pack` and appends a footer and trailer
/// for the records found. Returns whether every record holds its chunk.
fn build(pack: &mut Vec<u8>) -> bool {
    // The header is made whole; its reserved bytes stay as fuzzed.
    if pack.len() < PACK_HEADER_BYTES {
        pack.resize(PACK_HEADER_BYTES, 0);
    }
    pack[..16].copy_from_slice(&PackHeader { pack: PACK }.encode()[..16]);
    seal_crc(pack, 0..PACK_HEADER_BYTES - 4, PACK_HEADER_BYTES - 4);
    let mut entries = Vec::new();
    let mut every_record_holds = true;
    let mut offset = PACK_HEADER_BYTES;
    while offset < pack.len() {
        let Some((length, holds)) = seal_record(&mut pack[offset..]) else { break };
        every_record_holds &= holds;
        entries.push(FooterEntry {
            hash: pack[offset + 16..offset + 48].try_into().expect("32 bytes"),
            id: ChunkId(entries.len() as u64 + 1),
            offset: offset as u64,
            stored_bytes: le_u32(pack, offset + 8).expect("sealed"),
            raw_bytes: le_u32(pack, offset + 12).expect("sealed"),
        });
        offset += length;
    }
    pack.truncate(offset);
    let footer_offset = pack.len() as u64;
    let mut footer = Vec::new();
    for entry in &entries {
        entry.encode(&mut footer);
    }
    let trailer =
        PackTrailer { entry_count: entries.len() as u32, footer_offset, footer_crc32c: rewind_format::crc32c(&footer) };
    pack.extend_from_slice(&footer);
    pack.extend_from_slice(&trailer.encode());
    every_record_holds
}

fn flip(bytes: &[u8], bit: usize) -> Vec<u8> {
    let mut damaged = bytes.to_vec();
    damaged[bit / 8] ^= 1 << (bit % 8);
    damaged
}

fn structures(mode: u8, bytes: &mut Vec<u8>) {
    match mode >> 2 & 3 {
        0 => {
            if mode & 0x10 != 0 {
                seal_crc(bytes, 0..PACK_HEADER_BYTES - 4, PACK_HEADER_BYTES - 4);
            }
            let Ok(header) = PackHeader::decode(bytes) else { return };
            assert_eq!(PackHeader::decode(&header.encode()), Ok(header), "header round trip");
            let bit = (header.pack as usize) % ((PACK_HEADER_BYTES - 4) * 8);
            assert!(PackHeader::decode(&flip(bytes, bit)).is_err(), "bit {bit} flipped, header accepted");
        }
        1 => {
            if mode & 0x10 != 0 {
                seal_record(bytes);
            }
            let Ok((header, stored)) = RecordHeader::decode_record(bytes) else { return };
            assert!(header.stored_bytes <= CHUNK_BYTES_MAX && header.raw_bytes <= CHUNK_BYTES_MAX);
            assert!(header.codec != Codec::Raw || header.stored_bytes == header.raw_bytes);
            let mut encoded = Vec::new();
            header.encode_record(stored, &mut encoded);
            assert_eq!(RecordHeader::decode_record(&encoded), Ok((header, stored)), "record round trip");
            // Not in the stored size: that moves where the stored bytes end.
            let flippable: Vec<usize> =
                (0..RECORD_HEADER_BYTES + stored.len()).filter(|byte| !(8..12).contains(byte)).collect();
            let bit =
                flippable[header.raw_bytes as usize % flippable.len()] * 8 + (header.raw_bytes as usize >> 16) % 8;
            assert!(RecordHeader::decode_record(&flip(bytes, bit)).is_err(), "bit {bit} flipped, record accepted");
        }
        2 => {
            let pack_bytes = u64::from(le_u32(bytes, 0).unwrap_or(0));
            let skip = 4.min(bytes.len());
            let bytes = &mut bytes[skip..];
            if mode & 0x10 != 0 {
                seal_crc(bytes, 0..PACK_TRAILER_BYTES - 4, PACK_TRAILER_BYTES - 4);
            }
            let Ok(trailer) = PackTrailer::decode(bytes, pack_bytes) else { return };
            assert!(trailer.footer_offset >= PACK_HEADER_BYTES as u64);
            let footer_end = trailer.footer_offset.checked_add(trailer.footer_bytes());
            assert_eq!(footer_end, pack_bytes.checked_sub(PACK_TRAILER_BYTES as u64), "footer ends at the trailer");
            assert_eq!(PackTrailer::decode(&trailer.encode(), pack_bytes), Ok(trailer), "trailer round trip");
            let bit = (trailer.footer_offset as usize) % ((PACK_TRAILER_BYTES - 4) * 8);
            assert!(PackTrailer::decode(&flip(bytes, bit), pack_bytes).is_err(), "bit {bit} flipped, trailer accepted");
        }
        _ => {
            let (entries, peak) = peak_heap_bytes(|| FooterEntry::decode_all(bytes));
            assert_heap_follows_input(peak, bytes.len(), 2, 1024);
            let Ok(entries) = entries else { return };
            let mut encoded = Vec::new();
            for entry in &entries {
                entry.encode(&mut encoded);
            }
            assert_eq!(&encoded, bytes, "footer round trip");
        }
    }
}

fn pack_file(mode: u8, mut pack: Vec<u8>) {
    let built = mode & 0x10 != 0;
    let every_record_holds = built && build(&mut pack);
    let storage = storage_with(&[(&format!("packs/{}", pack_name(PACK)), &pack)]);
    let packs: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(storage, "packs").expect("in-memory storage"));
    let (scrub, peak) = peak_heap_bytes(|| PackReader::open(&packs, PACK)?.verify());
    // Reading a chunk needs its record and its raw bytes: at most two
    // chunks' worth beyond what follows the file.
    assert_heap_follows_input(peak, pack.len(), 3, 4 * CHUNK_BYTES_MAX as usize);
    if built {
        match scrub {
            Ok(count) => assert!(every_record_holds, "scrubbed {count} chunks clean, one of which is not"),
            Err(ChunkError::Corrupt { .. }) => assert!(!every_record_holds, "a good pack: {scrub:?}"),
            Err(error) => panic!("a sealed pack: {error}"),
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let mut bytes = input.rest().to_vec();
    if mode & 3 == 0 {
        structures(mode, &mut bytes);
    } else {
        pack_file(mode, bytes);
    }
});
