//! Listeners, connection threads, connection limits and shutdown, for any
//! protocol (NBD, NFS): the protocol serves one connection on its thread,
//! and says, if it can, why a connection over a limit is refused.
//!
//! # Threads
//!
//! Each listener (`serve_tcp`, `serve_unix`) has an accept thread that waits
//! in `poll(2)` on the listening socket and on a wake-up socket; shutdown
//! closes the wake-up socket's other end, which ends the wait without
//! connecting to ourselves. Each accepted connection gets one thread, which
//! runs [`Protocol::serve`] to the connection's end.
//!
//! # Limits
//!
//! - `ServeConfig::connections_max` live connections, of which at most
//!   `ServeConfig::connections_per_client_max` from one client: one IP
//!   address, or one user on a Unix socket. A connection over either limit
//!   is handed to [`Protocol::refuse`], which may tell the client why from
//!   the accept thread (a refused connection never costs a thread), at most
//!   `ServeConfig::refusals_max` at once per listener; beyond that, or if
//!   the protocol has no way to say it, it is closed.
//! - Log lines a client can cause are rate-limited per client
//!   (`crate::log_limit`).
//! - Accept errors (out of file descriptors) are retried every 100 ms and
//!   logged once per log interval.
//!
//! # Shutdown
//!
//! [`Listeners::shutdown`] stops the listeners, then shuts down the read
//! side of every live connection (the protocol finishes what is in flight
//! and closes), and joins every thread before it returns.

use std::collections::HashMap;
use std::io;
use std::marker::PhantomData;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::{error, info, info_span, warn};

use crate::log_limit::{LogBudget, PeerKey, PeerLog};
use crate::transport::Transport;

const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The limits of [`Listeners`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeConfig {
    pub connections_max: usize,
    pub connections_per_client_max: usize,
    /// Refused connections told why at once, per listener.
    pub refusals_max: usize,
    pub log_lines_per_client: u32,
    pub log_interval: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            connections_max: 128,
            connections_per_client_max: 32,
            refusals_max: 64,
            log_lines_per_client: 20,
            log_interval: Duration::from_secs(60),
        }
    }
}

/// A client, as the listener knows it: how it is named to people, whether
/// it is on this machine (a loopback address or a Unix socket), which
/// client it counts against, and its address (TCP only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub local: bool,
    pub key: PeerKey,
    pub address: Option<SocketAddr>,
}

/// Whether the server is shutting down: connections stop taking new work.
#[derive(Clone, Debug, Default)]
pub struct Running(Arc<AtomicBool>);

impl Running {
    pub fn is_stopping(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A refused connection being told why, from the accept thread: every step
/// a single non-blocking read or write.
pub trait Refusal: Send {
    fn fd(&self) -> BorrowedFd<'_>;
    /// When the client's time to read its message ends.
    fn deadline(&self) -> Instant;
    /// The client sent something (or hung up); false when it is done with.
    fn readable(&mut self) -> bool;
}

/// A protocol served on [`Listeners`].
pub trait Protocol: Send + Sync + 'static {
    /// For thread names and logs: "nbd", "nfs".
    const NAME: &'static str;

    /// Serves one connection to its end, on the connection's own thread.
    /// `log` is the client's log budget; `running` says when to stop.
    fn serve<S: Transport>(self: &Arc<Self>, stream: S, peer: Peer, log: PeerLog, running: Running);

    /// Starts telling a client over a limit why (`message`), or `None` to
    /// close the connection at once.
    fn refuse<S: Transport>(&self, stream: S, message: String) -> Option<Box<dyn Refusal>>;
}

struct Shared<P> {
    protocol: Arc<P>,
    config: ServeConfig,
    logs: Arc<LogBudget>,
    running: Running,
    next_connection_id: AtomicU64,
    table: Mutex<ConnectionTable>,
}

#[derive(Default)]
struct ConnectionTable {
    /// Each live connection's handle for shutdown. A connection leaves
    /// the table only when its thread ends (`Deregister`), after its own
    /// handles are dropped, so a client over its limit is never let in
    /// while the old connection still holds a descriptor.
    live: HashMap<u64, Control>,
    per_client: HashMap<PeerKey, usize>,
    threads: Vec<JoinHandle<()>>,
}

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
    fn accept_stream(&self) -> io::Result<(Self::Stream, Peer)>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<(TcpStream, Peer)> {
        let (stream, address) = self.accept()?;
        // An IPv4 client on a dual-stack socket is the same client as on an
        // IPv4 one.
        let key = PeerKey::Ip(address.ip().to_canonical());
        let peer = Peer { name: address.to_string(), local: address.ip().is_loopback(), key, address: Some(address) };
        Ok((stream, peer))
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixListener::set_nonblocking(self, nonblocking)
    }
    fn accept_stream(&self) -> io::Result<(UnixStream, Peer)> {
        let (stream, _) = self.accept()?;
        // Unix peers have no useful address; the connection id tells them
        // apart, and their user id is who they are for the limits.
        let key = match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(credentials) => PeerKey::Uid(credentials.uid.as_raw()),
            Err(_) => PeerKey::Unix,
        };
        Ok((stream, Peer { name: "unix".to_owned(), local: true, key, address: None }))
    }
}

