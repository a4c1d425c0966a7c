//! The CLI and the HTTP API end to end: volumes, bookmarks, timeline, views,
//! errors, metrics, and working offline on a data directory.

mod common;

use common::nbd_client::NbdClient;
use common::{json, require, run, run_failing, wait_for, Server, REWIND};

/// Runs the CLI directly on a data directory, without a server.
fn offline(data: &str, args: &[&str]) -> String {
    let mut all = vec!["--offline", "--data-dir", data];
    all.extend_from_slice(args);
    run(REWIND, &all)
}

fn failing(server: &Server, args: &[&str]) -> String {
    let output = server.rewind_output(args);
    assert!(!output.status.success(), "rewind {args:?} should fail:\n{}", common::describe(&output));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bookmarks_timeline_and_views_through_the_cli_and_the_api() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&["volume", "create", "db", "--size", "16MiB"]);
    let volumes = json(&server.rewind(&["volume", "list", "--json"]));
    assert_eq!(volumes[0]["name"], "db");
    assert_eq!(volumes[0]["size_bytes"], 16 << 20);
    assert!(server.rewind(&["volume", "list"]).contains("db"));

    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 1M", &server.uri("db")]);
    let one = json(&server.rewind(&["bookmark", "db", "one", "--json"]));
    let at = one["at"].as_str().unwrap().to_owned();
    let same = json(&server.rewind(&["bookmark", "create", "db", "same-time", "--at", &at, "--json"]));
    assert_eq!(same["at_unix_nanos"], one["at_unix_nanos"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x22 0 1M", &server.uri("db")]);
    let bookmarks = json(&server.rewind(&["bookmark", "list", "db", "--json"]));
    assert_eq!(bookmarks.as_array().unwrap().len(), 2);
    let error = failing(&server, &["bookmark", "db", "one"]);
    assert!(error.contains("already has a bookmark"), "{error}");
    let error = failing(&server, &["bookmark", "db", "9lives"]);
    assert!(error.contains("must not start with a digit"), "{error}");
    server.rewind(&["bookmark", "delete", "db", "same-time"]);
    assert_eq!(json(&server.rewind(&["bookmark", "list", "db", "--json"])).as_array().unwrap().len(), 1);

    let detail = json(&server.rewind(&["volume", "info", "db", "--json"]));
    assert_eq!(detail["stats"]["write_bytes"], 2 << 20);
    assert!(detail["stats"]["versions"].as_u64().unwrap() >= 512);

    let timeline = json(&server.rewind(&["timeline", "db", "--json"]));
    let written: u64 = timeline["buckets"].as_array().unwrap().iter().map(|b| b["write_bytes"].as_u64().unwrap()).sum();
    assert_eq!(written, 2 << 20);
    assert_eq!(timeline["bookmarks"][0]["name"], "one");
    let chart = server.rewind(&["timeline", "db", "--bucket", "1h"]);
    assert!(chart.contains("◆ one") && chart.contains("2.00 MiB"), "{chart}");

    let view = json(&server.rewind(&["view", "db", "one", "--json"]));
    assert_eq!(view["export"], format!("db@{at}"));
    let human = server.rewind(&["view", "db", "-1ms"]);
    assert!(human.contains(&format!("nbd://{}/db@", server.nbd)), "{human}");
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x11 0 1M", &server.uri(view["export"].as_str().unwrap())]);
    let error = failing(&server, &["view", "db", "2001-01-01T00:00:00Z"]);
    assert!(error.contains("no history before"), "{error}");
    let error = failing(&server, &["view", "db", "next tuesday"]);
    assert!(error.contains("cannot read"), "{error}");
    let error = failing(&server, &["view", "nosuch", "now"]);
    assert!(error.contains("no volume named"), "{error}");
    let error = failing(&server, &["volume", "create", "bad@name", "--size", "1MiB"]);
    assert!(error.contains("invalid volume name"), "{error}");
    let error = failing(&server, &["volume", "create", "odd", "--size", "1000"]);
    assert!(error.contains("multiple of its block size"), "{error}");

    // The API itself: statuses, error bodies and metrics.
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let bearer = format!("Bearer {}", server.token);
    let mut missing =
        agent.get(format!("{}/v1/volumes/nosuch", server.api())).header("Authorization", &bearer).call().unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.body_mut().read_json().unwrap();
    assert_eq!(body["kind"], "not_found");
    let duplicate = agent
        .post(format!("{}/v1/volumes/db/bookmarks", server.api()))
        .header("Authorization", &bearer)
        .send_json(serde_json::json!({"name": "one"}))
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    let bad = agent
        .get(format!("{}/v1/volumes/db/view", server.api()))
        .header("Authorization", &bearer)
        .query("at", "2001-01-01T00:00:00Z")
        .call()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let metrics = agent
        .get(format!("{}/metrics", server.api()))
        .header("Authorization", &bearer)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(metrics.contains("rewind_volume_write_bytes_total{volume=\"db\"} 2097152"), "{metrics}");

    server.rewind(&["volume", "delete", "db", "--yes"]);
    assert!(server.rewind(&["volume", "list", "--json"]).trim() == "[]");
}

#[test]
fn offline_commands_work_on_the_data_directory_and_respect_a_running_server() {
    require("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let offline = |args: &[&str]| offline(data, args);
    let failure = run_failing(REWIND, &["--offline", "--data-dir", data, "volume", "list"]);
    assert!(failure.contains("there is no data directory"), "{failure}");
    offline(&["volume", "create", "x", "--size", "8MiB"]);
    offline(&["bookmark", "x", "created"]);
    assert!(offline(&["volume", "list"]).contains('x'));
    let mut server = Server::start(std::path::Path::new(data));
    run("nbdinfo", &["--size", &server.uri("x@created")]);
    let busy = run_failing(REWIND, &["--offline", "--data-dir", data, "volume", "list"]);
    assert!(busy.contains("in use by another rewind process"), "{busy}");
    server.stop();
    assert!(offline(&["bookmark", "list", "x"]).contains("created"));
}

#[test]
fn granularity_keeps_one_version_per_window_and_rounds_views_to_exact_points() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let created = json(&server.rewind(&["volume", "create", "db", "--size", "1MiB", "--granularity", "1h", "--json"]));
    assert_eq!(created["granularity"], "1h");
    assert_eq!(created["granularity_nanos"], 3_600_000_000_000u64);
    let error = failing(&server, &["volume", "create", "bad", "--size", "1MiB", "--granularity", "often"]);
    assert!(error.contains("use 0 or ew (every write) or a duration"), "{error}");

    // Ten writes of block 0 within (almost certainly) one hour-long window.
    for pattern in 1..=10 {
        run("qemu-io", &["-f", "raw", "-c", &format!("write -P {pattern} 0 4k"), &server.uri("db")]);
    }
    // A bookmark is an exact point whatever the granularity.
    let bookmark = json(&server.rewind(&["bookmark", "db", "ten", "--json"]));
    run("qemu-io", &["-f", "raw", "-c", "write -P 11 0 4k", &server.uri("db")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 10 0 4k", &server.uri("db@ten")]);
    // Any other time shows the latest exact point at or before it: here the
    // bookmark (or an hour's end, if one passed since).
    let view = json(&server.rewind(&["view", "db", "now", "--json"]));
    let at = view["at"].as_str().unwrap();
    assert!(at == bookmark["at"] || at.ends_with(":59:59.999999999Z"), "view of now at {at}, bookmark {bookmark}");

    // Stopping persists the memtable, thinned: of 11 writes, block 0's state at
    // the bookmark and its last write are kept (one more if an hour ended).
    server.stop();
    let offline = |args: &[&str]| offline(data.to_str().unwrap(), args);
    let detail = json(&offline(&["volume", "info", "db", "--json"]));
    let (kept, written) =
        (detail["stats"]["versions"].as_u64().unwrap(), detail["stats"]["versions_written"].as_u64().unwrap());
    assert_eq!(written, 11, "{detail}");
    assert!((2..=3).contains(&kept), "kept {kept} of {written}: {detail}");
    let human = offline(&["volume", "info", "db"]);
    assert!(human.contains("each block's last write per 1h"), "{human}");

    let set = offline(&["volume", "set", "db", "--granularity", "0"]);
    assert!(set.contains("now keeps every write"), "{set}");
    let info = json(&offline(&["volume", "info", "db", "--json"]));
    assert_eq!(info["granularity_nanos"], 0);
}

#[test]
fn retention_drops_old_history_but_keeps_bookmarks_and_open_views() {
    require("qemu-io");
    require("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--retention-interval", "100ms"]);
    let created =
        json(&server.rewind(&["volume", "create", "db", "--size", "1MiB", "--retention", "all:2s", "--json"]));
    assert_eq!(created["retention"], "all:2s");
    assert_eq!(created["oldest_kept"], serde_json::Value::Null);
    let error = failing(&server, &["volume", "set", "db", "--granularity", "1m", "--retention", "all:1h, 90s:1d"]);
    assert!(error.contains("must be a multiple of the granularity"), "{error}");
    let error = failing(&server, &["volume", "create", "bad", "--size", "1MiB", "--retention", "1h"]);
    assert!(error.contains("write interval:age"), "{error}");

    let write =
        |pattern: u8| run("qemu-io", &["-f", "raw", "-c", &format!("write -P {pattern} 0 4k"), &server.uri("db")]);
    write(1);
    server.rewind(&["bookmark", "db", "kept"]);
    write(2);
    let old = json(&server.rewind(&["view", "db", "now", "--json"]));
    let old_at = old["at_unix_nanos"].as_u64().unwrap().to_string();
    // An open view pins its time: retention cannot change what it shows.
    let mut held = NbdClient::connect(server.nbd, old["export"].as_str().unwrap()).unwrap();
    write(3);
    let newest = json(&server.rewind(&["view", "db", "now", "--json"]))["at_unix_nanos"].as_u64().unwrap();
    // Once the oldest kept state is past every write, only pins keep older ones.
    wait_for("retention to pass every write", || {
        let info = json(&server.rewind(&["volume", "info", "db", "--json"]));
        info["oldest_kept_unix_nanos"].as_u64().is_some_and(|oldest| oldest > newest)
    });
    let mut block = vec![0u8; 4096];
    held.read(0, &mut block).unwrap();
    assert!(block.iter().all(|&byte| byte == 2), "the open view still shows its time");
    held.disconnect().unwrap();
    let error = failing(&server, &["view", "db", &old_at]);
    assert!(error.contains("keeps no history before") && error.contains("bookmark kept"), "{error}");
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 1 0 4k", &server.uri("db@kept")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 3 0 4k", &server.uri("db")]);
    let human = server.rewind(&["volume", "info", "db"]);
    assert!(human.contains("retention all:2s") && human.contains("oldest kept"), "{human}");
}

