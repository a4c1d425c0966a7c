//! File trees through real NFS clients (libnfs's nfs-cp, nfs-ls and
//! nfs-cat) against a real `rewind serve`: files in and out, the past as
//! `/.rewind/TIME` and `/TREE@TIME`, a tree kept across a restart, and NBD
//! keeping its hands off trees; a tree in a group with a block volume, and
//! a space cap on a tree's history.

mod common;

use std::fs;

use common::{json, require, run, run_failing, wait_for, Server};

use common::{nfs_names as names, nfs_url as url};

#[test]
fn files_go_in_and_come_back_now_and_as_they_were() {
    for tool in ["nfs-cp", "nfs-ls", "nfs-cat", "nbdinfo"] {
        require(tool);
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let created = json(&server.rewind(&["tree", "create", "home", "--json"]));
    assert_eq!(created["kind"], "tree");
    assert_eq!(created["export"], "/home");
    let listed = server.rewind(&["tree", "list"]);
    assert!(listed.contains("home") && listed.contains("/home"), "{listed}");

    // In: a file of 3 MiB (several 1 MiB WRITEs) and a small one.
    let big: Vec<u8> = common::pattern(7, 3 << 20);
    fs::write(dir.path().join("big.bin"), &big).unwrap();
    fs::write(dir.path().join("notes.txt"), "first draft\n").unwrap();
    for file in ["big.bin", "notes.txt"] {
        run("nfs-cp", &[dir.path().join(file).to_str().unwrap(), &url(&server, &format!("/home/{file}"))]);
    }
    assert_eq!(names(&run("nfs-ls", &[&url(&server, "/home")])), ["big.bin", "notes.txt"]);
    assert_eq!(run("nfs-cat", &[&url(&server, "/home/notes.txt")]), "first draft\n");
    let copied = dir.path().join("big.copy");
    run("nfs-cp", &[&url(&server, "/home/big.bin"), copied.to_str().unwrap()]);
    assert!(fs::read(&copied).unwrap() == big, "3 MiB come back as they went in");

    // Every version of a file, with who made it.
    let history = json(&server.rewind(&["tree", "history", "home", "notes.txt", "--json"]));
    let versions = history["versions"].as_array().unwrap();
    assert!(versions.len() >= 2, "created, then written: {history}");
    assert_eq!(versions[0]["size_bytes"], 12, "newest first");
    assert!(versions[0]["client"].as_str().unwrap().starts_with("127.0.0.1:"), "{history}");
    let times: Vec<u64> = versions.iter().map(|version| version["at_unix_nanos"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|pair| pair[0] > pair[1]), "{times:?}");
    let missing = server.rewind_failing(&["tree", "history", "home", "nope.txt"]);
    assert!(missing.contains("home has no nope.txt now"), "{missing}");

    // A bookmark, then the present moves on.
    let bookmark = json(&server.rewind(&["bookmark", "home", "before-cleanup", "--json"]));
    let at = bookmark["at"].as_str().unwrap().to_owned();
    fs::write(dir.path().join("later.txt"), "written after the bookmark\n").unwrap();
    run("nfs-cp", &[dir.path().join("later.txt").to_str().unwrap(), &url(&server, "/home/later.txt")]);
    assert_eq!(names(&run("nfs-ls", &[&url(&server, "/home")])), ["big.bin", "later.txt", "notes.txt"]);

    // The past, by bookmark and by time (percent-encoded, as in a URL), is
    // the tree as it was; `.rewind` is not listed in the root, but found.
    let encoded = at.replace(':', "%3A");
    for past in ["/home/.rewind/before-cleanup", &format!("/home/.rewind/{encoded}"), "/home@before-cleanup"] {
        assert_eq!(names(&run("nfs-ls", &[&url(&server, past)])), ["big.bin", "notes.txt"], "{past}");
        assert_eq!(run("nfs-cat", &[&url(&server, &format!("{past}/notes.txt"))]), "first draft\n", "{past}");
    }
    assert_eq!(names(&run("nfs-ls", &[&url(&server, "/home/.rewind")])), ["before-cleanup"]);
    // `tree view` names the exact point, whichever way it was asked for.
    let view = json(&server.rewind(&["tree", "view", "home", "before-cleanup", "--json"]));
    let exact = view["at_unix_nanos"].as_u64().unwrap().to_string();
    for past in [format!("/home/.rewind/{exact}"), format!("/home@{exact}")] {
        assert_eq!(names(&run("nfs-ls", &[&url(&server, &past)])), ["big.bin", "notes.txt"], "{past}");
    }
    let shown = server.rewind(&["tree", "view", "home", "before-cleanup"]);
    assert!(shown.contains(&format!("path    /home/.rewind/{exact}/")), "{shown}");
    assert!(!run("nfs-ls", &[&url(&server, "/home")]).contains(".rewind"));
    // Read-only: a copy into the past is refused by the server.
    let refused = run_failing(
        "nfs-cp",
        &[dir.path().join("later.txt").to_str().unwrap(), &url(&server, "/home/.rewind/before-cleanup/x.txt")],
    );
    assert!(refused.contains("NFS3ERR_ROFS"), "{refused}");
    // A time before the tree existed is no directory.
    let before = run_failing("nfs-ls", &[&url(&server, "/home/.rewind/2001-01-01T00:00:00Z")]);
    assert!(before.contains("MNT3ERR_NOENT"), "{before}");

    // Copied out as it was: the whole tree, and one file, from the bookmark.
    let restored = dir.path().join("restored");
    let summary =
        json(&server.rewind(&["tree", "restore", "home@before-cleanup", "--to", restored.to_str().unwrap(), "--json"]));
    assert_eq!((summary["files"].as_u64(), summary["bytes"].as_u64()), (Some(2), Some(3 * 1024 * 1024 + 12)));
    assert!(fs::read(restored.join("big.bin")).unwrap() == big);
    assert_eq!(fs::read_to_string(restored.join("notes.txt")).unwrap(), "first draft\n");
    assert!(!restored.join("later.txt").exists(), "written after the bookmark");
    let one = dir.path().join("notes-then.txt");
    server.rewind(&["tree", "restore", "home@before-cleanup/notes.txt", "--to", one.to_str().unwrap()]);
    assert_eq!(fs::read_to_string(&one).unwrap(), "first draft\n");
    let occupied = server.rewind_failing(&["tree", "restore", "home", "--to", restored.to_str().unwrap()]);
    assert!(occupied.contains("is not an empty directory"), "{occupied}");

    // Put back in place: notes.txt as it was (later.txt stays), then undone.
    let reverted = json(&server.rewind(&["tree", "revert", "home", "later.txt", "--to", "before-cleanup", "--json"]));
    assert_eq!(reverted["removed"], 1, "later.txt did not exist then: going back removes it");
    assert_eq!(names(&run("nfs-ls", &[&url(&server, "/home")])), ["big.bin", "notes.txt"]);
    let bookmark = reverted["bookmark"].as_str().unwrap().to_owned();
    server.rewind(&["tree", "revert", "home", "later.txt", "--to", &bookmark]);
    assert_eq!(run("nfs-cat", &[&url(&server, "/home/later.txt")]), "written after the bookmark\n", "undone");

    // A tree is not a disk: NBD neither lists nor opens it.
    let nbd = run_failing("nbdinfo", &[&server.uri("home")]);
    assert!(nbd.contains("No such file or directory for export: home"), "{nbd}");
    let exports = run("nbdinfo", &["--list", "--json", &server.uri("")]);
    assert!(!exports.contains("\"home"), "{exports}");

    // Kept across a restart, the past too.
    server.stop();
    let server = Server::start(&data);
    assert_eq!(run("nfs-cat", &[&url(&server, "/home/later.txt")]), "written after the bookmark\n");
    assert_eq!(names(&run("nfs-ls", &[&url(&server, "/home/.rewind/before-cleanup")])), ["big.bin", "notes.txt"]);
}

/// Writes `data` over the start of `file` in the root of tree `export`,
/// stably, in place (`nfs-cp` only makes new files).
fn overwrite(server: &Server, export: &str, file: &str, data: &[u8]) {
    use nfs3_client::nfs3_types::nfs3::*;
    use nfs3_client::nfs3_types::xdr_codec::Opaque;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut client = common::nfs_connect(server.nfs.port(), export).await;
        let what = diropargs3 { dir: client.root_nfs_fh3(), name: filename3(Opaque::borrowed(file.as_bytes())) };
        let handle = client.lookup(&LOOKUP3args { what }).await.unwrap().unwrap().object;
        for (index, piece) in data.chunks(1 << 20).enumerate() {
            let write = WRITE3args {
                file: handle.clone(),
                offset: (index << 20) as u64,
                count: piece.len() as u32,
                stable: stable_how::FILE_SYNC,
                data: Opaque::borrowed(piece),
            };
            client.write(&write).await.unwrap().unwrap();
        }
    });
}

