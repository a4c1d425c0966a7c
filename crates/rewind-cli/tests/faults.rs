//! The bad day with a real server and real clients: a full disk (a small
//! loop-mounted ext4 holding the data directory), damaged files of one
//! volume while another is served, a damaged journal tail, private file
//! modes, volumes too large for the filesystem.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{require, run, run_failing, wait_for, Server};

/// A small ext4 filesystem on a loop device, mounted for the test's life.
struct LoopFs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    fn new(size_mib: u64) -> LoopFs {
        for tool in ["mkfs.ext4", "mount", "umount", "fallocate"] {
            require(tool);
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image).unwrap().set_len(size_mib << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", "-m", "0", image.to_str().unwrap()]);
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        run("mount", &["-o", "loop", image.to_str().unwrap(), mount.to_str().unwrap()]);
        LoopFs { mount, _dir: dir }
    }

    fn free_bytes(&self) -> u64 {
        let output = run("df", &["--output=avail", "-B1", self.mount.to_str().unwrap()]);
        output.lines().nth(1).unwrap().trim().parse().unwrap()
    }

    /// Takes all but about `leave` bytes of the free space with a filler
    /// file (ext4 needs some of what it reports free for the filler's own
    /// extents: it asks for less until it fits).
    fn fill(&self, leave: u64) -> PathBuf {
        let filler = self.mount.join("filler");
        let mut size = self.free_bytes().saturating_sub(leave);
        loop {
            let status = Command::new("fallocate").args(["-l", &size.to_string()]).arg(&filler).status().unwrap();
            if status.success() {
                return filler;
            }
            assert!(size > 1 << 20, "cannot fill {}", self.mount.display());
            size -= 256 << 10;
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn qemu_io(server: &Server, export: &str, commands: &[&str]) -> std::process::Output {
    let mut args = vec!["-f", "raw"];
    if export.contains('@') {
        // Views are read-only.
        args.push("-r");
    }
    for command in commands {
        args.extend(["-c", command]);
    }
    let uri = server.uri(export);
    args.push(&uri);
    Command::new("qemu-io").args(&args).output().expect("qemu-io runs")
}

/// qemu-io's commands can fail while it exits 0: its output says.
fn failed(output: &std::process::Output) -> Option<String> {
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (text.contains("failed") || !output.status.success()).then_some(text)
}

fn state_of(server: &Server, volume: &str) -> serde_json::Value {
    let list: serde_json::Value = serde_json::from_str(&server.rewind(&["volume", "list", "--json"])).unwrap();
    list.as_array().unwrap().iter().find(|info| info["name"] == volume).cloned().unwrap_or_else(|| panic!("{list}"))
}

#[test]
fn a_full_disk_fails_writes_with_enospc_and_recovers_by_itself() {
    require("qemu-io");
    require("qemu-img");
    let fs = LoopFs::new(192);
    let data_dir = fs.mount.join("rewind-data");
    let mut server = Server::start_with(&data_dir, &["--reserve", "0"]);
    server.rewind(&["volume", "create", "v", "--size", "32MiB"]);
    assert!(failed(&qemu_io(&server, "v", &["write -P 0x11 0 32M", "flush"])).is_none());
    // The disk fills (another tenant); the journal's segment was allocated
    // whole, so writes go on into it until it is full...
    let filler = fs.fill(256 << 10);
    let mut enospc = None;
    for round in 0..8 {
        let output = qemu_io(&server, "v", &[&format!("write -P 0x{:x} 0 16M", 0x20 + round), "flush"]);
        if let Some(text) = failed(&output) {
            enospc = Some(text);
            break;
        }
    }
    let text = enospc.expect("the disk filled up");
    assert!(text.contains("No space left on device"), "NBD clients get ENOSPC, not ESHUTDOWN: {text}");
    // ...and then fail with ENOSPC; the volume is not poisoned, reads go on.
    let info = state_of(&server, "v");
    assert_eq!(info["poisoned"], false, "{info}");
    assert!(failed(&qemu_io(&server, "v", &["read 0 32M"])).is_none());
    // Space comes back: writes work again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    wait_for("writes to work again", || failed(&qemu_io(&server, "v", &["write -P 0x5a 0 1M", "flush"])).is_none());
    assert!(failed(&qemu_io(&server, "v", &["read -P 0x5a 0 1M"])).is_none());
    // Full again, and the process dies: it starts on a full disk, with every
    // acknowledged write.
    let filler = fs.fill(0);
    server.kill();
    let server = Server::start_with(&data_dir, &["--reserve", "0"]);
    assert!(failed(&qemu_io(&server, "v", &["read -P 0x5a 0 1M"])).is_none(), "started on a full disk");
    // With it, Rewind itself frees space: deleting a volume.
    server.rewind(&["volume", "delete", "v", "--yes"]);
    std::fs::remove_file(&filler).unwrap();
}

#[test]
fn writes_stop_at_the_reserve_and_say_so() {
    require("qemu-io");
    let fs = LoopFs::new(192);
    let data_dir = fs.mount.join("rewind-data");
    let server = Server::start_with(&data_dir, &["--reserve", "48MiB"]);
    server.rewind(&["volume", "create", "v", "--size", "8MiB"]);
    assert!(failed(&qemu_io(&server, "v", &["write -P 1 0 1M", "flush"])).is_none());
    let filler = fs.fill(32 << 20);
    wait_for("the reserve to be reached", || {
        let stats: serde_json::Value = serde_json::from_str(&server.rewind(&["stats", "--json"])).unwrap();
        stats["disk_state"] == "exhausted"
    });
    let text = failed(&qemu_io(&server, "v", &["write -P 2 0 1M"])).expect("writes are refused below the reserve");
    assert!(text.contains("No space left on device"), "{text}");
    let stats = server.rewind(&["stats"]);
    assert!(stats.contains("BELOW THE RESERVE"), "{stats}");
    let metrics = run("curl", &["-s", "-H", &server.authorization(), &format!("{}/metrics", server.api())]);
    assert!(metrics.contains("rewind_disk_space_low 2"), "alerting sees it");
    std::fs::remove_file(&filler).unwrap();
    wait_for("writes to work again", || failed(&qemu_io(&server, "v", &["write -P 3 0 1M"])).is_none());
}

/// A data directory with volumes `a` and `b`, history archived and
/// recent, bookmarks, the server stopped cleanly.
fn two_volumes(dir: &Path) {
    let mut server = Server::start_with(dir, &["--archive-interval", "1s"]);
    for (name, fill) in [("a", 0x0a), ("b", 0x0b)] {
        server.rewind(&["volume", "create", name, "--size", "8MiB"]);
        assert!(failed(&qemu_io(&server, name, &[&format!("write -P {fill} 0 8M"), "flush"])).is_none());
        server.rewind(&["bookmark", name, "first"]);
    }
    wait_for("history to be archived", || {
        let stats: serde_json::Value = serde_json::from_str(&server.rewind(&["stats", "--json"])).unwrap();
        stats["chunks_live"].as_u64().unwrap() > 0
    });
    for (name, fill) in [("a", 0x1a), ("b", 0x1b)] {
        assert!(failed(&qemu_io(&server, name, &[&format!("write -P {fill} 1M 1M"), "flush"])).is_none());
    }
    server.stop();
}

fn flip(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], offset).unwrap();
}

fn flip_both_copies(path: &Path) {
    let size = std::fs::metadata(path).unwrap().len();
    flip(path, 10);
    flip(path, size / 2 + 10);
}

/// `b` is served whole, at present and at its bookmark.
fn b_is_served(server: &Server) {
    assert!(failed(&qemu_io(server, "b", &["read -P 0x0b 0 1M", "read -P 0x1b 1M 1M", "read -P 0x0b 2M 6M"])).is_none());
    assert!(failed(&qemu_io(server, "b@first", &["read -P 0x0b 0 8M"])).is_none());
}

#[test]
fn one_damaged_file_takes_out_only_its_volume_until_repaired() {
    require("qemu-io");
    let pristine = tempfile::tempdir().unwrap();
    two_volumes(pristine.path());
    let index_run = |dir: &Path| -> PathBuf {
        let runs = dir.join("volumes/a/index");
        let mut names: Vec<String> = std::fs::read_dir(&runs)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".run"))
            .collect();
        names.sort();
        runs.join(&names[0])
    };
    type Damage = fn(&Path);
    // What was damaged, how, the volume's state when the server has
    // started, and what the repair says.
    let cases: [(&str, Damage, &str, &str); 7] = [
        ("checkpoint", |dir| flip_both_copies(&dir.join("volumes/a/checkpoint")), "damaged", "repaired"),
        ("policy", |dir| flip_both_copies(&dir.join("volumes/a/policy")), "damaged", "retention policy"),
        ("bookmarks", |dir| flip_both_copies(&dir.join("volumes/a/bookmarks")), "damaged", "bookmark"),
        ("index manifest", |dir| flip(&dir.join("volumes/a/index/manifest"), 20), "ok", "not damaged"),
        ("volume.meta", |dir| flip(&dir.join("volumes/a/volume.meta"), 20), "ok", "not damaged"),
        // After a clean stop the server takes back the chunk reference
        // counts it saved instead of reading every index page to count
        // them: a run damaged meanwhile is found by the repair's check.
        ("index run", |_| {}, "ok", "repaired"),
        // After a crash it counts, reading every page: found at start.
        (
            "index run, after a crash",
            |dir| std::fs::remove_file(dir.join("chunks/counts.meta")).unwrap(),
            "damaged",
            "repaired",
        ),
    ];
    for (kind, damage, state, expected) in cases {
        println!("damaged: {kind}");
        let dir = tempfile::tempdir().unwrap();
        run("cp", &["-a", &format!("{}/.", pristine.path().display()), dir.path().to_str().unwrap()]);
        if kind.starts_with("index run") {
            flip(&index_run(dir.path()), 4096 + 300);
        }
        damage(dir.path());
        let server = Server::start(dir.path());
        b_is_served(&server);
        let info = state_of(&server, "a");
        assert_eq!(info["state"], state, "{kind}: {info}");
        if state == "damaged" {
            let problem = info["problem"].as_str().unwrap();
            assert!(problem.contains("damaged") && !problem.contains("truncated"), "{kind}: {problem}");
            assert!(problem.contains("rewind volume repair a"), "says what to do: {problem}");
        }
        let repair = server.rewind(&["volume", "repair", "a", "--yes"]);
        assert!(repair.contains(expected), "{kind}: {repair}");
        assert!(failed(&qemu_io(&server, "a", &["read -P 0x0a 0 1M", "read -P 0x1a 1M 1M"])).is_none(), "{kind}");
        b_is_served(&server);
    }
}

