//! Real NBD clients against the in-process server: nbdinfo, nbdcopy, nbdsh
//! (libnbd), qemu-img, qemu-io (qemu's client) and fio's nbd engine.
//!
//! The tools come from the Debian packages `libnbd-bin python3-libnbd
//! qemu-utils fio`. A missing tool fails the test (CI installs them); it is
//! never skipped.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use common::*;

/// Longest any single client run may take before it is killed and the test
/// fails; far above what each needs (a few seconds at most).
const TOOL_TIMEOUT_SECS: &str = "300";

/// A command for `program`, killed if it outlives `TOOL_TIMEOUT_SECS`.
fn tool(program: &str) -> Command {
    let mut command = Command::new("timeout");
    command.args(["--kill-after=10", TOOL_TIMEOUT_SECS, program]);
    // nbdsh is a Python script that needs the system python with the nbd
    // module (python3-libnbd), not whatever python comes first on PATH.
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("/usr/bin:{path}"));
    command
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("spawn timeout(1)");
    if output.status.code() == Some(127) {
        panic!(
            "{command:?}: tool not found; install the Debian packages \
             libnbd-bin python3-libnbd qemu-utils fio"
        );
    }
    output
}

fn run_ok(command: &mut Command) -> String {
    let output = run(command);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed with {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write test file");
}

#[test]
fn nbdinfo_describes_exports_over_tcp_and_unix() {
    let server = TestServer::start();
    let out = run_ok(tool("nbdinfo").arg(server.uri(DISK)));
    for expected in [
        "export=\"disk\"",
        "description: scratch disk",
        "export-size: 16777216",
        "base:allocation",
        "is_read_only: false",
        "can_multi_conn: true",
        "can_flush: true",
        "can_fua: true",
        "can_trim: true",
        "can_zero: true",
        "can_fast_zero: false",
        "block_size_maximum: 33554432",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }

    let json = run_ok(tool("nbdinfo").arg("--json").arg(server.unix_uri(READ_ONLY)));
    for expected in [
        "\"export-name\": \"ro\"",
        "\"export-size\": 4194304",
        "\"is_read_only\": true",
        "\"can_trim\": false",
        "\"can_zero\": false",
        "\"structured\": true",
        "\"description\": \"frozen view\"",
    ] {
        assert!(json.contains(expected), "{expected:?} missing from:\n{json}");
    }

    let size = run_ok(tool("nbdinfo").arg("--size").arg(server.unix_uri(SPARSE)));
    assert_eq!(size.trim(), SPARSE_BYTES.to_string());
    let out = run_ok(tool("nbdinfo").args(["--can", "fast-zero"]).arg(server.uri(SPARSE)));
    assert!(out.is_empty(), "--can exits 0 silently when true: {out}");
}

#[test]
fn nbdinfo_lists_all_exports() {
    let server = TestServer::start();
    let out = run_ok(tool("nbdinfo").arg("--list").arg(format!("nbd://{}", server.address)));
    for (name, description) in [(DISK, "scratch disk"), (READ_ONLY, "frozen view"), (SPARSE, "thin disk")] {
        assert!(out.contains(&format!("export=\"{name}\"")), "{name} missing from:\n{out}");
        assert!(out.contains(&format!("description: {description}")), "{description} missing:\n{out}");
    }
    let json = run_ok(tool("nbdinfo").args(["--list", "--json"]).arg(server.unix_uri("")));
    assert_eq!(json.matches("\"export-name\"").count(), 3, "{json}");
}

#[test]
fn nbdinfo_maps_holes_and_data() {
    let server = TestServer::start();
    server.export(SPARSE).set_contents(1 << 20, &[0xee; 8192]);
    server.export(SPARSE).set_contents(6 << 20, &[0xee; 4096]);
    let out = run_ok(tool("nbdinfo").arg("--map").arg(server.uri(SPARSE)));
    let map: Vec<Vec<String>> = out.lines().map(|line| line.split_whitespace().map(str::to_owned).collect()).collect();
    let expected = [
        ("0", "1048576", "3", "hole,zero"),
        ("1048576", "8192", "0", "data"),
        ("1056768", "5234688", "3", "hole,zero"),
        ("6291456", "4096", "0", "data"),
        ("6295552", "2093056", "3", "hole,zero"),
    ];
    let expected: Vec<Vec<String>> =
        expected.iter().map(|(a, b, c, d)| vec![a.to_string(), b.to_string(), c.to_string(), d.to_string()]).collect();
    assert_eq!(map, expected, "nbdinfo --map printed:\n{out}");

    let totals = run_ok(tool("nbdinfo").args(["--map", "--totals"]).arg(server.unix_uri(SPARSE)));
    assert!(totals.contains("12288"), "data total missing:\n{totals}");
}

#[test]
fn failing_open_shows_the_catalog_message() {
    let server = TestServer::start();
    // libnbd 1.14 reports the server's message in its debug output; newer
    // versions also put it in the error itself. Either way it is on stderr.
    let output = run(tool("nbdinfo").env("LIBNBD_DEBUG", "1").arg(server.uri(TOO_OLD)));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(TOO_OLD_MESSAGE), "message missing from nbdinfo stderr:\n{stderr}");

    let output = run(tool("qemu-img").args(["info", &server.uri(TOO_OLD)]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(TOO_OLD_MESSAGE), "message missing from qemu-img stderr:\n{stderr}");

    let output = run(tool("nbdinfo").arg(server.uri("no-such-export")));
    assert!(!output.status.success());
}

#[test]
fn nbdcopy_uploads_and_downloads() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.raw");
    let data = pattern(0x42, DISK_BYTES);
    write_file(&source, &data);

    run_ok(tool("nbdcopy").arg(&source).arg(server.uri(DISK)));
    assert!(server.export(DISK).snapshot() == data, "export differs after upload");

    let back = dir.path().join("back.raw");
    run_ok(tool("nbdcopy").arg(server.unix_uri(DISK)).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "download differs from upload");

    let ro = dir.path().join("ro.raw");
    run_ok(tool("nbdcopy").arg(server.uri(READ_ONLY)).arg(&ro));
    assert!(std::fs::read(&ro).unwrap() == server.export(READ_ONLY).snapshot());
}

