//! Writing and reading one pack.

use std::sync::Arc;

use rewind_format::crc32c;
use rewind_format::pack::{
    ChunkHash, Codec, FooterEntry, PackHeader, PackTrailer, RecordHeader, CHUNK_BYTES_MAX, PACK_HEADER_BYTES,
    PACK_TRAILER_BYTES, RECORD_HEADER_BYTES,
};
use rewind_types::ChunkId;

use crate::pack_store::{Generation, PackStore, PackUpload};
use crate::{chunk_hash, ChunkError, ChunkLocation};

/// zstd level: fast enough to keep up with the journal on one core, and most
/// of the ratio the higher levels get on block data.
const ZSTD_LEVEL: i32 = 3;
/// zstd's fastest level: the probe of early abort.
const PROBE_LEVEL: i32 = 1;
/// The share of recent chunks that compressed, as [`Compressor::compressed_share`]
/// counts it: this is all of them.
const SHARE_ALL: u32 = 1 << 10;
/// Chunks are probed while fewer than half of the recent ones compressed.
/// Probing each chunk (3.0 µs for 4 KiB here) and compressing at level 3
/// (6.7 µs) only those that pass costs less than trying each at level 3
/// whenever under about 55% pass.
const PROBE_BELOW_SHARE: u32 = SHARE_ALL / 2;
/// Records are buffered and written in writes of about this size.
const WRITE_BYTES: usize = 1 << 20;

/// Compresses chunks where that pays, with early abort (as OpenZFS 2.2's
/// zstd early abort, with zstd's own fastest level as the probe). Archiving
/// history that does not compress (already compressed or encrypted data,
/// fio's random bytes) spent over half of the archiver's CPU in zstd, which
/// then gave up. While fewer than half of the recent chunks compressed,
/// each is first tried at zstd's fastest level — 3.0 µs for 4 KiB of
/// random bytes against 6.7 µs at level 3, measured here — and only one
/// that compresses there is compressed at level 3. A share, not a run of
/// failures: fio's buffers, written over NBD, compress in one chunk in 18,
/// never 32 failures apart, and a run of 32 was never reached. History
/// that compresses never pays for the probe; what is stored compressed is
/// always level 3's output.
pub struct Compressor {
    full: zstd::bulk::Compressor<'static>,
    probe: zstd::bulk::Compressor<'static>,
    /// The share of recent chunks that compressed, in [`SHARE_ALL`]ths: a
    /// moving average over about the last 16.
    compressed_share: u32,
}

impl Compressor {
    pub fn new() -> std::io::Result<Compressor> {
        Ok(Compressor {
            full: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            probe: zstd::bulk::Compressor::new(PROBE_LEVEL)?,
            compressed_share: SHARE_ALL,
        })
    }

    /// Compresses `raw` into `out` if that saves at least an eighth of its
    /// size; otherwise copies it. Returns how it is stored.
    pub fn compress(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Codec {
        // A destination an eighth smaller than the input makes zstd fail on
        // data that does not compress well enough, without a second pass.
        let limit = raw.len() - raw.len() / 8;
        out.clear();
        out.reserve(raw.len());
        out.resize(limit, 0);
        let pays = |compressor: &mut zstd::bulk::Compressor<'static>, out: &mut Vec<u8>| {
            compressor.compress_to_buffer(raw, out.as_mut_slice()).ok().filter(|&size| size < limit)
        };
        let probed_out = self.probing() && pays(&mut self.probe, out).is_none();
        match if probed_out { None } else { pays(&mut self.full, out) } {
            Some(size) => {
                out.truncate(size);
                self.compressed_share += (SHARE_ALL - self.compressed_share) / 16;
                Codec::Zstd
            }
            None => {
                out.clear();
                out.extend_from_slice(raw);
                self.compressed_share -= self.compressed_share / 16;
                Codec::Raw
            }
        }
    }

    fn probing(&self) -> bool {
        self.compressed_share < PROBE_BELOW_SHARE
    }
}

