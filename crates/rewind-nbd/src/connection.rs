//! One client connection: the handshake on the connection thread, then
//! transmission (`crate::transmission`). The state machine and its limits are
//! described in `crate::server`; after `NBD_OPT_STARTTLS` the same code goes
//! on over the TLS session's plaintext (`crate::tls`).

use std::fmt::Write as _;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::export::{Client, Export, OpenError, OpenErrorKind};
use crate::protocol::{self as p, Session};
use crate::server::{Shared, OPTIONS_PER_HANDSHAKE_MAX};
use crate::tls::{self, TlsMode};
use crate::transmission::{self, MetaContexts, Negotiated, Stats};
use rewind_serve::listen::Running;
use rewind_serve::log_limit::PeerLog;
pub(crate) use rewind_serve::transport::Transport;

/// Read buffer per connection. Large enough that pipelined small requests
/// (fio/qemu keep dozens in flight) are picked up with one `read` call; large
/// WRITE payloads bypass it and land directly in the payload buffer.
pub(crate) const READ_BUFFER_BYTES: usize = 128 * 1024;

/// `NBD_OPT_LIST` replies are sent in pieces of about this size.
const LIST_REPLY_BATCH_BYTES: usize = 64 * 1024;

/// The read side. During the handshake every read is bounded by what is
/// left of the handshake deadline, so a client trickling one byte at a time
/// cannot stretch it; in transmission each read waits up to the export's
/// idle timeout, if it has one (see "Limits" in `crate::server`).
pub(crate) struct DeadlineReader<S> {
    stream: S,
    deadline: Option<Instant>,
}

impl<S: Transport> DeadlineReader<S> {
    /// The idle timeout a read in transmission just hit.
    pub(crate) fn idle_timeout(&self) -> io::Result<Duration> {
        Ok(self.stream.read_timeout()?.unwrap_or_default())
    }
}

impl<S: Transport> Read for DeadlineReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.deadline {
            Some(deadline) => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                self.stream.set_read_timeout(Some(remaining))?;
            }
            None => {
                if let Some(read) = rewind_serve::transport::poll_briefly(&self.stream, buf) {
                    return Ok(read);
                }
            }
        }
        self.stream.read(buf)
    }
}

