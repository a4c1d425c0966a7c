//! The transmission phase of one connection: requests are read in order by
//! whichever of the connection's threads holds the reading role; small ones
//! are run by that thread as it reads, and with a large or slow one it hands
//! the role on and runs the request itself (leader/follower).
//!
//! ```text
//!            ┌─ window: ≤ requests_in_flight_max requests in flight,
//!            │  ≤ BUFFER_BYTES_PER_CONNECTION_MAX of payload buffers
//!  socket ─▶ reading role ─┬─ READ/WRITE ≤ INLINE_BYTES_MAX, invalid requests,
//!            │  (one thread │  anything when alone ──▶ export ──▶ outbox ──────┐
//!            │   at a time) └─ larger READ/WRITE, FLUSH, TRIM, WRITE_ZEROES,    │
//!            │                 BLOCK_STATUS: role handed on, then ──▶ export ──┤
//!            │                 (≤ 1 + workers_per_connection_max threads)      ▼
//!            └─────────────────────────────────────────────────────── writer lock ─▶ socket
//! ```
//!
//! # Design
//!
//! - The reading role (`Requests`, under a lock) reads each header,
//!   validates it against the session, admits it into the window, reads a
//!   WRITE's payload into a buffer lent by the window, and then runs it or
//!   hands the role on. Reading stays strictly in order:
//!   the stream has no other framing. While the window is full the reader
//!   stops reading, so a client pipelining without end costs a bounded
//!   amount of memory, not more.
//! - Who executes: a READ or WRITE of at most `INLINE_BYTES_MAX`, and any
//!   request that is alone in flight with no next request buffered (queue
//!   depth 1: nothing to overlap with), runs under the reading role. Handing
//!   the role on costs a wake-up, which on the
//!   2-core machines this was measured on is more CPU than a 4 KiB export
//!   call; the CPU is the bottleneck at high queue depth because the client
//!   (fio) and the engine's own background thread share it. Everything else
//!   is run by the thread that read it, after it gave up the role, so large
//!   reads (CRC-32C of every block) and fsyncs run in parallel with each
//!   other and with reading.
//! - Replies to what the reading role runs go to its outbox, written with one
//!   `write` when the reader runs out of buffered input, is about to wait
//!   for room, hands the role on, or the outbox would exceed
//!   `OUTBOX_BYTES_MAX` (then with the
//!   reply's data in the same `writev`, not copied). Under load requests
//!   arrive several per `read`, so this turns one `sendto` per reply (half
//!   of the old single-threaded server's connection-thread CPU) into one per
//!   batch; at queue depth 1 the batch is one reply and goes out at once.
//! - The connection's threads are the connection thread and scoped threads
//!   started on demand (the role is handed on and no thread waits for it)
//!   up to `ServerConfig::workers_per_connection_max` more, kept until the
//!   connection ends. A thread that finished its request waits for the
//!   role. The thread that gives the role up runs the request it just read,
//!   so the request goes from the socket to the export without a wake-up
//!   on its way; the wake-up of the next reader is off its path. Each
//!   writes its whole reply under the writer lock — one `write`/`writev`,
//!   or for a large READ its header with `MSG_MORE` and then its data — so
//!   replies never interleave. Replies may leave in any order, which NBD
//!   allows (the handle says which request a reply answers). Each reply is
//!   a single message (a simple reply, or one chunk flagged
//!   `NBD_REPLY_FLAG_DONE`), so structured-reply ordering within a request
//!   holds as before.
//! - Overlapping requests in flight together are not ordered, as NBD allows;
//!   exports are safe for concurrent calls. The one ordering kept is FLUSH:
//!   it waits until every WRITE, TRIM and WRITE_ZEROES received before it on
//!   this connection has finished, then calls `Export::flush`. That covers
//!   every write the client saw completed before sending the FLUSH (the
//!   spec's rule) and also writes merely in flight with it, which is
//!   stricter than needed but never waits on later requests. It cannot
//!   deadlock: a write is registered before the role is handed on, and is
//!   then already executing on the thread that read it; writes run under
//!   the reading role finish before the next request is even read.
//! - Payload buffers are pooled per connection and lent to requests (best
//!   fit, else the largest free one grown, sizes in powers of two), so steady
//!   state allocates nothing per request; all of them together stay within
//!   `BUFFER_BYTES_PER_CONNECTION_MAX` (the bound the single payload buffer
//!   had before), and a request that does not fit waits for earlier ones.
//! - The connection ends (EOF, NBD_CMD_DISC, protocol violation, server
//!   shutdown) only after every admitted request has been executed and
//!   answered: the thread holding the role records why reading ended, and
//!   every thread returns once its own request is answered and it sees that.
//!   A reply that cannot be written (a client that stopped reading, past
//!   `write_timeout`) breaks the connection: nothing more is sent, the reader
//!   is woken by shutting down the socket's read side, and requests read but
//!   not yet started are dropped unrun. A panicking export call does the
//!   same, and the panic then ends the connection thread as before (no
//!   `catch_unwind`).
//!
//! # Measurements that set the constants
//!
//! fio over libnbd against `rewind serve` and `nbdkit file`, 512 MiB, 10 s
//! runs alternating between servers, ratio Rewind ÷ nbdkit (medians):
//!
//! - Everything to workers, 4 workers: 1 MiB reads at depth 4 went from 0.72
//!   (single-threaded) to 0.92, but 4 KiB random reads at depth 32 fell from
//!   0.97 to 0.80 and random writes from 0.76 to 0.69, at one context switch
//!   per request. Hence small requests on the reader, with the outbox.
//! - Workers for 1 MiB reads at depth 4: 1 → 0.78, 2 → 0.91, 4 → 0.91
//!   (8 cannot differ at depth 4; it measured 0.80, which is the noise).
//!   Four keeps headroom for deeper queues and slower exports.
//! - `INLINE_BYTES_MAX`: 64 KiB reads at depth 8 do better on the reader
//!   (0.83 vs 0.73 on workers), 256 KiB reads on workers (0.91–0.93 vs 0.71).
//! - Running a lone request on the reader saves a hand-off: 1 MiB reads at
//!   depth 1 took 325 µs instead of 340 µs.
//! - Leader/follower, against a reader that queued large requests for
//!   workers (2026-11-28, 1 GiB, 1 MiB reads at depth 4, 6 s, five
//!   alternating rounds): 0.92× `nbdkit file` (0.90 / 0.92 / 0.95) against
//!   0.88× (0.84 / 0.88 / 0.93); 1.04× the queueing build pairwise (1.02 /
//!   1.04 / 1.10). The queue put two wake-ups on each request's path (the
//!   reader's, then a worker's); now the one that reads it runs it. 4 KiB
//!   random reads at depth 32 (run on the reader either way) 1.16 against
//!   1.15.
//! - Small READs that miss the page cache still run on the reader, one at a
//!   time (2026-11-30). Handing them on while most of the last eight the
//!   reader ran took 30 µs or more gave five at once, but no more
//!   throughput: 4 KiB random reads at depth 32 right after random writes
//!   (newest blocks read from the journal) 265 against 246 MiB/s, and of a
//!   cold current store 43 against 90 (medians of four, a noisy disk;
//!   BENCHMARKS.md). Not kept.
//!
//! Why per-connection threads rather than one pool for all connections: one
//! client's slow requests (a view read deep in history, an fsync) then never
//! hold up another's, the threads live exactly as long as their connection
//! (scoped threads borrowing the export and session, no reference
//! counting, joined before the connection closes), and they are only started
//! when a connection actually has concurrent large requests. A shared pool
//! would save idle threads, not CPU, and was not built.