/// A pack being written.
pub struct PackWriter {
    pack: u64,
    /// Where the pack goes, for messages.
    path: String,
    upload: Box<dyn PackUpload>,
    /// Encoded records not yet handed to the upload.
    pending: Vec<u8>,
    entries: Vec<FooterEntry>,
    raw_total: u64,
    compressor: Compressor,
    stored: Vec<u8>,
}

/// What a sealed pack holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedPack {
    pub pack: u64,
    pub chunk_count: u32,
    /// The pack file's size.
    pub bytes: u64,
    /// The chunks' size before compression.
    pub raw_bytes: u64,
    /// Which object the store holds under the pack's number.
    pub generation: Generation,
}

impl PackWriter {
    /// Starts pack number `pack` in `packs`; it must not exist.
    pub fn create(packs: &dyn PackStore, pack: u64) -> Result<PackWriter, ChunkError> {
        let path = packs.locate(pack);
        let upload = packs.create(pack).map_err(ChunkError::io(&path))?;
        let compressor = Compressor::new().map_err(ChunkError::io(&path))?;
        Ok(PackWriter {
            pack,
            path,
            upload,
            pending: PackHeader { pack }.encode().to_vec(),
            entries: Vec::new(),
            raw_total: 0,
            compressor,
            stored: Vec::new(),
        })
    }

    /// Adds chunk `id`, whose hash is `hash` (the caller has hashed it to look
    /// it up), compressing it where that pays. Its location is valid once the
    /// pack is sealed.
    pub fn add(&mut self, id: ChunkId, hash: ChunkHash, raw: &[u8]) -> Result<ChunkLocation, ChunkError> {
        assert!(raw.len() <= CHUNK_BYTES_MAX as usize, "a chunk is at most one block");
        debug_assert_eq!(chunk_hash(raw), hash, "the caller's hash names these bytes");
        let mut stored = std::mem::take(&mut self.stored);
        let codec = self.compressor.compress(raw, &mut stored);
        let location = self.add_stored(id, hash, codec, &stored, raw.len() as u32);
        self.stored = stored;
        location
    }

    /// Adds chunk `id` as it is stored elsewhere (repacking copies records
    /// without compressing them again). The caller has verified the bytes.
    pub fn add_stored(
        &mut self,
        id: ChunkId,
        hash: ChunkHash,
        codec: Codec,
        stored: &[u8],
        raw_bytes: u32,
    ) -> Result<ChunkLocation, ChunkError> {
        let header = RecordHeader { codec, stored_bytes: stored.len() as u32, raw_bytes, hash };
        let offset = self.bytes();
        header.encode_record(stored, &mut self.pending);
        self.entries.push(FooterEntry { hash, id, offset, stored_bytes: header.stored_bytes, raw_bytes });
        self.raw_total += u64::from(raw_bytes);
        if self.pending.len() >= WRITE_BYTES {
            self.write_pending()?;
        }
        Ok(ChunkLocation { pack: self.pack, offset, stored_bytes: header.stored_bytes, raw_bytes })
    }

    /// The pack's size so far.
    pub fn bytes(&self) -> u64 {
        self.upload.len() + self.pending.len() as u64
    }

    pub fn chunk_count(&self) -> usize {
        self.entries.len()
    }

    fn write_pending(&mut self) -> Result<(), ChunkError> {
        // A local store takes the room here: a full disk fails an append,
        // never the seal.
        self.upload.append(&self.pending).map_err(ChunkError::io(&self.path))?;
        self.pending.clear();
        Ok(())
    }

    /// Leaves nothing of the unfinished pack (an archive pass or a repack failed).
    pub fn discard(self) -> Result<(), ChunkError> {
        self.upload.abort().map_err(ChunkError::io(&self.path))
    }

