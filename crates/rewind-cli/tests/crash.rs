//! `kill -9` during load: a real server process is killed at random moments
//! while fio writes (with flushes) and a writer of our own records exactly
//! which writes and flushes were acknowledged. After every restart:
//! - the writer's region holds exactly the state after some prefix of its
//!   writes, and that prefix includes every write acknowledged before its
//!   last acknowledged flush;
//! - every view taken before — by bookmark and by time — reads exactly as it
//!   did when it was taken.
//!
//! `REWIND_SEED=n` replays a run; `REWIND_KILLS=n` sets the number of kills.

mod common;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use common::nbd_client::NbdClient;
use common::{require, run, Server};

const BLOCK: u64 = 4096;
const VOLUME_BYTES: u64 = 32 << 20;
/// fio writes the first half, our writer the second.
const WRITER_OFFSET: u64 = VOLUME_BYTES / 2;
const WRITER_BLOCKS: u64 = (VOLUME_BYTES - WRITER_OFFSET) / BLOCK;
const FLUSH_EVERY: u64 = 7;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Write number `seq` (from 1) of the writer: which block, and what bytes.
fn write_of(seed: u64, seq: u64) -> (u64, Vec<u8>) {
    let block = splitmix(seed ^ seq.wrapping_mul(31)) % WRITER_BLOCKS;
    let mut data = Vec::with_capacity(BLOCK as usize);
    data.extend_from_slice(&seq.to_le_bytes());
    data.extend_from_slice(&block.to_le_bytes());
    let fill = splitmix(seed.wrapping_add(seq));
    while data.len() < BLOCK as usize {
        data.extend_from_slice(&fill.to_le_bytes());
    }
    (block, data)
}

/// The writer region after writes `1..=seq`.
fn region_after(seed: u64, seq: u64) -> Vec<u8> {
    let mut region = vec![0u8; (WRITER_BLOCKS * BLOCK) as usize];
    for n in 1..=seq {
        let (block, data) = write_of(seed, n);
        region[(block * BLOCK) as usize..((block + 1) * BLOCK) as usize].copy_from_slice(&data);
    }
    region
}

fn hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Reads a whole export with nbdcopy (a real client) and hashes it.
fn view_hash(server: &Server, export: &str, scratch: &std::path::Path) -> u64 {
    let file = scratch.join("view.raw");
    run("nbdcopy", &[&server.uri(export), file.to_str().unwrap()]);
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(bytes.len() as u64, VOLUME_BYTES);
    hash(&bytes)
}

struct Acknowledged {
    writes: AtomicU64,
    flushed: AtomicU64,
}

/// Writes from `first` on until the connection breaks, recording acks.
fn writer(server_nbd: std::net::SocketAddr, seed: u64, first: u64, acked: Arc<Acknowledged>) {
    let Ok(mut client) = NbdClient::connect(server_nbd, "crash") else { return };
    for seq in first.. {
        let (block, data) = write_of(seed, seq);
        if client.write(WRITER_OFFSET + block * BLOCK, &data).is_err() {
            return;
        }
        acked.writes.store(seq, Ordering::Release);
        if seq % FLUSH_EVERY == 0 {
            if client.flush().is_err() {
                return;
            }
            acked.flushed.store(seq, Ordering::Release);
        }
    }
}

fn start_fio(server: &Server, seed: u64) -> Child {
    Command::new("fio")
        .args([
            "--name=load",
            // Jobs as threads of one process, so killing it stops them all.
            "--thread",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri("crash")),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--fsync=8",
            &format!("--size={}", WRITER_OFFSET),
            "--time_based",
            "--runtime=300",
            &format!("--randseed={seed}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("fio starts")
}

/// The newest write in the region; checks the region is exactly the state
/// after it.
fn check_region(server: &Server, seed: u64, flushed: u64, acked: u64, round: u32) -> u64 {
    let mut client = NbdClient::connect(server.nbd, "crash").expect("connect after restart");
    let mut region = vec![0u8; (WRITER_BLOCKS * BLOCK) as usize];
    client.read(WRITER_OFFSET, &mut region).expect("read the region");
    client.disconnect().expect("disconnect");
    let newest = region
        .chunks_exact(BLOCK as usize)
        .map(|block| u64::from_le_bytes(block[..8].try_into().unwrap()))
        .max()
        .unwrap_or(0);
    assert!(
        newest >= flushed,
        "seed {seed} round {round}: write {flushed} was acknowledged by a flush, but the newest write that survived is {newest}"
    );
    assert!(newest <= acked + 1, "seed {seed} round {round}: write {newest} survived but only {acked} were issued");
    assert!(
        region == region_after(seed, newest),
        "seed {seed} round {round}: the region is not the state after write {newest} (a lost or torn write)"
    );
    newest
}

#[test]
fn acknowledged_writes_and_history_survive_kill_9() {
    require("fio");
    require("nbdcopy");
    let seed: u64 = std::env::var("REWIND_SEED").map_or_else(
        |_| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000,
        |seed| seed.parse().expect("REWIND_SEED is a number"),
    );
    let kills: u32 = std::env::var("REWIND_KILLS").map_or(20, |kills| kills.parse().expect("a number"));
    println!("seed {seed}, {kills} kills (REWIND_SEED={seed} replays)");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "crash", "--size", &VOLUME_BYTES.to_string()]);
    // (export name, hash of its contents when taken)
    let mut views: Vec<(String, u64)> = Vec::new();
    let mut newest = 0;
    for round in 0..kills {
        let acked = Arc::new(Acknowledged { writes: AtomicU64::new(newest), flushed: AtomicU64::new(newest) });
        let mut fio = start_fio(&server, seed + u64::from(round));
        let writer_thread = {
            let acked = Arc::clone(&acked);
            let nbd = server.nbd;
            thread::spawn(move || writer(nbd, seed, newest + 1, acked))
        };
        // Under load, take a view by bookmark and by time and remember its contents.
        let target = newest + 20 + splitmix(seed ^ u64::from(round)) % 60;
        common::wait_for("the writer to get going", || acked.writes.load(Ordering::Acquire) >= target);
        let json = server.rewind(&["bookmark", "crash", &format!("round-{round}"), "--json"]);
        let bookmark: serde_json::Value = serde_json::from_str(&json).unwrap();
        let by_name = format!("crash@round-{round}");
        let by_time = format!("crash@{}", bookmark["at"].as_str().unwrap());
        let contents = view_hash(&server, &by_name, dir.path());
        assert_eq!(view_hash(&server, &by_time, dir.path()), contents, "seed {seed}: bookmark and time agree");
        views.push((by_name, contents));
        views.push((by_time, contents));
        // Then crash at a random later moment.
        let target = acked.writes.load(Ordering::Acquire) + 10 + splitmix(seed ^ u64::from(round) << 8) % 300;
        common::wait_for("more acknowledged writes", || acked.writes.load(Ordering::Acquire) >= target);
        server.kill();
        writer_thread.join().expect("writer thread");
        let _ = fio.kill();
        fio.wait().expect("fio reaped");

        server = Server::start(&data);
        let (writes, flushed) = (acked.writes.load(Ordering::Acquire), acked.flushed.load(Ordering::Acquire));
        newest = check_region(&server, seed, flushed, writes, round);
        for (export, contents) in &views {
            assert_eq!(
                view_hash(&server, export, dir.path()),
                *contents,
                "seed {seed} round {round}: view {export} changed"
            );
        }
        println!(
            "round {round}: {writes} writes acknowledged, {flushed} flushed, {newest} survived; {} views intact",
            views.len()
        );
    }
    server.stop();
}
