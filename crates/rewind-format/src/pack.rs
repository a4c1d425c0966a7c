//! Pack file format (`docs/format/pack.md`).
//!
//! A pack is a write-once file of chunks: a 64-byte [`PackHeader`], chunk
//! records, then a footer listing every record and a 32-byte [`PackTrailer`]
//! at the very end. Each record carries the BLAKE3 hash of the chunk's raw
//! bytes and a CRC-32C of its stored bytes, so one chunk is verified without
//! its neighbours, and a pack whose trailer is missing or damaged (a crash
//! while it was written) is told apart from one whose records are damaged.

use rewind_types::ChunkId;

use crate::{crc32c, crc32c_append, crc32c_combine, verify_crc, FormatError, Reader, Writer};

pub const PACK_HEADER_BYTES: usize = 64;
pub const RECORD_HEADER_BYTES: usize = 56;
pub const FOOTER_ENTRY_BYTES: usize = 56;
pub const PACK_TRAILER_BYTES: usize = 32;
pub const PACK_MAGIC: u32 = u32::from_le_bytes(*b"RWPK");
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RWPC");
pub const TRAILER_MAGIC: u32 = u32::from_le_bytes(*b"RWPT");
pub const FORMAT_VERSION: u32 = 1;
/// The largest chunk a record holds (raw or stored): the largest block size.
pub const CHUNK_BYTES_MAX: u32 = 64 * 1024;

/// A BLAKE3 hash of a chunk's raw bytes: the chunk's name.
pub type ChunkHash = [u8; 32];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackHeader {
    pub pack: u64,
}

impl PackHeader {
    pub fn encode(&self) -> [u8; PACK_HEADER_BYTES] {
        let mut writer = Writer::new();
        writer.u32(PACK_MAGIC).u32(FORMAT_VERSION).u64(self.pack);
        writer.into_sealed(PACK_HEADER_BYTES).try_into().expect("header size")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "pack header";
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(PACK_MAGIC)?;
        let version = reader.u32()?;
        let pack = reader.u64()?;
        reader.take(PACK_HEADER_BYTES - 4 - 16)?;
        let stored = reader.u32()?;
        verify_crc(WHAT, stored, crc32c(&bytes[..PACK_HEADER_BYTES - 4]))?;
        crate::check_version(WHAT, version, FORMAT_VERSION)?;
        Ok(PackHeader { pack })
    }
}

/// How a chunk's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    /// As they are (compression did not pay).
    Raw = 0,
    /// A zstd frame.
    Zstd = 1,
}

/// The fixed header in front of each chunk's stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub codec: Codec,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
    pub hash: ChunkHash,
}

impl RecordHeader {
    /// The whole record's size: header, stored bytes, padding to 8.
    pub fn record_bytes(&self) -> u64 {
        (RECORD_HEADER_BYTES as u64 + u64::from(self.stored_bytes)).next_multiple_of(8)
    }

    /// Encodes the header followed by `stored` and the padding.
    pub fn encode_record(&self, stored: &[u8], out: &mut Vec<u8>) {
        assert_eq!(stored.len(), self.stored_bytes as usize, "stored bytes and header disagree");
        let mut writer = Writer::new();
        writer
            .u32(RECORD_MAGIC)
            .u8(self.codec as u8)
            .zeros(3)
            .u32(self.stored_bytes)
            .u32(self.raw_bytes)
            .slice(&self.hash);
        let head = writer.into_bytes();
        let crc = crc32c_append(crc32c(&head), stored);
        let start = out.len();
        out.extend_from_slice(&head);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(stored);
        out.resize(start + self.record_bytes() as usize, 0);
    }

    /// Decodes a record (header and stored bytes) and checks its CRC. Returns
    /// the header and the stored bytes.
    pub fn decode_record(bytes: &[u8]) -> Result<(Self, &[u8]), FormatError> {
        let (header, stored_crc) = Self::decode_header(bytes)?;
        let stored = Reader::new(RECORD_WHAT, &bytes[RECORD_HEADER_BYTES..]).take(header.stored_bytes as usize)?;
        header.verify(bytes, stored_crc, stored)?;
        Ok((header, stored))
    }

    /// [`RecordHeader::decode_record`] of a record read in two parts: its
    /// `header` and, elsewhere, its `stored` bytes (a scatter read put them
    /// where they are wanted). Also returns the CRC-32C of the stored bytes
    /// alone: the record's is checked from it, so they are read once.
    pub fn decode_parts(header: &[u8], stored: &[u8]) -> Result<(Self, u32), FormatError> {
        let (decoded, stored_crc) = Self::decode_header(header)?;
        if stored.len() != decoded.stored_bytes as usize || header.len() != RECORD_HEADER_BYTES {
            return Err(FormatError::Invalid {
                what: RECORD_WHAT,
                reason: format!(
                    "{} header bytes and {} stored bytes read, the header says {RECORD_HEADER_BYTES} and {}",
                    header.len(),
                    stored.len(),
                    decoded.stored_bytes
                ),
            });
        }
        let stored_alone = crc32c(stored);
        let head = crc32c(&header[..RECORD_HEADER_BYTES - 8]);
        verify_crc(RECORD_WHAT, stored_crc, crc32c_combine(head, stored_alone, stored.len() as u64))?;
        Ok((decoded, stored_alone))
    }

