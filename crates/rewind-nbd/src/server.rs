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
//!     │                    │ unknown bit     │ ABORT, bad magic, option too      │ DISC, EOF, bad magic,
//!     │ over a limit       ▼                 ▼ long, too many, deadline, EOF     ▼ oversized WRITE, EOF mid-payload,
//!     ▼                  closed            closed                              closed   idle too long
//!  refused: greeting, ERR_POLICY + message per option (accept thread) ──ABORT, EOF, EXPORT_NAME, 5 s──▶ closed
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
//! What a client may hold, and what it costs the server at most:
//!
//! - `ServerConfig::connections_max` live connections (default 128), of which
//!   at most `ServerConfig::connections_per_client_max` (default 32) from one
//!   client: one TCP address, or one user on the Unix socket. A connection
//!   over either limit is refused the NBD way (`crate::refusal`): its options
//!   get `NBD_REP_ERR_POLICY` with a message such as "server full for
//!   127.0.0.1: 32 connections from it (limit 32 per client)", answered from
//!   the accept thread, so a refused connection never costs a thread. The
//!   per-client limit is why 64 idle connections from one place no longer
//!   lock everyone else out. Every local TCP client is 127.0.0.1 and every
//!   VM of one qemu user is one Unix socket user, which is why the default
//!   is a generous quarter of the total rather than a handful.
//! - `ServerConfig::handshake_timeout` bounds the whole handshake, not each
//!   read, so a client trickling bytes cannot hold a slot; the TLS handshake
//!   counts, and so do options after it.
//! - `OPTIONS_PER_HANDSHAKE_MAX` options per handshake and
//!   `protocol::OPTION_BYTES_MAX` bytes per option; beyond either we hang up.
//! - Idle connections: a connection in transmission that sends nothing for
//!   `ServerConfig::idle_timeout` (writable exports) or
//!   `ServerConfig::idle_timeout_read_only` (views) while none of its
//!   requests is in flight is closed. The two differ on purpose. A live
//!   volume is typically a VM's disk: qemu keeps its one connection for the
//!   VM's lifetime and sends nothing while the guest leaves the disk alone,
//!   which can be days for a data disk; cutting it costs the guest an I/O
//!   error on its next access (and ext4 a read-only remount). So by default
//!   writable connections have no idle timeout: the connection limits above
//!   already keep them from locking others out. A view is read by a restore
//!   (nbdcopy, qemu-img, an nbdfuse mount someone is browsing); one idle for
//!   an hour (the default) has most likely been forgotten, and opening it
//!   again is cheap and shows the same data.
//! - `protocol::PAYLOAD_BYTES_MAX` (32 MiB) per READ or WRITE, advertised as
//!   the maximum block size. A larger READ gets `NBD_EINVAL`; a larger WRITE
//!   ends the connection before its payload is read.
//! - `ServerConfig::requests_in_flight_max` requests per connection admitted
//!   and not yet answered, and `BUFFER_BYTES_PER_CONNECTION_MAX` (32 MiB) of
//!   payload buffers per connection; while either is used up the connection
//!   is not read.
//! - `ServerConfig::write_timeout`: a client that stops reading its replies
//!   is dropped rather than pinning a thread forever.
//! - Log lines a client can cause are rate-limited per client
//!   (`crate::log_limit`), so a flood of bad requests or connections cannot
//!   fill the disk.
//!
//! Memory, stated and enforced: a connection holds at most
//! `BUFFER_BYTES_PER_CONNECTION_MAX` of payload buffers (32 MiB, however
//! much it pipelines), a 128 KiB read buffer, a 64 KiB outbox, reply
//! scratch for the reader and each worker (a block status reply of
//! `protocol::EXTENTS_PER_REPLY_MAX` extents, 128 KiB, or an error message),
//! and `1 + workers_per_connection_max` threads (5; their stacks are mapped,
//! not resident, beyond what they touch). During the handshake the option
//! buffer adds at most `protocol::OPTION_BYTES_MAX` (64 KiB), freed when
//! transmission starts. `ServerConfig::memory_per_connection_max` adds
//! these up: under 33 MiB. A request costs nothing beyond its payload
//! buffer, which counts against its connection's 32 MiB. So the server's
//! buffers are bounded by `connections_max × memory_per_connection_max`,
//! about 4.1 GiB with the defaults (buffers are allocated as requests need
//! them, so idle clients and small requests use a small fraction of it),
//! plus `refusals_max` refusals of a few hundred bytes per listener. File
//! descriptors: `FDS_PER_CONNECTION` per connection, one per refusal.
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
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::{error, info, info_span, warn};

