//! Many nodes, one bucket (issue 14 req 7; MYCDP's many clients, seed 004
//! §4). Nodes that share a bucket coordinate through it alone: each *joins*
//! under a name and gets a node number by conditional writes
//! (`numbers/NNNNN`, then `members/NAME`), keeps its catalogs and pieces
//! under `nodes/NAME/`, and writes its packs into the shared `packs/`
//! numbered under its node number (`rewind_chunks::peers`).
//!
//! Every upload interval, before taking its own catalog, a node reads the
//! newest catalog of every other member and the chunk table in it: archive
//! passes borrow the chunks those tables hold instead of storing them again.
//! The tables are trusted for a quarter of the grace period after they were
//! read; past that (the bucket does not answer) nothing is borrowed.
//!
//! A pack its owner no longer needs (retired by its collection) leaves the
//! bucket only when, for the time `P` the owner first published a catalog
//! taken after retiring it: every other member has published a catalog
//! taken at `P` + half the grace period or later — so any lookup in a
//! table read before `P`, the last tables that named the pack, has ended
//! in a catalog (a table is trusted a quarter of the grace period, and a
//! catalog's table is captured after the archive pass in flight; the
//! other quarter covers the nodes' clocks disagreeing) — and none of
//! those newest catalogs names the pack. A
//! member that stops publishing holds every retired pack of the others
//! until it publishes again or leaves the pool: safe, at the price of
//! space, and shown in `rewind stats`.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_chunks::meta_store::{MetaStore, Within};
use rewind_chunks::peers::PeerTables;
use rewind_chunks::ChunkStore;
use rewind_types::Timestamp;

use crate::catalog::{fetch_file, newest};
use crate::node::CHUNKS_DIR;
use crate::EngineError;

const MEMBERS_DIR: &str = "members";
const NUMBERS_DIR: &str = "numbers";

/// A node's place among the nodes sharing its bucket.
pub struct Pool {
    pub name: String,
    /// Its node number: the top 16 bits of its packs' numbers (1 and up).
    pub number: u16,
    /// The bucket's objects, shared by its nodes.
    store: Arc<dyn MetaStore>,
    /// See the module documentation (nanoseconds).
    pub grace_nanos: u64,
}

/// Another member as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub number: u16,
    /// Its newest catalog, if it has published one, and when it was taken.
    pub generation: Option<u64>,
    pub taken: Timestamp,
}

/// Each other member, by name, with its newest catalog's chunk table.
type PeerTablesByName = BTreeMap<String, (Peer, Arc<Vec<u8>>)>;

/// The other members and what their tables hold, as last read.
#[derive(Default)]
struct Seen {
    read_at: Option<Timestamp>,
    peers: PeerTablesByName,
    tables: Arc<PeerTables>,
}

/// A node's pool and what it has seen of the others.
pub(crate) struct Members {
    pub(crate) pool: Pool,
    seen: Mutex<Seen>,
}

/// What `rewind stats` shows of the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolStatus {
    pub name: String,
    pub number: u16,
    pub peers: Vec<Peer>,
    /// When the other members were last read.
    pub read_at: Option<Timestamp>,
    /// Chunks the others' tables lend.
    pub chunks_lendable: u64,
    /// Chunks of this node's history in the others' packs, their stored
    /// bytes, and how many archive passes found there since the start.
    pub chunks_borrowed: u64,
    pub bytes_borrowed: u64,
    pub borrowed_since_start: u64,
}