use std::fmt::Write as _;
use std::io::{self, BufReader, IoSlice, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, Scope};

use parking_lot::{Condvar, Mutex};
use tracing::{debug, error, warn, Span};

use crate::connection::{read_rest, write_all_vectored, DeadlineReader, Hangup, Result, Transport};
use crate::export::{DirtyBitmap, Export, ExportError, ExportErrorKind, ZeroFlags};
use crate::protocol::{self as p, Command, Refusal, RequestHeader, Session};
use crate::server::ServerConfig;
use rewind_serve::log_limit::PeerLog;

/// Most bytes of payload buffers one connection keeps, lent or pooled. A
/// request larger than what is free waits for earlier ones to finish; one of
/// `PAYLOAD_BYTES_MAX` always fits once nothing else is in flight.
pub const BUFFER_BYTES_PER_CONNECTION_MAX: usize = p::PAYLOAD_BYTES_MAX as usize;
const _: () = assert!(BUFFER_BYTES_PER_CONNECTION_MAX >= p::PAYLOAD_BYTES_MAX as usize);

/// Buffers are sized in powers of two from here, so that requests of
/// similar sizes share them.
const BUFFER_BYTES_MIN: usize = 4096;

/// READs and WRITEs up to this size are executed under the reading role:
/// for them the export call costs less than handing the reading on.
pub const INLINE_BYTES_MAX: u32 = 64 * 1024;

/// The reader writes its outbox before it would hold this much.
pub(crate) const OUTBOX_BYTES_MAX: usize = 64 * 1024;

/// A reply with at least this much data sends its header first, saying the
/// data follows (`Transport::write_header`), rather than both in one
/// `writev`. Smaller replies go out whole, gathered as before.
const CORKED_DATA_BYTES_MIN: usize = 64 * 1024;

/// What a handshake ended in: the export, and how it is used.
pub(crate) struct Negotiated {
    pub(crate) export: Arc<dyn Export>,
    pub(crate) name: String,
    pub(crate) session: Session,
    pub(crate) contexts: MetaContexts,
}

/// The metadata contexts a connection selected for its export: a
/// BLOCK_STATUS gets one chunk from each, in this order.
#[derive(Default)]
pub(crate) struct MetaContexts {
    pub(crate) base_allocation: bool,
    /// Context ids from `META_DIRTY_BITMAP_FIRST_ID`, in order.
    pub(crate) dirty_bitmaps: Vec<Arc<dyn DirtyBitmap>>,
}

impl MetaContexts {
    pub(crate) fn count(&self) -> usize {
        usize::from(self.base_allocation) + self.dirty_bitmaps.len()
    }
}

/// Per-connection counters for the closing log line.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) requests: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
}