/// Why a connection ended.
pub(crate) enum Hangup {
    /// The client closed the socket between messages.
    ClientClosed,
    /// The client ended the session the proper way.
    ClientDone(&'static str),
    /// The server stopped reading requests: it is shutting down, or the
    /// export was cut off (a deleted volume).
    ServerStopped,
    /// The client broke the protocol; we hung up (warn).
    Violation(String),
    /// The client sent nothing for this long with no request in flight.
    Idle(Duration),
    /// `NBD_OPT_EXPORT_NAME` named an export we cannot open, and that option
    /// has no way to report errors (spec: the server MUST hang up).
    ExportRefused {
        name: String,
        message: String,
    },
    /// `NBD_OPT_EXPORT_NAME` before TLS while TLS is required: it cannot be
    /// answered with an error (spec: the server MUST hang up).
    TlsRequired,
    /// The TLS handshake failed (a certificate that does not verify, none
    /// where one is required, a client that is not speaking TLS).
    Tls(io::Error),
    Io(io::Error),
}

impl From<io::Error> for Hangup {
    fn from(error: io::Error) -> Self {
        Hangup::Io(error)
    }
}

pub(crate) type Result<T> = std::result::Result<T, Hangup>;

/// Where option haggling ended.
enum Step {
    Negotiated(Negotiated),
    /// We acknowledged `NBD_OPT_STARTTLS`: TLS begins now.
    StartTls,
}

/// What the last `NBD_OPT_SET_META_CONTEXT` selected, for one export name.
struct MetaSelection {
    export: String,
    base_allocation: bool,
    /// The leaves of the `qemu:dirty-bitmap:` contexts selected, in the
    /// order of their ids (at most `DIRTY_BITMAPS_MAX`).
    dirty_bitmaps: Vec<String>,
}

/// An opened export plus what we advertise for it.
struct Opened {
    export: Arc<dyn Export>,
    flags: u16,
    size_bytes: u64,
    block_min: u32,
    block_preferred: u32,
    block_max: u32,
}

/// Writes option replies during the handshake, each whole in one `write`.
struct ReplyWriter<S> {
    stream: S,
    /// Replies assembled in memory, sent by `flush`; reused.
    assembled: Vec<u8>,
    /// Scratch for error messages.
    message: String,
}

impl<S: Transport> ReplyWriter<S> {
    fn flush(&mut self) -> io::Result<()> {
        let result = self.stream.write_all(&self.assembled);
        self.assembled.clear();
        result
    }
}

pub(crate) fn write_all_vectored<W: Write>(writer: &mut W, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match writer.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut bufs, written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

struct Connection<S> {
    shared: Arc<Shared>,
    /// Whether the server is shutting down (no new exports then).
    running: Running,
    reader: BufReader<DeadlineReader<S>>,
    replies: ReplyWriter<S>,
    /// Who is connected: the catalog decides access by it.
    client: Client,
    /// Lines about this client go through its log budget.
    log: PeerLog,
    /// Option payloads during the handshake (at most `OPTION_BYTES_MAX`).
    option_data: Vec<u8>,
    // Handshake state.
    /// The end of the handshake, TLS handshake included.
    deadline: Instant,
    /// Options this handshake may still send (`OPTIONS_PER_HANDSHAKE_MAX`
    /// for the whole handshake, before and after STARTTLS).
    options_left: u32,
    /// This connection runs over TLS.
    tls_active: bool,
    no_zeroes: bool,
    structured: bool,
    /// What the last SET_META_CONTEXT selected, if anything.
    meta: Option<MetaSelection>,
}

/// Serves one accepted connection until it ends, logging how it ended.
pub(crate) fn serve<S: Transport>(stream: S, shared: Arc<Shared>, client: Client, log: PeerLog, running: Running) {
    let deadline = Instant::now() + shared.config.handshake_timeout;
    let connection = match Connection::new(stream, (shared, running), client, log.clone(), deadline, false) {
        Ok(connection) => connection,
        Err(error) => {
            if log.allow() {
                warn!(%error, "cannot set up connection");
            }
            return;
        }
    };
    let mut export_name = String::new();
    let mut stats = Stats::default();
    let hangup = connection.run(&mut stats, &mut export_name);
    // Most ends are logged at INFO: with INFO filtered out they neither
    // spend the client's budget nor are reported as suppressed.
    let at_warn = match &hangup {
        Hangup::Violation(_) | Hangup::ExportRefused { .. } => true,
        Hangup::Io(error) => matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock),
        Hangup::ClientClosed
        | Hangup::ClientDone(_)
        | Hangup::ServerStopped
        | Hangup::Idle(_)
        | Hangup::TlsRequired
        | Hangup::Tls(_) => false,
    };
    if !(if at_warn { log.allow() } else { log.allow_info() }) {
        return;
    }
    let Stats { requests, bytes_read, bytes_written } = stats;
    let export = export_name.as_str();
    match hangup {
        Hangup::ClientClosed => {
            info!(export, requests, bytes_read, bytes_written, "connection closed by client")
        }
        Hangup::ClientDone(how) => {
            info!(export, requests, bytes_read, bytes_written, "connection ended by client ({how})")
        }
        Hangup::Violation(what) => {
            warn!(export, requests, "protocol violation, hanging up: {what}")
        }
        Hangup::ServerStopped => {
            info!(
                export,
                requests,
                bytes_read,
                bytes_written,
                "connection closed by the server (shutting down, or the export is gone)"
            )
        }
        Hangup::Idle(timeout) => {
            info!(
                export,
                requests,
                bytes_read,
                bytes_written,
                "connection closed: idle for {} s with nothing in flight (the idle timeout)",
                timeout.as_secs()
            )
        }
        Hangup::ExportRefused { name, message } => {
            warn!(export = %name, "NBD_OPT_EXPORT_NAME refused, hanging up: {message}")
        }
        Hangup::TlsRequired => {
            info!("NBD_OPT_EXPORT_NAME without TLS while TLS is required, hanging up")
        }
        Hangup::Tls(error) => info!("TLS handshake failed: {error}"),
        Hangup::Io(error) if matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
            warn!(export, requests, "connection timed out: {error}")
        }
        Hangup::Io(error) => {
            info!(export, requests, bytes_read, bytes_written, "connection lost: {error}")
        }
    }
}

