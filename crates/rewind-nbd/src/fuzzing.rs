//! Hooks for the fuzz targets in `fuzz/` (feature `fuzzing`, never enabled
//! by the product): the real connection code — handshake, then transmission
//! with its validation, window, threads and replies — serving one client
//! whose bytes are given up front, over an in-memory stream instead of a
//! socket. No listener, no connection thread: the caller's thread is the
//! connection thread, so one fuzz input costs no thread unless the
//! connection starts more threads, as it would on a socket.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::connection::{self, Transport};
use crate::export::{Catalog, Client};
use crate::server::{ServerConfig, Shared};
use rewind_serve::listen::Running;
use rewind_serve::log_limit::{LogBudget, PeerKey};

/// What one connection wrote, and how it ended for the stream.
#[derive(Debug)]
pub struct Exchange {
    /// Every byte the server wrote, in order.
    pub output: Vec<u8>,
    /// The server tried to write more than the client would take: the
    /// stream broke, so replies may be missing.
    pub output_refused: bool,
}

/// Serves `input` as everything one client sends, then end-of-file, and
/// returns what the server wrote. The client takes at most `output_bytes_max`
/// bytes of replies: a write beyond that fails, as it would to a client that
/// stopped reading.
pub fn serve_connection(
    catalog: Arc<dyn Catalog>,
    config: ServerConfig,
    input: &[u8],
    output_bytes_max: usize,
) -> Exchange {
    let pipe = Arc::new(Mutex::new(Pipe {
        input: input.to_vec(),
        position: 0,
        read_shut: false,
        output: Vec::new(),
        output_bytes_max,
        output_refused: false,
    }));
    let shared = Arc::new(Shared::new(catalog, config));
    let client = Client { peer: "unix".to_owned(), local: true, identity: None };
    let logs = Arc::new(LogBudget::new(config.log_interval, config.log_lines_per_client));
    let log = logs.connection(PeerKey::Unix);
    connection::serve(MemoryStream(Arc::clone(&pipe)), shared, client, log, Running::default());
    let pipe = std::mem::take(&mut *pipe.lock());
    Exchange { output: pipe.output, output_refused: pipe.output_refused }
}

#[derive(Default)]
struct Pipe {
    input: Vec<u8>,
    position: usize,
    /// `shutdown(Read)` was called: reads see end-of-file from then on, as
    /// on a socket.
    read_shut: bool,
    output: Vec<u8>,
    output_bytes_max: usize,
    output_refused: bool,
}

/// Both ends of the connection as the server sees them; clones share the
/// pipe, as `try_clone` of a socket shares the connection.
struct MemoryStream(Arc<Mutex<Pipe>>);

impl Read for MemoryStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut pipe = self.0.lock();
        if pipe.read_shut {
            return Ok(0);
        }
        let available = &pipe.input[pipe.position..];
        let count = available.len().min(buf.len());
        buf[..count].copy_from_slice(&available[..count]);
        pipe.position += count;
        Ok(count)
    }
}

impl Write for MemoryStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut pipe = self.0.lock();
        let room = pipe.output_bytes_max - pipe.output.len();
        if room == 0 && !buf.is_empty() {
            pipe.output_refused = true;
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let count = room.min(buf.len());
        pipe.output.extend_from_slice(&buf[..count]);
        Ok(count)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `Transport` needs a descriptor for the TLS pump's `poll`; the fuzzed
/// server offers no TLS, so it is never polled. One `/dev/null` serves.
impl AsFd for MemoryStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        static NULL: OnceLock<std::fs::File> = OnceLock::new();
        NULL.get_or_init(|| std::fs::File::open("/dev/null").expect("/dev/null opens")).as_fd()
    }
}

impl Transport for MemoryStream {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(MemoryStream(Arc::clone(&self.0)))
    }
    fn set_read_timeout(&self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
    fn read_timeout(&self) -> io::Result<Option<Duration>> {
        // Reads never wait: the input is all there, then end-of-file.
        Ok(None)
    }
    fn set_write_timeout(&self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
    fn set_nonblocking(&self, _nonblocking: bool) -> io::Result<()> {
        Ok(())
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.0.lock().read_shut = true;
        }
        Ok(())
    }
    fn configure(&self) -> io::Result<()> {
        Ok(())
    }
}
