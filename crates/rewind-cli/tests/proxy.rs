//! `rewind proxy` in front of a real, unmodified NFSv3 server: nfs-ganesha
//! with its VFS back end over a local directory (Debian's `nfs-ganesha`,
//! `nfs-ganesha-vfs` and `rpcbind`, installed by scripts/test.sh; ganesha
//! runs as root, on free ports of 127.0.0.1, with the configuration below).
//! The clients are libnfs's nfs-cp, nfs-ls and nfs-cat. What the upstream
//! holds is read straight from its directory; what Rewind kept, through
//! `/.rewind` and `rewind tree restore`.

mod common;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use common::{json, nfs_names, nfs_url, require, run, wait_for, Server};

/// One nfs-ganesha at a time: instances share its state directories.
static GANESHA: Mutex<()> = Mutex::new(());

struct Ganesha {
    child: Child,
    export: PathBuf,
    nfs_port: u16,
    mount_port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Ganesha {
    /// Starts nfs-ganesha on free ports. A port found free can be taken by
    /// another process before ganesha binds it (tests run in parallel): it
    /// then exits, and is started again on other ports. Ready is what its
    /// log says, not a port that answers, which could be that other process.
    fn start(dir: &Path) -> Ganesha {
        for tool in ["ganesha.nfsd", "rpcbind", "nfs-cp", "nfs-ls", "nfs-cat"] {
            require(tool);
        }
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "nfs-ganesha's VFS back end needs root (open_by_handle_at); run the suite as root, as CI does"
        );
        let export = dir.join("export");
        fs::create_dir_all(&export).unwrap();
        // ganesha registers with the portmapper; `-w` keeps rpcbind's state warm.
        if !Command::new("pgrep").args(["-x", "rpcbind"]).stdout(Stdio::null()).status().unwrap().success() {
            run("rpcbind", &["-w"]);
        }
        const ATTEMPTS: usize = 5;
        let log = dir.join("ganesha.log");
        for attempt in 1..=ATTEMPTS {
            let (nfs_port, mount_port) = (free_port(), free_port());
            let mut child = Ganesha::spawn(dir, &export, nfs_port, mount_port);
            let mut exited = None;
            wait_for("nfs-ganesha to start or exit", || {
                exited = child.try_wait().unwrap();
                exited.is_some() || fs::read_to_string(&log).is_ok_and(|text| text.contains("NFS SERVER INITIALIZED"))
            });
            match exited {
                None => {
                    for port in [nfs_port, mount_port] {
                        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "nfs-ganesha listens on {port}");
                    }
                    return Ganesha { child, export, nfs_port, mount_port };
                }
                Some(status) => eprintln!(
                    "nfs-ganesha on ports {nfs_port}/{mount_port} exited ({status}; attempt {attempt} of {ATTEMPTS}): {}",
                    fs::read_to_string(&log).unwrap_or_default().lines().last().unwrap_or_default()
                ),
            }
        }
        panic!("nfs-ganesha did not start in {ATTEMPTS} attempts; its log is {}", log.display());
    }

    /// One ganesha process on the given ports, its log (emptied) in `dir`.
    fn spawn(dir: &Path, export: &Path, nfs_port: u16, mount_port: u16) -> Child {
        let (nlm, rquota) = (free_port(), free_port());
        // Attributes and directories uncached, so changes made in the
        // export directory behind ganesha's back are what it serves (the
        // test makes some, as another program on the upstream would).
        let config = dir.join("ganesha.conf");
        fs::write(
            &config,
            format!(
                "NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; NFS_Port = {nfs_port}; MNT_Port = {mount_port}; \
                 NLM_Port = {nlm}; Rquota_Port = {rquota}; Protocols = 3; Enable_NLM = false; \
                 Enable_RQUOTA = false; Enable_UDP = false; }}\n\
                 NFSV4 {{ Graceless = true; }}\n\
                 EXPORT {{ Export_Id = 1; Path = {path}; Pseudo = {path}; Access_Type = RW; \
                 Squash = No_Root_Squash; Protocols = 3; Transports = TCP; Attr_Expiration_Time = 0; \
                 FSAL {{ Name = VFS; }} }}\n\
                 MDCACHE {{ Dir_Chunk = 0; }}\n\
                 LOG {{ Default_Log_Level = EVENT; }}\n",
                path = export.display()
            ),
        )
        .unwrap();
        let log = dir.join("ganesha.log");
        let _ = fs::remove_file(&log);
        Command::new("ganesha.nfsd")
            .args(["-F", "-f"])
            .arg(&config)
            .arg("-L")
            .arg(&log)
            .arg("-p")
            .arg(dir.join("ganesha.pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ganesha.nfsd starts")
    }

    fn proxy(&self, data: &Path, log: &Path, more: &[&str]) -> Server {
        let upstream = format!("127.0.0.1:{}", self.nfs_port);
        let mount_port = self.mount_port.to_string();
        let mut options = vec!["--upstream", &upstream, "--upstream-mount-port", &mount_port, "--tree", "shop"];
        options.extend_from_slice(more);
        Server::start_proxy(data, &options, log)
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

/// Every file under `dir` with its contents, sorted by path.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let name = entry.path().strip_prefix(dir).unwrap().display().to_string();
                found.push((name, fs::read(entry.path()).unwrap()));
            }
        }
    }
    found.sort();
    found
}

