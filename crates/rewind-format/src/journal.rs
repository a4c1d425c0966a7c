//! Journal segment and record formats (`docs/format/journal.md`).
//!
//! A segment file is a 64-byte [`SegmentHeader`] followed by records, each a
//! 64-byte [`RecordHeader`], then (write records only) one CRC-32C per block
//! padded to 8 bytes, then the blocks. The header checksum covers the header
//! and the CRC array, so a reader verifies a whole record, or one block of it
//! against its own CRC without reading its neighbours.

use rewind_types::{BlockIndex, BlockSize, ChunkId, Lsn, Timestamp, Version, VersionData};

use crate::{crc32c, crc32c_append, verify_crc, FormatError, Reader, Writer};

pub const SEGMENT_HEADER_BYTES: usize = 64;
pub const RECORD_HEADER_BYTES: usize = 64;
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"RWJS");
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RWJR");
pub const FORMAT_VERSION: u32 = 1;
/// The largest write record's payload; larger writes are split.
pub const WRITE_RECORD_BYTES_MAX: u64 = 64 * 1024 * 1024;

const CHECKSUM_OFFSET: usize = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub segment: u32,
    pub block_size: BlockSize,
    /// LSN of the first record in this segment.
    pub lsn_first: Lsn,
    /// Time of the last record before this segment (of the volume's
    /// creation, for the first): the previous segment holds nothing newer,
    /// which tells when it may be reclaimed.
    pub timestamp_before: Timestamp,
    /// The file held an earlier segment and was reused for this one: past
    /// this segment's records it holds that segment's bytes, not zeros. Its
    /// records (all with LSNs below `lsn_first`) cannot pass for this
    /// segment's, whose LSNs start there.
    pub recycled: bool,
    /// The file is new, and the journal may write zeros ahead of the
    /// records in it (so that commits find its blocks written, not
    /// allocated and unwritten): past the records it may hold those zeros.
    pub written_ahead: bool,
}

/// Bit 0 of the segment header's flags.
const SEGMENT_FLAG_RECYCLED: u32 = 1;
/// Bit 1 of the segment header's flags.
const SEGMENT_FLAG_WRITTEN_AHEAD: u32 = 2;

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut writer = Writer::new();
        writer
            .u32(SEGMENT_MAGIC)
            .u32(FORMAT_VERSION)
            .u32(self.segment)
            .u32(self.block_size.bytes())
            .u64(self.lsn_first.0)
            .u64(self.timestamp_before.unix_nanos())
            .u32(
                if self.recycled { SEGMENT_FLAG_RECYCLED } else { 0 }
                    | if self.written_ahead { SEGMENT_FLAG_WRITTEN_AHEAD } else { 0 },
            )
            .zeros(CHECKSUM_OFFSET - 36);
        seal(writer.into_bytes(), &[])
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "journal segment header";
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(SEGMENT_MAGIC)?;
        let version = reader.u32()?;
        let segment = reader.u32()?;
        let block_size = reader.u32()?;
        let lsn_first = Lsn(reader.u64()?);
        let timestamp_before = Timestamp::from_unix_nanos(reader.u64()?);
        let flags = reader.u32()?;
        reader.take(CHECKSUM_OFFSET - 36)?;
        let stored = reader.u32()?;
        verify_crc(WHAT, stored, crc32c(&bytes[..CHECKSUM_OFFSET]))?;
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { what: WHAT, found: version, supported: FORMAT_VERSION });
        }
        let block_size = BlockSize::new(block_size).map_err(|error| reader.invalid(error.to_string()))?;
        if flags & !(SEGMENT_FLAG_RECYCLED | SEGMENT_FLAG_WRITTEN_AHEAD) != 0 {
            return Err(reader.invalid(format!("unknown segment flags {flags:#x}")));
        }
        let recycled = flags & SEGMENT_FLAG_RECYCLED != 0;
        let written_ahead = flags & SEGMENT_FLAG_WRITTEN_AHEAD != 0;
        Ok(SegmentHeader { segment, block_size, lsn_first, timestamp_before, recycled, written_ahead })
    }

    /// Whether the file's size may not tell where the segment's records
    /// end: past them it may hold an earlier segment's bytes or zeros
    /// written ahead, not only the padding of their last sector.
    pub fn bytes_follow_records(&self) -> bool {
        self.recycled || self.written_ahead
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// Blocks with their contents.
    Write = 1,
    /// Blocks that now read as zeros (TRIM, WRITE_ZEROES); no payload.
    Zero = 2,
    /// Versions copied to history before they were overwritten (the COW
    /// layout): `block_count` entries of [`COPY_ENTRY_BYTES`] where a write
    /// record has its CRC array, each a block, its version's own time, and
    /// where its bytes now are (a chunk, or zeros). No payload.
    Copy = 3,
    /// Vouches that every record up to its LSN was durable when it was
    /// written, so that recovery can tell damage in those records from a
    /// torn write even when no later record would. It takes no LSN of its
    /// own (its LSN is the last record's), covers no blocks, and is written
    /// once the journal has been quiet for a moment after a commit.
    Vouch = 4,
    /// Written by `rewind volume repair` over records that were damaged
    /// after they were acknowledged: it takes their place byte for byte
    /// (`block_first` holds the length of its zero padding, which the
    /// checksum covers) and their LSNs (`block_count` of them, from its
    /// LSN), so that the intact records after it are kept. Their writes
    /// are lost, and said to be.
    Lost = 5,
    /// Several writes and zeroings at one time, all or none: one operation
    /// on a file tree (a file's blocks and its inode, two directories of a
    /// rename). `block_first` holds the number of extents, `block_count`
    /// the number of blocks with data; the CRC area is the extent table
    /// ([`COMPOUND_EXTENT_BYTES`] each, sorted by block, disjoint) followed by
    /// the data blocks' CRCs, and the payload is the data blocks in extent
    /// order. Atomic because it is one record: a torn one is cut off whole.
    Compound = 6,
}

