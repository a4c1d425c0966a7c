//! Real NBD clients against a real `rewind serve`: nbdinfo, nbdcopy, qemu-img,
//! qemu-io, fio with verification, and a filesystem through nbdfuse and a
//! loop device — each against every layout.

mod common;

use std::fs;
use std::time::Duration;

use common::filesystem::FsTest;
use common::{json, pattern, require, run, run_failing, run_failing_with_env, Server};

/// The layouts: every test here runs against each (the guarantees are the same).
const LAYOUTS: [&str; 7] = ["journaled", "logging", "split-stream", "split-down-stream", "checkpointing", "cow", "row"];

fn in_every_layout(test: fn(&str)) {
    // Every layout takes seconds; a test stuck in the kernel fails CI now.
    let _watchdog = common::Watchdog::new("a client test", Duration::from_secs(600));
    for layout in LAYOUTS {
        println!("layout {layout}");
        test(layout);
    }
}

/// `rewind volume create|import …` arguments, in `layout`.
fn in_layout<'a>(args: &[&'a str], layout: &'a str) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(["--layout", layout]);
    all
}

fn bookmark_time(server: &Server, volume: &str, name: &str) -> String {
    let json = server.rewind(&["bookmark", volume, name, "--json"]);
    let value: serde_json::Value = serde_json::from_str(&json).expect("bookmark JSON");
    value["at"].as_str().expect("at").to_owned()
}

#[test]
fn nbdinfo_shows_volumes_views_and_clear_errors() {
    in_every_layout(nbdinfo_shows_volumes_views_and_clear_errors_in);
}

fn nbdinfo_shows_volumes_views_and_clear_errors_in(layout: &str) {
    require("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&in_layout(&["volume", "create", "db", "--size", "64MiB"], layout));
    let info = run("nbdinfo", &["--json", &server.uri("db")]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 64 << 20);
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["can_flush"], true);
    assert_eq!(export["can_fua"], true);
    assert_eq!(export["can_multi_conn"], true);
    assert_eq!(export["can_trim"], true);

    server.rewind(&["bookmark", "db", "empty"]);
    let list = run("nbdinfo", &["--list", &server.uri("")]);
    assert!(list.contains("export=\"db\"") || list.contains("db\n") || list.contains("db"), "{list}");
    assert!(list.contains("db@empty"), "bookmarks are listed as views:\n{list}");

    let view = run("nbdinfo", &["--json", &server.uri("db@empty")]);
    let view: serde_json::Value = serde_json::from_str(&view).unwrap();
    assert_eq!(view["exports"][0]["is_read_only"], true);
    let relative = run("nbdinfo", &["--size", &server.uri("db@-0s")]);
    assert_eq!(relative.trim(), (64u64 << 20).to_string());

    // The reason reaches the client. libnbd 1.14 (Debian 12) shows the
    // server's message only in its debug output; qemu-img shows it plainly.
    for (export, reason) in [
        ("db@2001-01-01T00:00:00Z", "no history before"),
        ("db@2500-01-01T00:00:00Z", "in the future"),
        ("db@2999-01-01T00:00:00Z", "after 2554"),
        ("db@not-a-bookmark", "no bookmark"),
        ("db@13:61:00", "cannot read"),
        ("nosuch", "no volume named"),
    ] {
        let error = run_failing_with_env("nbdinfo", &[&server.uri(export)], &[("LIBNBD_DEBUG", "1")]);
        assert!(error.contains(reason), "nbdinfo {export}: {error}");
        let error = run_failing("qemu-img", &["info", "-f", "raw", &server.uri(export)]);
        assert!(error.contains(reason), "qemu-img info {export}: {error}");
    }
}

#[test]
fn qemu_img_convert_compare_and_views_keep_the_past() {
    in_every_layout(qemu_img_convert_compare_and_views_keep_the_past_in);
}

