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
use common::{json, pattern, require, run, Server};

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
    let (seed, kills) = seed_and_kills(20);
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

/// The lineage rounds' volume: small, so every view is checked every round.
const LINEAGE_BYTES: usize = 1 << 20;
const LAYOUTS: [&str; 7] = ["journaled", "logging", "split-stream", "split-down-stream", "checkpointing", "cow", "row"];

/// What one round asks of the server while it is killed.
#[derive(Debug)]
enum Operation {
    Revert { to: usize },
    Undo,
    Clone { at: usize, name: String },
    Restore { at: usize, file: std::path::PathBuf },
    Promote { name: String },
}

fn read_export(server: &Server, export: &str) -> std::io::Result<Vec<u8>> {
    let mut client = NbdClient::connect(server.nbd, export)?;
    let mut bytes = vec![0; LINEAGE_BYTES];
    client.read(0, &mut bytes)?;
    client.disconnect()?;
    Ok(bytes)
}

/// `REWIND_SEED` (or a fresh seed) and `REWIND_KILLS` (or `default_kills`).
fn seed_and_kills<T: std::str::FromStr>(default_kills: T) -> (u64, T) {
    let seed: u64 = std::env::var("REWIND_SEED").map_or_else(
        |_| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000,
        |seed| seed.parse().expect("REWIND_SEED is a number"),
    );
    let kills = std::env::var("REWIND_KILLS")
        .map_or(Some(default_kills), |kills| kills.parse().ok())
        .expect("REWIND_KILLS is a number");
    (seed, kills)
}

/// Numbers below a bound, from `seed`.
fn dice(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut random = seed;
    move |bound| {
        random = splitmix(random);
        random % bound
    }
}

/// Runs the CLI with `args` and `kill -9`s the server `delay_micros` after
/// it starts — a random moment from before its request reaches the server
/// until after it is done (the CLI takes a few ms to start) — then starts
/// the server again on the same data. Whether the CLI said it was done.
fn crash_during(server: &mut Server, args: &[String], delay_micros: u64) -> bool {
    let mut cli = Command::new(common::REWIND)
        .args(args)
        .args(["--server", &server.api()])
        .env("REWIND_TOKEN", &server.token)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rewind runs");
    thread::sleep(std::time::Duration::from_micros(delay_micros));
    server.kill();
    let done = cli.wait().expect("the CLI ends once the server is gone").success();
    *server = Server::start(&server.data_dir.clone());
    done
}