#[test]
fn history_delete_keeps_every_point_outside_the_range() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&["volume", "create", "db", "--size", "1MiB"]);
    let write =
        |pattern: u8| run("qemu-io", &["-f", "raw", "-c", &format!("write -P {pattern} 0 4k"), &server.uri("db")]);
    write(1);
    let a = json(&server.rewind(&["bookmark", "db", "a", "--json"]));
    write(2);
    let middle = json(&server.rewind(&["bookmark", "db", "middle", "--json"]));
    write(3);
    write(4);
    let b = json(&server.rewind(&["bookmark", "db", "b", "--json"]));
    let from = (a["at_unix_nanos"].as_u64().unwrap() + 1).to_string();

    let error = failing(&server, &["history", "delete", "db", "--from", &from, "--to", "b", "--yes"]);
    assert!(error.contains("bookmark middle") && error.contains("delete it first"), "{error}");
    server.rewind(&["bookmark", "delete", "db", "middle"]);
    let deleted = json(&server.rewind(&["history", "delete", "db", "--from", &from, "--to", "b", "--yes", "--json"]));
    assert_eq!(deleted["to_unix_nanos"], b["at_unix_nanos"]);
    assert_eq!(deleted["versions_thinned"], 2, "block 0's writes 2 and 3: {deleted}");
    assert_eq!(deleted["versions"], 2, "write 1 (before the range) and write 4 (its last): {deleted}");

    // Outside the range, everything reads as before.
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 1 0 4k", &server.uri("db@a")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 4 0 4k", &server.uri("db@b")]);
    // Inside, the time is refused, naming the nearest kept points.
    let inside = middle["at"].as_str().unwrap();
    let error = failing(&server, &["view", "db", inside]);
    assert!(error.contains("was deleted") && error.contains("nearest points kept"), "{error}");
    assert!(error.contains(b["at"].as_str().unwrap()), "{error}");
    let error = failing(&server, &["history", "delete", "db", "--from", "b", "--to", "b", "--yes"]);
    assert!(error.contains("must start before it ends"), "{error}");
}