/// Bytes of one extent of a compound record.
pub const COMPOUND_EXTENT_BYTES: usize = 16;
/// The most extents one compound record holds.
pub const COMPOUND_EXTENTS_MAX: u64 = 4096;

/// Bytes of one entry of a copy record.
pub const COPY_ENTRY_BYTES: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub block_size: BlockSize,
    pub lsn: Lsn,
    /// The journal's durable LSN when this record was appended. Recovery uses
    /// it to tell a torn tail from corruption: a damaged record that a later,
    /// intact record vouches for as durable was acknowledged, so it is
    /// corruption, not a torn write.
    pub lsn_committed: Lsn,
    pub timestamp: Timestamp,
    pub block_first: BlockIndex,
    pub block_count: u32,
    /// Write and zero records of a revert's background copy only: the time
    /// of that revert (`None` otherwise). Their blocks are the volume as at
    /// the point it went back to, in effect from the revert's time: not a
    /// write, nor history, and `timestamp` is only the newest time so far.
    pub revert: Option<Timestamp>,
}

impl RecordHeader {
    /// Bytes of the per-block CRC array after the header, padding included.
    pub fn crc_area_bytes(&self) -> usize {
        match self.kind {
            RecordKind::Write => (self.block_count as usize * 4).next_multiple_of(8),
            RecordKind::Zero | RecordKind::Vouch => 0,
            RecordKind::Copy => self.block_count as usize * COPY_ENTRY_BYTES,
            RecordKind::Lost => self.block_first.0 as usize,
            RecordKind::Compound => {
                self.block_first.0 as usize * COMPOUND_EXTENT_BYTES
                    + (self.block_count as usize * 4).next_multiple_of(8)
            }
        }
    }

    /// Where the per-block CRCs start in the CRC area.
    pub fn block_crcs_offset(&self) -> usize {
        match self.kind {
            RecordKind::Compound => self.block_first.0 as usize * COMPOUND_EXTENT_BYTES,
            _ => 0,
        }
    }

    /// Offset of the first block's bytes from the start of the record.
    pub fn data_offset(&self) -> usize {
        RECORD_HEADER_BYTES + self.crc_area_bytes()
    }

    pub fn data_bytes(&self) -> u64 {
        match self.kind {
            RecordKind::Write | RecordKind::Compound => {
                u64::from(self.block_count) * u64::from(self.block_size.bytes())
            }
            RecordKind::Zero | RecordKind::Copy | RecordKind::Vouch | RecordKind::Lost => 0,
        }
    }

    pub fn record_bytes(&self) -> u64 {
        self.data_offset() as u64 + self.data_bytes()
    }

    fn encode_unsealed(&self) -> Vec<u8> {
        let mut writer = Writer::new();
        writer
            .u32(RECORD_MAGIC)
            .u8(self.kind as u8)
            .u8(self.block_size.shift() as u8)
            .zeros(2)
            .u64(self.lsn.0)
            .u64(self.timestamp.unix_nanos())
            .u64(self.block_first.0)
            .u32(self.block_count)
            .u64(self.lsn_committed.0)
            .u64(self.revert.map_or(0, Timestamp::unix_nanos))
            .zeros(CHECKSUM_OFFSET - 52);
        writer.into_bytes()
    }

