//! History that lasts, end to end with the real server and real clients:
//! history archived into the deduplicated, compressed chunk store (across
//! volumes), views reading it back, `rewind stats` and `rewind gc`, the
//! space cap, and a `kill -9` after all of it.

mod common;

use std::path::Path;

use common::{json, pattern, require, run, wait_for, Server};

fn stats(server: &Server, volume: &str) -> serde_json::Value {
    json(&server.rewind(&["stats", volume, "--json"]))
}

/// The volume's counters (`volume info`'s `stats`).
fn counters(server: &Server, volume: &str) -> serde_json::Value {
    json(&server.rewind(&["volume", "info", volume, "--json"]))["stats"].clone()
}

/// Waits until the archive pass has moved all of `volume`'s history out of
/// the journal.
fn wait_archived(server: &Server, volume: &str) {
    wait_for(&format!("{volume}'s history to be archived"), || {
        stats(server, volume)["versions_in_journal"].as_u64() == Some(0)
    });
}

/// 8 MiB of incompressible bytes, then 8 MiB of numbered lines of text:
/// no two blocks alike, but each compresses well.
fn write_image(path: &Path) {
    let mut image = pattern(1, 8 << 20);
    let mut line = 0;
    while image.len() < 16 << 20 {
        image.extend(format!("line {line:08}: Rewind keeps every write, and compresses what it keeps.\n").bytes());
        line += 1;
    }
    image.truncate(16 << 20);
    std::fs::write(path, image).unwrap();
}

#[test]
fn archived_history_is_deduplicated_compressed_and_reads_back() {
    require("qemu-img");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let image = dir.path().join("image.raw");
    write_image(&image);
    let image = image.to_str().unwrap();
    let mut server = Server::start_with(&data, &["--archive-interval", "100ms", "--gc-interval", "1h"]);
    for volume in ["db", "copy"] {
        server.rewind(&["volume", "create", volume, "--size", "16MiB"]);
        run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", image, &server.uri(volume)]);
        server.rewind(&["bookmark", volume, "imported"]);
    }
    // Bytes only `db` ever held, overwritten at once: garbage once their
    // history is deleted.
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x33 0 4M", &server.uri("db")]);
    let before_unique = server.rewind(&["bookmark", "db", "before-unique", "--json"]);
    let before_unique = json(&before_unique)["at"].as_str().unwrap().to_owned();
    std::fs::write(dir.path().join("unique.raw"), pattern(7, 2 << 20)).unwrap();
    let unique = dir.path().join("unique.raw");
    run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", unique.to_str().unwrap(), &server.uri("db")]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x44 0 4M", &server.uri("db")]);
    let after_unique = json(&server.rewind(&["bookmark", "db", "after-unique", "--json"]));
    let after_unique = after_unique["at"].as_str().unwrap().to_owned();
    wait_archived(&server, "db");
    wait_archived(&server, "copy");

    // The same 16 MiB in two volumes is stored once, and the text compresses.
    let node = json(&server.rewind(&["stats", "--json"]));
    assert!(node["dedup_ratio"].as_f64().unwrap() > 1.9, "{node:#}");
    assert!(node["compression_ratio"].as_f64().unwrap() > 1.5, "{node:#}");
    assert!(node["pack_bytes"].as_u64().unwrap() < 14 << 20, "{node:#}");
    let db = stats(&server, "db");
    assert_eq!(db["versions_kept"], db["versions_written"], "every write is kept: {db:#}");
    let info = json(&server.rewind(&["volume", "info", "db", "--json"]));
    assert!(info["stats"]["archive_passes"].as_u64().unwrap() > 0, "passes counted: {info:#}");
    assert!(info["stats"]["archive_pauses"].is_u64(), "{info:#}");
    assert_eq!(db["retained_fraction"], 1.0);
    let human = server.rewind(&["stats"]);
    assert!(human.contains("dedup") && human.contains("copy"), "{human}");

    // Views read the archived history back, checked against the image.
    for volume in ["db", "copy"] {
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri(&format!("{volume}@imported"))]);
    }
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x33 0 4M", &server.uri("db@before-unique")]);

    // Deleting the history that held the unique bytes makes them garbage;
    // what `copy` shares survives collection.
    server.rewind(&["bookmark", "delete", "db", "before-unique"]);
    server.rewind(&["history", "delete", "db", "--from", &before_unique, "--to", &after_unique, "--yes"]);
    let collected = json(&server.rewind(&["gc", "--json"]));
    assert!(collected["chunks_freed"].as_u64().unwrap() >= 512, "2 MiB of unique 4 KiB chunks: {collected:#}");
    let human = server.rewind(&["gc", "--progress"]);
    assert!(human.contains("freed 0 chunks"), "nothing left to free: {human}");
    for volume in ["db", "copy"] {
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri(&format!("{volume}@imported"))]);
    }

    // A crash: on restart every chunk history refers to is counted again.
    let live = json(&server.rewind(&["stats", "--json"]))["chunks_live"].clone();
    server.kill();
    // Offline, straight on the data directory, and after a restart.
    let offline = run(common::REWIND, &["stats", "--json", "--offline", "--data-dir", data.to_str().unwrap()]);
    assert_eq!(json(&offline)["chunks_live"], live, "{offline}");
    let server = Server::start_with(&data, &["--archive-interval", "100ms"]);
    // Before anything else has measured the volumes: a scrape measures them.
    let metrics = run("curl", &["-sf", "-H", &server.authorization(), &format!("{}/metrics", server.api())]);
    assert!(metrics.contains("rewind_chunks_live ") && metrics.contains("rewind_chunk_dedup_hits_total"), "{metrics}");
    let pack_bytes = metrics.lines().find_map(|line| line.strip_prefix("rewind_volume_pack_bytes{volume=\"copy\"} "));
    assert!(pack_bytes.and_then(|bytes| bytes.parse::<u64>().ok()).is_some_and(|bytes| bytes > 1 << 20), "{metrics}");
    let node = json(&server.rewind(&["stats", "--json"]));
    assert_eq!(node["chunks_live"], live, "{node:#}");
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", image, &server.uri("copy@imported")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x44 0 4M", &server.uri("db@after-unique")]);
}

