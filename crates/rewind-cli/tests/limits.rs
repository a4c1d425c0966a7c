//! The bad day, bounded: floods of bad requests leave a few log lines,
//! connection limits refuse with a message real clients show, idle views
//! give their slots back, slow imports wait in a bounded line while quick
//! requests answer, the file descriptor budget holds under a low limit,
//! and a volume with clients attached is deleted only when forced.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::nbd_client::NbdClient;
use common::{describe, pattern, require, run, run_failing, wait_for, Server, REWIND};

/// A real libnbd client (Python bindings) holding one connection: it reads
/// a block each time it is told to, and says how that went.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

const HOLDER: &str = r#"
import nbd, sys
h = nbd.NBD()
try:
    h.connect_uri(sys.argv[1])
except nbd.Error as error:
    print("refused:", error, flush=True)
    sys.exit(1)
print("connected", flush=True)
for line in sys.stdin:
    try:
        h.pread(512, 0)
        print("read ok", flush=True)
    except nbd.Error as error:
        print("read failed:", error, flush=True)
"#;

impl Holder {
    fn connect(uri: &str) -> Holder {
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", HOLDER, uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 with libnbd's bindings (python3-libnbd) runs");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "connected", "{uri}");
        Holder { child, stdin, stdout }
    }

    /// Reads a block; the client's report ("read ok" or "read failed: …").
    fn read(&mut self) -> String {
        writeln!(self.stdin, "read").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log).expect("log").lines().map(str::to_owned).collect()
}

/// NBD requests for 512 bytes at the end of the volume: each is refused
/// with EINVAL, and each used to be a WARN line.
fn bad_reads(count: usize, size_bytes: u64) -> Vec<u8> {
    let mut requests = Vec::with_capacity(count * 28);
    for handle in 0..count as u64 {
        requests.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        requests.extend_from_slice(&0u16.to_be_bytes());
        requests.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        requests.extend_from_slice(&handle.to_be_bytes());
        requests.extend_from_slice(&size_bytes.to_be_bytes());
        requests.extend_from_slice(&512u32.to_be_bytes());
    }
    requests
}

#[test]
fn a_flood_of_bad_requests_and_connections_logs_a_bounded_number_of_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let mut server = Server::start_logging(&dir.path().join("data"), &[], &log);
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);
    let mut good = NbdClient::connect(server.nbd, "v").unwrap();

    // 100 000 invalid requests on one connection, answered while sent.
    const FLOOD: usize = 100_000;
    let mut flood = NbdClient::connect(server.nbd, "v").unwrap();
    let size_bytes = flood.size_bytes;
    let stream = flood.raw_stream();
    let mut replies = stream.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut reply = vec![0u8; 16 * 1000];
        for _ in 0..FLOOD / 1000 {
            replies.read_exact(&mut reply).unwrap();
            assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 22, "EINVAL");
        }
    });
    for _ in 0..FLOOD / 1000 {
        stream.write_all(&bad_reads(1000, size_bytes)).unwrap();
    }
    reader.join().unwrap();
    // And 300 connections, each with one bad request or garbage.
    for round in 0..300 {
        if round % 2 == 0 {
            let mut client = NbdClient::connect(server.nbd, "v").unwrap();
            client.raw_stream().write_all(&bad_reads(1, size_bytes)).unwrap();
            client.raw_stream().read_exact(&mut [0u8; 16]).unwrap();
        } else {
            let mut garbage = TcpStream::connect(server.nbd).unwrap();
            garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            let _ = garbage.read_to_end(&mut Vec::new());
        }
    }
    // The well-behaved client was served throughout.
    let data = pattern(7, 64 * 1024);
    good.write(4096, &data).unwrap();
    good.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    good.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    good.disconnect().unwrap();
    server.stop();

    let lines = lines(&log);
    let text = lines.join("\n");
    assert!(lines.len() < 80, "{} log lines for {FLOOD} bad requests and 300 connections:\n{text}", lines.len());
    let suppressed: u64 =
        lines.iter().filter_map(|line| line.split("suppressed ").nth(1)?.split(' ').next()?.parse::<u64>().ok()).sum();
    assert!(suppressed >= FLOOD as u64, "the summary counts what was held back ({suppressed}):\n{text}");
    assert!(text.contains("log lines about 127.0.0.1"), "{text}");
    assert!(!text.contains('\x1b'), "no colour escapes in a log file:\n{text}");
}