    /// Decodes the fixed header. The checksum is not checked here because it
    /// also covers the CRC array: call [`RecordHeader::verify`] once that has
    /// been read too.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "journal record header";
        let mut reader = Reader::new(WHAT, bytes);
        reader.magic(RECORD_MAGIC)?;
        let kind = match reader.u8()? {
            1 => RecordKind::Write,
            2 => RecordKind::Zero,
            3 => RecordKind::Copy,
            4 => RecordKind::Vouch,
            5 => RecordKind::Lost,
            6 => RecordKind::Compound,
            other => return Err(reader.invalid(format!("unknown record kind {other}"))),
        };
        let shift = reader.u8()?;
        let block_size = 1u32
            .checked_shl(u32::from(shift))
            .and_then(|bytes| BlockSize::new(bytes).ok())
            .ok_or_else(|| reader.invalid(format!("bad block size shift {shift}")))?;
        reader.take(2)?;
        let lsn = Lsn(reader.u64()?);
        let timestamp = Timestamp::from_unix_nanos(reader.u64()?);
        let block_first = BlockIndex(reader.u64()?);
        let block_count = reader.u32()?;
        let lsn_committed = Lsn(reader.u64()?);
        let revert = match reader.u64()? {
            0 => None,
            nanos => Some(Timestamp::from_unix_nanos(nanos)),
        };
        if revert.is_some() && !matches!(kind, RecordKind::Write | RecordKind::Zero) {
            return Err(reader.invalid("only write and zero records belong to a revert's copy"));
        }
        let header = RecordHeader { kind, block_size, lsn, lsn_committed, timestamp, block_first, block_count, revert };
        if kind == RecordKind::Vouch {
            if block_count != 0 || lsn_committed != lsn {
                return Err(reader.invalid("a vouch record covers no blocks and vouches for its own LSN"));
            }
        } else if kind == RecordKind::Lost {
            let padding = block_first.0;
            if !padding.is_multiple_of(8) || padding > LOST_PADDING_BYTES_MAX || lsn_committed >= lsn.max(Lsn(1)) {
                return Err(reader.invalid(format!("a lost record of {padding} padding bytes")));
            }
        } else {
            if kind == RecordKind::Compound {
                if !(1..=COMPOUND_EXTENTS_MAX).contains(&block_first.0) {
                    return Err(reader.invalid(format!("a compound record of {} extents", block_first.0)));
                }
            } else if block_count == 0 {
                return Err(reader.invalid("record covers no blocks"));
            }
            if header.data_bytes() > WRITE_RECORD_BYTES_MAX {
                return Err(reader.invalid(format!("record payload of {} bytes is too large", header.data_bytes())));
            }
            if lsn_committed >= lsn {
                return Err(reader.invalid(format!("record {lsn} claims {lsn_committed} was committed before it")));
            }
        }
        reader.take(CHECKSUM_OFFSET - 52 + 4)?;
        Ok(header)
    }

    /// Checks the record checksum over `header` (the 64 header bytes) and
    /// `crc_area` (the CRC array, [`RecordHeader::crc_area_bytes`] long).
    pub fn verify(header: &[u8], crc_area: &[u8]) -> Result<(), FormatError> {
        let stored = u32::from_le_bytes(header[CHECKSUM_OFFSET..RECORD_HEADER_BYTES].try_into().expect("4"));
        let computed = crc32c_append(crc32c(&header[..CHECKSUM_OFFSET]), crc_area);
        verify_crc("journal record", stored, computed)
    }
}

/// The fields of a record header that do not depend on its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordStamp {
    pub block_size: BlockSize,
    pub lsn: Lsn,
    pub lsn_committed: Lsn,
    pub timestamp: Timestamp,
    pub block_first: BlockIndex,
    /// See [`RecordHeader::revert`].
    pub revert: Option<Timestamp>,
}

impl RecordStamp {
    fn header(self, kind: RecordKind, block_count: u32) -> RecordHeader {
        assert!(
            self.revert.is_none() || matches!(kind, RecordKind::Write | RecordKind::Zero),
            "only write and zero records belong to a revert's copy"
        );
        RecordHeader {
            kind,
            block_size: self.block_size,
            lsn: self.lsn,
            lsn_committed: self.lsn_committed,
            timestamp: self.timestamp,
            block_first: self.block_first,
            block_count,
            revert: self.revert,
        }
    }
}

