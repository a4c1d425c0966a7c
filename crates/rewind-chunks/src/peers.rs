//! Many nodes, one bucket (issue 14 req 7; MYCDP's many clients deduplicating
//! into one cloud store, seed 004 §4). Nodes that share a bucket share its
//! pack namespace: a pack's number carries its writer's *node number* in its
//! top 16 bits ([`pack_owner`]), so every node names its packs apart and
//! any node can read any pack. A node learns what the others store from the
//! chunk tables in their published catalogs ([`PeerTables`]) and, when an
//! archive pass meets bytes another node already stored, gives the chunk an
//! id of its own whose table slot names the other node's pack — a
//! *borrowed* chunk — instead of storing it again.
//!
//! A node never rewrites or deletes a pack of another: borrowed chunks only
//! leave its table. The owner of a pack deletes it from the bucket only when
//! no other node's newest catalog names it, and only once every other node
//! has published a catalog captured long enough after the pack left the
//! owner's own catalog that no lookup in an older table can still be on its
//! way into one (the engine's pool, `rewind_engine::pool`, keeps that rule).
//! Node number 0 is a bucket of one node: every pack number it ever used.

use rustc_hash::{FxHashMap, FxHashSet};

use rewind_format::chunks::{decode_table_header, TableSlot, TABLE_SLOT_BYTES};
use rewind_types::ChunkId;

use crate::ChunkHash;

/// The bits below a pack number's node number.
const OWNER_SHIFT: u32 = 48;

/// The node number of the node that wrote pack `pack`.
pub fn pack_owner(pack: u64) -> u16 {
    (pack >> OWNER_SHIFT) as u16
}

/// The number below the first pack of node `node`: its packs are numbered
/// from one above it.
pub fn packs_before(node: u16) -> u64 {
    u64::from(node) << OWNER_SHIFT
}

/// Where other nodes keep chunks, by hash: what an archive pass asks when
/// its own dedup index has no entry (see [`crate::ChunkStore::set_peers`]).
pub trait PeerChunks: Send + Sync {
    /// A slot of another node's table naming one of that node's packs that
    /// holds chunk `hash`, if any is known.
    fn find(&self, hash: &ChunkHash) -> Option<TableSlot>;
}

/// The chunks other nodes store, read from their chunk tables, and the
/// packs each table names.
#[derive(Default)]
pub struct PeerTables {
    chunks: FxHashMap<ChunkHash, TableSlot>,
    named: FxHashSet<u64>,
}

impl PeerTables {
    /// Adds the chunk table `bytes` of node `node` (as its catalog holds
    /// it: [`crate::ChunkStore::table_for_catalog`], free ids zeroed): its
    /// chunks in its own packs become findable, and every pack any of its
    /// slots names is counted as named. Returns how many slots did not
    /// decode: damaged, they are skipped (what a damaged slot named is lost
    /// to its node already; one slot must not stop every node's deletions).
    /// A table that is not whole slots, or whose header is damaged, is an
    /// error.
    pub fn add_table(&mut self, node: u16, bytes: &[u8]) -> Result<u64, String> {
        if bytes.len() < TABLE_SLOT_BYTES || !bytes.len().is_multiple_of(TABLE_SLOT_BYTES) {
            return Err(format!("a chunk table of {} bytes is not whole slots", bytes.len()));
        }
        decode_table_header(&bytes[..TABLE_SLOT_BYTES]).map_err(|error| error.to_string())?;
        let mut damaged = 0;
        for (index, slot_bytes) in bytes.chunks_exact(TABLE_SLOT_BYTES).enumerate().skip(1) {
            let id = ChunkId(index as u64);
            let slot = match TableSlot::decode(slot_bytes, id) {
                Ok(Some(slot)) => slot,
                Ok(None) => continue,
                Err(_) => {
                    damaged += 1;
                    continue;
                }
            };
            // Stale slots (freed ids) are counted too: conservative.
            self.named.insert(slot.pack);
            if pack_owner(slot.pack) == node {
                self.chunks.entry(slot.hash).or_insert(slot);
            }
        }
        Ok(damaged)
    }

    /// Whether some table added names pack `pack`.
    pub fn names(&self, pack: u64) -> bool {
        self.named.contains(&pack)
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
}

impl PeerChunks for PeerTables {
    fn find(&self, hash: &ChunkHash) -> Option<TableSlot> {
        self.chunks.get(hash).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_format::chunks::encode_table_header;

    fn slot(hash: u8, pack: u64) -> TableSlot {
        TableSlot { hash: [hash; 32], pack, offset: 64, stored_bytes: 100, raw_bytes: 4096, bare_crc32c: None }
    }

    fn table(slots: &[Option<TableSlot>]) -> Vec<u8> {
        let mut bytes = encode_table_header().to_vec();
        for (index, slot) in slots.iter().enumerate() {
            match slot {
                Some(slot) => bytes.extend_from_slice(&slot.encode(ChunkId(index as u64 + 1))),
                None => bytes.extend_from_slice(&[0; TABLE_SLOT_BYTES]),
            }
        }
        bytes
    }

    #[test]
    fn pack_numbers_carry_their_node() {
        assert_eq!(pack_owner(1), 0);
        assert_eq!(pack_owner(packs_before(3) + 1), 3);
        assert_eq!(pack_owner(packs_before(u16::MAX) + 7), u16::MAX);
        assert!(packs_before(1) > 1 << 40, "a node of its own never reaches another's numbers");
    }

    #[test]
    fn a_table_lends_its_own_chunks_and_names_every_pack() {
        let (own, other) = (packs_before(2) + 5, packs_before(1) + 9);
        let mut tables = PeerTables::default();
        tables.add_table(2, &table(&[Some(slot(1, own)), None, Some(slot(2, other))])).expect("a whole table");
        assert_eq!(tables.find(&[1; 32]), Some(slot(1, own)));
        // A chunk the node itself borrowed is not lent on.
        assert_eq!(tables.find(&[2; 32]), None);
        assert!(tables.names(own) && tables.names(other));
        assert!(!tables.names(own + 1));
        assert_eq!(tables.chunk_count(), 1);
    }

    #[test]
    fn a_damaged_slot_is_skipped_and_a_damaged_table_refused() {
        let mut bytes = table(&[Some(slot(1, packs_before(2) + 1)), Some(slot(2, packs_before(2) + 2))]);
        bytes[TABLE_SLOT_BYTES + 40] ^= 1;
        let mut tables = PeerTables::default();
        assert_eq!(tables.add_table(2, &bytes), Ok(1), "one slot damaged");
        assert_eq!((tables.chunk_count(), tables.names(packs_before(2) + 2)), (1, true));
        let error = PeerTables::default().add_table(2, &bytes[..100]).expect_err("half a slot");
        assert!(error.contains("not whole slots"), "{error}");
        bytes[10] ^= 1;
        let error = PeerTables::default().add_table(2, &bytes).expect_err("a damaged header");
        assert!(!error.contains("whole"), "{error}");
    }
}