fn qemu_img_convert_compare_and_views_keep_the_past_in(layout: &str) {
    require("qemu-img");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    server.rewind(&in_layout(&["volume", "create", "db", "--size", "32MiB"], layout));
    // An image with data and zero regions.
    let original = dir.path().join("original.raw");
    let mut bytes = pattern(1, 32 << 20);
    bytes[4 << 20..12 << 20].fill(0);
    fs::write(&original, &bytes).unwrap();
    let original = original.to_str().unwrap();
    run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", original, &server.uri("db")]);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", original, &server.uri("db")]);
    let before = bookmark_time(&server, "db", "before-change");

    // Change the live volume: a pattern write and a discard.
    run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0xab 1M 3M", "-c", "discard 20M 4M", "-c", "flush", &server.uri("db")],
    );
    run("qemu-io", &["-f", "raw", "-c", "read -P 0xab 1M 3M", "-c", "read -P 0 20M 4M", &server.uri("db")]);
    let changed = run_failing("qemu-img", &["compare", "-f", "raw", "-F", "raw", original, &server.uri("db")]);
    assert!(changed.contains("differ") || changed.contains("mismatch"), "{changed}");

    // The past is intact, by bookmark and by time.
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", original, &server.uri("db@before-change")]);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", original, &server.uri(&format!("db@{before}"))]);
    let info = run("qemu-img", &["info", "-f", "raw", &server.uri("db@before-change")]);
    assert!(info.contains("32 MiB"), "{info}");

    // Views are read-only.
    let denied = run_failing("qemu-io", &["-f", "raw", "-c", "write -P 1 0 4k", &server.uri("db@before-change")]);
    assert!(denied.contains("ermission") || denied.contains("read-only") || denied.contains("Read-only"), "{denied}");
}

#[test]
fn qemu_io_patterns_zeroes_and_unaligned_requests() {
    in_every_layout(qemu_io_patterns_zeroes_and_unaligned_requests_in);
}

fn qemu_io_patterns_zeroes_and_unaligned_requests_in(layout: &str) {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&in_layout(&["volume", "create", "db", "--size", "16MiB", "--block-size", "4KiB"], layout));
    let uri = server.uri("db");
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x11 0 1M",
            "-c",
            "write -P 0x22 513 1000",
            "-c",
            "write -z 64k 64k",
            "-c",
            "write -f -P 0x33 200k 8k",
            "-c",
            "flush",
            &uri,
        ],
    );
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x11 0 513",
            "-c",
            "read -P 0x22 513 1000",
            "-c",
            "read -P 0x11 1513 63023",
            "-c",
            "read -P 0 64k 64k",
            "-c",
            "read -P 0x33 200k 8k",
            "-c",
            "read -P 0x11 208k 816k",
            &uri,
        ],
    );
}

#[test]
fn nbdcopy_both_ways_and_import() {
    in_every_layout(nbdcopy_both_ways_and_import_in);
}

fn nbdcopy_both_ways_and_import_in(layout: &str) {
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let image = dir.path().join("image.raw");
    fs::write(&image, pattern(7, 8 << 20)).unwrap();
    let imported = server.rewind(&in_layout(&["volume", "import", "vm1", image.to_str().unwrap(), "--json"], layout));
    let imported: serde_json::Value = serde_json::from_str(&imported).unwrap();
    assert_eq!(imported["bytes_read"], 8 << 20);
    let out = dir.path().join("out.raw");
    run("nbdcopy", &[&server.uri("vm1"), out.to_str().unwrap()]);
    assert!(fs::read(&out).unwrap() == fs::read(&image).unwrap(), "nbdcopy out of an imported volume");

    server.rewind(&in_layout(&["volume", "create", "copy", "--size", "8MiB"], layout));
    run("nbdcopy", &[image.to_str().unwrap(), &server.uri("copy")]);
    let back = dir.path().join("back.raw");
    run("nbdcopy", &[&server.uri("copy"), back.to_str().unwrap()]);
    assert!(fs::read(&back).unwrap() == fs::read(&image).unwrap(), "nbdcopy in and out");
}

#[test]
fn fio_verifies_the_live_volume_and_a_view() {
    in_every_layout(fio_verifies_the_live_volume_and_a_view_in);
}

