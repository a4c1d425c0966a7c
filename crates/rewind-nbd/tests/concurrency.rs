//! Requests of one connection executing concurrently: pipelined requests of
//! every kind all answered correctly, FLUSH ordered after earlier writes,
//! the in-flight bound, and NBD_CMD_DISC with requests in flight.
//!
//! Several tests first park the connection's reader on a gated small write
//! (small requests run on the reader itself) and queue the rest of their
//! requests over a Unix socket meanwhile: a completed `write` on a Unix
//! socket is in the server's receive queue, so once the reader resumes it
//! finds the whole burst buffered and hands large requests to workers
//! rather than running them itself.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Instant;

use common::*;
use rewind_nbd::protocol as p;
use rewind_nbd::server::INLINE_BYTES_MAX;
use rewind_nbd::{
    BlockSizes, Catalog, Client, Export, ExportError, ExportListing, Extent, OpenError, OpenErrorKind, Server,
    ServerConfig, ZeroFlags,
};

const GATED_BYTES: usize = 8 << 20;
/// Run by the reader itself.
const SMALL: u32 = 4096;
/// Run by the thread that read it, after it handed the reading on (unless
/// it is the only request in flight).
const LARGE: u32 = INLINE_BYTES_MAX + 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Gated {
    Writes,
    ReadsAndWrites,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Other,
}

#[derive(Default)]
struct Counters {
    /// Export calls begun, gated or not.
    entered: usize,
    executing: usize,
    executing_max: usize,
    writes_executing: usize,
    /// Gated calls that may pass; `open` lets all pass.
    permits: usize,
    open: bool,
    flushes: usize,
    flush_overlapped_a_write: bool,
    /// The threads that called `read`.
    reading_threads: HashSet<thread::ThreadId>,
}

/// A byte array whose reads and/or writes wait at a gate the test opens,
/// and which counts what executes at once.
struct GatedExport {
    data: Mutex<Vec<u8>>,
    gated: Gated,
    counters: Mutex<Counters>,
    changed: Condvar,
}

impl GatedExport {
    fn new(gated: Gated) -> Self {
        GatedExport {
            data: Mutex::new(vec![0; GATED_BYTES]),
            gated,
            counters: Mutex::new(Counters::default()),
            changed: Condvar::new(),
        }
    }

    fn is_gated(&self, op: Op) -> bool {
        match op {
            Op::Write => true,
            Op::Read => self.gated == Gated::ReadsAndWrites,
            Op::Other => false,
        }
    }

    /// Waits on the condition variable until `done`, failing the test
    /// rather than hanging if that takes longer than any client would wait.
    fn wait_until(&self, mut done: impl FnMut(&mut Counters) -> bool) -> std::sync::MutexGuard<'_, Counters> {
        let deadline = Instant::now() + CLIENT_TIMEOUT;
        let mut counters = self.counters.lock().unwrap();
        while !done(&mut counters) {
            let left = deadline.checked_duration_since(Instant::now()).expect("timed out waiting at the gate");
            counters = self.changed.wait_timeout(counters, left).unwrap().0;
        }
        counters
    }

    fn enter(&self, op: Op) {
        {
            let mut counters = self.counters.lock().unwrap();
            counters.entered += 1;
            counters.executing += 1;
            counters.executing_max = counters.executing_max.max(counters.executing);
            if op == Op::Write {
                counters.writes_executing += 1;
            }
            if op == Op::Read {
                counters.reading_threads.insert(thread::current().id());
            }
            self.changed.notify_all();
        }
        if self.is_gated(op) {
            let mut counters = self.wait_until(|c| c.open || c.permits > 0);
            if !counters.open {
                counters.permits -= 1;
            }
        }
    }

    fn leave(&self, op: Op) {
        let mut counters = self.counters.lock().unwrap();
        counters.executing -= 1;
        if op == Op::Write {
            counters.writes_executing -= 1;
        }
        self.changed.notify_all();
    }

    fn wait_entered(&self, calls: usize) {
        drop(self.wait_until(|c| c.entered >= calls));
    }

    fn release(&self, calls: usize) {
        self.counters.lock().unwrap().permits += calls;
        self.changed.notify_all();
    }

    fn open(&self) {
        self.counters.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    fn counters<T>(&self, f: impl FnOnce(&Counters) -> T) -> T {
        f(&self.counters.lock().unwrap())
    }
}

