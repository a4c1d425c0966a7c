//! The NBD server: listeners, connection threads, limits and shutdown. The
//! listeners, connection table, limits and shutdown are the front ends'
//! shared `rewind_serve::listen` (NFS uses them too); this module is NBD's
//! part: its configuration, its connections, and its way of refusing one.
//!
//! # Threads
//!
//! Each listener (`serve_tcp`, `serve_unix`) has an accept thread that waits
//! in `poll(2)` on the listening socket and on a wake-up socket; shutdown
//! closes the wake-up socket's other end, which ends the wait without
//! connecting to ourselves. Each accepted connection gets one thread that
//! runs the handshake and then reads the connection's requests, in order.
//! In transmission it runs small requests itself; with a large or slow one
//! it hands the reading on to another thread of that connection (up to
//! `ServerConfig::workers_per_connection_max` more, started on demand) and
//! runs the request itself; replies are written whole under a lock and may
//! leave in any order, as the spec allows. Why this split, how
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
//!   window, executed on the export (by the thread that read it) and
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
//! scratch for the reading role and each thread (a block status reply of
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

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rewind_serve::listen::{self, Listeners, Peer, Protocol, Running, ServeConfig};
use rewind_serve::log_limit::PeerLog;

use crate::connection::{self, Transport};
use crate::export::{Catalog, Client};
use crate::protocol as p;
use crate::refusal::Refusal;
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
    /// Most threads per connection beside its own, started on demand: a
    /// thread that reads a large or slow request hands the reading on to
    /// another and runs the request.
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
    /// the reading role and each of the connection's threads (a block
    /// status reply of `EXTENTS_PER_REPLY_MAX` extents, or an error message).
    pub fn memory_per_connection_max(&self) -> usize {
        const SCRATCH_BYTES_MAX: usize = p::CHUNK_HEADER_BYTES + 4 + p::EXTENTS_PER_REPLY_MAX * 8 + p::STRING_BYTES_MAX;
        BUFFER_BYTES_PER_CONNECTION_MAX
            + connection::READ_BUFFER_BYTES
            + crate::transmission::OUTBOX_BYTES_MAX
            + (1 + 1 + self.workers_per_connection_max) * SCRATCH_BYTES_MAX
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
impl ServerConfig {
    /// The limits the listeners enforce.
    fn serve_config(&self) -> ServeConfig {
        ServeConfig {
            connections_max: self.connections_max,
            connections_per_client_max: self.connections_per_client_max,
            refusals_max: self.refusals_max,
            log_lines_per_client: self.log_lines_per_client,
            log_interval: self.log_interval,
        }
    }
}

/// What every connection of one server shares: the NBD protocol as
/// `rewind_serve::listen::Listeners` serves it.
pub(crate) struct Shared {
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) config: ServerConfig,
    pub(crate) tls: Option<NbdTls>,
}

impl Shared {
    pub(crate) fn new(catalog: Arc<dyn Catalog>, config: ServerConfig) -> Shared {
        Shared { catalog, config, tls: None }
    }
}

impl Protocol for Shared {
    const NAME: &'static str = "nbd";

    fn serve<S: Transport>(self: &Arc<Self>, stream: S, peer: Peer, log: PeerLog, running: Running) {
        let client = Client { peer: peer.name, local: peer.local, identity: None };
        connection::serve(stream, Arc::clone(self), client, log, running);
    }

    /// The NBD way (`crate::refusal`): the greeting, then an error reply
    /// with the message to each option.
    fn refuse<S: Transport>(&self, stream: S, message: String) -> Option<Box<dyn listen::Refusal>> {
        Refusal::start(stream, message).map(|refusal| Box::new(refusal) as Box<dyn listen::Refusal>)
    }
}

/// An NBD server serving the exports of one catalog on any number of TCP and
/// Unix socket listeners. Dropping it shuts it down.
pub struct Server {
    listeners: Listeners<Shared>,
}

impl Server {
    pub fn new(catalog: Arc<dyn Catalog>, config: ServerConfig) -> Server {
        assert!(config.idle_timeout.is_none_or(|timeout| !timeout.is_zero()), "idle_timeout must be positive");
        assert!(
            config.idle_timeout_read_only.is_none_or(|timeout| !timeout.is_zero()),
            "idle_timeout_read_only must be positive"
        );
        assert!(!config.handshake_timeout.is_zero(), "handshake_timeout must be positive");
        assert!(!config.write_timeout.is_zero(), "write_timeout must be positive");
        assert!(config.workers_per_connection_max > 0, "workers_per_connection_max must be positive");
        assert!(config.requests_in_flight_max > 0, "requests_in_flight_max must be positive");
        Server { listeners: Listeners::new(Arc::new(Shared::new(catalog, config)), config.serve_config()) }
    }

    /// Offers TLS (`NBD_OPT_STARTTLS`) on every listener; call before the
    /// first `serve_*`.
    pub fn with_tls(mut self, tls: NbdTls) -> Server {
        self.listeners.protocol_mut().expect("with_tls comes before serving").tls = Some(tls);
        self
    }

    /// Listens on a TCP address (Rewind's default is `127.0.0.1:10809`) and
    /// returns the bound address, useful with port 0.
    pub fn serve_tcp(&self, address: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        self.listeners.serve_tcp(address)
    }

    /// Listens on a Unix domain socket at `path`, which must not exist yet.
    /// The socket file is removed again on shutdown.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.listeners.serve_unix(path)
    }

    /// Connections currently being served (in handshake or transmission).
    pub fn connection_count(&self) -> usize {
        self.listeners.connection_count()
    }

    /// Stops accepting, ends every connection once its in-flight requests are
    /// answered, and waits for all threads. Idempotent.
    pub fn shutdown(&self) {
        self.listeners.shutdown()
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