fn fio_verifies_the_live_volume_and_a_view_in(layout: &str) {
    require("fio");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&in_layout(&["volume", "create", "db", "--size", "64MiB"], layout));
    let fio = |uri: &str, extra: &[&str]| {
        let mut args = vec![
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--iodepth=16",
            "--verify=crc32c",
            "--randseed=42",
            // fio would otherwise leave a verify state file in the working directory.
            "--verify_state_save=0",
        ];
        let uri = format!("--uri={uri}");
        args.push(&uri);
        args.extend_from_slice(extra);
        run("fio", &args)
    };
    fio(&server.uri("db"), &["--fsync=16"]);
    let written = bookmark_time(&server, "db", "written");
    // Overwrite with other data; the view at the bookmark still verifies.
    fio(&server.uri("db"), &["--randseed=7", "--verify=md5"]);
    fio(&server.uri("db@written"), &["--verify_only"]);
    fio(&server.uri(&format!("db@{written}")), &["--verify_only"]);
    let wrong = run_failing(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--verify=crc32c",
            "--randseed=42",
            "--verify_state_save=0",
            "--verify_only",
            &format!("--uri={}", server.uri("db")),
        ],
    );
    assert!(wrong.contains("verify") || wrong.contains("bad"), "the live volume no longer holds that data:\n{wrong}");
}

/// Changed-block tracking over NBD, as incremental-backup clients read it:
/// after a fio random-write workload, `nbdinfo --map` of the context
/// `qemu:dirty-bitmap:since-BOOKMARK` is exactly the blocks fio's own log
/// says it wrote since the bookmark — on the live volume, by the time form,
/// and on a view — and LIST names one context per bookmark.
#[test]
fn nbdinfo_maps_the_dirty_bitmap_since_a_bookmark_as_exactly_what_fio_wrote() {
    in_every_layout(nbdinfo_maps_the_dirty_bitmap_since_a_bookmark_in);
}

fn nbdinfo_maps_the_dirty_bitmap_since_a_bookmark_in(layout: &str) {
    require("fio");
    require("nbdinfo");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&in_layout(&["volume", "create", "db", "--size", "64MiB"], layout));
    let uri = server.uri("db");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 16M", &uri]);
    let backup = bookmark_time(&server, "db", "backup");

    let fio = |seed: &str| {
        let iolog = dir.path().join(format!("fio-{seed}.iolog"));
        let seed = format!("--randseed={seed}");
        let log = format!("--write_iolog={}", iolog.display());
        let uri = format!("--uri={uri}");
        let args = ["--name=cbt", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=64M", "--number_ios=400"];
        run("fio", &[&args[..], &["--iodepth=8", "--refill_buffers", &seed, &log, &uri]].concat());
        // fio's own record of every write it issued: `[TIME] FILE write
        // OFFSET LENGTH` (the time in version 3 of the format).
        let log = fs::read_to_string(&iolog).unwrap();
        let writes: Vec<(u64, u64)> = log
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                match fields[..] {
                    [.., _, "write", offset, length] => Some((offset.parse().unwrap(), length.parse().unwrap())),
                    _ => None,
                }
            })
            .collect();
        assert_eq!(writes.len(), 400, "fio logged its writes:\n{log}");
        writes
    };
    let mut written = fio("1");
    server.rewind(&["bookmark", "db", "later"]);
    written.extend(fio("2"));
    let changed = merged_ranges(&written);

    let dirty = |uri: &str, context: &str| -> Vec<(u64, u64)> {
        let map = json(&run("nbdinfo", &["--json", &format!("--map={context}"), uri]));
        let extents = map.as_array().unwrap_or_else(|| panic!("a list of extents: {map}"));
        let mut covered = 0;
        let mut dirty = Vec::new();
        for extent in extents {
            let (offset, length) = (extent["offset"].as_u64().unwrap(), extent["length"].as_u64().unwrap());
            assert_eq!(offset, covered, "extents cover the volume in order: {map}");
            covered += length;
            if extent["type"].as_u64().unwrap() & 1 == 1 {
                dirty.push((offset, length));
            }
        }
        assert_eq!(covered, 64 << 20, "{map}");
        merged_ranges(&dirty)
    };
    assert_eq!(dirty(&uri, "qemu:dirty-bitmap:since-backup"), changed, "since the bookmark, on the live volume");
    let by_time = format!("qemu:dirty-bitmap:since-{backup}");
    assert_eq!(dirty(&uri, &by_time), changed, "since the bookmark's time, {backup}");
    let second_run = merged_ranges(&written[400..]);
    assert_eq!(dirty(&uri, "qemu:dirty-bitmap:since-later"), second_run, "since the second bookmark");
    let first_run = merged_ranges(&written[..400]);
    assert_eq!(dirty(&server.uri("db@later"), "qemu:dirty-bitmap:since-backup"), first_run, "on a view");

    let listed = run("nbdinfo", &["--content", &uri]);
    for context in ["base:allocation", "qemu:dirty-bitmap:since-backup", "qemu:dirty-bitmap:since-later"] {
        assert!(listed.contains(context), "LIST_META_CONTEXT names {context}:\n{listed}");
    }
    let unknown = run_failing("nbdinfo", &["--map=qemu:dirty-bitmap:since-no-such-bookmark", &uri]);
    assert!(unknown.contains("qemu:dirty-bitmap:since-no-such-bookmark"), "{unknown}");
}

