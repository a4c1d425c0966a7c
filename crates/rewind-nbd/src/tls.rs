//! TLS for NBD (`NBD_OPT_STARTTLS`), with rustls.
//!
//! # Why a pump thread
//!
//! The connection code reads requests on one thread and writes replies from
//! several (`crate::transmission`): it needs a byte stream it can clone. A
//! rustls session is one state machine that cannot be shared that way. So
//! after `STARTTLS` the connection thread does the TLS handshake itself
//! (bounded by the handshake deadline, so it learns the client's identity
//! before reading another option), then hands the session and the TCP
//! socket to a *pump* thread and goes on with one end of a
//! `UnixStream::pair()` as its transport, as if the client were local. The
//! pump moves bytes both ways in one `poll(2)` loop: records from the socket
//! are decrypted into the pair, plaintext from the pair is encrypted onto the
//! socket.
//!
//! Everything the plain path relies on carries over: end-of-file on the
//! socket (a client hanging up, or the server's shutdown of the socket's read
//! side) becomes end-of-file on the pair; the connection closing its end
//! makes the pump send `close_notify` and close the socket; a client that
//! stops reading fills the pair's buffer, and the connection's write timeout
//! fires as it would on TCP — the pump gives up on a socket that accepts
//! nothing for the same time. Memory is bounded: the pump reads the socket
//! only once what it decrypted has gone into the pair, and the pair only
//! once what it read has been taken by rustls (whose outgoing buffer is
//! capped at `TLS_OUTGOING_BYTES_MAX`).
//!
//! The cost is one more copy of each byte through a local socket, next to
//! the encryption itself (see BENCHMARKS.md for TLS against plain NBD).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustls::ServerConnection;
use tracing::debug;

use crate::connection::Transport;

/// Whether and how the server offers TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// `STARTTLS` is answered with `NBD_REP_ERR_POLICY` (the spec's NOTLS).
    Off,
    /// Offered; a client may go on without it.
    On,
    /// Every option but `STARTTLS` and `ABORT` is answered with
    /// `NBD_REP_ERR_TLS_REQD` until TLS is up; `NBD_OPT_EXPORT_NAME` before
    /// it ends the connection (the spec's FORCEDTLS).
    Require,
}

/// TLS for the NBD server: the mode and the rustls configuration (which
/// decides whether client certificates are asked for and checked).
#[derive(Clone)]
pub struct NbdTls {
    pub mode: TlsMode,
    pub config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdTls").field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// Plaintext moved per read from either side.
const PUMP_BUFFER_BYTES: usize = 256 * 1024;
/// Encrypted bytes rustls may hold for a socket that is not taking them.
const TLS_OUTGOING_BYTES_MAX: usize = 1024 * 1024;

/// A connection after a successful TLS handshake (its plaintext stream is
/// handed out beside it).
pub(crate) struct Session {
    /// The common name of the client's verified certificate (or its whole
    /// subject, if it has no common name); `None` without a certificate.
    pub(crate) identity: Option<String>,
    pump: JoinHandle<()>,
}

impl Session {
    /// Waits for the pump to finish; call once every handle on the plaintext
    /// stream is gone (the pump sends `close_notify` and ends when it sees
    /// them go).
    pub(crate) fn finish(self) {
        if self.pump.join().is_err() {
            tracing::error!("NBD TLS pump thread panicked");
        }
    }
}

/// Reads and writes `stream` with every call bounded by what is left until
/// `deadline`.
struct DeadlineIo<'a, S> {
    stream: &'a mut S,
    deadline: Instant,
}

impl<S: Transport> DeadlineIo<'_, S> {
    fn remaining(&self) -> io::Result<Duration> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake took too long"));
        }
        Ok(remaining)
    }
}

impl<S: Transport> Read for DeadlineIo<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let remaining = self.remaining()?;
        self.stream.set_read_timeout(Some(remaining))?;
        self.stream.read(buf)
    }
}

