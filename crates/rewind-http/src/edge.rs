//! The API's edge: accepting connections, TLS, and the limits that keep a
//! crowd of slow or idle clients from costing the node its file descriptors.
//!
//! # Why not `axum::serve`
//!
//! It accepts every connection and keeps it for as long as the client likes:
//! ~1,100 idle connections once used up the process's descriptors, and then
//! volumes failed on `Too many open files` and the NBD listener stopped
//! accepting. Here every connection holds a *slot*; there are
//! [`HttpConfig::connections_max`] of them, so the API never holds more
//! descriptors than that.
//!
//! # When the slots are full
//!
//! A new connection takes the slot of the connection that has been idle the
//! longest — one with no request in progress: a keep-alive connection
//! between requests, a client still sending its header, a TLS handshake —
//! which is closed. Only when every slot has a request in progress is the
//! newcomer refused (`503` in plain HTTP, closed under TLS), at once. So
//! idle and half-sent connections cannot lock a real client out: they are
//! the first to go. (Attackers who *complete* requests are rate-limited by
//! the work those requests cost them; that is not this module's business.)
//!
//! # Timeouts
//!
//! - [`HttpConfig::header_timeout`]: from the moment the server waits for a
//!   request — a new connection, or the end of the previous response on a
//!   keep-alive one — until its whole header has arrived (hyper's header
//!   timer starts when it starts waiting, so this is also the keep-alive idle
//!   limit). A TLS handshake must finish within it too.
//! - [`HttpConfig::body_stall_timeout`]: a request body (an import streams
//!   gigabytes) may take as long as it needs, but may not stall: this is the
//!   longest wait for its next bytes while a handler is waiting for them.
//! - [`HttpConfig::write_stall_timeout`]: the longest a response write may
//!   wait for a client that does not read.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tower::ServiceExt;
use tracing::{debug, info, warn};

/// How the API server treats connections. `Default` gives what Rewind ships.
#[derive(Clone)]
pub struct HttpConfig {
    /// Most connections held at once (one descriptor each).
    pub connections_max: usize,
    /// Longest wait for a request's header, counted from when the server
    /// starts waiting (so also how long a keep-alive connection may idle).
    pub header_timeout: Duration,
    /// Longest a request body may stall while its handler waits for it.
    pub body_stall_timeout: Duration,
    /// Longest a response write may wait for a client that does not read.
    pub write_stall_timeout: Duration,
    /// Serve HTTPS with this configuration; `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connections_max: 256,
            header_timeout: Duration::from_secs(10),
            body_stall_timeout: Duration::from_secs(30),
            write_stall_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("connections_max", &self.connections_max)
            .field("header_timeout", &self.header_timeout)
            .field("body_stall_timeout", &self.body_stall_timeout)
            .field("write_stall_timeout", &self.write_stall_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// How long accepting pauses after an error such as running out of
/// descriptors, so a persistent error does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// What the loop tells a client when every slot has a request in progress.
const BUSY_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Content-Length: 96\r\nRetry-After: 1\r\nConnection: close\r\n\r\n\
{\"error\":\"the server is at its connection limit with requests in progress\",\"kind\":\"unavailable\"}";

/// Whether a connection has a request in progress, and since when it has not.
struct Activity {
    in_flight: AtomicU64,
    /// Nanoseconds since `epoch` when the last request ended (or the
    /// connection was accepted).
    idle_since_nanos: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        let activity = Activity { in_flight: AtomicU64::new(0), idle_since_nanos: AtomicU64::new(0), epoch };
        activity.touch();
        activity
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.idle_since_nanos.store(nanos, Ordering::Release);
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }
}

/// A request in progress: from the service call until its response body is
/// sent (or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Slot {
    activity: Arc<Activity>,
    evict: oneshot::Sender<()>,
}

#[derive(Default)]
struct Slots {
    live: HashMap<u64, Slot>,
    next_id: u64,
    /// Set while full, so the log says so once per episode, not per refusal.
    full_logged: bool,
}

enum Admission {
    Admitted { id: u64, activity: Arc<Activity>, evicted: oneshot::Receiver<()> },
    Busy,
}

impl Slots {
    fn admit(&mut self, connections_max: usize, epoch: Instant) -> Admission {
        if self.live.len() >= connections_max {
            let victim = self
                .live
                .iter()
                .filter(|(_, slot)| slot.activity.in_flight.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, slot)| slot.activity.idle_since_nanos.load(Ordering::Acquire))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => {
                    let slot = self.live.remove(&id).expect("found just now");
                    // The connection may be finishing anyway; then nobody listens.
                    let _ = slot.evict.send(());
                    if !self.full_logged {
                        self.full_logged = true;
                        warn!(connections_max, "API connection limit reached: closing the longest idle connections");
                    }
                }
                None => {
                    if !self.full_logged {
                        self.full_logged = true;
                        warn!(connections_max, "API connection limit reached with requests in progress: refusing");
                    }
                    return Admission::Busy;
                }
            }
        } else if self.live.len() < connections_max / 2 {
            self.full_logged = false;
        }
        let id = self.next_id;
        self.next_id += 1;
        let activity = Arc::new(Activity::new(epoch));
        let (evict, evicted) = oneshot::channel();
        self.live.insert(id, Slot { activity: Arc::clone(&activity), evict });
        Admission::Admitted { id, activity, evicted }
    }
}

