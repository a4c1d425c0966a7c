//! Shared fixtures for the integration tests: in-memory exports, a catalog,
//! a server on an ephemeral TCP port plus a Unix socket, and a raw NBD client
//! that speaks the protocol byte by byte (so tests can also misbehave).
#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewind_nbd::protocol as p;
use rewind_nbd::{
    BlockSizes, Catalog, Client, DirtyBitmap, DirtyExtent, Export, ExportError, ExportErrorKind, ExportListing, Extent,
    OpenError, OpenErrorKind, Server, ServerConfig, ZeroFlags,
};

/// Granularity at which the sparse export tracks what was written.
pub const SPARSE_BLOCK_BYTES: u64 = 4096;

/// How block status is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Everything is data.
    Dense,
    /// Never-written (or trimmed/zeroed) 4 KiB blocks are holes that read as zeros.
    Sparse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

/// A byte vector behind a mutex, optionally tracking written blocks.
pub struct MemExport {
    data: Mutex<Vec<u8>>,
    written: Mutex<Vec<bool>>,
    access: Access,
    allocation: Allocation,
    description: String,
    pub flushes: AtomicU64,
    pub writes: AtomicU64,
}

impl MemExport {
    pub fn new(size: usize, access: Access, allocation: Allocation, description: &str) -> Self {
        let blocks = (size as u64).div_ceil(SPARSE_BLOCK_BYTES) as usize;
        MemExport {
            data: Mutex::new(vec![0; size]),
            written: Mutex::new(vec![allocation == Allocation::Dense; blocks]),
            access,
            allocation,
            description: description.to_owned(),
            flushes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// Fills the export with a recognisable pattern (byte i = i*7 mod 251).
    pub fn with_pattern(self) -> Self {
        for (i, byte) in self.data.lock().unwrap().iter_mut().enumerate() {
            *byte = (i * 7 % 251) as u8;
        }
        self.written.lock().unwrap().fill(true);
        self
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }

    pub fn set_contents(&self, offset: usize, bytes: &[u8]) {
        self.data.lock().unwrap()[offset..offset + bytes.len()].copy_from_slice(bytes);
        self.mark(offset as u64, bytes.len() as u64, true);
    }

    fn check(&self, offset: u64, length: u64) {
        let size = self.data.lock().unwrap().len() as u64;
        assert!(length > 0 && offset + length <= size, "server passed an invalid range");
    }

    fn check_writable(&self) -> Result<(), ExportError> {
        match self.access {
            Access::ReadWrite => Ok(()),
            // The server must have refused this already.
            Access::ReadOnly => panic!("server let a write through to a read-only export"),
        }
    }

    /// Marks whole blocks inside the range (partially covered blocks count as
    /// written when data is written, and stay as they were when zeroed).
    fn mark(&self, offset: u64, length: u64, written: bool) {
        let mut map = self.written.lock().unwrap();
        if written {
            let first = offset / SPARSE_BLOCK_BYTES;
            let last = (offset + length).div_ceil(SPARSE_BLOCK_BYTES);
            map[first as usize..last as usize].fill(true);
        } else if self.allocation == Allocation::Sparse {
            let first = offset.div_ceil(SPARSE_BLOCK_BYTES);
            let last = (offset + length) / SPARSE_BLOCK_BYTES;
            if first < last {
                map[first as usize..last as usize].fill(false);
            }
        }
    }
}

impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::UNCONSTRAINED
    }
    fn is_read_only(&self) -> bool {
        self.access == Access::ReadOnly
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    fn can_fast_zero(&self) -> bool {
        self.allocation == Allocation::Sparse
    }
    fn description(&self) -> String {
        self.description.clone()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64);
        let data = self.data.lock().unwrap();
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64);
        self.check_writable()?;
        self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.mark(offset, data.len() as u64, true);
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), ExportError> {
        self.check(offset, length);
        self.check_writable()?;
        // Trim may discard; we zero so that reads are predictable in tests.
        self.data.lock().unwrap()[offset as usize..(offset + length) as usize].fill(0);
        self.mark(offset, length, false);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), ExportError> {
        self.check(offset, length);
        self.check_writable()?;
        if flags.fast && !self.can_fast_zero() {
            return Err(ExportError::new(ExportErrorKind::NotSupported, "zeroing is slow here"));
        }
        self.data.lock().unwrap()[offset as usize..(offset + length) as usize].fill(0);
        self.mark(offset, length, flags.no_hole);
        Ok(())
    }

    /// A sparse export lists the dirty bitmap `since-start` and selects any
    /// `since-…`: each marks dirty the blocks written when it is opened.
    fn dirty_bitmaps(&self) -> Vec<String> {
        match self.allocation {
            Allocation::Sparse => vec![SINCE_START.to_owned()],
            Allocation::Dense => Vec::new(),
        }
    }

    fn dirty_bitmap(&self, leaf: &str) -> Option<Arc<dyn DirtyBitmap>> {
        if self.allocation == Allocation::Dense || !leaf.starts_with("since-") {
            return None;
        }
        let size = self.size_bytes();
        Some(Arc::new(WrittenBlocks { size, written: self.written.lock().unwrap().clone() }))
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        let runs = written_extents(&self.written.lock().unwrap(), offset, length, self.size_bytes());
        Ok(runs.into_iter().map(|(length, written)| Extent { length, hole: !written, zero: !written }).collect())
    }
}