struct ListenerHandle {
    /// Dropping this wakes the accept thread, which then exits.
    wake: UnixStream,
    thread: JoinHandle<()>,
    /// The socket file to remove once the listener has stopped.
    unix_path: Option<PathBuf>,
}

/// Any number of TCP and Unix socket listeners serving one protocol.
/// Dropping it shuts it down.
pub struct Listeners<P: Protocol> {
    shared: Arc<Shared<P>>,
    listeners: Mutex<Vec<ListenerHandle>>,
    _protocol: PhantomData<P>,
}

impl<P: Protocol> Listeners<P> {
    pub fn new(protocol: Arc<P>, config: ServeConfig) -> Listeners<P> {
        assert!(config.connections_max > 0, "connections_max must be positive");
        assert!(config.connections_per_client_max > 0, "connections_per_client_max must be positive");
        assert!(!config.log_interval.is_zero(), "log_interval must be positive");
        let shared = Shared {
            protocol,
            config,
            logs: Arc::new(LogBudget::new(config.log_interval, config.log_lines_per_client)),
            running: Running::default(),
            next_connection_id: AtomicU64::new(1),
            table: Mutex::new(ConnectionTable::default()),
        };
        Listeners { shared: Arc::new(shared), listeners: Mutex::new(Vec::new()), _protocol: PhantomData }
    }

    /// The protocol, to change before the first `serve_*` (`None` after).
    pub fn protocol_mut(&mut self) -> Option<&mut P> {
        Arc::get_mut(&mut self.shared).and_then(|shared| Arc::get_mut(&mut shared.protocol))
    }

    pub fn protocol(&self) -> &Arc<P> {
        &self.shared.protocol
    }

    /// Listens on a TCP address and returns the bound address, useful with port 0.
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
        if self.shared.running.is_stopping() {
            return Err(io::Error::other(format!("the {} server is shut down", P::NAME)));
        }
        // Non-blocking so that a connection reset between poll and accept
        // cannot leave the thread stuck in accept, deaf to shutdown.
        listener.set_nonblocking(true)?;
        let (wake, wake_rx) = UnixStream::pair()?;
        let shared = Arc::clone(&self.shared);
        let span_name = name.clone();
        let thread = thread::Builder::new().name(format!("{}-accept", P::NAME)).spawn(move || {
            let _span = info_span!("listener", protocol = P::NAME, listener = %span_name).entered();
            accept_loop(&shared, &listener, &wake_rx);
        })?;
        info!(listener = %name, "{} server listening", P::NAME.to_uppercase());
        listeners.push(ListenerHandle { wake, thread, unix_path });
        Ok(())
    }

    /// Connections currently being served.
    pub fn connection_count(&self) -> usize {
        self.shared.table.lock().live.len()
    }

    /// Stops accepting, ends every connection once what it has in flight is
    /// answered, and waits for all threads. Idempotent.
    pub fn shutdown(&self) {
        self.shared.running.stop();
        let listeners = std::mem::take(&mut *self.listeners.lock());
        for ListenerHandle { wake, thread, unix_path } in listeners {
            drop(wake);
            if thread.join().is_err() {
                error!("{} accept thread panicked", P::NAME);
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
                error!("{} connection thread panicked", P::NAME);
            }
        }
        self.shared.logs.flush();
    }
}