/// The file at `path` of the tree, copied out through NFS.
fn fetched(server: &Server, path: &str, into: &std::path::Path) -> Vec<u8> {
    let _ = fs::remove_file(into);
    run("nfs-cp", &[&url(server, path), into.to_str().unwrap()]);
    fs::read(into).unwrap()
}

#[test]
fn a_tree_shares_a_groups_bookmarks_and_its_space_cap_drops_only_unbookmarked_history() {
    for tool in ["nfs-cp", "nfs-ls", "qemu-io"] {
        require(tool);
    }
    let dir = tempfile::tempdir().unwrap();
    let options = ["--archive-interval", "100ms", "--retention-interval", "200ms", "--gc-interval", "100ms"];
    let server = Server::start_with(&dir.path().join("data"), &options);
    server.rewind(&["tree", "create", "docs"]);
    server.rewind(&["volume", "create", "db", "--size", "1MiB"]);
    let group = json(&server.rewind(&["group", "create", "shop", "db", "docs", "--json"]));
    assert_eq!(group["members"], serde_json::json!(["db", "docs"]), "{group}");

    // Four generations of one 4 MiB file (nothing alike between them), each
    // with the database beside it, each bookmarked across both at once.
    let mut times = Vec::new();
    for generation in 0..4u64 {
        let file = dir.path().join(format!("generation-{generation}.bin"));
        fs::write(&file, common::pattern(100 + generation, 4 << 20)).unwrap();
        match generation {
            0 => drop(run("nfs-cp", &[file.to_str().unwrap(), &url(&server, "/docs/data.bin")])),
            _ => overwrite(&server, "/docs", "data.bin", &fs::read(&file).unwrap()),
        }
        let fill = format!("write -P {} 0 1M", 0x40 + generation);
        run("qemu-io", &["-f", "raw", "-c", &fill, &server.uri("db")]);
        let taken = json(&server.rewind(&["bookmark", "shop", &format!("generation-{generation}"), "--json"]));
        let exports: Vec<&str> =
            taken["members"].as_array().unwrap().iter().map(|member| member["export"].as_str().unwrap()).collect();
        let name = format!("generation-{generation}");
        assert_eq!(exports, [format!("db@{name}"), format!("/docs@{name}")], "NBD's name, NFS's path: {taken}");
        times.push(taken["members"][1]["at"].as_str().unwrap().to_owned());
    }
    let listed = server.rewind(&["bookmark", "list", "docs"]);
    assert!(listed.contains("generation-0") && listed.contains("generation-3"), "a tree has the group's: {listed}");
    let refused = server.rewind_failing(&["revert", "shop", "--to", "generation-1"]);
    assert!(refused.contains("docs is a file tree") && refused.contains("rewind tree revert"), "{refused}");
    let then = dir.path().join("then.bin");
    for generation in [1, 2] {
        let read = fetched(&server, &format!("/docs/.rewind/generation-{generation}/data.bin"), &then);
        assert!(read == common::pattern(100 + generation, 4 << 20), "generation {generation} before the cap");
    }

    // Keep two of the group's bookmarks, cap the tree's history below the
    // four generations: the oldest unbookmarked history goes, and its
    // space with it; the bookmarks and the present stay.
    for generation in [1, 2] {
        server.rewind(&["bookmark", "delete", "shop", &format!("generation-{generation}")]);
    }
    wait_for("the tree's history to be archived", || {
        json(&server.rewind(&["stats", "docs", "--json"]))["versions_in_journal"].as_u64() == Some(0)
    });
    let stats = json(&server.rewind(&["stats", "docs", "--json"]));
    assert!(stats["pack_bytes"].as_u64().unwrap() >= 16 << 20, "{stats}");
    // (The views of generations 1 and 2 read above hold their times in
    // history while open; the server closes them once idle for 10 s.)
    let info = json(&server.rewind(&["volume", "set", "docs", "--space-max", "12MiB", "--json"]));
    assert_eq!(info["space_max_bytes"], 12 << 20);
    wait_for("the cap to drop the tree's old history", || {
        let report = json(&server.rewind(&["stats", "docs", "--json"]));
        !report["oldest_kept"].is_null() && report["pack_bytes"].as_u64().unwrap() <= 12 << 20
    });
    let gone = server.rewind_failing(&["tree", "view", "docs", &times[1]]);
    assert!(gone.contains("keeps no history before"), "{gone}");
    for generation in [0, 3] {
        let read = fetched(&server, &format!("/docs/.rewind/generation-{generation}/data.bin"), &then);
        assert!(read == common::pattern(100 + generation, 4 << 20), "bookmark generation-{generation} kept");
    }
    let now = fetched(&server, "/docs/data.bin", &then);
    assert!(now == common::pattern(103, 4 << 20), "the present kept");
    let db = server.rewind(&["volume", "info", "db"]);
    assert!(!db.contains("at most"), "the cap is the tree's alone: {db}");
}