impl Export for GatedExport {
    fn size_bytes(&self) -> u64 {
        GATED_BYTES as u64
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::UNCONSTRAINED
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    fn can_fast_zero(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.enter(Op::Read);
        let offset = offset as usize;
        buf.copy_from_slice(&self.data.lock().unwrap()[offset..offset + buf.len()]);
        self.leave(Op::Read);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.enter(Op::Write);
        let offset = offset as usize;
        self.data.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
        self.leave(Op::Write);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.enter(Op::Other);
        {
            let mut counters = self.counters.lock().unwrap();
            counters.flushes += 1;
            if counters.writes_executing > 0 {
                counters.flush_overlapped_a_write = true;
            }
        }
        self.leave(Op::Other);
        Ok(())
    }
    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), ExportError> {
        unreachable!("not used by these tests")
    }
    fn write_zeroes(&self, _offset: u64, _length: u64, _flags: ZeroFlags) -> Result<(), ExportError> {
        unreachable!("not used by these tests")
    }
    fn block_status(&self, _offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(vec![Extent { length, hole: false, zero: false }])
    }
}

struct GatedCatalog(Arc<GatedExport>);

impl Catalog for GatedCatalog {
    fn list(&self, _client: &Client) -> Vec<ExportListing> {
        vec![ExportListing { name: "gated".into(), description: String::new() }]
    }
    fn open(&self, name: &str, _client: &Client) -> Result<Arc<dyn Export>, OpenError> {
        match name {
            "gated" => Ok(Arc::clone(&self.0) as Arc<dyn Export>),
            _ => Err(OpenError { kind: OpenErrorKind::NotFound, message: "no such export".into() }),
        }
    }
}

struct GatedServer {
    server: Server,
    export: Arc<GatedExport>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl GatedServer {
    fn start(gated: Gated, config: ServerConfig) -> Self {
        let export = Arc::new(GatedExport::new(gated));
        let server = Server::new(Arc::new(GatedCatalog(Arc::clone(&export))), config);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        server.serve_unix(&socket).unwrap();
        GatedServer { server, export, socket, _dir: dir }
    }

    fn client(&self, negotiate: Negotiate) -> RawClient {
        let mut client = RawClient::unix(&self.socket);
        client.connect_export("gated", negotiate);
        client
    }
}

/// Sends a small write the reader runs itself, and waits until it is
/// blocked at the gate: the reader reads nothing more until it is released.
fn park_the_reader(client: &mut RawClient, export: &GatedExport) -> u64 {
    let offset = (GATED_BYTES - SMALL as usize) as u64;
    let handle = client.send_request(0, p::CMD_WRITE, offset, SMALL, &pattern(1, SMALL as usize));
    export.wait_entered(1);
    handle
}

fn expect_ok(reply: Reply) -> u64 {
    match reply {
        Reply::Simple { handle, errno: 0, .. } => handle,
        other => panic!("expected success, got {other:?}"),
    }
}

#[test]
fn pipelined_requests_of_every_kind_get_their_replies_with_correct_data() {
    let server = TestServer::start();
    let disk = server.export(DISK);
    let before = pattern(7, 1 << 20);
    disk.set_contents(0, &before);
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, STRUCTURED);

