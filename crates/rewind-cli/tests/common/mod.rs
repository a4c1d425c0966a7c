//! A real `rewind serve` process for tests, and helpers to run real clients
//! against it. Every test gets its own data directory and ports.

#![allow(dead_code)] // Each test binary uses a different part of this.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const REWIND: &str = env!("CARGO_BIN_EXE_rewind");

pub struct Server {
    pub data_dir: PathBuf,
    pub nbd: SocketAddr,
    /// NFS (MOUNT and NFS on this port).
    pub nfs: SocketAddr,
    pub http: SocketAddr,
    /// The API is HTTPS (the server was given a certificate).
    pub https: bool,
    /// The admin token the server wrote into its data directory.
    pub token: String,
    /// The CA the CLI trusts for an HTTPS API (`--server-ca`).
    pub server_ca: Option<PathBuf>,
    child: Option<Child>,
}

/// Fails the test with a clear message when a client tool is missing: CI
/// installs them (scripts/test.sh); tests never skip.
pub fn require(tool: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().expect("sh runs");
    assert!(found.status.success(), "{tool} is not installed; scripts/test.sh installs every tool the tests use");
}

impl Server {
    pub fn start(data_dir: &Path) -> Server {
        Server::start_with(data_dir, &[])
    }

    /// Starts `rewind serve` with more options.
    pub fn start_with(data_dir: &Path, options: &[&str]) -> Server {
        let mut command = Command::new(REWIND);
        command.env("RUST_LOG", "warn").stderr(Stdio::inherit());
        Server::start_command(command, &["serve"], data_dir, options)
    }

    /// Starts `rewind serve` with at most `open_files_max` file descriptors
    /// (`ulimit -n`), as on a machine with a low limit.
    pub fn start_with_open_files_max(data_dir: &Path, options: &[&str], open_files_max: u32) -> Server {
        let mut command = Command::new("bash");
        command.args(["-c", r#"ulimit -n "$0" && exec "$@""#, &open_files_max.to_string(), REWIND]);
        command.env("RUST_LOG", "warn").stderr(Stdio::inherit());
        Server::start_command(command, &["serve"], data_dir, options)
    }

    /// Starts `rewind serve` with `options` and these environment variables.
    pub fn start_with_env(data_dir: &Path, options: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(REWIND);
        command.env("RUST_LOG", "warn").envs(env.iter().copied()).stderr(Stdio::inherit());
        Server::start_command(command, &["serve"], data_dir, options)
    }

    /// Starts `rewind serve` logging at `info` into `log`, as an operator
    /// running it as a service would.
    pub fn start_logging(data_dir: &Path, options: &[&str], log: &Path) -> Server {
        let mut command = Command::new(REWIND);
        command.env("RUST_LOG", "info").stderr(std::fs::File::create(log).expect("log file"));
        Server::start_command(command, &["serve"], data_dir, options)
    }

    /// Starts `rewind serve` through `sh -c "PREFIX; exec rewind serve …"`,
    /// e.g. to set soft and hard descriptor limits apart with `ulimit`,
    /// logging at `info` into `log`.
    pub fn start_in_shell(data_dir: &Path, prefix: &str, options: &[&str], log: &Path) -> Server {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("{prefix}; exec \"$0\" \"$@\""))
            .arg(REWIND)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(log).expect("log file"));
        Server::start_command(command, &["serve"], data_dir, options)
    }

    /// Starts `rewind proxy` with `options` (`--upstream …`), logging at
    /// `info` into `log`.
    pub fn start_proxy(data_dir: &Path, options: &[&str], log: &Path) -> Server {
        let mut command = Command::new(REWIND);
        command.env("RUST_LOG", "info").stderr(std::fs::File::create(log).expect("log file"));
        Server::start_command(command, &["proxy"], data_dir, options)
    }

