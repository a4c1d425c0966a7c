//! The NBD server: listeners, connection threads, limits and shutdown.
//!
//! # Threads
//!
//! Each listener (`serve_tcp`, `serve_unix`) has an accept thread that waits
//! in `poll(2)` on the listening socket and on a wake-up socket; shutdown
//! closes the wake-up socket's other end, which ends the wait without
//! connecting to ourselves. Each accepted connection gets one thread that
//! runs the handshake and then reads the connection's requests, in order.
//! In transmission it runs small requests itself and hands large and slow
//! ones to up to `ServerConfig::workers_per_connection_max` worker threads
//! of that connection, started on demand; replies are written whole under a
//! lock and may leave in any order, as the spec allows. Why this split, how
//! FLUSH stays ordered after writes, and the measurements behind it:
//! `crate::transmission`. Parallelism across connections comes from
//! clients opening several (fio jobs, qemu multi-conn), which the export
//! allows by reporting `can_multi_conn`.
//!
//! # Connection state machine
//!
//! ```text
//!  accepted ──greeting──▶ client flags ──▶ option haggling ──GO / EXPORT_NAME──▶ transmission
//!                          │ unknown bit     │ ABORT, bad magic, option too      │ DISC, EOF, bad magic,
//!                          ▼                 ▼ long, too many, deadline, EOF     ▼ oversized WRITE, EOF mid-payload
//!                        closed            closed                              closed
//! ```
//!
//! - Greeting: `NBDMAGIC IHAVEOPT` with `NBD_FLAG_FIXED_NEWSTYLE |
//!   NBD_FLAG_NO_ZEROES`. Client flags with any other bit end the connection
//!   (the spec says MUST).
//! - Option haggling: every option except `EXPORT_NAME` and `ABORT` gets
//!   replies and leaves us in this state; malformed options get
//!   `NBD_REP_ERR_INVALID` with a message, unknown ones `NBD_REP_ERR_UNSUP`,
//!   `STARTTLS` `NBD_REP_ERR_POLICY` without TLS configured, otherwise
//!   `NBD_REP_ACK` and the TLS handshake, after which haggling starts over
//!   on the TLS session (`crate::tls`); with TLS required, every option
//!   before it but `STARTTLS` and `ABORT` gets `NBD_REP_ERR_TLS_REQD` and
//!   `EXPORT_NAME` a hang-up. Export open errors
//!   `NBD_REP_ERR_UNKNOWN` with the catalog's message. State gathered here:
//!   `NO_ZEROES`, structured replies, and the export name `base:allocation`
//!   was selected for. `NBD_OPT_GO` and `NBD_OPT_EXPORT_NAME` open the export
//!   and move on; an `EXPORT_NAME` that cannot be opened can only be answered
//!   by hanging up.
//! - Transmission: each request is decoded, validated against the negotiated
//!   session (`protocol::validate_request`), admitted into the connection's
//!   window, executed on the export (by the reader or a worker) and
//!   answered. An invalid request is answered with the spec's errno (and a
//!   message when structured replies are on) and the connection goes on; a
//!   WRITE's payload is skipped so the stream stays in step. Only a broken
//!   stream (bad magic, EOF mid-message) or a WRITE payload over the limit ends
//!   it. Options are never read in this state: bytes that are not a request
//!   fail the magic check.
//!
//! # Limits
//!
//! - `ServerConfig::connections_max` live connections; extra ones are
//!   accepted and closed at once, so they never cost a thread.
//! - `ServerConfig::handshake_timeout` bounds the whole handshake, not each
//!   read, so a client trickling bytes cannot hold a slot; the TLS handshake
//!   counts, and so do options after it.
//! - `OPTIONS_PER_HANDSHAKE_MAX` options per handshake and
//!   `protocol::OPTION_BYTES_MAX` bytes per option; beyond either we hang up.
//! - `protocol::PAYLOAD_BYTES_MAX` (32 MiB) per READ or WRITE, advertised as
//!   the maximum block size. A larger READ gets `NBD_EINVAL`; a larger WRITE
//!   ends the connection before its payload is read.
//! - `ServerConfig::requests_in_flight_max` requests per connection admitted
//!   and not yet answered, and `BUFFER_BYTES_PER_CONNECTION_MAX` (32 MiB) of
//!   payload buffers per connection; while either is used up the connection
//!   is not read. Memory per connection is bounded by that plus the fixed
//!   buffers (128 KiB read buffer, 64 KiB outbox, reply scratch per worker),
//!   however much a client pipelines.
//! - `ServerConfig::write_timeout`: a client that stops reading its replies
//!   is dropped rather than pinning a thread forever.
//! - No timeout once in transmission: an idle client is legitimate.
//!
//! # Shutdown
//!
//! `Server::shutdown` stops the listeners, then shuts down the read side of
//! every live connection. A connection with requests in flight finishes
//! them and sends their replies (the spec asks servers to finish in-flight
//! requests; `NBD_CMD_DISC` is handled the same way), then closes; one in
//! the handshake sees end-of-file at once. `shutdown` joins every thread
//! before it returns.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::Mutex;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::{error, info, info_span, warn};

