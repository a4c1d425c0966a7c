//! Server lifecycle: shutdown with clients in every state, in-flight requests
//! finishing during shutdown, drop, and a panicking export.

mod common;

use std::net::TcpStream;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rewind_nbd::protocol as p;
use rewind_nbd::{
    BlockSizes, Catalog, Client, Export, ExportError, ExportListing, Extent, OpenError, OpenErrorKind, Server,
    ServerConfig, ZeroFlags,
};

/// An export whose `flush` and `read` wait until the test lets them go, and
/// whose `trim` panics (a bug in an export must cost one connection only).
struct GateExport {
    entered: Mutex<Sender<&'static str>>,
    release: Mutex<Receiver<()>>,
}

impl GateExport {
    fn pass(&self, what: &'static str) {
        self.entered.lock().unwrap().send(what).unwrap();
        self.release.lock().unwrap().recv().unwrap();
    }
}

impl Export for GateExport {
    fn size_bytes(&self) -> u64 {
        1 << 20
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::UNCONSTRAINED
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn can_multi_conn(&self) -> bool {
        false
    }
    fn can_fast_zero(&self) -> bool {
        false
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.pass("read");
        buf.fill(0x3c);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), ExportError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.pass("flush");
        Ok(())
    }
    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), ExportError> {
        panic!("export bug (deliberate, from the test)");
    }
    fn write_zeroes(&self, _offset: u64, _length: u64, _flags: ZeroFlags) -> Result<(), ExportError> {
        Ok(())
    }
    fn block_status(&self, _offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(vec![Extent { length, hole: false, zero: false }])
    }
}

/// Serves `gate` plus, for opens of `stopping`, an `Unavailable` error once the
/// test releases it.
struct GateCatalog {
    gate: Arc<GateExport>,
    open_entered: Mutex<Sender<()>>,
    open_release: Mutex<Receiver<()>>,
}

impl Catalog for GateCatalog {
    fn list(&self, _client: &Client) -> Vec<ExportListing> {
        vec![ExportListing { name: "gate".into(), description: String::new() }]
    }
    fn open(&self, name: &str, _client: &Client) -> Result<Arc<dyn Export>, OpenError> {
        match name {
            "gate" => Ok(Arc::clone(&self.gate) as Arc<dyn Export>),
            "stopping" => {
                self.open_entered.lock().unwrap().send(()).unwrap();
                self.open_release.lock().unwrap().recv().unwrap();
                Err(OpenError { kind: OpenErrorKind::Unavailable, message: "volume is closing".into() })
            }
            _ => Err(OpenError { kind: OpenErrorKind::NotFound, message: "no such export".into() }),
        }
    }
}

struct Gates {
    server: Arc<Server>,
    address: std::net::SocketAddr,
    entered: Receiver<&'static str>,
    release: Sender<()>,
    open_entered: Receiver<()>,
    open_release: Sender<()>,
}

fn gated_server() -> Gates {
    gated_server_with(ServerConfig::default())
}

fn gated_server_with(config: ServerConfig) -> Gates {
    let (entered_tx, entered) = channel();
    let (release, release_rx) = channel();
    let (open_entered_tx, open_entered) = channel();
    let (open_release, open_release_rx) = channel();
    let catalog = GateCatalog {
        gate: Arc::new(GateExport { entered: Mutex::new(entered_tx), release: Mutex::new(release_rx) }),
        open_entered: Mutex::new(open_entered_tx),
        open_release: Mutex::new(open_release_rx),
    };
    let server = Arc::new(Server::new(Arc::new(catalog), config));
    let address = server.serve_tcp("127.0.0.1:0").unwrap();
    Gates { server, address, entered, release, open_entered, open_release }
}

/// Waits (bounded) until the listener at `address` refuses connections,
/// which `shutdown` causes only after it has marked the server as stopping.
fn wait_until_refused(address: std::net::SocketAddr) {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while TcpStream::connect(address).is_ok() {
        assert!(Instant::now() < deadline, "listener still accepting after shutdown began");
        thread::yield_now();
    }
}