/// Frees a connection's slot when its task ends, however it ends.
struct SlotGuard {
    slots: Arc<Mutex<Slots>>,
    id: u64,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.lock().expect("slot lock is not poisoned").live.remove(&self.id);
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets
/// requests in progress finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    assert!(config.connections_max > 0, "connections_max must be positive");
    let config = Arc::new(config);
    let slots = Arc::new(Mutex::new(Slots::default()));
    let epoch = Instant::now();
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        // Finished connections are reaped here so the set stays as small as
        // the live connections.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                if !matches!(error.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted) {
                    warn!(%error, "API accept failed");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                    }
                }
                continue;
            }
        };
        let admission = slots.lock().expect("slot lock is not poisoned").admit(config.connections_max, epoch);
        let Admission::Admitted { id, activity, evicted } = admission else {
            refuse(stream, config.tls.is_some());
            continue;
        };
        let guard = SlotGuard { slots: Arc::clone(&slots), id };
        let connection = Connection {
            config: Arc::clone(&config),
            router: router.clone(),
            activity,
            evicted,
            stopping: stopping.clone(),
            peer,
        };
        connections.spawn(async move {
            let _guard = guard;
            connection.run(stream).await;
        });
    }
    info!("API server stopping: finishing requests in progress");
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Tells a client we are full without reading from it or waiting for it.
fn refuse(stream: TcpStream, tls: bool) {
    if !tls {
        // Best effort: the socket's buffer is empty, so the whole answer fits.
        let _ = stream.try_write(BUSY_RESPONSE);
    }
    debug!("API connection refused: every slot has a request in progress");
}

struct Connection {
    config: Arc<HttpConfig>,
    router: Router,
    activity: Arc<Activity>,
    evicted: oneshot::Receiver<()>,
    stopping: watch::Receiver<bool>,
    peer: SocketAddr,
}

impl Connection {
    async fn run(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let stream = WriteStall::new(stream, self.config.write_stall_timeout);
        let Some(tls) = self.config.tls.clone() else {
            return self.serve_http(stream).await;
        };
        let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
        let stream = tokio::select! {
            result = tokio::time::timeout(self.config.header_timeout, handshake) => match result {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    debug!(peer = %self.peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(peer = %self.peer, "TLS handshake timed out");
                    return;
                }
            },
            Ok(()) = &mut self.evicted => return,
            _ = self.stopping.changed() => return,
        };
        self.serve_http(stream).await;
    }

    async fn serve_http<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(mut self, stream: S) {
        let router = self.router.clone();
        let activity = Arc::clone(&self.activity);
        let body_stall_timeout = self.config.body_stall_timeout;
        let service = service_fn(move |request: Request<Incoming>| {
            let in_flight = activity.begin();
            let request = request.map(|body| Body::new(StallingBody::new(body, body_stall_timeout)));
            let router = router.clone();
            async move {
                let response = match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _in_flight: in_flight })))
            }
        });
        let mut builder = http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(self.config.header_timeout).keep_alive(true);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    debug!(peer = %self.peer, %error, "API connection ended");
                }
            }
            Ok(()) = &mut self.evicted => {
                debug!(peer = %self.peer, "idle API connection closed to make room");
            }
            _ = self.stopping.changed() => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }
}

/// A response body that keeps its request counted as in progress until it
/// has been sent.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails when it stalls: when a handler has waited
/// `timeout` for its next bytes. Time the handler spends elsewhere (the
/// engine writing what it got) does not count.
struct StallingBody {
    body: Incoming,
    timeout: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl StallingBody {
    fn new(body: Incoming, timeout: Duration) -> StallingBody {
        StallingBody { body, timeout, waiting: None }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body stalled: no bytes for {0:?}")]
struct BodyStalled(Duration);

impl HttpBody for StallingBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = None;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let waiting = this.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A stream whose writes fail once they have waited `timeout` for a client
/// that does not read. Reads are left alone: hyper bounds them.
struct WriteStall<S> {
    inner: S,
    timeout: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteStall<S> {
    fn new(inner: S, timeout: Duration) -> WriteStall<S> {
        WriteStall { inner, timeout, waiting: None }
    }

    fn stalled<T>(&mut self, cx: &mut Context<'_>, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(result) => {
                self.waiting = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let waiting = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {timeout:?}"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stalled(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stalled(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.stalled(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.stalled(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_says_its_own_length() {
        let text = std::str::from_utf8(BUSY_RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())), "{head}");
        serde_json::from_str::<crate::api::ErrorBody>(body).unwrap();
    }
}