    /// Writes the footer and trailer and makes the pack durable under its
    /// number. A failure that does not pass (a failed sync) may have lost
    /// what was written: the caller poisons the store.
    pub fn seal(mut self) -> Result<SealedPack, ChunkError> {
        let footer_offset = self.bytes();
        let mut footer = Vec::with_capacity(self.entries.len() * rewind_format::pack::FOOTER_ENTRY_BYTES);
        for entry in &self.entries {
            entry.encode(&mut footer);
        }
        let trailer = PackTrailer {
            entry_count: u32::try_from(self.entries.len()).expect("packs hold far fewer than 2^32 chunks"),
            footer_offset,
            footer_crc32c: crc32c(&footer),
        };
        self.pending.extend_from_slice(&footer);
        self.pending.extend_from_slice(&trailer.encode());
        self.write_pending()?;
        let bytes = self.upload.len();
        let generation = self.upload.finish().map_err(ChunkError::sync_or_io(&self.path))?;
        Ok(SealedPack {
            pack: self.pack,
            chunk_count: trailer.entry_count,
            bytes,
            raw_bytes: self.raw_total,
            generation,
        })
    }
}

/// A sealed pack, open for reading.
pub struct PackReader {
    pack: u64,
    path: String,
    packs: Arc<dyn PackStore>,
    bytes: u64,
    /// `None` for a pack whose trailer or footer is damaged: its records
    /// are still read where the chunk table says they are.
    trailer: Option<PackTrailer>,
}

impl PackReader {
    /// Opens pack `pack` in `packs`, checking its header and trailer (the
    /// footer is read only by [`PackReader::footer`]).
    pub fn open(packs: &Arc<dyn PackStore>, pack: u64) -> Result<PackReader, ChunkError> {
        let mut reader = PackReader::open_records(packs, pack)?;
        let (path, bytes) = (&reader.path.clone(), reader.bytes);
        let unsealed = |reason: String| ChunkError::Unsealed { path: path.clone(), reason };
        if bytes < (PACK_HEADER_BYTES + PACK_TRAILER_BYTES) as u64 {
            return Err(unsealed(format!("{bytes} bytes is too short for a header and a trailer")));
        }
        let trailer_offset = bytes - PACK_TRAILER_BYTES as u64;
        let mut trailer = [0; PACK_TRAILER_BYTES];
        packs.read(pack, trailer_offset, &mut trailer).map_err(ChunkError::io(path))?;
        let trailer = PackTrailer::decode(&trailer, bytes).map_err(|error| unsealed(error.to_string()))?;
        reader.trailer = Some(trailer);
        Ok(reader)
    }

    /// Opens pack `pack` for reading records at known offsets, checking its
    /// header only: for a sealed pack whose trailer or footer is damaged
    /// (its chunks are found through the chunk table).
    pub fn open_records(packs: &Arc<dyn PackStore>, pack: u64) -> Result<PackReader, ChunkError> {
        let path = packs.locate(pack);
        let bytes = packs.stat(pack).map_err(ChunkError::io(&path))?.bytes;
        let mut header = [0; PACK_HEADER_BYTES];
        packs.read(pack, 0, &mut header).map_err(|error| match rewind_io::is_transient(&error) {
            true => ChunkError::io(&path)(error),
            false => ChunkError::corrupt(&path, 0, error),
        })?;
        let header = PackHeader::decode(&header).map_err(|error| ChunkError::corrupt(&path, 0, error))?;
        if header.pack != pack {
            return Err(ChunkError::corrupt(&path, 0, format!("the header names pack {}", header.pack)));
        }
        Ok(PackReader { pack, path, packs: Arc::clone(packs), bytes, trailer: None })
    }

    pub fn pack(&self) -> u64 {
        self.pack
    }

