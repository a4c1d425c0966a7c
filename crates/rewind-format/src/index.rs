//! Version index run format (`docs/format/index-run.md`).
//!
//! A run is an immutable file of [`Version`] entries sorted by
//! `(block, timestamp)`, in 4 KiB pages: page 0 is the [`RunHeader`], then the
//! data pages of up to [`ENTRIES_PER_PAGE`] entries each, then the *fence*: the
//! first key of every data page, which readers keep in memory to find the one
//! page that can hold a key.

use rewind_types::{BlockIndex, ChunkId, Timestamp, Version, VersionData};

use crate::{crc32c, verify_crc, FormatError, Reader, Writer};

pub const PAGE_BYTES: usize = 4096;
pub const ENTRY_BYTES: usize = 32;
pub const ENTRIES_PER_PAGE: usize = 127;
pub const FENCE_KEY_BYTES: usize = 16;
pub const RUN_MAGIC: u32 = u32::from_le_bytes(*b"RWIX");
pub const FORMAT_VERSION: u32 = 1;

const _: () = assert!(ENTRIES_PER_PAGE * ENTRY_BYTES + 32 == PAGE_BYTES);
const PAGE_TRAILER_OFFSET: usize = ENTRIES_PER_PAGE * ENTRY_BYTES;
const CHECKSUM_OFFSET: usize = PAGE_BYTES - 4;

const KIND_ZERO: u8 = 1;
const KIND_JOURNAL: u8 = 2;
const KIND_CHUNK: u8 = 3;

/// The sort key of an entry.
pub type Key = (u64, u64);

pub fn key_of(version: &Version) -> Key {
    (version.block.0, version.timestamp.unix_nanos())
}

pub fn encode_entry(version: &Version, out: &mut [u8]) {
    let (kind, location) = match version.data {
        VersionData::Zero => (KIND_ZERO, 0),
        VersionData::Journal { segment, offset } => (KIND_JOURNAL, u64::from(segment) << 32 | u64::from(offset)),
        VersionData::Chunk(id) => (KIND_CHUNK, id.0),
    };
    out[0..8].copy_from_slice(&version.block.0.to_le_bytes());
    out[8..16].copy_from_slice(&version.timestamp.unix_nanos().to_le_bytes());
    out[16..24].copy_from_slice(&location.to_le_bytes());
    out[24..28].copy_from_slice(&version.crc32c.to_le_bytes());
    out[28] = kind;
    out[29..32].fill(0);
}

pub fn decode_entry(bytes: &[u8]) -> Result<Version, FormatError> {
    let mut reader = Reader::new("index entry", bytes);
    let block = BlockIndex(reader.u64()?);
    let timestamp = Timestamp::from_unix_nanos(reader.u64()?);
    let location = reader.u64()?;
    let crc32c = reader.u32()?;
    let data = match reader.u8()? {
        KIND_ZERO => VersionData::Zero,
        KIND_JOURNAL => VersionData::Journal { segment: (location >> 32) as u32, offset: location as u32 },
        KIND_CHUNK if location != 0 => VersionData::Chunk(ChunkId(location)),
        other => return Err(reader.invalid(format!("unknown version kind {other}"))),
    };
    Ok(Version { block, timestamp, data, crc32c })
}

/// Encodes one data page holding `entries` (sorted, at most
/// [`ENTRIES_PER_PAGE`]) as page `page_number` of its run.
pub fn encode_page(page_number: u64, entries: &[Version], out: &mut [u8; PAGE_BYTES]) {
    assert!(!entries.is_empty() && entries.len() <= ENTRIES_PER_PAGE);
    out.fill(0);
    for (slot, version) in out.chunks_exact_mut(ENTRY_BYTES).zip(entries) {
        encode_entry(version, slot);
    }
    let trailer = &mut out[PAGE_TRAILER_OFFSET..];
    trailer[0..4].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    trailer[8..16].copy_from_slice(&page_number.to_le_bytes());
    let checksum = crc32c(&out[..CHECKSUM_OFFSET]);
    out[CHECKSUM_OFFSET..].copy_from_slice(&checksum.to_le_bytes());
}

