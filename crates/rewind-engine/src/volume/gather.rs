//! Reading the journal blocks of many versions at once, in journal order.
//!
//! The archiver and the destager both take versions in block order, whose
//! journal bytes lie wherever the writes put them. The journal is written
//! around the page cache, so each read goes to the disk (and is made with
//! direct I/O too: `Journal::read_span`): one read per
//! block made random writes' destaging a synchronous 4 KiB read each
//! (about 10,000 a second on this disk), slower than the writes arrived.
//! Read in journal order, neighbouring versions share a read.

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
    /// into `gathered`, in the order given.
    pub(super) fn read(
        &mut self,
        journal: &Journal,
        versions: impl Iterator<Item = VersionData>,
        block_bytes: usize,
    ) -> Result<(), JournalError> {
        self.order.clear();
        self.order.extend(versions.enumerate().map(|(at, data)| match data {
            VersionData::Journal { segment, offset } => (segment, u64::from(offset), at),
            _ => unreachable!("only versions in the journal are gathered from it"),
        }));
        self.order.sort_unstable();
        self.gathered.resize(self.order.len() * block_bytes, 0);
        let block = block_bytes as u64;
        let mut first = 0;
        while first < self.order.len() {
            let (segment, start, _) = self.order[first];
            let mut end = start + block;
            let mut last = first + 1;
            while let Some(&(next_segment, next, _)) = self.order.get(last) {
                let near = next_segment == segment && next <= end + READ_GAP_MAX;
                if !near || next + block - start > READ_BYTES_MAX as u64 {
                    break;
                }
                end = end.max(next + block);
                last += 1;
            }
            let span = journal.read_span(segment, start, (end - start) as usize, &mut self.span)?;
            for &(_, offset, at) in &self.order[first..last] {
                let from = (offset - start) as usize;
                self.gathered[at * block_bytes..][..block_bytes].copy_from_slice(&span[from..from + block_bytes]);
            }
            first = last;
        }
        Ok(())
    }
}