/// Byte ranges sorted and merged where they touch or overlap.
fn merged_ranges(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut ranges = ranges.to_vec();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (offset, length) in ranges {
        match merged.last_mut() {
            Some((start, run)) if *start + *run >= offset => *run = (*run).max(offset + length - *start),
            _ => merged.push((offset, length)),
        }
    }
    merged
}

/// Mounting needs root (loop devices); CI runs as root.
#[test]
fn a_filesystem_as_it_was_at_a_bookmark() {
    in_every_layout(a_filesystem_as_it_was_at_a_bookmark_in);
}

fn a_filesystem_as_it_was_at_a_bookmark_in(layout: &str) {
    let _mounts = FsTest::one_at_a_time();
    require("nbdfuse");
    require("mkfs.ext4");
    require("losetup");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    server.rewind(&in_layout(&["volume", "create", "fs", "--size", "256MiB"], layout));
    let mut fs_test = FsTest::new(dir.path());
    let (fuse, fuse_view, mnt, old) =
        (fs_test.fuse.clone(), fs_test.fuse_view.clone(), fs_test.mnt.clone(), fs_test.old.clone());
    let disk = fs_test.attach(&server.uri("fs"), &fuse, false);
    run("mkfs.ext4", &["-q", &disk]);
    run("mount", &[&disk, mnt.to_str().unwrap()]);
    let keep = pattern(11, 3 << 20);
    let doomed = pattern(12, 1 << 20);
    fs::write(mnt.join("keep.bin"), &keep).unwrap();
    fs::write(mnt.join("doomed.bin"), &doomed).unwrap();
    fs::create_dir(mnt.join("dir")).unwrap();
    fs::write(mnt.join("dir/note.txt"), b"before the upgrade\n").unwrap();
    // Make the filesystem consistent on the volume, bookmark, carry on.
    run("fsfreeze", &["-f", mnt.to_str().unwrap()]);
    server.rewind(&["bookmark", "fs", "before-upgrade"]);
    run("fsfreeze", &["-u", mnt.to_str().unwrap()]);
    fs::write(mnt.join("keep.bin"), pattern(13, 2 << 20)).unwrap();
    fs::remove_file(mnt.join("doomed.bin")).unwrap();
    fs::write(mnt.join("dir/note.txt"), b"after the upgrade\n").unwrap();
    fs::write(mnt.join("new.bin"), pattern(14, 1 << 20)).unwrap();
    run("sync", &[]);

    let view_disk = fs_test.attach(&server.uri("fs@before-upgrade"), &fuse_view, true);
    run("mount", &["-o", "ro,noload", &view_disk, old.to_str().unwrap()]);
    assert!(fs::read(old.join("keep.bin")).unwrap() == keep, "keep.bin as it was");
    assert!(fs::read(old.join("doomed.bin")).unwrap() == doomed, "the deleted file is back");
    assert_eq!(fs::read(old.join("dir/note.txt")).unwrap(), b"before the upgrade\n");
    assert!(!old.join("new.bin").exists(), "later files are not in the past");
    assert_eq!(fs::read(mnt.join("dir/note.txt")).unwrap(), b"after the upgrade\n", "the present is untouched");
    assert!(!mnt.join("doomed.bin").exists());
}

