//! Every layout through real NBD clients, with the same guarantees: an
//! image in and out (qemu-img), patterns, discards and unaligned writes
//! (qemu-io), fio with verification, a view at a bookmark, and the lot
//! again after `kill -9`. Per layout the device I/O shows where writes went.

mod common;

use std::fs;

use common::{json, pattern, require, run, wait_for, Server};

fn fio(uri: &str, extra: &[&str]) -> String {
    let uri = format!("--uri={uri}");
    let mut args =
        vec!["--name=verify", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=16M", "--iodepth=8", &uri];
    args.extend_from_slice(extra);
    run("fio", &args)
}

fn exercise(layout: &str, create: &[&str]) {
    for tool in ["qemu-img", "qemu-io", "fio"] {
        require(tool);
    }
    println!("layout {layout}");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let mut args = vec!["volume", "create", "v", "--size", "32MiB", "--layout", layout, "--json"];
    args.extend_from_slice(create);
    let info = json(&server.rewind(&args));
    assert_eq!(info["layout"], layout);

    let image = dir.path().join("image.raw");
    let mut bytes = pattern(3, 32 << 20);
    bytes[8 << 20..12 << 20].fill(0);
    fs::write(&image, &bytes).unwrap();
    let image = image.to_str().unwrap();
    run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", image, &server.uri("v")]);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri("v")]);
    server.rewind(&["bookmark", "v", "imaged"]);

    let uri = server.uri("v");
    let patterns = [
        "write -P 0x11 1M 1M",
        "write -P 0x22 513 1000",
        "write -z 4M 64k",
        "discard 20M 1M",
        "write -f -P 0x33 200k 8k",
        "flush",
    ];
    let mut qemu_io = vec!["-f", "raw"];
    for command in &patterns {
        qemu_io.extend(["-c", command]);
    }
    qemu_io.push(&uri);
    run("qemu-io", &qemu_io);
    let reads =
        ["read -P 0x11 1M 1M", "read -P 0x22 513 1000", "read -P 0 4M 64k", "read -P 0 20M 1M", "read -P 0x33 200k 8k"];
    let mut qemu_io = vec!["-f", "raw"];
    for command in &reads {
        qemu_io.extend(["-c", command]);
    }
    qemu_io.push(&uri);
    run("qemu-io", &qemu_io);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri("v@imaged")]);

    // The layouts that copy a block out at its first overwrite after a
    // snapshot read it from the current store, or from the journal while
    // it is not destaged yet: with everything destaged first, fio's
    // overwrites of the imaged blocks are copied from the current store.
    let copies_out = layout == "cow" || layout == "checkpointing";
    let destaged = || {
        let info = json(&server.rewind(&["volume", "info", "v", "--json"]));
        info["stats"]["versions_pending_destage"].as_u64() == Some(0)
    };
    let current_read_bytes =
        || json(&server.rewind(&["stats", "v", "--json"]))["io"]["current"]["read_bytes"].as_u64().unwrap();
    if copies_out {
        wait_for("the image and the patterns to be destaged", destaged);
    }
    let read_before = current_read_bytes();
    fio(&uri, &["--verify=crc32c", "--randseed=42", "--fsync=8"]);
    if copies_out {
        wait_for("fio's writes to be destaged", destaged);
    }
    let copied_out = current_read_bytes() - read_before;
    println!("{layout}: {copied_out} bytes read from the current store around fio");
    fio(&uri, &["--verify=crc32c", "--randseed=42", "--verify_only"]);
    let stats = json(&server.rewind(&["stats", "v", "--json"]));
    println!("{layout}: {}", stats["io"]);
    if layout == "logging" {
        assert_eq!(stats["io"]["current"]["writes"], 0, "logging has no current store: {stats}");
        assert_eq!(stats["current_bytes"], 0);
    }
    if copies_out {
        // fio overwrote the first 16 MiB after the snapshot at `imaged`: the
        // imaged blocks there that qemu-io had not overwritten since (0–8
        // MiB but for about 1.1 MiB of patterns, and 12–16 MiB; 8–12 MiB
        // are zeros, copied as such) were each copied out first.
        assert!(copied_out >= 10 << 20, "{copied_out} bytes copied out of the current store: {stats}");
    }

    server.kill();
    let server = Server::start(&data);
    fio(&server.uri("v"), &["--verify=crc32c", "--randseed=42", "--verify_only"]);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri("v@imaged")]);
    let info = json(&server.rewind(&["volume", "info", "v", "--json"]));
    assert_eq!(info["layout"], layout, "{info}");
}

#[test]
fn journaled_through_real_clients() {
    exercise("journaled", &[]);
}

#[test]
fn logging_through_real_clients() {
    exercise("logging", &[]);
}

#[test]
fn split_stream_through_real_clients() {
    exercise("split-stream", &["--cache", "16MiB", "--granularity", "2s"]);
}

#[test]
fn split_down_stream_through_real_clients() {
    exercise("split-down-stream", &["--cache", "16MiB"]);
}

#[test]
fn checkpointing_through_real_clients() {
    exercise("checkpointing", &["--cache", "16MiB", "--granularity", "2s"]);
}

#[test]
fn cow_through_real_clients() {
    exercise("cow", &["--snap-block", "8KiB", "--granularity", "2s"]);
}

#[test]
fn row_through_real_clients() {
    // Snapshots (merges) every 2 s: the test runs across several.
    exercise("row", &["--snap-block", "16KiB", "--granularity", "2s"]);
}

#[test]
fn snap_block_belongs_to_snapshot_layouts_and_layouts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let output = server.rewind_output(&[
        "volume",
        "create",
        "a",
        "--size",
        "1MiB",
        "--layout",
        "logging",
        "--snap-block",
        "16KiB",
    ]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && error.contains("--snap-block"), "{error}");
    let output =
        server.rewind_output(&["volume", "create", "a", "--size", "1MiB", "--layout", "row", "--cache", "1MiB"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && error.contains("split-stream, split-down-stream"), "{error}");
    let output = server.rewind_output(&["volume", "create", "a", "--size", "1MiB", "--layout", "lvm"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && error.contains("unknown layout \"lvm\"") && error.contains("row"), "{error}");
    let info = json(&server.rewind(&[
        "volume",
        "create",
        "s",
        "--size",
        "1MiB",
        "--layout",
        "row",
        "--snap-block",
        "16KiB",
        "--json",
    ]));
    assert_eq!((info["layout"].as_str(), info["block_size"].as_u64()), (Some("row"), Some(16384)));
}
