//! The chunk table: one slot (and the table header) decoded from fuzzed
//! bytes, and a whole table file opened by the real chunk store, whose
//! every slot is then read.
//!
//! The first byte picks which, and whether checksums are sealed first (a
//! slot's covers its id, so it is sealed for the id it is read as).
//!
//! Properties: no panic; a slot that decodes is all zero (never written) or
//! re-encodes to bytes that decode the same; it does not pass for
//! another id's slot; one flipped bit is rejected; the store opens a table
//! with a good header and answers every read with a slot, a "missing" or a
//! corruption error, with memory in proportion to the table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rewind_chunks::{ChunkError, ChunkStore, ChunkStoreConfig};
use rewind_format::chunks::{decode_table_header, TableSlot, TABLE_SLOT_BYTES};
use rewind_fuzz::{assert_heap_follows_input, peak_heap_bytes, seal_crc, storage_with, Cursor};
use rewind_types::ChunkId;

fn seal_slot(bytes: &mut [u8], id: u64) {
    if bytes.len() >= TABLE_SLOT_BYTES && bytes[..TABLE_SLOT_BYTES].iter().any(|&byte| byte != 0) {
        let crc = rewind_format::crc32c_append(rewind_format::crc32c(&bytes[..60]), &id.to_le_bytes());
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    }
}

fn slot(bytes: &[u8], id: ChunkId) {
    let Ok(decoded) = TableSlot::decode(bytes, id) else { return };
    assert_eq!(bytes.len(), TABLE_SLOT_BYTES);
    let Some(slot) = decoded else {
        assert!(bytes.iter().all(|&byte| byte == 0), "a slot with bytes read as never written");
        return;
    };
    let encoded = slot.encode(id);
    assert_eq!(TableSlot::decode(&encoded, id), Ok(Some(slot)), "slot round trip");
    assert!(TableSlot::decode(bytes, ChunkId(id.0.wrapping_add(1))).is_err(), "a slot passed for another id's");
    let bit = (slot.pack as usize ^ slot.offset as usize) % (TABLE_SLOT_BYTES * 8);
    let mut damaged = bytes.to_vec();
    damaged[bit / 8] ^= 1 << (bit % 8);
    assert!(TableSlot::decode(&damaged, id).is_err(), "bit {bit} flipped and the slot still decodes");
}

fn table(bytes: &[u8], ids: &[u64]) {
    let storage = storage_with(&[("chunks/table", bytes)]);
    let config = ChunkStoreConfig::default();
    let (result, peak) = peak_heap_bytes(|| {
        let store = ChunkStore::open(storage, "chunks", config)?;
        let mut answers = Vec::new();
        for &id in ids {
            let mut out = vec![0; 4096];
            answers.push(store.read(ChunkId(id), &mut out));
        }
        Ok::<_, ChunkError>(answers)
    });
    // The store holds a counter per slot, and fixed buffers.
    assert_heap_follows_input(peak, bytes.len(), 2, 4 << 20);
    let header_good = bytes.len() < TABLE_SLOT_BYTES || decode_table_header(&bytes[..TABLE_SLOT_BYTES]).is_ok();
    let Ok(answers) = result else {
        assert!(!header_good, "a table with a good header refused: {:?}", result.err());
        return;
    };
    for answer in answers {
        // No pack exists, so nothing can be read; but how it fails matters.
        match answer {
            Ok(()) => panic!("read a chunk from a store without packs"),
            Err(ChunkError::Missing { .. } | ChunkError::Corrupt { .. } | ChunkError::Io { .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let sealed = mode & 0x10 != 0;
    match mode & 3 {
        0 => {
            let id = input.u64();
            let mut bytes = input.rest().to_vec();
            if sealed {
                seal_slot(&mut bytes, id);
            }
            slot(&bytes, ChunkId(id));
        }
        1 => {
            let mut bytes = input.rest().to_vec();
            if sealed {
                seal_crc(&mut bytes, 0..TABLE_SLOT_BYTES - 4, TABLE_SLOT_BYTES - 4);
            }
            if decode_table_header(&bytes).is_ok() {
                let bit = usize::from(bytes[8]) % ((TABLE_SLOT_BYTES - 4) * 8);
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(decode_table_header(&damaged).is_err(), "bit {bit} flipped and the header still decodes");
            }
        }
        _ => {
            let ids: Vec<u64> = (0..4).map(|_| u64::from(input.u8())).collect();
            let mut bytes = input.rest().to_vec();
            if sealed {
                seal_crc(&mut bytes, 0..TABLE_SLOT_BYTES - 4, TABLE_SLOT_BYTES - 4);
                for id in 1..bytes.len() / TABLE_SLOT_BYTES {
                    seal_slot(&mut bytes[id * TABLE_SLOT_BYTES..], id as u64);
                }
            }
            table(&bytes, &ids);
        }
    }
});
