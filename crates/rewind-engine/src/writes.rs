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

impl Volume {
    /// The writes the volume's history holds, oldest first (neighbouring
    /// blocks of one time make one write). Thinning by granularity and
    /// retention has already dropped the writes it does not keep, so this
    /// is the trace of what is kept; the index holds one small entry per
    /// block version, and so does the list while it is sorted.
    pub fn write_history(&self) -> Result<Vec<WriteExtent>, EngineError> {
        let mut versions: Vec<(Timestamp, u64)> = Vec::new();
        self.index.for_each_version(&mut |version| {
            versions.push((version.timestamp, version.block.0));
            Ok(())
        })?;
        versions.sort_unstable();
        versions.dedup();
        let block_bytes = u64::from(self.block_size().bytes());
        let mut writes: Vec<WriteExtent> = Vec::new();
        for (time, block) in versions {
            let offset_bytes = block * block_bytes;
            match writes.last_mut() {
                Some(last) if last.time == time && last.offset_bytes + last.length_bytes == offset_bytes => {
                    last.length_bytes += block_bytes;
                }
                _ => writes.push(WriteExtent { time, offset_bytes, length_bytes: block_bytes }),
            }
        }
        Ok(writes)
    }
}