/// The dirty bitmap a sparse export lists.
pub const SINCE_START: &str = "since-start";

/// A dirty bitmap of the blocks written when it was opened.
struct WrittenBlocks {
    size: u64,
    written: Vec<bool>,
}

impl DirtyBitmap for WrittenBlocks {
    fn extents(&self, offset: u64, length: u64) -> Result<Vec<DirtyExtent>, ExportError> {
        let extents = written_extents(&self.written, offset, length, self.size);
        Ok(extents.into_iter().map(|(length, dirty)| DirtyExtent { length, dirty }).collect())
    }
}

/// `(length, written)` runs of the range in a map of written blocks.
fn written_extents(map: &[bool], offset: u64, length: u64, size: u64) -> Vec<(u64, bool)> {
    assert!(length > 0 && offset + length <= size, "server passed an invalid range");
    let end = offset + length;
    let mut extents: Vec<(u64, bool)> = Vec::new();
    let mut position = offset;
    while position < end {
        let block = position / SPARSE_BLOCK_BYTES;
        let block_end = ((block + 1) * SPARSE_BLOCK_BYTES).min(end);
        let written = map[block as usize];
        let piece = block_end - position;
        match extents.last_mut() {
            Some(last) if last.1 == written => last.0 += piece,
            _ => extents.push((piece, written)),
        }
        position = block_end;
    }
    extents
}

/// Export names in the test catalog.
pub const DISK: &str = "disk";
pub const READ_ONLY: &str = "ro";
pub const SPARSE: &str = "sparse";
/// Opening this fails with the message below (a view before history starts).
pub const TOO_OLD: &str = "db@2026-11-22T10:00:00Z";
pub const TOO_OLD_MESSAGE: &str = "volume 'db' has no history before 2026-11-22T10:00:00Z";

pub const DISK_BYTES: usize = 16 << 20;
pub const READ_ONLY_BYTES: usize = 4 << 20;
pub const SPARSE_BYTES: usize = 8 << 20;

pub struct TestCatalog {
    pub exports: BTreeMap<String, Arc<MemExport>>,
}

impl TestCatalog {
    pub fn new() -> Self {
        let mut exports = BTreeMap::new();
        exports.insert(
            DISK.to_owned(),
            Arc::new(MemExport::new(DISK_BYTES, Access::ReadWrite, Allocation::Dense, "scratch disk")),
        );
        exports.insert(
            READ_ONLY.to_owned(),
            Arc::new(
                MemExport::new(READ_ONLY_BYTES, Access::ReadOnly, Allocation::Dense, "frozen view").with_pattern(),
            ),
        );
        exports.insert(
            SPARSE.to_owned(),
            Arc::new(MemExport::new(SPARSE_BYTES, Access::ReadWrite, Allocation::Sparse, "thin disk")),
        );
        TestCatalog { exports }
    }

    pub fn export(&self, name: &str) -> &Arc<MemExport> {
        &self.exports[name]
    }
}

impl Catalog for TestCatalog {
    fn list(&self, _client: &Client) -> Vec<ExportListing> {
        self.exports
            .iter()
            .map(|(name, export)| ExportListing { name: name.clone(), description: export.description.clone() })
            .collect()
    }

    fn open(&self, name: &str, _client: &Client) -> Result<Arc<dyn Export>, OpenError> {
        if name == TOO_OLD {
            return Err(OpenError { kind: OpenErrorKind::BadName, message: TOO_OLD_MESSAGE.into() });
        }
        match self.exports.get(name) {
            Some(export) => Ok(Arc::clone(export) as Arc<dyn Export>),
            None => Err(OpenError { kind: OpenErrorKind::NotFound, message: format!("no export named '{name}'") }),
        }
    }
}