#[test]
fn a_ransomware_attack_is_reverted_and_the_revert_undone() {
    in_every_layout(a_ransomware_attack_is_reverted_and_the_revert_undone_in);
}

/// ext4 on a volume: files written, bookmarked, then every file overwritten
/// with random bytes and half of them deleted. `rewind revert --to` the
/// bookmark brings every file back byte for byte, before and after the
/// background copy that follows it; `--undo` brings the
/// encrypted state back; a clone at the bookmark takes changes the origin
/// never sees.
fn a_ransomware_attack_is_reverted_and_the_revert_undone_in(layout: &str) {
    let _mounts = FsTest::one_at_a_time();
    require("nbdfuse");
    require("mkfs.ext4");
    require("losetup");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    server.rewind(&in_layout(&["volume", "create", "fs", "--size", "128MiB"], layout));
    let mut fs_test = FsTest::new(dir.path());
    let (mnt, old) = (fs_test.mnt.clone(), fs_test.old.clone());
    let disk = fs_test.attach(&server.uri("fs"), &fs_test.fuse.clone(), false);
    run("mkfs.ext4", &["-q", &disk]);
    run("mount", &[&disk, mnt.to_str().unwrap()]);
    let files: Vec<(String, Vec<u8>)> =
        (0..8).map(|index| (format!("file{index}.bin"), pattern(30 + index, (index as usize + 1) << 18))).collect();
    for (name, bytes) in &files {
        fs::write(mnt.join(name), bytes).unwrap();
    }
    run("fsfreeze", &["-f", mnt.to_str().unwrap()]);
    server.rewind(&["bookmark", "fs", "clean"]);
    run("fsfreeze", &["-u", mnt.to_str().unwrap()]);
    // The attack: every file encrypted, half of them deleted.
    let encrypted: Vec<Vec<u8>> = files.iter().map(|(_, bytes)| pattern(99, bytes.len())).collect();
    for ((name, _), bytes) in files.iter().zip(&encrypted) {
        fs::write(mnt.join(name), bytes).unwrap();
    }
    for (name, _) in files.iter().step_by(2) {
        fs::remove_file(mnt.join(name)).unwrap();
    }
    run("sync", &[]);
    // Not under a mounted filesystem's feet.
    let refused = server.rewind_failing(&["revert", "fs", "--to", "clean"]);
    assert!(refused.contains("open for writing") && refused.contains("--disconnect"), "{refused}");
    fs_test.detach();

    let reverted = || server.rewind_output(&["revert", "fs", "--to", "clean", "--json"]);
    let mut summary = None;
    common::wait_for("the filesystem's NBD connection to close", || {
        let output = reverted();
        let done = output.status.success();
        summary = done.then(|| json(&String::from_utf8_lossy(&output.stdout)));
        done
    });
    let summary = summary.unwrap();
    let before = summary["bookmark"].as_str().unwrap().to_owned();
    assert!(before.starts_with("before-revert-"), "{summary}");
    let disk = fs_test.attach(&server.uri("fs"), &fs_test.fuse.clone(), false);
    run("mount", &[&disk, mnt.to_str().unwrap()]);
    for (name, bytes) in &files {
        assert!(fs::read(mnt.join(name)).unwrap() == *bytes, "{name} is back as it was");
    }
    let timeline = server.rewind(&["timeline", "fs"]);
    assert!(timeline.contains("↶ reverted") && timeline.contains(&before), "{timeline}");
    fs_test.detach();

    // Meanwhile the background copy has been putting what the revert reads
    // through history back into the current store; the files are the same
    // after it (and the filesystem's own writes since are kept).
    let mut copied = 0;
    common::wait_for("the background copy after the revert to finish", || {
        let info = json(&server.rewind(&["volume", "info", "fs", "--json"]));
        copied = info["stats"]["revert_blocks_copied"].as_u64().unwrap();
        info["stats"]["revert_copy_blocks_left"].as_u64() == Some(0)
    });
    assert_eq!(copied > 0, layout != "logging", "{layout}: {copied} blocks copied (logging has no current store)");
    let disk = fs_test.attach(&server.uri("fs"), &fs_test.fuse_view.clone(), true);
    run("mount", &["-o", "ro,noload", &disk, old.to_str().unwrap()]);
    for (name, bytes) in &files {
        assert!(fs::read(old.join(name)).unwrap() == *bytes, "{name} reads the same after the copy");
    }
    fs_test.detach();

    // Undo: the encrypted state is back (and stays readable at its bookmark).
    common::wait_for("the filesystem's NBD connection to close", || {
        server.rewind_output(&["revert", "fs", "--undo"]).status.success()
    });
    let disk = fs_test.attach(&server.uri("fs"), &fs_test.fuse_view.clone(), true);
    run("mount", &["-o", "ro,noload", &disk, old.to_str().unwrap()]);
    for (index, ((name, _), bytes)) in files.iter().zip(&encrypted).enumerate() {
        match index % 2 {
            0 => assert!(!old.join(name).exists(), "{name} was deleted"),
            _ => assert!(fs::read(old.join(name)).unwrap() == *bytes, "{name} is encrypted again"),
        }
    }
    fs_test.detach();

    // A clone of the clean state, changed; the origin's clean point is not.
    server.rewind(&["volume", "clone", "fs@clean", "fs-debug"]);
    let disk = fs_test.attach(&server.uri("fs-debug"), &fs_test.fuse.clone(), false);
    run("mount", &[&disk, mnt.to_str().unwrap()]);
    fs::write(mnt.join("file1.bin"), b"debugging\n").unwrap();
    run("sync", &[]);
    let view = fs_test.attach(&server.uri("fs@clean"), &fs_test.fuse_view.clone(), true);
    run("mount", &["-o", "ro,noload", &view, old.to_str().unwrap()]);
    assert_eq!(fs::read(mnt.join("file1.bin")).unwrap(), b"debugging\n");
    assert!(fs::read(old.join("file1.bin")).unwrap() == files[1].1, "the origin is unaffected");
}