/// `rewind diff` with a real client writing: the ranges written between two
/// bookmarks, and since the first up to now, exactly; the same through the
/// API and offline; bad points are refused with what to do.
#[test]
fn diff_lists_exactly_the_ranges_written_between_two_points() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut server = Server::start(dir.path());
    server.rewind(&["volume", "create", "db", "--size", "64MiB"]);
    let uri = server.uri("db");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 8M", &uri]);
    server.rewind(&["bookmark", "db", "base"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x22 1M 64k", "-c", "write -P 0x33 10M 1M", &uri]);
    server.rewind(&["bookmark", "db", "later"]);
    // Zeroes: allocated over a hole (NO_HOLE) are stored, so a change, as in
    // qemu's dirty bitmaps; unmapped over a hole, nothing changes.
    let zeroes = ["-c", "write -z 20M 2M", "-c", "write -z -u 30M 1M", "-c", "write -P 0x44 63M 4k"];
    run("qemu-io", &[&["-f", "raw"][..], &zeroes, &[uri.as_str()]].concat());

    let ranges = |changes: &serde_json::Value| -> Vec<(u64, u64)> {
        let ranges = changes["ranges"].as_array().unwrap();
        ranges.iter().map(|range| (range["offset"].as_u64().unwrap(), range["length"].as_u64().unwrap())).collect()
    };
    let between = json(&server.rewind(&["diff", "db@base", "db@later", "--json"]));
    assert_eq!(ranges(&between), vec![(1 << 20, 64 << 10), (10 << 20, 1 << 20)], "{between}");
    assert_eq!(between["changed_bytes"], (1 << 20) + (64 << 10));
    assert_eq!(between["to_present"], false);
    let since = json(&server.rewind(&["diff", "db@base", "--json"]));
    let expected = vec![(1 << 20, 64 << 10), (10 << 20, 1 << 20), (20 << 20, 2 << 20), (63 << 20, 4 << 10)];
    assert_eq!(ranges(&since), expected, "{since}");
    assert_eq!(since["to_present"], true);
    let text = server.rewind(&["diff", "db@base", "db@later"]);
    assert!(text.contains("in 2 ranges") && text.contains("10485760"), "{text}");

    let response = run(
        "curl",
        &["-sf", "-H", &server.authorization(), &format!("{}/v1/volumes/db/changes?from=base&to=later", server.api())],
    );
    assert_eq!(ranges(&json(&response)), ranges(&between));

    let error = failing(&server, &["diff", "db"]);
    assert!(error.contains("is not VOLUME@TIME"), "{error}");
    let error = failing(&server, &["diff", "db@base", "other@later"]);
    assert!(error.contains("two points of one volume"), "{error}");
    let error = failing(&server, &["diff", "db@no-such-bookmark"]);
    assert!(error.contains("no-such-bookmark"), "{error}");

    server.stop();
    let offline_changes = json(&offline(&data, &["diff", "db@base", "db@later", "--json"]));
    assert_eq!(ranges(&offline_changes), ranges(&between));
}

/// A SIGTERM as soon as the server says it listens is a clean stop: the
/// handler used to be installed only when the shutdown future was first
/// polled, just after "listening", and a stop in between killed it.
#[test]
fn a_stop_right_after_the_server_says_it_listens_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let mut server = Server::start(&dir.path().join(format!("data-{round}")));
        server.stop();
    }
}

