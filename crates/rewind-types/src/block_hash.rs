//! Hash tables keyed by block number that keep neighbouring blocks together.
//!
//! A large write puts hundreds of consecutive blocks into the engine's
//! per-block tables (the overlay, the version index's memtable) one after
//! another. A hash that scatters them puts each in a slot at random across
//! a table of 2^20 entries (tens of MiB, beyond the caches): each insert a
//! miss in the cache and the TLB. [`NeighbourHasher`] places a block by its
//! run of 16 blocks (scattered, by a multiplicative hash) and its place
//! within the run, so a large write's blocks fill neighbouring slots, in the
//! same cache lines and pages.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by block number, hashed with [`NeighbourHasher`].
pub type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<NeighbourHasher>>;

/// Hashes a block number (see the module documentation). The top seven
/// bits, which the table keeps beside each slot to tell keys apart, come
/// from the whole block, so those of one run differ.
#[derive(Default)]
pub struct NeighbourHasher(u64);

impl Hasher for NeighbourHasher {
    fn write_u64(&mut self, block: u64) {
        const RUN_BITS: u32 = 4;
        /// Bits of the hash the table may use for a slot: all but the top seven.
        const SLOT_MASK: u64 = (1 << 57) - 1;
        let run = (block >> RUN_BITS).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
        let slot = ((run << RUN_BITS) | (block & ((1 << RUN_BITS) - 1))) & SLOT_MASK;
        let tag = block.wrapping_mul(0xbf58_476d_1ce4_e5b9) & !SLOT_MASK;
        self.0 = slot | tag;
    }

    fn write(&mut self, _bytes: &[u8]) {
        unreachable!("the keys are block numbers")
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn neighbour_hash(block: u64) -> u64 {
        let mut hasher = NeighbourHasher::default();
        hasher.write_u64(block);
        hasher.finish()
    }

    /// A run of 16 blocks takes 16 neighbouring slots, told apart by their
    /// tags; runs are scattered over the slots, strided ones too.
    #[test]
    fn neighbouring_blocks_hash_to_neighbouring_slots_with_distinct_tags() {
        const SLOTS: u64 = (1 << 20) - 1;
        for run in [0u64, 1, 7, 1 << 20, 123_456_789] {
            let hashes: Vec<u64> = (16 * run..16 * run + 16).map(neighbour_hash).collect();
            for (i, hash) in hashes.iter().enumerate() {
                assert_eq!(hash & SLOTS, (hashes[0] & SLOTS) + i as u64, "run {run}, block {i}");
            }
            let tags: HashSet<u64> = hashes.iter().map(|hash| hash >> 57).collect();
            assert!(tags.len() >= 12, "run {run}: {} tags of 16", tags.len());
        }
        for stride in [16u64, 256, 4096, 1 << 16] {
            let slots: HashSet<u64> = (0..4096).map(|i| neighbour_hash(i * stride) & SLOTS).collect();
            assert!(slots.len() >= 4000, "stride {stride}: {} slots of 4096", slots.len());
        }
    }
}