impl<S: Transport> Connection<S> {
    fn new(
        stream: S,
        (shared, running): (Arc<Shared>, Running),
        client: Client,
        log: PeerLog,
        deadline: Instant,
        tls_active: bool,
    ) -> io::Result<Self> {
        // The listener is non-blocking; on some systems accepted sockets
        // inherit that, and this thread wants blocking I/O with timeouts.
        stream.set_nonblocking(false)?;
        stream.configure()?;
        stream.set_write_timeout(Some(shared.config.write_timeout))?;
        let read_half = stream.try_clone()?;
        Ok(Connection {
            shared,
            running,
            reader: BufReader::with_capacity(
                READ_BUFFER_BYTES,
                DeadlineReader { stream: read_half, deadline: Some(deadline) },
            ),
            replies: ReplyWriter { stream, assembled: Vec::new(), message: String::new() },
            client,
            log,
            option_data: Vec::new(),
            deadline,
            options_left: OPTIONS_PER_HANDSHAKE_MAX,
            tls_active,
            no_zeroes: false,
            structured: false,
            meta: None,
        })
    }

    /// The handshake (from the greeting, or from just after STARTTLS), then
    /// transmission; returns why the connection ended.
    fn run(mut self, stats: &mut Stats, export_name: &mut String) -> Hangup {
        let step = if self.tls_active { self.haggle() } else { self.greet().and_then(|()| self.haggle()) };
        match step {
            Err(hangup) => hangup,
            Ok(Step::StartTls) => self.start_tls(stats, export_name),
            Ok(Step::Negotiated(negotiated)) => {
                if self.log.allow_info() {
                    info!(
                        export = %negotiated.name,
                        size_bytes = negotiated.session.size_bytes,
                        flags = format_args!("{:#06x}", negotiated.session.flags),
                        structured_replies = negotiated.session.structured_replies,
                        tls = self.tls_active,
                        "transmission started"
                    );
                }
                export_name.clone_from(&negotiated.name);
                let config = &self.shared.config;
                let idle_timeout =
                    if negotiated.export.is_read_only() { config.idle_timeout_read_only } else { config.idle_timeout };
                if let Err(error) = self.enter_transmission(idle_timeout) {
                    return Hangup::Io(error);
                }
                // Shutting down the read side is how the server ends a
                // connection gracefully (see `Server::shutdown`); the flag
                // says so to a reader the client keeps busy.
                let cut_off = Arc::new(AtomicBool::new(false));
                match self.replies.stream.try_clone() {
                    Ok(control) => {
                        let cut_off = Arc::clone(&cut_off);
                        negotiated.export.when_cut_off(Box::new(move || {
                            cut_off.store(true, Ordering::Release);
                            let _ = control.shutdown(Shutdown::Read);
                        }))
                    }
                    Err(error) => return Hangup::Io(error),
                }
                let Connection { shared, running, mut reader, replies, log, .. } = self;
                let stopped = || running.is_stopping() || cut_off.load(Ordering::Acquire);
                transmission::serve(&mut reader, replies.stream, &negotiated, &shared.config, &log, &stopped, stats)
            }
        }
    }

    /// After our ACK to STARTTLS: the TLS handshake, then the rest of the
    /// connection over it. Nothing negotiated before carries over but the
    /// client's flags (a man in the middle could have chosen it).
    fn start_tls(self, stats: &mut Stats, export_name: &mut String) -> Hangup {
        let Connection { shared, running, reader, replies, client, log, deadline, options_left, no_zeroes, .. } = self;
        // Whatever the client sent after STARTTLS and we already read is the
        // start of its TLS handshake.
        let early = reader.buffer().to_vec();
        drop(reader);
        let config = Arc::clone(&shared.tls.as_ref().expect("STARTTLS is acknowledged only with TLS on").config);
        let name = std::thread::current().name().unwrap_or("nbd-conn").replacen("conn", "tls", 1);
        let (stream, session) =
            match tls::start(replies.stream, &early, config, deadline, shared.config.write_timeout, name) {
                Ok(started) => started,
                Err(error) => return Hangup::Tls(error),
            };
        let client = Client { identity: session.identity.clone(), ..client };
        if log.allow_info() {
            info!(identity = client.identity.as_deref().unwrap_or("none"), "TLS established");
        }
        let hangup = match Connection::new(stream, (shared, running), client, log, deadline, true) {
            Ok(mut connection) => {
                connection.no_zeroes = no_zeroes;
                connection.options_left = options_left;
                connection.run(stats, export_name)
            }
            Err(error) => Hangup::Io(error),
        };
        // Every handle on the plaintext stream is gone now: the pump sends
        // close_notify and ends.
        session.finish();
        hangup
    }