    /// The header at the start of `bytes` and the CRC it gives its record;
    /// nothing is checked against the stored bytes yet.
    fn decode_header(bytes: &[u8]) -> Result<(Self, u32), FormatError> {
        let mut reader = Reader::new(RECORD_WHAT, bytes);
        reader.magic(RECORD_MAGIC)?;
        let codec = match reader.u8()? {
            0 => Codec::Raw,
            1 => Codec::Zstd,
            other => return Err(reader.invalid(format!("unknown codec {other}"))),
        };
        reader.take(3)?;
        let stored_bytes = reader.u32()?;
        let raw_bytes = reader.u32()?;
        let hash: ChunkHash = reader.take(32)?.try_into().expect("32 bytes");
        let stored_crc = reader.u32()?;
        if reader.take(4)? != [0; 4] {
            return Err(reader.invalid("reserved bytes 52..56 are not zero"));
        }
        if stored_bytes > CHUNK_BYTES_MAX || raw_bytes > CHUNK_BYTES_MAX {
            return Err(reader.invalid(format!("chunk of {stored_bytes} stored / {raw_bytes} raw bytes is too large")));
        }
        if codec == Codec::Raw && stored_bytes != raw_bytes {
            return Err(reader.invalid("a raw chunk's stored and raw sizes differ"));
        }
        Ok((RecordHeader { codec, stored_bytes, raw_bytes, hash }, stored_crc))
    }

    /// Checks the record's CRC: over the header up to the CRC field, then
    /// the stored bytes.
    fn verify(&self, header: &[u8], stored_crc: u32, stored: &[u8]) -> Result<(), FormatError> {
        debug_assert_eq!(stored.len(), self.stored_bytes as usize);
        verify_crc(RECORD_WHAT, stored_crc, crc32c_append(crc32c(&header[..RECORD_HEADER_BYTES - 8]), stored))
    }
}

const RECORD_WHAT: &str = "pack record";

/// One footer entry: which chunk a record holds and where it is in the pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FooterEntry {
    pub hash: ChunkHash,
    /// The id the chunk had when the pack was written. The chunk table is the
    /// authority on where an id's chunk is; this lets it be rebuilt.
    pub id: ChunkId,
    /// Byte offset of the record from the start of the pack.
    pub offset: u64,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
}

impl FooterEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut writer = Writer::new();
        writer.slice(&self.hash).u64(self.id.0).u64(self.offset).u32(self.stored_bytes).u32(self.raw_bytes);
        out.extend_from_slice(&writer.into_bytes());
    }

    /// Decodes a footer (after its CRC has been checked against the trailer).
    pub fn decode_all(bytes: &[u8]) -> Result<Vec<FooterEntry>, FormatError> {
        const WHAT: &str = "pack footer";
        if !bytes.len().is_multiple_of(FOOTER_ENTRY_BYTES) {
            return Err(FormatError::Invalid {
                what: WHAT,
                reason: format!("{} bytes is not whole entries", bytes.len()),
            });
        }
        let mut reader = Reader::new(WHAT, bytes);
        let mut entries = Vec::with_capacity(bytes.len() / FOOTER_ENTRY_BYTES);
        while reader.remaining() > 0 {
            let hash = reader.take(32)?.try_into().expect("32 bytes");
            let id = match reader.u64()? {
                0 => return Err(reader.invalid("chunk id 0")),
                id => ChunkId(id),
            };
            let offset = reader.u64()?;
            let stored_bytes = reader.u32()?;
            let raw_bytes = reader.u32()?;
            // Readers size their buffers by these: a scrub of a 208-byte
            // pack whose footer claimed 4 GiB chunks allocated 3.9 GB
            // (found by the `pack` fuzz target).
            if stored_bytes > CHUNK_BYTES_MAX || raw_bytes > CHUNK_BYTES_MAX {
                return Err(reader.invalid(format!(
                    "chunk {id} of {stored_bytes} stored / {raw_bytes} raw bytes is larger than a block can be"
                )));
            }
            entries.push(FooterEntry { hash, id, offset, stored_bytes, raw_bytes });
        }
        Ok(entries)
    }
}

/// The last 32 bytes of a sealed pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackTrailer {
    pub entry_count: u32,
    /// Byte offset of the footer from the start of the pack.
    pub footer_offset: u64,
    pub footer_crc32c: u32,
}