use crate::connection::{self, Transport};
use crate::export::{Catalog, Client};
use crate::log_limit::{LogBudget, PeerKey, PeerLog};
use crate::protocol as p;
use crate::refusal::{self, Refusal};
use crate::tls::NbdTls;
pub use crate::transmission::{BUFFER_BYTES_PER_CONNECTION_MAX, INLINE_BYTES_MAX};

/// Most options one handshake may send. Real clients need a handful (nbdinfo
/// `--list` a few per export); the cap stops a client from holding a slot by
/// haggling forever, together with the handshake deadline.
pub const OPTIONS_PER_HANDSHAKE_MAX: u32 = 1024;

/// File descriptors one connection holds: its socket, and duplicates of it
/// for the connection table (shutdown), the read half, and the transmission
/// pipeline's control handle. `rewind serve` sizes `connections_max` by it.
pub const FDS_PER_CONNECTION: usize = 4;

/// With TLS: the socket and its table handle, the pair the TLS pump
/// decrypts into (`crate::tls`), and the connection's read half and
/// transmission control handle on that pair.
pub const FDS_PER_TLS_CONNECTION: usize = 6;

/// Server limits. `Default` gives the values Rewind ships with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most connections served at once; further ones are refused with an
    /// NBD error.
    pub connections_max: usize,
    /// Most connections from one client (TCP: one IP address; Unix socket:
    /// one user id); further ones are refused with an NBD error.
    pub connections_per_client_max: usize,
    /// Most refused connections each listener tells why at once (see
    /// `crate::refusal`); more are closed at once. Each holds a descriptor.
    pub refusals_max: usize,
    /// Time from accept to the end of option haggling.
    pub handshake_timeout: Duration,
    /// A connection to a writable export that sends nothing this long with
    /// no request in flight is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// The same for read-only exports (views).
    pub idle_timeout_read_only: Option<Duration>,
    /// Longest a single reply write may block on a client that does not read.
    pub write_timeout: Duration,
    /// Most worker threads per connection, started on demand, for the
    /// requests its reader does not run itself (large or slow ones).
    pub workers_per_connection_max: usize,
    /// Most requests of one connection admitted and not yet answered; the
    /// connection is not read while this many are in flight.
    pub requests_in_flight_max: usize,
    /// Most log lines one client can cause per `log_interval` (see
    /// `crate::log_limit`); the rest are counted and summarised.
    pub log_lines_per_client: u32,
    pub log_interval: Duration,
}

impl ServerConfig {
    /// The most memory one connection's buffers take (see "Memory" above):
    /// payload buffers, the read buffer, the outbox, and reply scratch for
    /// the reader and each worker (a block status reply of
    /// `EXTENTS_PER_REPLY_MAX` extents, or an error message).
    pub fn memory_per_connection_max(&self) -> usize {
        const SCRATCH_BYTES_MAX: usize = p::CHUNK_HEADER_BYTES + 4 + p::EXTENTS_PER_REPLY_MAX * 8 + p::STRING_BYTES_MAX;
        BUFFER_BYTES_PER_CONNECTION_MAX
            + connection::READ_BUFFER_BYTES
            + crate::transmission::OUTBOX_BYTES_MAX
            + (1 + self.workers_per_connection_max) * SCRATCH_BYTES_MAX
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            connections_max: 128,
            connections_per_client_max: 32,
            refusals_max: 64,
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: None,
            idle_timeout_read_only: Some(Duration::from_secs(3600)),
            write_timeout: Duration::from_secs(60),
            workers_per_connection_max: 4,
            requests_in_flight_max: 64,
            log_lines_per_client: 20,
            log_interval: Duration::from_secs(60),
        }
    }
}

/// How long the accept loop stops accepting after an unexpected accept
/// error (such as running out of file descriptors), so a persistent error
/// does not spin a core. Refusals and shutdown are still served meanwhile.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// State shared by the listeners and the connection threads.
pub(crate) struct Shared {
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) config: ServerConfig,
    pub(crate) tls: Option<NbdTls>,
    logs: Arc<LogBudget>,
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
            logs: Arc::new(LogBudget::new(config.log_interval, config.log_lines_per_client)),
            stopping: AtomicBool::new(false),
            next_connection_id: AtomicU64::new(1),
            table: Mutex::new(ConnectionTable::default()),
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// A connection's handle on `peer`'s log budget (`crate::log_limit`).
    pub(crate) fn client_log(&self, peer: PeerKey) -> PeerLog {
        self.logs.connection(peer)
    }
}