/// The CRC of data block `index` from a record's CRC area (see
/// [`RecordHeader::block_crcs_offset`]).
pub fn block_crc(header: &RecordHeader, crc_area: &[u8], index: u32) -> u32 {
    let at = header.block_crcs_offset() + index as usize * 4;
    u32::from_le_bytes(crc_area[at..at + 4].try_into().expect("4 bytes"))
}

/// Appends a write record for `data` (a whole number of blocks) to `out`, and
/// the CRC of each block to `crcs`.
pub fn append_write_record(out: &mut Vec<u8>, crcs: &mut Vec<u32>, stamp: RecordStamp, data: &[u8]) {
    let block_bytes = stamp.block_size.bytes() as usize;
    assert!(!data.is_empty() && data.len().is_multiple_of(block_bytes), "whole blocks only");
    assert!(data.len() as u64 <= WRITE_RECORD_BYTES_MAX);
    let block_count = u32::try_from(data.len() / block_bytes).expect("bounded by WRITE_RECORD_BYTES_MAX");
    let header = stamp.header(RecordKind::Write, block_count);
    append_with_blocks(out, crcs, &header, Vec::new(), &[data]);
}

/// Appends a record whose CRC area is `crc_area` (what comes before the
/// blocks' CRCs, if anything), the CRC of each block of `data`, and its
/// padding, followed by the blocks; pushes their CRCs onto `crcs`.
fn append_with_blocks(
    out: &mut Vec<u8>,
    crcs: &mut Vec<u32>,
    header: &RecordHeader,
    mut crc_area: Vec<u8>,
    data: &[&[u8]],
) {
    let block_bytes = header.block_size.bytes() as usize;
    let crc_first = crcs.len();
    crcs.extend(data.iter().flat_map(|slice| slice.chunks_exact(block_bytes)).map(crc32c));
    crc_area.reserve(header.crc_area_bytes() - crc_area.len());
    for crc in &crcs[crc_first..] {
        crc_area.extend_from_slice(&crc.to_le_bytes());
    }
    crc_area.resize(header.crc_area_bytes(), 0);
    out.reserve(header.record_bytes() as usize);
    out.extend_from_slice(&seal(header.encode_unsealed(), &crc_area));
    out.extend_from_slice(&crc_area);
    for slice in data {
        out.extend_from_slice(slice);
    }
}

/// One extent of a compound record: blocks that now hold data (taken in turn
/// from the record's payload) or read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompoundExtent {
    pub block_first: BlockIndex,
    pub block_count: u32,
    pub zero: bool,
}

const COMPOUND_EXTENT_ZERO: u32 = 1;

/// Appends a compound record (see [`RecordKind::Compound`]) to `out`: `extents`
/// sorted by block and disjoint, `data` the blocks of the data extents in
/// order; pushes each data block's CRC-32C onto `crcs`.
pub fn append_compound_record(
    out: &mut Vec<u8>,
    crcs: &mut Vec<u32>,
    stamp: RecordStamp,
    extents: &[CompoundExtent],
    data: &[&[u8]],
) {
    let block_bytes = stamp.block_size.bytes() as usize;
    assert!(!extents.is_empty() && extents.len() as u64 <= COMPOUND_EXTENTS_MAX);
    let data_extents = extents.iter().filter(|extent| !extent.zero);
    assert!(
        data_extents
            .clone()
            .map(|extent| extent.block_count as usize * block_bytes)
            .eq(data.iter().map(|slice| slice.len())),
        "one slice of its blocks per data extent"
    );
    let data_bytes: usize = data.iter().map(|slice| slice.len()).sum();
    assert!(data_bytes as u64 <= WRITE_RECORD_BYTES_MAX);
    let data_blocks = (data_bytes / block_bytes) as u64;
    assert!(extents.iter().all(|extent| extent.block_count > 0), "extents cover blocks");
    assert!(
        extents.windows(2).all(|pair| pair[0].block_first.0 + u64::from(pair[0].block_count) <= pair[1].block_first.0),
        "extents sorted and disjoint"
    );
    let header = RecordStamp { block_first: BlockIndex(extents.len() as u64), ..stamp }
        .header(RecordKind::Compound, u32::try_from(data_blocks).expect("bounded by WRITE_RECORD_BYTES_MAX"));
    let mut crc_area = Writer::new();
    for extent in extents {
        crc_area.u64(extent.block_first.0).u32(extent.block_count).u32(if extent.zero {
            COMPOUND_EXTENT_ZERO
        } else {
            0
        });
    }
    append_with_blocks(out, crcs, &header, crc_area.into_bytes(), data);
}