/// A server on 127.0.0.1:0 and a Unix socket in a temporary directory.
pub struct TestServer {
    pub server: Server,
    pub catalog: Arc<TestCatalog>,
    pub address: SocketAddr,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start() -> Self {
        Self::with_config(ServerConfig::default())
    }

    pub fn with_config(config: ServerConfig) -> Self {
        let catalog = Arc::new(TestCatalog::new());
        let server = Server::new(Arc::clone(&catalog) as Arc<dyn Catalog>, config);
        let address = server.serve_tcp("127.0.0.1:0").expect("bind TCP");
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("nbd.sock");
        server.serve_unix(&socket).expect("bind Unix socket");
        TestServer { server, catalog, address, socket, _dir: dir }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.address, export)
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{}?socket={}", export, self.socket.display())
    }

    pub fn export(&self, name: &str) -> &Arc<MemExport> {
        self.catalog.export(name)
    }
}

/// How long a raw client waits for any reply before failing the test, so a
/// server bug shows up as a failure rather than a hung test run.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub flags: u16,
    pub reply_type: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

impl Chunk {
    /// (errno, message) of an error chunk.
    pub fn error(&self) -> (u32, String) {
        assert!(self.reply_type & 0x8000 != 0, "not an error chunk: {self:?}");
        let errno = u32::from_be_bytes(self.payload[0..4].try_into().unwrap());
        let length = u16::from_be_bytes(self.payload[4..6].try_into().unwrap()) as usize;
        (errno, String::from_utf8(self.payload[6..6 + length].to_vec()).unwrap())
    }
}

/// A reply to some request, as `RawClient::any_reply` read it.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Error field (0 for success) and, for a successful READ, the data.
    Simple {
        handle: u64,
        errno: u32,
        data: Vec<u8>,
    },
    Chunk(Chunk),
}

impl Reply {
    pub fn handle(&self) -> u64 {
        match self {
            Reply::Simple { handle, .. } => *handle,
            Reply::Chunk(chunk) => chunk.handle,
        }
    }
}

/// What a raw client negotiates before entering transmission.
#[derive(Clone, Copy, Debug)]
pub struct Negotiate {
    pub structured: bool,
    pub base_allocation: bool,
}

pub const SIMPLE: Negotiate = Negotiate { structured: false, base_allocation: false };
pub const STRUCTURED: Negotiate = Negotiate { structured: true, base_allocation: true };

/// A client that writes protocol bytes by hand.
pub struct RawClient {
    pub stream: Stream,
    next_handle: u64,
}

impl RawClient {
    pub fn tcp(address: SocketAddr) -> Self {
        Self::from_tcp(TcpStream::connect(address).expect("connect"))
    }

    /// A client on a connection made elsewhere.
    pub fn from_tcp(stream: TcpStream) -> Self {
        stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        RawClient { stream: Stream::Tcp(stream), next_handle: 1 }
    }

    /// Connects from a chosen local address, such as 127.0.0.2: every
    /// 127.0.0.0/8 address is this host, and to the server another client.
    pub fn tcp_from(local: std::net::IpAddr, address: SocketAddr) -> Self {
        use rustix::net::{bind, connect, socket, AddressFamily, SocketType};
        let family = if local.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
        let socket = socket(family, SocketType::STREAM, None).expect("socket");
        bind(&socket, &SocketAddr::new(local, 0)).expect("bind the client's address");
        connect(&socket, &address).expect("connect");
        let stream = TcpStream::from(socket);
        stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        RawClient { stream: Stream::Tcp(stream), next_handle: 1 }
    }

    pub fn unix(path: &std::path::Path) -> Self {
        let stream = UnixStream::connect(path).expect("connect");
        stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        RawClient { stream: Stream::Unix(stream), next_handle: 1 }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        self.stream.read_exact(&mut buf).expect("receive");
        buf
    }