/// Runs the transmission phase until the connection ends and every
/// admitted request has been answered.
pub(crate) fn serve<S: Transport>(
    reader: &mut BufReader<DeadlineReader<S>>,
    stream: S,
    negotiated: &Negotiated,
    config: &ServerConfig,
    log: &PeerLog,
    stopped: &(dyn Fn() -> bool + Sync),
    stats: &mut Stats,
) -> Hangup {
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(error) => return Hangup::Io(error),
    };
    let Negotiated { export, session, contexts, .. } = negotiated;
    let export = &**export;
    assert_eq!(session.meta_contexts, contexts.count() > 0, "the session knows whether contexts were selected");
    let pipeline = Pipeline::new(export, contexts, session.structured_replies, config, log, stream, control);
    let reading = Mutex::new(Requests {
        reader,
        session,
        stopped,
        scratch: Scratch::default(),
        outbox: Vec::with_capacity(OUTBOX_BYTES_MAX),
        stats,
        threads_started: 0,
        ended: None,
    });
    // The scope joins every thread the connection started before it returns.
    thread::scope(|scope| pipeline.follow(scope, &reading));
    let hangup = reading.into_inner().ended.expect("the connection's threads stop only once reading has ended");
    stats.bytes_read = pipeline.bytes_read.load(Ordering::Relaxed);
    // A reply that could not be written says more than what the reader saw
    // afterwards (usually end-of-file from our own shutdown of the socket).
    match pipeline.state.into_inner().failure {
        Some(error) => Hangup::Io(error),
        None => hangup,
    }
}

/// Scratch space for assembling replies; one per thread that sends them.
#[derive(Default)]
struct Scratch {
    assembled: Vec<u8>,
    message: String,
}

/// Where a reply goes.
enum Delivery<'o> {
    /// Written at once, under the writer lock.
    Now,
    /// Appended to the reader's outbox, which is written in one go when the
    /// reader runs out of buffered input, is about to wait, or holds
    /// `OUTBOX_BYTES_MAX`.
    Outbox(&'o mut Vec<u8>),
}

/// A validated request on its way to the export.
struct Job {
    /// Position in the connection's request stream (orders FLUSH after writes).
    sequence: u64,
    handle: u64,
    command: Command,
    /// READ and WRITE payload, lent by the window (`command`'s length of it
    /// is used); empty for other commands.
    buffer: Vec<u8>,
}

/// Commands a FLUSH must wait for.
fn is_write(command: &Command) -> bool {
    matches!(command, Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. })
}

// --- The window -----------------------------------------------------------------------

/// Admission control for one connection: how many requests are in flight
/// (admitted, not yet answered) and the payload buffers lent to them.
/// Invariants: `requests <= requests_max`; `buffer_bytes <= buffer_bytes_max`
/// counts every buffer, lent or free; there are at most `requests_max`
/// buffers, so `free` never reallocates.
struct Window {
    requests: usize,
    requests_max: usize,
    free: Vec<Vec<u8>>,
    buffer_bytes: usize,
    buffer_bytes_max: usize,
}

impl Window {
    fn new(requests_max: usize, buffer_bytes_max: usize) -> Window {
        assert!(requests_max > 0);
        assert!(buffer_bytes_max >= p::PAYLOAD_BYTES_MAX as usize);
        Window { requests: 0, requests_max, free: Vec::with_capacity(requests_max), buffer_bytes: 0, buffer_bytes_max }
    }

    /// Admits a request with `length` bytes of payload, returning its buffer
    /// (at least `length` bytes; empty for none), or `None` if it must wait
    /// until a request in flight is released. Always succeeds when nothing is
    /// in flight.
    fn try_admit(&mut self, length: usize) -> Option<Vec<u8>> {
        assert!(length <= p::PAYLOAD_BYTES_MAX as usize);
        if self.requests >= self.requests_max {
            return None;
        }
        let buffer = if length == 0 { Vec::new() } else { self.buffer(length)? };
        self.requests += 1;
        Some(buffer)
    }

    /// Ends a request admitted by `try_admit`, taking its buffer back.
    fn release(&mut self, buffer: Vec<u8>) {
        assert!(self.requests > 0);
        self.requests -= 1;
        if !buffer.is_empty() {
            assert!(self.free.len() < self.requests_max);
            self.free.push(buffer);
        }
    }

    fn buffer(&mut self, length: usize) -> Option<Vec<u8>> {
        let best_fit =
            (0..self.free.len()).filter(|&i| self.free[i].len() >= length).min_by_key(|&i| self.free[i].len());
        if let Some(index) = best_fit {
            return Some(self.free.swap_remove(index));
        }
        let size = length.next_power_of_two().max(BUFFER_BYTES_MIN);
        // No free buffer is large enough: grow the largest one (keeping the
        // number of buffers within `requests_max`), dropping other free
        // ones if that is what it takes to stay within the byte budget.
        let largest = (0..self.free.len()).max_by_key(|&i| self.free[i].len());
        let mut buffer = largest.map(|index| self.free.swap_remove(index)).unwrap_or_default();
        while self.buffer_bytes - buffer.len() + size > self.buffer_bytes_max {
            let Some(dropped) = self.free.pop() else {
                // Lent buffers hold the rest; wait for them.
                if !buffer.is_empty() {
                    self.free.push(buffer);
                }
                return None;
            };
            self.buffer_bytes -= dropped.len();
        }
        self.buffer_bytes = self.buffer_bytes - buffer.len() + size;
        buffer.resize(size, 0);
        Some(buffer)
    }
}

