//! A real MinIO server for tests (issue 14 tests against a real S3 server,
//! never a fake): started on a directory and a free port of 127.0.0.1, with
//! one bucket, stopped and started again on the same data, killed on drop.
//! `scripts/test.sh` builds MinIO; `REWIND_MINIO` names the binary.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::S3Config;

/// The root user and password of every test MinIO.
pub const USER: &str = "rewind-test";
pub const PASSWORD: &str = "rewind-test-secret";
/// The bucket every test MinIO has.
pub const BUCKET: &str = "rewind";
/// The bucket with object lock a test MinIO makes when asked
/// ([`Minio::create_locked_bucket`]).
pub const LOCKED_BUCKET: &str = "rewind-locked";

/// Where the MinIO binary is: `REWIND_MINIO`, else `minio` on the `PATH`,
/// else Go's `~/go/bin/minio`.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REWIND_MINIO") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("minio")).find(|path| path.exists()));
    let home_go = std::env::var_os("HOME").map(|home| Path::new(&home).join("go/bin/minio"));
    on_path.or(home_go.filter(|path| path.exists())).unwrap_or_else(|| {
        panic!("MinIO is needed (a real S3 server): scripts/test.sh builds it, or set REWIND_MINIO=/path/to/minio")
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("bound").port()
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port`
/// (`/proc/net/tcp` names the socket's inode, `/proc/PID/fd` the process's).
fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    // Local address in the kernel's byte order, and state LISTEN.
    let local = format!("0100007F:{port:04X}");
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A");
            Some(format!("socket:[{}]", fields.get(9)?)).filter(|_| listening)
        })
        .collect();
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    descriptors.flatten().any(|descriptor| {
        std::fs::read_link(descriptor.path())
            .is_ok_and(|target| sockets.iter().any(|socket| target.as_os_str() == socket.as_str()))
    })
}

/// A MinIO server; see the module documentation.
pub struct Minio {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Minio {
    /// Starts MinIO on `dir` (its data and log go there) with the bucket
    /// [`BUCKET`].
    pub fn start(dir: &Path) -> Minio {
        // A top-level directory of MinIO's drive is a bucket.
        std::fs::create_dir_all(dir.join("data").join(BUCKET)).expect("the bucket's directory");
        let mut minio = Minio { dir: dir.to_owned(), port: free_port(), child: None };
        // A port `free_port` gave out may be taken before MinIO binds it
        // (tests start servers side by side); MinIO then exits, and starts
        // again on another.
        for _ in 0..4 {
            if minio.try_run().is_ok() {
                return minio;
            }
            minio.port = free_port();
        }
        minio.run();
        minio
    }

    /// Starts the server again on the same data and port (after [`Minio::stop`]).
    pub fn run(&mut self) {
        if let Err(log) = self.try_run() {
            panic!("MinIO did not start on port {}: {log}", self.port);
        }
    }

    /// Starts the server and waits until it serves, or returns its log if
    /// it exits first (its port taken).
    fn try_run(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "MinIO is running already");
        let log = std::fs::File::create(self.dir.join("minio.log")).expect("minio.log");
        let mut child = Command::new(binary())
            .args(["server", "--quiet", "--address", &format!("127.0.0.1:{}", self.port)])
            .arg(self.dir.join("data"))
            // No web console: its port is one more that can be taken, and
            // it answers the readiness check too.
            .env("MINIO_BROWSER", "off")
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", PASSWORD)
            .stdout(Stdio::from(log.try_clone().expect("minio.log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("MinIO starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        // Another server on the port answers the readiness check as well:
        // only ours holding the listening socket counts.
        while !(self.ready() && listens(child.id(), self.port)) {
            if child.try_wait().expect("MinIO's status").is_some() {
                return Err(self.log());
            }
            assert!(Instant::now() < deadline, "MinIO did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
        Ok(())
    }

    /// MinIO's readiness check answers 200.
    fn ready(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let request = format!("GET /minio/health/ready HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", self.port);
        let mut reply = String::new();
        let answered = stream.write_all(request.as_bytes()).and_then(|()| stream.read_to_string(&mut reply));
        // The status line, in the version asked in or a later one.
        answered.is_ok() && reply.split(' ').nth(1) == Some("200")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("minio.log")).unwrap_or_default()
    }

    /// Kills the server; its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where a pack store under `prefix` of the bucket is, with the root
    /// user's keys.
    pub fn config(&self, prefix: &str) -> S3Config {
        S3Config {
            bucket: BUCKET.to_owned(),
            prefix: prefix.to_owned(),
            endpoint: Some(self.endpoint()),
            region: None,
            access_key: Some((USER.to_owned(), PASSWORD.to_owned())),
            request_timeout: None,
        }
    }
}

impl Minio {
    /// Creates [`LOCKED_BUCKET`], with object lock (a bucket's lock is
    /// chosen when it is made, through the API).
    pub fn create_locked_bucket(&self) {
        crate::lock::create_locked_bucket(&self.locked_config("")).expect("MinIO makes a bucket with object lock");
    }

    /// Where a store under `prefix` of [`LOCKED_BUCKET`] is.
    pub fn locked_config(&self, prefix: &str) -> S3Config {
        S3Config { bucket: LOCKED_BUCKET.to_owned(), ..self.config(prefix) }
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_told_from_another_processs() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens(std::process::id(), port), "this process listens there");
        assert!(!listens(1, port), "init does not");
        drop(listener);
        assert!(!listens(std::process::id(), port), "nobody listens there now");
    }
}