    /// The pack file's size.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Every chunk in the pack, in the order written, read from the footer
    /// and checked against the trailer's CRC.
    pub fn footer(&self) -> Result<Vec<FooterEntry>, ChunkError> {
        let Some(trailer) = &self.trailer else {
            return Err(ChunkError::corrupt(
                &self.path,
                self.bytes,
                "its trailer is damaged, so its footer cannot be found",
            ));
        };
        let mut footer = vec![0; trailer.footer_bytes() as usize];
        self.packs.read(self.pack, trailer.footer_offset, &mut footer).map_err(ChunkError::io(&self.path))?;
        let corrupt = |reason: String| ChunkError::corrupt(&self.path, trailer.footer_offset, reason);
        rewind_format::verify_crc("pack footer", trailer.footer_crc32c, crc32c(&footer))
            .map_err(|error| corrupt(error.to_string()))?;
        let entries = FooterEntry::decode_all(&footer).map_err(|error| corrupt(error.to_string()))?;
        if let Some(entry) = entries.iter().find(|entry| entry.offset >= trailer.footer_offset) {
            return Err(corrupt(format!("entry for chunk {} points past the records", entry.id)));
        }
        Ok(entries)
    }

    pub fn location(&self, entry: &FooterEntry) -> ChunkLocation {
        ChunkLocation {
            pack: self.pack,
            offset: entry.offset,
            stored_bytes: entry.stored_bytes,
            raw_bytes: entry.raw_bytes,
        }
    }

    /// Reads the chunk named `hash` at `location` into `out` (of its raw
    /// size), checking the record, the size and, with [`Check::Hash`], the
    /// hash of the bytes.
    pub fn read(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        out: &mut [u8],
        check: Check,
    ) -> Result<(), ChunkError> {
        let mut record = Vec::new();
        self.read_record(location, hash, &mut record, out, check).map(|_| ())
    }

    /// Like [`PackReader::read`], also leaving the whole record in `record`;
    /// returns how the chunk is stored (its stored bytes follow the header).
    pub fn read_record(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        record: &mut Vec<u8>,
        out: &mut [u8],
        check: Check,
    ) -> Result<Codec, ChunkError> {
        assert_eq!(location.pack, self.pack, "location in another pack");
        record.resize(RECORD_HEADER_BYTES + location.stored_bytes as usize, 0);
        self.read_span(location.offset, record)?;
        self.decode(location, hash, record, out, check)
    }

    /// Reads `buf.len()` bytes at `offset` (one or more neighbouring
    /// records, to be checked with [`PackReader::decode`]).
    pub fn read_span(&self, offset: u64, buf: &mut [u8]) -> Result<(), ChunkError> {
        self.check_inside(offset, buf.len() as u64)?;
        self.packs.read(self.pack, offset, buf).map_err(ChunkError::io(&self.path))
    }

