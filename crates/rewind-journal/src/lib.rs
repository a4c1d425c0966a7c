//! The journal: a volume's durable, checksummed, append-only log of writes.
//!
//! Every write and zeroing of a volume is appended here first; it is the
//! source of truth from which the version index and the current store are
//! rebuilt after a crash, and (until history moves to packs) the store of
//! every historical block version.
//!
//! Appends go to an in-memory *active batch*. [`Journal::commit`] seals it and
//! writes every sealed batch with one `pwrite` per batch (two threads may
//! write two batches at once: `BATCHES_IN_FLIGHT_MAX`), then `fdatasync`s —
//! group commit: whoever writes seals everything appended by then, so one
//! write carries the records of every committer that came meanwhile, and
//! whoever syncs makes everyone's written records durable. Writing and
//! syncing take separate locks, so the next committers write their batch
//! while a sync waits for the disk, and their sync starts as it ends. Until a
//! batch is on disk, reads of its bytes are served from memory, so a version
//! is readable the moment it is appended.
//!
//! The writes go around the page cache (`O_DIRECT`) where the filesystem
//! allows, so the `fdatasync` has no dirty pages to write back, only the
//! device cache and the filesystem's metadata to flush — on the disks
//! measured, buffered writes with syncs ran at a fraction of the device's
//! bandwidth (BENCHMARKS.md, bench/journal.py). A direct write covers whole
//! 4 KiB sectors: it starts at the sector where the written records end,
//! writing their bytes there again unchanged (a tear of that sector leaves
//! them either way), and pads the last sector with zeros, which recovery
//! knows for the end of the records. Each batch is built in memory laid out
//! for its direct write (see `Batch`), so records are copied once, from the
//! request into the batch, and written from there. Batches so written stay in memory for
//! a while (the destager reads them soon after), since the page cache does
//! not keep them. A filesystem that refuses direct I/O gets buffered writes,
//! with a log line.
//!
//! The journal is split into segment files (`journal/00000001.seg`, …) of at
//! most `segment_bytes_max` bytes; a record never spans two segments. Once
//! history has been archived out of a segment and recovery no longer starts
//! in it, [`Journal::reclaim`] deletes it: each segment header records the
//! time of the last record before it, which tells how old its predecessor's
//! newest record is.
//!
//! Segment files are kept as spares (`journal/spare-0`, …) and renamed to
//! start later segments, as PostgreSQL recycles WAL files: a reclaim keeps
//! as many as the journal started between two reclaims at most in the last
//! hour, up to `spare_segments_max`, and deletes the rest; the engine gives
//! them back when the filesystem's free space runs low
//! ([`Journal::give_back_spares`]). A new file's blocks are allocated but
//! unwritten, so each commit into it also commits filesystem metadata (ext4
//! converts the written extent, a journal commit with its own cache
//! flushes); a spare's blocks are written already, and a commit is the data
//! write and one flush. Measured on this machine's disk (4 KiB direct write
//! and `fdatasync`, median of 2000): 128–182 µs into a new file, 83 µs into
//! a written one. Large writes pay too: fio's direct 4 MiB writes at depth 2
//! made 1,450–1,650 MiB/s into a new file and 1,930–2,230 into a written
//! one (BENCHMARKS.md), so a burst that outgrows the spares runs at about
//! three quarters of the disk. That part is the disk's, not ext4's: this
//! VM's host allocates a block at its first write, and blocks a spare had
//! and made unwritten again (`File::zero_range`, as opening a journal does
//! to the spares it finds) take writes as fast as written ones. Spares are
//! reclaimed segments, or segments of zeros written ahead at a quiet moment
//! ([`Journal::prepare_spare`]): up to two for a journal whose segments
//! take many commits (`spare_after_commits`), and one for each segment
//! file the chunk store adopted that a reclaim would have kept
//! (`spares_for_adopted`): history kept where the journal wrote it saves
//! its second write while the writes come, and its spare is written when
//! nothing else is.
//! Without a spare, small batches in a new file have its blocks written
//! ahead of them, a mebibyte of zeros at a time ([`WRITE_AHEAD_BYTES`]), so
//! that the filesystem converts its extents once a mebibyte rather than at
//! every commit; the segment's header says so, and recovery takes the zeros
//! for no record, as it does a recycled file's old bytes. A reused
//! file keeps the old segment's bytes past the new records; its header says
//! it is recycled, and recovery never takes those bytes for records: each
//! old record has an LSN below the segment's first, and a segment's records
//! end where the next segment's begin. Opening a journal wipes the spares
//! (see `Journal::wipe_spares`): a crash can leave a lost segment's records,
//! whose LSNs are given out again, in one. Wiped, their blocks stay theirs,
//! so that a burst after a restart writes into blocks written before.
//!
//! Recovery ([`Journal::recover`]) replays records from a checkpointed
//! position. At the first damaged record it decides between a *torn tail*
//! (records that were never acknowledged: truncated) and *corruption*
//! (acknowledged records that went bad: an error). Each record carries the
//! durable LSN at the time it was appended, so a damaged record is known to
//! have been acknowledged if any intact record after it vouches for it. The one
//! case this cannot catch is damage to the very last acknowledged records
//! with nothing intact written after them; it is then indistinguishable from
//! a torn write.
//!
//! The records after the last one a later record vouches for have nothing
//! behind them; so once the journal has been quiet for a moment after a
//! commit, [`Journal::vouch`] appends a *vouch* record (no LSN, no blocks)
//! saying that everything up to the last LSN was durable. Damage to the
//! last acknowledged records is then corruption, not a torn tail; what is
//! left undecidable is a crash within that moment after a commit. A tail
//! that recovery does cut off is reported ([`RecoveryReport::dropped`]),
//! saying whether the record there was cut short (a torn write) or whole
//! but failing its checksum (a torn write or damage).
//!
//! A failed fsync poisons the journal: every later append and commit fails
//! until the process restarts and recovers from what is on disk, because
//! after a failed fsync Linux may have dropped the dirty pages it could not
//! write. Segments are allocated whole when they are started, so a full disk
//! fails the append that needed a new segment — cleanly, an error of that
//! request and no poison — and never a sync; so do other transient errors
//! (no file descriptors left, say) from writes.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rewind_format::journal::{
    append_compound_record, append_copy_record, append_vouch_record, append_write_record, append_zero_record,
    block_crc, compound_extents, copy_entries, encode_lost_record, CompoundExtent, RecordHeader, RecordKind,
    RecordStamp, SegmentHeader, COMPOUND_EXTENT_BYTES, COPY_ENTRY_BYTES, RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES,
};
use rewind_format::meta::JournalPosition;
use rewind_format::FormatError;
use rewind_io::{aligned_slice, is_direct_aligned, File, OpenMode, Storage, DIRECT_ALIGN};
use rewind_types::{BlockIndex, BlockSize, Lsn, Timestamp, Version};

#[derive(Clone, Copy, Debug)]
pub struct JournalConfig {
    /// A segment is closed once it reaches this size. At most `u32::MAX`,
    /// because versions address journal bytes with 32-bit offsets.
    pub segment_bytes_max: u64,
    /// Write with direct I/O (see the module documentation) where the
    /// filesystem takes it.
    pub direct_io: bool,
    /// A batch of appended records is sealed once it reaches this size, so
    /// that its buffer, allocated this large once and then reused, never
    /// grows (a reallocation copies what it holds, touches fresh pages and
    /// loses the buffer's alignment). Only a single larger record makes a
    /// larger batch.
    pub batch_bytes_max: usize,
    /// The most segment files kept to be reused for new segments (see the
    /// module documentation): each holds its disk space, and saves the
    /// commits written into the segment that reuses it the filesystem
    /// metadata a fresh file's first writes cost. A reclaim keeps as many
    /// as segments were started between two reclaims at most in the last
    /// hour (the journal's demand), up to this; 0 keeps none and writes
    /// none ahead.
    pub spare_segments_max: usize,
    /// Commits a segment takes (the last or the current one) for spares to be
    /// written ahead of need ([`Journal::prepare_spare`]).
    pub spare_after_commits: u64,
    /// Whether spares are written ahead at quiet moments for the segment
    /// files the chunk store adopted (`Journal::prepare_spare`): a segment's
    /// write of zeros each, for bursts as fast as into reused files.
    pub spares_for_adopted: bool,
    /// Ask the kernel for transparent huge pages behind fresh batch buffers
    /// (`madvise(MADV_HUGEPAGE)`). Off for machines whose
    /// `transparent_hugepage/defrag` setting makes an advised fault compact
    /// memory in place, where a fragmented machine would stall the writer
    /// that needed a fresh buffer.
    pub huge_pages: bool,
}

impl Default for JournalConfig {
    fn default() -> Self {
        // Small enough that archived history gives its journal space back soon,
        // large enough for the biggest record (32 MiB) and few files.
        // Batches: twice what the engine appends before it writes them out.
        // Spares: up to 16 segments (1 GiB), what a journal that archives
        // every 1 GiB of history starts between two reclaims, so that in
        // steady state every segment reuses a file. (A burst that keeps
        // archiving waiting, see the engine's `burst_archive_wait_nanos`,
        // starts more; spares beyond 16 are deleted, so their disk space is
        // not held after the burst.)
        // Spares written ahead after 1024 commits a segment: writing one is a
        // sequential write of a whole segment (about 50 ms of this machine's
        // disk for 64 MiB), and each commit into it then saves a filesystem
        // metadata commit (50–100 µs). Large writes with few syncs fill
        // segments in few commits and would gain too little for the bandwidth.
        JournalConfig {
            segment_bytes_max: 64 << 20,
            direct_io: true,
            batch_bytes_max: 8 << 20,
            spare_segments_max: 256,
            spare_after_commits: 1024,
            spares_for_adopted: true,
            huge_pages: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error("journal I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("journal corrupt in {path} at byte {offset}: {reason}")]
    Corrupt { path: String, offset: u64, reason: String },
    #[error(
        "the journal is poisoned by an earlier failed write or fsync; no further writes are accepted \
         until the server restarts and recovers from the journal on disk"
    )]
    Poisoned,
    /// The segment was deleted after its history was archived: whoever
    /// looked the version up should look again.
    #[error("journal segment {segment} was reclaimed (its history is archived)")]
    Reclaimed { segment: u32 },
}

impl JournalError {
    /// Whether the error is a condition that passes (a full disk, no file
    /// descriptors left): the journal is not poisoned by it.
    pub fn is_transient(&self) -> bool {
        matches!(self, JournalError::Io { source, .. } if rewind_io::is_transient(source))
    }
}

/// The time a record is stamped with.
#[derive(Clone, Copy)]
enum Stamped {
    /// A write's own time.
    At(Timestamp),
    /// The newest time so far: the record adds no point in time.
    Latest,
    /// The newest time so far, for a revert's copy (`RecordHeader::revert`).
    RevertCopy(Timestamp),
}

/// Where an appended record landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub lsn: Lsn,
    pub segment: u32,
    /// Offset of the record's first block of data (write records) or of the
    /// record's end (zero records) within the segment.
    pub data_offset: u32,
}

/// Appended records on their way to a segment file, in a buffer laid out for
/// the direct write that takes them there, so that it needs no copy: the
/// records start at the right distance after an address aligned for direct
/// I/O, preceded by the bytes already in the file from their sector's start
/// (written again unchanged: a tear of that sector leaves them either way),
/// and a sealed batch is padded with zeros to a whole sector, which recovery
/// reads as the padding it is.
struct Batch {
    segment: u32,
    /// File offset of the first record.
    offset: u64,
    /// `[alignment pad][sector prefix][records][zeros, once sealed]`.
    bytes: Vec<u8>,
    /// Where the sector holding `offset` starts in `bytes`; aligned in
    /// memory unless a record larger than the batch moved the buffer.
    sector_start: usize,
    /// Where the records start in `bytes`.
    records_start: usize,
    /// Where the records end in `bytes`.
    records_end: usize,
    /// Highest LSN in the batch (`Lsn::ZERO` if it holds only a segment header).
    lsn_last: Lsn,
    /// The batch starts its segment: the segment's name must be synced too.
    starts_segment: bool,
    /// Its segment's file is new, and its header allows zeros past the
    /// records: small batches have the file's blocks written ahead of them
    /// (see [`WRITE_AHEAD_BYTES`]).
    write_ahead: bool,
    /// Records appended.
    records: u32,
    /// Fresh buffers are advised to the kernel for huge pages
    /// ([`JournalConfig::huge_pages`]).
    huge_pages: bool,
    /// A small batch's records kept in [`Recent`], carved out of a slab
    /// ([`RecentMemory::carve`]); `bytes` is empty then.
    carved: Option<Bytes>,
}

impl Batch {
    /// An empty batch whose first record goes at `offset` of `segment`,
    /// after `prefix`: the bytes of the file from the start of `offset`'s
    /// sector to `offset`. `buffer` is reused, with room for `capacity`
    /// bytes of records.
    fn new(segment: u32, offset: u64, prefix: &[u8], mut buffer: Vec<u8>, capacity: usize, huge_pages: bool) -> Batch {
        assert_eq!(prefix.len() as u64, offset % DIRECT_ALIGN as u64);
        buffer.clear();
        // The alignment pad, the prefix and the padding of the last sector
        // are each shorter than a sector.
        let fresh = buffer.capacity() < capacity + 3 * DIRECT_ALIGN;
        buffer.reserve(capacity + 3 * DIRECT_ALIGN);
        if fresh && huge_pages {
            // Filled and written again and again (buffers are recycled).
            // With huge pages, 1 MiB writes that needed fresh buffers (a
            // server still busy with earlier work) ran 1.15–1.27× faster
            // (BENCHMARKS.md, "Huge pages for the journal's batches").
            rewind_io::advise_huge_pages(&buffer);
        }
        let sector_start = buffer.as_ptr().align_offset(DIRECT_ALIGN);
        assert!(sector_start < DIRECT_ALIGN, "a byte pointer can always be aligned");
        buffer.resize(sector_start, 0);
        buffer.extend_from_slice(prefix);
        let records_start = buffer.len();
        Batch {
            segment,
            offset,
            bytes: buffer,
            sector_start,
            records_start,
            records_end: records_start,
            lsn_last: Lsn::ZERO,
            starts_segment: false,
            write_ahead: false,
            records: 0,
            huge_pages,
            carved: None,
        }
    }

    /// The empty batch that follows this one in its segment, in `buffer`.
    fn next(&self, buffer: Vec<u8>, capacity: usize) -> Batch {
        let end = self.end();
        let prefix = &self.bytes[self.records_end - (end % DIRECT_ALIGN as u64) as usize..self.records_end];
        Batch {
            write_ahead: self.write_ahead,
            ..Batch::new(self.segment, end, prefix, buffer, capacity, self.huge_pages)
        }
    }

    fn records(&self) -> &[u8] {
        let bytes = self.carved.as_deref().unwrap_or(&self.bytes);
        &bytes[self.records_start..self.records_end]
    }

    fn records_len(&self) -> u64 {
        (self.records_end - self.records_start) as u64
    }

    /// The memory the batch holds: its buffer, whole, or its records
    /// carved out of a slab.
    fn held_bytes(&self) -> u64 {
        self.carved.as_ref().map_or(self.bytes.capacity(), Bytes::len) as u64
    }

    fn end(&self) -> u64 {
        self.offset + self.records_len()
    }

    /// Where it starts in the journal, comparable across segments.
    fn position(&self) -> u64 {
        pack(self.segment, self.offset)
    }

    /// Makes room for `record_bytes` of records and at least `capacity` in
    /// all, if the batch holds no records yet, by laying it out afresh; a
    /// batch that holds records grows when it must (its buffer then moves
    /// out of alignment, and its direct write copies it).
    fn make_room(&mut self, record_bytes: usize, capacity: usize) {
        let room = self.bytes.capacity() - self.bytes.len();
        if room >= record_bytes || self.records_len() > 0 {
            return;
        }
        let prefix = self.bytes[self.sector_start..self.records_start].to_vec();
        let buffer = std::mem::take(&mut self.bytes);
        let fresh = Batch::new(self.segment, self.offset, &prefix, buffer, capacity.max(record_bytes), self.huge_pages);
        *self = Batch {
            lsn_last: self.lsn_last,
            starts_segment: self.starts_segment,
            write_ahead: self.write_ahead,
            ..fresh
        };
    }

    /// Appends a record with `encode`, which must add `record_bytes`; an
    /// empty batch first makes room for at least `capacity` bytes.
    fn append(&mut self, record_bytes: u64, capacity: usize, encode: impl FnOnce(&mut Vec<u8>)) {
        assert_eq!(self.records_end, self.bytes.len(), "sealed batches take no records");
        self.make_room(record_bytes as usize, capacity);
        encode(&mut self.bytes);
        assert_eq!((self.bytes.len() - self.records_end) as u64, record_bytes);
        self.records_end = self.bytes.len();
        self.records += 1;
    }

    /// Whether its records are large writes on average (see
    /// [`LARGE_RECORD_BYTES`]).
    fn holds_large_records(&self) -> bool {
        self.records > 0 && self.records_len() / u64::from(self.records) >= LARGE_RECORD_BYTES
    }