impl PackTrailer {
    pub fn footer_bytes(&self) -> u64 {
        u64::from(self.entry_count) * FOOTER_ENTRY_BYTES as u64
    }

    pub fn encode(&self) -> [u8; PACK_TRAILER_BYTES] {
        let mut writer = Writer::new();
        writer.u32(TRAILER_MAGIC).u32(self.entry_count).u64(self.footer_offset).u32(self.footer_crc32c);
        writer.into_sealed(PACK_TRAILER_BYTES).try_into().expect("trailer size")
    }

    /// Decodes the trailer of a pack of `pack_bytes` bytes and checks that
    /// the footer it points to lies between the header and the trailer.
    pub fn decode(bytes: &[u8], pack_bytes: u64) -> Result<Self, FormatError> {
        const WHAT: &str = "pack trailer";
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(TRAILER_MAGIC)?;
        let entry_count = reader.u32()?;
        let footer_offset = reader.u64()?;
        let footer_crc32c = reader.u32()?;
        reader.take(PACK_TRAILER_BYTES - 24)?;
        let stored = reader.u32()?;
        verify_crc(WHAT, stored, crc32c(&bytes[..PACK_TRAILER_BYTES - 4]))?;
        let trailer = PackTrailer { entry_count, footer_offset, footer_crc32c };
        // Both sides must exist: a footer end past u64 once matched a pack
        // too short for a trailer, both being `None` (found by fuzzing).
        let footer_end = footer_offset.checked_add(trailer.footer_bytes());
        let trailer_offset = pack_bytes.checked_sub(PACK_TRAILER_BYTES as u64);
        if footer_offset < PACK_HEADER_BYTES as u64 || footer_end.is_none() || footer_end != trailer_offset {
            return Err(reader.invalid(format!(
                "footer of {entry_count} entries at byte {footer_offset} does not end where the trailer begins \
                 in a pack of {pack_bytes} bytes"
            )));
        }
        Ok(trailer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(codec: Codec, stored: &[u8], raw_bytes: u32) -> (RecordHeader, Vec<u8>) {
        let header = RecordHeader { codec, stored_bytes: stored.len() as u32, raw_bytes, hash: [7; 32] };
        let mut out = Vec::new();
        header.encode_record(stored, &mut out);
        (header, out)
    }

    #[test]
    fn records_round_trip_and_are_padded_to_8() {
        let (header, bytes) = record(Codec::Zstd, b"compressed!", 4096);
        assert_eq!(bytes.len() as u64, header.record_bytes());
        assert_eq!(bytes.len() % 8, 0);
        let (decoded, stored) = RecordHeader::decode_record(&bytes).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(stored, b"compressed!");
    }

    #[test]
    fn every_flipped_bit_of_a_record_is_caught() {
        let (header, bytes) = record(Codec::Raw, &[0xA5; 40], 40);
        let meaningful = RECORD_HEADER_BYTES + header.stored_bytes as usize;
        for bit in 0..meaningful * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(RecordHeader::decode_record(&damaged).is_err(), "bit {bit} flipped went unnoticed");
        }
    }

    #[test]
    fn raw_records_must_not_claim_a_different_raw_size() {
        let (_, bytes) = record(Codec::Raw, &[1; 16], 32);
        let error = RecordHeader::decode_record(&bytes).unwrap_err();
        assert!(error.to_string().contains("sizes differ"), "{error}");
    }

    #[test]
    fn trailer_must_point_at_a_footer_that_fits() {
        let trailer = PackTrailer { entry_count: 2, footer_offset: 1000, footer_crc32c: 5 };
        let pack_bytes = 1000 + 2 * FOOTER_ENTRY_BYTES as u64 + PACK_TRAILER_BYTES as u64;
        assert_eq!(PackTrailer::decode(&trailer.encode(), pack_bytes).unwrap(), trailer);
        let error = PackTrailer::decode(&trailer.encode(), pack_bytes + 8).unwrap_err();
        assert!(error.to_string().contains("does not end where the trailer begins"), "{error}");
        // A footer ending past u64 in a pack too short for a trailer
        // (fuzz/regressions/pack/crash-5c05f430…).
        let overflowing = PackTrailer { entry_count: 1, footer_offset: u64::MAX - 8, footer_crc32c: 5 };
        assert!(PackTrailer::decode(&overflowing.encode(), 16).is_err());
    }

    #[test]
    fn header_round_trips_and_rejects_other_versions() {
        let header = PackHeader { pack: 42 };
        assert_eq!(PackHeader::decode(&header.encode()).unwrap(), header);
        let mut bytes = header.encode();
        bytes[4] = 2;
        let crc = crc32c(&bytes[..60]);
        bytes[60..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(PackHeader::decode(&bytes), Err(FormatError::UnsupportedVersion { found: 2, .. })));
    }
}