// --- The pipeline: window, threads, replies -----------------------------------------

struct State {
    window: Window,
    /// Sequence numbers of writes run off the reading role, not yet finished.
    writes_pending: Vec<u64>,
    reader_waiting: bool,
    flushes_waiting: usize,
    /// The first reply that could not be written.
    failure: Option<io::Error>,
}

struct Pipeline<'a, S> {
    export: &'a dyn Export,
    contexts: &'a MetaContexts,
    /// Warnings about the client go through its log budget.
    log: &'a PeerLog,
    structured: bool,
    workers_max: usize,
    /// Threads waiting for the reading role (see `follow`).
    followers: AtomicUsize,
    /// The connection thread's name, which its other threads extend.
    thread_name: String,
    state: Mutex<State>,
    /// The reader waits here for room in the window.
    room: Condvar,
    /// Flushes wait here for earlier writes to finish.
    writes_done: Condvar,
    /// The write side; holding the lock is the right to send one reply.
    writer: Mutex<S>,
    /// A reply could not be written or a thread panicked: send nothing more.
    broken: AtomicBool,
    /// Another handle on the socket, to wake the reader when broken.
    control: S,
    bytes_read: AtomicU64,
    /// The connection's span, entered by its threads so their log lines say
    /// which connection they belong to.
    span: Span,
}

impl<'a, S: Transport> Pipeline<'a, S> {
    fn new(
        export: &'a dyn Export,
        contexts: &'a MetaContexts,
        structured: bool,
        config: &ServerConfig,
        log: &'a PeerLog,
        stream: S,
        control: S,
    ) -> Self {
        let requests_max = config.requests_in_flight_max;
        Pipeline {
            export,
            contexts,
            log,
            structured,
            workers_max: config.workers_per_connection_max,
            followers: AtomicUsize::new(0),
            thread_name: thread::current().name().unwrap_or("nbd").to_owned(),
            state: Mutex::new(State {
                window: Window::new(requests_max, BUFFER_BYTES_PER_CONNECTION_MAX),
                writes_pending: Vec::with_capacity(requests_max),
                reader_waiting: false,
                flushes_waiting: 0,
                failure: None,
            }),
            room: Condvar::new(),
            writes_done: Condvar::new(),
            writer: Mutex::new(stream),
            broken: AtomicBool::new(false),
            control,
            bytes_read: AtomicU64::new(0),
            span: Span::current(),
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Admits a request with `length` bytes of payload if there is room now.
    fn try_admit(&self, length: u32) -> Option<Vec<u8>> {
        self.state.lock().window.try_admit(length as usize)
    }

    /// Waits for room for a request with `length` bytes of payload; `None`
    /// if the connection broke meanwhile.
    fn admit(&self, length: u32) -> Option<Vec<u8>> {
        let mut state = self.state.lock();
        loop {
            if self.is_broken() {
                return None;
            }
            if let Some(buffer) = state.window.try_admit(length as usize) {
                return Some(buffer);
            }
            state.reader_waiting = true;
            self.room.wait(&mut state);
            state.reader_waiting = false;
        }
    }

    /// Gives back an admission whose request never ran.
    fn cancel(&self, buffer: Vec<u8>) {
        self.state.lock().window.release(buffer);
    }

    fn requests_in_flight(&self) -> usize {
        self.state.lock().window.requests
    }

    /// One of the connection's threads, the connection thread first
    /// (leader/follower): whoever holds the reading role reads requests and
    /// runs the small ones; with a large one it gives the role up, to a
    /// thread waiting for it or one it starts, and runs the request itself.
    /// Returns once reading has ended and this thread's request is answered.
    fn follow<'scope>(&'scope self, scope: &'scope Scope<'scope, '_>, reading: &'scope Mutex<Requests<'_, S>>) {
        let _span = self.span.enter();
        let _guard = PanicGuard(self);
        let mut scratch = Scratch::default();
        loop {
            self.followers.fetch_add(1, Ordering::Relaxed);
            let mut requests = reading.lock();
            self.followers.fetch_sub(1, Ordering::Relaxed);
            let job = loop {
                if requests.ended.is_some() {
                    return;
                }
                match requests.next(self) {
                    Ok(Some(job)) => break job,
                    Ok(None) => {}
                    Err(hangup) => {
                        self.send_outbox(&mut requests.outbox);
                        requests.ended = Some(hangup);
                        return;
                    }
                }
            };
            self.send_outbox(&mut requests.outbox);
            if self.followers.load(Ordering::Relaxed) == 0 && requests.threads_started < self.workers_max {
                let number = requests.threads_started + 1;
                if self.start_follower(scope, reading, number) {
                    requests.threads_started = number;
                }
            }
            drop(requests);
            self.run(job, &mut scratch, Delivery::Now);
        }
    }

    /// Starts another thread for the connection. If it cannot start, the
    /// requests wait for a thread that is there.
    fn start_follower<'scope>(
        &'scope self,
        scope: &'scope Scope<'scope, '_>,
        reading: &'scope Mutex<Requests<'_, S>>,
        number: usize,
    ) -> bool {
        let name = format!("{}-w{number}", self.thread_name);
        let started = thread::Builder::new().name(name).spawn_scoped(scope, move || self.follow(scope, reading));
        if let Err(error) = &started {
            warn!(%error, threads = number, "cannot start another thread for an NBD connection");
        }
        started.is_ok()
    }