    /// Pads the batch with zeros to a whole sector: it takes no more records.
    fn seal(&mut self) {
        let sectors = (self.records_end - self.sector_start).next_multiple_of(DIRECT_ALIGN);
        self.bytes.resize(self.sector_start + sectors, 0);
    }

    /// A sealed batch's whole sectors, and the file offset of the first.
    fn sectors(&self) -> (&[u8], u64) {
        let sector_offset = self.offset - (self.records_start - self.sector_start) as u64;
        (&self.bytes[self.sector_start..], sector_offset)
    }

    /// The file offsets a sealed batch's direct write covers.
    fn sector_range(&self) -> Range<u64> {
        let (sectors, sector_offset) = self.sectors();
        sector_offset..sector_offset + sectors.len() as u64
    }

    /// A copy of a written batch's records, carved out of a slab of
    /// `memory` ([`RecentMemory::carve`]), to keep in [`Recent`]
    /// while its own buffer is reused; `None` when that
    /// buffer is half full and worth keeping instead — a quarter full if it
    /// holds large records: the journal's writer writes out every 4 MiB, so
    /// batches of sustained large writes end just under half full, and
    /// their copies (with the page faults of the buffers they went into)
    /// were 4.5% of the server's CPU, for a share of [`RecentMemory`] that
    /// is small anyway. The copy is never written: it is not laid out for
    /// direct I/O.
    fn compacted(&self, memory: &RecentMemory) -> Option<Batch> {
        let share = if self.holds_large_records() { 4 } else { 2 };
        if self.records_len() as usize >= self.bytes.capacity() / share {
            return None;
        }
        let carved = memory.carve(self.records());
        let records_end = carved.len();
        Some(Batch { bytes: Vec::new(), carved: Some(carved), sector_start: 0, records_start: 0, records_end, ..*self })
    }

    /// Where the `len` bytes at `offset` of `segment` start in
    /// [`Batch::records`], if this batch holds them.
    fn start_of(&self, segment: u32, offset: u64, len: usize) -> Option<usize> {
        let holds = segment == self.segment && offset >= self.offset && offset + len as u64 <= self.end();
        holds.then(|| (offset - self.offset) as usize)
    }

    /// Copies `buf.len()` bytes at `offset` of `segment` if this batch holds them.
    fn copy_out(&self, segment: u32, offset: u64, buf: &mut [u8]) -> bool {
        let Some(start) = self.start_of(segment, offset, buf.len()) else {
            return false;
        };
        buf.copy_from_slice(&self.records()[start..start + buf.len()]);
        true
    }
}

/// Journal bytes still in the journal's memory, borrowed from the batch
/// that holds them rather than copied: the batch stays alive while they
/// are held, so hold them no longer than needed. The destager's copies
/// out of journal memory were a quarter of its CPU under sustained 1 MiB
/// writes (BENCHMARKS.md).
pub struct MemorySpan {
    /// `None` once dropped.
    batch: Option<Arc<Batch>>,
    start: usize,
    len: usize,
    memory: Arc<RecentMemory>,
    batch_bytes_max: usize,
}

impl std::ops::Deref for MemorySpan {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let batch = self.batch.as_ref().expect("held until dropped");
        &batch.records()[self.start..self.start + self.len]
    }
}

impl Drop for MemorySpan {
    /// The journal may have let go of the batch meanwhile (its memory
    /// full under sustained writes, the destager behind): its buffer is
    /// then kept for reuse here, as the journal would have. Freed, the
    /// next batches came in fresh buffers, and the kernel's zeroing of
    /// their pages took a sixth of the server's CPU (BENCHMARKS.md).
    fn drop(&mut self) {
        let batch = self.batch.take().expect("dropped once");
        self.memory.recycle(batch, self.batch_bytes_max);
    }
}

/// Bytes of the journal that [`Journal::read_span`] found: read into the
/// caller's buffer, or still in the journal's memory.
pub enum SpanBytes<'a> {
    Buffer(&'a [u8]),
    Memory(MemorySpan),
}

impl std::ops::Deref for SpanBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SpanBytes::Buffer(bytes) => bytes,
            SpanBytes::Memory(span) => span,
        }
    }
}

struct Tail {
    active: Batch,
    sealed: VecDeque<Arc<Batch>>,
    lsn_next: Lsn,
    /// Time of the last record appended (or recovered).
    timestamp_last: Timestamp,
    /// The active segment's file is a spare whose blocks are written: its
    /// header says recycled, and not written ahead (as a spare wiped at
    /// opening is, see `Journal::wipe_spares`).
    recycled: bool,
}

/// The segment file direct writes go to.
struct DirectFile {
    segment: u32,
    file: Arc<dyn File>,
}

/// Where a batch is written (see `Journal::write_target`).
enum WriteTarget {
    /// Around the page cache, with the aligned buffer for a batch whose own
    /// buffer is out of alignment.
    Direct {
        file: Arc<dyn File>,
        aligned: Vec<u8>,
    },
    Buffered(Arc<dyn File>),
}

/// What has been written to the segment files; guarded by the lock that
/// serialises writers and committers.
struct Written {
    /// Highest LSN in the files.
    lsn: Lsn,
    /// Where the written bytes end (a record boundary).
    end: JournalPosition,
    /// Segments written since their last sync, in order.
    unsynced: Vec<u32>,
    /// Direct writes: where they go, and an aligned buffer for a batch whose
    /// own buffer a record larger than `BATCH_BYTES` moved out of alignment
    /// (taken by the write that needs it; a second one at once allocates).
    direct: Option<DirectFile>,
    aligned: Vec<u8>,
    /// Commits into the segment written last, and into the one before it.
    commits: SegmentCommits,
    /// Sealed batches being written, by position (at most
    /// `BATCHES_IN_FLIGHT_MAX`), and those written whose predecessor is
    /// not yet: `lsn` and `end` move over batches in order only.
    writing: Vec<u64>,
    finished: Vec<u64>,
    /// Zeros written ahead of small batches in a new segment file.
    ahead: WrittenAhead,
}

/// Sealed batches written at once. One at a time, the disk idled between
/// one batch's write and the next — for a sync, a segment's start, a writer
/// not yet scheduled on a busy machine — 18% of the time under sustained
/// 1 MiB writes, whose batches it otherwise wrote at its full bandwidth
/// (BENCHMARKS.md, "Two batches in flight").
const BATCHES_IN_FLIGHT_MAX: usize = 2;

/// How far ahead of a small batch's records the blocks of a new segment
/// file are written (with zeros), half of it at least. A new file's blocks
/// are allocated but unwritten, and the first write into each costs the
/// filesystem a metadata commit at the next sync: for small commits, one
/// per commit, with its own cache flushes (32 KiB direct writes each
/// synced made 137–189 MiB/s into a new file, 194–234 with a mebibyte
/// written ahead of them, on this machine's disk; a written file made
/// 199–213). Written ahead, the commits that follow find the blocks
/// written, and the filesystem commits once per mebibyte. The zeros cost a
/// write of that mebibyte, which pays only for small batches
/// ([`WRITE_AHEAD_BATCH_MAX`]); a burst of large ones writes into the new
/// file as it is.
const WRITE_AHEAD_BYTES: u64 = 1 << 20;

/// The largest batch (its sectors) that has the blocks written ahead of
/// it: a metadata commit costs about as much as writing a seventh of
/// [`WRITE_AHEAD_BYTES`] (70 µs against 500 µs for the mebibyte at 2 GB/s),
/// so writing ahead pays while a commit takes less than that.
const WRITE_AHEAD_BATCH_MAX: usize = 128 << 10;

/// Where the blocks of a new segment file are written through, ahead of
/// the records, and the zeros being written ahead now, which no batch's
/// write may overlap until they land (they would wipe its records).
#[derive(Default)]
struct WrittenAhead {
    segment: u32,
    through: u64,
    writing: Option<Range<u64>>,
}

impl WrittenAhead {
    /// Whether `batch`'s write must wait for the zeros being written ahead.
    fn holds_back(&self, batch: &Batch) -> bool {
        let sectors = batch.sector_range();
        self.segment == batch.segment
            && self.writing.as_ref().is_some_and(|zeros| zeros.start < sectors.end && sectors.start < zeros.end)
    }

    /// The zeros to write right after `batch` (of a file of `file_bytes`),
    /// if it is small and its records come within half of
    /// [`WRITE_AHEAD_BYTES`] of where the file's blocks are written
    /// through: the next mebibyte from there. Planned only for a batch
    /// handed out while no other is being written or waits for one before
    /// it, so they start past every batch handed out so far, and a later
    /// one that reaches them waits for them (`holds_back`); at least one
    /// small batch past this one, so that the next batch, written at once
    /// with this one, does not wait for them (in a new segment, whose
    /// blocks are written through nowhere yet).
    fn plan(&mut self, batch: &Batch, file_bytes: u64) -> Option<Range<u64>> {
        let sectors = batch.sector_range();
        if !batch.write_ahead || sectors.end - sectors.start > WRITE_AHEAD_BATCH_MAX as u64 || self.writing.is_some() {
            return None;
        }
        if self.segment != batch.segment {
            *self = WrittenAhead { segment: batch.segment, through: 0, writing: None };
        }
        if sectors.end + WRITE_AHEAD_BYTES / 2 <= self.through {
            return None;
        }
        let start = self.through.max(sectors.end + WRITE_AHEAD_BATCH_MAX as u64);
        let end = (start + WRITE_AHEAD_BYTES).min(file_bytes);
        let zeros = start..end;
        (!zeros.is_empty()).then(|| {
            self.writing = Some(zeros.clone());
            zeros
        })
    }

    /// The zeros planned have been written (`landed`), or not.
    fn done(&mut self, zeros: Range<u64>, landed: bool) {
        assert_eq!(self.writing.as_ref(), Some(&zeros), "one write ahead at a time, of its segment");
        self.writing = None;
        if landed {
            self.through = self.through.max(zeros.end);
        }
    }
}

/// What one [`Journal::write_one`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WriteStep {
    /// The files hold every byte asked for.
    Done,
    /// Not yet: it wrote a batch, gave up one whose predecessor's write
    /// failed, or waited for another writer's.
    Again,
}

/// How many commits the last segments took (see `spare_after_commits`).
#[derive(Clone, Copy, Default)]
struct SegmentCommits {
    segment: u32,
    current: u64,
    previous: u64,
}

/// Buffers of written batches kept for reuse however full the memory.
const SPARE_BUFFERS_MIN: usize = 4;
/// What a journal keeps in memory of the batches it wrote when no
/// [`RecentMemory`] is shared with it ([`Journal::sharing_recent_memory`]).
const RECENT_BYTES_OWN: u64 = 64 << 20;
/// Batches whose records hold this much on average are of large writes,
/// which [`RecentMemory`] keeps less of: read back from the disk they are
/// read a record at a time, sequentially. As `rewind serve --burst-reads`
/// tells small reads from large ones.
const LARGE_RECORD_BYTES: u64 = 64 << 10;
/// Batches of large records take at most this share of the memory.
const LARGE_RECORDS_SHARE: u64 = 8;

/// Memory that journals keep the batches they wrote with direct I/O in,
/// until the destager has read them ([`Journal::forget_written`]): the page
/// cache does not hold them, and a buffered writer's would. Reads of blocks
/// not destaged yet and the destager's own reads then come from memory, not
/// the disk: after a burst of random writes, 140,000–370,000 blocks wait,
/// and half of the random reads that follow are theirs (BENCHMARKS.md).
/// Shared by the journals of a node: one that writes lets go of its own
/// oldest batches while the journals together keep more than `limit`.
///
/// The buffers of batches let go are kept for the next batches, of any of
/// the journals, within the same `limit`: a batch in a fresh buffer pays a
/// page fault for each 4 KiB its records fill, and a burst into a new
/// volume took a fifth of the server's time in them (BENCHMARKS.md, "The
/// journal at the device's limit"). Those no batch took between two calls
/// of [`RecentMemory::release_idle_spares`] are given back. Small batches'
/// copies are carved one after another out of such a buffer (a slab,
/// [`RecentMemory::carve`]), not out of fresh memory, and the slab goes
/// back to the spares once its last copy is let go.
///
/// Batches of large writes ([`Batch::holds_large_records`]) take at most
/// an eighth of `limit`: read back from the disk they cost a sequential
/// read, where the 4 KiB blocks of random writes cost a random read each,
/// and what the memory holds is paid for as it is first touched. On a VM
/// whose balloon takes freed memory back, that is a host fault and a
/// zeroed page for every 4 KiB: with all of an eighth of 23 GiB open to
/// them, 10 s of 1 MiB writes into a new server ran at 988 MiB/s and took
/// 1.17 CPU-s a GiB, against 1,230 and 0.63 with this share (BENCHMARKS.md,
/// "The journal's memory and large writes"). Random writes that fill the
/// memory afterwards pay for its pages instead, as they would have on a
/// server that had not seen large writes.
#[derive(Debug)]
pub struct RecentMemory {
    limit: u64,
    used: AtomicU64,
    /// The share of `used` in batches of large records.
    large_used: AtomicU64,
    spares: Mutex<SpareBuffers>,
}

/// Buffers of written batches kept for reuse, and the fewest there were
/// since the last release: that many no batch needed meanwhile; and the
/// slabs small batches' copies are carved out of.
#[derive(Debug, Default)]
struct SpareBuffers {
    buffers: Vec<Vec<u8>>,
    /// The bytes of `buffers`.
    bytes: u64,
    fewest: usize,
    /// The slab copies are carved out of now: what is left of it.
    slab: Slab,
    /// Slabs filled, oldest first, until their last copy is let go.
    filled: VecDeque<Slab>,
}

/// A buffer small batches' copies are carved out of, one after another
/// ([`RecentMemory::carve`]). What is carved is counted in
/// [`RecentMemory::used`] by its length, not by the slab: the memory holds
/// at most the slab being carved and the filled ones an old copy still
/// pins beyond that count (the journals let their copies go oldest first,
/// so few).
#[derive(Debug, Default)]
struct Slab {
    /// The slab's part not carved yet.
    rest: BytesMut,
    /// The slab's whole buffer, in bytes.
    capacity: usize,
}

/// A slab in fresh memory is at least this large, where no batch's
/// buffer is spare to carve copies out of.
const SLAB_BYTES: usize = 1 << 20;

impl SpareBuffers {
    /// Keeps `buffer` for a batch to come, if the memory has room for it
    /// beside `used` bytes of batches kept, within `limit`.
    fn keep(&mut self, buffer: Vec<u8>, used: u64, limit: u64) {
        let bytes = buffer.capacity() as u64;
        if self.buffers.len() < SPARE_BUFFERS_MIN || used + self.bytes + bytes <= limit {
            self.bytes += bytes;
            self.buffers.push(buffer);
        }
    }

    /// A buffer of a written batch, or a new one.
    fn take(&mut self) -> Vec<u8> {
        let buffer = self.buffers.pop().unwrap_or_default();
        self.bytes -= buffer.capacity() as u64;
        self.fewest = self.fewest.min(self.buffers.len());
        buffer
    }

    /// The filled slabs whose copies have all been let go, oldest first,
    /// as the buffers they were.
    fn slabs_free(&mut self) -> Vec<Vec<u8>> {
        let mut free = Vec::new();
        while let Some(oldest) = self.filled.front_mut() {
            let capacity = oldest.capacity;
            // Succeeds only where no copy shares the buffer any more.
            if !oldest.rest.try_reclaim(capacity) {
                break;
            }
            let slab = self.filled.pop_front().expect("found above");
            free.push(Vec::from(slab.rest));
        }
        free
    }
}

impl RecentMemory {
    pub fn new(limit: u64) -> Arc<RecentMemory> {
        Arc::new(RecentMemory {
            limit,
            used: AtomicU64::new(0),
            large_used: AtomicU64::new(0),
            spares: Mutex::default(),
        })
    }

    /// A buffer of a written batch, or a new one.
    fn take_spare(&self) -> Vec<u8> {
        self.spares.lock().take()
    }

    /// Keeps `buffer` for a batch to come, if the memory has room for it.
    fn keep_spare(&self, buffer: Vec<u8>) {
        self.spares.lock().keep(buffer, self.used(), self.limit);
    }