#[test]
fn a_volume_beyond_repair_is_deleted_offline_and_online() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    two_volumes(dir.path());
    flip_both_copies(&dir.path().join("volumes/a/volume.meta"));
    // Offline: the CLI works on the data directory itself.
    let offline = |args: &[&str]| {
        let mut command = Command::new(common::REWIND);
        command.args(args).args(["--offline", "--data-dir", dir.path().to_str().unwrap()]);
        command.output().unwrap()
    };
    let listed = String::from_utf8(offline(&["volume", "list"]).stdout).unwrap();
    assert!(listed.contains("DAMAGED") && listed.contains("volume.meta"), "{listed}");
    let repair = offline(&["volume", "repair", "a", "--yes"]);
    assert!(!repair.status.success(), "nothing derives volume.meta");
    assert!(String::from_utf8_lossy(&repair.stdout).contains("cannot repair"));
    let server = Server::start(dir.path());
    b_is_served(&server);
    server.rewind(&["volume", "delete", "a", "--yes"]);
    assert!(!dir.path().join("volumes/a").exists());
    b_is_served(&server);
}

#[test]
fn a_damaged_acknowledged_last_write_is_reported_not_rolled_back() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    server.rewind(&["volume", "create", "v", "--size", "1MiB"]);
    assert!(failed(&qemu_io(&server, "v", &["write -P 1 0 64k", "flush"])).is_none());
    assert!(failed(&qemu_io(&server, "v", &["write -P 2 0 64k", "flush"])).is_none());
    // Once the journal has been quiet a moment, it vouches for the last write.
    wait_for("the journal to vouch for its last write", || {
        let info: serde_json::Value = serde_json::from_str(&server.rewind(&["volume", "info", "v", "--json"])).unwrap();
        let stats = &info["stats"];
        stats["lsn_vouched"].as_u64() == stats["lsn_durable"].as_u64() && stats["lsn_durable"].as_u64() > Some(0)
    });
    server.kill();
    let segment = dir.path().join("volumes/v/journal/00000001.seg");
    let end = rewind_format::journal::records_end(&std::fs::read(&segment).unwrap());
    // In the last write's blocks (the vouch record, 64 bytes, follows it).
    flip(&segment, end - 64 - 1000);
    let server = Server::start(dir.path());
    let info = state_of(&server, "v");
    assert_eq!(info["state"], "damaged", "an acknowledged write was damaged, not silently rolled back: {info}");
    let repair = server.rewind(&["volume", "repair", "v", "--yes"]);
    assert!(repair.contains("lost:") && repair.contains("1 writes from LSN 2"), "{repair}");
    // The lost write is gone, as said; the one before it is there.
    assert!(failed(&qemu_io(&server, "v", &["read -P 1 0 64k"])).is_none());
}

#[test]
fn data_is_private_and_oversized_volumes_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(&data_dir);
    server.rewind(&["volume", "create", "v", "--size", "1MiB"]);
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data_dir), 0o700, "the data directory is made private");
    for path in ["volumes/v", "volumes/v/journal", "chunks"] {
        assert_eq!(mode(&data_dir.join(path)), 0o700, "{path}");
    }
    for path in ["volumes/v/volume.meta", "volumes/v/current.img", "volumes/v/journal/00000001.seg", "chunks/table"] {
        assert_eq!(mode(&data_dir.join(path)), 0o600, "{path}");
    }
    let error = server.rewind_failing(&["volume", "create", "huge", "--size", "1EiB"]);
    assert!(error.contains("larger than the data directory's filesystem allows"), "{error}");
    assert!(!data_dir.join("volumes/huge").exists(), "nothing is left behind");
    assert!(!run_failing("ls", &[data_dir.join("volumes/huge").to_str().unwrap()]).is_empty());
}