/// Volume `v` (8 MiB) filled, its odd blocks in the first 2 MiB rewritten
/// in a later pass, bookmarked `mixed`, then written over whole: a view of
/// `mixed` reads its history from two places. Returns the path of an image
/// of what it reads.
fn mixed_history(server: &Server, dir: &Path) -> String {
    require("qemu-img");
    require("qemu-io");
    let image = dir.join("image.raw");
    std::fs::write(&image, pattern(3, 8 << 20)).unwrap();
    server.rewind(&["volume", "create", "v", "--size", "8MiB"]);
    run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", image.to_str().unwrap(), &server.uri("v")]);
    wait_archived(server, "v");
    let odd_blocks: Vec<String> =
        (0..256).map(|block| format!("write -P 0x55 {} 4k", (2 * block + 1) * 4096)).collect();
    let mut args = vec!["-f", "raw"];
    for command in &odd_blocks {
        args.extend(["-c", command.as_str()]);
    }
    let uri = server.uri("v");
    args.push(&uri);
    run("qemu-io", &args);
    wait_archived(server, "v");
    server.rewind(&["bookmark", "v", "mixed"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x66 0 8M", &server.uri("v")]);
    wait_archived(server, "v");
    let mut expected = std::fs::read(&image).unwrap();
    for block in 0..256 {
        let at = (2 * block + 1) * 4096;
        expected[at..at + 4096].fill(0x55);
    }
    let expected_path = dir.join("expected.raw");
    std::fs::write(&expected_path, &expected).unwrap();
    let expected_path = expected_path.to_str().unwrap().to_owned();
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &expected_path, &server.uri("v@mixed")]);
    expected_path
}

/// `rewind volume defrag`, on a server that leaves bookmarks as archived:
/// laid out in block order, `v@mixed` reads the same bytes, a second
/// defrag leaves it be, and a bad point is refused with a way forward.
#[test]
fn defrag_lays_out_a_view_in_block_order_and_it_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let options = ["--archive-interval", "100ms", "--gc-interval", "1h", "--no-bookmark-layout"];
    let server = Server::start_with(&dir.path().join("data"), &options);
    let expected_path = mixed_history(&server, dir.path());
    assert_eq!(counters(&server, "v")["bookmarks_awaiting_layout"], 0, "none with --no-bookmark-layout");

    let summary = json(&server.rewind(&["volume", "defrag", "v@mixed", "--json"]));
    assert_eq!(summary["blocks_archived"], 2048, "{summary:#}");
    // The 256 rewritten blocks are alike: one chunk, laid out once.
    assert_eq!(summary["chunks"], 1792 + 1, "{summary:#}");
    assert!(summary["runs_before"].as_u64().unwrap() > 256, "half of 2 MiB from elsewhere: {summary:#}");
    assert_eq!(summary["chunks_moved"], 1793, "{summary:#}");
    assert!(summary["bytes_written"].as_u64().unwrap() >= 1793 * 4096, "{summary:#}");
    assert_eq!(json(&server.rewind(&["stats", "--json"]))["chunks_relocated"], 1793);
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &expected_path, &server.uri("v@mixed")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x66 0 8M", &server.uri("v")]);

    let again = server.rewind(&["volume", "defrag", "v@mixed", "--progress"]);
    assert!(again.contains("lay in one run of neighbouring records; 0 chunks laid out"), "{again}");
    let refused = server.rewind_failing(&["volume", "defrag", "v"]);
    assert!(refused.contains("is not VOLUME@TIME"), "{refused}");
    let refused = server.rewind_failing(&["volume", "defrag", "v@no-such-bookmark"]);
    assert!(refused.contains("no-such-bookmark"), "{refused}");
}