    /// A copy of a small batch's `records`, carved out of the slab after
    /// the copy before. A slab is a spare batch's buffer, whose pages are
    /// already touched, or else fresh memory: each copy in fresh memory
    /// paid a page fault for every 4 KiB of its records, on the path of
    /// the flush that made it, and on a VM whose balloon has taken the
    /// memory back that is a host fault, 8 µs and more (synced writes
    /// every 8 ran at about 50 MiB/s then, and at 60–87 where their copies
    /// found memory already touched: BENCHMARKS.md, "Synced every 8: fast
    /// when its copies land in memory the machine has touched").
    fn carve(&self, records: &[u8]) -> Bytes {
        let mut spares = self.spares.lock();
        if spares.slab.rest.capacity() < records.len() {
            let filled = std::mem::take(&mut spares.slab);
            if filled.capacity > 0 {
                spares.filled.push_back(filled);
            }
            // The newest slab free is carved next, the others go back to the spares.
            let mut free = spares.slabs_free();
            let mut buffer = free.pop().unwrap_or_default();
            for other in free {
                spares.keep(other, self.used(), self.limit);
            }
            if buffer.capacity() < records.len() {
                buffer = spares.take();
            }
            if buffer.capacity() < records.len() {
                if buffer.capacity() > 0 {
                    spares.keep(buffer, self.used(), self.limit);
                }
                buffer = Vec::with_capacity(SLAB_BYTES.max(records.len()));
            }
            buffer.clear();
            let capacity = buffer.capacity();
            let rest = Bytes::from(buffer).try_into_mut().expect("a buffer just taken is shared with nothing");
            assert_eq!(rest.capacity(), capacity, "the slab is the whole buffer");
            spares.slab = Slab { rest, capacity };
        }
        spares.slab.rest.extend_from_slice(records);
        spares.slab.rest.split().freeze()
    }

    /// Gives the filled slabs whose copies have all been let go back to
    /// the spares.
    fn give_back_free_slabs(&self) {
        let mut spares = self.spares.lock();
        for buffer in spares.slabs_free() {
            spares.keep(buffer, self.used(), self.limit);
        }
    }

    /// Gives back the spare buffers no batch took since the last call (the
    /// oldest kept), keeping a few: run now and then (a minute apart), so
    /// that the memory of a burst is held for the next burst but not by an
    /// idle node.
    pub fn release_idle_spares(&self) {
        self.give_back_free_slabs();
        let mut spares = self.spares.lock();
        let idle = spares.fewest.min(spares.buffers.len().saturating_sub(SPARE_BUFFERS_MIN));
        let released: u64 = spares.buffers.drain(..idle).map(|buffer| buffer.capacity() as u64).sum();
        spares.bytes -= released;
        spares.fewest = spares.buffers.len();
    }

    /// Keeps a written batch's buffer for reuse if this was its last
    /// holder: its pages are already faulted in. A whole batch's buffer is
    /// kept for the next batches; a carved copy let go may free its slab
    /// ([`RecentMemory::carve`]).
    fn recycle(&self, batch: Arc<Batch>, batch_bytes_max: usize) {
        let Ok(batch) = Arc::try_unwrap(batch) else { return };
        match batch.carved {
            Some(carved) => {
                drop(carved);
                self.give_back_free_slabs();
            }
            None if batch.bytes.capacity() >= batch_bytes_max => self.keep_spare(batch.bytes),
            // A first batch in a buffer of a few sectors.
            None => {}
        }
    }

    /// Bytes of spare batches' buffers kept now.
    pub fn spare_bytes(&self) -> u64 {
        self.spares.lock().bytes
    }

    /// Bytes of written batches the journals keep now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }

    fn large_over(&self) -> bool {
        self.large_used.load(Ordering::Relaxed) > self.limit / LARGE_RECORDS_SHARE
    }

    fn count(&self, batch: &Batch) {
        self.used.fetch_add(batch.held_bytes(), Ordering::Relaxed);
        if batch.holds_large_records() {
            self.large_used.fetch_add(batch.held_bytes(), Ordering::Relaxed);
        }
    }

    fn uncount(&self, batch: &Batch) {
        self.used.fetch_sub(batch.held_bytes(), Ordering::Relaxed);
        if batch.holds_large_records() {
            self.large_used.fetch_sub(batch.held_bytes(), Ordering::Relaxed);
        }
    }
}

/// The batches written with direct I/O that are still kept in memory,
/// oldest first: a small batch's records in a copy of their size
/// ([`Batch::compacted`]), so that its buffer, reserved for a whole batch,
/// is reused at once. Reads find theirs by bisection, and their bytes are
/// counted in [`RecentMemory`], not summed: a stream of small commits
/// keeps thousands. Those
/// of large records may leave before older ones ([`RecentMemory`]), so
/// the batches kept need not be neighbours.
#[derive(Default)]
struct Recent {
    batches: VecDeque<Arc<Batch>>,
    /// Where each of `batches` starts, packed: bisected rather than the
    /// batches, each a pointer away. A read of a MiB right after random
    /// writes synced every 8 looks up dozens of blocks among thousands of
    /// small batches, and the bisection through the batches was 5% of the
    /// readers' time, under the lock (BENCHMARKS.md).
    starts: VecDeque<u64>,
    /// Where the kept batches of large records start, oldest first.
    large: VecDeque<u64>,
}

impl Recent {
    /// The kept batch that would hold bytes at `offset` of `segment`, if any.
    fn batch_at(&self, segment: u32, offset: u64) -> Option<&Arc<Batch>> {
        let at = pack(segment, offset);
        let after = self.starts.partition_point(|&start| start <= at);
        after.checked_sub(1).map(|index| &self.batches[index])
    }

    fn push(&mut self, batch: Arc<Batch>) {
        if batch.holds_large_records() {
            self.large.push_back(batch.position());
        }
        self.starts.push_back(batch.position());
        self.batches.push_back(batch);
    }

    fn pop_oldest(&mut self) -> Option<Arc<Batch>> {
        let oldest = self.batches.pop_front()?;
        assert_eq!(self.starts.pop_front(), Some(oldest.position()), "a start per batch");
        if self.large.front() == Some(&oldest.position()) {
            self.large.pop_front();
        }
        Some(oldest)
    }

    /// Takes out the oldest kept batch of large records.
    fn pop_oldest_large(&mut self) -> Option<(usize, Arc<Batch>)> {
        let position = self.large.pop_front()?;
        let index = self.starts.binary_search(&position);
        let index = index.expect("a kept batch of large records is among the kept batches");
        let batch = self.batches.remove(index).expect("found above");
        self.starts.remove(index);
        assert!(batch.holds_large_records());
        Some((index, batch))
    }

    /// Where the oldest kept batch starts; `u64::MAX` with none.
    fn start(&self) -> u64 {
        self.starts.front().copied().unwrap_or(u64::MAX)
    }

    /// Copies `buf.len()` bytes at `offset` of `segment` if a kept batch holds them.
    fn copy_out(&self, segment: u32, offset: u64, buf: &mut [u8]) -> bool {
        self.batch_at(segment, offset).is_some_and(|batch| batch.copy_out(segment, offset, buf))
    }
}

pub struct Journal {
    storage: Arc<dyn Storage>,
    dir: String,
    block_size: BlockSize,
    config: JournalConfig,
    tail: Mutex<Tail>,
    /// Hands out sealed batches to write, moves the files' end over them in
    /// order, and is taken for what a sync makes durable.
    written: Mutex<Written>,
    /// Signalled whenever a batch's write ends, whether it moved `written`
    /// or failed: writers wait on it for a batch another one writes.
    written_moved: parking_lot::Condvar,
    /// Serialises syncs, apart from `written`: while one waits for the disk,
    /// the next committers write their batches out, and the sync for them
    /// starts as soon as it ends. Holding `written` through the sync made
    /// each commit wait for the one before it, then write, then sync
    /// (BENCHMARKS.md, NFS at 96% updates). A `std` mutex: its waiters sleep
    /// in the kernel, where `parking_lot`'s first yield in a loop, for a lock
    /// held across a disk flush.
    syncing: std::sync::Mutex<()>,
    /// Batches written with direct I/O (see [`RecentMemory`]).
    /// Read by every reader of blocks still in memory, at once.
    recent: parking_lot::RwLock<Recent>,
    recent_memory: Arc<RecentMemory>,
    /// `pack(segment, offset)` of the oldest byte `recent` holds.
    recent_start: AtomicU64,
    /// Writes go around the page cache; cleared for good if the filesystem refuses.
    direct_io: AtomicBool,
    lsn_durable: AtomicU64,
    /// The durable LSN with the position right after its record, updated together.
    durable_point: Mutex<(Lsn, JournalPosition)>,
    /// `pack(segment, offset)`: everything before this is in the files.
    written_end: AtomicU64,
    poisoned: AtomicBool,
    /// The LSN the last vouch record vouches for.
    lsn_vouched: AtomicU64,
    files: Mutex<HashMap<u32, Arc<dyn File>>>,
    /// Segments below this were reclaimed.
    segment_first: AtomicU32,
    /// Serialises reclaiming, and looking at what can be reclaimed; and
    /// naming spares.
    reclaiming: Mutex<()>,
    /// Held while a spare is written ahead of need.
    preparing: Mutex<()>,
    /// `SegmentCommits::current.max(previous)`, for `prepare_spare`.
    segment_commits: AtomicU64,
    /// `pack(segment, commits)`: the commits into the segment written last.
    commits_written: AtomicU64,
    /// Spare segment files kept, as last counted.
    spares_kept: AtomicUsize,
    /// Spares the chunk store took: segments a reclaim would have kept as
    /// spares, had the chunk store not adopted their files (`reclaim`).
    /// `prepare_spare` writes as many ahead of need, so that the next burst
    /// still writes into written files.
    spares_owed: AtomicUsize,
    /// Bytes of zeros written into spares ahead of need, since opening.
    spare_bytes_written: AtomicU64,
    /// Segments started since the last reclaim that gave any up: how many
    /// spares the journal would have used (`reclaim`).
    segments_started: AtomicU32,
    /// The most segments started between two reclaims lately.
    spare_demand: Mutex<SpareDemand>,
}

/// The most segments a journal started between two reclaims, and when
/// that reclaim was: a reclaim keeps that many spares, so that the next
/// burst as large as the last writes only into reused files. The spares a
/// journal finds when it opens are a demand dated by its first reclaim
/// (`at` is `None` until then): the journal has no clock, and a restart
/// says nothing about the bursts to come.
#[derive(Clone, Copy, Default)]
struct SpareDemand {
    segments: usize,
    at: Option<Timestamp>,
}

/// How long a reclaim remembers the largest demand for spares. A burst
/// (a nightly job, a restore, a database's checkpoint) tends to come
/// again; files kept an hour cost disk space the journal held anyway at
/// its peak, and are given back at once when space runs low
/// ([`Journal::give_back_spares`]).
const SPARE_DEMAND_KEPT_NANOS: u64 = 3_600 * Timestamp::NANOS_PER_SECOND;

/// How many segment files stay open for reading.
const OPEN_SEGMENTS_MAX: usize = 64;

/// Spares written ahead at most ([`Journal::prepare_spare`]): enough for
/// the segments a quiet moment comes between; reclaims keep the rest.
const SPARES_AHEAD_MAX: usize = 2;

/// The lowest spare number not in `spares`.
fn free_spare_number(spares: &[u32]) -> u32 {
    (0..).find(|number| !spares.contains(number)).expect("fewer spares than numbers")
}

fn pack(segment: u32, offset: u64) -> u64 {
    assert!(offset <= u64::from(u32::MAX));
    u64::from(segment) << 32 | offset
}

fn unpack(packed: u64) -> (u32, u64) {
    ((packed >> 32) as u32, packed & u64::from(u32::MAX))
}

fn segment_name(segment: u32) -> String {
    format!("{segment:08}.seg")
}

fn parse_segment_name(name: &str) -> Option<u32> {
    name.strip_suffix(".seg").filter(|digits| digits.len() == 8).and_then(|digits| digits.parse().ok())
}

/// A spare segment file: `spare-0`, `spare-1`, … (the lowest numbers free).
fn spare_name(number: u32) -> String {
    format!("spare-{number}")
}