/// A compound record's payload (the data extents' blocks, back to back, as
/// recovery reads them) cut into a slice per data extent, as
/// [`append_compound_record`] takes them.
pub fn split_compound_payload<'a>(extents: &[CompoundExtent], payload: &'a [u8], block_bytes: usize) -> Vec<&'a [u8]> {
    let mut slices = Vec::new();
    let mut at = 0;
    for extent in extents.iter().filter(|extent| !extent.zero) {
        let end = at + extent.block_count as usize * block_bytes;
        slices.push(&payload[at..end]);
        at = end;
    }
    assert_eq!(at, payload.len(), "the payload is the data extents' blocks");
    slices
}

/// The extents of a compound record, from its CRC area (verified with the
/// header), checked as [`append_compound_record`] requires them.
pub fn compound_extents(header: &RecordHeader, crc_area: &[u8]) -> Result<Vec<CompoundExtent>, FormatError> {
    assert_eq!(header.kind, RecordKind::Compound);
    let mut reader = Reader::new("journal compound record", &crc_area[..header.block_crcs_offset()]);
    let mut extents = Vec::with_capacity(header.block_first.0 as usize);
    let mut data_blocks = 0u64;
    let mut end = 0u64;
    while reader.remaining() > 0 {
        let block_first = BlockIndex(reader.u64()?);
        let block_count = reader.u32()?;
        let flags = reader.u32()?;
        if block_count == 0 || flags & !COMPOUND_EXTENT_ZERO != 0 {
            return Err(reader.invalid(format!("extent of {block_count} blocks with flags {flags:#x}")));
        }
        if block_first.0 < end && !extents.is_empty() {
            return Err(
                reader.invalid(format!("extent at block {} overlaps or precedes the one before", block_first.0))
            );
        }
        end = block_first
            .0
            .checked_add(u64::from(block_count))
            .ok_or_else(|| reader.invalid(format!("extent at block {} runs past the end of blocks", block_first.0)))?;
        let zero = flags & COMPOUND_EXTENT_ZERO != 0;
        if !zero {
            data_blocks += u64::from(block_count);
        }
        extents.push(CompoundExtent { block_first, block_count, zero });
    }
    if data_blocks != u64::from(header.block_count) {
        return Err(
            reader.invalid(format!("extents hold {data_blocks} blocks of data, the header {}", header.block_count))
        );
    }
    Ok(extents)
}

/// Appends a zero record for `block_count` blocks to `out`.
pub fn append_zero_record(out: &mut Vec<u8>, stamp: RecordStamp, block_count: u32) {
    assert!(block_count > 0);
    let header = stamp.header(RecordKind::Zero, block_count);
    out.extend_from_slice(&seal(header.encode_unsealed(), &[]));
}

/// Appends a vouch record to `out`: every record up to `stamp.lsn` is
/// durable (`stamp.lsn_committed` must be the same LSN).
pub fn append_vouch_record(out: &mut Vec<u8>, stamp: RecordStamp) {
    assert_eq!(stamp.lsn, stamp.lsn_committed, "a vouch record vouches for its own LSN");
    let header = stamp.header(RecordKind::Vouch, 0);
    out.extend_from_slice(&seal(header.encode_unsealed(), &[]));
}

/// The longest span one lost record covers: a whole segment.
pub const LOST_PADDING_BYTES_MAX: u64 = u32::MAX as u64;

/// Encodes a lost record (see [`RecordKind::Lost`]) taking the place of
/// `span_bytes` of damaged records whose LSNs were `stamp.lsn` and the
/// `lsn_count - 1` after it.
pub fn encode_lost_record(stamp: RecordStamp, lsn_count: u32, span_bytes: u64) -> Vec<u8> {
    assert!(
        span_bytes >= RECORD_HEADER_BYTES as u64 && span_bytes.is_multiple_of(8),
        "a lost record spans whole records"
    );
    let padding = span_bytes - RECORD_HEADER_BYTES as u64;
    assert!(padding <= LOST_PADDING_BYTES_MAX);
    let header = RecordStamp { block_first: BlockIndex(padding), ..stamp }.header(RecordKind::Lost, lsn_count);
    let zeros = vec![0u8; padding as usize];
    let mut out = seal(header.encode_unsealed(), &zeros).to_vec();
    out.extend_from_slice(&zeros);
    out
}

