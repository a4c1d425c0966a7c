//! Chunk store metadata (`docs/format/chunk-store.md`): the chunk table, the
//! dedup index's runs and manifest, and the repack intent.
//!
//! The chunk table maps a [`ChunkId`] to where its chunk is: one fixed-size
//! [`TableSlot`] per id at offset `id · 64` of `chunks/table`, so finding a
//! chunk is one read. The dedup index maps a chunk's BLAKE3 hash to its id:
//! immutable sorted runs of `(hash, id)` entries in checksummed pages, each
//! with a *fence* (the first 8 hash bytes of every page) and a Bloom filter,
//! so a hash that is not stored (the common case for new data) costs no
//! read at all.

use rewind_types::ChunkId;

use crate::meta::{finish, open_envelope, seal_envelope};
use crate::pack::{ChunkHash, CHUNK_BYTES_MAX};
use crate::{crc32c, verify_crc, FormatError, Reader, Writer};

pub const TABLE_SLOT_BYTES: usize = 64;
pub const TABLE_MAGIC: u32 = u32::from_le_bytes(*b"RWCT");
const SLOT_MAGIC: u32 = u32::from_le_bytes(*b"RWCS");
/// The magic of a slot whose chunk is bare ([`TableSlot::bare_crc32c`]).
const BARE_SLOT_MAGIC: u32 = u32::from_le_bytes(*b"RWCB");
pub const FORMAT_VERSION: u32 = 1;

/// Slot 0 of the chunk table: it names the file (ids start at 1).
pub fn encode_table_header() -> [u8; TABLE_SLOT_BYTES] {
    let mut writer = Writer::new();
    writer.u32(TABLE_MAGIC).u32(FORMAT_VERSION);
    writer.into_sealed(TABLE_SLOT_BYTES).try_into().expect("one slot")
}

pub fn decode_table_header(bytes: &[u8]) -> Result<(), FormatError> {
    const WHAT: &str = "chunk table header";
    let mut reader = Reader::new(WHAT, bytes);
    reader.magic(TABLE_MAGIC)?;
    let version = reader.u32()?;
    reader.take(TABLE_SLOT_BYTES - 12)?;
    let stored = reader.u32()?;
    verify_crc(WHAT, stored, crc32c(&bytes[..TABLE_SLOT_BYTES - 4]))?;
    crate::check_version(WHAT, version, FORMAT_VERSION)
}

/// Where one chunk is: the table's entry for its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableSlot {
    pub hash: ChunkHash,
    pub pack: u64,
    /// Byte offset of the chunk's record in the pack (packs stay below 4 GiB).
    pub offset: u32,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
    /// `Some` for a *bare* chunk: its raw bytes lie at `offset` as they are,
    /// with no record around them — in a journal segment the chunk store
    /// adopted as a pack — and this is their CRC-32C, which every read
    /// checks as a record's CRC is checked.
    pub bare_crc32c: Option<u32>,
}

