//! The current store's per-block metadata (`docs/format/current-store.md`):
//! `current.meta` holds one 16-byte entry per block, recording what the block
//! in `current.img` is and when it was last written. The all-zero entry means
//! "never written", so a new volume's metadata file can be sparse.

use rewind_types::Timestamp;

use crate::{crc32c, FormatError};

pub const BLOCK_META_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Never written since the volume was created: reads as zeros.
    Unwritten,
    /// Zeroed (TRIM / WRITE_ZEROES): reads as zeros, holds no data.
    Zero,
    /// Holds data whose CRC-32C is `crc32c`.
    Data,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    pub state: BlockState,
    pub crc32c: u32,
    /// Time of the block's latest version (`Timestamp::MIN` if unwritten).
    pub timestamp: Timestamp,
}

impl BlockMeta {
    pub const UNWRITTEN: BlockMeta = BlockMeta { state: BlockState::Unwritten, crc32c: 0, timestamp: Timestamp::MIN };

    /// Layout: timestamp u64, crc32c u32, state u8, then the low 24 bits of the
    /// CRC-32C of the first 13 bytes, so a damaged entry is caught too.
    pub fn encode(&self, out: &mut [u8]) {
        if *self == BlockMeta::UNWRITTEN {
            out[..BLOCK_META_BYTES].fill(0);
            return;
        }
        out[0..8].copy_from_slice(&self.timestamp.unix_nanos().to_le_bytes());
        out[8..12].copy_from_slice(&self.crc32c.to_le_bytes());
        out[12] = match self.state {
            BlockState::Unwritten => 0,
            BlockState::Zero => 1,
            BlockState::Data => 2,
        };
        let check = crc32c(&out[..13]).to_le_bytes();
        out[13..16].copy_from_slice(&check[..3]);
    }

    pub fn decode(bytes: &[u8]) -> Result<BlockMeta, FormatError> {
        const WHAT: &str = "current store block metadata";
        let bytes = &bytes[..BLOCK_META_BYTES];
        if bytes.iter().all(|&byte| byte == 0) {
            return Ok(BlockMeta::UNWRITTEN);
        }
        let check = crc32c(&bytes[..13]).to_le_bytes();
        let stored = u32::from_le_bytes([bytes[13], bytes[14], bytes[15], 0]);
        let computed = u32::from_le_bytes([check[0], check[1], check[2], 0]);
        crate::verify_crc(WHAT, stored, computed)?;
        let state = match bytes[12] {
            1 => BlockState::Zero,
            2 => BlockState::Data,
            other => return Err(FormatError::Invalid { what: WHAT, reason: format!("unknown block state {other}") }),
        };
        Ok(BlockMeta {
            state,
            crc32c: u32::from_le_bytes(bytes[8..12].try_into().expect("4")),
            timestamp: Timestamp::from_unix_nanos(u64::from_le_bytes(bytes[0..8].try_into().expect("8"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let meta = BlockMeta { state: BlockState::Data, crc32c: 0xfeed, timestamp: Timestamp::from_unix_nanos(99) };
        let mut bytes = [0u8; BLOCK_META_BYTES];
        meta.encode(&mut bytes);
        assert_eq!(BlockMeta::decode(&bytes).unwrap(), meta);
        BlockMeta::UNWRITTEN.encode(&mut bytes);
        assert_eq!(bytes, [0; BLOCK_META_BYTES]);
        assert_eq!(BlockMeta::decode(&bytes).unwrap(), BlockMeta::UNWRITTEN);
        meta.encode(&mut bytes);
        for at in 0..BLOCK_META_BYTES {
            let mut damaged = bytes;
            damaged[at] ^= 0x20;
            assert!(BlockMeta::decode(&damaged).is_err(), "flip at byte {at}");
        }
    }
}