/// Appends a copy record of `versions` (each in the chunk store or zeros) to `out`.
pub fn append_copy_record(out: &mut Vec<u8>, stamp: RecordStamp, versions: &[Version]) {
    let header = stamp.header(RecordKind::Copy, u32::try_from(versions.len()).expect("bounded batches"));
    assert!(header.block_count > 0);
    let mut entries = Writer::new();
    for version in versions {
        let (kind, chunk) = match version.data {
            VersionData::Zero => (0, 0),
            VersionData::Chunk(ChunkId(id)) => (1, id),
            VersionData::Journal { .. } => panic!("copies are in the chunk store or zeros"),
        };
        entries
            .u64(version.block.0)
            .u64(version.timestamp.unix_nanos())
            .u64(chunk)
            .u32(version.crc32c)
            .u8(kind)
            .zeros(3);
    }
    let entries = entries.into_bytes();
    out.extend_from_slice(&seal(header.encode_unsealed(), &entries));
    out.extend_from_slice(&entries);
}

/// The versions of a copy record, from its entry area (verified with the header).
pub fn copy_entries(entries: &[u8]) -> Result<Vec<Version>, FormatError> {
    let mut reader = Reader::new("journal copy record", entries);
    let mut versions = Vec::with_capacity(entries.len() / COPY_ENTRY_BYTES);
    while reader.remaining() > 0 {
        let block = BlockIndex(reader.u64()?);
        let timestamp = Timestamp::from_unix_nanos(reader.u64()?);
        let chunk = reader.u64()?;
        let crc32c = reader.u32()?;
        let data = match reader.u8()? {
            0 => VersionData::Zero,
            1 => VersionData::Chunk(ChunkId(chunk)),
            other => return Err(reader.invalid(format!("unknown copy kind {other}"))),
        };
        reader.take(3)?;
        versions.push(Version { block, timestamp, data, crc32c });
    }
    Ok(versions)
}

/// Completes a 60-byte header with its checksum over the header and `covered`.
fn seal(mut header: Vec<u8>, covered: &[u8]) -> [u8; RECORD_HEADER_BYTES] {
    assert_eq!(header.len(), CHECKSUM_OFFSET);
    let checksum = crc32c_append(crc32c(&header), covered);
    header.extend_from_slice(&checksum.to_le_bytes());
    header.try_into().expect("64 bytes")
}

