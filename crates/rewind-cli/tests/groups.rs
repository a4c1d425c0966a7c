//! Consistency groups with real clients. A group bookmark is one instant
//! across its volumes: a writer that writes record n to `db`, waits for the
//! acknowledgement, then writes record n to `logs`, never finds `logs` ahead
//! of `db` at a group bookmark (bookmarks taken one volume after the other
//! would let it be). A group reverts every member or none, and is undone;
//! a group cloned at a group bookmark is a new group of clones at that
//! instant; a member's share of a group bookmark goes only with the
//! group's; groups and volumes do not share names; all of it survives a
//! restart.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::nbd_client::NbdClient;
use common::{json, wait_for, Server};

const RECORD: usize = 4096;
const RECORDS: u64 = 256;

/// Record `n` goes to block `n % RECORDS`, holding `n`.
fn record(n: u64) -> Vec<u8> {
    let mut bytes = vec![0; RECORD];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    bytes
}

/// The newest record in a view of one volume.
fn newest(server: &Server, export: &str) -> u64 {
    let mut client = NbdClient::connect(server.nbd, export).expect("connect to a view");
    let mut bytes = vec![0; RECORD * RECORDS as usize];
    client.read(0, &mut bytes).expect("read the view");
    client.disconnect().expect("disconnect");
    bytes.chunks_exact(RECORD).map(|block| u64::from_le_bytes(block[..8].try_into().unwrap())).max().unwrap()
}

#[test]
fn a_group_bookmark_is_one_instant_and_a_group_reverts_together() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let size = (RECORD as u64 * RECORDS).to_string();
    for volume in ["db", "logs", "other"] {
        server.rewind(&["volume", "create", volume, "--size", &size]);
    }
    let group = json(&server.rewind(&["group", "create", "shop", "db", "logs", "--json"]));
    assert_eq!(group["members"], serde_json::json!(["db", "logs"]), "{group}");
    let error = server.rewind_failing(&["volume", "create", "shop", "--size", "1MiB"]);
    assert!(error.contains("a group is named shop"), "{error}");
    let error = server.rewind_failing(&["group", "create", "db", "other"]);
    assert!(error.contains("a volume is named db"), "{error}");
    let error = server.rewind_failing(&["group", "create", "two", "logs"]);
    assert!(error.contains("in group shop already"), "{error}");

    // The writer: record n to db, acknowledged, then record n to logs.
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, stop, nbd) = (Arc::clone(&written), Arc::clone(&stop), server.nbd);
        std::thread::spawn(move || {
            let mut db = NbdClient::connect(nbd, "db").expect("connect to db");
            let mut logs = NbdClient::connect(nbd, "logs").expect("connect to logs");
            for n in 1.. {
                let offset = (n % RECORDS) * RECORD as u64;
                db.write(offset, &record(n)).expect("write db");
                logs.write(offset, &record(n)).expect("write logs");
                written.store(n, Ordering::Release);
                if stop.load(Ordering::Acquire) {
                    break;
                }
            }
        })
    };
    let mut cuts = Vec::new();
    for round in 0..12 {
        let target = written.load(Ordering::Acquire) + 50;
        wait_for("the writer to write", || written.load(Ordering::Acquire) >= target);
        let name = format!("cut-{round}");
        let taken = json(&server.rewind(&["bookmark", "shop", &name, "--json"]));
        let exports: Vec<&str> =
            taken["members"].as_array().unwrap().iter().map(|member| member["export"].as_str().unwrap()).collect();
        assert_eq!(exports, [format!("db@{name}"), format!("logs@{name}")], "{taken}");
        cuts.push((name, written.load(Ordering::Acquire)));
    }
    stop.store(true, Ordering::Release);
    writer.join().expect("the writer");
    for (name, acknowledged_after) in &cuts {
        let (db, logs) = (newest(&server, &format!("db@{name}")), newest(&server, &format!("logs@{name}")));
        // logs holds n only after db acknowledged n; db is at most one ahead.
        assert!(logs <= db && db <= logs + 1, "{name}: db at {db}, logs at {logs}: not one instant");
        assert!(db <= *acknowledged_after + 1, "{name}: db at {db}, later than the bookmark");
    }
    let listed = server.rewind(&["bookmark", "list", "shop"]);
    assert!(listed.contains("cut-0:") && listed.contains("db@cut-0") && listed.contains("logs@cut-11"), "{listed}");
    let error = server.rewind_failing(&["bookmark", "delete", "db", "cut-0"]);
    assert!(error.contains("group shop's bookmark cut-0"), "{error}");

    // Revert: every member to the cut; undo: every member back.
    let (first, _) = &cuts[0];
    let (db_then, logs_then) = (newest(&server, &format!("db@{first}")), newest(&server, &format!("logs@{first}")));
    let (db_now, logs_now) = (newest(&server, "db"), newest(&server, "logs"));
    let summary = json(&server.rewind(&["revert", "shop", "--to", first, "--json"]));
    assert_eq!(summary["members"].as_array().unwrap().len(), 2, "{summary}");
    assert_eq!((newest(&server, "db"), newest(&server, "logs")), (db_then, logs_then));
    server.rewind(&["revert", "shop", "--undo"]);
    assert_eq!((newest(&server, "db"), newest(&server, "logs")), (db_now, logs_now));

    // All or none: with a writer on one member, neither is reverted.
    let mut holding = NbdClient::connect(server.nbd, "logs").unwrap();
    let error = server.rewind_failing(&["revert", "shop", "--to", first]);
    assert!(error.contains("volume logs is open for writing"), "{error}");
    assert_eq!((newest(&server, "db"), newest(&server, "logs")), (db_now, logs_now), "nothing reverted");
    holding.read(0, &mut [0; 512]).unwrap();
    holding.disconnect().unwrap();

    // A clone of the group at a cut: a new group of writable clones, each
    // at its volume's point of that instant.
    let (cut, _) = &cuts[3];
    let clones = json(&server.rewind(&["volume", "clone", &format!("shop@{cut}"), "dbg", "--json"]));
    assert_eq!(clones["members"], serde_json::json!(["dbg-db", "dbg-logs"]), "{clones}");
    for volume in ["db", "logs"] {
        let clone = format!("dbg-{volume}");
        assert_eq!(newest(&server, &clone), newest(&server, &format!("{volume}@{cut}")), "{clone} starts at the cut");
    }
    let mut writer = NbdClient::connect(server.nbd, "dbg-db").unwrap();
    writer.write(0, &record(1 << 40)).unwrap();
    writer.disconnect().unwrap();
    assert_eq!(newest(&server, "dbg-db"), 1 << 40);
    assert!(newest(&server, "db") < 1 << 40, "the origin does not see the clone's writes");
    let error = server.rewind_failing(&["volume", "clone", "shop", "dbg2"]);
    assert!(error.contains("cloned at one of its bookmarks"), "{error}");
    let error = server.rewind_failing(&["volume", "clone", &format!("shop@{cut}"), "dbg"]);
    assert!(error.contains("dbg-db") && error.contains("already exists"), "{error}");
    server.rewind(&["group", "delete", "dbg"]);
    for clone in ["dbg-db", "dbg-logs"] {
        server.rewind(&["volume", "delete", clone, "--yes"]);
    }

    // Membership, and the same after a restart.
    server.rewind(&["group", "add", "shop", "other"]);
    let error = server.rewind_failing(&["revert", "shop", "--to", first]);
    assert!(error.contains("before other joined group shop"), "{error}");
    server.rewind(&["group", "remove", "shop", "other"]);
    server.stop();
    let server = Server::start(&data);
    let groups = json(&server.rewind(&["group", "list", "--json"]));
    assert_eq!(groups[0]["members"], serde_json::json!(["db", "logs"]), "{groups}");
    assert_eq!(groups[0]["bookmarks"].as_array().unwrap().len(), cuts.len(), "{groups}");
    server.rewind(&["bookmark", "delete", "shop", "cut-0"]);
    let bookmarks = json(&server.rewind(&["bookmark", "list", "db", "--json"]));
    assert!(!bookmarks.as_array().unwrap().iter().any(|bookmark| bookmark["name"] == "cut-0"), "{bookmarks}");
    server.rewind(&["volume", "delete", "logs", "--yes"]);
    let groups = json(&server.rewind(&["group", "list", "--json"]));
    assert_eq!(groups[0]["members"], serde_json::json!(["db"]), "a deleted volume leaves its group: {groups}");
    server.rewind(&["group", "delete", "shop"]);
    assert!(server.rewind(&["bookmark", "list", "db"]).contains("cut-1"), "the members keep their bookmarks");
}