fn parse_spare_name(name: &str) -> Option<u32> {
    name.strip_prefix("spare-")
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

/// Where a spare is written before it is named one (a crash leaves it to
/// the next preparation to remove).
const SPARE_PREPARING_NAME: &str = "spare.preparing";

impl Drop for Journal {
    /// Gives back the memory its written batches took from what it shares.
    fn drop(&mut self) {
        for batch in &self.recent.get_mut().batches {
            self.recent_memory.uncount(batch);
        }
    }
}

impl Journal {
    /// Creates an empty journal in `dir` whose first record will be LSN 1;
    /// `created` is when the volume's history begins.
    pub fn create(
        storage: Arc<dyn Storage>,
        dir: &str,
        block_size: BlockSize,
        config: JournalConfig,
        created: Timestamp,
    ) -> Result<Journal, JournalError> {
        assert!(config.segment_bytes_max <= u64::from(u32::MAX));
        let io = |path: &str| {
            let path = path.to_owned();
            move |source| JournalError::Io { path, source }
        };
        storage.create_dir_all(dir).map_err(io(dir))?;
        let path = format!("{dir}/{}", segment_name(1));
        let file = storage.open_file(&path, OpenMode::CreateNew).map_err(io(&path))?;
        file.allocate(0, segment_reserved_bytes(config.segment_bytes_max)).map_err(io(&path))?;
        let header = SegmentHeader {
            segment: 1,
            block_size,
            lsn_first: Lsn(1),
            timestamp_before: created,
            recycled: false,
            written_ahead: config.direct_io,
        };
        file.write_all_at(&header.encode(), 0).map_err(io(&path))?;
        file.sync_data().map_err(io(&path))?;
        storage.sync_dir(dir).map_err(io(dir))?;
        let start = JournalPosition { segment: 1, offset: SEGMENT_HEADER_BYTES as u64 };
        let prefix = header.encode();
        let journal = Journal::assemble(storage, dir, block_size, config, start, &prefix, Lsn(1), created, 1);
        journal.files.lock().insert(1, file);
        journal.tail.lock().active.write_ahead = header.written_ahead;
        // Spares of an earlier journal here would hold records with LSNs
        // this one is yet to reach: they must not be read as such.
        journal.wipe_spares()?;
        Ok(journal)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &str,
        block_size: BlockSize,
        config: JournalConfig,
        JournalPosition { segment, offset: end }: JournalPosition,
        prefix: &[u8],
        lsn_next: Lsn,
        timestamp_last: Timestamp,
        segment_first: u32,
    ) -> Journal {
        Journal {
            storage,
            dir: dir.to_owned(),
            block_size,
            config,
            tail: Mutex::new(Tail {
                // Room for records is made by the first append: a journal
                // opened only to be read (recovery) holds no batch buffer.
                active: Batch::new(segment, end, prefix, Vec::new(), 0, config.huge_pages),
                sealed: VecDeque::new(),
                lsn_next,
                timestamp_last,
                recycled: false,
            }),
            written: Mutex::new(Written {
                lsn: Lsn(lsn_next.0 - 1),
                end: JournalPosition { segment, offset: end },
                unsynced: Vec::new(),
                direct: None,
                aligned: Vec::new(),
                commits: SegmentCommits::default(),
                writing: Vec::new(),
                finished: Vec::new(),
                ahead: WrittenAhead::default(),
            }),
            written_moved: parking_lot::Condvar::new(),
            syncing: std::sync::Mutex::new(()),
            recent: parking_lot::RwLock::new(Recent::default()),
            recent_memory: RecentMemory::new(RECENT_BYTES_OWN),
            recent_start: AtomicU64::new(u64::MAX),
            direct_io: AtomicBool::new(config.direct_io),
            lsn_durable: AtomicU64::new(lsn_next.0 - 1),
            durable_point: Mutex::new((Lsn(lsn_next.0 - 1), JournalPosition { segment, offset: end })),
            written_end: AtomicU64::new(pack(segment, end)),
            poisoned: AtomicBool::new(false),
            lsn_vouched: AtomicU64::new(0),
            files: Mutex::new(HashMap::new()),
            segment_first: AtomicU32::new(segment_first),
            reclaiming: Mutex::new(()),
            preparing: Mutex::new(()),
            segment_commits: AtomicU64::new(0),
            commits_written: AtomicU64::new(0),
            spares_kept: AtomicUsize::new(0),
            spares_owed: AtomicUsize::new(0),
            spare_bytes_written: AtomicU64::new(0),
            segments_started: AtomicU32::new(0),
            spare_demand: Mutex::default(),
        }
    }

    /// Starts recovering a journal: records from `from` on (which must be the
    /// start of record `lsn_from`, or the end of the journal; the record
    /// before it has time `timestamp_before`) are handed out by
    /// [`Recovery::next_record`]; [`Recovery::finish`] then yields the journal.
    pub fn recover(
        storage: Arc<dyn Storage>,
        dir: &str,
        block_size: BlockSize,
        config: JournalConfig,
        from: JournalPosition,
        lsn_from: Lsn,
        timestamp_before: Timestamp,
    ) -> Result<Recovery, JournalError> {
        let segment_first = {
            let names = storage.list_dir(dir).map_err(|source| JournalError::Io { path: dir.to_owned(), source })?;
            names.iter().filter_map(|name| parse_segment_name(name)).min().unwrap_or(from.segment)
        };
        let path = format!("{dir}/{}", segment_name(from.segment));
        let prefix = storage
            .open_file(&path, OpenMode::Existing)
            .and_then(|file| read_prefix(&*file, from.offset))
            .map_err(|source| JournalError::Io { path, source })?;
        let journal = Journal::assemble(
            storage,
            dir,
            block_size,
            config,
            from,
            &prefix,
            lsn_from,
            timestamp_before,
            segment_first,
        );
        let mut recovery = Recovery {
            journal,
            timestamp_last: timestamp_before,
            segment: from.segment,
            offset: from.offset,
            lsn_expected: lsn_from,
            buffer: Vec::new(),
            records_replayed: 0,
            truncated_bytes: 0,
            dropped: None,
            repair: false,
            lost: Vec::new(),
            file: None,
            header: None,
        };
        recovery.open_segment(from.segment, None)?;
        Ok(recovery)
    }

    /// Where the oldest segment still present starts, the LSN of its first
    /// record and the time of the last record before it: a replay position
    /// from which everything the journal still holds is read (for a repair
    /// that lost the checkpoint, or rebuilds what is derived from it).
    pub fn oldest_start(storage: &dyn Storage, dir: &str) -> Result<(JournalPosition, Lsn, Timestamp), JournalError> {
        let io = |path: &str| {
            let path = path.to_owned();
            move |source| JournalError::Io { path, source }
        };
        let names = storage.list_dir(dir).map_err(io(dir))?;
        let segment = names.iter().filter_map(|name| parse_segment_name(name)).min().ok_or_else(|| {
            JournalError::Corrupt { path: dir.to_owned(), offset: 0, reason: "no journal segment is left".into() }
        })?;
        let path = format!("{dir}/{}", segment_name(segment));
        let file = storage.open_file(&path, OpenMode::Existing).map_err(io(&path))?;
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut header, 0).map_err(io(&path))?;
        let header = SegmentHeader::decode(&header).map_err(|error| JournalError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason: error.to_string(),
        })?;
        let start = JournalPosition { segment, offset: SEGMENT_HEADER_BYTES as u64 };
        Ok((start, header.lsn_first, header.timestamp_before))
    }

    fn path(&self, segment: u32) -> String {
        format!("{}/{}", self.dir, segment_name(segment))
    }

    fn io_error(&self, path: String) -> impl FnOnce(io::Error) -> JournalError {
        move |source| JournalError::Io { path, source }
    }

    /// Like `io_error`, but names the segment only if there is an error: reads
    /// and writes are too frequent to format a path each time.
    fn segment_io_error(&self, segment: u32) -> impl FnOnce(io::Error) -> JournalError + '_ {
        move |source| JournalError::Io { path: self.path(segment), source }
    }

    fn check_poisoned(&self) -> Result<(), JournalError> {
        if self.poisoned.load(Ordering::Acquire) {
            Err(JournalError::Poisoned)
        } else {
            Ok(())
        }
    }

    fn poison(&self, error: JournalError) -> JournalError {
        self.poisoned.store(true, Ordering::Release);
        error
    }

    /// Poisons the journal after a failed write, unless the failure is
    /// transient (see [`JournalError::is_transient`]): a write that failed
    /// for want of space or descriptors leaves its batch queued, and the
    /// next commit writes it again at the same place.
    fn fail_write(&self, error: JournalError) -> JournalError {
        if error.is_transient() {
            return error;
        }
        self.poison(error)
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    fn file(&self, segment: u32) -> Result<Arc<dyn File>, JournalError> {
        let mut files = self.files.lock();
        if let Some(file) = files.get(&segment) {
            return Ok(Arc::clone(file));
        }
        let path = self.path(segment);
        let file = self.storage.open_file(&path, OpenMode::Existing).map_err(self.io_error(path))?;
        if files.len() >= OPEN_SEGMENTS_MAX {
            // The oldest: never the segment being written (the newest),
            // whose reopening for a commit's sync could meet EMFILE.
            let victim = *files.keys().filter(|&&other| other != segment).min().expect("cache is not empty");
            files.remove(&victim);
        }
        files.insert(segment, Arc::clone(&file));
        Ok(file)
    }

    /// Appends a write record for `data`, a whole number of blocks starting at
    /// `block_first`, and pushes each block's CRC-32C onto `crcs`.
    pub fn append_write(
        &self,
        timestamp: Timestamp,
        block_first: BlockIndex,
        data: &[u8],
        crcs: &mut Vec<u32>,
    ) -> Result<Appended, JournalError> {
        self.append_blocks(Stamped::At(timestamp), block_first, data, crcs)
    }

    /// Appends a zero record: `block_count` blocks from `block_first` now read
    /// as zeros.
    pub fn append_zero(
        &self,
        timestamp: Timestamp,
        block_first: BlockIndex,
        block_count: u32,
    ) -> Result<Appended, JournalError> {
        self.append_zeros(Stamped::At(timestamp), block_first, block_count)
    }

    /// Appends a compound record (see `RecordKind::Compound`): `extents`, sorted
    /// and disjoint, written or zeroed at one time, all or none; `data` holds
    /// the data extents' blocks in order. Pushes each data block's CRC-32C
    /// onto `crcs`; the data of the i-th data block is at
    /// `Appended::data_offset` + i blocks.
    pub fn append_compound(
        &self,
        timestamp: Timestamp,
        extents: &[CompoundExtent],
        data: &[&[u8]],
        crcs: &mut Vec<u32>,
    ) -> Result<Appended, JournalError> {
        let data_bytes: u64 = data.iter().map(|slice| slice.len() as u64).sum();
        let header_bytes = (RECORD_HEADER_BYTES + extents.len() * COMPOUND_EXTENT_BYTES) as u64
            + (data_bytes / u64::from(self.block_size.bytes()) * 4).next_multiple_of(8);
        let first = BlockIndex(extents.len() as u64);
        self.append(Stamped::At(timestamp), first, header_bytes, data_bytes, |out, stamp| {
            append_compound_record(out, crcs, stamp, extents, data)
        })
    }

    /// Appends a write record of the background copy after the revert at
    /// `revert` (see `RecordHeader::revert`): `data`, from `block_first`,
    /// as the volume reads there from that revert on.
    pub fn append_revert_copy(
        &self,
        revert: Timestamp,
        block_first: BlockIndex,
        data: &[u8],
        crcs: &mut Vec<u32>,
    ) -> Result<Appended, JournalError> {
        self.append_blocks(Stamped::RevertCopy(revert), block_first, data, crcs)
    }

    /// [`Journal::append_revert_copy`] for `block_count` blocks of zeros.
    pub fn append_revert_zero(
        &self,
        revert: Timestamp,
        block_first: BlockIndex,
        block_count: u32,
    ) -> Result<Appended, JournalError> {
        self.append_zeros(Stamped::RevertCopy(revert), block_first, block_count)
    }

    fn append_blocks(
        &self,
        stamped: Stamped,
        block_first: BlockIndex,
        data: &[u8],
        crcs: &mut Vec<u32>,
    ) -> Result<Appended, JournalError> {
        let block_count = data.len() as u64 / u64::from(self.block_size.bytes());
        let header_bytes = RECORD_HEADER_BYTES as u64 + (block_count * 4).next_multiple_of(8);
        self.append(stamped, block_first, header_bytes, data.len() as u64, |out, stamp| {
            append_write_record(out, crcs, stamp, data)
        })
    }

    fn append_zeros(
        &self,
        stamped: Stamped,
        block_first: BlockIndex,
        block_count: u32,
    ) -> Result<Appended, JournalError> {
        self.append(stamped, block_first, RECORD_HEADER_BYTES as u64, 0, |out, stamp| {
            append_zero_record(out, stamp, block_count)
        })
    }

    /// Appends a copy record of `versions` (see `RecordKind::Copy`), stamped
    /// with the newest time so far.
    pub fn append_copy(&self, versions: &[Version]) -> Result<Appended, JournalError> {
        let header_bytes = (RECORD_HEADER_BYTES + versions.len() * COPY_ENTRY_BYTES) as u64;
        self.append(Stamped::Latest, BlockIndex(0), header_bytes, 0, |out, stamp| {
            append_copy_record(out, stamp, versions)
        })
    }

    fn append(
        &self,
        stamped: Stamped,
        block_first: BlockIndex,
        header_bytes: u64,
        data_bytes: u64,
        encode: impl FnOnce(&mut Vec<u8>, RecordStamp),
    ) -> Result<Appended, JournalError> {
        self.check_poisoned()?;
        let record_bytes = header_bytes + data_bytes;
        let mut tail = self.tail.lock();
        let end = tail.active.end();
        if end + record_bytes > self.config.segment_bytes_max && end > SEGMENT_HEADER_BYTES as u64
            || self.leaves_new_segment(&tail)
        {
            self.start_segment(&mut tail)?;
        } else if tail.active.records_len() + record_bytes > self.config.batch_bytes_max as u64
            && tail.active.records_len() > 0
        {
            self.seal_active_locked(&mut tail);
        }
        let lsn = tail.lsn_next;
        let (timestamp, revert) = match stamped {
            Stamped::At(timestamp) => (timestamp, None),
            Stamped::Latest => (tail.timestamp_last, None),
            Stamped::RevertCopy(revert) => (tail.timestamp_last, Some(revert)),
        };
        let stamp = RecordStamp {
            block_size: self.block_size,
            lsn,
            lsn_committed: Lsn(self.lsn_durable.load(Ordering::Acquire)),
            timestamp,
            block_first,
            revert,
        };
        let record_offset = tail.active.end();
        tail.active.append(record_bytes, self.config.batch_bytes_max, |out| encode(out, stamp));
        tail.active.lsn_last = lsn;
        tail.lsn_next = lsn.next();
        tail.timestamp_last = timestamp;
        let data_offset = u32::try_from(record_offset + header_bytes).expect("segments are below 4 GiB");
        Ok(Appended { lsn, segment: tail.active.segment, data_offset })
    }

    /// Whether to end the active segment early for a spare: it is a new file
    /// (each commit into it costs the filesystem a metadata commit), a spare
    /// is ready, and the segment has taken `spare_after_commits` commits
    /// already — a journal of many small commits, such as the first minutes
    /// of a new volume's database or file tree. Its unused space is given
    /// back when it is reclaimed.
    fn leaves_new_segment(&self, tail: &Tail) -> bool {
        let (segment, commits) = unpack(self.commits_written.load(Ordering::Relaxed));
        !tail.recycled
            && segment == tail.active.segment
            && commits >= self.config.spare_after_commits
            && self.spares_kept.load(Ordering::Relaxed) > 0
            && tail.active.end() > SEGMENT_HEADER_BYTES as u64
    }

    /// Seals the active batch and starts the next segment with its header,
    /// in a spare segment file if there is one, else in a new file, allocating
    /// the whole segment either way (see the module documentation).
    fn start_segment(&self, tail: &mut Tail) -> Result<(), JournalError> {
        let segment = tail.active.segment + 1;
        let path = self.path(segment);
        let (file, recycled) = match self.take_spare(&path).map_err(|error| self.fail_write(error))? {
            Some(file) => (file, true),
            None => (self.create_segment_file(&path).map_err(|error| self.fail_write(error))?, false),
        };
        // A spare wiped at opening reads as one hole: its blocks are
        // unwritten, as a new file's are (where holes cannot be told, every
        // spare counts as written).
        let unwritten =
            !recycled || file.next_data(0).map_err(|error| self.fail_write(self.io_error(path)(error)))?.is_none();
        self.files.lock().insert(segment, file);
        self.segments_started.fetch_add(1, Ordering::Relaxed);
        tail.recycled = !unwritten;
        let header = SegmentHeader {
            segment,
            block_size: self.block_size,
            lsn_first: tail.lsn_next,
            timestamp_before: tail.timestamp_last,
            recycled,
            // A direct write lands in the file's blocks as it is: a reused
            // spare's are written already, others' are written ahead.
            written_ahead: unwritten && self.direct_io.load(Ordering::Acquire),
        };
        let capacity = self.config.batch_bytes_max;
        let mut next = Batch::new(segment, 0, &[], self.spare_buffer(), capacity, self.config.huge_pages);
        next.append(SEGMENT_HEADER_BYTES as u64, capacity, |out| out.extend_from_slice(&header.encode()));
        next.starts_segment = true;
        next.write_ahead = header.written_ahead;
        self.seal_into(tail, next);
        Ok(())
    }

    /// How many spares a reclaim keeps: as many segments as the journal
    /// started between two reclaims at most within the last hour
    /// (`SPARE_DEMAND_KEPT_NANOS`; what its next burst would reuse), at
    /// least those written ahead, at most `spare_segments_max`. A demand
    /// older than that gives way to the current one.
    fn spares_wanted(&self, now: Timestamp) -> usize {
        let started = self.segments_started.swap(0, Ordering::Relaxed) as usize;
        let mut demand = self.spare_demand.lock();
        let at = *demand.at.get_or_insert(now);
        if started >= demand.segments || now.unix_nanos().saturating_sub(at.unix_nanos()) >= SPARE_DEMAND_KEPT_NANOS {
            *demand = SpareDemand { segments: started, at: Some(now) };
        }
        demand.segments.max(SPARES_AHEAD_MAX).min(self.config.spare_segments_max)
    }

    /// Deletes the spares beyond those written ahead and forgets the demand
    /// for them: the filesystem's free space runs low, and other files
    /// (the chunk store's packs, the index) need it more than the next
    /// burst's speed does. Returns the bytes given back.
    pub fn give_back_spares(&self) -> Result<u64, JournalError> {
        let keep = SPARES_AHEAD_MAX.min(self.config.spare_segments_max);
        if self.spares_kept.load(Ordering::Relaxed) <= keep {
            return Ok(0);
        }
        let _reclaiming = self.reclaiming.lock();
        *self.spare_demand.lock() = SpareDemand::default();
        self.spares_owed.store(0, Ordering::Relaxed);
        self.trim_spares(keep)
    }

    /// Deletes the spares beyond the `keep` lowest numbered (those taken
    /// first): a journal whose demand fell gives their space back. Returns
    /// the bytes their files had allocated.
    fn trim_spares(&self, keep: usize) -> Result<u64, JournalError> {
        let spares = self.spares()?;
        let mut deleted = 0;
        for &number in spares.iter().skip(keep) {
            let path = format!("{}/{}", self.dir, spare_name(number));
            match self.storage.remove_file(&path) {
                Ok(()) => deleted += segment_reserved_bytes(self.config.segment_bytes_max),
                // Taken for a segment meanwhile.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(self.io_error(path)(error)),
            }
        }
        if spares.len() > keep {
            self.storage.sync_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        }
        self.spares_kept.store(spares.len().min(keep), Ordering::Relaxed);
        Ok(deleted)
    }

    /// A new segment file at `path`, its whole size allocated.
    fn create_segment_file(&self, path: &str) -> Result<Arc<dyn File>, JournalError> {
        let created = self.storage.open_file(path, OpenMode::CreateNew).and_then(|file| {
            match file.allocate(0, segment_reserved_bytes(self.config.segment_bytes_max)) {
                Ok(()) => Ok(file),
                Err(error) => {
                    // Nothing refers to it: the next attempt starts afresh.
                    drop(file);
                    let _ = self.storage.remove_file(path);
                    Err(error)
                }
            }
        });
        created.map_err(self.io_error(path.to_owned()))
    }

    /// A spare segment file renamed to `path`, if there is one. Its old
    /// header and records stay until the new segment's batches overwrite
    /// them; recovery tells them apart by their LSNs (see `Recovery`). The
    /// rename is made durable before the segment's first batch is written
    /// (`write_sealed`), as a new file's name is.
    fn take_spare(&self, path: &str) -> Result<Option<Arc<dyn File>>, JournalError> {
        let (spares, spare_path) = loop {
            let spares = self.spares()?;
            let Some(&spare) = spares.first() else { return Ok(None) };
            let spare_path = format!("{}/{}", self.dir, spare_name(spare));
            match self.storage.rename(&spare_path, path) {
                // Trimmed by a reclaim since the listing (the writer does not
                // wait for reclaims): the next one, if any.
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                renamed => renamed.map_err(self.io_error(spare_path.clone()))?,
            }
            break (spares, spare_path);
        };
        self.spares_kept.store(spares.len() - 1, Ordering::Relaxed);
        let opened = self.storage.open_file(path, OpenMode::Existing).and_then(|file| {
            // A spare cut short by recovery (a torn tail) has less than a segment.
            file.allocate(0, segment_reserved_bytes(self.config.segment_bytes_max))?;
            Ok(file)
        });
        match opened {
            Ok(file) => Ok(Some(file)),
            Err(error) => {
                // Named a spare again, so that the segment is created anew
                // once the (transient) condition passes: left under the
                // segment's name, it made that creation fail, for good.
                if let Err(undo) = self.storage.rename(path, &spare_path) {
                    tracing::warn!(%path, %undo, "cannot name a spare segment file back after failing to take it");
                }
                Err(self.io_error(path.to_owned())(error))
            }
        }
    }

    /// Writes a spare segment file ahead of need when the segments take many
    /// commits (`spare_after_commits`) and fewer than two spares are kept
    /// (`SPARES_AHEAD_MAX`), or when the chunk store took segment files a
    /// reclaim would have kept as spares (`spares_owed`): a whole segment of
    /// zeros, written with direct I/O and synced, so that the segment that
    /// takes it commits as fast as one in a reused file, and a burst as large
    /// as the last writes at the speed of written blocks, not of new ones
    /// (about 0.8 of the speed on this VM's disk, whose host allocates a
    /// block at its first write, BENCHMARKS.md). Adopting a segment saved
    /// writing its history again while the writes came; its spare is written
    /// when nothing else is. For the background, at a quiet moment: it
    /// writes a whole segment, which the next cache flush of the journal's
    /// commits would otherwise wait for. Returns whether it wrote one;
    /// nothing where the journal does not write with direct I/O (such a
    /// filesystem has no unwritten extents to convert).
    pub fn prepare_spare(&self) -> Result<bool, JournalError> {
        let Some(_preparing) = self.preparing.try_lock() else { return Ok(false) };
        let owed = self.spares_owed.load(Ordering::Relaxed) > 0;
        let many_commits = self.segment_commits.load(Ordering::Relaxed) >= self.config.spare_after_commits
            && self.spares()?.len() < self.config.spare_segments_max.min(SPARES_AHEAD_MAX);
        if !self.direct_io.load(Ordering::Acquire) || !(owed || many_commits) {
            return Ok(false);
        }
        self.check_poisoned()?;
        let path = format!("{}/{SPARE_PREPARING_NAME}", self.dir);
        match self.storage.remove_file(&path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(self.io_error(path)(error)),
            _ => {}
        }
        let written = self.write_zeros(&path);
        if written.is_err() {
            let _ = self.storage.remove_file(&path);
        }
        if !written? {
            return Ok(false);
        }
        let _reclaiming = self.reclaiming.lock();
        let spares = self.spares()?;
        let spare_path = format!("{}/{}", self.dir, spare_name(free_spare_number(&spares)));
        self.storage.rename(&path, &spare_path).map_err(self.io_error(path))?;
        self.storage.sync_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        self.spares_kept.store(spares.len() + 1, Ordering::Relaxed);
        let _ = self.spares_owed.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |owed| owed.checked_sub(1));
        Ok(true)
    }

    /// Spares still to be written ahead for those the chunk store took
    /// (see [`Journal::prepare_spare`]).
    pub fn spares_owed(&self) -> usize {
        self.spares_owed.load(Ordering::Relaxed)
    }

    /// Bytes of zeros written into spares ahead of need since the journal
    /// was opened (see [`Journal::prepare_spare`]).
    pub fn spare_bytes_written(&self) -> u64 {
        self.spare_bytes_written.load(Ordering::Relaxed)
    }

    /// A new file at `path` of `segment_bytes_max` zeros written with direct
    /// I/O, and synced; `false` (and no file) if the filesystem refuses
    /// direct I/O.
    fn write_zeros(&self, path: &str) -> Result<bool, JournalError> {
        const CHUNK_BYTES: usize = 1 << 20;
        let io = self.io_error(path.to_owned());
        let file = self.storage.open_file(path, OpenMode::CreateNew).map_err(self.io_error(path.to_owned()))?;
        let size_bytes = segment_reserved_bytes(self.config.segment_bytes_max);
        file.allocate(0, size_bytes).map_err(self.io_error(path.to_owned()))?;
        let direct = match self.storage.open_direct(path) {
            Ok(direct) => direct,
            Err(error) if error.kind() == io::ErrorKind::Unsupported => {
                drop(file);
                self.storage.remove_file(path).map_err(io)?;
                return Ok(false);
            }
            Err(error) => return Err(self.io_error(path.to_owned())(error)),
        };
        let mut buffer = Vec::new();
        let zeros = aligned_slice(&mut buffer, CHUNK_BYTES);
        zeros.fill(0);
        let mut offset = 0;
        while offset < size_bytes {
            let length = CHUNK_BYTES.min((size_bytes - offset) as usize);
            direct.write_all_at(&zeros[..length], offset).map_err(self.io_error(path.to_owned()))?;
            offset += length as u64;
            self.spare_bytes_written.fetch_add(length as u64, Ordering::Relaxed);
        }
        file.sync_data().map_err(io)?;
        Ok(true)
    }

    /// Makes every spare read as zeros, durably, before any is reused. After
    /// a crash a spare may hold a segment the crash lost (started in it, and
    /// the renaming undone): records with the LSNs the journal hands out
    /// again, which would be replayed as written if the file were reused and
    /// its new records lost in turn. Nothing tells such a file from a clean
    /// one. The zeros are not written: the filesystem marks the blocks
    /// unwritten and they stay the file's (`File::zero_range`), so the first
    /// burst after a restart writes into blocks the disk has had written, as
    /// the burst before it did, rather than into new ones (slower on a
    /// thin-provisioned disk, BENCHMARKS.md); such a spare then takes zeros
    /// ahead of small batches as a new file does (`start_segment`). A spare
    /// that cannot be wiped (the filesystem cannot zero a range, the disk is
    /// full, its sync fails) is deleted instead, as all were before: it holds
    /// nothing acknowledged, and the journal must open. The spares kept
    /// are the demand until a reclaim finds a larger one, or an hour passes.
    fn wipe_spares(&self) -> Result<(), JournalError> {
        let spares = self.spares()?;
        let mut kept = 0;
        let mut deleted = false;
        for &number in &spares {
            let path = format!("{}/{}", self.dir, spare_name(number));
            let wiped = self.storage.open_file(&path, OpenMode::Existing).and_then(|file| {
                match file.size_bytes()? {
                    // fallocate refuses an empty range; there is nothing to wipe.
                    0 => Ok(()),
                    size_bytes => {
                        file.zero_range(0, size_bytes)?;
                        file.sync_data()
                    }
                }
            });
            match wiped {
                Ok(()) => kept += 1,
                Err(error) => {
                    if error.kind() != io::ErrorKind::Unsupported {
                        tracing::warn!(%path, %error, "cannot wipe a spare segment file; deleting it instead");
                    }
                    self.storage.remove_file(&path).map_err(self.io_error(path))?;
                    deleted = true;
                }
            }
        }
        if deleted {
            self.storage.sync_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        }
        self.spares_kept.store(kept, Ordering::Relaxed);
        *self.spare_demand.lock() = SpareDemand { segments: kept, at: None };
        Ok(())
    }

    /// The spare segment files, by number.
    fn spares(&self) -> Result<Vec<u32>, JournalError> {
        let names = self.storage.list_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        let mut spares: Vec<u32> = names.iter().filter_map(|name| parse_spare_name(name)).collect();
        spares.sort_unstable();
        Ok(spares)
    }

    /// The LSN the next appended record will get.
    pub fn lsn_next(&self) -> Lsn {
        self.tail.lock().lsn_next
    }

    /// Every record up to and including this LSN is durable.
    pub fn lsn_durable(&self) -> Lsn {
        Lsn(self.lsn_durable.load(Ordering::Acquire))
    }

    /// The durable LSN and where the record after it starts: replaying from
    /// there skips exactly the records up to that LSN.
    pub fn durable_point(&self) -> (Lsn, JournalPosition) {
        *self.durable_point.lock()
    }

    /// Bytes in the segment files (spares included) and in memory.
    pub fn size_bytes(&self) -> Result<u64, JournalError> {
        // Segments listed must not be reclaimed before they are measured.
        let _reclaiming = self.reclaiming.lock();
        let tail = self.tail.lock();
        let in_memory = tail.active.records_len() + tail.sealed.iter().map(|b| b.records_len()).sum::<u64>();
        let (segment_last, unwritten_from) = match tail.sealed.front() {
            Some(batch) => (batch.segment, batch.offset),
            None => (tail.active.segment, tail.active.offset),
        };
        drop(tail);
        let names = self.storage.list_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        let mut total = in_memory;
        for name in &names {
            if let Some(segment) = parse_segment_name(name) {
                if segment < segment_last {
                    total += self.file(segment)?.size_bytes().map_err(self.segment_io_error(segment))?;
                } else if segment == segment_last {
                    total += unwritten_from;
                }
            } else if parse_spare_name(name).is_some() {
                let path = format!("{}/{name}", self.dir);
                match self.storage.open_file(&path, OpenMode::Existing) {
                    // Taken for a segment since the listing (the writer takes
                    // spares without waiting for this): counted next time.
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    opened => total += opened.and_then(|spare| spare.size_bytes()).map_err(self.io_error(path))?,
                }
            }
        }
        Ok(total)
    }

    /// Where the next record will start.
    pub fn position_next(&self) -> JournalPosition {
        let tail = self.tail.lock();
        JournalPosition { segment: tail.active.segment, offset: tail.active.end() }
    }

    /// Bytes appended but not yet written to the segment files.
    pub fn bytes_unwritten(&self) -> u64 {
        let tail = self.tail.lock();
        tail.active.records_len() + tail.sealed.iter().map(|batch| batch.records_len()).sum::<u64>()
    }

    /// Makes every record appended before this call durable, and returns the
    /// durable LSN (which may be higher: group commit).
    pub fn commit(&self) -> Result<Lsn, JournalError> {
        let (target, target_end) = {
            let tail = self.tail.lock();
            // Where the records appended so far end: a record that takes no
            // LSN of its own (a vouch whose write failed on a full disk) may
            // wait behind the last durable one, and everything appended is
            // made durable, as a checkpoint's replay position, the
            // journal's end, must be on disk.
            let end = match (tail.active.records_len() > 0, tail.sealed.back()) {
                (true, _) => pack(tail.active.segment, tail.active.end()),
                (false, Some(batch)) => pack(batch.segment, batch.end()),
                // `written_end` moves before the written batch leaves `sealed`.
                (false, None) => self.written_end.load(Ordering::Acquire),
            };
            (Lsn(tail.lsn_next.0 - 1), end)
        };
        self.write_out_through(target_end)?;
        let syncing = self.lock_syncing();
        self.check_poisoned()?;
        // By position, not by what waits unsynced: a committer whose records
        // the sync before it took returns, rather than syncing (and waiting
        // for) the batches written since.
        if self.durable_end() >= target_end {
            assert!(self.lsn_durable() >= target, "records durable to their end have durable LSNs");
            return Ok(self.lsn_durable());
        }
        self.sync_written(&syncing, self.written.lock()).map_err(|error| self.poison(error))?;
        Ok(self.lsn_durable())
    }

    /// Where the durable records end, packed.
    fn durable_end(&self) -> u64 {
        let (_, position) = *self.durable_point.lock();
        pack(position.segment, position.offset)
    }

    /// Appends and commits a vouch record (see the module documentation) if
    /// every record is durable and some were made so since the last one.
    /// Returns whether it wrote one. Maintenance calls it once the journal
    /// has been quiet for a moment.
    pub fn vouch(&self) -> Result<bool, JournalError> {
        self.check_poisoned()?;
        let lsn = {
            let lsn_durable = self.lsn_durable();
            let lsn_vouched = Lsn(self.lsn_vouched.load(Ordering::Acquire));
            if lsn_durable == Lsn::ZERO || lsn_durable <= lsn_vouched {
                return Ok(false);
            }
            let mut tail = self.tail.lock();
            if Lsn(tail.lsn_next.0 - 1) != lsn_durable || tail.active.records_len() > 0 || !tail.sealed.is_empty() {
                // Records are waiting: their commit will come, and a vouch after it.
                return Ok(false);
            }
            let end = tail.active.end();
            if end + RECORD_HEADER_BYTES as u64 > self.config.segment_bytes_max {
                // The next record starts a segment; it can vouch itself.
                return Ok(false);
            }
            let stamp = RecordStamp {
                block_size: self.block_size,
                lsn: lsn_durable,
                lsn_committed: lsn_durable,
                timestamp: tail.timestamp_last,
                block_first: BlockIndex(0),
                revert: None,
            };
            let capacity = self.config.batch_bytes_max;
            tail.active.append(RECORD_HEADER_BYTES as u64, capacity, |out| append_vouch_record(out, stamp));
            tail.active.lsn_last = tail.active.lsn_last.max(lsn_durable);
            lsn_durable
        };
        self.seal_active();
        self.write_out_sealed()?;
        let syncing = self.lock_syncing();
        self.check_poisoned()?;
        self.sync_written(&syncing, self.written.lock()).map_err(|error| self.poison(error))?;
        self.lsn_vouched.fetch_max(lsn.0, Ordering::AcqRel);
        Ok(true)
    }

    /// The LSN the last vouch record vouches for (0 if none since opening).
    pub fn lsn_vouched(&self) -> Lsn {
        Lsn(self.lsn_vouched.load(Ordering::Acquire))
    }

    /// Writes what was appended to the segment files without waiting for the
    /// disk: the kernel starts writing it back, the memory is freed, and a
    /// later [`Journal::commit`] has less to wait for.
    /// It takes the batches one at a time, so a commit, or a writer
    /// waiting for room ([`Journal::write_out_oldest`]), waits for one.
    pub fn write_out(&self) -> Result<(), JournalError> {
        self.seal_active();
        self.write_out_sealed()
    }

    /// Writes the batches sealed now (not those sealed meanwhile). When it
    /// returns they are all written, by this thread or another.
    fn write_out_sealed(&self) -> Result<(), JournalError> {
        let Some(through) = self.tail.lock().sealed.back().map(|batch| pack(batch.segment, batch.end())) else {
            return Ok(());
        };
        while self.write_one(through)? != WriteStep::Done {}
        Ok(())
    }

    /// Writes batches out until the files hold every byte before `end` (a
    /// packed position). The active batch is sealed only when no sealed one
    /// waits, with whatever was appended by then: committers that came while
    /// the one before them wrote find their records in its batch, and one
    /// write carries them all (sealing each committer's own records cost a
    /// write each, in turn, at NFS's 96% updates). Batches are handed out
    /// one at a time: appends go on meanwhile, and a writer waiting for
    /// room waits for one batch's write, not for a commit of the whole
    /// buffer (which held writers 40–65 ms at 1 GB/s).
    fn write_out_through(&self, end: u64) -> Result<(), JournalError> {
        loop {
            {
                let mut tail = self.tail.lock();
                if tail.sealed.is_empty() && tail.active.records_len() > 0 {
                    self.seal_active_locked(&mut tail);
                }
            }
            if self.write_one(end)? == WriteStep::Done {
                return Ok(());
            }
        }
    }

    /// Writes the oldest batch waiting (without syncing), sealing the
    /// active one if none is sealed, or waits for one that another writer
    /// writes: what a writer that finds too many bytes waiting does before
    /// appending more, so it waits for one batch's write rather than a
    /// commit of them all.
    pub fn write_out_oldest(&self) -> Result<(), JournalError> {
        if self.tail.lock().sealed.is_empty() {
            self.seal_active();
        }
        self.write_one(u64::MAX)?;
        Ok(())
    }

    /// One step towards files that hold every byte before `through` (a
    /// packed position): writes the oldest sealed batch nobody writes, or,
    /// with `BATCHES_IN_FLIGHT_MAX` being written or none left to take,
    /// waits for a write to end. A failed write poisons the journal unless
    /// its error passes (`fail_write`).
    fn write_one(&self, through: u64) -> Result<WriteStep, JournalError> {
        let mut written = self.written.lock();
        self.check_poisoned()?;
        if pack(written.end.segment, written.end.offset) >= through {
            return Ok(WriteStep::Done);
        }
        let next = {
            let tail = self.tail.lock();
            tail.sealed
                .iter()
                .enumerate()
                .find(|(_, batch)| {
                    !written.writing.contains(&batch.position()) && !written.finished.contains(&batch.position())
                })
                .filter(|(_, batch)| pack(batch.segment, batch.offset) < through)
                .map(|(index, batch)| (Arc::clone(batch), index > 0))
        };
        let (batch, behind) = match next {
            Some(next) if written.writing.len() < BATCHES_IN_FLIGHT_MAX && !written.ahead.holds_back(&next.0) => next,
            _ if written.writing.is_empty() => return Ok(WriteStep::Done),
            _ => {
                self.written_moved.wait(&mut written);
                return Ok(WriteStep::Again);
            }
        };
        // Alone, every batch before it is in the file and every later one
        // is handed out after it; a batch handed out again after its write
        // failed may have later ones written already.
        let alone = written.writing.is_empty() && written.finished.is_empty();
        written.writing.push(batch.position());
        let target = self.write_target(&mut written, &batch);
        let zeros = match &target {
            Ok(WriteTarget::Direct { .. }) if alone => {
                written.ahead.plan(&batch, segment_reserved_bytes(self.config.segment_bytes_max))
            }
            _ => None,
        };
        drop(written);
        let result = target.and_then(|target| self.write_batch(&batch, behind, target));
        let result = match (result, &zeros) {
            (Ok(Some(target)), Some(zeros)) => {
                self.write_ahead(batch.segment, &target, zeros.clone()).map(|()| Some(target))
            }
            (result, _) => result,
        };
        let position = batch.position();
        // Its last holder retires it, and so recycles its buffer.
        drop(batch);
        let mut written = self.written.lock();
        written.writing.retain(|&writing| writing != position);
        if let Some(zeros) = zeros {
            written.ahead.done(zeros, matches!(result, Ok(Some(_))));
        }
        let outcome = match result {
            Ok(Some(target)) => {
                if let WriteTarget::Direct { aligned, .. } = target {
                    if written.aligned.capacity() < aligned.capacity() {
                        written.aligned = aligned;
                    }
                }
                written.finished.push(position);
                self.retire_finished(&mut written);
                Ok(WriteStep::Again)
            }
            // Its predecessor's write failed: handed out again, in order.
            Ok(None) => Ok(WriteStep::Again),
            Err(error) => Err(self.fail_write(error)),
        };
        drop(written);
        self.written_moved.notify_all();
        outcome
    }

    /// Where `batch` is written: the segment's file opened for direct I/O
    /// (kept for the next batch) with the aligned buffer, or its ordinary
    /// file where the filesystem refuses direct I/O.
    fn write_target(&self, written: &mut Written, batch: &Batch) -> Result<WriteTarget, JournalError> {
        if self.direct_io.load(Ordering::Acquire) {
            let file = match &written.direct {
                Some(direct) if direct.segment == batch.segment => Some(Arc::clone(&direct.file)),
                _ => self.open_direct(batch.segment)?,
            };
            if let Some(file) = file {
                written.direct = Some(DirectFile { segment: batch.segment, file: Arc::clone(&file) });
                return Ok(WriteTarget::Direct { file, aligned: std::mem::take(&mut written.aligned) });
            }
        }
        Ok(WriteTarget::Buffered(self.file(batch.segment)?))
    }

    /// Writes a sealed batch; `None` if it gave up, its predecessor's write
    /// having failed. A direct write starts at the sector where the batch
    /// before it ends, writing that batch's last bytes there again; while
    /// that batch is still being written (`behind`), the shared sector is
    /// written only once it is, or the older write could land last and
    /// wipe this batch's first bytes with its padding.
    fn write_batch(
        &self,
        batch: &Batch,
        behind: bool,
        target: WriteTarget,
    ) -> Result<Option<WriteTarget>, JournalError> {
        if batch.starts_segment {
            // A segment's name is durable before any of its records
            // reach the file. Were a spare's renaming undone by a crash
            // after them, the spare would hold this segment's records,
            // whose LSNs the journal gives out again after recovery.
            self.storage.sync_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        }
        let io_error = self.segment_io_error(batch.segment);
        let WriteTarget::Direct { file, mut aligned } = target else {
            let WriteTarget::Buffered(file) = &target else { unreachable!("either target") };
            file.write_all_at(batch.records(), batch.offset).map_err(io_error)?;
            return Ok(Some(target));
        };
        let (sectors, sector_offset) = batch.sectors();
        let sectors: &[u8] = if is_direct_aligned(sectors, sector_offset) {
            sectors
        } else {
            let buffer = aligned_slice(&mut aligned, sectors.len());
            buffer.copy_from_slice(sectors);
            buffer
        };
        let shares_first = behind && sector_offset < batch.offset;
        if shares_first {
            if sectors.len() > DIRECT_ALIGN {
                let body = &sectors[DIRECT_ALIGN..];
                file.write_all_at(body, sector_offset + DIRECT_ALIGN as u64)
                    .map_err(self.segment_io_error(batch.segment))?;
            }
            if !self.wait_written_before(batch.position()) {
                return Ok(None);
            }
            file.write_all_at(&sectors[..DIRECT_ALIGN], sector_offset).map_err(io_error)?;
        } else {
            file.write_all_at(sectors, sector_offset).map_err(io_error)?;
        }
        Ok(Some(WriteTarget::Direct { file, aligned }))
    }

    /// Writes `zeros` into `segment`'s new file, past the records of the
    /// batch just written there (see [`WRITE_AHEAD_BYTES`]).
    fn write_ahead(&self, segment: u32, target: &WriteTarget, zeros: Range<u64>) -> Result<(), JournalError> {
        static ZEROS: LazyLock<Vec<u8>> = LazyLock::new(|| vec![0; WRITE_AHEAD_BYTES as usize + DIRECT_ALIGN]);
        let WriteTarget::Direct { file, .. } = target else { unreachable!("planned for direct writes only") };
        let start = ZEROS.as_ptr().align_offset(DIRECT_ALIGN);
        let length = (zeros.end - zeros.start) as usize;
        file.write_all_at(&ZEROS[start..start + length], zeros.start).map_err(self.segment_io_error(segment))
    }

    /// Waits until the files hold every byte before `position`; false if a
    /// batch before it is no longer being written (its write failed) or
    /// the journal is poisoned.
    fn wait_written_before(&self, position: u64) -> bool {
        let mut written = self.written.lock();
        loop {
            if pack(written.end.segment, written.end.offset) >= position {
                return true;
            }
            let abandoned =
                self.tail.lock().sealed.iter().take_while(|batch| batch.position() < position).any(|batch| {
                    !written.writing.contains(&batch.position()) && !written.finished.contains(&batch.position())
                });
            if abandoned || self.is_poisoned() {
                return false;
            }
            self.written_moved.wait(&mut written);
        }
    }

    /// Seals the active batch; returns the LSN of the last record appended.
    fn seal_active(&self) -> Lsn {
        let mut tail = self.tail.lock();
        if tail.active.records_len() > 0 {
            self.seal_active_locked(&mut tail);
        }
        Lsn(tail.lsn_next.0 - 1)
    }

    /// Seals the active batch; the next one follows it in its segment.
    fn seal_active_locked(&self, tail: &mut Tail) {
        let next = tail.active.next(self.spare_buffer(), self.config.batch_bytes_max);
        self.seal_into(tail, next);
    }

    /// Seals the active batch and queues it for writing; `next` takes its place.
    fn seal_into(&self, tail: &mut Tail, next: Batch) {
        let mut sealed = std::mem::replace(&mut tail.active, next);
        sealed.seal();
        tail.sealed.push_back(Arc::new(sealed));
    }

    /// A buffer of a written batch, or a new one.
    fn spare_buffer(&self) -> Vec<u8> {
        self.recent_memory.take_spare()
    }

    /// Moves the files' end over the written batches at the front of
    /// `sealed`, in order: each leaves `sealed` for `recent`.
    fn retire_finished(&self, written: &mut Written) {
        loop {
            let Some(batch) = self.tail.lock().sealed.front().cloned() else {
                return;
            };
            let Some(at) = written.finished.iter().position(|&position| position == batch.position()) else {
                return;
            };
            written.finished.swap_remove(at);
            self.retire(written, batch);
        }
    }

    /// Takes a written batch, the oldest sealed one, into what the files
    /// hold and what `recent` keeps in memory.
    fn retire(&self, written: &mut Written, batch: Arc<Batch>) {
        if written.unsynced.last() != Some(&batch.segment) {
            written.unsynced.push(batch.segment);
        }
        written.lsn = written.lsn.max(batch.lsn_last);
        written.end = JournalPosition { segment: batch.segment, offset: batch.end() };
        self.written_end.store(pack(batch.segment, batch.end()), Ordering::Release);
        // Copied before taking the locks: appends wait for `tail`.
        let kept: Option<Arc<Batch>> = match self.direct_io.load(Ordering::Acquire) {
            true => Some(batch.compacted(&self.recent_memory).map_or_else(|| batch.clone(), Arc::new)),
            false => None,
        };
        let mut tail = self.tail.lock();
        // Still readable from memory: `recent` holds it before `sealed` lets go.
        let mut recent = self.recent.write();
        if let Some(kept) = &kept {
            if recent.batches.is_empty() {
                self.recent_start.store(pack(batch.segment, batch.offset), Ordering::Release);
            }
            self.recent_memory.count(kept);
            recent.push(kept.clone());
        }
        let front = tail.sealed.pop_front().expect("a written batch is still queued");
        assert!(Arc::ptr_eq(&front, &batch), "written batches are retired in order");
        drop(tail);
        self.forget_recent(&mut recent, |_| kept.is_none() || self.recent_memory.over());
        self.forget_large(&mut recent);
        drop(recent);
        // Unshared now unless kept whole in `recent`.
        drop((kept, front));
        self.recent_memory.recycle(batch, self.config.batch_bytes_max);
    }

    /// Keeps written batches in `memory`, shared with other journals,
    /// instead of memory of the journal's own. Before anything is written.
    pub fn sharing_recent_memory(mut self, memory: Arc<RecentMemory>) -> Journal {
        assert!(self.recent.get_mut().batches.is_empty(), "recent memory is shared before the first write");
        self.recent_memory = memory;
        self
    }

    /// Lets the written batches whose records are all at or below `lsn` go
    /// from memory: whoever was to read them soon (the destager) has.
    pub fn forget_written(&self, lsn: Lsn) {
        let mut recent = self.recent.write();
        self.forget_recent(&mut recent, |recent| recent.batches.front().is_some_and(|oldest| oldest.lsn_last <= lsn));
    }

    /// Drops the oldest of the `recent` batches while `forget` says so.
    fn forget_recent(&self, recent: &mut Recent, mut forget: impl FnMut(&Recent) -> bool) {
        while !recent.batches.is_empty() && forget(recent) {
            let oldest = recent.pop_oldest().expect("not empty");
            self.recent_start.store(recent.start(), Ordering::Release);
            self.let_go(oldest);
        }
    }

    /// Drops this journal's oldest batches of large records while those of
    /// all the journals take more than their share (see [`RecentMemory`]).
    fn forget_large(&self, recent: &mut Recent) {
        while self.recent_memory.large_over() {
            let Some((index, batch)) = recent.pop_oldest_large() else { return };
            if index == 0 {
                self.recent_start.store(recent.start(), Ordering::Release);
            }
            self.let_go(batch);
        }
    }

    /// Gives back the memory of `batch`, no longer among the `recent` ones.
    fn let_go(&self, batch: Arc<Batch>) {
        self.recent_memory.uncount(&batch);
        self.recent_memory.recycle(batch, self.config.batch_bytes_max);
    }

    /// Opens `segment` for direct writes; `None` (and buffered writes from
    /// now on) if the filesystem refuses direct I/O.
    fn open_direct(&self, segment: u32) -> Result<Option<Arc<dyn File>>, JournalError> {
        let path = self.path(segment);
        match self.storage.open_direct(&path) {
            Ok(file) => Ok(Some(file)),
            Err(error) if error.kind() == io::ErrorKind::Unsupported => {
                tracing::info!(journal = %self.dir, %error, "the journal writes through the page cache");
                self.direct_io.store(false, Ordering::Release);
                Ok(None)
            }
            Err(error) => Err(self.io_error(path)(error)),
        }
    }

    fn lock_syncing(&self) -> std::sync::MutexGuard<'_, ()> {
        // It guards no data, so a panic while it was held leaves nothing torn.
        self.syncing.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Syncs every segment written since the last sync, as `written` has
    /// them now, and lets `written` go before waiting for the disk: batches
    /// written meanwhile wait in `unsynced` for the next sync. A sync makes
    /// durable every write that completed before it began, so the durable
    /// point is the one taken here. Callers hold `syncing`, which keeps syncs,
    /// and so the durable point, in order.
    fn sync_written(
        &self,
        _syncing: &std::sync::MutexGuard<'_, ()>,
        mut written: parking_lot::MutexGuard<'_, Written>,
    ) -> Result<(), JournalError> {
        let written_last = written.end.segment;
        let commits = &mut written.commits;
        if commits.segment != written_last {
            *commits = SegmentCommits { segment: written_last, current: 0, previous: commits.current };
        }
        commits.current += 1;
        self.segment_commits.store(commits.current.max(commits.previous), Ordering::Relaxed);
        let counted = commits.current.min(u64::from(u32::MAX));
        self.commits_written.store(pack(commits.segment, counted), Ordering::Relaxed);
        let unsynced = std::mem::take(&mut written.unsynced);
        let point = (written.lsn, written.end);
        drop(written);
        for segment in unsynced {
            self.file(segment)?.sync_data().map_err(self.segment_io_error(segment))?;
        }
        self.lsn_durable.fetch_max(point.0 .0, Ordering::AcqRel);
        let mut durable_point = self.durable_point.lock();
        assert!(durable_point.0 <= point.0, "syncs are made durable in order");
        *durable_point = point;
        Ok(())
    }

    /// Reads journal bytes (a block of a version) wherever they are: in the
    /// segment files or still in memory.
    pub fn read(&self, segment: u32, offset: u64, buf: &mut [u8]) -> Result<(), JournalError> {
        if segment < self.segment_first.load(Ordering::Acquire) {
            return Err(JournalError::Reclaimed { segment });
        }
        let end = offset + buf.len() as u64;
        if pack(segment, end) > self.written_end.load(Ordering::Acquire) {
            let tail = self.tail.lock();
            let in_memory = std::iter::once(&tail.active).chain(tail.sealed.iter().map(|batch| &**batch));
            for batch in in_memory {
                if batch.copy_out(segment, offset, buf) {
                    return Ok(());
                }
            }
            // Written out since we looked: in `recent`, or in the file.
        }
        if pack(segment, offset) >= self.recent_start.load(Ordering::Acquire) {
            let recent = self.recent.read();
            if recent.copy_out(segment, offset, buf) {
                return Ok(());
            }
        }
        let file = match self.file(segment) {
            Err(JournalError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound && segment < self.segment_first.load(Ordering::Acquire) =>
            {
                return Err(JournalError::Reclaimed { segment });
            }
            other => other?,
        };
        file.read_exact_at(buf, offset).map_err(self.segment_io_error(segment))?;
        // Reclaimed while it was read, its file may already hold a later
        // segment's bytes (spare segment files are reused).
        if segment < self.segment_first.load(Ordering::Acquire) {
            return Err(JournalError::Reclaimed { segment });
        }
        Ok(())
    }

    /// Whether the block at `offset` of `segment` is still in memory (not
    /// yet written out, or kept since: see [`RecentMemory`]): a read of it
    /// is a copy, not a disk read. It may leave memory right after.
    pub fn holds_in_memory(&self, segment: u32, offset: u64) -> bool {
        let at = pack(segment, offset);
        if at >= self.written_end.load(Ordering::Acquire) {
            return true;
        }
        // Kept batches need not be neighbours: look.
        at >= self.recent_start.load(Ordering::Acquire)
            && self
                .recent
                .read()
                .batch_at(segment, offset)
                .is_some_and(|batch| batch.start_of(segment, offset, 1).is_some())
    }

    /// The `len` bytes at `offset` of `segment`: borrowed from the batch
    /// that holds them where the journal keeps it in memory (sealed, or
    /// written and kept), otherwise read into `buffer` — with direct I/O
    /// where the journal writes so and no one batch in memory holds them (the
    /// sectors around them, straight from the device into an aligned part
    /// of `buffer`), and otherwise as [`Journal::read`] does. For the
    /// destager's and the archiver's reads of a megabyte at a time: through
    /// the page cache, half the destager's CPU went to the kernel copying
    /// pages it had read ahead (BENCHMARKS.md).
    pub fn read_span<'a>(
        &self,
        segment: u32,
        offset: u64,
        len: usize,
        buffer: &'a mut Vec<u8>,
    ) -> Result<SpanBytes<'a>, JournalError> {
        if let Some(span) = self.span_in_memory(segment, offset, len) {
            return Ok(SpanBytes::Memory(span));
        }
        // Written out, and no one kept batch holds it all.
        let end = offset + len as u64;
        let in_file = pack(segment, end) <= self.written_end.load(Ordering::Acquire);
        if in_file && self.direct_io.load(Ordering::Acquire) {
            let align = DIRECT_ALIGN as u64;
            let first = offset / align * align;
            let sectors = aligned_slice(buffer, (end.div_ceil(align) * align - first) as usize);
            if self.read_sectors(segment, first, sectors)? {
                let from = (offset - first) as usize;
                let start = sectors.as_ptr() as usize - buffer.as_ptr() as usize + from;
                return Ok(SpanBytes::Buffer(&buffer[start..start + len]));
            }
        }
        // The active batch's bytes among them (it is not shared), or its
        // batch written out and let go since we looked.
        buffer.resize(buffer.len().max(len), 0);
        self.read(segment, offset, &mut buffer[..len])?;
        Ok(SpanBytes::Buffer(&buffer[..len]))
    }

    /// The `len` bytes at `offset` of `segment`, if a sealed batch or one
    /// written and kept holds them (not the active batch: it is not shared).
    pub fn span_in_memory(&self, segment: u32, offset: u64, len: usize) -> Option<MemorySpan> {
        let held = |batch: &Arc<Batch>| {
            let start = batch.start_of(segment, offset, len)?;
            Some(MemorySpan {
                batch: Some(batch.clone()),
                start,
                len,
                memory: self.recent_memory.clone(),
                batch_bytes_max: self.config.batch_bytes_max,
            })
        };
        if pack(segment, offset + len as u64) > self.written_end.load(Ordering::Acquire) {
            if let Some(found) = self.tail.lock().sealed.iter().find_map(held) {
                return Some(found);
            }
        }
        if pack(segment, offset) >= self.recent_start.load(Ordering::Acquire) {
            return self.recent.read().batch_at(segment, offset).and_then(held);
        }
        None
    }

    /// Reads whole sectors of `segment` with direct I/O; `false` where the
    /// filesystem refuses it, or the last sector is past the file's end (a
    /// segment cut at a torn tail ends mid-sector): read them buffered.
    fn read_sectors(&self, segment: u32, offset: u64, sectors: &mut [u8]) -> Result<bool, JournalError> {
        if segment < self.segment_first.load(Ordering::Acquire) {
            return Err(JournalError::Reclaimed { segment });
        }
        let path = self.path(segment);
        let file = match self.storage.open_direct(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::Unsupported => return Ok(false),
            Err(error)
                if error.kind() == io::ErrorKind::NotFound && segment < self.segment_first.load(Ordering::Acquire) =>
            {
                return Err(JournalError::Reclaimed { segment });
            }
            Err(error) => return Err(self.io_error(path)(error)),
        };
        match file.read_exact_at(sectors, offset) {
            Ok(()) => {}
            // Past the end, the last read is short and the one after it
            // misaligned (EINVAL) or empty.
            Err(error) if matches!(error.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidInput) => {
                return Ok(false)
            }
            Err(error) => return Err(self.io_error(path)(error)),
        }
        // Reclaimed while it was read, its file may already hold a later
        // segment's bytes (spare segment files are reused).
        if segment < self.segment_first.load(Ordering::Acquire) {
            return Err(JournalError::Reclaimed { segment });
        }
        Ok(true)
    }

    /// Bytes of the segments whose records are all older than
    /// `archived_before`: what [`Journal::reclaim`] can delete once recovery
    /// starts after them.
    pub fn reclaimable_bytes(&self, archived_before: Timestamp) -> Result<u64, JournalError> {
        let _reclaiming = self.reclaiming.lock();
        let current = self.position_next().segment;
        let mut bytes = 0;
        for segment in self.segment_first.load(Ordering::Acquire)..current {
            if self.segment_timestamp_before(segment + 1)? >= archived_before {
                break;
            }
            bytes += self.file(segment)?.size_bytes().map_err(self.segment_io_error(segment))?;
        }
        Ok(bytes)
    }

    /// The bytes of a segment after a torn tail that recovery deletes: all of
    /// a new file's; of a recycled one, those of a torn first record; none of
    /// a spare renamed for a segment that was never started (its header is
    /// still the old segment's, or the zeros of a spare written ahead).
    fn started_segment_bytes(&self, segment: u32) -> Result<u64, JournalError> {
        let path = self.path(segment);
        let file = self.file(segment)?;
        let size_bytes = file.size_bytes().map_err(self.io_error(path))?;
        let mut bytes = [0; SEGMENT_HEADER_BYTES];
        let read = file.read_exact_at(&mut bytes, 0);
        if read.is_ok() && bytes.iter().all(|&byte| byte == 0) {
            return Ok(0);
        }
        let header = read.ok().and_then(|()| SegmentHeader::decode(&bytes).ok());
        Ok(match header {
            Some(header) if header.segment != segment => 0,
            Some(header) if header.bytes_follow_records() => {
                SEGMENT_HEADER_BYTES as u64
                    + torn_record_bytes(&*file, SEGMENT_HEADER_BYTES as u64, size_bytes, header.lsn_first)
            }
            _ => size_bytes,
        })
    }

    /// The path of segment `segment`'s file, for the chunk store to adopt as
    /// a pack (history archived where it already lies, not copied), if
    /// nothing will change it again: a later segment has started and has a
    /// durable record, so every record of this one is durable and no crash
    /// makes it the last segment, whose tail recovery cuts and the journal
    /// writes on. Once adopted the file has a second name, and
    /// [`Journal::reclaim`] only deletes the journal's: it never keeps it
    /// as a spare, whose next segment would write over the pack.
    pub fn sealed_segment(&self, segment: u32) -> Result<Option<String>, JournalError> {
        let _reclaiming = self.reclaiming.lock();
        if segment < self.segment_first.load(Ordering::Acquire) || segment + 1 > self.position_next().segment {
            return Ok(None);
        }
        let sealed = self.segment_header(segment + 1)?.lsn_first <= self.lsn_durable();
        Ok(sealed.then(|| self.path(segment)))
    }

    /// The oldest segment not reclaimed.
    pub fn segment_first(&self) -> u32 {
        self.segment_first.load(Ordering::Acquire)
    }

    /// The time of the last record before `segment` (from its header).
    fn segment_timestamp_before(&self, segment: u32) -> Result<Timestamp, JournalError> {
        Ok(self.segment_header(segment)?.timestamp_before)
    }

    fn segment_header(&self, segment: u32) -> Result<SegmentHeader, JournalError> {
        let mut header = [0; SEGMENT_HEADER_BYTES];
        // The newest segment's header may still be in memory.
        self.read(segment, 0, &mut header)?;
        SegmentHeader::decode(&header).map_err(|error| JournalError::Corrupt {
            path: self.path(segment),
            offset: 0,
            reason: error.to_string(),
        })
    }

    /// Reclaims the oldest segments that no one needs any more: those before
    /// segment `before` (where recovery starts) whose every record is older
    /// than `archived_before` (the version index refers to none of them).
    /// Each is kept as a spare segment file while fewer are kept than the
    /// journal lately started segments between two reclaims (`spares_wanted`,
    /// as of `now`), else deleted, and spares beyond that are deleted too —
    /// but one the chunk store adopted ([`Journal::sealed_segment`]) only
    /// loses the journal's name, its bytes now the store's. Returns the
    /// bytes reclaimed.
    pub fn reclaim(&self, before: u32, archived_before: Timestamp, now: Timestamp) -> Result<u64, JournalError> {
        // Several threads reclaim (after checkpoints, after archive passes).
        let _reclaiming = self.reclaiming.lock();
        let mut freed = 0;
        let mut wanted = None;
        let mut owed = 0;
        loop {
            let segment = self.segment_first.load(Ordering::Acquire);
            // The next segment's header tells the time of this one's last record.
            if segment + 1 > before.min(self.position_next().segment)
                || self.segment_timestamp_before(segment + 1)? >= archived_before
            {
                if let Some(wanted) = wanted {
                    self.trim_spares(wanted)?;
                    // Never more than the demand has room for: it may have fallen.
                    let room = wanted.saturating_sub(self.spares_kept.load(Ordering::Relaxed));
                    let owed_before = self.spares_owed.load(Ordering::Relaxed);
                    self.spares_owed.store((owed_before + owed).min(room), Ordering::Relaxed);
                }
                return Ok(freed);
            }
            let wanted = *wanted.get_or_insert_with(|| self.spares_wanted(now));
            let path = self.path(segment);
            let size_bytes = self.file(segment)?.size_bytes().map_err(self.segment_io_error(segment))?;
            // A file the chunk store adopted holds history: it is never reused.
            let adopted = self.storage.link_count(&path).map_err(self.io_error(path.clone()))? > 1;
            if !adopted {
                freed += size_bytes;
            }
            // Readers that looked a version up in this segment now get `Reclaimed`.
            self.segment_first.store(segment + 1, Ordering::Release);
            self.files.lock().remove(&segment);
            let spares = self.spares()?;
            // Owed only where spares can be written ahead (direct I/O: a
            // filesystem without it has no unwritten extents to convert).
            if adopted
                && self.config.spares_for_adopted
                && self.direct_io.load(Ordering::Acquire)
                && spares.len() + owed < wanted
            {
                owed += 1;
            }
            if spares.len() < wanted && !adopted {
                let spare_path = format!("{}/{}", self.dir, spare_name(free_spare_number(&spares)));
                self.storage.rename(&path, &spare_path).map_err(self.io_error(path))?;
                self.spares_kept.store(spares.len() + 1, Ordering::Relaxed);
            } else {
                self.storage.remove_file(&path).map_err(self.io_error(path))?;
            }
            self.storage.sync_dir(&self.dir).map_err(self.io_error(self.dir.clone()))?;
        }
    }
}

