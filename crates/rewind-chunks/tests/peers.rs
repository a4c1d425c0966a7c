//! Two nodes, one bucket (issue 14 req 7), at the chunk store: the second
//! node borrows the chunks the first already stored — their slots name the
//! first node's packs, nothing is stored twice — reads them back through
//! the bucket, keeps them across a reopen, and lets them go without ever
//! deleting the first node's packs; and a node's table says which packs it
//! borrows from, which is what keeps their owner from deleting them.

use std::sync::Arc;

use rewind_chunks::peers::{pack_owner, PeerTables};
use rewind_chunks::tiered::{TierConfig, TieredPackStore};
use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting, LocalPackStore, PackStore};
use rewind_io::{OsStorage, Storage};
use rewind_types::ChunkId;

/// A node: its own directory and local tier, the bucket shared.
fn node(
    dir: &std::path::Path,
    name: &str,
    number: u16,
    bucket: &Arc<dyn PackStore>,
) -> (Arc<dyn Storage>, Arc<TieredPackStore>, ChunkStore) {
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir).unwrap());
    storage.create_dir_all(name).unwrap();
    let local: Arc<dyn PackStore> =
        Arc::new(LocalPackStore::open(Arc::clone(&storage), &format!("{name}/local")).unwrap());
    let config = TierConfig { node: number, ..TierConfig::default() };
    let tiered = Arc::new(TieredPackStore::open(local, Arc::clone(bucket), config).unwrap());
    let chunks = ChunkStoreConfig { node: number, ..ChunkStoreConfig::default() };
    let store =
        ChunkStore::open_with_packs(Arc::clone(&storage), &format!("{name}/chunks"), chunks, Arc::clone(&tiered) as _)
            .unwrap();
    (storage, tiered, store)
}

fn block(index: u32) -> Vec<u8> {
    (0..1024u32).flat_map(|word| (word ^ index.wrapping_mul(2_654_435_761)).to_le_bytes()).collect()
}

fn put_all(store: &ChunkStore, blocks: &[Vec<u8>]) -> Vec<ChunkId> {
    let mut session = store.session().unwrap();
    let ids = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    ids
}

