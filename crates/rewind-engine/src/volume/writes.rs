//! A volume's write history as a block trace: what `rewind trace export`
//! hands the lab.

use crate::{EngineError, Timestamp, Volume};

/// One write the history keeps: neighbouring blocks written at one time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteExtent {
    pub time: Timestamp,
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

/// The writes a volume's history keeps, oldest first; iterate it for
/// [`WriteExtent`]s. It holds one (time, block) pair per kept block version
/// — 16 bytes each — and merges neighbours as it is read.
#[derive(Debug)]
pub struct WriteHistory {
    versions: Vec<(Timestamp, u64)>,
    block_bytes: u64,
}

impl IntoIterator for WriteHistory {
    type Item = WriteExtent;
    type IntoIter = WriteExtents;

    fn into_iter(self) -> WriteExtents {
        WriteExtents { versions: self.versions.into_iter().peekable(), block_bytes: self.block_bytes }
    }
}

/// The writes of a [`WriteHistory`], oldest first.
pub struct WriteExtents {
    versions: std::iter::Peekable<std::vec::IntoIter<(Timestamp, u64)>>,
    block_bytes: u64,
}

impl Iterator for WriteExtents {
    type Item = WriteExtent;

    fn next(&mut self) -> Option<WriteExtent> {
        let (time, block) = self.versions.next()?;
        let mut blocks = 1;
        while self.versions.next_if_eq(&(time, block + blocks)).is_some() {
            blocks += 1;
        }
        Some(WriteExtent { time, offset_bytes: block * self.block_bytes, length_bytes: blocks * self.block_bytes })
    }
}

impl Volume {
    /// The writes the volume's history holds (neighbouring blocks of one
    /// time make one write). Thinning by granularity and retention has
    /// already dropped the writes it does not keep, so this is the trace of
    /// what is kept.
    pub fn write_history(&self) -> Result<WriteHistory, EngineError> {
        let mut versions: Vec<(Timestamp, u64)> = Vec::new();
        self.index.for_each_version(&mut |version| {
            versions.push((version.timestamp, version.block.0));
            Ok(())
        })?;
        versions.sort_unstable();
        versions.dedup();
        Ok(WriteHistory { versions, block_bytes: u64::from(self.block_size().bytes()) })
    }
}