#[test]
fn clean_connections_spend_no_log_budget_while_info_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let mut server = Server::start_in_shell(&dir.path().join("data"), "export RUST_LOG=warn", &[], &log);
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);
    // Past the 20 lines a client may have logged a minute, each ending
    // with a line at INFO, which a server logging warnings drops.
    for _ in 0..40 {
        NbdClient::connect(server.nbd, "v").unwrap().disconnect().unwrap();
    }
    server.stop();
    let text = lines(&log).join("\n");
    assert!(!text.contains("suppressed"), "no lines held back that would have been shown:\n{text}");
}

#[test]
fn refused_clients_see_why_and_idle_views_give_their_slots_back() {
    require("nbdinfo");
    require("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let options = ["--nbd-connections-per-client", "2", "--nbd-view-idle-timeout", "3s"];
    let server = Server::start_with(dir.path(), &options);
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);
    server.rewind(&["bookmark", "v", "b"]);
    let mut views = [Holder::connect(&server.uri("v@b")), Holder::connect(&server.uri("v@b"))];

    let refused = "server full for 127.0.0.1: 2 connections from it (limit 2 per client)";
    // Each view reads first, so it is anything but idle while others are refused.
    let keep_busy = |views: &mut [Holder; 2]| views.iter_mut().for_each(|view| assert_eq!(view.read(), "read ok"));
    keep_busy(&mut views);
    let error = common::run_failing_with_env("nbdinfo", &[&server.uri("v")], &[("LIBNBD_DEBUG", "1")]);
    assert!(error.contains(refused), "nbdinfo shows the server's message with LIBNBD_DEBUG=1:\n{error}");
    keep_busy(&mut views);
    let error = run_failing("qemu-img", &["info", &server.uri("v")]);
    assert!(error.contains(&format!("server reported: {refused}")), "{error}");

    // Once the views have been idle past the timeout, their slots are free.
    wait_for("the idle views to be closed", || {
        Command::new("nbdinfo").arg(server.uri("v")).output().unwrap().status.success()
    });
    for view in &mut views {
        assert!(view.read().starts_with("read failed"), "the idle view was closed");
    }
}

#[test]
fn deleting_a_volume_with_a_client_connected_names_it_and_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);
    let mut holder = Holder::connect(&server.uri("v"));
    assert_eq!(holder.read(), "read ok");

    let output = server.rewind_output(&["volume", "delete", "v", "--yes"]);
    assert!(!output.status.success(), "{}", describe(&output));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("volume v is in use by a client: nbd 127.0.0.1:"), "{error}");
    assert!(error.contains("(v)") && error.contains("--force"), "{error}");
    assert!(server.rewind(&["volume", "list"]).contains('v'));
    assert_eq!(holder.read(), "read ok", "refusing changed nothing for the client");

    server.rewind(&["volume", "delete", "v", "--yes", "--force"]);
    assert!(!server.rewind(&["volume", "list", "--json"]).contains("\"v\""));
    assert!(holder.read().starts_with("read failed"), "the client gets errors from then on");
}

