//! `rewind restore` with real clients: a full restore is sparse and reads
//! back identical to the view (`qemu-img compare` over NBD); `--since`
//! writes exactly the changed bytes onto an older restored copy and gives
//! the same bytes; a block device gets every byte (zeros over the holes);
//! the target is protected (no overwrite without
//! `--force`, not inside the data directory, not too small); offline too.

mod common;

use common::{json, require, run, Server, REWIND};

/// A loop device, detached when dropped (also when a check fails).
struct LoopDevice(String);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn restore_writes_the_view_sparsely_and_since_moves_only_the_changes() {
    require("qemu-io");
    require("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let path = |name: &str| out.join(name).to_str().unwrap().to_owned();
    let mut server = Server::start(&data);
    server.rewind(&["volume", "create", "db", "--size", "64MiB"]);
    let uri = server.uri("db");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4M", "-c", "write -P 0x12 32M 1M", &uri]);
    server.rewind(&["bookmark", "db", "first"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x21 1M 64k", "-c", "write -P 0x22 40M 2M", &uri]);
    run("qemu-io", &["-f", "raw", "-c", "write -z -u 32M 512k", &uri]);
    server.rewind(&["bookmark", "db", "second"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x31 0 8M", &uri]);

    // A full restore of the first point: identical, and sparse.
    let first = json(&server.rewind(&["restore", "db@first", "--to", &path("first.raw"), "--json"]));
    assert_eq!(first["bytes_moved"], 5 << 20, "{first}");
    assert_eq!(first["size_bytes"], 64 << 20);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &path("first.raw"), &server.uri("db@first")]);
    let metadata = std::fs::metadata(path("first.raw")).unwrap();
    assert_eq!(metadata.len(), 64 << 20);
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&metadata) * 512 <= 6 << 20,
        "the holes stay holes: {} bytes allocated",
        std::os::unix::fs::MetadataExt::blocks(&metadata) * 512
    );

    // The target is protected.
    let error = server.rewind_failing(&["restore", "db@first", "--to", &path("first.raw")]);
    assert!(error.contains("exists; pass --force"), "{error}");
    let inside = data.join("volumes").join("restored.raw");
    let error = server.rewind_failing(&["restore", "db@first", "--to", inside.to_str().unwrap()]);
    assert!(error.contains("inside the data directory"), "{error}");
    let error = server.rewind_failing(&["restore", "db@second", "--to", &path("missing.raw"), "--since", "first"]);
    assert!(error.contains("does not exist"), "{error}");
    std::fs::write(path("small.raw"), vec![0; 1 << 20]).unwrap();
    let error = server.rewind_failing(&["restore", "db@second", "--to", &path("small.raw"), "--since", "first"]);
    assert!(error.contains("too small"), "{error}");
    assert_eq!(std::fs::metadata(path("small.raw")).unwrap().len(), 1 << 20, "nothing written");
    let error = server.rewind_failing(&["restore", "db", "--to", &path("x.raw")]);
    assert!(error.contains("is not VOLUME@TIME"), "{error}");

    // --since: only the changes, onto a copy of the first point.
    std::fs::copy(path("first.raw"), path("second.raw")).unwrap();
    let changes = json(&server.rewind(&["diff", "db@first", "db@second", "--json"]));
    let since =
        json(&server.rewind(&["restore", "db@second", "--to", &path("second.raw"), "--since", "first", "--json"]));
    assert_eq!(since["bytes_moved"], changes["changed_bytes"], "{since}\n{changes}");
    assert_eq!(since["bytes_moved"], (64 << 10) + (2 << 20) + (512 << 10));
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &path("second.raw"), &server.uri("db@second")]);

    // A block device (a loop device over a file of garbage): every byte
    // written, the holes as zeros, the writes going back as they are made.
    require("losetup");
    std::fs::write(path("device.img"), vec![0xaa; 64 << 20]).unwrap();
    let device = LoopDevice(run("losetup", &["--find", "--show", &path("device.img")]).trim().to_owned());
    let restored = json(&server.rewind(&["restore", "db@first", "--to", &device.0, "--force", "--json"]));
    assert_eq!(restored["block_device"], true, "{restored}");
    assert_eq!(restored["bytes_moved"], 5 << 20, "{restored}");
    assert_eq!(restored["bytes_zeroed"], 59 << 20, "{restored}");
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &device.0, &server.uri("db@first")]);
    drop(device);

    // --force over an existing file: the whole present, then offline.
    let text = server.rewind(&["restore", "db@first", "--to", &path("first.raw"), "--force", "--progress"]);
    assert!(text.contains("restored db@") && text.contains("synced"), "{text}");
    server.stop();
    let data = data.to_str().unwrap();
    let offline = ["--offline", "--data-dir", data, "restore", "db@second", "--to", &path("offline.raw"), "--json"];
    let offline = json(&run(REWIND, &offline));
    // Allocated at the second point: 4 MiB, 1 MiB less the 512 KiB unmapped, 2 MiB.
    assert_eq!(offline["bytes_moved"].as_u64().unwrap(), (4 << 20) + (512 << 10) + (2 << 20));
    assert_eq!(std::fs::read(path("offline.raw")).unwrap(), std::fs::read(path("second.raw")).unwrap());
}
