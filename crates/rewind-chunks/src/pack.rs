//! Writing and reading one pack.

use std::cell::RefCell;
use std::sync::{Arc, LazyLock};

use rewind_format::crc32c;
use rewind_format::journal::{SegmentHeader, SEGMENT_MAGIC};
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
/// The share of recent chunks that compressed, as [`Compressor::compressed_share`]
/// counts it: this is all of them.
const SHARE_ALL: u32 = 1 << 10;
/// Chunks are probed while fewer than half of the recent ones compressed.
/// Chosen when the probe was zstd's fastest level, which cost less than
/// level 3 on every chunk whenever under about half passed; the look that
/// replaced it costs less still, so probing would pay at higher shares
/// too, but history that compresses that often is not the case to tune.
const PROBE_BELOW_SHARE: u32 = SHARE_ALL / 2;
/// Records are buffered and written in writes of about this size.
const WRITE_BYTES: usize = 1 << 20;
/// A chunk is stored compressed only if that saves at least this share of
/// its bytes: a quarter. Reading a compressed 4 KiB chunk back costs about
/// 5 µs of zstd (800 MB/s on one core), and on this 2.5 GB/s disk even a
/// whole chunk's saving (1.6 µs of reading) never pays that back in time,
/// only in space. Below a quarter it buys little space: of 2 GiB of
/// /usr and Rust sources in 4 KiB chunks, those that save an eighth to a
/// quarter are 1.1%, with 0.4% of what zstd saves (stored ÷ raw 0.4294
/// against 0.4273 with an eighth; `chunk-bench savings`). History that
/// barely compresses (fio's buffers save about a tenth; one chunk in 18 an
/// eighth) is then stored as it is, and a view of it took 9% less server
/// CPU per byte (BENCHMARKS.md, "Compressed only where a quarter is saved").
pub const SAVING_SHARE_MIN: f64 = 0.25;

/// Compresses chunks where that pays, with early abort (as OpenZFS 2.2's
/// zstd early abort). Archiving history that does not compress (already
/// compressed or encrypted data, fio's random bytes) spent over half of the
/// archiver's CPU in zstd, which then gave up. While fewer than half of the
/// recent chunks compressed, each is first looked at cheaply
/// ([`Compressor::may_compress`]), and only one that may compress is
/// compressed at level 3. A share, not a run of failures: fio's buffers,
/// written over NBD, compress in one chunk in 18, never 32 failures apart,
/// and a run of 32 was never reached. History that compresses never pays
/// for the look; what is stored compressed is always level 3's output.
pub struct Compressor {
    full: zstd::bulk::Compressor<'static>,
    /// LZ4's output for the look for repeats, which is thrown away.
    repeats: Vec<u8>,
    /// The share of recent chunks that compressed, in [`SHARE_ALL`]ths: a
    /// moving average over about the last 16.
    compressed_share: u32,
}

impl Compressor {
    pub fn new() -> std::io::Result<Compressor> {
        Ok(Compressor {
            full: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            repeats: Vec::new(),
            compressed_share: SHARE_ALL,
        })
    }