/// A record handed out during recovery.
pub struct ReplayRecord<'a> {
    pub header: RecordHeader,
    pub segment: u32,
    /// Offset of the record within its segment.
    pub offset: u64,
    crc_area: &'a [u8],
    /// The record's blocks (empty for zero records).
    pub data: &'a [u8],
}

impl ReplayRecord<'_> {
    pub fn block_crc(&self, index: u32) -> u32 {
        block_crc(&self.header, self.crc_area, index)
    }

    /// The versions of a copy record.
    pub fn copies(&self) -> Result<Vec<Version>, JournalError> {
        debug_assert_eq!(self.header.kind, RecordKind::Copy);
        copy_entries(self.crc_area).map_err(|error| JournalError::Corrupt {
            path: format!("segment {}", self.segment),
            offset: self.offset,
            reason: error.to_string(),
        })
    }

    /// The extents of a compound record.
    pub fn extents(&self) -> Result<Vec<CompoundExtent>, JournalError> {
        compound_extents(&self.header, self.crc_area).map_err(|error| JournalError::Corrupt {
            path: format!("segment {}", self.segment),
            offset: self.offset,
            reason: error.to_string(),
        })
    }

    /// Offset of the record's first block of data within the segment.
    pub fn data_offset(&self) -> u32 {
        u32::try_from(self.offset + self.header.data_offset() as u64).expect("segments are below 4 GiB")
    }
}