    /// Records a request about to run off the reading role that a later
    /// FLUSH must wait for.
    fn register(&self, job: &Job) {
        if is_write(&job.command) {
            self.state.lock().writes_pending.push(job.sequence);
        }
    }

    /// Executes one admitted request, answers it and releases it.
    fn run(&self, mut job: Job, scratch: &mut Scratch, mut delivery: Delivery<'_>) {
        if matches!(job.command, Command::Flush) {
            self.wait_for_writes_before(job.sequence);
        }
        if !self.is_broken() {
            self.execute(&mut job, scratch, &mut delivery);
        }
        let mut state = self.state.lock();
        // Writes run by the reading role are not registered: no FLUSH can
        // be waiting for them, as it would have been read later.
        let pending = &mut state.writes_pending;
        if let Some(index) = pending.iter().position(|&sequence| sequence == job.sequence) {
            pending.swap_remove(index);
            if state.flushes_waiting > 0 {
                self.writes_done.notify_all();
            }
        }
        state.window.release(job.buffer);
        if state.reader_waiting {
            self.room.notify_one();
        }
    }

    fn wait_for_writes_before(&self, sequence: u64) {
        let mut state = self.state.lock();
        state.flushes_waiting += 1;
        while !self.is_broken() && state.writes_pending.iter().any(|&pending| pending < sequence) {
            self.writes_done.wait(&mut state);
        }
        state.flushes_waiting -= 1;
    }

    /// Appends the answer of every selected context to `out`, the last
    /// chunk flagged done; nothing is sent if any of them fails.
    fn block_status(
        &self,
        handle: u64,
        offset: u64,
        length: u32,
        req_one: bool,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), ExportError> {
        let contexts = self.contexts;
        let count = contexts.count();
        let mut answered = 0;
        if contexts.base_allocation {
            let extents = self.export.block_status(offset, u64::from(length))?;
            answered += 1;
            let statuses = extents.iter().map(|extent| (extent.length, extent.status()));
            let id = p::META_BASE_ALLOCATION_ID;
            p::push_block_status_chunk(out, handle, id, statuses, length, req_one, answered == count);
        }
        for (id, bitmap) in (p::META_DIRTY_BITMAP_FIRST_ID..).zip(&contexts.dirty_bitmaps) {
            let extents = bitmap.extents(offset, u64::from(length))?;
            answered += 1;
            let statuses = extents.iter().map(|extent| (extent.length, extent.status()));
            p::push_block_status_chunk(out, handle, id, statuses, length, req_one, answered == count);
        }
        assert_eq!(answered, count, "validation admits BLOCK_STATUS only with a context selected");
        Ok(())
    }

    fn execute(&self, job: &mut Job, scratch: &mut Scratch, delivery: &mut Delivery<'_>) {
        let export = self.export;
        let handle = job.handle;
        let (result, fast_zero) = match job.command {
            Command::Read { offset, length } => {
                let buffer = &mut job.buffer[..length as usize];
                match export.read(offset, buffer) {
                    Ok(()) => {
                        self.bytes_read.fetch_add(u64::from(length), Ordering::Relaxed);
                        return self.reply_read(delivery, handle, offset, buffer);
                    }
                    Err(error) => (Err(error), false),
                }
            }
            Command::Write { offset, length, fua } => {
                (export.write(offset, &job.buffer[..length as usize], fua), false)
            }
            Command::Flush => (export.flush(), false),
            Command::Trim { offset, length, fua } => (export.trim(offset, u64::from(length), fua), false),
            Command::WriteZeroes { offset, length, mode } => {
                let flags = ZeroFlags { fua: mode.fua, no_hole: mode.no_hole, fast: mode.fast };
                (export.write_zeroes(offset, u64::from(length), flags), mode.fast)
            }
            Command::BlockStatus { offset, length, req_one } => {
                match self.block_status(handle, offset, length, req_one, &mut scratch.assembled) {
                    Ok(()) => {
                        self.reply(delivery, &scratch.assembled, &[]);
                        return scratch.assembled.clear();
                    }
                    Err(error) => {
                        scratch.assembled.clear();
                        (Err(error), false)
                    }
                }
            }
            Command::Disconnect => unreachable!("the reader ends the connection instead"),
        };
        match result {
            Ok(()) => self.reply(delivery, &p::encode_simple_reply(handle, 0), &[]),
            Err(error) => {
                let errno = export_errno(&error, fast_zero);
                if errno == p::ENOTSUP {
                    debug!(handle, "fast zero declined: {}", error.message);
                } else if errno == p::ENOSPC {
                    // A full disk is reported by the engine, once.
                    debug!(handle, "no space: {}", error.message);
                } else if self.log.allow() {
                    // EIO is the server's failure (the device, damaged
                    // data); the rest are the client's request refused.
                    if errno == p::EIO {
                        error!(handle, errno, "export operation failed: {error}");
                    } else {
                        warn!(handle, errno, "export operation failed: {error}");
                    }
                }
                self.reply_error(scratch, delivery, handle, errno, &error.message);
            }
        }
    }

    // --- Replies ---