/// Background work yields the CPU to serving (issue 13, req 4): the history
/// thread (archiving, retention, collection) runs at nice 10, the threads
/// that serve clients at the process's own priority.
#[test]
fn the_history_thread_yields_the_cpu_to_the_threads_serving_clients() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let nice_by_thread = || -> Vec<(String, i64)> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap();
        tasks
            .filter_map(|task| {
                let task = task.unwrap().path();
                let name = std::fs::read_to_string(task.join("comm")).ok()?.trim().to_owned();
                let stat = std::fs::read_to_string(task.join("stat")).ok()?;
                // Fields after the parenthesised name: state is the 3rd, nice the 19th.
                let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
                Some((name, fields[16].parse().unwrap()))
            })
            .collect()
    };
    let nice_of = |threads: &[(String, i64)], name: &str| {
        threads.iter().find(|(thread, _)| thread == name).map(|(_, nice)| *nice)
    };
    // A new thread names itself and lowers its own priority as it starts,
    // which may be after the server answers, and threads spawned in order
    // may start out of order: wait for both threads to have named themselves.
    wait_for("the history and maintenance threads to start", || {
        let threads = nice_by_thread();
        nice_of(&threads, "history") == Some(10) && nice_of(&threads, "maintenance").is_some()
    });
    let threads = nice_by_thread();
    assert_eq!(nice_of(&threads, "maintenance"), Some(0), "{threads:?}");
    assert!(threads.iter().filter(|(_, nice)| *nice == 0).count() > 2, "{threads:?}");
}

fn threads_and_rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|line| line.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (field("Threads:"), field("VmRSS:"))
}

fn jobs(agent: &ureq::Agent, server: &Server) -> Vec<serde_json::Value> {
    let request = agent.get(&format!("{}/v1/jobs", server.api()));
    let mut response = request.header("Authorization", format!("Bearer {}", server.token)).call().unwrap();
    response.body_mut().read_json::<Vec<serde_json::Value>>().unwrap()
}

fn count(jobs: &[serde_json::Value], state: &str) -> usize {
    jobs.iter().filter(|job| job["state"] == state).count()
}

#[test]
fn slow_imports_wait_in_a_bounded_line_while_quick_requests_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(&dir.path().join("data"), &["--imports-max", "2"]);
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let (running_max, waiting_max) = (2, 16);

    // Uploads that send a little and then nothing: what filled the
    // blocking pool before.
    let mut uploads = Vec::new();
    for i in 0..60 {
        let mut upload = TcpStream::connect(server.http).unwrap();
        upload.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            upload,
            "POST /v1/volumes/slow{i}/import HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: 16777216\r\n\r\n",
            server.http, server.token
        )
        .unwrap();
        upload.write_all(&[0u8; 4096]).unwrap();
        if i < running_max + waiting_max {
            wait_for("the import to be a job", || jobs(&agent, &server).len() == i + 1);
        } else {
            let mut answer = vec![0u8; 4096];
            let read = upload.read(&mut answer).unwrap();
            let answer = String::from_utf8_lossy(&answer[..read]);
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains("retry-after"), "{answer}");
            assert!(answer.contains("too many imports: 2 running and 16 waiting"), "{answer}");
        }
        uploads.push(upload);
    }
    let listed = jobs(&agent, &server);
    assert_eq!((count(&listed, "running"), count(&listed, "waiting")), (running_max, waiting_max));
    let behind: Vec<u64> = listed.iter().filter_map(|job| job["waiting_behind"].as_u64()).collect();
    assert_eq!(behind, (0..waiting_max as u64).rev().collect::<Vec<_>>(), "newest first, each knows its place");

    // Quick requests answer promptly meanwhile.
    for path in ["/v1/health", "/v1/volumes", "/v1/volumes/v", "/v1/volumes/v/bookmarks"] {
        for _ in 0..20 {
            let started = Instant::now();
            let request = agent.get(&format!("{}{path}", server.api()));
            let response = request.header("Authorization", format!("Bearer {}", server.token)).call().unwrap();
            assert_eq!(response.status(), 200, "{path}");
            assert!(started.elapsed() < Duration::from_secs(2), "{path} took {:?}", started.elapsed());
        }
    }
    let (threads, rss_kib) = threads_and_rss_kib(server.pid());
    assert!(threads <= 32, "{threads} threads for 60 slow imports (there were 518 before)");
    assert!(rss_kib < 128 * 1024, "{rss_kib} KiB resident for 60 slow imports");

    // The clients give up: every job ends, no volume is left half imported.
    drop(uploads);
    wait_for("every import to end", || {
        let listed = jobs(&agent, &server);
        count(&listed, "failed") == running_max + waiting_max
    });
    let volumes = server.rewind(&["volume", "list", "--json"]);
    assert!(!volumes.contains("slow"), "{volumes}");

    // And a real import goes through.
    let image = dir.path().join("image.raw");
    std::fs::write(&image, pattern(3, 4 << 20)).unwrap();
    server.rewind(&["volume", "import", "imported", image.to_str().unwrap(), "--progress"]);
    let listed = jobs(&agent, &server);
    assert_eq!(listed[0]["volume"], "imported");
    assert_eq!(listed[0]["state"], "done");
    assert_eq!(listed[0]["bytes_done"], 4 << 20);
    let copy = dir.path().join("copy.raw");
    require("nbdcopy");
    run("nbdcopy", &[&server.uri("imported"), copy.to_str().unwrap()]);
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&image).unwrap());
}