impl Pool {
    /// Joins the nodes sharing `store` (a bucket) as `name`, or finds the
    /// number `name` was given when it joined before (a recovered node
    /// keeps its number).
    pub fn join(store: Arc<dyn MetaStore>, name: &str, grace_nanos: u64) -> io::Result<Pool> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
        if !valid {
            let message = format!("node name {name:?}: use 1 to 64 letters, digits, '-' or '_'");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        }
        let member = format!("{MEMBERS_DIR}/{name}");
        let number = match store.get(&member) {
            Ok(bytes) => parse_number(&store.locate(&member), &bytes)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let number = claim_number(&*store, name)?;
                match store.put_new(&member, number.to_string().as_bytes()) {
                    Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
                    _ => {}
                }
                // Whoever wrote it first wins; a node that lost sees it.
                parse_number(&store.locate(&member), &store.get(&member)?)?
            }
            Err(error) => return Err(error),
        };
        Ok(Pool { name: name.to_owned(), number, store, grace_nanos })
    }

    /// Node `name` of the nodes sharing `store`, which must have joined
    /// before (what a recovery asks: a mistyped name must not join).
    pub fn member(store: Arc<dyn MetaStore>, name: &str, grace_nanos: u64) -> io::Result<Pool> {
        let member = format!("{MEMBERS_DIR}/{name}");
        match store.get(&member) {
            Ok(bytes) => {
                let number = parse_number(&store.locate(&member), &bytes)?;
                Ok(Pool { name: name.to_owned(), number, store, grace_nanos })
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let members = store.list(MEMBERS_DIR)?;
                let message = format!(
                    "no node {name:?} has joined; the nodes are: {}",
                    if members.is_empty() { "none".to_owned() } else { members.join(", ") }
                );
                Err(io::Error::new(io::ErrorKind::NotFound, message))
            }
            Err(error) => Err(error),
        }
    }

    /// Where node `name`'s own objects are: its catalogs and their pieces.
    pub fn node_store(&self, name: &str) -> Arc<dyn MetaStore> {
        Arc::new(Within::new(Arc::clone(&self.store), &format!("nodes/{name}")))
    }

    /// Every member, by name, with its number.
    fn members(&self) -> io::Result<Vec<(String, u16)>> {
        let mut members = Vec::new();
        for name in self.store.list(MEMBERS_DIR)? {
            let member = format!("{MEMBERS_DIR}/{name}");
            members.push((name, parse_number(&self.store.locate(&member), &self.store.get(&member)?)?));
        }
        Ok(members)
    }
}

fn parse_number(location: &str, bytes: &[u8]) -> io::Result<u16> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|&number| number > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{location} does not hold a node number")))
}