/// The tree as Rewind keeps it at `at`, copied out with `rewind tree restore`.
fn restored(server: &Server, at: &str, into: &Path) -> Vec<(String, Vec<u8>)> {
    let _ = fs::remove_dir_all(into);
    server.rewind(&["tree", "restore", &format!("shop@{at}"), "--to", into.to_str().unwrap()]);
    files(into)
}

#[test]
fn the_proxy_keeps_every_change_of_an_unmodified_nfs_ganesha() {
    let _one = GANESHA.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let ganesha = Ganesha::start(dir.path());
    let export = ganesha.export.clone();
    // What the server held before it was protected.
    fs::write(export.join("pre.txt"), "there before\n").unwrap();
    fs::create_dir(export.join("d")).unwrap();
    fs::write(export.join("d/x.txt"), "inner\n").unwrap();
    std::os::unix::fs::symlink("pre.txt", export.join("link")).unwrap();
    fs::hard_link(export.join("pre.txt"), export.join("d/hard")).unwrap();

    let (data, log) = (dir.path().join("data"), dir.path().join("proxy.log"));
    let mut server = ganesha.proxy(&data, &log, &[]);
    let started = fs::read_to_string(&log).unwrap();
    assert!(started.contains("mirror in step with the upstream"), "{started}");
    assert_eq!(nfs_names(&run("nfs-ls", &[&nfs_url(&server, "/shop")])), ["d", "link", "pre.txt"]);
    assert_eq!(run("nfs-cat", &[&nfs_url(&server, "/shop/d/x.txt")]), "inner\n");

    // Through the proxy, into the upstream.
    let big = common::pattern(11, 3 << 20);
    fs::write(dir.path().join("big.bin"), &big).unwrap();
    run("nfs-cp", &[dir.path().join("big.bin").to_str().unwrap(), &nfs_url(&server, "/shop/big.bin")]);
    assert!(fs::read(export.join("big.bin")).unwrap() == big, "the upstream has what the client wrote");
    let history = json(&server.rewind(&["tree", "history", "shop", "big.bin", "--json"]));
    let versions = history["versions"].as_array().unwrap();
    assert!(versions.len() >= 4, "created, then three 1 MiB writes: {history}");
    assert_eq!(versions[0]["size_bytes"], 3 << 20);
    assert!(versions[0]["client"].as_str().unwrap().starts_with("127.0.0.1:"), "{history}");

    server.rewind(&["bookmark", "shop", "before"]);
    fs::write(dir.path().join("later.txt"), "later\n").unwrap();
    run("nfs-cp", &[dir.path().join("later.txt").to_str().unwrap(), &nfs_url(&server, "/shop/d/later.txt")]);
    // A name made on the upstream behind the proxy's back is taken in when
    // a client meets it; a change to a file it knows, at its next start.
    fs::write(export.join("behind.txt"), "made upstream\n").unwrap();
    assert_eq!(run("nfs-cat", &[&nfs_url(&server, "/shop/behind.txt")]), "made upstream\n");
    let taken = json(&server.rewind(&["tree", "history", "shop", "behind.txt", "--json"]));
    assert!(taken["versions"][0]["client"].as_str().unwrap().ends_with(&format!(":{}", ganesha.nfs_port)), "{taken}");
    fs::write(export.join("pre.txt"), "changed upstream\n").unwrap();
    assert_eq!(run("nfs-cat", &[&nfs_url(&server, "/shop/pre.txt")]), "changed upstream\n", "read through");

    // The past, beside the present.
    assert_eq!(run("nfs-cat", &[&nfs_url(&server, "/shop/.rewind/before/pre.txt")]), "there before\n");
    assert_eq!(nfs_names(&run("nfs-ls", &[&nfs_url(&server, "/shop/.rewind/before/d")])), ["hard", "x.txt"]);
    assert_eq!(nfs_names(&run("nfs-ls", &[&nfs_url(&server, "/shop/d")])), ["hard", "later.txt", "x.txt"]);
    let refused = server.rewind_failing(&["tree", "revert", "shop", "d", "--to", "before"]);
    assert!(refused.contains("mirrors 127.0.0.1:") && refused.contains("rewind proxy"), "{refused}");
    let mirror = json(&server.rewind(&["tree", "mirror", "shop", "--json"]));
    assert_eq!(mirror["asynchronous"], false);
    assert!(mirror["recorded"].as_u64().unwrap() >= 6 && mirror["forwarded"].as_u64().unwrap() > 6, "{mirror}");

    // A crash, and the upstream changing while the proxy is down.
    server.kill();
    fs::remove_file(export.join("d/later.txt")).unwrap();
    fs::write(export.join("d/while-down.txt"), "while down\n").unwrap();
    let server = ganesha.proxy(&data, &log, &[]);
    assert_eq!(nfs_names(&run("nfs-ls", &[&nfs_url(&server, "/shop/d")])), ["hard", "while-down.txt", "x.txt"]);
    assert_eq!(run("nfs-cat", &[&nfs_url(&server, "/shop/.rewind/-0s/pre.txt")]), "changed upstream\n");
    server.rewind(&["bookmark", "shop", "after"]);
    let now = restored(&server, "after", &dir.path().join("now"));
    assert!(now == files(&export), "Rewind's present is the upstream's");
    let before = restored(&server, "before", &dir.path().join("then"));
    let names: Vec<&str> = before.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["big.bin", "d/hard", "d/x.txt", "pre.txt"], "the past is kept across the crash");
    assert_eq!(before[3].1, b"there before\n");
}