#[derive(Default)]
struct ConnectionTable {
    /// A handle on each live connection's socket, used by shutdown to end it.
    /// The connection thread removes its entry as its very last step: the
    /// socket closes when this handle is dropped, so a client that saw the
    /// connection close can count on its slot being free.
    live: HashMap<u64, Control>,
    /// Live connections per client; no zero entries.
    per_client: HashMap<PeerKey, usize>,
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

trait IntoControl: Transport + AsFd {
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

/// An accepted connection: the socket, how the client is named to people,
/// whether it is on this machine (a loopback address or a Unix socket), and
/// which client it counts against.
struct Accepted<S> {
    stream: S,
    peer: String,
    local: bool,
    key: PeerKey,
}

/// A listening socket of either kind.
trait Listener: AsFd + Send + 'static {
    type Stream: IntoControl;
    fn accept_stream(&self) -> io::Result<Accepted<Self::Stream>>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<Accepted<TcpStream>> {
        let (stream, peer) = self.accept()?;
        // An IPv4 client on a dual-stack socket is the same client as on an
        // IPv4 one.
        let key = PeerKey::Ip(peer.ip().to_canonical());
        Ok(Accepted { stream, peer: peer.to_string(), local: peer.ip().is_loopback(), key })
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<Accepted<UnixStream>> {
        let (stream, _) = self.accept()?;
        // Unix peers have no useful address; the connection id tells them
        // apart, and their user id is who they are for the limits.
        let key = match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(credentials) => PeerKey::Uid(credentials.uid.as_raw()),
            Err(_) => PeerKey::Unix,
        };
        Ok(Accepted { stream, peer: "unix".to_owned(), local: true, key })
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
        assert!(config.connections_per_client_max > 0, "connections_per_client_max must be positive");
        assert!(config.idle_timeout.is_none_or(|timeout| !timeout.is_zero()), "idle_timeout must be positive");
        assert!(
            config.idle_timeout_read_only.is_none_or(|timeout| !timeout.is_zero()),
            "idle_timeout_read_only must be positive"
        );
        assert!(!config.log_interval.is_zero(), "log_interval must be positive");
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
        self.shared.logs.flush();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop<L: Listener>(shared: &Arc<Shared>, listener: &L, wake: &UnixStream) {
    let refusals_max = shared.config.refusals_max;
    let mut refusals: Vec<Refusal<L::Stream>> = Vec::with_capacity(refusals_max);
    let mut accept_errors = AcceptErrors::default();
    let interval = shared.logs.interval();
    let mut next_sweep = Instant::now() + interval;
    let mut accepting_from = Instant::now();
    loop {
        let now = Instant::now();
        // Refusals past their deadline are dropped, which closes them.
        refusals.retain(|refusal| refusal.deadline > now);
        if now >= next_sweep {
            shared.logs.sweep();
            accept_errors.summarise(interval);
            next_sweep = now + interval;
        }
        let accepting = now >= accepting_from;
        let mut wake_at = refusals.iter().map(|refusal| refusal.deadline).fold(next_sweep, Instant::min);
        if !accepting {
            wake_at = wake_at.min(accepting_from);
        }
        let timeout = wake_at.saturating_duration_since(now);
        let timeout = Timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };

        // Wake-up socket, listener, refusals, in that order.
        let (woken, acceptable, readable) = {
            let mut fds = Vec::with_capacity(2 + refusals.len());
            fds.push(PollFd::new(wake, PollFlags::IN));
            // While backing off after an error the listener is left out, so
            // a connection waiting in its queue does not spin the loop.
            fds.push(PollFd::new(listener, if accepting { PollFlags::IN } else { PollFlags::empty() }));
            fds.extend(refusals.iter().map(|refusal| PollFd::new(&refusal.stream, PollFlags::IN)));
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => {
                    error!(%error, "poll on the listening socket failed; listener stopped");
                    return;
                }
            }
            let readable: Vec<bool> = fds[2..].iter().map(|fd| !fd.revents().is_empty()).collect();
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty(), readable)
        };
        if woken {
            return;
        }
        let mut index = 0;
        refusals.retain_mut(|refusal| {
            let keep = !readable[index] || refusal.readable() == refusal::Next::Wait;
            index += 1;
            keep
        });
        if !accepting || !acceptable {
            continue;
        }
        match listener.accept_stream() {
            Ok(accepted) => {
                let Some((stream, message)) = admit(shared, accepted) else { continue };
                if refusals.len() < refusals_max && stream.set_nonblocking(true).is_ok() {
                    refusals.extend(Refusal::start(stream, message));
                }
                // Otherwise dropping the stream closes it: with this many
                // refusals under way, saying why costs more than it helps.
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(error) => {
                // Out of file descriptors (EMFILE, ENFILE) or memory: the
                // connection stays queued; try again after the backoff.
                accept_errors.record(&error);
                accepting_from = Instant::now() + ACCEPT_ERROR_BACKOFF;
            }
        }
    }
}

/// Accept errors, logged at most once per log interval each kind, so an
/// exhausted descriptor table does not also fill the disk.
#[derive(Default)]
struct AcceptErrors {
    /// Errors since the last line, and the last one.
    count: u64,
    last: Option<String>,
    logged: bool,
}

impl AcceptErrors {
    fn record(&mut self, error: &io::Error) {
        if !self.logged {
            warn!(%error, "accept failed; new connections wait until it works again (retrying every 100 ms)");
            self.logged = true;
        } else {
            self.count += 1;
            self.last = Some(error.to_string());
        }
    }