    // --- Handshake -------------------------------------------------------------------

    fn greet(&mut self) -> Result<()> {
        self.replies.stream.write_all(&p::encode_greeting())?;
        let mut flags = [0u8; 4];
        read_message_start(&mut self.reader, &mut flags)?;
        let client = p::decode_client_flags(flags)
            .map_err(|raw| Hangup::Violation(format!("client flags {raw:#x} include bits the server did not offer")))?;
        if !client.fixed_newstyle {
            // Allowed by the spec; the options work the same for us.
            debug!("client did not set NBD_FLAG_C_FIXED_NEWSTYLE");
        }
        self.no_zeroes = client.no_zeroes;
        Ok(())
    }

    fn haggle(&mut self) -> Result<Step> {
        while self.options_left > 0 {
            self.options_left -= 1;
            if let Some(step) = self.option()? {
                return Ok(step);
            }
        }
        Err(Hangup::Violation(format!("more than {OPTIONS_PER_HANDSHAKE_MAX} options without entering transmission")))
    }

    fn tls_mode(&self) -> TlsMode {
        self.shared.tls.as_ref().map_or(TlsMode::Off, |tls| tls.mode)
    }

    /// Reads and answers one option; returns where the handshake goes next
    /// once the client enters transmission or starts TLS.
    fn option(&mut self) -> Result<Option<Step>> {
        let mut header = [0u8; p::OPTION_HEADER_BYTES];
        read_message_start(&mut self.reader, &mut header)?;
        let header = p::decode_option_header(&header)
            .map_err(|magic| Hangup::Violation(format!("option magic {magic:#018x} is not IHAVEOPT")))?;
        let option = header.option;
        let name = p::option_name(option);
        if header.length > p::OPTION_BYTES_MAX {
            return Err(Hangup::Violation(format!(
                "{name} ({option}) with {} bytes of data exceeds the {} byte option limit",
                header.length,
                p::OPTION_BYTES_MAX
            )));
        }
        // Bounded by OPTION_BYTES_MAX just above.
        let mut data = std::mem::take(&mut self.option_data);
        data.resize(header.length as usize, 0);
        let read = read_rest(&mut self.reader, &mut data);
        self.option_data = data;
        read?;
        debug!(option = name, length = header.length, "option");

        if self.running.is_stopping() && option != p::OPT_ABORT {
            self.option_error(option, p::REP_ERR_SHUTDOWN, "server is shutting down")?;
            return Ok(None);
        }
        let tls_required = !self.tls_active && self.tls_mode() == TlsMode::Require;
        match option {
            p::OPT_STARTTLS => self.starttls(),
            p::OPT_EXPORT_NAME if tls_required => Err(Hangup::TlsRequired),
            p::OPT_ABORT => {
                p::push_option_reply(&mut self.replies.assembled, option, p::REP_ACK, &[]);
                // The client may already be gone: the spec lets it hang up
                // without waiting for the reply.
                let _ = self.replies.flush();
                Err(Hangup::ClientDone("NBD_OPT_ABORT"))
            }
            _ if tls_required => {
                debug!(option = name, "refused before TLS");
                self.option_error(
                    option,
                    p::REP_ERR_TLS_REQD,
                    "this server requires TLS: connect with nbds:// (libnbd) or tls-creds (qemu)",
                )?;
                Ok(None)
            }
            p::OPT_EXPORT_NAME => self.export_name().map(|negotiated| Some(Step::Negotiated(negotiated))),
            p::OPT_LIST => {
                if !self.option_data.is_empty() {
                    self.option_invalid(option, p::OptionError::UnexpectedData)?;
                    return Ok(None);
                }
                for listing in self.shared.catalog.list(&self.client) {
                    let assembled = &mut self.replies.assembled;
                    p::push_rep_server(assembled, &listing.name, &listing.description);
                    // Bounded memory however many exports there are.
                    if assembled.len() >= LIST_REPLY_BATCH_BYTES {
                        self.replies.flush()?;
                    }
                }
                p::push_option_reply(&mut self.replies.assembled, option, p::REP_ACK, &[]);
                self.replies.flush()?;
                Ok(None)
            }
            p::OPT_INFO | p::OPT_GO => self.info_or_go(option),
            p::OPT_STRUCTURED_REPLY => {
                if !self.option_data.is_empty() {
                    self.option_invalid(option, p::OptionError::UnexpectedData)?;
                    return Ok(None);
                }
                self.structured = true;
                p::push_option_reply(&mut self.replies.assembled, option, p::REP_ACK, &[]);
                self.replies.flush()?;
                Ok(None)
            }
            p::OPT_LIST_META_CONTEXT | p::OPT_SET_META_CONTEXT => {
                self.meta_context(option)?;
                Ok(None)
            }
            _ => {
                debug!(option, "unsupported option");
                self.option_error(option, p::REP_ERR_UNSUP, "option not supported by this server")?;
                Ok(None)
            }
        }
    }

