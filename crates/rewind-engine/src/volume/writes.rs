//! A volume's write history as a block trace: what `rewind trace export`
//! hands the lab.
//!
//! The index keeps versions by block, and a trace lists writes by time, so
//! exporting is a sort — of 10^8 versions for a long history, 1.6 GB of
//! (time, block) pairs. Memory stays bounded: versions are sorted in
//! batches of `SORT_BATCH`, every full batch is written to a scratch file
//! beside the volume, and the batches are merged as the trace is read.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rewind_index::IndexError;
use rewind_io::File;

use crate::{EngineError, Timestamp, Volume};

/// Versions sorted in memory at a time: 64 MiB of (time, block) pairs.
const SORT_BATCH: usize = 1 << 22;
/// Pairs read from a scratch file at a time: 64 KiB.
const READ_PAIRS: usize = 1 << 12;
const PAIR_BYTES: usize = 16;

/// A version in the trace: (time in nanoseconds, block).
type Pair = (u64, u64);

/// One write the history keeps: neighbouring blocks written at one time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteExtent {
    pub time: Timestamp,
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

/// The writes a volume's history keeps, oldest first; iterate it for
/// [`WriteExtent`]s (reading a scratch file can fail, hence `Result`s).
pub struct WriteHistory {
    sources: Vec<Source>,
    block_bytes: u64,
}

impl std::fmt::Debug for WriteHistory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("WriteHistory").field("sorted_batches", &self.sources.len()).finish()
    }
}

/// One sorted batch of (time in nanoseconds, block) pairs: the last, in
/// memory, or a full one in a scratch file.
enum Source {
    Memory(std::vec::IntoIter<Pair>),
    Scratch { file: Arc<dyn File>, pairs: u64, next: u64, buffer: std::vec::IntoIter<Pair>, what: String },
}

impl Source {
    fn next(&mut self) -> Result<Option<Pair>, EngineError> {
        match self {
            Source::Memory(pairs) => Ok(pairs.next()),
            Source::Scratch { file, pairs, next, buffer, what } => {
                if let Some(pair) = buffer.next() {
                    return Ok(Some(pair));
                }
                if *next == *pairs {
                    return Ok(None);
                }
                let count = (*pairs - *next).min(READ_PAIRS as u64);
                let mut bytes = vec![0; count as usize * PAIR_BYTES];
                let read = file.read_exact_at(&mut bytes, *next * PAIR_BYTES as u64);
                read.map_err(|source| IndexError::Io { path: what.clone(), source })?;
                *next += count;
                *buffer = bytes.chunks_exact(PAIR_BYTES).map(decode_pair).collect::<Vec<_>>().into_iter();
                Ok(buffer.next())
            }
        }
    }
}

fn decode_pair(bytes: &[u8]) -> Pair {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    (word(0), word(8))
}

impl IntoIterator for WriteHistory {
    type Item = Result<WriteExtent, EngineError>;
    type IntoIter = WriteExtents;

    fn into_iter(self) -> WriteExtents {
        WriteExtents { sources: self.sources, heads: None, last: None, pending: None, block_bytes: self.block_bytes }
    }
}

/// The writes of a [`WriteHistory`], oldest first.
pub struct WriteExtents {
    sources: Vec<Source>,
    /// The next pair of each source not yet taken, smallest first; filled
    /// on the first call.
    heads: Option<BinaryHeap<Reverse<(Pair, usize)>>>,
    /// The pair taken last (pairs are distinct in the trace).
    last: Option<Pair>,
    /// A pair taken that begins the next write.
    pending: Option<Pair>,
    block_bytes: u64,
}

impl WriteExtents {
    /// The next distinct (time, block) pair of all sources.
    fn next_pair(&mut self) -> Result<Option<Pair>, EngineError> {
        if self.heads.is_none() {
            let mut heads = BinaryHeap::with_capacity(self.sources.len());
            for (index, source) in self.sources.iter_mut().enumerate() {
                if let Some(pair) = source.next()? {
                    heads.push(Reverse((pair, index)));
                }
            }
            self.heads = Some(heads);
        }
        let heads = self.heads.as_mut().expect("filled above");
        while let Some(Reverse((pair, index))) = heads.pop() {
            if let Some(next) = self.sources[index].next()? {
                debug_assert!(next >= pair, "batches are sorted");
                heads.push(Reverse((next, index)));
            }
            if self.last != Some(pair) {
                self.last = Some(pair);
                return Ok(Some(pair));
            }
        }
        Ok(None)
    }