    /// Half-closes our side; the server then sees end-of-file.
    pub fn close_write(&mut self) {
        match &self.stream {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write).unwrap(),
            Stream::Unix(s) => s.shutdown(Shutdown::Write).unwrap(),
        }
    }

    /// Asserts the server closed the connection: the next read sees end of
    /// file (or a reset) rather than data or a timeout.
    pub fn expect_closed(&mut self) {
        let mut buf = [0u8; 1];
        match self.stream.read(&mut buf) {
            Ok(0) => {}
            Ok(_) => panic!("expected the server to close the connection, got data"),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("expected the server to close the connection, got {e}"),
        }
    }

    /// Asserts the server refuses this connection the NBD way: a greeting,
    /// then `NBD_REP_ERR_POLICY` with a message for an option, and an ACK for
    /// `NBD_OPT_ABORT`, after which it closes. Returns the message.
    pub fn expect_refused(&mut self) -> String {
        self.start(p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES);
        let replies = self.option(p::OPT_GO, &info_data(DISK, &[]));
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].reply_type, p::REP_ERR_POLICY);
        let message = String::from_utf8(replies[0].data.clone()).expect("a UTF-8 message");
        assert_eq!(self.option(p::OPT_ABORT, &[])[0].reply_type, p::REP_ACK);
        self.expect_closed();
        message
    }

    /// Reads the greeting and sends client flags.
    pub fn start(&mut self, client_flags: u32) {
        let greeting = self.recv(18);
        assert_eq!(&greeting[0..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([greeting[16], greeting[17]]), 3);
        self.send(&client_flags.to_be_bytes());
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut message = b"IHAVEOPT".to_vec();
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.send(&message);
    }

    pub fn option_reply(&mut self) -> OptionReply {
        let header = self.recv(20);
        assert_eq!(u64::from_be_bytes(header[0..8].try_into().unwrap()), p::OPTION_REPLY_MAGIC);
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        OptionReply { option, reply_type, data: self.recv(length) }
    }

    /// Sends an option and collects replies up to the final one (ACK or error).
    pub fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptionReply> {
        self.send_option(option, data);
        let mut replies = Vec::new();
        loop {
            let reply = self.option_reply();
            assert_eq!(reply.option, option);
            let last = reply.reply_type == p::REP_ACK || reply.reply_type & 0x8000_0000 != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// Full handshake into transmission with NBD_OPT_GO; returns (size, flags).
    pub fn connect_export(&mut self, name: &str, negotiate: Negotiate) -> (u64, u16) {
        self.start(p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES);
        if negotiate.structured {
            let replies = self.option(p::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(replies[0].reply_type, p::REP_ACK);
        }
        if negotiate.base_allocation {
            let replies = self.option(p::OPT_SET_META_CONTEXT, &meta_data(name, &[p::META_BASE_ALLOCATION]));
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].reply_type, p::REP_META_CONTEXT);
        }
        let replies = self.option(p::OPT_GO, &info_data(name, &[]));
        let last = replies.last().unwrap();
        assert_eq!(last.reply_type, p::REP_ACK, "GO failed: {replies:?}");
        let export =
            replies.iter().find(|r| r.reply_type == p::REP_INFO && r.data[0..2] == [0, 0]).expect("NBD_INFO_EXPORT");
        let size = u64::from_be_bytes(export.data[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(export.data[10..12].try_into().unwrap());
        (size, flags)
    }

    pub fn send_request(&mut self, flags: u16, command: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        let mut message = Vec::with_capacity(28 + payload.len());
        let handle = self.queue_request(&mut message, flags, command, offset, length, payload);
        self.send(&message);
        handle
    }

    /// Appends a request to `burst` instead of sending it, so that several
    /// can go out in one `write`; returns its handle.
    pub fn queue_request(
        &mut self,
        burst: &mut Vec<u8>,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        burst.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
        burst.extend_from_slice(&flags.to_be_bytes());
        burst.extend_from_slice(&command.to_be_bytes());
        burst.extend_from_slice(&handle.to_be_bytes());
        burst.extend_from_slice(&offset.to_be_bytes());
        burst.extend_from_slice(&length.to_be_bytes());
        burst.extend_from_slice(payload);
        handle
    }

    /// A second handle on the connection, for a thread that sends while
    /// this one reads.
    pub fn sender(&self) -> Stream {
        match &self.stream {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone().unwrap()),
            Stream::Unix(s) => Stream::Unix(s.try_clone().unwrap()),
        }
    }

    /// Asserts that no reply (and no end-of-file) is waiting to be read
    /// right now.
    pub fn expect_nothing_pending(&mut self) {
        self.set_nonblocking(true);
        let mut byte = [0u8; 1];
        let result = self.stream.read(&mut byte);
        self.set_nonblocking(false);
        match result {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(0) => panic!("the server closed the connection"),
            Ok(_) => panic!("a reply arrived that must not have been sent yet"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    fn set_nonblocking(&self, nonblocking: bool) {
        match &self.stream {
            Stream::Tcp(s) => s.set_nonblocking(nonblocking).unwrap(),
            Stream::Unix(s) => s.set_nonblocking(nonblocking).unwrap(),
        }
    }

    /// Reads a simple reply for `handle`, returning its error field.
    pub fn simple_reply(&mut self, handle: u64) -> u32 {
        let reply = self.recv(16);
        assert_eq!(u32::from_be_bytes(reply[0..4].try_into().unwrap()), p::SIMPLE_REPLY_MAGIC);
        assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), handle);
        u32::from_be_bytes(reply[4..8].try_into().unwrap())
    }

    pub fn chunk(&mut self) -> Chunk {
        let header = self.recv(20);
        assert_eq!(u32::from_be_bytes(header[0..4].try_into().unwrap()), p::STRUCTURED_REPLY_MAGIC);
        let flags = u16::from_be_bytes(header[4..6].try_into().unwrap());
        let reply_type = u16::from_be_bytes(header[6..8].try_into().unwrap());
        let handle = u64::from_be_bytes(header[8..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        Chunk { flags, reply_type, handle, payload: self.recv(length) }
    }

    /// Reads the next reply, whichever request it answers (replies to
    /// pipelined requests may come in any order). `read_length(handle)` is
    /// the number of data bytes after a successful simple reply: the length
    /// of a READ on a simple-reply connection, 0 for anything else.
    pub fn any_reply(&mut self, read_length: impl Fn(u64) -> usize) -> Reply {
        let magic = self.recv(4);
        let magic = u32::from_be_bytes(magic.try_into().unwrap());
        if magic == p::STRUCTURED_REPLY_MAGIC {
            let header = self.recv(16);
            let flags = u16::from_be_bytes(header[0..2].try_into().unwrap());
            let reply_type = u16::from_be_bytes(header[2..4].try_into().unwrap());
            let handle = u64::from_be_bytes(header[4..12].try_into().unwrap());
            let length = u32::from_be_bytes(header[12..16].try_into().unwrap()) as usize;
            return Reply::Chunk(Chunk { flags, reply_type, handle, payload: self.recv(length) });
        }
        assert_eq!(magic, p::SIMPLE_REPLY_MAGIC, "not a reply");
        let header = self.recv(12);
        let errno = u32::from_be_bytes(header[0..4].try_into().unwrap());
        let handle = u64::from_be_bytes(header[4..12].try_into().unwrap());
        let data = if errno == 0 { self.recv(read_length(handle)) } else { Vec::new() };
        Reply::Simple { handle, errno, data }
    }

    /// Writes with simple replies expected; returns the error field.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        let handle = self.send_request(0, p::CMD_WRITE, offset, data.len() as u32, data);
        self.simple_reply(handle)
    }

    /// Reads on a simple-reply connection; Err(errno) on failure.
    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let handle = self.send_request(0, p::CMD_READ, offset, length, &[]);
        match self.simple_reply(handle) {
            0 => Ok(self.recv(length as usize)),
            errno => Err(errno),
        }
    }

    /// Reads on a structured-reply connection.
    pub fn read_structured(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, (u32, String)> {
        let handle = self.send_request(0, p::CMD_READ, offset, length, &[]);
        let chunk = self.chunk();
        assert_eq!(chunk.handle, handle);
        assert_eq!(chunk.flags & p::REPLY_FLAG_DONE, p::REPLY_FLAG_DONE);
        match chunk.reply_type {
            p::REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), offset);
                Ok(chunk.payload[8..].to_vec())
            }
            p::REPLY_TYPE_ERROR => Err(chunk.error()),
            other => panic!("unexpected chunk type {other}"),
        }
    }

    pub fn disconnect(mut self) {
        self.send_request(0, p::CMD_DISC, 0, 0, &[]);
        self.close_write();
        self.expect_closed();
    }
}

/// `NBD_OPT_INFO`/`GO` payload.
pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}

/// `NBD_OPT_{LIST,SET}_META_CONTEXT` payload.
pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// Deterministic test data: different for each seed and offset.
pub fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

/// A well-behaved client that writes and reads back through `server`,
/// proving it still serves correctly while another client misbehaves.
pub fn assert_healthy(client: &mut RawClient, seed: u8) {
    let offset = 1 << 20;
    let data = pattern(seed, 64 * 1024);
    assert_eq!(client.write(offset, &data), 0);
    assert_eq!(client.read(offset, data.len() as u32).unwrap(), data);
}
