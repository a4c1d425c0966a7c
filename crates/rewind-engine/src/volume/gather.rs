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
//! at once, so that they wait for the device together. Spans the journal
//! still holds in memory are borrowed, not copied: under sustained 1 MiB
//! writes the destager then writes the current store straight from the
//! journal's memory.

use rewind_journal::{Journal, JournalError, MemorySpan};
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

/// Where a gathered version's block is.
#[derive(Clone, Copy)]
enum Located {
    /// Copied into `gathered`, at this place (in the versions' order).
    Copied(usize),
    /// In `held[span]`, at `offset`.
    Held { span: usize, offset: usize },
}

/// Reuses its buffers from one gathering to the next.
#[derive(Default)]
pub(super) struct JournalGather {
    /// Per version, where its block lies and where it goes in `gathered`.
    order: Vec<(u32, u64, usize)>,
    /// One read's bytes (somewhere in it: see `Journal::read_span`).
    span: Vec<u8>,
    /// The blocks copied for the versions last gathered, in their order:
    /// sized for those only, so that a part borrowed whole from memory
    /// zeroes and faults in no buffer.
    gathered: Vec<u8>,
    /// Spans borrowed from the journal's memory (see [`JournalGather::let_go`]).
    held: Vec<MemorySpan>,
    /// Per version last gathered, where its block is.
    located: Vec<Located>,
    block_bytes: usize,
}