    /// The first pair of the next write, then the blocks that continue it.
    fn next_extent(&mut self) -> Result<Option<WriteExtent>, EngineError> {
        let first = match self.pending.take() {
            Some(pair) => Some(pair),
            None => self.next_pair()?,
        };
        let Some((time, block)) = first else {
            return Ok(None);
        };
        let mut blocks = 1;
        while let Some(pair) = self.next_pair()? {
            if pair != (time, block + blocks) {
                self.pending = Some(pair);
                break;
            }
            blocks += 1;
        }
        Ok(Some(WriteExtent {
            time: Timestamp::from_unix_nanos(time),
            offset_bytes: block * self.block_bytes,
            length_bytes: blocks * self.block_bytes,
        }))
    }
}

impl Iterator for WriteExtents {
    type Item = Result<WriteExtent, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_extent().transpose()
    }
}

impl Volume {
    /// The writes the volume's history holds (neighbouring blocks of one
    /// time make one write). Thinning by granularity and retention has
    /// already dropped the writes it does not keep, so this is the trace of
    /// what is kept. Memory is bounded (see the module documentation).
    pub fn write_history(&self) -> Result<WriteHistory, EngineError> {
        self.write_history_sorting(SORT_BATCH)
    }

    fn write_history_sorting(&self, batch_max: usize) -> Result<WriteHistory, EngineError> {
        let mut sources = Vec::new();
        let mut batch: Vec<Pair> = Vec::new();
        self.index.for_each_version(&mut |version| {
            if batch.len() == batch_max {
                sources.push(self.spill(&mut batch)?);
            }
            batch.push((version.timestamp.unix_nanos(), version.block.0));
            Ok(())
        })?;
        batch.sort_unstable();
        sources.push(Source::Memory(batch.into_iter()));
        Ok(WriteHistory { sources, block_bytes: u64::from(self.block_size().bytes()) })
    }

    /// Sorts `batch` into a scratch file and empties it.
    fn spill(&self, batch: &mut Vec<Pair>) -> Result<Source, IndexError> {
        let what = format!("{} (scratch space sorting the write history)", self.dir);
        let io = |source| IndexError::Io { path: what.clone(), source };
        batch.sort_unstable();
        let file = self.storage.create_scratch(&self.dir).map_err(io)?;
        let mut bytes = Vec::with_capacity(READ_PAIRS * PAIR_BYTES);
        for (index, pairs) in batch.chunks(READ_PAIRS).enumerate() {
            bytes.clear();
            bytes.extend(
                pairs.iter().flat_map(|&(time, block)| time.to_le_bytes().into_iter().chain(block.to_le_bytes())),
            );
            file.write_all_at(&bytes, (index * READ_PAIRS * PAIR_BYTES) as u64).map_err(io)?;
        }
        let pairs = batch.len() as u64;
        batch.clear();
        Ok(Source::Scratch { file, pairs, next: 0, buffer: Vec::new().into_iter(), what })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rewind_io::{SimConfig, SimStorage};
    use rewind_types::{BlockSize, VolumeName};

    use super::*;
    use crate::{Durability, Node, NodeConfig, VolumeSpec};

    #[test]
    fn a_history_sorted_through_scratch_files_is_the_one_sorted_in_memory() {
        let seed = 7;
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let storage = SimStorage::new(SimConfig::default(), seed);
        let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
        let start = Timestamp::from_unix_nanos(1_000_000_000_000);
        let spec = VolumeSpec::new(VolumeName::new("v").unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
        let volume = node.create_volume(spec, start).unwrap();
        let mut expected = Vec::new();
        for write in 1..=500u64 {
            let (block, blocks) = (rng.random_range(0..250u64), rng.random_range(1..=6u64));
            let at = start.saturating_add_nanos(write * 1_000);
            volume.write(at, block * 4096, &vec![write as u8; blocks as usize * 4096], Durability::Buffered).unwrap();
            expected.push(WriteExtent { time: at, offset_bytes: block * 4096, length_bytes: blocks * 4096 });
            if write % 100 == 0 {
                // Some versions in runs, some in memory.
                volume.checkpoint(at).unwrap();
            }
        }
        let extents = |batch_max| -> Vec<WriteExtent> {
            volume.write_history_sorting(batch_max).unwrap().into_iter().collect::<Result<_, _>>().unwrap()
        };
        assert_eq!(extents(SORT_BATCH), expected);
        for batch_max in [1, 7, 64, 1000] {
            assert_eq!(extents(batch_max), expected, "sorted {batch_max} at a time");
        }
        let history = volume.write_history_sorting(64).unwrap();
        assert!(history.sources.len() > 20, "scratch files were used: {history:?}");
    }
}