/// `kill -9` at a random moment during reverts, undos, clones, promotes and
/// restores: after the restart each is all or nothing — the live volume is
/// exactly as before the revert or exactly as the point it went to (and as
/// the point when the CLI said it was done), a clone is absent or reads
/// exactly as its source at the branch point, a promoted clone has its own
/// copy (when the CLI said so) or is still a clone with no copy left
/// behind, a restore the CLI said was done holds the view — and every
/// bookmarked state still reads as it was.
#[test]
fn reverts_clones_and_restores_are_all_or_nothing_under_kill_9() {
    let (seed, kills) = seed_and_kills(24);
    let layout = LAYOUTS[(seed % LAYOUTS.len() as u64) as usize];
    println!("seed {seed}, {kills} kills, layout {layout} (REWIND_SEED={seed} replays)");
    let mut next = dice(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let size = LINEAGE_BYTES.to_string();
    server.rewind(&["volume", "create", "vol", "--size", &size, "--layout", layout]);
    // The live volume as it must read, each bookmark `s<n>`'s state, and the
    // state before each revert that took effect (what `--undo` goes back to).
    let mut live = vec![0u8; LINEAGE_BYTES];
    let mut states: Vec<Vec<u8>> = Vec::new();
    let mut befores: Vec<Vec<u8>> = Vec::new();
    let mut clones: Vec<(String, usize)> = Vec::new();
    let mut promoted: Vec<String> = Vec::new();
    for round in 0..kills {
        // Writes, flushed, then a bookmark of the state they leave.
        let mut client = NbdClient::connect(server.nbd, "vol").expect("connect");
        for _ in 0..1 + next(12) {
            let offset = next((LINEAGE_BYTES / 4096) as u64) as usize * 4096;
            let bytes = pattern(next(u64::MAX), 4096 * (1 + next(4) as usize).min((LINEAGE_BYTES - offset) / 4096));
            client.write(offset as u64, &bytes).expect("write");
            live[offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        client.flush().expect("flush");
        client.disconnect().expect("disconnect");
        server.rewind(&["bookmark", "vol", &format!("s{round}")]);
        states.push(live.clone());

        let unpromoted: Vec<&String> =
            clones.iter().map(|(name, _)| name).filter(|name| !promoted.contains(*name)).collect();
        let operation = match next(5) {
            0 => Operation::Revert { to: next(states.len() as u64) as usize },
            1 if !befores.is_empty() => Operation::Undo,
            1 | 2 => Operation::Clone { at: next(states.len() as u64) as usize, name: format!("c{round}") },
            3 if !unpromoted.is_empty() => {
                Operation::Promote { name: unpromoted[next(unpromoted.len() as u64) as usize].clone() }
            }
            _ => Operation::Restore {
                at: next(states.len() as u64) as usize,
                file: dir.path().join(format!("r{round}.raw")),
            },
        };
        let args: Vec<String> = match &operation {
            Operation::Revert { to } => vec!["revert".into(), "vol".into(), "--to".into(), format!("s{to}")],
            Operation::Undo => vec!["revert".into(), "vol".into(), "--undo".into()],
            Operation::Clone { at, name } => vec!["volume".into(), "clone".into(), format!("vol@s{at}"), name.clone()],
            Operation::Restore { at, file } => {
                vec!["restore".into(), format!("vol@s{at}"), "--to".into(), file.to_str().unwrap().into()]
            }
            Operation::Promote { name } => vec!["volume".into(), "promote".into(), name.clone()],
        };
        let done = crash_during(&mut server, &args, next(25_000));

        let now = read_export(&server, "vol").expect("read the live volume");
        let what =
            format!("seed {seed} round {round}: {operation:?} (the CLI said {})", if done { "done" } else { "failed" });
        match &operation {
            Operation::Revert { to } => {
                settle_revert(&server, &what, done, &states[*to].clone(), &mut live, &mut befores, now.clone())
            }
            Operation::Undo => {
                let target = befores.last().unwrap().clone();
                settle_revert(&server, &what, done, &target, &mut live, &mut befores, now.clone())
            }
            Operation::Clone { at, name } => {
                let listed = json(&server.rewind(&["volume", "list", "--json"]));
                let exists = listed.as_array().unwrap().iter().any(|volume| volume["name"] == name.as_str());
                assert!(!done || exists, "{what}: the clone was acknowledged but is not there");
                if exists {
                    let clone = read_export(&server, name).expect("read the clone");
                    assert!(clone == states[*at], "{what}: the clone does not read as its source at the branch point");
                    clones.push((name.clone(), *at));
                }
            }
            Operation::Restore { at, file } => {
                if done {
                    let restored = std::fs::read(file).expect("a restore said done left its file");
                    assert!(restored == states[*at], "{what}: the restored file is not the view");
                }
            }
            Operation::Promote { name } => {
                let info = json(&server.rewind(&["volume", "info", name, "--json"]));
                let copied = info["base"]["copied"].as_bool().expect("a clone has a base");
                assert!(!done || copied, "{what}: the promote was acknowledged but the clone has no copy");
                let copy = data.join("volumes").join(name).join("base.img");
                assert_eq!(copy.exists(), copied, "{what}: a copy of the base is there exactly when promoted");
                if copied {
                    promoted.push(name.clone());
                }
            }
        }
        assert!(now == live, "{what}: the live volume is not as the model says");
        for (index, state) in states.iter().enumerate() {
            let view = read_export(&server, &format!("vol@s{index}")).expect("read a bookmark's view");
            assert!(view == *state, "{what}: bookmark s{index} no longer reads as it did");
        }
        for (name, at) in &clones {
            let clone = read_export(&server, name).expect("read a clone");
            assert!(clone == states[*at], "{what}: clone {name} changed");
        }
        println!("round {round}: {operation:?} {}", if done { "done" } else { "cut short" });
    }
    server.stop();
}

/// After a revert (or undo) to `target` that the crash left in place or
/// not: the volume's revert count says which, the live volume is exactly
/// the state before or `target` accordingly, and there is one exact
/// `before-revert-…` bookmark per revert that happened. The model follows.
fn settle_revert(
    server: &Server,
    what: &str,
    done: bool,
    target: &[u8],
    live: &mut Vec<u8>,
    befores: &mut Vec<Vec<u8>>,
    now: Vec<u8>,
) {
    let count = json(&server.rewind(&["volume", "info", "vol", "--json"]))["revert_count"].as_u64().unwrap() as usize;
    assert!(count == befores.len() || count == befores.len() + 1, "{what}: {count} reverts after {}", befores.len());
    let reverted = count > befores.len();
    assert!(!done || reverted, "{what}: the revert was acknowledged but is not there");
    if reverted {
        assert!(now == target, "{what}: the revert is recorded but the volume does not read as the point");
        befores.push(std::mem::replace(live, now));
    }
    let bookmarks = json(&server.rewind(&["bookmark", "list", "vol", "--json"]));
    let before_reverts: Vec<&str> = bookmarks
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|bookmark| bookmark["name"].as_str().filter(|name| name.starts_with("before-revert-")))
        .collect();
    assert_eq!(
        before_reverts.len(),
        befores.len(),
        "{what}: one before-revert bookmark per revert: {before_reverts:?}"
    );
    for (name, before) in before_reverts.iter().zip(befores.iter()) {
        let view = read_export(server, &format!("vol@{name}")).expect("read a before-revert view");
        assert!(view == *before, "{what}: {name} does not read as the state before that revert");
    }
}

/// `kill -9` at a random moment during group bookmarks and group reverts of
/// two volumes: after the restart a group bookmark is on both volumes or on
/// neither (and there when the CLI said so), reading as both were; a group
/// revert moved both volumes or neither; every group bookmark taken still
/// reads as it did.
#[test]
fn group_bookmarks_and_reverts_are_all_or_nothing_under_kill_9() {
    let (seed, kills) = seed_and_kills(20);
    let layouts = [LAYOUTS[(seed % 7) as usize], LAYOUTS[(seed / 7 % 7) as usize]];
    println!("seed {seed}, {kills} kills, layouts {layouts:?} (REWIND_SEED={seed} replays)");
    let mut next = dice(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let members = ["a", "b"];
    for (member, layout) in members.iter().zip(layouts) {
        server.rewind(&["volume", "create", member, "--size", &LINEAGE_BYTES.to_string(), "--layout", layout]);
    }
    server.rewind(&["group", "create", "g", "a", "b"]);
    // Each member's live state; the group bookmarks taken, with both states.
    let mut live = [vec![0u8; LINEAGE_BYTES], vec![0u8; LINEAGE_BYTES]];
    let mut taken: Vec<(String, [Vec<u8>; 2])> = Vec::new();
    let mut reverts = 0;
    for round in 0..kills {
        for (member, state) in members.iter().zip(live.iter_mut()) {
            let mut client = NbdClient::connect(server.nbd, member).expect("connect");
            for _ in 0..1 + next(6) {
                let offset = next((LINEAGE_BYTES / 4096) as u64) as usize * 4096;
                let bytes = pattern(next(u64::MAX), 4096);
                client.write(offset as u64, &bytes).expect("write");
                state[offset..offset + 4096].copy_from_slice(&bytes);
            }
            client.flush().expect("flush");
            client.disconnect().expect("disconnect");
        }
        let revert_to = (!taken.is_empty() && next(3) == 0).then(|| next(taken.len() as u64) as usize);
        let name = format!("g{round}");
        let args: Vec<String> = match revert_to {
            Some(index) => vec!["revert".into(), "g".into(), "--to".into(), taken[index].0.clone()],
            None => vec!["bookmark".into(), "g".into(), name.clone()],
        };
        let done = crash_during(&mut server, &args, next(25_000));
        let what =
            format!("seed {seed} round {round}: {args:?} (the CLI said {})", if done { "done" } else { "failed" });

        let now = members.map(|member| read_export(&server, member).expect("read a member"));
        let groups = json(&server.rewind(&["group", "list", "--json"]));
        assert_eq!(groups[0]["revert_unfinished"], false, "{what}: a group revert left unfinished after the restart");
        let outcome = match revert_to {
            None => {
                let recorded =
                    groups[0]["bookmarks"].as_array().unwrap().iter().any(|bookmark| bookmark["name"] == name.as_str());
                let on_members = members.map(|member| {
                    let bookmarks = json(&server.rewind(&["bookmark", "list", member, "--json"]));
                    bookmarks.as_array().unwrap().iter().any(|bookmark| bookmark["name"] == name.as_str())
                });
                assert!(!done || recorded, "{what}: the group bookmark was acknowledged but is not there");
                assert_eq!(on_members, [recorded; 2], "{what}: the group bookmark is on some members only");
                if recorded {
                    taken.push((name.clone(), live.clone()));
                }
                assert!(now == live, "{what}: a bookmark changed a member");
                if recorded {
                    "on both"
                } else {
                    "on neither"
                }
            }
            Some(index) => {
                let counts = members.map(|member| {
                    let info = json(&server.rewind(&["volume", "info", member, "--json"]));
                    info["revert_count"].as_u64().unwrap() as usize
                });
                assert!(counts[0] == counts[1], "{what}: one member reverted and not the other: {counts:?}");
                assert!(counts[0] == reverts || counts[0] == reverts + 1, "{what}: {counts:?} reverts after {reverts}");
                assert!(
                    !done || counts[0] == reverts + 1,
                    "{what}: the group revert was acknowledged but is not there"
                );
                let moved = counts[0] == reverts + 1;
                if moved {
                    reverts += 1;
                    live = taken[index].1.clone();
                }
                assert!(now == live, "{what}: the members are not as the group revert left them");
                if moved {
                    "both reverted"
                } else {
                    "neither reverted"
                }
            }
        };
        for (bookmark, states) in &taken {
            for (member, state) in members.iter().zip(states) {
                let view = read_export(&server, &format!("{member}@{bookmark}")).expect("read a group bookmark's view");
                assert!(view == *state, "{what}: {member}@{bookmark} no longer reads as it did");
            }
        }
        println!("round {round}: {args:?} {}: {outcome}", if done { "done" } else { "cut short" });
    }
    server.stop();
}