impl<S: Transport> Write for DeadlineIo<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let remaining = self.remaining()?;
        self.stream.set_write_timeout(Some(remaining))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Runs the server side of a TLS handshake on `stream` (after our
/// `NBD_REP_ACK` to `STARTTLS`), then starts the pump. `early` holds bytes
/// the client sent after its `STARTTLS` that were already read: the start of
/// its handshake. Returns the connection's transport from now on (plaintext)
/// and the session.
pub(crate) fn start<S: Transport>(
    mut stream: S,
    early: &[u8],
    config: Arc<rustls::ServerConfig>,
    deadline: Instant,
    write_timeout: Duration,
    name: String,
) -> io::Result<(UnixStream, Session)> {
    let mut session = ServerConnection::new(config).map_err(io::Error::other)?;
    session.set_buffer_limit(Some(TLS_OUTGOING_BYTES_MAX));
    let mut early = early;
    while !early.is_empty() {
        session.read_tls(&mut early)?;
        session.process_new_packets().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
    }
    {
        let mut io = DeadlineIo { stream: &mut stream, deadline };
        while session.is_handshaking() {
            if let Err(error) = session.complete_io(&mut io) {
                // Tell the client why (an alert), if it still listens.
                let _ = session.write_tls(&mut io);
                return Err(error);
            }
        }
    }
    let identity = session.peer_certificates().and_then(|chain| chain.first()).and_then(|leaf| identity(leaf));
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let (inner, outer) = UnixStream::pair()?;
    let pump = thread::Builder::new().name(name).spawn(move || {
        if let Err(error) = pump(stream, session, outer, write_timeout) {
            debug!(%error, "TLS connection ended");
        }
    })?;
    Ok((inner, Session { identity, pump }))
}

/// The common name of a certificate's subject, or the whole subject when it
/// has none.
fn identity(certificate: &rustls::pki_types::CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let (_, certificate) = x509_parser::certificate::X509Certificate::from_der(certificate.as_ref()).ok()?;
    let subject = certificate.subject();
    let common_name = subject.iter_common_name().next().and_then(|name| name.as_str().ok());
    Some(common_name.map_or_else(|| subject.to_string(), str::to_owned))
}

fn would_block(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// Moves bytes between the TLS session on `socket` and `pair` until both
/// directions are done (see the module's doc).
fn pump<S: Transport>(
    mut socket: S,
    mut session: ServerConnection,
    mut pair: UnixStream,
    write_timeout: Duration,
) -> io::Result<()> {
    socket.set_nonblocking(true)?;
    pair.set_nonblocking(true)?;
    let mut buffer = vec![0u8; PUMP_BUFFER_BYTES];
    // Decrypted, not yet written into the pair.
    let mut to_pair: Vec<u8> = Vec::new();
    let mut to_pair_sent = 0;
    // Read from the pair, not yet taken by rustls.
    let mut to_session: Vec<u8> = Vec::new();
    let mut to_session_sent = 0;
    // The socket gave end-of-file (the client hung up, or the server shut
    // down the socket's read side) or failed: nothing more to read from it.
    let mut socket_done = false;
    // ... and everything rustls decrypted before that has been taken.
    let mut client_done = false;
    let mut pair_write_shut = false;
    // The connection will send nothing more.
    let mut connection_done = false;
    loop {
        // Decrypted data waiting in rustls, then into the pair.
        if to_pair_sent == to_pair.len() && !client_done {
            to_pair.clear();
            to_pair_sent = 0;
            loop {
                match session.reader().read(&mut buffer) {
                    Ok(0) => {
                        client_done = true;
                        break;
                    }
                    Ok(count) => to_pair.extend_from_slice(&buffer[..count]),
                    Err(error) if would_block(&error) => {
                        client_done = socket_done;
                        break;
                    }
                    Err(_) => {
                        // Closed without close_notify: end-of-file all the same.
                        client_done = true;
                        break;
                    }
                }
                // No cap needed: rustls holds at most its received-plaintext
                // limit, as it stops reading the socket beyond that.
            }
        }
        while to_pair_sent < to_pair.len() {
            match pair.write(&to_pair[to_pair_sent..]) {
                Ok(count) => to_pair_sent += count,
                Err(error) if would_block(&error) => break,
                Err(_) => {
                    // The connection is gone; what the client sent goes nowhere.
                    to_pair_sent = to_pair.len();
                    connection_done = true;
                }
            }
        }
        if client_done && to_pair_sent == to_pair.len() && !pair_write_shut {
            pair_write_shut = true;
            let _ = pair.shutdown(Shutdown::Write);
        }
        // Plaintext from the connection into rustls, and records onto the
        // socket, until one of them is stuck: rustls takes plaintext only
        // while its outgoing buffer has room, which writing to the socket
        // makes.
        loop {
            let mut progress = false;
            while to_session_sent < to_session.len() {
                match session.writer().write(&to_session[to_session_sent..])? {
                    0 => break,
                    count => {
                        to_session_sent += count;
                        progress = true;
                    }
                }
            }
            while session.wants_write() {
                match session.write_tls(&mut socket) {
                    Ok(_) => progress = true,
                    Err(error) if would_block(&error) => break,
                    Err(error) => return Err(error),
                }
            }
            if !progress {
                break;
            }
        }
        if connection_done && to_session_sent == to_session.len() && !session.wants_write() {
            // Everything the connection said has left; so has close_notify.
            let _ = socket.shutdown(Shutdown::Write);
            return Ok(());
        }

        let mut socket_events = PollFlags::empty();
        if !socket_done && to_pair_sent == to_pair.len() {
            socket_events |= PollFlags::IN;
        }
        if session.wants_write() {
            socket_events |= PollFlags::OUT;
        }
        let mut pair_events = PollFlags::empty();
        if !connection_done && to_session_sent == to_session.len() {
            pair_events |= PollFlags::IN;
        }
        if to_pair_sent < to_pair.len() {
            pair_events |= PollFlags::OUT;
        }
        // Waiting on a client to take our bytes is bounded; waiting for
        // either side to say something is not (an idle client is legitimate).
        let stalled_on_client = session.wants_write();
        let timeout = Timespec { tv_sec: write_timeout.as_secs() as _, tv_nsec: write_timeout.subsec_nanos() as _ };
        // A side that hung up keeps reporting it: a side we want nothing
        // from is left out, or this loop would spin.
        let (watch_pair, watch_socket) = (!pair_events.is_empty(), !socket_events.is_empty());
        if !watch_pair && !watch_socket {
            // Cannot happen: with nothing to move, one side is still open for reading.
            return Err(io::Error::other("TLS pump has nothing to wait for"));
        }
        let mut fds = [PollFd::new(&pair, pair_events), PollFd::new(&socket, socket_events)];
        let watched = match (watch_pair, watch_socket) {
            (true, true) => &mut fds[..],
            (true, false) => &mut fds[..1],
            (false, _) => &mut fds[1..],
        };
        let ready = match poll(watched, stalled_on_client.then_some(&timeout)) {
            Ok(ready) => ready,
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
        };
        if ready == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the client read nothing for the write timeout"));
        }
        let pair_ready = if watch_pair { fds[0].revents() } else { PollFlags::empty() };
        let socket_ready = if watch_socket { fds[1].revents() } else { PollFlags::empty() };

        if socket_ready.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) && !socket_done {
            match session.read_tls(&mut socket) {
                Ok(0) => socket_done = true,
                Ok(_) => {
                    if let Err(error) = session.process_new_packets() {
                        // Send the alert that says why, then give up.
                        let _ = session.write_tls(&mut socket);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, error));
                    }
                }
                Err(error) if would_block(&error) => {}
                Err(_) => socket_done = true,
            }
        }
        if pair_ready.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) && !connection_done {
            match pair.read(&mut buffer) {
                Ok(0) => {
                    connection_done = true;
                    session.send_close_notify();
                }
                Ok(count) => {
                    to_session.clear();
                    to_session_sent = 0;
                    to_session.extend_from_slice(&buffer[..count]);
                }
                Err(error) if would_block(&error) => {}
                Err(_) => {
                    connection_done = true;
                    session.send_close_notify();
                }
            }
        }
    }
}