/// What recovery found, for logs, `rewind volume info` and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub records_replayed: u64,
    /// Bytes of a torn (never acknowledged) tail that were cut off.
    pub truncated_bytes: u64,
    /// What was cut off, if anything.
    pub dropped: Option<DroppedTail>,
    /// Damaged records a repair replaced (see [`Recovery::repairing`]).
    pub lost: Vec<LostSpan>,
}

/// Acknowledged records a repair found damaged and replaced by a lost
/// record: their writes are gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostSpan {
    pub path: String,
    pub offset: u64,
    pub bytes: u64,
    pub lsn_first: Lsn,
    /// How many LSNs (records) were lost (0: only a vouch record).
    pub lsn_count: u64,
    /// Times of the intact records around them.
    pub after: Timestamp,
    pub before: Timestamp,
    /// What was wrong.
    pub reason: String,
}

/// A tail recovery cut off: nothing after the last intact record vouched
/// for it, so it was taken for a write torn by the crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedTail {
    /// The LSN the first record cut off would have had.
    pub lsn_first: Lsn,
    pub bytes: u64,
    /// Time of the last record kept.
    pub after: Timestamp,
    /// Why the record there was not intact.
    pub reason: String,
    /// Whether that record was there whole but failed its checksum (a torn
    /// write, or damage nothing could vouch against) rather than cut short.
    pub whole: bool,
}