use crate::connection::{self, Transport};
use crate::export::{Catalog, Client};
use crate::tls::NbdTls;
pub use crate::transmission::{BUFFER_BYTES_PER_CONNECTION_MAX, INLINE_BYTES_MAX};

/// Most options one handshake may send. Real clients need a handful (nbdinfo
/// `--list` a few per export); the cap stops a client from holding a slot by
/// haggling forever, together with the handshake deadline.
pub const OPTIONS_PER_HANDSHAKE_MAX: u32 = 1024;

/// Server limits. `Default` gives the values Rewind ships with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most connections served at once; further ones are closed on accept.
    pub connections_max: usize,
    /// Time from accept to the end of option haggling.
    pub handshake_timeout: Duration,
    /// Longest a single reply write may block on a client that does not read.
    pub write_timeout: Duration,
    /// Most worker threads per connection, started on demand, for the
    /// requests its reader does not run itself (large or slow ones).
    pub workers_per_connection_max: usize,
    /// Most requests of one connection admitted and not yet answered; the
    /// connection is not read while this many are in flight.
    pub requests_in_flight_max: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            connections_max: 64,
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            workers_per_connection_max: 4,
            requests_in_flight_max: 64,
        }
    }
}

/// How long the accept loop waits after an unexpected accept error (such as
/// running out of file descriptors) before trying again, so a persistent
/// error does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// State shared by the listeners and the connection threads.
pub(crate) struct Shared {
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) config: ServerConfig,
    pub(crate) tls: Option<NbdTls>,
    stopping: AtomicBool,
    next_connection_id: AtomicU64,
    table: Mutex<ConnectionTable>,
}