#[test]
fn shutdown_closes_connections_in_every_state_and_removes_the_socket() {
    let server = TestServer::start();
    let mut idle = RawClient::tcp(server.address);
    idle.connect_export(DISK, SIMPLE);
    assert_healthy(&mut idle, 1);
    let mut handshaking = RawClient::unix(&server.socket);
    handshaking.start(p::FLAG_C_FIXED_NEWSTYLE);
    let mut greeted = RawClient::tcp(server.address);
    greeted.recv(18);
    assert_eq!(server.server.connection_count(), 3);

    server.server.shutdown();

    assert_eq!(server.server.connection_count(), 0);
    idle.expect_closed();
    handshaking.expect_closed();
    greeted.expect_closed();
    assert!(!server.socket.exists(), "the Unix socket file is removed");
    assert!(TcpStream::connect(server.address).is_err(), "the TCP listener is closed");
    assert!(server.server.serve_tcp("127.0.0.1:0").is_err(), "no new listeners after shutdown");
    server.server.shutdown();
}

#[test]
fn shutdown_lets_the_in_flight_request_finish() {
    shutdown_during_a_flush(|_| {});
}

/// Shutdown shuts each socket's read side down, but Linux goes on
/// delivering what the client sends: a request that arrives once shutdown
/// has begun is not served (a client that kept sending would otherwise
/// keep the server from stopping), the one in flight is answered, and the
/// connection closes (reset, as the request's bytes were never read).
#[test]
fn requests_that_arrive_once_shutdown_began_are_not_served() {
    shutdown_during_a_flush(|client| {
        // Waits in the socket while the flush holds the reading role.
        client.send_request(0, p::CMD_WRITE, 0, 4096, &[7; 4096]);
    });
}

/// Shuts the server down while a flush is in flight, with what `meanwhile`
/// sends once shutdown has begun: the flush is answered, nothing else, and
/// the connection closes.
fn shutdown_during_a_flush(meanwhile: impl FnOnce(&mut RawClient)) {
    let gates = gated_server();
    let mut client = RawClient::tcp(gates.address);
    client.connect_export("gate", SIMPLE);
    let handle = client.send_request(0, p::CMD_FLUSH, 0, 0, &[]);
    assert_eq!(gates.entered.recv().unwrap(), "flush");

    let server = Arc::clone(&gates.server);
    let stopper = thread::spawn(move || server.shutdown());
    wait_until_refused(gates.address);
    meanwhile(&mut client);
    gates.release.send(()).unwrap();

    assert_eq!(client.simple_reply(handle), 0);
    client.expect_closed();
    stopper.join().unwrap();
    assert_eq!(gates.server.connection_count(), 0);
}

/// The first bytes of a request, then a pause past the idle timeout while
/// another request is in flight: the reader keeps what it read of the
/// magic, and the request is served once the rest comes.
#[test]
fn a_request_paused_within_its_magic_past_the_idle_timeout_is_served() {
    let idle_timeout = Duration::from_millis(200);
    let gates = gated_server_with(ServerConfig { idle_timeout: Some(idle_timeout), ..ServerConfig::default() });
    let mut client = RawClient::tcp(gates.address);
    client.connect_export("gate", SIMPLE);
    // A large read with a request behind it runs off the reading role,
    // which goes on reading: the first write, then two bytes of the second.
    let mut burst = Vec::new();
    let read = client.queue_request(&mut burst, 0, p::CMD_READ, 0, 1 << 20, &[]);
    let first = client.queue_request(&mut burst, 0, p::CMD_WRITE, 0, 4096, &[7; 4096]);
    let mut second = Vec::new();
    let handle = client.queue_request(&mut second, 0, p::CMD_WRITE, 4096, 4096, &[8; 4096]);
    burst.extend_from_slice(&second[..2]);
    client.send(&burst);
    assert_eq!(gates.entered.recv().unwrap(), "read");
    assert_eq!(client.simple_reply(first), 0);
    // The pause is what is under test: the reader's socket read times out
    // (more than once) with two bytes of the magic read.
    thread::sleep(3 * idle_timeout);
    client.send(&second[2..]);
    // Released first, so that a failure below cannot leave the read waiting.
    gates.release.send(()).unwrap();
    let mut answered = Vec::new();
    for _ in 0..2 {
        let reply = client.recv(16);
        assert_eq!(u32::from_be_bytes(reply[0..4].try_into().unwrap()), p::SIMPLE_REPLY_MAGIC);
        assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0, "no error");
        let replied = u64::from_be_bytes(reply[8..16].try_into().unwrap());
        if replied == read {
            assert_eq!(client.recv(1 << 20), vec![0x3c; 1 << 20]);
        }
        answered.push(replied);
    }
    answered.sort_unstable();
    let mut expected = vec![read, handle];
    expected.sort_unstable();
    assert_eq!(answered, expected, "the read and the second write are answered");
}