#[test]
fn an_asynchronous_proxy_that_crashes_loses_steps_never_the_upstreams_data() {
    let _one = GANESHA.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let ganesha = Ganesha::start(dir.path());
    let (data, log) = (dir.path().join("data"), dir.path().join("proxy.log"));
    let mut server = ganesha.proxy(&data, &log, &["--async", "--async-queue-updates", "64"]);
    server.rewind(&["bookmark", "shop", "empty"]);
    let sources = dir.path().join("sources");
    fs::create_dir(&sources).unwrap();
    let count = 12;
    for index in 0..count {
        let source = sources.join(format!("f{index}.bin"));
        fs::write(&source, common::pattern(index, 1 << 20)).unwrap();
        run("nfs-cp", &[source.to_str().unwrap(), &nfs_url(&server, &format!("/shop/f{index}.bin"))]);
    }
    let mirror = json(&server.rewind(&["tree", "mirror", "shop", "--json"]));
    assert_eq!(mirror["asynchronous"], true);
    let lag = &mirror["lag"];
    assert!(lag["recorded"].as_u64().unwrap() > 0 && lag["max_nanos"].as_u64().unwrap() > 0, "{mirror}");
    assert!(lag["pending_updates"].as_u64().unwrap() <= 65, "bounded by the queue: {mirror}");
    let text = server.rewind(&["tree", "mirror", "shop"]);
    assert!(text.contains("asynchronously") && text.contains("p99"), "{text}");
    // Killed while the last copies may still be queued or unflushed: those
    // steps may be lost, the upstream's data never.
    server.kill();
    let upstream = files(&ganesha.export);
    assert_eq!(upstream.len(), count as usize, "the upstream has every file");

    let server = ganesha.proxy(&data, &log, &[]);
    let restart = fs::read_to_string(&log).unwrap();
    assert!(restart.contains("mirror in step with the upstream"), "{restart}");
    server.rewind(&["bookmark", "shop", "restarted"]);
    let now = restored(&server, "restarted", &dir.path().join("now"));
    assert!(now == upstream, "the restart records the state the lost steps led to");
    assert!(restored(&server, "empty", &dir.path().join("then")).is_empty(), "the history before the crash stays");
}
