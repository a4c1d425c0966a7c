//! Writable clones and reverts in place with real clients. `rewind volume
//! clone db@first dbg` reads exactly as the view it starts from (`qemu-img
//! compare` over NBD), shows the source's allocation where it has not
//! written (`qemu-img map`), takes writes that the source never sees, can
//! itself be cloned, and survives `kill -9`; a volume with clones is not
//! deleted unless asked to delete them too; the same offline. `rewind
//! volume promote` gives a clone its own copy of its base, after which the
//! base can be deleted and the clone, its views and its clones read as
//! before (through `kill -9`, and offline too). `rewind
//! revert` refuses connected writers unless told to cut them off (closing
//! their connections), leaves
//! views alone, and is undone by `--undo`; bad points are refused.

mod common;

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::nbd_client::NbdClient;
use common::{json, require, run, wait_for, Server, REWIND};

/// The allocated (data) ranges `qemu-img map` reports for an export.
fn data_ranges(uri: &str) -> Vec<(u64, u64)> {
    let map = json(&run("qemu-img", &["map", "-f", "raw", "--output=json", uri]));
    let extents = map.as_array().expect("a list of extents");
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for extent in extents.iter().filter(|extent| extent["data"] == true) {
        let (start, length) = (extent["start"].as_u64().unwrap(), extent["length"].as_u64().unwrap());
        match ranges.last_mut() {
            Some((last_start, last_length)) if *last_start + *last_length == start => *last_length += length,
            _ => ranges.push((start, length)),
        }
    }
    ranges
}