/// Replays a journal after a restart; see [`Journal::recover`].
pub struct Recovery {
    journal: Journal,
    /// Time of the last record replayed (or before the first).
    timestamp_last: Timestamp,
    segment: u32,
    offset: u64,
    lsn_expected: Lsn,
    buffer: Vec<u8>,
    records_replayed: u64,
    truncated_bytes: u64,
    dropped: Option<DroppedTail>,
    /// Replace vouched damage by lost records instead of failing.
    repair: bool,
    lost: Vec<LostSpan>,
    file: Option<(Arc<dyn File>, u64)>,
    /// The open segment's header: whether its size tells where its records
    /// end, and whether its file is a new one or a spare.
    header: Option<SegmentHeader>,
}

/// Why a record could not be read; decides nothing by itself.
struct Damage {
    reason: String,
    /// The record was cut short by the end of its segment (a torn write
    /// beyond doubt), as opposed to present and failing its checks.
    cut_short: bool,
}

impl Damage {
    fn whole(reason: impl Into<String>) -> Damage {
        Damage { reason: reason.into(), cut_short: false }
    }

    fn cut_short(reason: &str) -> Damage {
        Damage { reason: reason.to_owned(), cut_short: true }
    }
}

impl From<FormatError> for Damage {
    fn from(error: FormatError) -> Self {
        Damage::whole(error.to_string())
    }
}