    fn starttls(&mut self) -> Result<Option<Step>> {
        let option = p::OPT_STARTTLS;
        if !self.option_data.is_empty() {
            self.option_invalid(option, p::OptionError::UnexpectedData)?;
            return Ok(None);
        }
        if self.tls_mode() == TlsMode::Off {
            // NOTLS mode: we know the option and decline it.
            self.option_error(option, p::REP_ERR_POLICY, "TLS is not enabled on this server (rewind serve --tls)")?;
            return Ok(None);
        }
        if self.tls_active {
            self.option_error(option, p::REP_ERR_INVALID, "TLS is already active")?;
            return Ok(None);
        }
        p::push_option_reply(&mut self.replies.assembled, option, p::REP_ACK, &[]);
        self.replies.flush()?;
        Ok(Some(Step::StartTls))
    }

    fn option_error(&mut self, option: u32, reply_type: u32, message: &str) -> Result<()> {
        p::push_option_error(&mut self.replies.assembled, option, reply_type, message);
        Ok(self.replies.flush()?)
    }

    fn option_invalid(&mut self, option: u32, error: p::OptionError) -> Result<()> {
        if self.log.allow() {
            warn!(option = p::option_name(option), "invalid option from client: {error}");
        }
        self.replies.message.clear();
        write!(self.replies.message, "{error}").expect("writing to a String cannot fail");
        p::push_option_error(&mut self.replies.assembled, option, p::REP_ERR_INVALID, &self.replies.message);
        Ok(self.replies.flush()?)
    }

    fn export_name(&mut self) -> Result<Negotiated> {
        let name = p::decode_export_name(&self.option_data)
            .map_err(|error| Hangup::Violation(format!("NBD_OPT_EXPORT_NAME: {error}")))?
            .to_owned();
        let refused = |message| Hangup::ExportRefused { name: name.clone(), message };
        let opened = self.open(&name).map_err(|(_, message)| refused(message))?;
        let contexts = self.contexts_for(&name, &opened.export).map_err(refused)?;
        let mut reply = [0u8; p::EXPORT_NAME_REPLY_BYTES];
        let length = p::encode_export_name_reply(opened.size_bytes, opened.flags, self.no_zeroes, &mut reply);
        self.replies.stream.write_all(&reply[..length])?;
        Ok(self.negotiated(name, opened, contexts))
    }

    fn info_or_go(&mut self, option: u32) -> Result<Option<Step>> {
        let request = match p::decode_info_request(&self.option_data) {
            Ok(request) => request,
            Err(error) => {
                self.option_invalid(option, error)?;
                return Ok(None);
            }
        };
        let name = request.name.to_owned();
        let wants_name = request.requests(p::INFO_NAME);
        let wants_description = request.requests(p::INFO_DESCRIPTION);
        let wants_block_size = request.requests(p::INFO_BLOCK_SIZE);

        let opened = self.open(&name).and_then(|opened| {
            // INFO answers without them; GO refuses if they went meanwhile.
            let contexts = match option {
                p::OPT_GO => {
                    self.contexts_for(&name, &opened.export).map_err(|message| (p::REP_ERR_UNKNOWN, message))?
                }
                _ => MetaContexts::default(),
            };
            Ok((opened, contexts))
        });
        let (opened, contexts) = match opened {
            Ok(opened) => opened,
            Err((reply_type, message)) => {
                if self.log.allow_info() {
                    info!(export = %name, option = p::option_name(option), "export refused: {message}");
                }
                self.option_error(option, reply_type, &message)?;
                return Ok(None);
            }
        };
        let out = &mut self.replies.assembled;
        // NBD_INFO_EXPORT goes out whether asked for or not: the spec makes it
        // mandatory before NBD_REP_ACK, and qemu never asks.
        p::push_info_export(out, option, opened.size_bytes, opened.flags);
        if wants_name {
            p::push_info_string(out, option, p::INFO_NAME, &name);
        }
        if wants_description {
            let description = opened.export.description();
            if !description.is_empty() {
                p::push_info_string(out, option, p::INFO_DESCRIPTION, &description);
            }
        }
        if wants_block_size {
            p::push_info_block_size(out, option, opened.block_min, opened.block_preferred, opened.block_max);
        }
        p::push_option_reply(out, option, p::REP_ACK, &[]);
        self.replies.flush()?;
        if option == p::OPT_GO {
            Ok(Some(Step::Negotiated(self.negotiated(name, opened, contexts))))
        } else {
            Ok(None)
        }
    }