impl TableSlot {
    /// The slot of chunk `id`. The id is part of the checksummed bytes, so a
    /// slot written at the wrong place does not pass for another id's.
    pub fn encode(&self, id: ChunkId) -> [u8; TABLE_SLOT_BYTES] {
        let mut writer = Writer::new();
        writer
            .slice(&self.hash)
            .u64(self.pack)
            .u32(self.offset)
            .u32(self.stored_bytes)
            .u32(self.raw_bytes)
            .u32(if self.bare_crc32c.is_some() { BARE_SLOT_MAGIC } else { SLOT_MAGIC })
            .u32(self.bare_crc32c.unwrap_or(0));
        assert_eq!(writer.len(), 60);
        let mut bytes: [u8; TABLE_SLOT_BYTES] = [0; TABLE_SLOT_BYTES];
        bytes[..60].copy_from_slice(&writer.into_bytes());
        let crc = crate::crc32c_append(crc32c(&bytes[..60]), &id.0.to_le_bytes());
        bytes[60..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes the slot of `id`: `None` if it was never written (all zero).
    pub fn decode(bytes: &[u8], id: ChunkId) -> Result<Option<TableSlot>, FormatError> {
        const WHAT: &str = "chunk table slot";
        if bytes.len() != TABLE_SLOT_BYTES {
            return Err(FormatError::Truncated { what: WHAT, available: bytes.len(), needed: TABLE_SLOT_BYTES });
        }
        if bytes.iter().all(|&byte| byte == 0) {
            return Ok(None);
        }
        let stored = u32::from_le_bytes(bytes[60..].try_into().expect("4"));
        verify_crc(WHAT, stored, crate::crc32c_append(crc32c(&bytes[..60]), &id.0.to_le_bytes()))?;
        let mut reader = Reader::new(WHAT, bytes);
        let mut slot = TableSlot {
            hash: reader.take(32)?.try_into().expect("32 bytes"),
            pack: reader.u64()?,
            offset: reader.u32()?,
            stored_bytes: reader.u32()?,
            raw_bytes: reader.u32()?,
            bare_crc32c: None,
        };
        match reader.u32()? {
            SLOT_MAGIC => {
                if reader.u32()? != 0 {
                    return Err(reader.invalid("reserved bytes 56..60 are not zero"));
                }
            }
            BARE_SLOT_MAGIC => {
                slot.bare_crc32c = Some(reader.u32()?);
                if slot.stored_bytes != slot.raw_bytes {
                    return Err(reader.invalid(format!(
                        "a bare chunk of {} stored / {} raw bytes: it is stored as it is",
                        slot.stored_bytes, slot.raw_bytes
                    )));
                }
            }
            found => return Err(FormatError::BadMagic { what: WHAT, found }),
        }
        // Readers size buffers by these (found by fuzzing the pack footer,
        // which had the same hole).
        if slot.stored_bytes > CHUNK_BYTES_MAX || slot.raw_bytes > CHUNK_BYTES_MAX {
            return Err(reader.invalid(format!(
                "chunk of {} stored / {} raw bytes is larger than a block can be",
                slot.stored_bytes, slot.raw_bytes
            )));
        }
        Ok(Some(slot))
    }
}

pub const DEDUP_PAGE_BYTES: usize = 4096;
pub const DEDUP_ENTRY_BYTES: usize = 40;
pub const DEDUP_ENTRIES_PER_PAGE: usize = 102;
pub const DEDUP_RUN_MAGIC: u32 = u32::from_le_bytes(*b"RWDX");
const DEDUP_TRAILER_OFFSET: usize = DEDUP_ENTRIES_PER_PAGE * DEDUP_ENTRY_BYTES;
const DEDUP_CHECKSUM_OFFSET: usize = DEDUP_PAGE_BYTES - 4;
const _: () = assert!(DEDUP_TRAILER_OFFSET + 16 == DEDUP_PAGE_BYTES);

/// A dedup index entry: chunk `id` has `hash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DedupEntry {
    pub hash: ChunkHash,
    pub id: ChunkId,
}

/// The fence key of a hash: its first 8 bytes, big-endian, so keys order
/// like the hashes.
pub fn fence_key(hash: &ChunkHash) -> u64 {
    u64::from_be_bytes(hash[..8].try_into().expect("8"))
}

/// Encodes one data page of a dedup run (entries sorted, 1..=102 of them).
pub fn encode_dedup_page(page_number: u64, entries: &[DedupEntry], out: &mut [u8; DEDUP_PAGE_BYTES]) {
    assert!(!entries.is_empty() && entries.len() <= DEDUP_ENTRIES_PER_PAGE);
    out.fill(0);
    for (slot, entry) in out.chunks_exact_mut(DEDUP_ENTRY_BYTES).zip(entries) {
        slot[..32].copy_from_slice(&entry.hash);
        slot[32..].copy_from_slice(&entry.id.0.to_le_bytes());
    }
    let trailer = &mut out[DEDUP_TRAILER_OFFSET..];
    trailer[0..4].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    trailer[4..12].copy_from_slice(&page_number.to_le_bytes());
    let checksum = crc32c(&out[..DEDUP_CHECKSUM_OFFSET]);
    out[DEDUP_CHECKSUM_OFFSET..].copy_from_slice(&checksum.to_le_bytes());
}

/// Checks a dedup page (checksum, number, count) and decodes its entries.
pub fn decode_dedup_page(bytes: &[u8], page_number: u64, out: &mut Vec<DedupEntry>) -> Result<(), FormatError> {
    const WHAT: &str = "dedup index page";
    if bytes.len() != DEDUP_PAGE_BYTES {
        return Err(FormatError::Truncated { what: WHAT, available: bytes.len(), needed: DEDUP_PAGE_BYTES });
    }
    let stored = u32::from_le_bytes(bytes[DEDUP_CHECKSUM_OFFSET..].try_into().expect("4"));
    verify_crc(WHAT, stored, crc32c(&bytes[..DEDUP_CHECKSUM_OFFSET]))?;
    let mut reader = Reader::new(WHAT, &bytes[DEDUP_TRAILER_OFFSET..]);
    let count = reader.u32()? as usize;
    let number = reader.u64()?;
    if number != page_number || count == 0 || count > DEDUP_ENTRIES_PER_PAGE {
        return Err(reader.invalid(format!("page {page_number} says it is page {number} of {count} entries")));
    }
    out.clear();
    for slot in bytes.chunks_exact(DEDUP_ENTRY_BYTES).take(count) {
        let hash: ChunkHash = slot[..32].try_into().expect("32");
        let id = u64::from_le_bytes(slot[32..].try_into().expect("8"));
        if id == 0 || out.last().is_some_and(|last: &DedupEntry| last.hash > hash) {
            return Err(reader.invalid("entries out of order or with chunk id 0"));
        }
        out.push(DedupEntry { hash, id: ChunkId(id) });
    }
    Ok(())
}

/// Page 0 of a dedup run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupRunHeader {
    pub entry_count: u64,
    pub data_page_count: u64,
    pub bloom_bits: u64,
    pub bloom_hashes: u32,
    pub fence_crc32c: u32,
    pub bloom_crc32c: u32,
}