impl Shared {
    pub(crate) fn new(catalog: Arc<dyn Catalog>, config: ServerConfig) -> Shared {
        Shared {
            catalog,
            config,
            tls: None,
            stopping: AtomicBool::new(false),
            next_connection_id: AtomicU64::new(1),
            table: Mutex::new(ConnectionTable::default()),
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct ConnectionTable {
    /// A handle on each live connection's socket, used by shutdown to end it.
    /// The connection thread removes its entry as its very last step: the
    /// socket closes when this handle is dropped, so a client that saw the
    /// connection close can count on its slot being free.
    live: HashMap<u64, Control>,
    /// Connection threads not yet joined; finished ones are reaped on accept.
    threads: Vec<JoinHandle<()>>,
}

/// A second handle on a connection's socket.
enum Control {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Control {
    fn shutdown_read(&self) {
        // The socket may already be closing; nothing to do about an error.
        let _ = match self {
            Control::Tcp(stream) => stream.shutdown(Shutdown::Read),
            Control::Unix(stream) => stream.shutdown(Shutdown::Read),
        };
    }
}

trait IntoControl: Transport {
    fn into_control(self) -> Control;
}

impl IntoControl for TcpStream {
    fn into_control(self) -> Control {
        Control::Tcp(self)
    }
}

impl IntoControl for UnixStream {
    fn into_control(self) -> Control {
        Control::Unix(self)
    }
}

/// A listening socket of either kind.
trait Listener: AsFd + Send + 'static {
    type Stream: IntoControl;
    /// The stream, the peer as people read it, and whether the peer is on
    /// this machine (a loopback address or a Unix socket).
    fn accept_stream(&self) -> io::Result<(Self::Stream, String, bool)>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<(TcpStream, String, bool)> {
        let (stream, peer) = self.accept()?;
        Ok((stream, peer.to_string(), peer.ip().is_loopback()))
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<(UnixStream, String, bool)> {
        let (stream, _) = self.accept()?;
        // Unix peers have no useful address; the connection id tells them apart.
        Ok((stream, "unix".to_owned(), true))
    }
}

struct ListenerHandle {
    /// Dropping this wakes the accept thread, which then exits.
    wake: UnixStream,
    thread: JoinHandle<()>,
    /// The socket file to remove once the listener has stopped.
    unix_path: Option<PathBuf>,
}

/// An NBD server serving the exports of one catalog on any number of TCP and
/// Unix socket listeners. Dropping it shuts it down.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Mutex<Vec<ListenerHandle>>,
}

impl Server {
    pub fn new(catalog: Arc<dyn Catalog>, config: ServerConfig) -> Server {
        assert!(config.connections_max > 0, "connections_max must be positive");
        assert!(!config.handshake_timeout.is_zero(), "handshake_timeout must be positive");
        assert!(!config.write_timeout.is_zero(), "write_timeout must be positive");
        assert!(config.workers_per_connection_max > 0, "workers_per_connection_max must be positive");
        assert!(config.requests_in_flight_max > 0, "requests_in_flight_max must be positive");
        Server { shared: Arc::new(Shared::new(catalog, config)), listeners: Mutex::new(Vec::new()) }
    }

    /// Offers TLS (`NBD_OPT_STARTTLS`) on every listener; call before the
    /// first `serve_*`.
    pub fn with_tls(mut self, tls: NbdTls) -> Server {
        let shared = Arc::get_mut(&mut self.shared).expect("with_tls comes before serving");
        shared.tls = Some(tls);
        self
    }

    /// Listens on a TCP address (Rewind's default is `127.0.0.1:10809`) and
    /// returns the bound address, useful with port 0.
    pub fn serve_tcp(&self, address: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(address)?;
        let local = listener.local_addr()?;
        self.start_listener(listener, None, format!("tcp:{local}"))?;
        Ok(local)
    }

    /// Listens on a Unix domain socket at `path`, which must not exist yet.
    /// The socket file is removed again on shutdown.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let listener = UnixListener::bind(path)?;
        self.start_listener(listener, Some(path.to_owned()), format!("unix:{}", path.display()))
    }

    fn start_listener<L: Listener>(&self, listener: L, unix_path: Option<PathBuf>, name: String) -> io::Result<()> {
        let mut listeners = self.listeners.lock();
        if self.shared.is_stopping() {
            return Err(io::Error::other("the NBD server is shut down"));
        }
        // Non-blocking so that a connection reset between poll and accept
        // cannot leave the thread stuck in accept, deaf to shutdown.
        listener.set_nonblocking(true)?;
        let (wake, wake_rx) = UnixStream::pair()?;
        let shared = Arc::clone(&self.shared);
        let span_name = name.clone();
        let thread = thread::Builder::new().name("nbd-accept".to_owned()).spawn(move || {
            let _span = info_span!("nbd_listener", listener = %span_name).entered();
            accept_loop(&shared, &listener, &wake_rx);
        })?;
        info!(listener = %name, "NBD server listening");
        listeners.push(ListenerHandle { wake, thread, unix_path });
        Ok(())
    }

    /// Connections currently being served (in handshake or transmission).
    pub fn connection_count(&self) -> usize {
        self.shared.table.lock().live.len()
    }

    /// Stops accepting, ends every connection once its in-flight requests are
    /// answered, and waits for all threads. Idempotent.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let listeners = std::mem::take(&mut *self.listeners.lock());
        for ListenerHandle { wake, thread, unix_path } in listeners {
            drop(wake);
            if thread.join().is_err() {
                error!("NBD accept thread panicked");
            }
            if let Some(path) = unix_path {
                if let Err(error) = std::fs::remove_file(&path) {
                    warn!(path = %path.display(), %error, "cannot remove Unix socket");
                }
            }
        }
        // No listener is left, so no connection can be added from here on.
        let threads = {
            let mut table = self.shared.table.lock();
            for control in table.live.values() {
                control.shutdown_read();
            }
            std::mem::take(&mut table.threads)
        };
        for thread in threads {
            if thread.join().is_err() {
                error!("NBD connection thread panicked");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop<L: Listener>(shared: &Arc<Shared>, listener: &L, wake: &UnixStream) {
    loop {
        let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(wake, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => {
                error!(%error, "poll on the listening socket failed; listener stopped");
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        match listener.accept_stream() {
            Ok((stream, peer, local)) => admit(shared, stream, peer, local),
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(error) => {
                warn!(%error, "accept failed");
                // Wait for shutdown or the backoff, whichever comes first.
                let mut fds = [PollFd::new(wake, PollFlags::IN)];
                let backoff = Timespec { tv_sec: 0, tv_nsec: ACCEPT_ERROR_BACKOFF.as_nanos() as _ };
                if matches!(poll(&mut fds, Some(&backoff)), Ok(n) if n > 0) {
                    return;
                }
            }
        }
    }
}

/// Registers an accepted connection and starts its thread, or closes it when
/// the server is full or stopping.
fn admit<S: IntoControl>(shared: &Arc<Shared>, stream: S, peer: String, local: bool) {
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(error) => {
            warn!(%peer, %error, "cannot register connection");
            return;
        }
    };
    let mut table = shared.table.lock();
    reap_finished(&mut table.threads);
    if shared.is_stopping() {
        return;
    }
    let connections_max = shared.config.connections_max;
    if table.live.len() >= connections_max {
        drop(table);
        warn!(%peer, connections_max, "refusing connection: connections_max reached");
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    table.live.insert(id, control.into_control());
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        // Declared first so it drops last, after the connection's own socket
        // handles, even if serving panics.
        let _deregister = Deregister { shared: Arc::clone(&thread_shared), id };
        let _span = info_span!("nbd_connection", id, peer = %peer).entered();
        info!("connection opened");
        connection::serve(stream, thread_shared, Client { peer, local, identity: None });
    });
    match spawned {
        Ok(thread) => table.threads.push(thread),
        Err(error) => {
            table.live.remove(&id);
            error!(%error, "cannot spawn connection thread");
        }
    }
}

/// Removes a connection from the table when its thread ends; see
/// `ConnectionTable::live` for why this must be the last step.
struct Deregister {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        self.shared.table.lock().live.remove(&self.id);
    }
}

/// Joins the threads of connections that have ended, so the list stays
/// bounded by the number of live connections.
fn reap_finished(threads: &mut Vec<JoinHandle<()>>) {
    let mut index = 0;
    while index < threads.len() {
        if threads[index].is_finished() {
            if threads.swap_remove(index).join().is_err() {
                error!("NBD connection thread panicked");
            }
        } else {
            index += 1;
        }
    }
}