    /// Sends or queues one whole reply: `header` then `data`.
    fn reply(&self, delivery: &mut Delivery<'_>, header: &[u8], data: &[u8]) {
        match delivery {
            Delivery::Now => self.send(&mut [IoSlice::new(header), IoSlice::new(data)]),
            Delivery::Outbox(outbox) if outbox.len() + header.len() + data.len() < OUTBOX_BYTES_MAX => {
                outbox.extend_from_slice(header);
                outbox.extend_from_slice(data);
            }
            Delivery::Outbox(outbox) => {
                // Full: out it goes with this reply, whose data is not copied.
                self.send(&mut [IoSlice::new(outbox), IoSlice::new(header), IoSlice::new(data)]);
                outbox.clear();
            }
        }
    }

    /// Writes whatever replies the outbox holds.
    fn send_outbox(&self, outbox: &mut Vec<u8>) {
        if !outbox.is_empty() {
            self.send(&mut [IoSlice::new(outbox)]);
            outbox.clear();
        }
    }

    /// Writes whole replies with one `write`/`writev`, unless the
    /// connection is broken.
    fn send(&self, bufs: &mut [IoSlice<'_>]) {
        let mut stream = self.writer.lock();
        if self.is_broken() {
            return;
        }
        let written = match bufs {
            [header, data] if data.len() >= CORKED_DATA_BYTES_MIN => {
                stream.write_header(header).and_then(|()| io::Write::write_all(&mut *stream, data))
            }
            _ => write_all_vectored(&mut *stream, bufs),
        };
        if let Err(error) = written {
            drop(stream);
            self.fail(error);
        }
    }

    /// A successful READ.
    fn reply_read(&self, delivery: &mut Delivery<'_>, handle: u64, offset: u64, data: &[u8]) {
        // Validated against PAYLOAD_BYTES_MAX before the buffer was filled.
        let length = u32::try_from(data.len()).expect("read longer than the payload limit");
        let mut header = [0u8; p::READ_CHUNK_PREFIX_BYTES];
        let header = if self.structured {
            header = p::encode_read_chunk_prefix(handle, offset, length);
            &header[..]
        } else {
            header[..p::SIMPLE_REPLY_BYTES].copy_from_slice(&p::encode_simple_reply(handle, 0));
            &header[..p::SIMPLE_REPLY_BYTES]
        };
        self.reply(delivery, header, data);
    }

    /// An error reply; with structured replies it carries `message` for the
    /// human at the other end.
    fn reply_error(
        &self,
        scratch: &mut Scratch,
        delivery: &mut Delivery<'_>,
        handle: u64,
        errno: u32,
        message: impl std::fmt::Display,
    ) {
        if !self.structured {
            return self.reply(delivery, &p::encode_simple_reply(handle, errno), &[]);
        }
        scratch.message.clear();
        write!(scratch.message, "{message}").expect("writing to a String cannot fail");
        p::push_error_chunk(&mut scratch.assembled, handle, errno, &scratch.message);
        self.reply(delivery, &scratch.assembled, &[]);
        scratch.assembled.clear();
    }

    // --- Ending ---

    /// A reply could not be written: the stream is unusable from here on.
    fn fail(&self, error: io::Error) {
        let mut state = self.state.lock();
        if state.failure.is_none() {
            state.failure = Some(error);
        }
        drop(state);
        self.stop();
    }

    /// Stops replies and wakes whoever waits: the reader (in a socket read or
    /// for room) and flushes.
    fn stop(&self) {
        self.broken.store(true, Ordering::Release);
        // The read side only: shutting down the write side would show the
        // client a closed connection before this one is deregistered.
        let _ = self.control.shutdown(Shutdown::Read);
        let _state = self.state.lock();
        self.room.notify_all();
        self.writes_done.notify_all();
    }
}

/// Breaks the connection when one of its threads panics (an export bug):
/// reading ends, and the panic ends the connection thread once the scope
/// joins.
struct PanicGuard<'p, 'a, S: Transport>(&'p Pipeline<'a, S>);

impl<S: Transport> Drop for PanicGuard<'_, '_, S> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.stop();
        }
    }
}

// --- The reader ---------------------------------------------------------------------

/// The reading role: the stream's read side and what goes with reading it.
/// One thread of the connection holds it at a time (`Pipeline::follow`).
struct Requests<'r, S> {
    reader: &'r mut BufReader<DeadlineReader<S>>,
    session: &'r Session,
    /// Whether the server stopped reading this connection (see `next`).
    stopped: &'r (dyn Fn() -> bool + Sync),
    scratch: Scratch,
    /// Replies to requests the reading role ran itself, not yet written.
    outbox: Vec<u8>,
    stats: &'r mut Stats,
    /// Threads started beside the connection thread.
    threads_started: usize,
    /// Why reading ended; set once, then every thread finishes and returns.
    ended: Option<Hangup>,
}