    enum Expect {
        Ok,
        Data(Vec<u8>),
        BlockStatus,
        Error(u32),
    }
    let mut burst = Vec::new();
    let mut expected = HashMap::new();
    let mut written = Vec::new();
    for i in 0..24u64 {
        let (flags, command, offset, length, payload, expect) = match i % 8 {
            0 | 1 => {
                // Small and large writes, to fresh places.
                let length = if i % 8 == 0 { SMALL } else { LARGE };
                let offset = (2 << 20) + i * 256 * 1024;
                let data = pattern(i as u8, length as usize);
                written.push((offset, data.clone()));
                (p::CMD_FLAG_FUA, p::CMD_WRITE, offset, length, data, Expect::Ok)
            }
            2 | 3 => {
                // Small and large reads of the data set up before.
                let length = if i % 8 == 2 { SMALL } else { LARGE };
                let offset = i * 4096;
                let data = before[offset as usize..(offset + u64::from(length)) as usize].to_vec();
                (0, p::CMD_READ, offset, length, Vec::new(), Expect::Data(data))
            }
            4 => (0, p::CMD_TRIM, (9 << 20) + i * 8192, 8192, Vec::new(), Expect::Ok),
            5 => (0, p::CMD_WRITE_ZEROES, (10 << 20) + i * 8192, 8192, Vec::new(), Expect::Ok),
            6 => (0, p::CMD_BLOCK_STATUS, 0, 1 << 20, Vec::new(), Expect::BlockStatus),
            _ if i == 7 => (0, p::CMD_FLUSH, 0, 0, Vec::new(), Expect::Ok),
            // Errors in one request must not disturb the others.
            _ => (0, p::CMD_READ, DISK_BYTES as u64, SMALL, Vec::new(), Expect::Error(p::EINVAL)),
        };
        let handle = client.queue_request(&mut burst, flags, command, offset, length, &payload);
        expected.insert(handle, expect);
    }
    // A second thread sends while this one reads, as real clients do.
    let mut sender = client.sender();
    let sending = thread::spawn(move || sender.write_all(&burst).unwrap());
    for _ in 0..expected.len() {
        let reply = client.any_reply(|_| 0);
        let handle = reply.handle();
        match (expected.remove(&handle).expect("one reply per request"), reply) {
            (Expect::Ok, Reply::Simple { errno: 0, .. }) => {}
            (Expect::Data(data), Reply::Chunk(chunk)) => {
                assert_eq!((chunk.reply_type, chunk.flags), (p::REPLY_TYPE_OFFSET_DATA, p::REPLY_FLAG_DONE));
                assert!(chunk.payload[8..] == data[..], "read {handle} returned the wrong data");
            }
            (Expect::BlockStatus, Reply::Chunk(chunk)) => {
                assert_eq!((chunk.reply_type, chunk.flags), (p::REPLY_TYPE_BLOCK_STATUS, p::REPLY_FLAG_DONE));
            }
            (Expect::Error(errno), Reply::Chunk(chunk)) => assert_eq!(chunk.error().0, errno),
            (_, reply) => panic!("unexpected reply {reply:?}"),
        }
    }
    sending.join().unwrap();
    assert!(expected.is_empty());
    let after = disk.snapshot();
    for (offset, data) in written {
        assert!(after[offset as usize..offset as usize + data.len()] == data[..], "write at {offset}");
    }
    // The connection carries on.
    assert_eq!(client.read_structured(0, SMALL).unwrap(), before[..SMALL as usize]);
}