/// Kibibytes of transparent huge pages in the process, from its
/// `smaps_rollup`.
fn anon_huge_kib(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let line = rollup.lines().find_map(|line| line.strip_prefix("AnonHugePages:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

#[test]
fn journal_buffers_ask_for_huge_pages_unless_the_operator_says_no() {
    let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    println!("transparent_hugepage: {}", setting.trim());
    let huge_kib_after_writes = |options: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start_with(dir.path(), options);
        server.rewind(&["volume", "create", "v", "--size", "64MiB"]);
        let mut client = NbdClient::connect(server.nbd, "v").unwrap();
        for mebibyte in 0..32u64 {
            client.write(mebibyte << 20, &common::pattern(mebibyte, 1 << 20)).unwrap();
        }
        client.flush().unwrap();
        let kib = anon_huge_kib(server.pid());
        client.disconnect().unwrap();
        println!("{options:?}: AnonHugePages {kib} kB");
        kib
    };
    let asked = huge_kib_after_writes(&[]);
    let refused = huge_kib_after_writes(&["--no-journal-huge-pages"]);
    if setting.contains("[madvise]") {
        // Only advised memory gets huge pages: the journal's 8 MiB batch
        // buffer holds at least two whole ones.
        assert!(asked >= 4096, "no huge pages behind the journal's batch buffer: {asked} kB");
        assert_eq!(refused, 0, "huge pages though the journal was told not to ask");
    } else if setting.contains("[never]") {
        assert_eq!((asked, refused), (0, 0), "huge pages though the kernel's setting is never");
    } else {
        // `always`: every large anonymous mapping may get them, asked or not.
        assert!(asked >= 4096, "no huge pages with transparent_hugepage always: {asked} kB");
    }
}

/// Bytes the server has read from `volume`'s current store.
fn current_read_bytes(server: &Server, volume: &str) -> u64 {
    json(&server.rewind(&["stats", volume, "--json"]))["io"]["current"]["read_bytes"].as_u64().unwrap()
}

#[test]
fn a_thin_terabyte_maps_and_restores_without_reading_its_unwritten_metadata() {
    require("nbdinfo");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    server.rewind(&["volume", "create", "thin", "--size", "1TiB"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x33 0 1M", "-c", "write -P 0x44 512G 1M", &server.uri("thin")]);
    let before_third =
        json(&server.rewind(&["bookmark", "thin", "two-writes", "--json"]))["at"].as_str().unwrap().to_owned();
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x55 768G 1M", &server.uri("thin")]);
    let read_before = current_read_bytes(&server, "thin");
    let present = run("nbdinfo", &["--map", &server.uri("thin")]);
    let then = run("nbdinfo", &["--map", &server.uri("thin@two-writes")]);
    let restored = dir.path().join("thin.raw");
    server.rewind(&["restore", "thin@two-writes", "--to", restored.to_str().unwrap()]);
    let read = current_read_bytes(&server, "thin") - read_before;
    println!("present:\n{present}then ({before_third}):\n{then}{read} bytes of the current store read");
    let data = |map: &str| -> Vec<String> {
        map.lines()
            .filter(|line| line.ends_with(" data"))
            .map(|line| line.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(data(&present), ["0", "549755813888", "824633720832"], "the present's data:\n{present}");
    assert_eq!(data(&then), ["0", "549755813888"], "the bookmark's data:\n{then}");
    // 1 TiB of 4 KiB blocks has 4 GiB of metadata; what was written, 3 MiB,
    // has 12 KiB of it (in pages of 4 KiB, read by each of the three).
    assert!(read < 1 << 20, "{read} bytes of the current store read to map and restore the thin volume");
    let check = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x33 0 1M",
            "-c",
            "read -P 0x44 512G 1M",
            "-c",
            "read -P 0 768G 1M",
            restored.to_str().unwrap(),
        ],
    );
    assert_eq!(check.matches("read 1048576/1048576 bytes").count(), 3, "{check}");
    let allocated =
        std::fs::metadata(&restored).map(|metadata| std::os::unix::fs::MetadataExt::blocks(&metadata)).unwrap();
    assert!(allocated * 512 < 16 << 20, "the restored terabyte is sparse: {allocated} sectors allocated");
}