    fn summarise(&mut self, interval: Duration) {
        if let Some(error) = self.last.take() {
            warn!(
                count = self.count,
                "accept failed {} more times in the last {} s, last: {error}",
                self.count,
                interval.as_secs().max(1)
            );
            self.count = 0;
        } else {
            // A quiet interval: the next error is news again.
            self.logged = false;
        }
    }
}

/// Registers an accepted connection and starts its thread. Returns the
/// stream and the reason when a limit refuses it; drops it (closing it)
/// when the server is stopping or the thread cannot start.
fn admit<S: IntoControl>(shared: &Arc<Shared>, accepted: Accepted<S>) -> Option<(S, String)> {
    let Accepted { stream, peer, local, key } = accepted;
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(error) => {
            if shared.logs.allow(key) {
                warn!(%peer, %error, "cannot register connection");
            }
            return None;
        }
    };
    let mut table = shared.table.lock();
    reap_finished(&mut table.threads);
    if shared.is_stopping() {
        return None;
    }
    let ServerConfig { connections_max, connections_per_client_max, .. } = shared.config;
    let live = table.live.len();
    let from_client = table.per_client.get(&key).copied().unwrap_or(0);
    let refused = if from_client >= connections_per_client_max {
        Some(format!(
            "server full for {key}: {} from it (limit {connections_per_client_max} per client); close one and \
             try again",
            connections(from_client)
        ))
    } else if live >= connections_max {
        Some(format!("server full: {} (limit {connections_max}); try again later", connections(live)))
    } else {
        None
    };
    if let Some(message) = refused {
        drop(table);
        if shared.logs.allow(key) {
            warn!(%peer, "refusing connection: {message}");
        }
        return Some((stream, message));
    }
    let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    table.live.insert(id, control.into_control());
    *table.per_client.entry(key).or_insert(0) += 1;
    let log = shared.client_log(key);
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        // Declared first so it drops last, after the connection's own socket
        // handles, even if serving panics.
        let _deregister = Deregister { shared: Arc::clone(&thread_shared), id, key };
        let _span = info_span!("nbd_connection", id, peer = %peer).entered();
        if log.allow() {
            info!("connection opened");
        }
        connection::serve(stream, thread_shared, Client { peer, local, identity: None }, log);
    });
    match spawned {
        Ok(thread) => table.threads.push(thread),
        Err(error) => {
            table.live.remove(&id);
            release_client(&mut table, key);
            error!(%error, "cannot spawn connection thread");
        }
    }
    None
}

fn connections(count: usize) -> String {
    if count == 1 {
        "1 connection".to_owned()
    } else {
        format!("{count} connections")
    }
}

fn release_client(table: &mut ConnectionTable, key: PeerKey) {
    let count = table.per_client.get_mut(&key).expect("a live connection is counted for its client");
    *count -= 1;
    if *count == 0 {
        table.per_client.remove(&key);
    }
}

/// Removes a connection from the table when its thread ends; see
/// `ConnectionTable::live` for why this must be the last step.
struct Deregister {
    shared: Arc<Shared>,
    id: u64,
    key: PeerKey,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        let mut table = self.shared.table.lock();
        table.live.remove(&self.id);
        release_client(&mut table, self.key);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers the module doc states.
    #[test]
    fn memory_per_connection_and_in_all_is_as_documented() {
        const MIB: usize = 1 << 20;
        let config = ServerConfig::default();
        let per_connection = config.memory_per_connection_max();
        assert!(per_connection > 32 * MIB && per_connection < 33 * MIB, "{per_connection}");
        let all = config.connections_max * per_connection;
        assert!(all < 4300 * MIB, "{all} is under 4.2 GiB");
    }
}