    /// Runs `command` (given its environment and standard error) with the
    /// `serve` (or `proxy`) arguments, and waits for the addresses.
    fn start_command(mut command: Command, subcommand: &[&str], data_dir: &Path, options: &[&str]) -> Server {
        let mut child = command
            .args(subcommand)
            .args(["--nbd", "127.0.0.1:0", "--http", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(options)
            .stdout(Stdio::piped())
            .spawn()
            .expect("rewind serve starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let (mut nbd, mut nfs, mut http, mut https) = (None, None, None, false);
        while nbd.is_none() || http.is_none() || nfs.is_none() {
            let line = lines.next().expect("rewind serve prints its addresses").expect("utf-8");
            if let Some(address) = line.strip_prefix("listening nbd ") {
                nbd = Some(address.parse().expect("address"));
            } else if let Some(address) = line.strip_prefix("listening nfs ") {
                nfs = Some(address.parse().expect("address"));
            } else if let Some(address) = line.strip_prefix("listening http ") {
                http = Some(address.parse().expect("address"));
            } else if let Some(address) = line.strip_prefix("listening https ") {
                http = Some(address.parse().expect("address"));
                https = true;
            }
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        // Written before the server listens.
        let token = std::fs::read_to_string(data_dir.join("admin-token")).expect("rewind serve wrote its admin token");
        Server {
            data_dir: data_dir.to_path_buf(),
            nbd: nbd.unwrap(),
            nfs: nfs.unwrap(),
            http: http.unwrap(),
            https,
            token: token.trim().to_owned(),
            server_ca: None,
            child: Some(child),
        }
    }

    /// The header that authorizes API requests, for curl's -H.
    pub fn authorization(&self) -> String {
        format!("Authorization: Bearer {}", self.token)
    }

    /// The server's process id, to look at it in /proc.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.nbd)
    }

    pub fn api(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.http)
    }

    /// Runs the CLI against this server; panics (with its output) on failure.
    pub fn rewind(&self, args: &[&str]) -> String {
        let output = self.rewind_output(args);
        assert!(output.status.success(), "rewind {args:?} failed:\n{}", describe(&output));
        String::from_utf8(output.stdout).expect("utf-8")
    }

    pub fn rewind_output(&self, args: &[&str]) -> Output {
        let mut command = Command::new(REWIND);
        command.args(args).args(["--server", &self.api()]).env("REWIND_TOKEN", &self.token);
        if let Some(ca) = &self.server_ca {
            command.arg("--server-ca").arg(ca);
        }
        bounded_output(command)
    }

    /// Runs the CLI against this server expecting it to fail; returns its
    /// stderr and stdout.
    pub fn rewind_failing(&self, args: &[&str]) -> String {
        let output = self.rewind_output(args);
        assert!(!output.status.success(), "rewind {args:?} should have failed:\n{}", describe(&output));
        String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout)
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("kill");
        child.wait().expect("reaped");
    }

    /// SIGTERM, a clean stop; checks it exits successfully.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("running");
        use rustix::process::{kill_process, Pid, Signal};
        kill_process(Pid::from_child(&child), Signal::TERM).expect("SIGTERM sent");
        let exit = child.wait().expect("reaped");
        assert!(exit.success(), "rewind serve exited with {exit}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A libnfs URL of `path` on the server's NFS port (MOUNT on it too).
pub fn nfs_url(server: &Server, path: &str) -> String {
    let port = server.nfs.port();
    format!("nfs://127.0.0.1{path}?version=3&nfsport={port}&mountport={port}")
}

pub type NfsConnection = nfs3_client::Nfs3Connection<nfs3_client::tokio::TokioIo<tokio::net::TcpStream>>;

/// Mounts `export` from the server at `port` (MOUNT and NFS on one port)
/// with `nfs3_client`, as root: for what the libnfs tools cannot do.
pub async fn nfs_connect(port: u16, export: &str) -> NfsConnection {
    use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
    nfs3_client::Nfs3ConnectionBuilder::new(nfs3_client::tokio::TokioConnector, "127.0.0.1", export)
        .connect_from_privileged_port(false)
        .mount_port(port)
        .nfs3_port(port)
        .credential(opaque_auth::auth_unix(&auth_unix::default()))
        .mount()
        .await
        .unwrap_or_else(|error| panic!("mount {export}: {error:?}"))
}

/// The names `nfs-ls` lists (its last column), sorted.
pub fn nfs_names(listing: &str) -> Vec<String> {
    let mut names: Vec<String> =
        listing.lines().filter_map(|line| line.split_whitespace().last()).map(str::to_owned).collect();
    names.sort();
    names
}

pub fn describe(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Parses a command's `--json` output; panics with the text if it is not JSON.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("not JSON ({error}):\n{text}"))
}

/// Runs a command; panics with its output unless it succeeds.
pub fn run(program: &str, args: &[&str]) -> String {
    let mut command = Command::new(program);
    command.args(args);
    let output = bounded_output(command);
    assert!(output.status.success(), "{program} {args:?} failed:\n{}", describe(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a command that must fail; returns its stderr and stdout.
pub fn run_failing(program: &str, args: &[&str]) -> String {
    run_failing_with_env(program, args, &[])
}

pub fn run_failing_with_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(program);
    command.args(args).envs(env.iter().copied());
    let output = bounded_output(command);
    assert!(!output.status.success(), "{program} {args:?} should have failed:\n{}", describe(&output));
    String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout)
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Waits (up to 30 s) for a condition another process brings about, such as
/// a file appearing; panics naming `what` if it never does.
pub fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long one external command may run. A client stuck on a hung mount or
/// server must fail its test with a picture of the machine, not hang CI.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(180);

/// Runs `command` to completion within [`COMMAND_DEADLINE`]; panics with what
/// every process was waiting on if it does not finish.
pub fn bounded_output(command: Command) -> Output {
    output_within(command, COMMAND_DEADLINE).unwrap_or_else(|error| panic!("{error}"))
}

/// Runs `command` (standard input empty, output captured) and waits at most
/// `deadline`; when it does not finish, kills it and says what every process
/// was waiting on.
pub fn output_within(command: Command, deadline: Duration) -> Result<Output, String> {
    output_or_timeout(command, deadline).map_err(|error| match error {
        Unfinished::Failed(error) => error,
        Unfinished::TimedOut(error) => format!("{error}\n{}", diagnose()),
    })
}

enum Unfinished {
    Failed(String),
    TimedOut(String),
}

fn output_or_timeout(mut command: Command, deadline: Duration) -> Result<Output, Unfinished> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| Unfinished::Failed(format!("{command:?}: {error}")))?;
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    // Waiting happens on a thread so this one can give up: a process stuck
    // in the kernel (state D) outlives even SIGKILL until the kernel lets go.
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(deadline) {
        Ok(output) => output.map_err(|error| Unfinished::Failed(format!("{command:?}: {error}"))),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            Err(Unfinished::TimedOut(format!("{command:?} did not finish within {deadline:?}; killed it")))
        }
    }
}

/// What a hang looks like from outside: every process with the kernel
/// function it sleeps in, the kernel stacks of those stuck uninterruptibly,
/// the FUSE and loop mounts, the loop devices and the end of the kernel log.
pub fn diagnose() -> String {
    let mut report = String::from("---- the machine at the time ----\n");
    let pictures: [(&str, &[&str]); 4] = [
        // Every process but the kernel's own threads.
        ("ps", &["--ppid", "2", "-p", "2", "--deselect", "-o", "pid,ppid,stat,wchan:32,etime,args"]),
        ("losetup", &["-a"]),
        ("sh", &["-c", "grep -E 'fuse|/dev/loop' /proc/self/mountinfo"]),
        ("sh", &["-c", "dmesg | tail -n 40"]),
    ];
    for (program, args) in pictures {
        let mut command = Command::new(program);
        command.args(args);
        report += &format!("$ {program} {}\n", args.join(" "));
        report += &match output_or_timeout(command, Duration::from_secs(10)) {
            Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
            Err(Unfinished::Failed(error) | Unfinished::TimedOut(error)) => format!("({error})\n"),
        };
    }
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The state is the field after the parenthesised command name.
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        if state == Some('D') {
            let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).unwrap_or_default();
            let (pid, name) = (entry.file_name().to_string_lossy().into_owned(), read("comm"));
            report += &format!("kernel stack of {pid} {} (state D):\n{}", name.trim(), read("stack"));
        }
    }
    report
}

/// Fails the whole test binary, with [`diagnose`]'s picture, if the guard is
/// still alive after `limit`: a test blocked inside the kernel (a read from
/// a hung mount) cannot fail by itself, and CI must not wait for it.
pub struct Watchdog {
    // Dropped with the guard, which ends the watchdog's wait in time.
    _done: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn new(what: &str, limit: Duration) -> Watchdog {
        let (done, finished) = mpsc::channel::<()>();
        let what = what.to_owned();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(limit) {
                eprintln!("{what} did not finish within {limit:?}: aborting the tests\n{}", diagnose());
                std::process::abort();
            }
        });
        Watchdog { _done: done }
    }
}

pub mod filesystem;
pub mod nbd_client;
pub mod pki;
