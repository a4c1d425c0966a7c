//! Importing an existing raw image as a volume's first version.

use std::io::{self, Read};

use rewind_types::Timestamp;

use crate::{Attachment, Durability, EngineError, Volume};

/// What an import did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub bytes_read: u64,
    /// Bytes stored; all-zero blocks are skipped (a new volume reads as zeros).
    pub bytes_written: u64,
}

const CHUNK_BYTES: usize = 4 << 20;

impl Attachment {
    /// Writes the image read from `source` (exactly the volume's size) from
    /// offset 0 as this client, then flushes. `progress` is told the bytes
    /// read so far. A revert with `--disconnect` meanwhile ends it.
    pub fn import(
        &self,
        now: Timestamp,
        source: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportReport, EngineError> {
        self.volume().import(self, now, source, progress)
    }
}

impl Volume {
    fn import(
        &self,
        writer: &Attachment,
        now: Timestamp,
        source: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportReport, EngineError> {
        let block_bytes = self.block_size().bytes() as usize;
        let mut buffer = vec![0u8; CHUNK_BYTES];
        let mut report = ImportReport::default();
        loop {
            let filled = fill(source, &mut buffer).map_err(EngineError::io("import source"))?;
            if filled == 0 {
                break;
            }
            let offset = report.bytes_read;
            if offset + filled as u64 > self.size_bytes() {
                return Err(EngineError::InvalidArgument(format!(
                    "the image is larger than volume {} ({} bytes)",
                    self.name(),
                    self.size_bytes()
                )));
            }
            let chunk = &buffer[..filled];
            // Write runs of non-zero blocks; zero blocks already read as zeros.
            let mut start = 0;
            while start < filled {
                let block_end = (start + block_bytes).min(filled);
                if chunk[start..block_end].iter().all(|&byte| byte == 0) {
                    start = block_end;
                    continue;
                }
                let mut end = block_end;
                while end < filled && chunk[end..(end + block_bytes).min(filled)].iter().any(|&byte| byte != 0) {
                    end = (end + block_bytes).min(filled);
                }
                writer.write(now, offset + start as u64, &chunk[start..end], Durability::Buffered)?;
                report.bytes_written += (end - start) as u64;
                start = end;
            }
            report.bytes_read += filled as u64;
            progress(report.bytes_read);
        }
        if report.bytes_read != self.size_bytes() {
            return Err(EngineError::InvalidArgument(format!(
                "the image has {} bytes but volume {} has {}",
                report.bytes_read,
                self.name(),
                self.size_bytes()
            )));
        }
        self.flush()?;
        Ok(report)
    }
}

/// Reads until `buffer` is full or the source ends; returns the bytes read.
fn fill(source: &mut dyn Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match source.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}