#[test]
fn hostile_clients_do_not_disturb_others_or_the_volume() {
    in_every_layout(hostile_clients_do_not_disturb_others_or_the_volume_in);
}

fn hostile_clients_do_not_disturb_others_or_the_volume_in(layout: &str) {
    use std::io::{Read, Write};
    require("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let image = dir.path().join("image.raw");
    fs::write(&image, pattern(21, 4 << 20)).unwrap();
    server.rewind(&in_layout(&["volume", "import", "db", image.to_str().unwrap()], layout));
    // Garbage instead of a handshake, a stalled handshake, and a client that
    // negotiates and then claims a 3 GiB write and disconnects mid-payload.
    let mut garbage = std::net::TcpStream::connect(server.nbd).unwrap();
    let _ = garbage.write_all(&[0xff; 4096]);
    let _stalled = std::net::TcpStream::connect(server.nbd).unwrap();
    let mut client = common::nbd_client::NbdClient::connect(server.nbd, "db").unwrap();
    let mut header = Vec::new();
    header.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    header.extend_from_slice(&0u16.to_be_bytes());
    header.extend_from_slice(&1u16.to_be_bytes()); // WRITE
    header.extend_from_slice(&7u64.to_be_bytes());
    header.extend_from_slice(&0u64.to_be_bytes());
    header.extend_from_slice(&(3u32 << 30).to_be_bytes());
    header.extend_from_slice(&[0xee; 1000]);
    let _ = client.raw_stream().write_all(&header);
    let mut rest = Vec::new();
    let _ = client.raw_stream().read_to_end(&mut rest); // the server hangs up
    drop(client);
    // Meanwhile and afterwards, a well-behaved client sees the volume intact.
    let out = dir.path().join("out.raw");
    run("nbdcopy", &[&server.uri("db"), out.to_str().unwrap()]);
    assert!(fs::read(&out).unwrap() == fs::read(&image).unwrap(), "the volume is unchanged");
    drop(garbage);
}