#[test]
fn a_low_descriptor_limit_is_raised_and_shared_so_clients_cannot_starve_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let data = dir.path().join("data");
    // Soft 256, hard 512: raised to 512; 256 kept for Rewind's own files,
    // 128 for NBD: (128 - 16 for refusals) / 4 per connection = 28, of
    // which NFS takes a quarter (7 connections of 2 descriptors, the room
    // of 4 NBD ones): 24.
    let limits = "ulimit -Sn 256 && ulimit -Hn 512";
    let server = Server::start_in_shell(&data, limits, &["--log-format", "json"], &log);
    server.rewind(&["volume", "create", "v", "--size", "16MiB"]);

    let mut clients = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..36 {
        match NbdClient::connect(server.nbd, "v") {
            Ok(client) => clients.push(client),
            Err(error) => refusals.push(error.to_string()),
        }
    }
    assert_eq!(clients.len(), 24, "{refusals:?}");
    assert!(refusals.iter().all(|refusal| refusal.contains("server full")), "{refusals:?}");
    // The engine still has its files: writes are made durable, a new
    // volume is created, garbage is collected.
    let data_written = pattern(11, 1 << 20);
    clients[0].write(0, &data_written).unwrap();
    clients[0].flush().unwrap();
    server.rewind(&["volume", "create", "w", "--size", "16MiB"]);
    server.rewind(&["gc"]);
    let info = server.rewind(&["volume", "info", "v", "--json"]);
    assert!(info.contains("\"poisoned\": false"), "{info}");
    drop(clients);

    // Logged as JSON, one object per line, the budget among them.
    let lines = lines(&log);
    for line in &lines {
        let object: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
        assert!(object["level"].is_string() && object["fields"]["message"].is_string(), "{line}");
    }
    let budget = lines.iter().find(|line| line.contains("file descriptors")).expect("the budget is logged");
    assert!(budget.contains("file descriptors: 512 (soft limit raised from 256)"), "{budget}");
    assert!(budget.contains("NBD up to 24 connections"), "{budget}");

    // Asking for more than the budget holds is refused at start, saying why.
    let error = run_failing(
        "sh",
        &[
            "-c",
            &format!("{limits}; exec \"$0\" \"$@\""),
            REWIND,
            "serve",
            "--nbd-connections-max",
            "1000",
            "--data-dir",
            dir.path().join("other").to_str().unwrap(),
        ],
    );
    assert!(error.contains("--nbd-connections-max 1000 needs more file descriptors"), "{error}");
    assert!(error.contains("ulimit -Hn"), "{error}");
}