    fn meta_context(&mut self, option: u32) -> Result<()> {
        let set = option == p::OPT_SET_META_CONTEXT;
        if set {
            // The spec: a SET replaces the selection even when it fails.
            self.meta = None;
        }
        if !self.structured {
            return self.option_invalid(option, p::OptionError::NeedsStructuredReplies);
        }
        let request = match p::decode_meta_context_request(&self.option_data) {
            Ok(request) => request,
            Err(error) => return self.option_invalid(option, error),
        };
        // Listing with no query means "everything"; `base:` and `qemu:` are
        // wildcards when listing, and nothing when setting.
        let everything = !set && request.queries.is_empty();
        let wildcard = |query: &p::MetaQuery<'_>| !set && matches!(query, p::MetaQuery::DirtyBitmapWildcard);
        let base_allocation = everything
            || request.queries.iter().any(|query| match query {
                p::MetaQuery::BaseAllocation => true,
                p::MetaQuery::BaseWildcard => !set,
                _ => false,
            });
        // Dirty bitmaps are the export's: it is opened (as the client,
        // refused quietly) to know which it has.
        let wants_bitmaps = everything
            || request.queries.iter().any(|query| wildcard(query) || matches!(query, p::MetaQuery::DirtyBitmap(_)));
        let export = match wants_bitmaps {
            true => self.shared.catalog.open(request.export_name, &self.client).ok(),
            false => None,
        };
        let mut bitmaps: Vec<String> = Vec::new();
        if let Some(export) = &export {
            if everything || request.queries.iter().any(wildcard) {
                bitmaps = export.dirty_bitmaps();
            }
            // Looking a bitmap up resolves a time and holds a view: at most
            // `DIRTY_BITMAPS_MAX` lookups per option, however many queries.
            let named = request.queries.iter().filter_map(|query| match *query {
                p::MetaQuery::DirtyBitmap(leaf) => Some(leaf),
                _ => None,
            });
            let mut looked_up: Vec<&str> = Vec::new();
            for leaf in named {
                if looked_up.contains(&leaf) || bitmaps.iter().any(|listed| listed == leaf) {
                    continue;
                }
                if looked_up.len() == p::DIRTY_BITMAPS_MAX {
                    break;
                }
                looked_up.push(leaf);
                if export.dirty_bitmap(leaf).is_some() {
                    bitmaps.push(leaf.to_owned());
                }
            }
            if set {
                bitmaps.truncate(p::DIRTY_BITMAPS_MAX);
            }
        }
        // Context ids in LIST replies are reserved and should be zero.
        let id = |id: u32| if set { id } else { 0 };
        if base_allocation {
            p::push_meta_context(
                &mut self.replies.assembled,
                option,
                id(p::META_BASE_ALLOCATION_ID),
                p::META_BASE_ALLOCATION,
            );
        }
        for (bitmap_id, leaf) in (p::META_DIRTY_BITMAP_FIRST_ID..).zip(&bitmaps) {
            let name = format!("{}{leaf}", p::META_DIRTY_BITMAP_PREFIX);
            p::push_meta_context(&mut self.replies.assembled, option, id(bitmap_id), &name);
            if self.replies.assembled.len() >= LIST_REPLY_BATCH_BYTES {
                self.replies.flush()?;
            }
        }
        if set && (base_allocation || !bitmaps.is_empty()) {
            let export = request.export_name.to_owned();
            self.meta = Some(MetaSelection { export, base_allocation, dirty_bitmaps: bitmaps });
        }
        p::push_option_reply(&mut self.replies.assembled, option, p::REP_ACK, &[]);
        Ok(self.replies.flush()?)
    }