#[test]
fn qemu_img_info_convert_compare() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();

    let info = run_ok(tool("qemu-img").args(["info", "--output=json", &server.uri(DISK)]));
    assert!(info.contains("\"virtual-size\": 16777216"), "{info}");

    // A sparse source: zeros with two islands of data.
    let source = dir.path().join("source.raw");
    let mut data = vec![0u8; SPARSE_BYTES];
    data[4096..4096 + 65536].copy_from_slice(&pattern(1, 65536));
    data[5 << 20..(5 << 20) + 4096].copy_from_slice(&pattern(2, 4096));
    write_file(&source, &data);
    let source = source.to_str().unwrap();

    run_ok(tool("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", source, &server.uri(SPARSE)]));
    assert!(server.export(SPARSE).snapshot() == data, "export differs after convert");
    let same = run_ok(tool("qemu-img").args(["compare", "-f", "raw", "-F", "raw", source, &server.unix_uri(SPARSE)]));
    assert!(same.contains("Images are identical"), "{same}");

    let back = dir.path().join("back.raw");
    run_ok(tool("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &server.uri(SPARSE)]).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data);

    // compare notices a difference, so the check above means something.
    server.export(SPARSE).set_contents(3 << 20, &[1]);
    let output = run(tool("qemu-img").args(["compare", "-f", "raw", "-F", "raw", source, &server.uri(SPARSE)]));
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn qemu_io_reads_writes_zeroes_discards_and_flushes() {
    let server = TestServer::start();
    let export = server.export(DISK);
    export.set_contents(128 << 10, &[0x77; 64 << 10]);
    let flushes_before = export.flushes.load(Ordering::Relaxed);
    let out = run_ok(tool("qemu-io").args(["-f", "raw", &server.uri(DISK)]).args([
        "-c",
        "write -P 0xab 0 64k",
        "-c",
        "read -P 0xab 0 64k",
        "-c",
        "write -z 64k 64k",
        "-c",
        "read -P 0 64k 64k",
        "-c",
        "discard 128k 64k",
        "-c",
        "write -P 0xcd 1m 512",
        "-c",
        "flush",
    ]));
    assert!(!out.contains("failed"), "{out}");
    assert_eq!(out.matches("wrote ").count(), 3, "{out}");
    assert_eq!(out.matches("read ").count(), 2, "{out}");
    assert!(out.contains("discard 65536/65536"), "{out}");
    let contents = export.snapshot();
    assert!(contents[..64 << 10].iter().all(|&b| b == 0xab));
    assert!(contents[64 << 10..128 << 10].iter().all(|&b| b == 0));
    // The test export zeroes what is discarded.
    assert!(contents[128 << 10..192 << 10].iter().all(|&b| b == 0));
    assert!(contents[1 << 20..(1 << 20) + 512].iter().all(|&b| b == 0xcd));
    assert!(export.flushes.load(Ordering::Relaxed) > flushes_before, "flush reached the export");

    // A pattern mismatch is reported: the checks above can fail.
    let output = run(tool("qemu-io").args(["-f", "raw", &server.unix_uri(DISK), "-c", "read -P 0xab 64k 4k"]));
    assert!(!output.status.success());
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn writes_to_a_read_only_export_fail_with_eperm() {
    let server = TestServer::start();
    let before = server.export(READ_ONLY).snapshot();
    // qemu refuses to open a read-only export for writing at all.
    let output = run(tool("qemu-io").args(["-f", "raw", &server.uri(READ_ONLY), "-c", "write -P 0xab 0 4k"]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Permission denied"), "{stderr}");

    // libnbd with its client-side checks off sends the write; the server's
    // NBD_EPERM comes back.
    let script = "\
h.set_strict_mode(0)
try:
    h.pwrite(b'\\xab' * 4096, 0)
    print('write succeeded')
except nbd.Error as e:
    print('errno', e.errno)
try:
    h.zero(4096, 0)
    print('zero succeeded')
except nbd.Error as e:
    print('errno', e.errno)
print(h.pread(4, 0).hex())
";
    let out = run_ok(tool("nbdsh").args(["-u", &server.uri(READ_ONLY), "-c", script]));
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["errno EPERM", "errno EPERM", "00070e15"], "{out}");
    assert!(server.export(READ_ONLY).snapshot() == before);
}

#[test]
fn libnbd_sees_spec_errors_and_structured_reads() {
    let server = TestServer::start();
    let script = format!(
        "\
h.set_strict_mode(0)
print(h.can_df(), h.get_structured_replies_negotiated())
h.pwrite(b'\\x11' * 8192, 4096, nbd.CMD_FLAG_FUA)
print(h.pread(8192, 4096, nbd.CMD_FLAG_DF) == b'\\x11' * 8192)
for offset, count in (({size} - 100, 512), ({size}, 1)):
    try:
        h.pread(count, offset)
    except nbd.Error as e:
        print('read', e.errno)
try:
    h.pwrite(b'x' * 512, {size} - 100)
except nbd.Error as e:
    print('write', e.errno)
h.flush()
print('ok')
",
        size = DISK_BYTES
    );
    let out = run_ok(tool("nbdsh").args(["-u", &server.uri(DISK), "-c", &script]));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec!["True True", "True", "read EINVAL", "read EINVAL", "write ENOSPC", "ok"],
        "{out}"
    );
}

fn fio(uri: &str, job: &[&str]) -> Command {
    let mut command = tool("fio");
    // Without this fio leaves `*-verify.state` files in the working directory.
    command.arg("--verify_state_save=0");
    command.args(["--name=rewind", "--ioengine=nbd", &format!("--uri={uri}")]).args(job);
    command
}

#[test]
fn fio_verifies_random_and_sequential_writes() {
    let server = TestServer::start();
    let common = ["--size=8M", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1"];
    let out = run_ok(fio(&server.uri(DISK), &common).args(["--rw=randwrite", "--bs=4k", "--iodepth=16", "--offset=0"]));
    assert!(out.contains("err= 0"), "{out}");
    assert!(out.contains("READ:"), "the verify pass must have read:\n{out}");

    let out =
        run_ok(fio(&server.unix_uri(DISK), &common).args(["--rw=write", "--bs=1m", "--iodepth=4", "--offset=8M"]));
    assert!(out.contains("err= 0"), "{out}");

    // Several connections at once (fio jobs), each verifying its own range.
    let out = run_ok(fio(&server.uri(SPARSE), &common[1..]).args([
        "--size=2M",
        "--numjobs=4",
        "--offset_increment=2M",
        "--rw=randwrite",
        "--bs=16k",
        "--iodepth=8",
    ]));
    assert!(out.contains("err= 0"), "{out}");

    // The data survives on the server: re-verify without writing, then show
    // that a corrupted block is caught.
    let verify_only = ["--size=8M", "--verify=crc32c", "--verify_only", "--verify_fatal=1"];
    run_ok(fio(&server.uri(DISK), &verify_only).args(["--rw=randwrite", "--bs=4k", "--offset=0"]));
    let mut block = vec![0u8; 4096];
    block.copy_from_slice(&server.export(DISK).snapshot()[8192..12288]);
    block[100] ^= 0xff;
    server.export(DISK).set_contents(8192, &block);
    let output = run(fio(&server.uri(DISK), &verify_only).args(["--rw=randwrite", "--bs=4k", "--offset=0"]));
    assert!(!output.status.success(), "fio must catch the corrupted block");
}
