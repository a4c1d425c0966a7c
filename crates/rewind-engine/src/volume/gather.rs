//! Reading the journal blocks of many versions at once, in journal order.
//!
//! The archiver and the destager both take versions in block order, whose
//! journal bytes lie wherever the writes put them. The journal is written
//! around the page cache, so each read goes to the disk (and is made with
//! direct I/O too: `Journal::read_span`): one read per
//! block made random writes' destaging a synchronous 4 KiB read each
//! (about 10,000 a second on this disk), slower than the writes arrived.
//! Read in journal order, neighbouring versions share a read; the reads
//! that go to the disk, where there are many, are made by several readers
//! at once, so that they wait for the device together.

use rewind_journal::{Journal, JournalError};
use rewind_types::VersionData;

/// Journal bytes read at once for versions that lie near each other.
const READ_BYTES_MAX: usize = 1 << 20;
/// Unneeded journal bytes read rather than split a read around them: at
/// this disk's 2.5 GB/s, 16 KiB costs less than another read's latency.
/// (Under bench/nfs_mix.py's four mixes, 16 KiB read 3.0 GB in 331k reads,
/// 64 KiB 7.5 GB in 207k; read in block order, as before, 2.4 GB in 526k.)
const READ_GAP_MAX: u64 = 16 << 10;
/// Journal bytes of versions gathered at once: the more of them are read
/// together in journal order, the more lie near each other.
pub(super) const GATHER_BYTES_MAX: usize = 32 << 20;

/// Spans on the disk read at once, at most. After a burst of random
/// writes, a part's blocks lie all over the journal, those left from the
/// burst's first seconds on the disk only: thousands of reads of 4–16 KiB
/// a part, each waiting for the device alone (2,400 took 0.5–0.8 s). With
/// 16 readers a sequential read right after such a burst ran at 0.34–0.66
/// of rested (median 0.62 of 4 runs), with 4 at 0.22 and 0.46
/// (BENCHMARKS.md). Threads of their own, blocked in the device, not on
/// the cores.
const DISK_READERS: usize = 16;

/// Spans on the disk below which they are read one after another: a
/// handful costs less than starting the readers.
const DISK_SPANS_FOR_READERS: usize = 8;

/// One read: the journal bytes `start..end` of `segment`, and where in
/// `order` the versions it holds are.
struct Span {
    segment: u32,
    start: u64,
    end: u64,
    versions: std::ops::Range<usize>,
}

/// Reuses its buffers from one gathering to the next.
#[derive(Default)]
pub(super) struct JournalGather {
    /// Per version, where its block lies and where it goes in `gathered`.
    order: Vec<(u32, u64, usize)>,
    /// One read's bytes (somewhere in it: see `Journal::read_span`).
    span: Vec<u8>,
    /// The blocks of the versions last gathered, in their order.
    pub gathered: Vec<u8>,
}

impl JournalGather {
    /// Reads the journal block of each of `versions` (all in the journal)
    /// into `gathered`, in the order given: nearby ones a read together,
    /// those in the journal's memory copied, those on the disk by several
    /// readers at once where there are many.
    pub(super) fn read(
        &mut self,
        journal: &Journal,
        versions: impl Iterator<Item = VersionData>,
        block_bytes: usize,
    ) -> Result<(), JournalError> {
        let JournalGather { order, span, gathered } = self;
        order.clear();
        order.extend(versions.enumerate().map(|(at, data)| match data {
            VersionData::Journal { segment, offset } => (segment, u64::from(offset), at),
            _ => unreachable!("only versions in the journal are gathered from it"),
        }));
        order.sort_unstable();
        gathered.resize(order.len() * block_bytes, 0);
        // Each version's block in `gathered`, handed to the read of its span.
        let mut blocks: Vec<Option<&mut [u8]>> = gathered.chunks_exact_mut(block_bytes).map(Some).collect();
        let (mut copies, mut disk_reads) = (Vec::new(), Vec::new());
        for read in spans(order, block_bytes as u64) {
            let targets: Vec<(usize, &mut [u8])> = order[read.versions.clone()]
                .iter()
                .map(|&(_, offset, at)| ((offset - read.start) as usize, blocks[at].take().expect("in one span")))
                .collect();
            match journal.holds_in_memory(read.segment, read.start) {
                true => copies.push((read, targets)),
                false => disk_reads.push((read, targets)),
            }
        }
        if disk_reads.len() < DISK_SPANS_FOR_READERS {
            copies.append(&mut disk_reads);
        }
        for (read, targets) in &mut copies {
            read_into(journal, read, targets, span)?;
        }
        if disk_reads.is_empty() {
            return Ok(());
        }
        // Dealt in turn, so that each reader's spans lie across the part.
        let mut shares: Vec<Vec<_>> = (0..DISK_READERS).map(|_| Vec::new()).collect();
        for (index, read) in disk_reads.into_iter().enumerate() {
            shares[index % DISK_READERS].push(read);
        }
        std::thread::scope(|scope| {
            let readers: Vec<_> = shares
                .into_iter()
                .map(|mut share| {
                    scope.spawn(move || {
                        let mut buffer = Vec::new();
                        share.iter_mut().try_for_each(|(read, targets)| read_into(journal, read, targets, &mut buffer))
                    })
                })
                .collect();
            readers.into_iter().try_for_each(|reader| reader.join().expect("a journal reader panicked"))
        })
    }
}

/// The reads `order` (sorted) takes: versions that lie near each other in
/// one segment share one, up to `READ_BYTES_MAX`.
fn spans(order: &[(u32, u64, usize)], block: u64) -> impl Iterator<Item = Span> + '_ {
    let mut first = 0;
    std::iter::from_fn(move || {
        let &(segment, start, _) = order.get(first)?;
        let mut end = start + block;
        let mut last = first + 1;
        while let Some(&(next_segment, next, _)) = order.get(last) {
            let near = next_segment == segment && next <= end + READ_GAP_MAX;
            if !near || next + block - start > READ_BYTES_MAX as u64 {
                break;
            }
            end = end.max(next + block);
            last += 1;
        }
        let span = Span { segment, start, end, versions: first..last };
        first = last;
        Some(span)
    })
}

/// Reads `span` and copies each of its versions' blocks to its target
/// (the block's offset in the span, and where it goes).
fn read_into(
    journal: &Journal,
    span: &Span,
    targets: &mut [(usize, &mut [u8])],
    buffer: &mut Vec<u8>,
) -> Result<(), JournalError> {
    let bytes = journal.read_span(span.segment, span.start, (span.end - span.start) as usize, buffer)?;
    for (from, block) in targets.iter_mut() {
        let len = block.len();
        block.copy_from_slice(&bytes[*from..*from + len]);
    }
    Ok(())
}