/// Where the records of the segment file `bytes` end, walking their headers
/// (checksums unchecked): a direct write pads the file with zeros up to the
/// next 4 KiB after them, and past them a new file may hold zeros written
/// ahead, so the file's size does not say. For tests and tools that damage
/// a chosen record.
pub fn records_end(bytes: &[u8]) -> u64 {
    let mut offset = SEGMENT_HEADER_BYTES as u64;
    while let Some(header) = bytes.get(offset as usize..).and_then(|rest| RecordHeader::decode(rest).ok()) {
        offset += header.record_bytes();
    }
    offset
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(lsn: u64, block_first: u64) -> RecordStamp {
        RecordStamp {
            block_size: BlockSize::new(512).unwrap(),
            lsn: Lsn(lsn),
            lsn_committed: Lsn(lsn - 1),
            timestamp: Timestamp::from_unix_nanos(5),
            block_first: BlockIndex(block_first),
            revert: None,
        }
    }

    #[test]
    fn write_record_round_trips_and_detects_damage() {
        let data: Vec<u8> = (0..1536u32).map(|i| (i * 7) as u8).collect();
        let mut record = Vec::new();
        let mut crcs = Vec::new();
        append_write_record(&mut record, &mut crcs, stamp(9, 40), &data);
        let header = RecordHeader::decode(&record).unwrap();
        assert_eq!(header.block_count, 3);
        assert_eq!(header.record_bytes() as usize, record.len());
        assert_eq!(header.crc_area_bytes(), 16);
        let crc_area = &record[RECORD_HEADER_BYTES..header.data_offset()];
        RecordHeader::verify(&record[..RECORD_HEADER_BYTES], crc_area).unwrap();
        for index in 0..3u32 {
            let at = header.data_offset() + index as usize * 512;
            assert_eq!(block_crc(&header, crc_area, index), crc32c(&record[at..at + 512]));
            assert_eq!(block_crc(&header, crc_area, index), crcs[index as usize]);
        }
        let mut damaged = record.clone();
        damaged[RECORD_HEADER_BYTES + 1] ^= 1;
        let crc_area = &damaged[RECORD_HEADER_BYTES..header.data_offset()];
        assert!(matches!(
            RecordHeader::verify(&damaged[..RECORD_HEADER_BYTES], crc_area),
            Err(FormatError::Checksum { .. })
        ));
    }

    #[test]
    fn compound_record_round_trips_and_its_extents_are_checked() {
        let extents = [
            CompoundExtent { block_first: BlockIndex(3), block_count: 2, zero: false },
            CompoundExtent { block_first: BlockIndex(9), block_count: 5, zero: true },
            CompoundExtent { block_first: BlockIndex(1 << 40), block_count: 1, zero: false },
        ];
        let data: Vec<u8> = (0..1536u32).map(|i| (i * 13) as u8).collect();
        let (mut record, mut crcs) = (Vec::new(), Vec::new());
        append_compound_record(&mut record, &mut crcs, stamp(4, 0), &extents, &[&data[..1024], &data[1024..]]);
        let header = RecordHeader::decode(&record).unwrap();
        assert_eq!((header.kind, header.block_first, header.block_count), (RecordKind::Compound, BlockIndex(3), 3));
        assert_eq!(header.record_bytes() as usize, record.len());
        assert_eq!(header.data_bytes(), 1536);
        let crc_area = &record[RECORD_HEADER_BYTES..header.data_offset()];
        RecordHeader::verify(&record[..RECORD_HEADER_BYTES], crc_area).unwrap();
        assert_eq!(compound_extents(&header, crc_area).unwrap(), extents);
        for index in 0..3u32 {
            let at = header.data_offset() + index as usize * 512;
            assert_eq!(block_crc(&header, crc_area, index), crc32c(&record[at..at + 512]));
        }
        assert_eq!(crcs.len(), 3);
        // The extent table is under the record checksum.
        let mut damaged = record.clone();
        damaged[RECORD_HEADER_BYTES + 8] ^= 1;
        let damaged_area = &damaged[RECORD_HEADER_BYTES..header.data_offset()];
        assert!(RecordHeader::verify(&damaged[..RECORD_HEADER_BYTES], damaged_area).is_err());
        // Tables that a bug or a hostile file could hold are refused, not trusted.
        let table = |entries: &[(u64, u32, u32)], data_blocks: u32| {
            let mut writer = Writer::new();
            for &(first, count, flags) in entries {
                writer.u64(first).u32(count).u32(flags);
            }
            let header =
                RecordHeader { block_first: BlockIndex(entries.len() as u64), block_count: data_blocks, ..header };
            let mut area = writer.into_bytes();
            area.resize(header.crc_area_bytes(), 0);
            compound_extents(&header, &area)
        };
        assert!(table(&[(3, 2, 0), (4, 1, 1)], 2).is_err(), "overlapping");
        assert!(table(&[(9, 1, 0), (3, 1, 0)], 2).is_err(), "out of order");
        assert!(table(&[(3, 0, 0)], 0).is_err(), "empty extent");
        assert!(table(&[(3, 1, 2)], 1).is_err(), "unknown flag");
        assert!(table(&[(3, 2, 0)], 3).is_err(), "data blocks disagree with the header");
        assert!(table(&[(u64::MAX, 2, 1)], 0).is_err(), "past the last block");
        assert!(table(&[(3, 2, 0), (5, 1, 1)], 2).is_ok());
        // No extents, or too many, is not a compound record.
        let mut encoded = record[..RECORD_HEADER_BYTES].to_vec();
        encoded[24..32].copy_from_slice(&0u64.to_le_bytes());
        assert!(RecordHeader::decode(&encoded).is_err());
        encoded[24..32].copy_from_slice(&(COMPOUND_EXTENTS_MAX + 1).to_le_bytes());
        assert!(RecordHeader::decode(&encoded).is_err());
    }

    #[test]
    fn copy_record_round_trips_and_its_entries_are_checksummed() {
        let versions = [
            Version {
                block: BlockIndex(7),
                timestamp: Timestamp::from_unix_nanos(3),
                data: VersionData::Zero,
                crc32c: 11,
            },
            Version {
                block: BlockIndex(2),
                timestamp: Timestamp::from_unix_nanos(4),
                data: VersionData::Chunk(ChunkId(99)),
                crc32c: 12,
            },
        ];
        let mut record = Vec::new();
        append_copy_record(&mut record, stamp(6, 0), &versions);
        let header = RecordHeader::decode(&record).unwrap();
        assert_eq!(
            (header.kind, header.block_count, header.record_bytes() as usize),
            (RecordKind::Copy, 2, record.len())
        );
        let entries = &record[RECORD_HEADER_BYTES..header.data_offset()];
        RecordHeader::verify(&record[..RECORD_HEADER_BYTES], entries).unwrap();
        assert_eq!(copy_entries(entries).unwrap(), versions);
        let mut damaged = record.clone();
        damaged[RECORD_HEADER_BYTES + 40] ^= 1;
        let entries = &damaged[RECORD_HEADER_BYTES..header.data_offset()];
        assert!(RecordHeader::verify(&damaged[..RECORD_HEADER_BYTES], entries).is_err());
    }

    #[test]
    fn a_revert_copy_record_keeps_its_revert_time_and_only_writes_and_zeros_may_have_one() {
        let revert = Some(Timestamp::from_unix_nanos(4));
        let mut record = Vec::new();
        append_write_record(&mut record, &mut Vec::new(), RecordStamp { revert, ..stamp(3, 8) }, &[7; 512]);
        append_zero_record(&mut record, RecordStamp { revert, ..stamp(4, 9) }, 2);
        let write = RecordHeader::decode(&record).unwrap();
        let zero = RecordHeader::decode(&record[write.record_bytes() as usize..]).unwrap();
        assert_eq!((write.kind, write.revert), (RecordKind::Write, revert));
        assert_eq!((zero.kind, zero.revert, zero.block_count), (RecordKind::Zero, revert, 2));
        let mut plain = Vec::new();
        append_zero_record(&mut plain, stamp(4, 9), 2);
        assert_eq!(RecordHeader::decode(&plain).unwrap().revert, None);

        let mut vouch = Vec::new();
        append_vouch_record(&mut vouch, RecordStamp { lsn_committed: Lsn(6), ..stamp(6, 0) });
        vouch[44..52].copy_from_slice(&4u64.to_le_bytes());
        let error = RecordHeader::decode(&vouch).unwrap_err().to_string();
        assert!(error.contains("only write and zero records belong to a revert's copy"), "{error}");
    }

    #[test]
    fn zero_record_and_segment_header_round_trip() {
        let mut record = Vec::new();
        append_zero_record(&mut record, stamp(1, 3), 1_000_000);
        let header = RecordHeader::decode(&record).unwrap();
        assert_eq!(header.record_bytes(), 64);
        RecordHeader::verify(&record, &[]).unwrap();
        let segment = SegmentHeader {
            segment: 4,
            block_size: BlockSize::new(512).unwrap(),
            lsn_first: Lsn(77),
            timestamp_before: Timestamp::from_unix_nanos(99),
            recycled: false,
            written_ahead: false,
        };
        assert_eq!(SegmentHeader::decode(&segment.encode()).unwrap(), segment);
        assert!(!segment.bytes_follow_records());
        let recycled = SegmentHeader { recycled: true, ..segment };
        assert_eq!(SegmentHeader::decode(&recycled.encode()).unwrap(), recycled);
        assert_eq!(recycled.encode()[32], 1, "the flag is bit 0 at byte 32");
        let written_ahead = SegmentHeader { written_ahead: true, ..segment };
        assert_eq!(SegmentHeader::decode(&written_ahead.encode()).unwrap(), written_ahead);
        assert_eq!(written_ahead.encode()[32], 2, "the flag is bit 1 at byte 32");
        assert!(recycled.bytes_follow_records() && written_ahead.bytes_follow_records());
        let mut bad = segment.encode();
        bad[20] ^= 0x10;
        assert!(SegmentHeader::decode(&bad).is_err());
        // A flag this version does not know is refused, not ignored.
        let mut unknown = segment.encode();
        unknown[32] = 4;
        let checksum = crate::crc32c(&unknown[..60]);
        unknown[60..].copy_from_slice(&checksum.to_le_bytes());
        let error = SegmentHeader::decode(&unknown).unwrap_err().to_string();
        assert!(error.contains("unknown segment flags 0x4"), "{error}");
    }

    #[test]
    fn decode_rejects_garbage_without_panicking() {
        assert!(RecordHeader::decode(&[]).is_err());
        assert!(RecordHeader::decode(&[0u8; 64]).is_err());
        let mut record = Vec::new();
        append_zero_record(&mut record, stamp(1, 3), 1);
        record[5] = 40; // block size shift
        assert!(RecordHeader::decode(&record).is_err());
    }
}