    /// The contexts the client selected for `name`, now opened as `export`.
    /// A dirty bitmap that went since it was selected (its bookmark was
    /// deleted) fails the negotiation rather than go unanswered.
    fn contexts_for(&self, name: &str, export: &Arc<dyn Export>) -> std::result::Result<MetaContexts, String> {
        let Some(selection) = self.meta.as_ref().filter(|selection| selection.export == name) else {
            return Ok(MetaContexts::default());
        };
        let mut dirty_bitmaps = Vec::with_capacity(selection.dirty_bitmaps.len());
        for leaf in &selection.dirty_bitmaps {
            let bitmap = export.dirty_bitmap(leaf).ok_or_else(|| {
                format!(
                    "the metadata context {}{leaf} of export '{name}' went since it was selected; select the \
                     contexts again",
                    p::META_DIRTY_BITMAP_PREFIX
                )
            })?;
            dirty_bitmaps.push(bitmap);
        }
        Ok(MetaContexts { base_allocation: selection.base_allocation, dirty_bitmaps })
    }

    /// Opens `name` and works out what to advertise; on failure returns the
    /// option reply type and the message for the client.
    fn open(&self, name: &str) -> std::result::Result<Opened, (u32, String)> {
        let export = self.shared.catalog.open(name, &self.client).map_err(|OpenError { kind, message }| {
            let reply_type = match kind {
                OpenErrorKind::NotFound | OpenErrorKind::BadName => p::REP_ERR_UNKNOWN,
                OpenErrorKind::Unavailable if self.running.is_stopping() => p::REP_ERR_SHUTDOWN,
                OpenErrorKind::Unavailable => p::REP_ERR_UNKNOWN,
            };
            (reply_type, message)
        })?;
        let sizes = export.block_sizes();
        if let Err(problem) = sizes.check() {
            if self.log.allow() {
                tracing::error!(export = %name, ?sizes, "export has invalid block sizes: {problem}");
            }
            return Err((p::REP_ERR_UNKNOWN, format!("export '{name}' cannot be served: {problem}")));
        }
        // The export may allow more than the server buffers; advertise the
        // smaller. Both are multiples of the minimum (a power of two <= 64 KiB
        // dividing PAYLOAD_BYTES_MAX), and the preferred size stays a power of
        // two because it is only cut when the maximum is PAYLOAD_BYTES_MAX.
        let block_max = sizes.maximum.min(p::PAYLOAD_BYTES_MAX);
        let block_preferred = sizes.preferred.min(block_max);
        let features = p::ExportFeatures {
            read_only: export.is_read_only(),
            multi_conn: export.can_multi_conn(),
            fast_zero: export.can_fast_zero(),
        };
        Ok(Opened {
            flags: p::transmission_flags(features, self.structured),
            size_bytes: export.size_bytes(),
            block_min: sizes.minimum,
            block_preferred,
            block_max,
            export,
        })
    }

    fn negotiated(&self, name: String, opened: Opened, contexts: MetaContexts) -> Negotiated {
        Negotiated {
            session: Session {
                size_bytes: opened.size_bytes,
                flags: opened.flags,
                block_min: opened.block_min,
                block_max: opened.block_max,
                structured_replies: self.structured,
                meta_contexts: contexts.count() > 0,
            },
            export: opened.export,
            name,
            contexts,
        }
    }

    // --- Transmission ------------------------------------------------------------------

    /// Ends the handshake deadline; from here on each read waits up to
    /// `idle_timeout` (the transmission reader decides what a timeout means).
    fn enter_transmission(&mut self, idle_timeout: Option<Duration>) -> io::Result<()> {
        let reader = self.reader.get_mut();
        reader.deadline = None;
        reader.stream.set_read_timeout(idle_timeout)?;
        // The handshake buffer is not needed any more.
        self.option_data = Vec::new();
        Ok(())
    }
}

// --- Reading --------------------------------------------------------------------------

/// Reads a message that may legitimately not come (the client may hang up
/// between messages): EOF before its first byte is a clean close, EOF within
/// it is a violation.
pub(crate) fn read_message_start(reader: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    let first = loop {
        match reader.read(buf) {
            Ok(0) => return Err(Hangup::ClientClosed),
            Ok(n) => break n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    };
    read_rest(reader, &mut buf[first..])
}

pub(crate) fn read_rest(reader: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    reader.read_exact(buf).map_err(|error| {
        if error.kind() == io::ErrorKind::UnexpectedEof {
            Hangup::Violation("client closed the connection within a message".into())
        } else {
            Hangup::Io(error)
        }
    })
}