impl JournalGather {
    /// Gathers the journal block of each of `versions` (all in the
    /// journal), in the order given ([`JournalGather::block`]): nearby ones
    /// a read together, those in the journal's memory borrowed (read,
    /// where no one batch holds a span: across two, or in the active
    /// batch, which is not shared), those on the disk read by several
    /// readers at once where there are many.
    pub(super) fn read(
        &mut self,
        journal: &Journal,
        versions: impl Iterator<Item = VersionData>,
        block_bytes: usize,
    ) -> Result<(), JournalError> {
        self.let_go();
        self.block_bytes = block_bytes;
        let JournalGather { order, span, gathered, held, located, .. } = self;
        order.clear();
        order.extend(versions.enumerate().map(|(at, data)| match data {
            VersionData::Journal { segment, offset } => (segment, u64::from(offset), at),
            _ => unreachable!("only versions in the journal are gathered from it"),
        }));
        order.sort_unstable();
        located.clear();
        located.resize(order.len(), Located::Copied(0));
        let mut to_read = Vec::new();
        for read in spans(order, block_bytes as u64) {
            let in_memory = journal.holds_in_memory(read.segment, read.start);
            let borrowed = in_memory
                .then(|| journal.span_in_memory(read.segment, read.start, (read.end - read.start) as usize))
                .flatten();
            match borrowed {
                Some(memory) => {
                    for &(_, offset, at) in &order[read.versions.clone()] {
                        located[at] = Located::Held { span: held.len(), offset: (offset - read.start) as usize };
                    }
                    held.push(memory);
                }
                None => to_read.push((read, in_memory)),
            }
        }
        let mut copied = 0;
        for located in located.iter_mut() {
            if let Located::Copied(place) = located {
                *place = copied;
                copied += 1;
            }
        }
        gathered.resize(copied * block_bytes, 0);
        // Each copied block's place in `gathered`, handed to the read of its span.
        let mut places: Vec<Option<&mut [u8]>> = gathered.chunks_exact_mut(block_bytes).map(Some).collect();
        let (mut copies, mut disk_reads) = (Vec::new(), Vec::new());
        for (read, in_memory) in to_read {
            let targets: Vec<(usize, &mut [u8])> = order[read.versions.clone()]
                .iter()
                .map(|&(_, offset, at)| {
                    let Located::Copied(place) = located[at] else { unreachable!("its span is read") };
                    ((offset - read.start) as usize, places[place].take().expect("in one span"))
                })
                .collect();
            match in_memory {
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

    /// The block of the `at`-th version last gathered.
    pub(super) fn block(&self, at: usize) -> &[u8] {
        match self.located[at] {
            Located::Copied(place) => &self.gathered[place * self.block_bytes..(place + 1) * self.block_bytes],
            Located::Held { span, offset } => &self.held[span][offset..offset + self.block_bytes],
        }
    }

    /// The blocks of the versions `range` of those last gathered, in
    /// their order, as stretches of neighbours in memory: each as long as
    /// the blocks next to each other where they lie.
    pub(super) fn stretches(&self, range: std::ops::Range<usize>) -> Vec<&[u8]> {
        let mut stretches = Vec::new();
        let mut at = range.start;
        while at < range.end {
            let mut end = at + 1;
            let next_to = |before: Located, after: Located| match (before, after) {
                (Located::Copied(place), Located::Copied(place_after)) => place + 1 == place_after,
                (Located::Held { span, offset }, Located::Held { span: span_after, offset: offset_after }) => {
                    span == span_after && offset + self.block_bytes == offset_after
                }
                _ => false,
            };
            while end < range.end && next_to(self.located[end - 1], self.located[end]) {
                end += 1;
            }
            let len = (end - at) * self.block_bytes;
            stretches.push(match self.located[at] {
                Located::Copied(place) => &self.gathered[place * self.block_bytes..][..len],
                Located::Held { span, offset } => &self.held[span][offset..offset + len],
            });
            at = end;
        }
        stretches
    }

    /// Lets go of the spans borrowed from the journal's memory: call once
    /// a part's blocks are used, so that the journal reuses the buffers of
    /// the batches it lets go of rather than freeing them.
    pub(super) fn let_go(&mut self) {
        self.held.clear();
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rewind_io::{SimConfig, SimStorage};
    use rewind_journal::{Journal, JournalConfig};
    use rewind_types::{BlockIndex, BlockSize, Timestamp, VersionData};

    use super::JournalGather;

    const BLOCK: usize = 4096;

    /// Durable blocks (what the destager and the archiver gather) from
    /// everywhere a journal keeps them — on the disk only, in batches kept
    /// in memory, in spans across two such batches (read from the file) —
    /// in any order: each version's block is its own, and the stretches of
    /// a range are those blocks, in order, neighbours in memory together.
    #[test]
    fn gathered_blocks_are_each_versions_own_wherever_the_journal_keeps_them() {
        for seed in 0..8 {
            println!("seed {seed}");
            gather_from_everywhere(seed);
        }
    }

    fn gather_from_everywhere(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let storage = SimStorage::new(SimConfig::default(), seed);
        let block_size = BlockSize::new(BLOCK as u32).unwrap();
        let journal =
            Journal::create(Arc::new(storage), "journal", block_size, JournalConfig::default(), Timestamp::MIN)
                .unwrap();
        let mut versions = Vec::new();
        let mut append = |journal: &Journal, records: u64, versions: &mut Vec<(VersionData, Vec<u8>)>| {
            for _ in 0..records {
                let blocks = rng.random_range(1..64usize);
                let data: Vec<u8> = (0..blocks * BLOCK).map(|_| rng.random()).collect();
                let at = Timestamp::from_unix_nanos(1 + versions.len() as u64);
                let appended = journal.append_write(at, BlockIndex(0), &data, &mut Vec::new()).unwrap();
                for (index, block) in data.chunks_exact(BLOCK).enumerate() {
                    let offset = appended.data_offset + (index * BLOCK) as u32;
                    versions.push((VersionData::Journal { segment: appended.segment, offset }, block.to_vec()));
                }
            }
        };
        append(&journal, 40, &mut versions);
        journal.commit().unwrap();
        journal.forget_written(journal.lsn_durable());
        for records in [40, 20, 10] {
            append(&journal, records, &mut versions);
            journal.commit().unwrap();
        }

        let mut gather = JournalGather::default();
        for round in 0..4 {
            match round {
                0 => {}
                1 => versions.reverse(),
                _ => versions.shuffle(&mut rng),
            }
            gather.read(&journal, versions.iter().map(|(data, _)| *data), BLOCK).unwrap();
            for (at, (_, block)) in versions.iter().enumerate() {
                assert!(gather.block(at) == &block[..], "seed {seed}, round {round}: version {at}'s block");
            }
            let (start, end) = match round {
                0 => (0, versions.len()),
                _ => {
                    let start = rng.random_range(0..versions.len());
                    (start, rng.random_range(start + 1..=versions.len()))
                }
            };
            let stretches = gather.stretches(start..end);
            let expected: Vec<u8> = versions[start..end].iter().flat_map(|(_, block)| block.iter().copied()).collect();
            assert!(stretches.concat() == expected, "seed {seed}, round {round}: stretches of {start}..{end}");
            if round == 0 {
                assert!(stretches.len() < end - start, "neighbours in memory make one stretch");
                assert!(!gather.held.is_empty() && !gather.gathered.is_empty(), "borrowed and read blocks both");
            }
            gather.let_go();
        }
    }
}