/// By default the server lays out a bookmark's history by itself once it
/// is archived: `v@mixed` reads the same bytes, `volume defrag` finds
/// nothing left to move, and after a restart nothing waits again.
#[test]
fn a_server_lays_out_a_bookmarks_history_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let options = ["--archive-interval", "100ms", "--gc-interval", "1h"];
    let mut server = Server::start_with(&data, &options);
    let expected_path = mixed_history(&server, dir.path());
    wait_for("the bookmark's history to be laid out", || {
        counters(&server, "v")["bookmarks_awaiting_layout"].as_u64() == Some(0)
    });
    let written = counters(&server, "v")["layout_bytes_written"].as_u64().unwrap();
    assert!(written >= 1793 * 4096, "{written} bytes of packs written laying out 1,793 chunks");
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &expected_path, &server.uri("v@mixed")]);
    let summary = json(&server.rewind(&["volume", "defrag", "v@mixed", "--json"]));
    assert_eq!(
        (&summary["chunks"], &summary["runs_before"], &summary["chunks_moved"]),
        (&1793.into(), &1.into(), &0.into()),
        "{summary:#}"
    );

    server.stop();
    let server = Server::start_with(&data, &options);
    let after = counters(&server, "v");
    assert_eq!(
        (&after["bookmarks_awaiting_layout"], &after["layout_bytes_written"]),
        (&0.into(), &0.into()),
        "{after:#}"
    );
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", &expected_path, &server.uri("v@mixed")]);
}

#[test]
fn a_space_cap_drops_the_oldest_history_but_keeps_bookmarks() {
    require("qemu-img");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let mut options = vec!["--archive-interval", "100ms", "--retention-interval", "200ms"];
    options.extend(["--gc-interval", "100ms"]);
    let server = Server::start_with(&dir.path().join("data"), &options);
    server.rewind(&["volume", "create", "cap", "--size", "4MiB"]);
    let mut times = Vec::new();
    for generation in 0..4u64 {
        let file = dir.path().join(format!("generation-{generation}.raw"));
        std::fs::write(&file, pattern(100 + generation, 4 << 20)).unwrap();
        run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", file.to_str().unwrap(), &server.uri("cap")]);
        let name = format!("generation-{generation}");
        let mark = json(&server.rewind(&["bookmark", "cap", &name, "--json"]));
        times.push(mark["at"].as_str().unwrap().to_owned());
    }
    // Keep one bookmark; the others only named times to come back to.
    for generation in [1, 2] {
        server.rewind(&["bookmark", "delete", "cap", &format!("generation-{generation}")]);
    }
    wait_archived(&server, "cap");
    assert!(stats(&server, "cap")["pack_bytes"].as_u64().unwrap() >= 16 << 20);
    let info = json(&server.rewind(&["volume", "set", "cap", "--space-max", "10MiB", "--json"]));
    assert_eq!(info["space_max_bytes"], 10 << 20);
    wait_for("the cap to drop old history", || {
        let report = stats(&server, "cap");
        !report["oldest_kept"].is_null() && report["pack_bytes"].as_u64().unwrap() <= 10 << 20
    });
    let error = server.rewind_failing(&["view", "cap", &times[1]]);
    assert!(error.contains("keeps no history before") && error.contains("nearest points kept"), "{error}");
    // Bookmarks stay, and so does the present.
    for generation in [0, 3] {
        let file = dir.path().join(format!("generation-{generation}.raw"));
        let view = server.uri(&format!("cap@generation-{generation}"));
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", file.to_str().unwrap(), &view]);
    }
    let info = server.rewind(&["volume", "info", "cap"]);
    assert!(info.contains("at most 10.0 MiB archived"), "{info}");
    let error = server.rewind_failing(&["volume", "set", "cap", "--space-max", "lots"]);
    assert!(error.contains("cannot read the space cap"), "{error}");
}