#[test]
fn flush_waits_for_earlier_writes() {
    let server = GatedServer::start(Gated::Writes, ServerConfig::default());
    let export = &server.export;
    let mut client = server.client(STRUCTURED);
    let parked = park_the_reader(&mut client, export);
    // A large write (for a worker), the flush, and a small read the reader
    // answers itself: once its reply is in, the flush has been read.
    let mut burst = Vec::new();
    let data = pattern(2, LARGE as usize);
    let write = client.queue_request(&mut burst, 0, p::CMD_WRITE, 1 << 20, LARGE, &data);
    let flush = client.queue_request(&mut burst, 0, p::CMD_FLUSH, 0, 0, &[]);
    let read = client.queue_request(&mut burst, 0, p::CMD_READ, 1 << 20, SMALL, &[]);
    client.send(&burst);
    export.release(1);
    export.wait_entered(3);

    assert_eq!(expect_ok(client.any_reply(|_| 0)), parked);
    let Reply::Chunk(chunk) = client.any_reply(|_| 0) else { panic!("a read reply") };
    assert_eq!(chunk.handle, read);
    // The write is blocked at the gate, so the flush must not have been
    // called, let alone answered.
    client.expect_nothing_pending();
    assert_eq!(export.counters(|c| c.flushes), 0);

    export.open();
    assert_eq!(expect_ok(client.any_reply(|_| 0)), write, "the write is answered first");
    assert_eq!(expect_ok(client.any_reply(|_| 0)), flush);
    assert!(!export.counters(|c| c.flush_overlapped_a_write));
    assert_eq!(export.counters(|c| c.flushes), 1);
    assert!(export.data.lock().unwrap()[1 << 20..(1 << 20) + data.len()] == data[..]);
    client.disconnect();
}