impl<P: Protocol> Drop for Listeners<P> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop<P: Protocol, L: Listener>(shared: &Arc<Shared<P>>, listener: &L, wake: &UnixStream) {
    let refusals_max = shared.config.refusals_max;
    let mut refusals: Vec<Box<dyn Refusal>> = Vec::with_capacity(refusals_max);
    let mut accept_errors = AcceptErrors::default();
    let interval = shared.logs.interval();
    let mut next_sweep = Instant::now() + interval;
    let mut accepting_from = Instant::now();
    loop {
        let now = Instant::now();
        // Refusals past their deadline are dropped, which closes them.
        refusals.retain(|refusal| refusal.deadline() > now);
        if now >= next_sweep {
            shared.logs.sweep();
            accept_errors.summarise(interval);
            next_sweep = now + interval;
        }
        let accepting = now >= accepting_from;
        let mut wake_at = refusals.iter().map(|refusal| refusal.deadline()).fold(next_sweep, Instant::min);
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
            fds.extend(refusals.iter().map(|refusal| PollFd::from_borrowed_fd(refusal.fd(), PollFlags::IN)));
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
            let keep = !readable[index] || refusal.readable();
            index += 1;
            keep
        });
        if !accepting || !acceptable {
            continue;
        }
        match listener.accept_stream() {
            Ok((stream, peer)) => {
                let Some((stream, message)) = admit(shared, stream, peer) else { continue };
                // Otherwise dropping the stream closes it: with this many
                // refusals under way, saying why costs more than it helps.
                if refusals.len() < refusals_max && stream.set_nonblocking(true).is_ok() {
                    refusals.extend(shared.protocol.refuse(stream, message));
                }
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
fn admit<P: Protocol, S: IntoControl>(shared: &Arc<Shared<P>>, stream: S, peer: Peer) -> Option<(S, String)> {
    let key = peer.key;
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(error) => {
            if shared.logs.allow(key) {
                warn!(peer = %peer.name, %error, "cannot register connection");
            }
            return None;
        }
    };
    let mut table = shared.table.lock();
    reap_finished::<P>(&mut table.threads);
    if shared.running.is_stopping() {
        return None;
    }
    let ServeConfig { connections_max, connections_per_client_max, .. } = shared.config;
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
            warn!(peer = %peer.name, "refusing connection: {message}");
        }
        return Some((stream, message));
    }
    let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    table.live.insert(id, control.into_control());
    *table.per_client.entry(key).or_insert(0) += 1;
    let log = shared.logs.connection(key);
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new().name(format!("{}-conn-{id}", P::NAME)).spawn(move || {
        // Declared first so it drops last, after the connection's own socket
        // handles, even if serving panics.
        let _deregister = Deregister { shared: Arc::clone(&thread_shared), id, key };
        let _span = info_span!("connection", protocol = P::NAME, id, peer = %peer.name).entered();
        if log.allow_info() {
            info!("connection opened");
        }
        let running = thread_shared.running.clone();
        thread_shared.protocol.serve(stream, peer, log, running);
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
struct Deregister<P: Protocol> {
    shared: Arc<Shared<P>>,
    id: u64,
    key: PeerKey,
}

impl<P: Protocol> Drop for Deregister<P> {
    fn drop(&mut self) {
        let mut table = self.shared.table.lock();
        table.live.remove(&self.id);
        release_client(&mut table, self.key);
    }
}

/// Joins the threads of connections that have ended, so the list stays
/// bounded by the number of live connections.
fn reap_finished<P: Protocol>(threads: &mut Vec<JoinHandle<()>>) {
    let mut index = 0;
    while index < threads.len() {
        if threads[index].is_finished() {
            if threads.swap_remove(index).join().is_err() {
                error!("{} connection thread panicked", P::NAME);
            }
        } else {
            index += 1;
        }
    }
}