impl DedupRunHeader {
    pub fn encode(&self) -> [u8; DEDUP_PAGE_BYTES] {
        let mut writer = Writer::new();
        writer
            .u32(DEDUP_RUN_MAGIC)
            .u32(FORMAT_VERSION)
            .u64(self.entry_count)
            .u64(self.data_page_count)
            .u64(self.bloom_bits)
            .u32(self.bloom_hashes)
            .u32(self.fence_crc32c)
            .u32(self.bloom_crc32c);
        writer.into_sealed(DEDUP_PAGE_BYTES).try_into().expect("one page")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "dedup run header";
        if bytes.len() != DEDUP_PAGE_BYTES {
            return Err(FormatError::Truncated { what: WHAT, available: bytes.len(), needed: DEDUP_PAGE_BYTES });
        }
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(DEDUP_RUN_MAGIC)?;
        let stored = u32::from_le_bytes(bytes[DEDUP_CHECKSUM_OFFSET..].try_into().expect("4"));
        verify_crc(WHAT, stored, crc32c(&bytes[..DEDUP_CHECKSUM_OFFSET]))?;
        crate::check_version(WHAT, reader.u32()?, FORMAT_VERSION)?;
        let header = DedupRunHeader {
            entry_count: reader.u64()?,
            data_page_count: reader.u64()?,
            bloom_bits: reader.u64()?,
            bloom_hashes: reader.u32()?,
            fence_crc32c: reader.u32()?,
            bloom_crc32c: reader.u32()?,
        };
        let pages_needed = header.entry_count.div_ceil(DEDUP_ENTRIES_PER_PAGE as u64);
        if header.entry_count == 0
            || header.data_page_count != pages_needed
            || header.bloom_bits == 0
            || !header.bloom_bits.is_multiple_of(64)
            || !(1..=BLOOM_HASHES_MAX).contains(&header.bloom_hashes)
        {
            return Err(reader.invalid(format!("inconsistent header {header:?}")));
        }
        // So that the offsets and sizes below cannot overflow.
        if header.end_bytes().is_none() {
            return Err(reader.invalid(format!("{} pages do not fit in a file", header.data_page_count)));
        }
        Ok(header)
    }

    pub fn fence_offset(&self) -> u64 {
        (1 + self.data_page_count) * DEDUP_PAGE_BYTES as u64
    }

    pub fn fence_bytes(&self) -> u64 {
        self.data_page_count * 8
    }

    pub fn bloom_offset(&self) -> u64 {
        self.fence_offset() + self.fence_bytes()
    }

    pub fn bloom_bytes(&self) -> u64 {
        self.bloom_bits / 8
    }

    /// Where the Bloom filter ends: the size of the run file.
    pub fn end_bytes(&self) -> Option<u64> {
        let fence_offset = self.data_page_count.checked_add(1)?.checked_mul(DEDUP_PAGE_BYTES as u64)?;
        fence_offset.checked_add(self.data_page_count.checked_mul(8)?)?.checked_add(self.bloom_bits / 8)
    }
}