    /// Compresses `raw` into `out` if that saves at least
    /// [`SAVING_SHARE_MIN`] of its size; otherwise copies it. Returns how it
    /// is stored.
    pub fn compress(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Codec {
        // A destination that much smaller than the input makes zstd fail on
        // data that does not compress well enough, without a second pass.
        let limit = raw.len() - (raw.len() as f64 * SAVING_SHARE_MIN) as usize;
        out.clear();
        out.reserve(raw.len());
        // A chunk the look passes over is copied without filling the
        // destination first.
        let stored = if !self.probing() || self.may_compress(raw) {
            out.resize(limit, 0);
            self.full.compress_to_buffer(raw, out.as_mut_slice()).ok().filter(|&size| size < limit)
        } else {
            None
        };
        match stored {
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

    /// Whether `raw` may save [`SAVING_SHARE_MIN`] at level 3, by a look that costs a
    /// fraction of compressing it. zstd saves in two ways, each with a cheap
    /// estimate: bytes that are not equally likely, which Huffman coding of
    /// the literals turns into savings up to their entropy
    /// ([`byte_entropy`]); and repeats, which LZ4's match finder finds.
    /// Their sum against the share needed: on fio's buffers (an eighth of
    /// their bytes zero, in words) it says 10%, and level 3 saves 11%, never
    /// a quarter. LZ4 runs only where the bytes' skew alone does not
    /// decide. The price: a chunk that saves barely more than the share may
    /// be stored as it is while probing, as with the look before, zstd's
    /// fastest level, whose matching took longer than LZ4's on such
    /// buffers (`chunk-bench compress`, BENCHMARKS.md).
    fn may_compress(&mut self, raw: &[u8]) -> bool {
        let skew_saves = (8.0 - byte_entropy(raw)) / 8.0;
        if skew_saves >= SAVING_SHARE_MIN {
            return true;
        }
        self.repeats.resize(lz4_flex::block::get_maximum_output_size(raw.len()), 0);
        let Ok(with_repeats) = lz4_flex::block::compress_into(raw, &mut self.repeats) else { return true };
        let repeats_save = raw.len().saturating_sub(with_repeats) as f64 / raw.len() as f64;
        skew_saves + repeats_save >= SAVING_SHARE_MIN
    }
}

/// Bytes of a chunk [`byte_entropy`] looks at, at most.
const ENTROPY_SAMPLES_MAX: usize = 1024;

/// `c log2 c` for every count a histogram of [`ENTROPY_SAMPLES_MAX`] bytes
/// can hold: 256 logarithms per chunk took four times as long as the
/// histogram.
static COUNT_LOG2_COUNT: LazyLock<Vec<f64>> = LazyLock::new(|| {
    (0..=ENTROPY_SAMPLES_MAX).map(|count| if count == 0 { 0.0 } else { count as f64 * (count as f64).log2() }).collect()
});

/// The entropy of `raw`'s bytes in bits per byte (8: every value equally
/// frequent; 0 when there are too few to say), estimated from at most
/// [`ENTROPY_SAMPLES_MAX`] of them — four runs of 256 spread over the chunk,
/// not every fourth byte, which in data laid out in words (fio's buffers)
/// sees some fields and never others — with Miller and Madow's correction
/// for the bias of so few samples (for random bytes, 7.8 bits without it).
fn byte_entropy(raw: &[u8]) -> f64 {
    const RUNS: usize = 4;
    const RUN_BYTES: usize = ENTROPY_SAMPLES_MAX / RUNS;
    // Four histograms, so that runs of one byte do not make each count
    // wait for the one before.
    let mut counts = [[0u16; 256]; 4];
    let mut count = |bytes: &[u8]| {
        for (at, &byte) in bytes.iter().enumerate() {
            counts[at % 4][usize::from(byte)] += 1;
        }
    };
    if raw.len() <= ENTROPY_SAMPLES_MAX {
        count(raw);
    } else {
        let gap = (raw.len() - RUN_BYTES) / (RUNS - 1);
        (0..RUNS).for_each(|run| count(&raw[run * gap..run * gap + RUN_BYTES]));
    }
    let samples = raw.len().min(ENTROPY_SAMPLES_MAX);
    if samples < 2 {
        return 0.0;
    }
    let (mut sum, mut values) = (0.0, 0);
    for value in 0..256 {
        let count = counts.iter().map(|histogram| usize::from(histogram[value])).sum::<usize>();
        sum += COUNT_LOG2_COUNT[count];
        values += usize::from(count > 0);
    }
    let samples = samples as f64;
    let plug_in = samples.log2() - sum / samples;
    let bias = (values - 1) as f64 / (2.0 * samples * std::f64::consts::LN_2);
    (plug_in + bias).min(8.0)
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
        Ok(PackWriter {
            pack,
            path,
            upload,
            pending: PackHeader { pack }.encode().to_vec(),
            entries: Vec::new(),
            raw_total: 0,
        })
    }

    /// Adds chunk `id`, whose hash is `hash`, stored as `codec` says
    /// ([`Compressor::compress`]'s output, or a record repacking copies
    /// without compressing it again). Its location is valid once the pack
    /// is sealed. The caller has hashed or verified the bytes.
    pub fn add_stored(
        &mut self,
        id: ChunkId,
        hash: ChunkHash,
        codec: Codec,
        stored: &[u8],
        raw_bytes: u32,
    ) -> Result<ChunkLocation, ChunkError> {
        assert!(raw_bytes <= CHUNK_BYTES_MAX, "a chunk is at most one block");
        let header = RecordHeader { codec, stored_bytes: stored.len() as u32, raw_bytes, hash };
        let offset = self.bytes();
        header.encode_record(stored, &mut self.pending);
        self.entries.push(FooterEntry { hash, id, offset, stored_bytes: header.stored_bytes, raw_bytes });
        self.raw_total += u64::from(raw_bytes);
        if self.pending.len() >= WRITE_BYTES {
            self.write_pending()?;
        }
        Ok(ChunkLocation { pack: self.pack, offset, stored_bytes: header.stored_bytes, raw_bytes, bare_crc32c: None })
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
    /// `None` for a pack whose trailer or footer is damaged, and for an
    /// adopted journal segment: its chunks are read where the chunk table
    /// says they are.
    trailer: Option<PackTrailer>,
    /// An adopted journal segment ([`crate::PackStore::adopt`]): its chunks
    /// are bare, with no records, footer or trailer.
    adopted: bool,
}

impl PackReader {
    /// Opens pack `pack` in `packs`, checking its header and trailer (the
    /// footer is read only by [`PackReader::footer`]).
    pub fn open(packs: &Arc<dyn PackStore>, pack: u64) -> Result<PackReader, ChunkError> {
        let mut reader = PackReader::open_records(packs, pack)?;
        if reader.adopted {
            return Ok(reader);
        }
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
    /// (its chunks are found through the chunk table). An adopted journal
    /// segment opens by its segment header.
    pub fn open_records(packs: &Arc<dyn PackStore>, pack: u64) -> Result<PackReader, ChunkError> {
        let path = packs.locate(pack);
        let bytes = packs.stat(pack).map_err(ChunkError::io(&path))?.bytes;
        let mut header = [0; PACK_HEADER_BYTES];
        packs.read(pack, 0, &mut header).map_err(|error| match rewind_io::is_transient(&error) {
            true => ChunkError::io(&path)(error),
            false => ChunkError::corrupt(&path, 0, error),
        })?;
        let adopted = header[..4] == SEGMENT_MAGIC.to_le_bytes();
        if adopted {
            SegmentHeader::decode(&header).map_err(|error| ChunkError::corrupt(&path, 0, error))?;
        } else {
            let header = PackHeader::decode(&header).map_err(|error| ChunkError::corrupt(&path, 0, error))?;
            if header.pack != pack {
                return Err(ChunkError::corrupt(&path, 0, format!("the header names pack {}", header.pack)));
            }
        }
        Ok(PackReader { pack, path, packs: Arc::clone(packs), bytes, trailer: None, adopted })
    }

    /// Whether this is an adopted journal segment, whose chunks are bare
    /// and found only through the chunk table.
    pub fn is_adopted(&self) -> bool {
        self.adopted
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
        if self.adopted {
            let reason =
                "it is an adopted journal segment, which has no footer: its chunks are found through the chunk table";
            return Err(ChunkError::corrupt(&self.path, 0, reason));
        }
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
            bare_crc32c: None,
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
    /// returns how the chunk is stored and where in `record` its stored
    /// bytes are (after the header; a bare chunk's are all of it).
    pub fn read_record(
        &self,
        location: ChunkLocation,
        hash: &ChunkHash,
        record: &mut Vec<u8>,
        out: &mut [u8],
        check: Check,
    ) -> Result<(Codec, std::ops::Range<usize>), ChunkError> {
        assert_eq!(location.pack, self.pack, "location in another pack");
        let header_bytes = record_header_bytes(location);
        record.resize(header_bytes + location.stored_bytes as usize, 0);
        self.read_span(location.offset, record)?;
        let codec = match location.bare_crc32c {
            Some(_) => {
                out.copy_from_slice(record);
                self.decode_in_place(location, hash, &[], out, check)?;
                Codec::Raw
            }
            None => self.decode(location, hash, record, out, check)?,
        };
        Ok((codec, header_bytes..record.len()))
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
        assert!(location.bare_crc32c.is_none(), "a record, not a bare chunk");
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
    /// A bare chunk has no header (`header` is empty): its bytes are checked
    /// against the CRC-32C its location holds. Returns the CRC-32C of the
    /// chunk's bytes, computed on the way.
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
        if let Some(expected) = location.bare_crc32c {
            assert!(header.is_empty(), "a bare chunk has no header");
            assert!(self.adopted, "bare chunks lie in adopted journal segments");
            let found = crc32c(out);
            if found != expected {
                let reason = format!(
                    "the bytes of chunk {} have CRC-32C {found:#010x}, its table slot says {expected:#010x}",
                    hex(hash)
                );
                return Err(self.corrupt(location, reason));
            }
            self.check_hash(location, hash, out, check)?;
            return Ok(found);
        }
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
        thread_local! {
            /// Each reading thread's decompression context, made once: making
            /// one (zstd allocates and sets up its tables) took as long as
            /// decompressing the 4 KiB chunk itself, half of a view's time in
            /// zstd.
            static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
        }
        let size = DECOMPRESSOR
            .with_borrow_mut(|decompressor| {
                let decompressor = match decompressor {
                    Some(decompressor) => decompressor,
                    None => decompressor.insert(zstd::bulk::Decompressor::new()?),
                };
                decompressor.decompress_to_buffer(stored, out)
            })
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

/// The bytes in front of the chunk's stored bytes at `location`: a record
/// header, or none for a bare chunk.
pub fn record_header_bytes(location: ChunkLocation) -> usize {
    match location.bare_crc32c {
        Some(_) => 0,
        None => RECORD_HEADER_BYTES,
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

    /// Random bytes with short runs of zeros, one run in every five bytes
    /// that start below `below`.
    fn zero_runs_block(below: u8) -> Vec<u8> {
        let mut block = random_block(1);
        for at in (0..4091).step_by(5) {
            if block[at] < below {
                block[at..at + 4].fill(0);
            }
        }
        block
    }

    /// Level 3 saves just over a quarter of this (found by search with this zstd).
    fn marginal_block() -> Vec<u8> {
        let block = zero_runs_block(112);
        let saved = 4096 - zstd::bulk::compress(&block, ZSTD_LEVEL).unwrap().len();
        assert!((1024..1100).contains(&saved), "the zstd this was found with: {saved} saved");
        block
    }

    /// Level 3 saves an eighth of this, not a quarter.
    fn an_eighth_block() -> Vec<u8> {
        let block = zero_runs_block(68);
        let saved = 4096 - zstd::bulk::compress(&block, ZSTD_LEVEL).unwrap().len();
        assert!((512..640).contains(&saved), "the zstd this was found with: {saved} saved");
        block
    }

    /// Random bytes repeated: only repeats to find, every byte value equally
    /// frequent.
    fn repeated_block(seed: u64) -> Vec<u8> {
        random_block(seed)[..1024].repeat(4)
    }

    /// Random hexadecimal digits: no repeats to speak of, four bits in each
    /// byte.
    fn hex_block(seed: u64) -> Vec<u8> {
        random_block(seed).iter().map(|&byte| b"0123456789abcdef"[usize::from(byte & 15)]).collect()
    }

    /// Random bytes, an eighth of them zero, as in fio's buffers: 7.5 bits
    /// of entropy per byte.
    fn fio_like_block(seed: u64) -> Vec<u8> {
        let mut block = random_block(seed);
        block.iter_mut().step_by(8).for_each(|byte| *byte = 0);
        block
    }

    #[test]
    fn the_look_passes_repeats_and_skewed_bytes_to_zstd_and_random_bytes_not() {
        let mut compressor = Compressor::new().unwrap();
        for seed in 0..32 {
            let random = random_block(seed);
            assert!(byte_entropy(&random) > 7.8, "random block {seed}");
            assert!(!compressor.may_compress(&random), "random block {seed}");
            assert!(!compressor.may_compress(&random[..1000]), "random block {seed}, a part");
            let fio_like = fio_like_block(seed);
            assert!(level_3(&fio_like).len() > 4096 - 512, "fio-like block {seed} saves less than an eighth");
            assert!(!compressor.may_compress(&fio_like), "fio-like block {seed}");
            for (what, block) in
                [("text", text_block(seed)), ("repeats", repeated_block(seed)), ("hex", hex_block(seed))]
            {
                assert!(compressor.may_compress(&block), "{what} {seed}");
                assert!(level_3(&block).len() < 4096 - 1024, "{what} {seed} saves a quarter at level 3");
            }
        }
        assert!(compressor.may_compress(&marginal_block()));
        assert_eq!(byte_entropy(&[7; 100]), 0.0);
        assert_eq!(byte_entropy(&(0..=255).collect::<Vec<u8>>()), 8.0);
        assert!(compressor.may_compress(&[1, 2, 3]), "too short to say: zstd decides");
    }

    #[test]
    fn early_abort_probes_while_fewer_than_half_the_recent_chunks_compressed() {
        let mut compressor = Compressor::new().unwrap();
        let mut out = Vec::new();
        // History that compresses is never probed.
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
        // One in eight that compresses among them (fio's buffers: one in
        // 18), of each kind the look finds, passes it and is stored as
        // level 3 stores it, and the rest are still probed.
        for seed in 0..96 {
            let block = match seed % 32 {
                0 => text_block(seed),
                8 => repeated_block(seed),
                16 => hex_block(seed),
                24 => marginal_block(),
                _ => random_block(seed),
            };
            let codec = if seed % 8 == 0 { Codec::Zstd } else { Codec::Raw };
            assert_eq!(compressor.compress(&block, &mut out), codec, "chunk {seed}");
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
        // Less than a quarter saved is not worth it, probing or not.
        let mut mostly_random = random_block(99);
        mostly_random[..400].fill(0);
        assert_eq!(compressor.compress(&mostly_random, &mut out), Codec::Raw);
        assert_eq!(out, mostly_random);
        assert!(!compressor.probing());
        assert_eq!(compressor.compress(&an_eighth_block(), &mut out), Codec::Raw);
        assert_eq!(out, an_eighth_block());
    }
}
