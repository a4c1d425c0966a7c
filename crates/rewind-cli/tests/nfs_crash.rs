//! `kill -9` of `rewind serve` while an NFS client writes (`nfs3_client`
//! over TCP): every byte a COMMIT acknowledged survives, in every file of
//! every round, and the write verifier changes with each start, so a client
//! knows to send its uncommitted (UNSTABLE) writes again, as RFC 1813 has
//! it. Rounds, and how far each gets before the kill, follow a seed
//! (REWIND_SEED to repeat one), printed.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::NfsConnection as Connection;
use common::{pattern, wait_for, Server};
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::xdr_codec::Opaque;

const PIECE: usize = 64 << 10;
/// A COMMIT after this many pieces.
const PIECES_PER_COMMIT: u64 = 8;

async fn connect(port: u16) -> Connection {
    common::nfs_connect(port, "/home").await
}

fn name(text: &str) -> diropargs3<'static> {
    diropargs3 { dir: nfs_fh3::default(), name: filename3(Opaque::owned(text.as_bytes().to_vec())) }
}

/// Writes `file` in UNSTABLE pieces with a COMMIT every few, until the
/// server goes; `committed` is the length every acknowledged COMMIT covers,
/// `verifiers` what the server's replies carried.
async fn write_until_killed(
    port: u16,
    file: &str,
    seed: u64,
    committed: Arc<AtomicU64>,
    verifiers: Arc<Mutex<Vec<[u8; 8]>>>,
) {
    let mut client = connect(port).await;
    let root = client.root_nfs_fh3();
    let how = createhow3::GUARDED(sattr3 { mode: Nfs3Option::Some(0o644), ..sattr3::default() });
    let created = client.create(&CREATE3args { where_: diropargs3 { dir: root, ..name(file) }, how }).await.unwrap();
    let Nfs3Option::Some(handle) = created.unwrap().obj else { panic!("CREATE returns a handle") };
    let contents = pattern(seed, PIECE * 4096);
    for (index, piece) in contents.chunks(PIECE).enumerate() {
        let write = WRITE3args {
            file: handle.clone(),
            offset: (index * PIECE) as u64,
            count: PIECE as u32,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(piece),
        };
        let Ok(Nfs3Result::Ok(written)) = client.write(&write).await else { return };
        verifiers.lock().unwrap().push(written.verf.0);
        if (index as u64 + 1).is_multiple_of(PIECES_PER_COMMIT) {
            let commit = COMMIT3args { file: handle.clone(), offset: 0, count: 0 };
            let Ok(Nfs3Result::Ok(done)) = client.commit(&commit).await else { return };
            let mut verifiers = verifiers.lock().unwrap();
            // Committed only if no write since the first had another verifier.
            if verifiers.iter().all(|verifier| *verifier == done.verf.0) {
                committed.store((index as u64 + 1) * PIECE as u64, Ordering::Release);
            }
            verifiers.push(done.verf.0);
        }
    }
}

async fn read_all(client: &mut Connection, file: &str, length: u64) -> Vec<u8> {
    let root = client.root_nfs_fh3();
    let found = client.lookup(&LOOKUP3args { what: diropargs3 { dir: root, ..name(file) } }).await.unwrap();
    let handle = found.unwrap().object;
    let mut bytes = Vec::new();
    while (bytes.len() as u64) < length {
        let count = (length - bytes.len() as u64).min(1 << 20) as u32;
        let read = READ3args { file: handle.clone(), offset: bytes.len() as u64, count };
        let data = client.read(&read).await.unwrap().unwrap().data.to_vec();
        assert!(!data.is_empty(), "{file} ends at {} of {length} committed bytes", bytes.len());
        bytes.extend_from_slice(&data);
    }
    bytes.truncate(length as usize);
    bytes
}

#[test]
fn every_committed_byte_survives_kill_9_and_the_verifier_changes() {
    common::require("nfs-ls");
    let seed =
        std::env::var("REWIND_SEED").map_or_else(|_| rand::random::<u64>() % 1_000_000, |seed| seed.parse().unwrap());
    println!("REWIND_SEED={seed}");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["tree", "create", "home"]);
    let mut survivors: Vec<(String, u64, u64)> = Vec::new();
    let mut seen_verifiers: Vec<[u8; 8]> = Vec::new();
    for round in 0..4u64 {
        let file = format!("round{round}.bin");
        let committed = Arc::new(AtomicU64::new(0));
        // The kill comes once this many bytes are committed, while the
        // client goes on writing.
        let kill_after = (1 + (seed + round * 7) % 5) * PIECES_PER_COMMIT * PIECE as u64;
        let verifiers = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (committed, verifiers, file) = (Arc::clone(&committed), Arc::clone(&verifiers), file.clone());
            let port = server.nfs.port();
            runtime.spawn(async move { write_until_killed(port, &file, seed + round, committed, verifiers).await })
        };
        wait_for("the client to commit enough", || committed.load(Ordering::Acquire) >= kill_after);
        server.kill();
        // The client library may go on trying to reach the server; what it
        // was told is in `committed` and `verifiers` already.
        writer.abort();
        let verifiers = verifiers.lock().unwrap().clone();
        let committed = committed.load(Ordering::Acquire);
        println!("round {round}: killed with {committed} bytes committed, {} replies", verifiers.len());
        let verifier = verifiers[0];
        assert!(!seen_verifiers.contains(&verifier), "a new start, a new verifier");
        seen_verifiers.push(verifier);
        survivors.push((file, seed + round, committed));

        server = Server::start(&data);
        let mut client = runtime.block_on(connect(server.nfs.port()));
        for (file, file_seed, length) in &survivors {
            let read = runtime.block_on(read_all(&mut client, file, *length));
            let expected = &pattern(*file_seed, PIECE * 4096)[..*length as usize];
            assert!(read == expected, "{file}: its {length} committed bytes came back different (seed {seed})");
        }
    }
}