/// A verified data page, read in place.
#[derive(Clone, Copy)]
pub struct Page<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> Page<'a> {
    /// Checks the page's checksum and that it is the page it claims to be.
    pub fn verify(bytes: &'a [u8], page_number: u64) -> Result<Self, FormatError> {
        const WHAT: &str = "index page";
        if bytes.len() != PAGE_BYTES {
            return Err(FormatError::Truncated { what: WHAT, available: bytes.len(), needed: PAGE_BYTES });
        }
        let stored = u32::from_le_bytes(bytes[CHECKSUM_OFFSET..].try_into().expect("4"));
        verify_crc(WHAT, stored, crc32c(&bytes[..CHECKSUM_OFFSET]))?;
        let mut reader = Reader::new(WHAT, &bytes[PAGE_TRAILER_OFFSET..]);
        let count = reader.u32()? as usize;
        reader.take(4)?;
        let number = reader.u64()?;
        if number != page_number {
            return Err(reader.invalid(format!("page {page_number} holds page {number}")));
        }
        if count == 0 || count > ENTRIES_PER_PAGE {
            return Err(reader.invalid(format!("page holds {count} entries")));
        }
        Ok(Page { bytes, count })
    }

    /// A page that [`Page::verify`] accepted earlier (held in a cache).
    pub fn assume_verified(bytes: &'a [u8]) -> Self {
        assert_eq!(bytes.len(), PAGE_BYTES);
        let count = u32::from_le_bytes(bytes[PAGE_TRAILER_OFFSET..PAGE_TRAILER_OFFSET + 4].try_into().expect("4"));
        assert!(count > 0 && count as usize <= ENTRIES_PER_PAGE, "page was verified");
        Page { bytes, count: count as usize }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn key(&self, index: usize) -> Key {
        assert!(index < self.count);
        let at = index * ENTRY_BYTES;
        let block = u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8"));
        let timestamp = u64::from_le_bytes(self.bytes[at + 8..at + 16].try_into().expect("8"));
        (block, timestamp)
    }

    pub fn entry(&self, index: usize) -> Result<Version, FormatError> {
        assert!(index < self.count);
        decode_entry(&self.bytes[index * ENTRY_BYTES..(index + 1) * ENTRY_BYTES])
    }

    /// Number of entries with key `<= key` (entries are sorted).
    pub fn count_le(&self, key: Key) -> usize {
        self.count_le_between(key, 0, self.count)
    }

    /// [`Page::count_le`] for a caller that knows the first `at_least`
    /// entries are `<= key` (it looked up a smaller key in this page
    /// before): gallops forward from there, so a lookup of each of many
    /// neighbouring blocks in turn costs a few comparisons, not a search of
    /// the page each.
    pub fn count_le_from(&self, key: Key, at_least: usize) -> usize {
        assert!(at_least <= self.count);
        assert!(at_least == 0 || self.key(at_least - 1) <= key, "the entries before the start are <= the key");
        let (mut low, mut step) = (at_least, 1);
        let high = loop {
            let probe = low + step - 1;
            if probe >= self.count {
                break self.count;
            }
            if self.key(probe) > key {
                break probe;
            }
            low = probe + 1;
            step *= 2;
        };
        self.count_le_between(key, low, high)
    }

    /// The binary search of both: entries before `low` are `<= key`, those
    /// from `high` on are not.
    fn count_le_between(&self, key: Key, mut low: usize, mut high: usize) -> usize {
        while low < high {
            let middle = (low + high) / 2;
            if self.key(middle) <= key {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunHeader {
    pub entry_count: u64,
    pub data_page_count: u64,
    pub timestamp_min: Timestamp,
    pub timestamp_max: Timestamp,
    pub fence_crc32c: u32,
}

impl RunHeader {
    pub fn encode(&self) -> [u8; PAGE_BYTES] {
        let mut writer = Writer::new();
        writer
            .u32(RUN_MAGIC)
            .u32(FORMAT_VERSION)
            .u64(self.entry_count)
            .u64(self.data_page_count)
            .u64(self.timestamp_min.unix_nanos())
            .u64(self.timestamp_max.unix_nanos())
            .u32(self.fence_crc32c);
        writer.into_sealed(PAGE_BYTES).try_into().expect("one page")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "index run header";
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(RUN_MAGIC)?;
        if bytes.len() < PAGE_BYTES {
            return Err(FormatError::Truncated { what: WHAT, available: bytes.len(), needed: PAGE_BYTES });
        }
        let stored = u32::from_le_bytes(bytes[CHECKSUM_OFFSET..PAGE_BYTES].try_into().expect("4"));
        verify_crc(WHAT, stored, crc32c(&bytes[..CHECKSUM_OFFSET]))?;
        let version = reader.u32()?;
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { what: WHAT, found: version, supported: FORMAT_VERSION });
        }
        let header = RunHeader {
            entry_count: reader.u64()?,
            data_page_count: reader.u64()?,
            timestamp_min: Timestamp::from_unix_nanos(reader.u64()?),
            timestamp_max: Timestamp::from_unix_nanos(reader.u64()?),
            fence_crc32c: reader.u32()?,
        };
        let pages_needed = header.entry_count.div_ceil(ENTRIES_PER_PAGE as u64);
        if header.entry_count == 0 || header.data_page_count != pages_needed {
            return Err(
                reader.invalid(format!("{} entries cannot fill {} pages", header.entry_count, header.data_page_count))
            );
        }
        // So that `fence_offset` and `fence_bytes` cannot overflow.
        if header.end_bytes().is_none() {
            return Err(reader.invalid(format!("{} pages do not fit in a file", header.data_page_count)));
        }
        Ok(header)
    }

    /// Byte offset of the fence, right after the data pages.
    pub fn fence_offset(&self) -> u64 {
        (1 + self.data_page_count) * PAGE_BYTES as u64
    }

    pub fn fence_bytes(&self) -> u64 {
        self.data_page_count * FENCE_KEY_BYTES as u64
    }

    /// Where the fence ends: the size of the run file.
    fn end_bytes(&self) -> Option<u64> {
        let fence_offset = self.data_page_count.checked_add(1)?.checked_mul(PAGE_BYTES as u64)?;
        fence_offset.checked_add(self.data_page_count.checked_mul(FENCE_KEY_BYTES as u64)?)
    }
}

pub fn encode_fence(keys: &[Key]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(keys.len() * FENCE_KEY_BYTES);
    for (block, timestamp) in keys {
        bytes.extend_from_slice(&block.to_le_bytes());
        bytes.extend_from_slice(&timestamp.to_le_bytes());
    }
    bytes
}

pub fn decode_fence(bytes: &[u8], header: &RunHeader) -> Result<Vec<Key>, FormatError> {
    verify_crc("index run fence", header.fence_crc32c, crc32c(bytes))?;
    let keys: Vec<Key> = bytes
        .chunks_exact(FENCE_KEY_BYTES)
        .map(|key| {
            let block = u64::from_le_bytes(key[..8].try_into().expect("8"));
            let timestamp = u64::from_le_bytes(key[8..].try_into().expect("8"));
            (block, timestamp)
        })
        .collect();
    if keys.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err(FormatError::Invalid { what: "index run fence", reason: "keys are not increasing".into() });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(block: u64, timestamp: u64) -> Version {
        Version {
            block: BlockIndex(block),
            timestamp: Timestamp::from_unix_nanos(timestamp),
            data: VersionData::Journal { segment: 3, offset: 4096 * block as u32 },
            crc32c: block as u32 ^ 0xdead,
        }
    }

    #[test]
    fn page_round_trip_search_and_damage() {
        let entries: Vec<Version> = (0..ENTRIES_PER_PAGE as u64).map(|i| version(i / 2, i)).collect();
        let mut page = [0u8; PAGE_BYTES];
        encode_page(5, &entries, &mut page);
        let view = Page::verify(&page, 5).unwrap();
        assert_eq!(view.len(), ENTRIES_PER_PAGE);
        assert_eq!(view.entry(7).unwrap(), entries[7]);
        assert_eq!(view.count_le((3, 6)), 7);
        assert_eq!(view.count_le((0, 0)), 1);
        assert_eq!(view.count_le((100, 0)), ENTRIES_PER_PAGE);
        for key in [(0, 0), (0, 1), (3, 6), (3, 7), (30, 60), (62, 0), (63, 126), (100, 0)] {
            let count = view.count_le(key);
            for start in 0..=count {
                assert_eq!(view.count_le_from(key, start), count, "key {key:?} from {start}");
            }
        }
        assert!(Page::verify(&page, 6).is_err(), "misplaced page");
        page[100] ^= 4;
        assert!(matches!(Page::verify(&page, 5), Err(FormatError::Checksum { .. })));
    }

    #[test]
    fn zero_entries_and_header_round_trip() {
        let mut bytes = [0u8; ENTRY_BYTES];
        for data in [VersionData::Zero, VersionData::Chunk(ChunkId(1 << 40))] {
            let entry = Version { data, ..version(9, 9) };
            encode_entry(&entry, &mut bytes);
            assert_eq!(decode_entry(&bytes).unwrap(), entry);
        }
        bytes[16..24].fill(0);
        assert!(decode_entry(&bytes).is_err(), "chunk ids start at 1");
        let header = RunHeader {
            entry_count: 128,
            data_page_count: 2,
            timestamp_min: Timestamp::from_unix_nanos(1),
            timestamp_max: Timestamp::from_unix_nanos(2),
            fence_crc32c: 3,
        };
        assert_eq!(RunHeader::decode(&header.encode()).unwrap(), header);
        let lying = RunHeader { data_page_count: 5, ..header };
        assert!(RunHeader::decode(&lying.encode()).is_err());
    }
}