/// At most this many bit positions per key.
pub const BLOOM_HASHES_MAX: u32 = 16;

/// The Bloom filter bits a chunk hash sets. The hash is already uniform, so
/// two 64-bit words of it serve as the two hash functions of double hashing
/// (Kirsch and Mitzenmacher): the `i`-th position is `(h1 + i·h2) mod m`,
/// with `h1` the little-endian `u64` at bytes 0..8 and `h2` the one at bytes
/// 8..16 with its lowest bit set.
pub fn bloom_bits(hash: &ChunkHash, bloom_bits: u64, hashes: u32) -> impl Iterator<Item = u64> {
    assert!(hashes <= BLOOM_HASHES_MAX);
    let first = u64::from_le_bytes(hash[..8].try_into().expect("8"));
    let step = u64::from_le_bytes(hash[8..16].try_into().expect("8")) | 1;
    (0..u64::from(hashes)).map(move |index| first.wrapping_add(index.wrapping_mul(step)) % bloom_bits)
}

pub fn encode_fence(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|key| key.to_le_bytes()).collect()
}

pub fn decode_fence(bytes: &[u8], header: &DedupRunHeader) -> Result<Vec<u64>, FormatError> {
    const WHAT: &str = "dedup run fence";
    verify_crc(WHAT, header.fence_crc32c, crc32c(bytes))?;
    let keys: Vec<u64> = bytes.chunks_exact(8).map(|key| u64::from_le_bytes(key.try_into().expect("8"))).collect();
    if keys.len() as u64 != header.data_page_count || keys.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(FormatError::Invalid { what: WHAT, reason: "keys are not in order".into() });
    }
    Ok(keys)
}

/// One dedup run, as listed in the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupRunInfo {
    pub id: u64,
    pub entry_count: u64,
}

/// `chunks/dedup/manifest`: the dedup index's runs, and the packs they cover.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DedupManifest {
    /// Every chunk of every pack numbered up to this is in the runs; the
    /// chunks of later packs are read back from the packs' footers on open.
    pub packs_covered: u64,
    pub run_id_next: u64,
    pub runs: Vec<DedupRunInfo>,
}

impl DedupManifest {
    const MAGIC: [u8; 4] = *b"RWDM";
    const WHAT: &'static str = "dedup index manifest";
    const RUNS_MAX: usize = 1 << 12;

    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Writer::new();
        payload.u64(self.packs_covered).u64(self.run_id_next).u32(self.runs.len() as u32);
        for run in &self.runs {
            payload.u64(run.id).u64(run.entry_count);
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let packs_covered = reader.u64()?;
        let run_id_next = reader.u64()?;
        let count = reader.u32()? as usize;
        if count > Self::RUNS_MAX {
            return Err(reader.invalid(format!("{count} runs")));
        }
        let mut runs = Vec::with_capacity(reader.capacity_for(count, 16));
        for _ in 0..count {
            let run = DedupRunInfo { id: reader.u64()?, entry_count: reader.u64()? };
            if run.id >= run_id_next || run.entry_count == 0 {
                return Err(reader.invalid(format!("run {run:?} with next id {run_id_next}")));
            }
            runs.push(run);
        }
        finish(reader)?;
        Ok(DedupManifest { packs_covered, run_id_next, runs })
    }
}

/// `chunks/repack`: present while garbage collection moves the live chunks
/// of `old` packs into the sealed pack `new` (0 when nothing was live) and
/// deletes the old ones. Recovery completes the move: it points the table at
/// `new`'s copies and deletes what is left of `old`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepackIntent {
    pub new: u64,
    pub old: Vec<u64>,
}

impl RepackIntent {
    const MAGIC: [u8; 4] = *b"RWRP";
    const WHAT: &'static str = "repack intent";
    pub const OLD_MAX: usize = 1 << 12;

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.old.len() <= Self::OLD_MAX);
        let mut payload = Writer::new();
        payload.u64(self.new).u32(self.old.len() as u32);
        for &pack in &self.old {
            payload.u64(pack);
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let new = reader.u64()?;
        let count = reader.u32()? as usize;
        if count > Self::OLD_MAX {
            return Err(reader.invalid(format!("{count} packs")));
        }
        let old = (0..count).map(|_| reader.u64()).collect::<Result<Vec<_>, _>>()?;
        finish(reader)?;
        Ok(RepackIntent { new, old })
    }
}