impl Recovery {
    fn open_segment(&mut self, segment: u32, lsn_first: Option<Lsn>) -> Result<(), JournalError> {
        let journal = &self.journal;
        let path = journal.path(segment);
        let file = journal.file(segment)?;
        let size_bytes = file.size_bytes().map_err(journal.io_error(path.clone()))?;
        let corrupt = |reason: String| JournalError::Corrupt { path: path.clone(), offset: 0, reason };
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut header, 0).map_err(|error| corrupt(format!("segment header: {error}")))?;
        let header = SegmentHeader::decode(&header).map_err(|error| corrupt(error.to_string()))?;
        if header.segment != segment || header.block_size != journal.block_size {
            return Err(corrupt(format!(
                "segment header says segment {} with {}-byte blocks",
                header.segment,
                header.block_size.bytes()
            )));
        }
        if let Some(lsn_first) = lsn_first {
            if header.lsn_first != lsn_first {
                return Err(corrupt(format!("segment starts at LSN {} instead of {lsn_first}", header.lsn_first)));
            }
        }
        // What survived the crash of the segment left behind may sit in
        // the page cache only, as the last one's may (see `finish`).
        if let Some((left, _)) = &self.file {
            left.sync_data().map_err(journal.segment_io_error(self.segment))?;
        }
        self.file = Some((file, size_bytes));
        self.header = Some(header);
        Ok(())
    }

    /// Whether the open segment's records end at the current offset because
    /// the next segment starts with the LSN expected here; if so, recovery
    /// moves on to it. A record never spans two segments, so the bytes left
    /// in this one hold no record of this journal: in a recycled segment,
    /// those of the segment its file held before.
    fn next_segment_follows(&mut self) -> Result<bool, JournalError> {
        let next = self.segment + 1;
        if !self.segments_after(self.segment)?.contains(&next) {
            return Ok(false);
        }
        match self.open_segment(next, Some(self.lsn_expected)) {
            Ok(()) => {
                self.segment = next;
                self.offset = SEGMENT_HEADER_BYTES as u64;
                Ok(true)
            }
            // Not started, or damaged: the damage here decides.
            Err(JournalError::Corrupt { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Makes this recovery a repair: damage to acknowledged records, which
    /// is otherwise an error, is replaced by lost records (and a damaged
    /// segment header rewritten) so that the intact records after it are
    /// kept; [`RecoveryReport::lost`] lists what was lost.
    pub fn repairing(mut self) -> Recovery {
        self.repair = true;
        self
    }

    fn segments_after(&self, segment: u32) -> Result<Vec<u32>, JournalError> {
        let journal = &self.journal;
        let names = journal.storage.list_dir(&journal.dir).map_err(journal.io_error(journal.dir.clone()))?;
        Ok(names.iter().filter_map(|name| parse_segment_name(name)).filter(|&other| other > segment).collect())
    }

    /// The next record, or `None` at the end of the journal (after cutting off
    /// a torn tail, if any).
    pub fn next_record(&mut self) -> Result<Option<ReplayRecord<'_>>, JournalError> {
        loop {
            let (file, size_bytes) = self.file.clone().expect("a segment is open");
            if self.offset >= size_bytes || is_padding(&*file, self.offset, size_bytes) {
                let later = self.segments_after(self.segment)?;
                let Some(&next) = later.first() else {
                    // The records end here (before any padding).
                    self.file = Some((file, self.offset));
                    return Ok(None);
                };
                if next != self.segment + 1 {
                    return Err(JournalError::Corrupt {
                        path: self.journal.path(self.segment + 1),
                        offset: 0,
                        reason: format!("segment missing (the next one present is {next})"),
                    });
                }
                if let Err(error) = self.open_segment(next, Some(self.lsn_expected)) {
                    let JournalError::Corrupt { reason, .. } = error else { return Err(error) };
                    // A segment started by a batch that never became durable.
                    let path = self.journal.path(next);
                    let size_bytes = self.journal.file(next)?.size_bytes().map_err(self.journal.io_error(path))?;
                    let damage = match size_bytes < SEGMENT_HEADER_BYTES as u64 {
                        true => Damage::cut_short(&reason),
                        false => Damage::whole(reason),
                    };
                    match self.resolve_damage(next, SEGMENT_HEADER_BYTES as u64, damage)? {
                        Resolved::Repaired => continue,
                        Resolved::Truncated => return Ok(None),
                    }
                }
                self.segment = next;
                self.offset = SEGMENT_HEADER_BYTES as u64;
                continue;
            }
            match self.read_record(&*file, size_bytes) {
                Ok(header) if header.kind == RecordKind::Vouch => {
                    self.offset += header.record_bytes();
                    self.journal.lsn_vouched.fetch_max(header.lsn.0, Ordering::AcqRel);
                }
                Ok(header) if header.kind == RecordKind::Lost => {
                    self.offset += header.record_bytes();
                    self.lsn_expected = Lsn(header.lsn.0 + u64::from(header.block_count));
                }
                Ok(header) => {
                    let record_offset = self.offset;
                    self.offset += header.record_bytes();
                    self.lsn_expected = header.lsn.next();
                    self.timestamp_last = header.timestamp;
                    self.records_replayed += 1;
                    let data_offset = header.data_offset();
                    return Ok(Some(ReplayRecord {
                        header,
                        segment: self.segment,
                        offset: record_offset,
                        crc_area: &self.buffer[RECORD_HEADER_BYTES..data_offset],
                        data: &self.buffer[data_offset..],
                    }));
                }
                Err(_) if self.next_segment_follows()? => continue,
                Err(damage) => match self.resolve_damage(self.segment, self.offset + 8, damage)? {
                    Resolved::Repaired => continue,
                    Resolved::Truncated => return Ok(None),
                },
            }
        }
    }

    /// Reads and fully verifies the record at the current offset into `buffer`.
    fn read_record(&mut self, file: &dyn File, size_bytes: u64) -> Result<RecordHeader, Damage> {
        let header = read_verified_record(file, size_bytes, self.offset, &mut self.buffer)?;
        // A vouch record carries the LSN of the record before it.
        let lsn_expected = match header.kind {
            RecordKind::Vouch => Lsn(self.lsn_expected.0 - 1),
            _ => self.lsn_expected,
        };
        if header.lsn != lsn_expected {
            return Err(Damage::whole(format!("record has LSN {} where {lsn_expected} was expected", header.lsn)));
        }
        if header.block_size != self.journal.block_size {
            return Err(Damage::whole(format!("record has {}-byte blocks", header.block_size.bytes())));
        }
        Ok(header)
    }

    /// The record expected at the current offset is damaged or missing (the
    /// damage was seen in `damaged_segment`, intact records can only follow
    /// from `search_from` on): corruption if any intact record after it says it
    /// was durable, otherwise a torn tail to cut off.
    fn resolve_damage(
        &mut self,
        damaged_segment: u32,
        search_from: u64,
        damage: Damage,
    ) -> Result<Resolved, JournalError> {
        let reason = damage.reason;
        let mut later = vec![damaged_segment];
        later.extend(self.segments_after(damaged_segment)?);
        for &segment in &later {
            let file = self.journal.file(segment)?;
            let path = self.journal.path(segment);
            let size_bytes = file.size_bytes().map_err(self.journal.io_error(path.clone()))?;
            let start = if segment == damaged_segment { search_from } else { SEGMENT_HEADER_BYTES as u64 };
            if let Some(voucher) = find_voucher(&*file, size_bytes, start, self.lsn_expected) {
                if self.repair {
                    self.replace_damage(damaged_segment, reason)?;
                    return Ok(Resolved::Repaired);
                }
                return Err(JournalError::Corrupt {
                    path: self.journal.path(self.segment),
                    offset: self.offset,
                    reason: format!(
                        "{reason}; an intact later record (in {path} at byte {voucher}) shows that LSN {} \
                         had already been made durable, so this is not a torn write",
                        self.lsn_expected
                    ),
                });
            }
        }
        // A torn tail: nothing after this point was ever acknowledged.
        let journal = &self.journal;
        let (file, size_bytes) = self.file.clone().expect("a segment is open");
        let mut dropped_bytes = match self.header.expect("a segment is open").bytes_follow_records() {
            false => size_bytes - self.offset,
            true => torn_record_bytes(&*file, self.offset, size_bytes, self.lsn_expected),
        };
        for segment in self.segments_after(self.segment)? {
            dropped_bytes += journal.started_segment_bytes(segment)?;
        }
        self.truncated_bytes += dropped_bytes;
        // (A segment a crash left empty drops nothing.)
        self.dropped = (dropped_bytes > 0).then_some(DroppedTail {
            lsn_first: self.lsn_expected,
            bytes: dropped_bytes,
            after: self.timestamp_last,
            reason,
            whole: !damage.cut_short,
        });
        let path = journal.path(self.segment);
        file.set_len(self.offset).map_err(journal.io_error(path.clone()))?;
        file.sync_data().map_err(journal.io_error(path.clone()))?;
        // The cut gave back the space the rest of the segment had reserved.
        // Reserved again if there is room; if not (a full disk), the
        // records' writes fail for want of it, an error that passes.
        if let Err(error) = file.allocate(0, segment_reserved_bytes(journal.config.segment_bytes_max)) {
            tracing::warn!(%path, %error, "the journal segment's space could not be reserved again after recovery");
        }
        for segment in self.segments_after(self.segment)? {
            let path = journal.path(segment);
            journal.files.lock().remove(&segment);
            journal.storage.remove_file(&path).map_err(journal.io_error(path))?;
        }
        journal.storage.sync_dir(&journal.dir).map_err(journal.io_error(journal.dir.clone()))?;
        self.file = Some((file, self.offset));
        Ok(Resolved::Truncated)
    }

    /// Repair: the damage at the current position (a record of the open
    /// segment, or the header of `damaged_segment` after it) was
    /// acknowledged. A damaged segment header is written again (everything
    /// in it is known); damaged records are replaced, up to the next intact
    /// record, by one lost record taking their LSNs.
    fn replace_damage(&mut self, damaged_segment: u32, reason: String) -> Result<(), JournalError> {
        let journal = &self.journal;
        if damaged_segment != self.segment {
            let path = journal.path(damaged_segment);
            let header = SegmentHeader {
                segment: damaged_segment,
                block_size: journal.block_size,
                lsn_first: self.lsn_expected,
                timestamp_before: self.timestamp_last,
                // Whether the file held an earlier segment is not known: say
                // it may have, so its size is not taken for its records' end.
                recycled: true,
                written_ahead: false,
            };
            let file = journal.file(damaged_segment)?;
            file.write_all_at(&header.encode(), 0).map_err(journal.io_error(path.clone()))?;
            file.sync_data().map_err(journal.io_error(path.clone()))?;
            return Ok(());
        }
        let (file, size_bytes) = self.file.clone().expect("a segment is open");
        let path = journal.path(self.segment);
        // The next intact record in this segment, or its end (the next
        // segment's header then says which LSN comes next).
        let (end, lsn_next, before) = match next_intact(&*file, size_bytes, self.offset + 8, self.lsn_expected) {
            Some((offset, header)) => {
                let lsn_next = match header.kind {
                    // A vouch record carries the LSN of the record before it.
                    RecordKind::Vouch => header.lsn.next(),
                    _ => header.lsn,
                };
                (offset, lsn_next, header.timestamp)
            }
            None => {
                let next =
                    self.segments_after(self.segment)?.first().copied().ok_or_else(|| JournalError::Corrupt {
                        path: path.clone(),
                        offset: self.offset,
                        reason: format!("{reason}; nothing intact follows it to repair from"),
                    })?;
                let mut header = [0u8; SEGMENT_HEADER_BYTES];
                journal.file(next)?.read_exact_at(&mut header, 0).map_err(journal.io_error(journal.path(next)))?;
                let header = SegmentHeader::decode(&header).map_err(|error| JournalError::Corrupt {
                    path: journal.path(next),
                    offset: 0,
                    reason: error.to_string(),
                })?;
                (size_bytes, header.lsn_first, header.timestamp_before)
            }
        };
        let lsn_count = lsn_next.0.saturating_sub(self.lsn_expected.0);
        let stamp = RecordStamp {
            block_size: journal.block_size,
            lsn: self.lsn_expected,
            lsn_committed: Lsn(self.lsn_expected.0.saturating_sub(1)),
            timestamp: self.timestamp_last,
            block_first: BlockIndex(0),
            revert: None,
        };
        let count = u32::try_from(lsn_count).map_err(|_| JournalError::Corrupt {
            path: path.clone(),
            offset: self.offset,
            reason: format!("{reason}; {lsn_count} records would be lost at once"),
        })?;
        // A lost record spans whole records; a segment whose damaged tail is
        // not a whole number of 8-byte units (or is shorter than a record
        // header) cannot be mended that way (found by the `journal_record`
        // fuzz target: the assertion in `encode_lost_record` failed).
        let span_bytes = end - self.offset;
        if span_bytes < RECORD_HEADER_BYTES as u64 || !span_bytes.is_multiple_of(8) {
            return Err(JournalError::Corrupt {
                path,
                offset: self.offset,
                reason: format!("{reason}; the {span_bytes} damaged bytes cannot be replaced by a lost record"),
            });
        }
        let filler = encode_lost_record(stamp, count, span_bytes);
        file.write_all_at(&filler, self.offset).map_err(journal.io_error(path.clone()))?;
        file.sync_data().map_err(journal.io_error(path.clone()))?;
        self.lost.push(LostSpan {
            path,
            offset: self.offset,
            bytes: end - self.offset,
            lsn_first: self.lsn_expected,
            lsn_count,
            after: self.timestamp_last,
            before,
            reason,
        });
        Ok(())
    }

    /// Ends recovery; call once `next_record` has returned `None`.
    pub fn finish(self) -> Result<(Journal, RecoveryReport), JournalError> {
        let (file, size_bytes) = self.file.expect("a segment is open");
        assert_eq!(size_bytes, self.offset, "finish() before next_record() returned None");
        // What survived the crash may sit in the page cache only: make it
        // durable before anything is built on it.
        file.sync_data().map_err(self.journal.segment_io_error(self.segment))?;
        let prefix = read_prefix(&*file, self.offset).map_err(self.journal.segment_io_error(self.segment))?;
        let journal = Journal::assemble(
            Arc::clone(&self.journal.storage),
            &self.journal.dir,
            self.journal.block_size,
            self.journal.config,
            JournalPosition { segment: self.segment, offset: self.offset },
            &prefix,
            self.lsn_expected,
            self.timestamp_last,
            self.journal.segment_first.load(Ordering::Acquire),
        );
        journal.files.lock().insert(self.segment, file);
        let header = self.header.expect("a segment is open");
        {
            let mut tail = journal.tail.lock();
            tail.recycled = header.recycled && !header.written_ahead;
            tail.active.write_ahead = header.written_ahead;
        }
        journal.wipe_spares()?;
        let report = RecoveryReport {
            records_replayed: self.records_replayed,
            truncated_bytes: self.truncated_bytes,
            dropped: self.dropped,
            lost: self.lost,
        };
        Ok((journal, report))
    }
}

/// The space a segment file reserves: its records' bytes up to the end of
/// the last sector a direct write of them writes.
fn segment_reserved_bytes(segment_bytes_max: u64) -> u64 {
    segment_bytes_max.next_multiple_of(DIRECT_ALIGN as u64)
}

/// The bytes of `file` from the start of `offset`'s sector to `offset`:
/// what the direct write of the records from `offset` on writes again.
fn read_prefix(file: &dyn File, offset: u64) -> io::Result<Vec<u8>> {
    let len = offset % DIRECT_ALIGN as u64;
    let mut prefix = vec![0; len as usize];
    file.read_exact_at(&mut prefix, offset - len)?;
    Ok(prefix)
}

/// Whether `offset..size_bytes` of a segment is the zero padding a direct
/// write puts after the last record, up to the next `DIRECT_ALIGN`
/// boundary: the end of the segment's records, not a torn one.
fn is_padding(file: &dyn File, offset: u64, size_bytes: u64) -> bool {
    if offset.is_multiple_of(DIRECT_ALIGN as u64) || size_bytes != offset.next_multiple_of(DIRECT_ALIGN as u64) {
        return false;
    }
    let mut padding = vec![0; (size_bytes - offset) as usize];
    file.read_exact_at(&mut padding, offset).is_ok() && padding.iter().all(|&byte| byte == 0)
}

/// Reads the record at `offset` into `buffer` and verifies its header
/// checksum and every block's CRC.
fn read_verified_record(
    file: &dyn File,
    size_bytes: u64,
    offset: u64,
    buffer: &mut Vec<u8>,
) -> Result<RecordHeader, Damage> {
    if offset + RECORD_HEADER_BYTES as u64 > size_bytes {
        return Err(Damage::cut_short("partial record header at the end of the segment"));
    }
    buffer.resize(RECORD_HEADER_BYTES, 0);
    file.read_exact_at(buffer, offset).map_err(|error| Damage::whole(error.to_string()))?;
    let header = RecordHeader::decode(buffer)?;
    if offset + header.record_bytes() > size_bytes {
        return Err(Damage::cut_short("record extends past the end of the segment"));
    }
    buffer.resize(header.record_bytes() as usize, 0);
    file.read_exact_at(&mut buffer[RECORD_HEADER_BYTES..], offset + RECORD_HEADER_BYTES as u64)
        .map_err(|error| Damage::whole(error.to_string()))?;
    let data_offset = header.data_offset();
    let (head, data) = buffer.split_at(data_offset);
    let crc_area = &head[RECORD_HEADER_BYTES..];
    RecordHeader::verify(&head[..RECORD_HEADER_BYTES], crc_area)?;
    if matches!(header.kind, RecordKind::Write | RecordKind::Compound) {
        let block_bytes = header.block_size.bytes() as usize;
        for (index, block) in data.chunks_exact(block_bytes).enumerate() {
            let computed = rewind_format::crc32c(block);
            rewind_format::verify_crc("journal block", block_crc(&header, crc_area, index as u32), computed)?;
        }
    }
    Ok(header)
}

/// The bytes of the record at `offset` if it has the header of a record
/// with LSN `lsn` or later, whatever its checksum: a torn write of this
/// segment's next batch. Past the records of a recycled segment, bytes
/// without such a header are taken for what its file held before.
fn torn_record_bytes(file: &dyn File, offset: u64, size_bytes: u64, lsn: Lsn) -> u64 {
    let mut header = [0; RECORD_HEADER_BYTES];
    if offset + RECORD_HEADER_BYTES as u64 > size_bytes || file.read_exact_at(&mut header, offset).is_err() {
        return 0;
    }
    match RecordHeader::decode(&header) {
        // (A vouch record carries the LSN of the record before it.)
        Ok(header) if header.lsn.0 + 1 >= lsn.0 => header.record_bytes().min(size_bytes - offset),
        _ => 0,
    }
}

/// How damage was resolved.
enum Resolved {
    /// A torn tail, cut off: recovery ends there.
    Truncated,
    /// Repaired in place: recovery reads on.
    Repaired,
}

/// The first intact record at or after `start` (8-aligned) whose LSN is
/// `lsn` or later, with its offset.
fn next_intact(file: &dyn File, size_bytes: u64, start: u64, lsn: Lsn) -> Option<(u64, RecordHeader)> {
    let mut buffer = Vec::new();
    let mut offset = start.next_multiple_of(8);
    let magic = rewind_format::journal::RECORD_MAGIC.to_le_bytes();
    let mut word = [0u8; 4];
    while offset + RECORD_HEADER_BYTES as u64 <= size_bytes {
        if file.read_exact_at(&mut word, offset).is_ok() && word == magic {
            if let Ok(header) = read_verified_record(file, size_bytes, offset, &mut buffer) {
                if header.lsn >= Lsn(lsn.0.saturating_sub(1)) {
                    return Some((offset, header));
                }
            }
        }
        offset += 8;
    }
    None
}

/// Offset of an intact record at or after `start` that was appended after
/// `lsn` had become durable, if any.
fn find_voucher(file: &dyn File, size_bytes: u64, start: u64, lsn: Lsn) -> Option<u64> {
    const WINDOW_BYTES: u64 = 1 << 20;
    let magic = rewind_format::journal::RECORD_MAGIC.to_le_bytes();
    let mut window = Vec::new();
    let mut buffer = Vec::new();
    // Records start at multiples of 8.
    let mut base = start.next_multiple_of(8);
    while base < size_bytes {
        let length = WINDOW_BYTES.min(size_bytes - base);
        window.resize(length as usize, 0);
        if file.read_exact_at(&mut window, base).is_err() {
            return None;
        }
        for at in (0..window.len().saturating_sub(3)).step_by(8) {
            if window[at..at + 4] != magic {
                continue;
            }
            let offset = base + at as u64;
            if let Ok(header) = read_verified_record(file, size_bytes, offset, &mut buffer) {
                if header.lsn_committed >= lsn {
                    return Some(offset);
                }
            }
        }
        base += length;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies are carved out of a spare batch's buffer, one after another,
    /// and the buffer goes back to the spares once the last copy in it is
    /// let go; without one, out of fresh memory.
    #[test]
    fn copies_are_carved_out_of_a_spare_buffer_which_goes_back_once_they_are_let_go() {
        const SPARE: usize = 64 << 10;
        let memory = RecentMemory::new(1 << 20);
        let spare = Vec::with_capacity(SPARE);
        let spare_at = spare.as_ptr();
        memory.keep_spare(spare);
        let copies: Vec<Bytes> = (0..15u8).map(|n| memory.carve(&[n; 4168])).collect();
        assert_eq!(memory.spare_bytes(), 0, "the spare buffer is the slab");
        for (n, copy) in copies.iter().enumerate() {
            assert_eq!(copy.as_ptr(), spare_at.wrapping_add(n * 4168), "carved one after another");
            assert!(copy.iter().all(|&byte| usize::from(byte) == n), "copy {n} holds its records");
        }
        // The 16th does not fit: the slab is filled, and the next is fresh.
        let fresh = memory.carve(&[15; 4168]);
        let in_spare = spare_at as usize..spare_at as usize + SPARE;
        assert!(!in_spare.contains(&(fresh.as_ptr() as usize)), "a fresh slab");
        // All but the oldest copy let go: it pins the filled slab.
        let mut copies = VecDeque::from(copies);
        let oldest = copies.pop_front().expect("15 copies");
        drop(copies);
        memory.give_back_free_slabs();
        assert_eq!(memory.spare_bytes(), 0, "the oldest copy still pins the slab");
        drop(oldest);
        memory.give_back_free_slabs();
        assert_eq!(memory.spare_bytes(), SPARE as u64, "the slab is a spare buffer again, whole");
        let taken = memory.take_spare();
        assert_eq!(taken.as_ptr(), spare_at, "the same buffer");
    }
}