#[test]
fn a_clone_starts_as_its_source_was_and_goes_its_own_way() {
    require("qemu-io");
    require("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "db", "--size", "64MiB"]);
    let db = server.uri("db");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4M", &db]);
    server.rewind(&["bookmark", "db", "first"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x22 1M 1M", "-c", "write -P 0x23 40M 1M", &db]);

    // A clone of the bookmark: the view's bytes and allocation.
    let clone = json(&server.rewind(&["volume", "clone", "db@first", "dbg", "--json"]));
    assert_eq!(clone["base"]["volume"], "db", "{clone}");
    assert_eq!(clone["size_bytes"], 64 << 20);
    let dbg = server.uri("dbg");
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &dbg, &server.uri("db@first")]);
    assert_eq!(data_ranges(&dbg), vec![(0, 4 << 20)], "the base's allocation shows through");

    // Its writes are its own; the source is unaffected.
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x33 2M 64k", "-c", "write -P 0x34 60M 64k", &dbg]);
    run("qemu-io", &["-f", "raw", "-c", "read -P 0x33 2M 64k", "-c", "read -P 0x11 1M 64k", &dbg]);
    run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x11 2M 64k", "-c", "read -P 0x22 1M 64k", "-c", "read -P 0 60M 64k", &db],
    );
    assert_eq!(data_ranges(&dbg), vec![(0, 4 << 20), (60 << 20, 64 << 10)]);
    let info = server.rewind(&["volume", "info", "dbg"]);
    assert!(info.contains("clone of        db as of"), "{info}");

    // A clone of the clone, now; then the first clone moves on.
    server.rewind(&["volume", "clone", "dbg", "dbg2"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x44 0 64k", &dbg]);
    let dbg2 = server.uri("dbg2");
    run("qemu-io", &["-f", "raw", "-c", "read -P 0x11 0 64k", "-c", "read -P 0x33 2M 64k", &dbg2]);
    // Views of a clone are views like any other.
    server.rewind(&["bookmark", "dbg", "mine"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x55 0 64k", &dbg]);
    run("qemu-io", &["-r", "-f", "raw", "-c", "read -P 0x44 0 64k", &server.uri("dbg@mine")]);

    // Bad requests change nothing.
    let error = server.rewind_failing(&["volume", "clone", "db@first", "dbg"]);
    assert!(error.contains("already exists"), "{error}");
    let error = server.rewind_failing(&["volume", "clone", "db@2001-01-01T00:00:00Z", "old"]);
    assert!(error.contains("before"), "{error}");
    let error = server.rewind_failing(&["volume", "clone", "nosuch@-1s", "x"]);
    assert!(error.contains("nosuch"), "{error}");

    // After kill -9 every clone reads as before.
    server.kill();
    let mut server = Server::start(&data);
    let (dbg, dbg2) = (server.uri("dbg"), server.uri("dbg2"));
    run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x55 0 64k", "-c", "read -P 0x33 2M 64k", "-c", "read -P 0x11 3M 64k", &dbg],
    );
    run("qemu-io", &["-f", "raw", "-c", "read -P 0x11 0 64k", "-c", "read -P 0x34 60M 64k", &dbg2]);
    let mine = server.uri("dbg@mine");
    run("qemu-io", &["-r", "-f", "raw", "-c", "read -P 0x44 0 64k", "-c", "read -P 0x33 2M 64k", &mine]);

    // A base is not deleted from under its clones.
    let error = server.rewind_failing(&["volume", "delete", "db", "--yes"]);
    assert!(error.contains("has a clone that reads from it: dbg") && error.contains("--with-clones"), "{error}");
    let error = server.rewind_failing(&["volume", "delete", "dbg", "--yes"]);
    assert!(error.contains("dbg2"), "{error}");
    server.rewind(&["volume", "delete", "dbg2", "--yes"]);
    server.stop();

    // Offline: a clone, and a delete with the clones.
    let data = data.to_str().unwrap();
    let offline = |args: &[&str]| run(REWIND, &[&["--offline", "--data-dir", data], args].concat());
    let clone = json(&offline(&["volume", "clone", "db", "db-now", "--json"]));
    assert_eq!(clone["base"]["volume"], "db", "{clone}");
    offline(&["volume", "delete", "db", "--yes", "--with-clones"]);
    let left = json(&offline(&["volume", "list", "--json"]));
    assert_eq!(left.as_array().unwrap().len(), 0, "{left}");
}

#[test]
fn a_promoted_clone_reads_as_before_when_its_base_is_gone() {
    require("qemu-io");
    require("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "db", "--size", "64MiB"]);
    let db = server.uri("db");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4M", "-c", "write -P 0x12 32M 1M", &db]);
    server.rewind(&["bookmark", "db", "first"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x22 1M 1M", &db]);
    server.rewind(&["volume", "clone", "db@first", "dbg"]);
    let dbg = server.uri("dbg");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x33 2M 64k", &dbg]);
    server.rewind(&["bookmark", "dbg", "mine"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x44 0 64k", "-c", "write -P 0x45 60M 64k", &dbg]);
    server.rewind(&["volume", "clone", "dbg", "dbg2"]);
    // What each must keep reading: the clone, its view, its clone.
    let saved = |export: &str, file: &str| {
        let path = dir.path().join(file);
        run("qemu-img", &["convert", "-f", "raw", "-O", "raw", &server.uri(export), path.to_str().unwrap()]);
        path.to_str().unwrap().to_owned()
    };
    let (dbg_raw, mine_raw, dbg2_raw) =
        (saved("dbg", "dbg.raw"), saved("dbg@mine", "mine.raw"), saved("dbg2", "dbg2.raw"));
    let map_before = data_ranges(&dbg);

    let error = server.rewind_failing(&["volume", "promote", "db"]);
    assert!(error.contains("not a clone"), "{error}");
    let promoted = json(&server.rewind(&["volume", "promote", "dbg", "--json"]));
    assert_eq!(promoted["base"]["volume"], "db", "{promoted}");
    assert_eq!(promoted["base"]["copied"], true, "{promoted}");
    assert_eq!(promoted["bytes_copied"], 5 << 20, "what db@first holds: 4 MiB and 1 MiB");
    let error = server.rewind_failing(&["volume", "promote", "dbg"]);
    assert!(error.contains("promoted already"), "{error}");
    let info = server.rewind(&["volume", "info", "dbg"]);
    assert!(info.contains("clone of        db as of") && info.contains("promoted"), "{info}");

    // The base goes; the clone, its view and its clone do not change.
    server.rewind(&["volume", "delete", "db", "--yes"]);
    let check = |server: &Server| {
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg"), &dbg_raw]);
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg@mine"), &mine_raw]);
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg2"), &dbg2_raw]);
        assert_eq!(data_ranges(&server.uri("dbg")), map_before, "allocation as before");
    };
    check(&server);
    // It takes writes as before; its copy is never written.
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x55 3M 64k", &server.uri("dbg")]);
    run("qemu-io", &["-f", "raw", "-c", "read -P 0x55 3M 64k", "-c", "read -P 0x11 3200k 64k", &server.uri("dbg")]);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg@mine"), &mine_raw]);
    let dbg_raw = saved("dbg", "dbg-after.raw");

    // After kill -9, the same.
    server.kill();
    let mut server = Server::start(&data);
    let check = |server: &Server| {
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg"), &dbg_raw]);
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg@mine"), &mine_raw]);
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg2"), &dbg2_raw]);
    };
    check(&server);
    server.stop();

    // Offline: the clone of the clone is promoted, and the clone can go.
    let data_dir = data.to_str().unwrap();
    let offline = |args: &[&str]| run(REWIND, &[&["--offline", "--data-dir", data_dir], args].concat());
    let promoted = json(&offline(&["volume", "promote", "dbg2", "--json"]));
    assert_eq!(promoted["base"]["volume"], "dbg", "{promoted}");
    offline(&["volume", "delete", "dbg", "--yes"]);
    let mut server = Server::start(&data);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &server.uri("dbg2"), &dbg2_raw]);
    server.stop();
}

/// A promote copies in the background: a client keeps writing to the
/// clone while it runs (some writes are acknowledged between the promote's
/// start and its end), and afterwards — after its base is deleted and
/// after `kill -9` — the clone holds exactly those writes over its base.
#[test]
fn a_clone_takes_writes_while_it_is_promoted() {
    require("qemu-io");
    const SIZE: usize = 256 << 20;
    const WRITE: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "db", "--size", "256MiB"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 256M", &server.uri("db")]);
    server.rewind(&["volume", "clone", "db", "dbg"]);

    let stop = Arc::new(AtomicBool::new(false));
    let (started, first_write) = mpsc::channel();
    let writer = {
        let (address, stop) = (server.nbd, Arc::clone(&stop));
        thread::spawn(move || {
            let mut client = NbdClient::connect(address, "dbg").expect("connect");
            let mut acknowledged = Vec::new();
            for seed in 1.. {
                let offset = (common::pattern(seed, 8).iter().map(|&byte| byte as usize).sum::<usize>() * 997
                    + seed as usize * 7919)
                    % (SIZE / WRITE)
                    * WRITE;
                let bytes = common::pattern(seed, WRITE);
                client.write(offset as u64, &bytes).expect("a write while the clone is promoted");
                acknowledged.push((Instant::now(), offset, bytes));
                if seed == 1 {
                    started.send(()).unwrap();
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            client.flush().expect("flush");
            client.disconnect().expect("disconnect");
            acknowledged
        })
    };
    first_write.recv().expect("the writer started");
    let promote_started = Instant::now();
    let promoted = json(&server.rewind(&["volume", "promote", "dbg", "--json"]));
    let promote_ended = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let acknowledged = writer.join().expect("the writer");
    assert_eq!(promoted["bytes_copied"], SIZE, "{promoted}");
    let during = acknowledged.iter().filter(|(at, _, _)| (promote_started..promote_ended).contains(at)).count();
    assert!(during > 0, "no write was acknowledged while the promote ran ({} in all)", acknowledged.len());
    println!("{during} of {} writes acknowledged while the promote ran", acknowledged.len());

    let mut expected = vec![0x11u8; SIZE];
    for (_, offset, bytes) in &acknowledged {
        expected[*offset..offset + WRITE].copy_from_slice(bytes);
    }
    let read_all = |server: &Server| {
        let mut client = NbdClient::connect(server.nbd, "dbg").expect("connect");
        let mut image = vec![0u8; SIZE];
        for (index, piece) in image.chunks_mut(32 << 20).enumerate() {
            client.read((index * (32 << 20)) as u64, piece).expect("read");
        }
        client.disconnect().expect("disconnect");
        image
    };
    assert!(read_all(&server) == expected, "the clone holds the writes over its base");
    server.rewind(&["volume", "delete", "db", "--yes"]);
    server.kill();
    let mut server = Server::start(&data);
    assert!(read_all(&server) == expected, "after the base is gone and a kill -9");
    server.stop();
}

#[test]
fn a_revert_cuts_off_connected_writers_only_when_told_to() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "db", "--size", "8MiB"]);
    let mut writer = NbdClient::connect(server.nbd, "db").unwrap();
    writer.write(0, &[1; 4096]).unwrap();
    writer.flush().unwrap();
    server.rewind(&["bookmark", "db", "one"]);
    writer.write(0, &[2; 4096]).unwrap();
    writer.flush().unwrap();
    let mut view = NbdClient::connect(server.nbd, "db@one").unwrap();

    let error = server.rewind_failing(&["revert", "db", "--to", "one"]);
    assert!(error.contains("open for writing by a client: nbd") && error.contains("--disconnect"), "{error}");
    let summary = json(&server.rewind(&["revert", "db", "--to", "one", "--disconnect", "--json"]));
    assert_eq!(summary["disconnected"].as_array().unwrap().len(), 1, "{summary}");
    // The server closed the writer's connection (the read's deadline only
    // bounds a failure).
    let stream = writer.raw_stream();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(stream.read(&mut [0; 1]).unwrap(), 0, "the cut-off writer's connection is closed");
    let mut block = [0; 4096];
    view.read(0, &mut block).unwrap();
    assert_eq!(block, [1; 4096], "a view is not cut off");
    let mut again = NbdClient::connect(server.nbd, "db").unwrap();
    again.read(0, &mut block).unwrap();
    assert_eq!(block, [1; 4096], "the volume reads as it did at the bookmark");
    let timeline = json(&server.rewind(&["timeline", "db", "--json"]));
    assert_eq!(timeline["reverts"].as_array().unwrap().len(), 1, "{timeline}");
    let info = server.rewind(&["volume", "info", "db"]);
    assert!(info.contains("reverted        once, last at") && info.contains("--undo"), "{info}");
    // The state before it stays while the revert does, and so does its name.
    let before = summary["bookmark"].as_str().unwrap();
    let error = server.rewind_failing(&["bookmark", "delete", "db", before]);
    assert!(error.contains("the state just before the revert") && error.contains("kept"), "{error}");

    // Undo, once the writer is gone: the state before the revert.
    again.disconnect().unwrap();
    drop(writer);
    wait_for("the writers to disconnect", || server.rewind_output(&["revert", "db", "--undo"]).status.success());
    run("qemu-io", &["-f", "raw", "-c", "read -P 2 0 4k", &server.uri("db")]);

    // Points that cannot be reverted to, with the reasons views give.
    let error = server.rewind_failing(&["revert", "db", "--to", "2001-01-01T00:00:00Z"]);
    assert!(error.contains("before"), "{error}");
    let error = server.rewind_failing(&["revert", "db", "--to", "2099-01-01T00:00:00Z"]);
    assert!(error.contains("future"), "{error}");
    let error = server.rewind_failing(&["revert", "db", "--to", "no-such-bookmark"]);
    assert!(error.contains("no-such-bookmark"), "{error}");
    server.rewind(&["volume", "create", "fresh", "--size", "1MiB"]);
    let error = server.rewind_failing(&["revert", "fresh", "--undo"]);
    assert!(error.contains("nothing to undo"), "{error}");
    server.stop();

    // Offline, after a restart: the revert and its undo are on the timeline.
    let data = data.to_str().unwrap();
    let timeline = json(&run(REWIND, &["--offline", "--data-dir", data, "timeline", "db", "--json"]));
    assert_eq!(timeline["reverts"].as_array().unwrap().len(), 2, "{timeline}");
}