#[test]
fn a_client_that_pipelines_without_end_is_held_to_the_in_flight_bound() {
    // More workers than requests in flight: the window, not the workers,
    // must be what bounds the requests executing.
    let requests_in_flight_max = 4;
    let config = ServerConfig { workers_per_connection_max: 8, requests_in_flight_max, ..ServerConfig::default() };
    let server = GatedServer::start(Gated::Writes, config);
    let export = Arc::clone(&server.export);
    let mut client = server.client(SIMPLE);
    let parked = park_the_reader(&mut client, &export);

    // 200 writes of 80 KiB (far beyond the bound) with an invalid request
    // right after the first one the server cannot admit.
    let writes = 200u64;
    let mut burst = Vec::new();
    let mut handles = HashMap::new();
    let mut invalid = 0;
    for i in 0..writes {
        let data = pattern(i as u8, LARGE as usize);
        let offset = i % 64 * u64::from(LARGE);
        handles.insert(client.queue_request(&mut burst, 0, p::CMD_WRITE, offset, LARGE, &data), i);
        if i == requests_in_flight_max as u64 {
            invalid = client.queue_request(&mut burst, 0, p::CMD_READ, GATED_BYTES as u64, 1, &[]);
        }
    }
    // The sender fills the socket until it would block, says so, then
    // blocks until the server reads on.
    let mut sender = match client.sender() {
        Stream::Unix(stream) => stream,
        Stream::Tcp(_) => unreachable!(),
    };
    let (full_tx, full) = std::sync::mpsc::channel();
    let sending = thread::spawn(move || {
        sender.set_nonblocking(true).unwrap();
        let mut sent = 0;
        loop {
            match sender.write(&burst[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        full_tx.send(()).unwrap();
        sender.set_nonblocking(false).unwrap();
        sender.write_all(&burst[sent..]).unwrap();
    });
    full.recv().unwrap();
    export.release(1);

    // The first `requests_in_flight_max` writes execute; the next waits for
    // room, so the reader sends what it has answered and reads no further.
    export.wait_entered(1 + requests_in_flight_max);
    assert_eq!(expect_ok(client.any_reply(|_| 0)), parked);
    // Had the server read on, the invalid request's error would come next.
    export.release(1);
    let first = expect_ok(client.any_reply(|_| 0));
    assert!(handles.remove(&first).is_some_and(|i| i < requests_in_flight_max as u64), "handle {first}");
    assert_eq!(client.any_reply(|_| 0), Reply::Simple { handle: invalid, errno: p::EINVAL, data: Vec::new() });

    export.open();
    for _ in 1..writes {
        let handle = expect_ok(client.any_reply(|_| 0));
        assert!(handles.remove(&handle).is_some(), "one reply per request");
    }
    sending.join().unwrap();
    let executing_max = export.counters(|c| c.executing_max);
    assert!(executing_max <= requests_in_flight_max, "{executing_max} requests executed at once");
    assert_eq!(export.counters(|c| c.entered), 1 + writes as usize);
    client.disconnect();
}

#[test]
fn large_requests_run_at_once_on_the_threads_that_read_them() {
    let config = ServerConfig { workers_per_connection_max: 2, ..ServerConfig::default() };
    let server = GatedServer::start(Gated::ReadsAndWrites, config);
    let export = &server.export;
    let mut client = server.client(SIMPLE);
    let parked = park_the_reader(&mut client, export);

    let mut burst = Vec::new();
    let mut reads: Vec<u64> =
        (0..4u64).map(|i| client.queue_request(&mut burst, 0, p::CMD_READ, i * u64::from(LARGE), LARGE, &[])).collect();
    client.send(&burst);
    export.release(1);
    // Each of the connection's three threads reads a large read, hands the
    // reading on and waits at the gate with it. The fourth read is read by
    // whichever of them is done first. (A fourth thread would read it at
    // once, unless one of the three got to the reading before it started:
    // this test catches one most of the time, not always.)
    export.wait_entered(1 + 3);
    assert_eq!(expect_ok(client.any_reply(|_| 0)), parked);
    export.open();
    let mut answered: Vec<u64> = (0..reads.len()).map(|_| expect_ok(client.any_reply(|_| LARGE as usize))).collect();
    answered.sort_unstable();
    reads.sort_unstable();
    assert_eq!(answered, reads);
    assert_eq!(export.counters(|c| c.reading_threads.len()), 3, "the reads ran on the connection's three threads");
    assert_eq!(export.counters(|c| c.executing_max), 3);
    client.disconnect();
}

#[test]
fn disconnect_lets_requests_in_flight_finish_and_answers_them() {
    let server = GatedServer::start(Gated::ReadsAndWrites, ServerConfig::default());
    let export = &server.export;
    export.data.lock().unwrap()[..1 << 20].copy_from_slice(&pattern(3, 1 << 20));
    let mut client = server.client(STRUCTURED);
    let parked = park_the_reader(&mut client, export);

    let mut burst = Vec::new();
    let data = pattern(4, LARGE as usize);
    let reads = [
        client.queue_request(&mut burst, 0, p::CMD_READ, 0, 1 << 20, &[]),
        client.queue_request(&mut burst, 0, p::CMD_READ, 1 << 19, LARGE, &[]),
    ];
    let write = client.queue_request(&mut burst, 0, p::CMD_WRITE, 4 << 20, LARGE, &data);
    client.queue_request(&mut burst, 0, p::CMD_DISC, 0, 0, &[]);
    client.send(&burst);
    export.release(1);
    export.wait_entered(4);

    assert_eq!(expect_ok(client.any_reply(|_| 0)), parked);
    // Three requests are stuck at the gate: the connection stays open.
    client.expect_nothing_pending();
    export.open();
    let mut answered = Vec::new();
    for _ in 0..3 {
        match client.any_reply(|_| 0) {
            Reply::Chunk(chunk) => {
                let offset = u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()) as usize;
                let expected = pattern(3, 1 << 20);
                assert!(chunk.payload[8..] == expected[offset..offset + chunk.payload.len() - 8]);
                answered.push(chunk.handle);
            }
            reply => answered.push(expect_ok(reply)),
        }
    }
    answered.sort_unstable();
    let mut sent = vec![reads[0], reads[1], write];
    sent.sort_unstable();
    assert_eq!(answered, sent);
    client.close_write();
    client.expect_closed();
    assert!(export.data.lock().unwrap()[4 << 20..(4 << 20) + data.len()] == data[..]);
    assert_eq!(server.server.connection_count(), 0);
}