    /// Fills `bufs` in turn from the bytes at `offset` on (neighbouring
    /// records, to be checked with [`PackReader::decode_in_place`] and
    /// [`PackReader::decode`]).
    pub fn read_scattered(&self, offset: u64, bufs: &mut [std::io::IoSliceMut<'_>]) -> Result<(), ChunkError> {
        self.check_inside(offset, bufs.iter().map(|buf| buf.len() as u64).sum())?;
        self.packs.read_vectored(self.pack, offset, bufs).map_err(ChunkError::io(&self.path))
    }

    /// `length` bytes at `offset` lie inside the pack (a table slot that
    /// says otherwise is damaged).
    fn check_inside(&self, offset: u64, length: u64) -> Result<(), ChunkError> {
        if offset.checked_add(length).is_some_and(|end| end <= self.bytes) {
            return Ok(());
        }
        let reason = format!("{length} bytes at {offset} do not fit in a pack of {} bytes", self.bytes);
        Err(ChunkError::corrupt(&self.path, offset, reason))
    }

    /// Checks the record `record` (read from `location`) and that it holds
    /// chunk `hash`, and decompresses it into `out` (of its raw size).
    pub fn decode(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        record: &[u8],
        out: &mut [u8],
        check: Check,
    ) -> Result<Codec, ChunkError> {
        assert_eq!(out.len(), location.raw_bytes as usize, "buffer of the chunk's raw size");
        let (header, stored) =
            RecordHeader::decode_record(record).map_err(|error| self.corrupt(location, error.to_string()))?;
        self.check_names(location, hash, &header)?;
        match header.codec {
            Codec::Raw => out.copy_from_slice(stored),
            Codec::Zstd => self.decompress(location, stored, out)?,
        }
        self.check_hash(location, hash, out, check)?;
        Ok(header.codec)
    }

    /// [`PackReader::decode`] of a record read in two parts: its `header`,
    /// and its stored bytes, which a scatter read put in `out` already (the
    /// caller expects a chunk stored as it is: as many stored bytes as raw).
    /// Returns the CRC-32C of the chunk's bytes, computed on the way.
    pub fn decode_in_place(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        header: &[u8],
        out: &mut [u8],
        check: Check,
    ) -> Result<u32, ChunkError> {
        assert_eq!(out.len(), location.raw_bytes as usize, "buffer of the chunk's raw size");
        assert_eq!(location.stored_bytes, location.raw_bytes, "a chunk stored as it is");
        let (decoded, stored_crc32c) =
            RecordHeader::decode_parts(header, out).map_err(|error| self.corrupt(location, error.to_string()))?;
        self.check_names(location, hash, &decoded)?;
        let raw_crc32c = match decoded.codec {
            Codec::Raw => stored_crc32c,
            Codec::Zstd => {
                // A frame as large as what it holds: not what Rewind writes,
                // but a valid record.
                let stored = out.to_vec();
                self.decompress(location, &stored, out)?;
                crc32c(out)
            }
        };
        self.check_hash(location, hash, out, check)?;
        Ok(raw_crc32c)
    }

    fn corrupt(&self, location: ChunkLocation, reason: String) -> ChunkError {
        ChunkError::corrupt(&self.path, location.offset, reason)
    }

    /// That the record holds the chunk that refers to it, of the sizes it
    /// was given.
    fn check_names(&self, location: ChunkLocation, hash: &ChunkHash, header: &RecordHeader) -> Result<(), ChunkError> {
        if header.hash != *hash
            || header.stored_bytes != location.stored_bytes
            || header.raw_bytes != location.raw_bytes
        {
            return Err(self.corrupt(
                location,
                format!(
                    "the record holds chunk {} ({} stored / {} raw bytes), not the chunk {} that refers to it",
                    hex(&header.hash),
                    header.stored_bytes,
                    header.raw_bytes,
                    hex(hash)
                ),
            ));
        }
        Ok(())
    }

    fn decompress(&self, location: ChunkLocation, stored: &[u8], out: &mut [u8]) -> Result<(), ChunkError> {
        let size = zstd::bulk::decompress_to_buffer(stored, out)
            .map_err(|error| self.corrupt(location, format!("zstd frame does not decompress: {error}")))?;
        if size != out.len() {
            return Err(self.corrupt(location, format!("zstd frame holds {size} bytes, the record says {}", out.len())));
        }
        Ok(())
    }

    fn check_hash(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        out: &[u8],
        check: Check,
    ) -> Result<(), ChunkError> {
        if check == Check::Hash && chunk_hash(out) != *hash {
            return Err(self.corrupt(location, format!("the bytes of chunk {} hash to something else", hex(hash))));
        }
        Ok(())
    }

    /// Reads and checks every chunk (a scrub). Returns the number checked.
    pub fn verify(&self) -> Result<usize, ChunkError> {
        let entries = self.footer()?;
        let mut out = Vec::new();
        for entry in &entries {
            out.resize(entry.raw_bytes as usize, 0);
            self.read(self.location(entry), &entry.hash, &mut out, Check::Hash)?;
        }
        Ok(entries.len())
    }
}

/// How much a read of a chunk checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The record's CRC-32C over its header and stored bytes, its sizes, and
    /// that it names the chunk asked for: what every read of history pays.
    /// It catches what happens to bytes at rest and on the way (the reader
    /// of a version also checks the CRC-32C the write was given), at a
    /// fraction of the cost of hashing.
    Crc,
    /// Also the BLAKE3 hash of the raw bytes: that they really are the chunk
    /// the hash names, whatever wrote or decompressed them. For what is
    /// copied to outlive the read (repacking, mending table slots) and for
    /// scrubbing, where it earns its cost.
    Hash,
}