#[test]
fn pending_replies_are_sent_before_a_disconnect() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, STRUCTURED);
    // Requests and the disconnect in one burst: every reply must still arrive.
    let mut burst = Vec::new();
    for i in 0..8u64 {
        burst.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
        burst.extend_from_slice(&0u16.to_be_bytes());
        burst.extend_from_slice(&p::CMD_READ.to_be_bytes());
        burst.extend_from_slice(&(100 + i).to_be_bytes());
        burst.extend_from_slice(&(i * 512).to_be_bytes());
        burst.extend_from_slice(&512u32.to_be_bytes());
    }
    burst.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
    burst.extend_from_slice(&0u16.to_be_bytes());
    burst.extend_from_slice(&p::CMD_DISC.to_be_bytes());
    burst.extend_from_slice(&[0; 20]);
    client.send(&burst);
    let mut handles: Vec<u64> = (0..8)
        .map(|_| {
            let chunk = client.chunk();
            assert_eq!(chunk.payload.len(), 8 + 512);
            chunk.handle
        })
        .collect();
    handles.sort_unstable();
    assert_eq!(handles, (100..108).collect::<Vec<u64>>(), "one reply per request, in any order");
    client.expect_closed();
}

#[test]
fn options_during_shutdown_are_answered_with_err_shutdown() {
    let gates = gated_server();
    let mut client = RawClient::tcp(gates.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    client.send_option(p::OPT_GO, &info_data("stopping", &[]));
    gates.open_entered.recv().unwrap();

    let server = Arc::clone(&gates.server);
    let stopper = thread::spawn(move || server.shutdown());
    wait_until_refused(gates.address);
    gates.open_release.send(()).unwrap();

    let reply = client.option_reply();
    assert_eq!(reply.reply_type, p::REP_ERR_SHUTDOWN);
    assert_eq!(String::from_utf8_lossy(&reply.data), "volume is closing");
    client.expect_closed();
    stopper.join().unwrap();
}

#[test]
fn dropping_the_server_shuts_it_down() {
    let gates = gated_server();
    let mut client = RawClient::tcp(gates.address);
    client.connect_export("gate", STRUCTURED);
    let handle = client.send_request(0, p::CMD_READ, 0, 4096, &[]);
    assert_eq!(gates.entered.recv().unwrap(), "read");
    gates.release.send(()).unwrap();
    let chunk = client.chunk();
    assert_eq!((chunk.handle, chunk.payload.len()), (handle, 8 + 4096));

    let Gates { server, address, .. } = gates;
    let server = Arc::try_unwrap(server).ok().expect("only the test holds the server");
    drop(server);
    client.expect_closed();
    assert!(TcpStream::connect(address).is_err());
}

#[test]
fn a_panicking_export_costs_only_its_connection() {
    let gates = gated_server();
    let mut victim = RawClient::tcp(gates.address);
    victim.connect_export("gate", SIMPLE);
    let mut bystander = RawClient::tcp(gates.address);
    bystander.connect_export("gate", SIMPLE);
    assert_eq!(gates.server.connection_count(), 2);

    victim.send_request(0, p::CMD_TRIM, 0, 4096, &[]);
    victim.expect_closed();
    // The slot is free again once the client has seen the close.
    assert_eq!(gates.server.connection_count(), 1);

    let handle = bystander.send_request(0, p::CMD_WRITE, 0, 512, &[1; 512]);
    assert_eq!(bystander.simple_reply(handle), 0);
    let handle = bystander.send_request(0, p::CMD_BLOCK_STATUS, 0, 512, &[]);
    assert_eq!(bystander.simple_reply(handle), p::EINVAL, "no context was negotiated");
    gates.server.shutdown();
    bystander.expect_closed();
}

#[test]
fn stalled_handshake_does_not_delay_shutdown() {
    let config = ServerConfig { handshake_timeout: Duration::from_secs(3600), ..ServerConfig::default() };
    let catalog = Arc::new(TestCatalog::new());
    let server = Server::new(catalog, config);
    let address = server.serve_tcp("127.0.0.1:0").unwrap();
    let mut silent = RawClient::tcp(address);
    silent.recv(18);
    let started = Instant::now();
    server.shutdown();
    assert!(started.elapsed() < CLIENT_TIMEOUT);
    silent.expect_closed();
}