#[test]
fn a_node_borrows_what_another_stored_and_never_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let shared: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let bucket: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(shared, "bucket").unwrap());

    let (_, tiered_a, a) = node(dir.path(), "a", 1, &bucket);
    a.finish_open(Counting::Exact).unwrap();
    let common: Vec<Vec<u8>> = (0..64).map(block).collect();
    put_all(&a, &common);
    while tiered_a.upload_next().unwrap().is_some() {}
    let a_packs = tiered_a.packs();
    assert!(!a_packs.is_empty() && a_packs.iter().all(|&pack| pack_owner(pack) == 1), "{a_packs:x?}");

    // B learns A's chunks from A's table (as A's catalog carries it).
    let tables_of_a = || {
        let mut tables = PeerTables::default();
        tables.add_table(1, &std::fs::read(dir.path().join("a/chunks/table")).unwrap()).unwrap();
        Arc::new(tables)
    };
    let tables = tables_of_a();
    assert_eq!(tables.chunk_count(), 64);
    let (_, tiered_b, b) = node(dir.path(), "b", 2, &bucket);
    b.finish_open(Counting::Exact).unwrap();
    b.set_peers(tables, u64::MAX);
    let own: Vec<Vec<u8>> = (1000..1016).map(block).collect();
    let mut blocks = common.clone();
    blocks.extend(own.iter().cloned());
    let ids = put_all(&b, &blocks);
    let stats = b.stats();
    assert_eq!((stats.dedup_hits_peers, stats.borrowed_chunks, stats.chunks_written), (64, 64, 16), "{stats:?}");
    assert!(tiered_b.packs().iter().all(|&pack| pack_owner(pack) == 2), "B writes packs of its own number only");
    while tiered_b.upload_next().unwrap().is_some() {}
    assert_eq!(tiered_b.stats().remote_packs as usize, tiered_b.packs().len(), "A's packs are not B's to count");
    let mut out = vec![0; 4096];
    for (id, bytes) in ids.iter().zip(&blocks) {
        b.read(*id, &mut out).unwrap();
        assert_eq!(&out, bytes, "chunk {id}");
    }

    // B's table names A's packs: what keeps A from deleting them.
    let mut b_table = PeerTables::default();
    b_table.add_table(2, &std::fs::read(dir.path().join("b/chunks/table")).unwrap()).unwrap();
    assert!(a_packs.iter().all(|&pack| b_table.names(pack)));
    assert_eq!(b_table.chunk_count(), 16, "B lends only what it stored");

    // Reopened, B counts what it borrowed and reads it again.
    drop((b, tiered_b));
    let (_, tiered_b, b) = node(dir.path(), "b", 2, &bucket);
    for id in &ids {
        b.mark(*id, 4096).unwrap();
    }
    let report = b.finish_open(Counting::Exact).unwrap();
    assert!(report.missing.is_empty(), "{report:?}");
    assert_eq!(b.stats().borrowed_chunks, 64);
    b.read(ids[3], &mut out).unwrap();
    assert_eq!(out, common[3]);

    // B lets everything go: collected, and A's packs are all still there.
    for id in &ids {
        b.release(*id, 4096);
    }
    b.collect(&mut |_, _, _| {}).unwrap();
    assert_eq!(b.stats().borrowed_chunks, 0);
    let names_a_pack = || {
        let mut b_table = PeerTables::default();
        b_table.add_table(2, &std::fs::read(dir.path().join("b/chunks/table")).unwrap()).unwrap();
        a_packs.iter().any(|&pack| b_table.names(pack))
    };
    assert!(!names_a_pack(), "freed borrowed slots are cleared");

    // B's emptied pack leaves the bucket once a catalog is taken after it.
    assert_eq!(tiered_b.delete_retired(tiered_b.begin_capture()).unwrap(), 1);
    let in_bucket: Vec<u64> = bucket.list().unwrap().iter().map(|stored| stored.pack).collect();
    assert!(a_packs.iter().all(|pack| in_bucket.contains(pack)), "{in_bucket:x?}");
    assert!(in_bucket.iter().all(|&pack| pack_owner(pack) == 1), "B's own emptied pack went, no other: {in_bucket:x?}");

    // Borrowed again, and the node stops before its history refers to them
    // or a collection runs (as a crash leaves it): opening clears the slots.
    b.set_peers(tables_of_a(), u64::MAX);
    put_all(&b, &common);
    assert!(names_a_pack());
    drop((b, tiered_b));
    let (_, _, b) = node(dir.path(), "b", 2, &bucket);
    b.finish_open(Counting::Exact).unwrap();
    assert!(!names_a_pack(), "stale borrowed slots are cleared at open");

    // Lending lasts until the time it was given for, on the embedder's clock.
    b.set_peers(tables_of_a(), 100);
    b.expire_peers(99);
    put_all(&b, &common[..1]);
    b.expire_peers(100);
    put_all(&b, &common[1..2]);
    let stats = b.stats();
    assert_eq!((stats.dedup_hits_peers, stats.chunks_written), (1, 1), "{stats:?}");
}

/// A catalog's table lends only chunks the node holds: freed ids' slots
/// (whose packs may be gone) are zeroed in it. And a store never opens
/// over packs of another node number: its own history would be taken for
/// borrowed and its packs deleted as empty.
#[test]
fn a_node_lends_only_what_it_holds_and_keeps_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let shared: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let bucket: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(shared, "bucket").unwrap());
    let (_, _, a) = node(dir.path(), "a", 1, &bucket);
    a.finish_open(Counting::Exact).unwrap();
    let ids = put_all(&a, &(0..8).map(block).collect::<Vec<_>>());
    {
        let _gate = a.hold_references();
        for id in &ids[..5] {
            a.release(*id, 4096);
        }
    }
    a.collect(&mut |_, _, _| {}).unwrap();
    let lent = |table: &[u8]| {
        let mut tables = PeerTables::default();
        assert_eq!(tables.add_table(1, table), Ok(0));
        tables.chunk_count()
    };
    assert_eq!(lent(&std::fs::read(dir.path().join("a/chunks/table")).unwrap()), 8, "freed slots stay on disk");
    let table = {
        let _gate = a.hold_references();
        a.table_for_catalog().unwrap()
    };
    assert_eq!(lent(&table), 3, "the catalog's table lends what is held");

    // The same store opened under another node number is refused.
    drop(a);
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let local: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(Arc::clone(&storage), "a/local").unwrap());
    let tiered = TieredPackStore::open(local, Arc::clone(&bucket), TierConfig { node: 3, ..TierConfig::default() });
    let chunks = ChunkStoreConfig { node: 3, ..ChunkStoreConfig::default() };
    let error = ChunkStore::open_with_packs(storage, "a/chunks", chunks, Arc::new(tiered.unwrap()) as _)
        .err()
        .expect("packs of node 1 under node 3");
    assert!(error.to_string().contains("written by node number 1"), "{error}");
}
