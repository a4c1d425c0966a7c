//! File trees through real NFS clients (libnfs's nfs-cp, nfs-ls and
//! nfs-cat) against a real `rewind serve`: files in and out, the past as
//! `/.rewind/TIME` and `/TREE@TIME`, a tree kept across a restart, and NBD
//! keeping its hands off trees.

mod common;

use std::fs;

use common::{json, require, run, run_failing, Server};

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