impl<S: Transport> Requests<'_, S> {
    /// Reads, validates and answers one request, or returns it to be run
    /// off the reading role.
    fn next(&mut self, pipeline: &Pipeline<'_, S>) -> Result<Option<Job>> {
        // Every way the server ends a connection shuts the socket's read
        // side down, but Linux goes on delivering what the client has sent
        // and sends after: a client that keeps writing would never see
        // the end. So the reasons are looked at before each request too.
        if pipeline.is_broken() || (self.stopped)() {
            return Err(Hangup::ServerStopped);
        }
        if self.reader.buffer().len() < p::REQUEST_HEADER_BYTES {
            // About to wait for the client, which may be waiting for these.
            pipeline.send_outbox(&mut self.outbox);
        }
        let mut header = [0u8; p::REQUEST_HEADER_BYTES];
        // The magic is checked before waiting for the rest: a client that
        // sends a 16-byte option here would otherwise wait for its reply while
        // we wait for 12 more bytes.
        let (magic, rest) = header.split_at_mut(4);
        self.read_request_start(pipeline, magic)?;
        if magic != p::REQUEST_MAGIC.to_be_bytes() {
            let magic = u32::from_be_bytes(magic.try_into().unwrap());
            return Err(Hangup::Violation(format!("request magic {magic:#010x} is not NBD_REQUEST_MAGIC")));
        }
        read_rest(self.reader, rest)?;
        let request = p::decode_request_header(&header).expect("magic checked above");
        self.stats.requests += 1;
        match p::validate_request(&request, self.session) {
            Ok(Command::Disconnect) => Err(Hangup::ClientDone("NBD_CMD_DISC")),
            Ok(command) => self.dispatch(pipeline, request.handle, command),
            Err(Refusal::Disconnect { length }) => Err(Hangup::Violation(format!(
                "NBD_CMD_WRITE of {length} bytes exceeds the {} byte payload limit",
                p::PAYLOAD_BYTES_MAX
            ))),
            Err(Refusal::Reply { errno, fault }) => self.refuse(pipeline, &request, errno, fault).map(|()| None),
        }
    }

    /// Waits for the next request's magic. A read timing out is the idle
    /// timeout (`enter_transmission` set it as the socket's read timeout):
    /// the connection is idle, and closed, only if none of its requests is
    /// in flight; otherwise the client is waiting for us, and the bytes of
    /// the magic already read are kept (read again, the stream would be out
    /// of step).
    fn read_request_start(&mut self, pipeline: &Pipeline<'_, S>, magic: &mut [u8]) -> Result<()> {
        let mut filled = 0;
        while filled < magic.len() {
            match self.reader.read(&mut magic[filled..]) {
                Ok(0) if filled == 0 => return Err(Hangup::ClientClosed),
                Ok(0) => return Err(Hangup::Violation("client closed the connection within a message".into())),
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if pipeline.requests_in_flight() > 0 {
                        continue;
                    }
                    if filled > 0 {
                        // Stalled within a message, nothing in flight.
                        return Err(Hangup::Io(error));
                    }
                    let timeout = self.reader.get_ref().idle_timeout()?;
                    return Err(Hangup::Idle(timeout));
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    fn dispatch(&mut self, pipeline: &Pipeline<'_, S>, handle: u64, command: Command) -> Result<Option<Job>> {
        let payload_bytes = match command {
            Command::Read { length, .. } | Command::Write { length, .. } => length,
            _ => 0,
        };
        let buffer = match pipeline.try_admit(payload_bytes) {
            Some(buffer) => Some(buffer),
            None => {
                pipeline.send_outbox(&mut self.outbox);
                pipeline.admit(payload_bytes)
            }
        };
        let Some(mut buffer) = buffer else {
            return Err(Hangup::Violation("connection broken while waiting to admit a request".into()));
        };
        if let Command::Write { length, .. } = command {
            if self.reader.buffer().len() < length as usize {
                pipeline.send_outbox(&mut self.outbox);
            }
            if let Err(error) = self.reader.read_exact(&mut buffer[..length as usize]) {
                pipeline.cancel(buffer);
                if error.kind() == io::ErrorKind::UnexpectedEof {
                    return Err(Hangup::Violation("client closed the connection within a write payload".into()));
                }
                return Err(error.into());
            }
            self.stats.bytes_written += u64::from(length);
        }
        let job = Job { sequence: self.stats.requests, handle, command, buffer };
        if payload_bytes > 0 && payload_bytes <= INLINE_BYTES_MAX {
            pipeline.run(job, &mut self.scratch, Delivery::Outbox(&mut self.outbox));
        } else if self.reader.buffer().len() < p::REQUEST_HEADER_BYTES && pipeline.requests_in_flight() == 1 {
            // Nothing to overlap with and no next request yet: save the
            // hand-over. No other request can be admitted meanwhile.
            pipeline.run(job, &mut self.scratch, Delivery::Now);
        } else {
            pipeline.register(&job);
            return Ok(Some(job));
        }
        Ok(None)
    }

    fn refuse(
        &mut self,
        pipeline: &Pipeline<'_, S>,
        request: &RequestHeader,
        errno: u32,
        fault: p::RequestFault,
    ) -> Result<()> {
        if pipeline.log.allow() {
            warn!(handle = request.handle, errno, "invalid request from client: {fault}");
        }
        if request.command == p::CMD_WRITE {
            // Stay in step with the stream: the payload follows regardless.
            // `validate_request` bounded it by PAYLOAD_BYTES_MAX.
            if self.reader.buffer().len() < request.length as usize {
                pipeline.send_outbox(&mut self.outbox);
            }
            let skipped = io::copy(&mut (&mut *self.reader).take(u64::from(request.length)), &mut io::sink())?;
            if skipped != u64::from(request.length) {
                return Err(Hangup::Violation("client closed the connection within a write payload".into()));
            }
        }
        let delivery = &mut Delivery::Outbox(&mut self.outbox);
        pipeline.reply_error(&mut self.scratch, delivery, request.handle, errno, fault);
        Ok(())
    }
}

fn export_errno(error: &ExportError, fast_zero: bool) -> u32 {
    match error.kind {
        ExportErrorKind::Io => p::EIO,
        ExportErrorKind::ReadOnly => p::EPERM,
        ExportErrorKind::Invalid => p::EINVAL,
        ExportErrorKind::NoSpace => p::ENOSPC,
        // The spec reserves ENOTSUP for declined fast zeroes.
        ExportErrorKind::NotSupported if fast_zero => p::ENOTSUP,
        ExportErrorKind::NotSupported => p::EINVAL,
        ExportErrorKind::Shutdown => p::ESHUTDOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn window_bounds_requests_in_flight() {
        let mut window = Window::new(3, BUFFER_BYTES_PER_CONNECTION_MAX);
        let a = window.try_admit(0).unwrap();
        let b = window.try_admit(4096).unwrap();
        let c = window.try_admit(0).unwrap();
        assert!(window.try_admit(0).is_none(), "a fourth request must wait");
        assert!(window.try_admit(512).is_none());
        window.release(b);
        let d = window.try_admit(512).unwrap();
        assert!(window.try_admit(0).is_none());
        for buffer in [a, c, d] {
            window.release(buffer);
        }
        assert_eq!(window.requests, 0);
    }

    #[test]
    fn window_bounds_buffer_bytes_and_reuses_buffers() {
        let mut window = Window::new(64, BUFFER_BYTES_PER_CONNECTION_MAX);
        // 1 MiB requests: 32 fit in the budget, the 33rd waits.
        let mut lent: Vec<Vec<u8>> = (0..32).map(|_| window.try_admit(MIB).unwrap()).collect();
        assert!(window.try_admit(MIB).is_none());
        assert!(window.try_admit(1).is_none(), "a new buffer would exceed the budget");
        assert!(window.try_admit(0).is_some(), "requests without payload are only counted");
        window.release(Vec::new());
        // Released buffers are lent again without allocating.
        let released = lent.pop().unwrap();
        let pointer = released.as_ptr();
        window.release(released);
        let again = window.try_admit(4096).unwrap();
        assert_eq!(again.as_ptr(), pointer);
        assert!(again.len() >= 4096);
        lent.push(again);
        assert_eq!(window.buffer_bytes, 32 * MIB);
        // The largest request waits until enough buffers are back, then
        // fits by dropping free ones.
        for buffer in lent.drain(..31) {
            window.release(buffer);
        }
        assert!(window.try_admit(p::PAYLOAD_BYTES_MAX as usize).is_none());
        window.release(lent.pop().unwrap());
        let largest = window.try_admit(p::PAYLOAD_BYTES_MAX as usize).unwrap();
        assert_eq!(largest.len(), p::PAYLOAD_BYTES_MAX as usize);
        assert!(window.buffer_bytes <= BUFFER_BYTES_PER_CONNECTION_MAX);
        assert!(window.free.is_empty());
        window.release(largest);
    }

    #[test]
    fn window_waiting_for_bytes_keeps_no_empty_buffers() {
        let mut window = Window::new(4, BUFFER_BYTES_PER_CONNECTION_MAX);
        let lent = window.try_admit(p::PAYLOAD_BYTES_MAX as usize).unwrap();
        for _ in 0..10 {
            assert!(window.try_admit(1).is_none());
        }
        assert!(window.free.is_empty());
        window.release(lent);
        assert!(window.try_admit(1).is_some());
    }

    #[test]
    fn window_keeps_its_invariants_under_any_sequence() {
        use proptest::prelude::*;
        use proptest::test_runner::TestRunner;
        let sizes = prop_oneof![Just(0usize), 1usize..=8192, 1usize..=p::PAYLOAD_BYTES_MAX as usize];
        let steps = proptest::collection::vec((any::<bool>(), sizes), 1..200);
        TestRunner::default()
            .run(&steps, |steps| {
                let mut window = Window::new(8, BUFFER_BYTES_PER_CONNECTION_MAX);
                let mut lent: Vec<Vec<u8>> = Vec::new();
                for (admit, length) in steps {
                    if admit || lent.is_empty() {
                        match window.try_admit(length) {
                            Some(buffer) => {
                                prop_assert!(buffer.len() >= length);
                                lent.push(buffer);
                            }
                            None => prop_assert!(!lent.is_empty(), "refused with nothing in flight"),
                        }
                    } else {
                        window.release(lent.swap_remove(length % lent.len()));
                    }
                    let held: usize =
                        lent.iter().map(Vec::len).sum::<usize>() + window.free.iter().map(Vec::len).sum::<usize>();
                    prop_assert_eq!(held, window.buffer_bytes);
                    prop_assert!(window.buffer_bytes <= BUFFER_BYTES_PER_CONNECTION_MAX);
                    prop_assert!(window.requests <= 8 && window.requests == lent.len());
                    prop_assert!(window.free.len() + lent.iter().filter(|b| !b.is_empty()).count() <= 8);
                    prop_assert!(window.free.iter().all(|buffer| !buffer.is_empty()));
                }
                Ok(())
            })
            .unwrap();
    }
}