/// The node's `groups` file damaged: in one copy it is healed from the
/// other; in both, the server still serves every volume and says what is
/// wrong with the groups.
#[test]
fn a_damaged_groups_file_takes_out_only_the_groups() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    for volume in ["db", "logs"] {
        server.rewind(&["volume", "create", volume, "--size", "1MiB"]);
    }
    server.rewind(&["group", "create", "shop", "db", "logs"]);
    server.rewind(&["bookmark", "shop", "first"]);
    server.stop();
    let path = data.join("groups");
    let intact = std::fs::read(&path).unwrap();
    // A byte of the first copy's payload: healed from the second.
    let mut damaged = intact.clone();
    damaged[20] ^= 0x40;
    std::fs::write(&path, &damaged).unwrap();
    let mut server = Server::start(&data);
    let groups = json(&server.rewind(&["group", "list", "--json"]));
    assert_eq!(groups[0]["bookmarks"][0]["name"], "first", "{groups}");
    server.stop();
    assert_eq!(std::fs::read(&path).unwrap(), intact, "the damaged copy is rewritten");
    // The same byte in both copies: groups refused, volumes served.
    damaged[intact.len() / 2 + 20] ^= 0x40;
    std::fs::write(&path, &damaged).unwrap();
    let server = Server::start(&data);
    let error = server.rewind_failing(&["group", "list"]);
    assert!(error.contains("groups file is damaged"), "{error}");
    let mut client = NbdClient::connect(server.nbd, "db").expect("the volumes are served");
    client.write(0, &record(7)).unwrap();
    client.disconnect().unwrap();
    assert!(server.rewind(&["bookmark", "list", "db"]).contains("first"), "a member's own bookmarks stay");
}