/// One pack in [`SavedCounts`]: what collection knows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedPack {
    pub pack: u64,
    pub bytes: u64,
    pub held_chunks: u64,
    pub held_bytes: u64,
}

/// `chunks/counts.meta`: the chunk store's reference counts as a clean
/// shutdown left them, so opening need not count every reference again.
/// The counts themselves are `chunks/counts`: one little-endian u32 per id
/// from 0, `counts_crc32c` over all of them. Both files are removed when
/// the store opens (before anything can change), so only a clean shutdown
/// leaves them; `history` names the version index state they were counted
/// from, and they are used only if the embedder's history still matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedCounts {
    /// BLAKE3 of the embedder's description of the history counted.
    pub history: [u8; 32],
    /// The table's id end and the dedup index's covered packs when saved:
    /// what the store must still find.
    pub table_id_end: u64,
    pub packs_covered: u64,
    pub live: u64,
    pub dead: u64,
    pub references: u64,
    pub logical_bytes: u64,
    pub held_raw_bytes: u64,
    pub held_stored_bytes: u64,
    pub packs: Vec<SavedPack>,
    /// Entries of `chunks/counts`, and their CRC-32C.
    pub count_entries: u64,
    pub counts_crc32c: u32,
}

impl SavedCounts {
    const MAGIC: [u8; 4] = *b"RWSC";
    const WHAT: &'static str = "saved chunk counts";
    pub const PACKS_MAX: usize = 1 << 22;

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.packs.len() <= Self::PACKS_MAX);
        let mut payload = Writer::new();
        payload
            .slice(&self.history)
            .u64(self.table_id_end)
            .u64(self.packs_covered)
            .u64(self.live)
            .u64(self.dead)
            .u64(self.references)
            .u64(self.logical_bytes)
            .u64(self.held_raw_bytes)
            .u64(self.held_stored_bytes)
            .u64(self.count_entries)
            .u32(self.counts_crc32c)
            .u32(self.packs.len() as u32);
        for pack in &self.packs {
            payload.u64(pack.pack).u64(pack.bytes).u64(pack.held_chunks).u64(pack.held_bytes);
        }
        seal_envelope(Self::MAGIC, payload)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = open_envelope(Self::WHAT, Self::MAGIC, bytes)?;
        let history = reader.take(32)?.try_into().expect("32 bytes");
        let (table_id_end, packs_covered) = (reader.u64()?, reader.u64()?);
        let (live, dead, references, logical_bytes) = (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
        let (held_raw_bytes, held_stored_bytes, count_entries) = (reader.u64()?, reader.u64()?, reader.u64()?);
        let counts_crc32c = reader.u32()?;
        let pack_count = reader.u32()? as usize;
        if pack_count > Self::PACKS_MAX {
            return Err(reader.invalid(format!("{pack_count} packs")));
        }
        let mut packs = Vec::with_capacity(pack_count);
        for _ in 0..pack_count {
            let (pack, bytes, held_chunks, held_bytes) = (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
            packs.push(SavedPack { pack, bytes, held_chunks, held_bytes });
        }
        finish(reader)?;
        Ok(SavedCounts {
            history,
            table_id_end,
            packs_covered,
            live,
            dead,
            references,
            logical_bytes,
            held_raw_bytes,
            held_stored_bytes,
            packs,
            count_entries,
            counts_crc32c,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_counts_round_trip_and_catch_damage() {
        let saved = SavedCounts {
            history: [7; 32],
            table_id_end: 1000,
            packs_covered: 11,
            live: 900,
            dead: 50,
            references: 4000,
            logical_bytes: 4000 * 4096,
            held_raw_bytes: 950 * 4096,
            held_stored_bytes: 950 * 2000,
            packs: vec![
                SavedPack { pack: 3, bytes: 1 << 25, held_chunks: 500, held_bytes: 1 << 24 },
                SavedPack { pack: 11, bytes: 1 << 20, held_chunks: 450, held_bytes: 1 << 19 },
            ],
            count_entries: 1000,
            counts_crc32c: 0xdead_beef,
        };
        let bytes = saved.encode();
        assert_eq!(SavedCounts::decode(&bytes).unwrap(), saved);
        let half = bytes.len() / 2;
        for bit in 0..half * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(SavedCounts::decode(&damaged).unwrap(), saved, "one damaged copy, bit {bit}");
            damaged[half + bit / 8] ^= 1 << (bit % 8);
            assert!(SavedCounts::decode(&damaged).is_err(), "both copies damaged, bit {bit}");
        }
    }

    #[test]
    fn slots_round_trip_and_know_their_place() {
        let slot = TableSlot {
            hash: [9; 32],
            pack: 1 << 40,
            offset: 4096,
            stored_bytes: 100,
            raw_bytes: 4096,
            bare_crc32c: None,
        };
        let bare = TableSlot { stored_bytes: 4096, bare_crc32c: Some(0xdead_beef), ..slot };
        for slot in [slot, bare] {
            let bytes = slot.encode(ChunkId(77));
            assert_eq!(TableSlot::decode(&bytes, ChunkId(77)).unwrap(), Some(slot));
            assert!(TableSlot::decode(&bytes, ChunkId(78)).is_err(), "a slot read for another id");
            for bit in 0..TABLE_SLOT_BYTES * 8 {
                let mut damaged = bytes;
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(TableSlot::decode(&damaged, ChunkId(77)).is_err(), "bit {bit}");
            }
        }
        assert_eq!(TableSlot::decode(&[0; TABLE_SLOT_BYTES], ChunkId(5)).unwrap(), None);
        let compressed_bare = TableSlot { stored_bytes: 100, ..bare };
        let error = TableSlot::decode(&compressed_bare.encode(ChunkId(3)), ChunkId(3)).unwrap_err();
        assert!(error.to_string().contains("stored as it is"), "{error}");
        decode_table_header(&encode_table_header()).unwrap();
    }

    #[test]
    fn dedup_pages_round_trip_and_catch_damage() {
        let entries: Vec<DedupEntry> = (0..DEDUP_ENTRIES_PER_PAGE as u8)
            .map(|i| DedupEntry { hash: [i; 32], id: ChunkId(u64::from(i) + 1) })
            .collect();
        let mut page = [0u8; DEDUP_PAGE_BYTES];
        encode_dedup_page(3, &entries, &mut page);
        let mut decoded = Vec::new();
        decode_dedup_page(&page, 3, &mut decoded).unwrap();
        assert_eq!(decoded, entries);
        assert!(decode_dedup_page(&page, 4, &mut decoded).is_err(), "misplaced page");
        page[77] ^= 1;
        assert!(decode_dedup_page(&page, 3, &mut decoded).is_err());
    }

    #[test]
    fn run_header_manifest_and_intent_round_trip() {
        let header = DedupRunHeader {
            entry_count: 205,
            data_page_count: 3,
            bloom_bits: 2048,
            bloom_hashes: 7,
            fence_crc32c: 1,
            bloom_crc32c: 2,
        };
        assert_eq!(DedupRunHeader::decode(&header.encode()).unwrap(), header);
        assert!(DedupRunHeader::decode(&DedupRunHeader { data_page_count: 2, ..header }.encode()).is_err());
        let manifest = DedupManifest {
            packs_covered: 9,
            run_id_next: 4,
            runs: vec![DedupRunInfo { id: 1, entry_count: 10 }, DedupRunInfo { id: 3, entry_count: 5 }],
        };
        assert_eq!(DedupManifest::decode(&manifest.encode()).unwrap(), manifest);
        let intent = RepackIntent { new: 12, old: vec![3, 5] };
        assert_eq!(RepackIntent::decode(&intent.encode()).unwrap(), intent);
    }

    #[test]
    fn bloom_filters_of_ten_bits_per_key_answer_wrongly_about_once_in_a_hundred() {
        // Hashes from a xorshift generator stand in for BLAKE3's.
        let hash = |seed: u64| -> ChunkHash {
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
        };
        let keys = 100_000u64;
        let bits = (keys * 10).next_multiple_of(64);
        let mut filter = vec![0u64; (bits / 64) as usize];
        for key in 0..keys {
            for bit in bloom_bits(&hash(key), bits, 7) {
                assert!(bit < bits);
                filter[(bit / 64) as usize] |= 1 << (bit % 64);
            }
        }
        let holds = |key| bloom_bits(&hash(key), bits, 7).all(|bit| filter[(bit / 64) as usize] >> (bit % 64) & 1 == 1);
        assert!((0..keys).all(holds), "no false negatives");
        let false_positives = (keys..2 * keys).filter(|&key| holds(key)).count();
        assert!(false_positives < 2_000, "{false_positives} false positives in {keys}");
    }
}