/// The node number claimed for `name`: one a crash left claimed without
/// its member record, else the next free one, taken with a conditional
/// write so two nodes joining at once get two numbers.
fn claim_number(store: &dyn MetaStore, name: &str) -> io::Result<u16> {
    let claimed = store.list(NUMBERS_DIR)?;
    for claim in &claimed {
        if store.get(&format!("{NUMBERS_DIR}/{claim}"))? == name.as_bytes() {
            return parse_number(&store.locate(&format!("{NUMBERS_DIR}/{claim}")), claim.as_bytes());
        }
    }
    let highest = claimed.iter().filter_map(|claim| claim.parse::<u16>().ok()).max().unwrap_or(0);
    for number in highest.saturating_add(1)..=u16::MAX {
        match store.put_new(&format!("{NUMBERS_DIR}/{number:05}"), name.as_bytes()) {
            Ok(()) => return Ok(number),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::new(io::ErrorKind::StorageFull, "every node number of the bucket is taken"))
}

impl Members {
    pub(crate) fn new(pool: Pool) -> Members {
        Members { pool, seen: Mutex::default() }
    }

    /// Reads the other members' newest catalogs (the chunk tables of those
    /// that changed) and lets `chunks` borrow from them. On failure, stops
    /// the borrowing once what was read last is too old to trust.
    pub(crate) fn refresh(&self, now: Timestamp, chunks: &ChunkStore) -> Result<(), EngineError> {
        let read = self.read_peers();
        let mut seen = self.seen.lock();
        match read {
            Ok(peers) => {
                let changed = peers.len() != seen.peers.len()
                    || peers.iter().any(|(name, (peer, _))| seen.peers.get(name).is_none_or(|(old, _)| old != peer));
                if changed {
                    let mut tables = PeerTables::default();
                    for (peer, table) in peers.values() {
                        if table.is_empty() {
                            continue;
                        }
                        let damaged = tables.add_table(peer.number, table).map_err(|error| EngineError::Corrupt {
                            volume: String::new(),
                            detail: format!("the chunk table of node {} in the bucket: {error}", peer.name),
                        })?;
                        if damaged > 0 {
                            tracing::warn!(node = %peer.name, damaged, "slots of another node's chunk table are damaged");
                        }
                    }
                    seen.tables = Arc::new(tables);
                    seen.peers = peers;
                }
                seen.read_at = Some(now);
                let until = now.saturating_add_nanos(self.pool.grace_nanos / 4);
                chunks.set_peers(Arc::clone(&seen.tables) as _, until.unix_nanos());
                Ok(())
            }
            Err(error) => {
                chunks.expire_peers(now.unix_nanos());
                Err(error)
            }
        }
    }

    /// The other members, each with its newest catalog's chunk table (the
    /// one read before if the catalog is the same).
    fn read_peers(&self) -> Result<PeerTablesByName, EngineError> {
        let members = self.pool.members().map_err(EngineError::io("the bucket's members"))?;
        let known: PeerTablesByName = self.seen.lock().peers.clone();
        let mut peers = BTreeMap::new();
        for (name, number) in members.into_iter().filter(|(name, _)| *name != self.pool.name) {
            let store = self.pool.node_store(&name);
            let catalog = newest(&*store, None)?;
            let generation = catalog.as_ref().map(|catalog| catalog.generation);
            let taken = catalog.as_ref().map_or(Timestamp::MIN, |catalog| catalog.taken);
            let peer = Peer { name: name.clone(), number, generation, taken };
            let table = match (&catalog, known.get(&name)) {
                (_, Some((old, table))) if *old == peer => Arc::clone(table),
                (None, _) => Arc::default(),
                (Some(catalog), _) => {
                    let path = format!("{CHUNKS_DIR}/table");
                    match catalog.files.iter().find(|file| file.path == path) {
                        Some(file) => Arc::new(fetch_file(&*store, file)?),
                        None => Arc::default(),
                    }
                }
            };
            peers.insert(name, (peer, table));
        }
        Ok(peers)
    }

    /// Whether the node must publish a catalog even though nothing changed
    /// since `taken`: the others wait for catalogs taken after their packs
    /// were let go (see [`Members::holds`]), so a member's newest catalog
    /// is never older than a quarter of the grace period.
    pub(crate) fn republish_due(&self, taken: Timestamp, now: Timestamp) -> bool {
        taken.saturating_add_nanos(self.pool.grace_nanos / 4) <= now
    }

    /// Whether own pack `pack`, retired and out of this node's catalogs
    /// since `published_at`, must stay in the bucket for the other members
    /// (see the module documentation).
    pub(crate) fn holds(&self, pack: u64, published_at: Timestamp) -> bool {
        let seen = self.seen.lock();
        let settled = published_at.saturating_add_nanos(self.pool.grace_nanos / 2);
        let read_late_enough = seen.read_at.is_some_and(|at| at >= settled);
        !read_late_enough || seen.peers.values().any(|(peer, _)| peer.taken < settled) || seen.tables.names(pack)
    }

    pub(crate) fn status(&self, chunks: &ChunkStore) -> PoolStatus {
        let stats = chunks.stats();
        let seen = self.seen.lock();
        PoolStatus {
            name: self.pool.name.clone(),
            number: self.pool.number,
            peers: seen.peers.values().map(|(peer, _)| peer.clone()).collect(),
            read_at: seen.read_at,
            chunks_lendable: seen.tables.chunk_count() as u64,
            chunks_borrowed: stats.borrowed_chunks,
            bytes_borrowed: stats.borrowed_stored_bytes,
            borrowed_since_start: stats.dedup_hits_peers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewind_chunks::LocalMetaStore;
    use rewind_io::{OsStorage, Storage};

    fn bucket() -> (tempfile::TempDir, Arc<dyn MetaStore>) {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
        (dir, Arc::new(LocalMetaStore::open(storage, "bucket").unwrap()))
    }

    #[test]
    fn nodes_join_with_numbers_of_their_own_and_keep_them() {
        let (_dir, store) = bucket();
        let a = Pool::join(Arc::clone(&store), "a", 1).unwrap();
        let b = Pool::join(Arc::clone(&store), "b", 1).unwrap();
        assert_eq!((a.number, b.number), (1, 2));
        assert_eq!(Pool::join(Arc::clone(&store), "a", 1).unwrap().number, 1, "a recovered node keeps its number");
        // A claim a crash left without its member record is the node's.
        store.put_new("numbers/00003", b"c").unwrap();
        assert_eq!(Pool::join(Arc::clone(&store), "c", 1).unwrap().number, 3);
        assert_eq!(Pool::join(Arc::clone(&store), "d", 1).unwrap().number, 4);
        let members = a.members().unwrap();
        assert_eq!(members, [("a".into(), 1), ("b".into(), 2), ("c".into(), 3), ("d".into(), 4)]);
        a.node_store("a").put_new("catalogs/x", b"1").unwrap();
        assert_eq!(Pool::member(Arc::clone(&store), "b", 1).unwrap().number, 2);
        let error = Pool::member(Arc::clone(&store), "x", 1).err().expect("never joined");
        assert!(error.to_string().contains("the nodes are: a, b, c, d"), "{error}");
        assert!(store.get("members/x").is_err(), "asking does not join");
        assert_eq!(store.get("nodes/a/catalogs/x").unwrap(), b"1");
    }

    #[test]
    fn a_bad_name_or_member_record_is_refused() {
        let (_dir, store) = bucket();
        for name in ["", "a/b", "..", &"x".repeat(65)] {
            let error = Pool::join(Arc::clone(&store), name, 1).err().expect("refused");
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{name:?}: {error}");
        }
        store.put_new("members/e", b"zero").unwrap();
        let error = Pool::join(Arc::clone(&store), "e", 1).err().expect("refused");
        assert!(error.to_string().contains("does not hold a node number"), "{error}");
    }
}