/// A hash as hex, for messages.
pub(crate) fn hex(hash: &ChunkHash) -> impl std::fmt::Display {
    blake3::Hash::from_bytes(*hash).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_block(seed: u64) -> Vec<u8> {
        let mut block = vec![0; 4096];
        blake3::Hasher::new().update(&seed.to_le_bytes()).finalize_xof().fill(&mut block);
        block
    }

    fn text_block(seed: u64) -> Vec<u8> {
        format!("row {seed}: the quick brown fox jumps over the lazy dog; ").bytes().cycle().take(4096).collect()
    }

    /// What level 3 alone stores for `raw`: the compressor before early abort.
    fn level_3(raw: &[u8]) -> Vec<u8> {
        zstd::bulk::Compressor::new(ZSTD_LEVEL).unwrap().compress(raw).unwrap()
    }

    /// Random bytes with short runs of zeros: level 3 saves just over an
    /// eighth of them, level 1 just under (found by search with this zstd).
    fn marginal_block() -> Vec<u8> {
        let mut block = random_block(1);
        for at in (0..4091).step_by(5) {
            if block[at] < 68 {
                block[at..at + 4].fill(0);
            }
        }
        let saves_an_eighth = |level| zstd::bulk::compress(&block, level).unwrap().len() < 4096 - 512;
        assert!(saves_an_eighth(ZSTD_LEVEL) && !saves_an_eighth(PROBE_LEVEL), "the zstd this was found with");
        block
    }

    #[test]
    fn early_abort_probes_while_fewer_than_half_the_recent_chunks_compressed() {
        let mut compressor = Compressor::new().unwrap();
        let mut out = Vec::new();
        // History that compresses is never probed: the marginal block is
        // compressed as level 3 alone compresses it.
        assert_eq!(compressor.compress(&marginal_block(), &mut out), Codec::Zstd);
        for seed in 0..100 {
            assert_eq!(compressor.compress(&text_block(seed), &mut out), Codec::Zstd);
            assert_eq!(out, level_3(&text_block(seed)), "level 3's output");
            assert!(!compressor.probing());
        }
        // A run that does not: stored as it is, and probed from then on.
        for seed in 0..32 {
            assert_eq!(compressor.compress(&random_block(seed), &mut out), Codec::Raw);
            assert_eq!(out, random_block(seed));
        }
        assert!(compressor.probing());
        // Probing: the marginal block fails the probe and is stored as it is
        // (the price of early abort: chunks that barely compress).
        assert_eq!(compressor.compress(&marginal_block(), &mut out), Codec::Raw);
        // One in eight that compresses among them (fio's buffers: one in
        // 18) passes the probe and is stored as level 3 stores it, and the
        // rest are still probed.
        for seed in 0..64 {
            let (block, codec) = match seed % 8 {
                0 => (text_block(seed), Codec::Zstd),
                _ => (random_block(seed), Codec::Raw),
            };
            assert_eq!(compressor.compress(&block, &mut out), codec);
            if codec == Codec::Zstd {
                assert_eq!(out, level_3(&block));
            }
            assert!(compressor.probing(), "chunk {seed}: still probing");
        }
        // Once most compress again, probing stops.
        for seed in 0..16 {
            assert_eq!(compressor.compress(&text_block(seed), &mut out), Codec::Zstd);
        }
        assert!(!compressor.probing());
        assert_eq!(compressor.compress(&marginal_block(), &mut out), Codec::Zstd, "not probing");
        // Less than an eighth saved is not worth it, probing or not.
        let mut mostly_random = random_block(99);
        mostly_random[..400].fill(0);
        assert_eq!(compressor.compress(&mostly_random, &mut out), Codec::Raw);
        assert_eq!(out, mostly_random);
    }
}
