//! The proxy's side of the upstream server: TCP connections that carry
//! clients' calls through unchanged but for their handles, and the calls the
//! proxy makes itself (MOUNT, and the reads that bring the mirror up to
//! date). Replies are read with the same bounded decoding as calls: the
//! upstream is the operator's server, but a reply still only gets the
//! memory its record holds.

use std::io::{self, BufReader, IoSlice, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rewind_tree::FileKind;
use rewind_types::Timestamp;

use crate::args::{self, FH_BYTES_MAX, NAME_BYTES_MAX, PATH_BYTES_MAX};
use crate::rpc::RECORD_BYTES_MAX;
use crate::xdr::{Garbage, XdrReader};

const LAST_FRAGMENT: u32 = 1 << 31;
const PORTMAP_PROGRAM: u32 = 100_000;
const PORTMAP_PORT: u16 = 111;
const MOUNT_PROGRAM: u32 = 100_005;
pub const NFS_PROGRAM: u32 = 100_003;
/// Entries and bytes the proxy asks for per READDIRPLUS of its own.
const LISTING_BYTES: u32 = 32 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream NFS server: {0}")]
    Io(#[from] io::Error),
    #[error("upstream NFS server sent a reply that does not decode: {0}")]
    Garbage(String),
    #[error("upstream NFS server refused the call (RPC accept status {0})")]
    Refused(u32),
    #[error("upstream NFS server answered NFS status {0}")]
    Status(u32),
    #[error("upstream MOUNT of {path:?} failed with status {status}")]
    Mount { path: String, status: u32 },
    #[error(
        "the upstream's MOUNT service is not at {address} (RPC accept status {stat}): give its port with \
         --upstream-mount-port (the portmapper did not say)"
    )]
    NoMount { address: SocketAddr, stat: u32 },
}

impl From<Garbage> for UpstreamError {
    fn from(Garbage(reason): Garbage) -> Self {
        UpstreamError::Garbage(reason)
    }
}

/// Where the upstream server is.
#[derive(Clone, Debug)]
pub struct UpstreamAddress {
    pub nfs: SocketAddr,
    pub mount: SocketAddr,
}

impl UpstreamAddress {
    /// The NFS address, and MOUNT's port: `mount_port` if given, else what
    /// the upstream host's portmapper says, else the NFS port (servers that
    /// share it, as Rewind's does).
    pub fn resolve(nfs: &str, mount_port: Option<u16>) -> Result<UpstreamAddress, UpstreamError> {
        let nfs = nfs
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| UpstreamError::Io(io::Error::new(io::ErrorKind::NotFound, format!("{nfs}: no address"))))?;
        let port = match mount_port {
            Some(port) => port,
            None => portmap_mount_port(nfs).unwrap_or(nfs.port()),
        };
        Ok(UpstreamAddress { nfs, mount: SocketAddr::new(nfs.ip(), port) })
    }
}

/// Asks the portmapper (RFC 1833 v2 GETPORT) where MOUNT v3 over TCP is.
fn portmap_mount_port(nfs: SocketAddr) -> Option<u16> {
    let mut connection = Connection::connect(SocketAddr::new(nfs.ip(), PORTMAP_PORT)).ok()?;
    let mut arguments = Vec::new();
    for word in [MOUNT_PROGRAM, 3, 6, 0] {
        arguments.extend_from_slice(&word.to_be_bytes());
    }
    let reply = connection.call(PORTMAP_PROGRAM, 2, 3, &arguments).ok()?;
    let port = results(&reply).ok()?.u32().ok()?;
    u16::try_from(port).ok().filter(|&port| port != 0)
}

static XID: AtomicU32 = AtomicU32::new(1);

/// The credentials of the proxy's own calls: AUTH_SYS as root (it reads
/// everything to keep the mirror whole, as a backup tool does).
fn own_call_header(program: u32, version: u32, procedure: u32) -> Vec<u8> {
    let xid = XID.fetch_add(1, Ordering::Relaxed) | 0x8000_0000;
    let mut header = Vec::with_capacity(64);
    for word in [xid, 0, 2, program, version, procedure, 1, 28, 0, 6] {
        header.extend_from_slice(&word.to_be_bytes());
    }
    header.extend_from_slice(b"rewind\0\0");
    for word in [0u32, 0, 0, 0, 0] {
        header.extend_from_slice(&word.to_be_bytes());
    }
    header
}

/// The results of an accepted, successful reply.
pub fn results(reply: &[u8]) -> Result<XdrReader<'_>, UpstreamError> {
    let mut reader = XdrReader::new(reply);
    let _xid = reader.u32()?;
    if reader.u32()? != 1 {
        return Err(UpstreamError::Garbage("a call where a reply should be".into()));
    }
    if reader.u32()? != 0 {
        return Err(UpstreamError::Refused(u32::MAX));
    }
    reader.u32()?;
    reader.opaque(400, "reply verifier")?;
    match reader.u32()? {
        0 => Ok(reader),
        stat => Err(UpstreamError::Refused(stat)),
    }
}

/// One connection to the upstream: one call at a time, in order.
pub struct Connection {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Connection {
    pub fn connect(address: SocketAddr) -> io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&address, IO_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Connection { writer: stream.try_clone()?, reader: BufReader::with_capacity(64 << 10, stream) })
    }

    /// Sends a call made of `parts` as one record (gathered, not copied) and
    /// reads its reply into `reply`, after `reserved` bytes kept at its
    /// start (room for the record mark of the reply passed on).
    pub fn exchange(&mut self, parts: &[&[u8]], reply: &mut Vec<u8>, reserved: usize) -> io::Result<()> {
        self.exchange_doing(parts, reply, reserved, || {})
    }

    /// As [`Connection::exchange`], doing `meanwhile` once the call is sent,
    /// while the upstream works on it.
    pub fn exchange_doing(
        &mut self,
        parts: &[&[u8]],
        reply: &mut Vec<u8>,
        reserved: usize,
        meanwhile: impl FnOnce(),
    ) -> io::Result<()> {
        let length: usize = parts.iter().map(|part| part.len()).sum();
        assert!(length < LAST_FRAGMENT as usize);
        let mark = (LAST_FRAGMENT | length as u32).to_be_bytes();
        let mut slices: Vec<IoSlice<'_>> =
            std::iter::once(&mark[..]).chain(parts.iter().copied()).map(IoSlice::new).collect();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let written = self.writer.write_vectored(slices)?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut slices, written);
        }
        meanwhile();
        reply.truncate(reserved);
        reply.resize(reserved, 0);
        read_record_after(&mut self.reader, reply)
    }

    /// One call of the proxy's own, with root's credentials.
    fn call(&mut self, program: u32, version: u32, procedure: u32, arguments: &[u8]) -> Result<Vec<u8>, UpstreamError> {
        let header = own_call_header(program, version, procedure);
        let mut reply = Vec::new();
        self.exchange(&[&header, arguments], &mut reply, 0)?;
        Ok(reply)
    }
}

/// Whether an error is the peer having closed the connection.
fn closed_meanwhile(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset)
}

/// Reads one record, appending it to `record`: like `rpc::read_record`,
/// bounded the same way.
fn read_record_after(stream: &mut impl io::Read, record: &mut Vec<u8>) -> io::Result<()> {
    let start = record.len();
    loop {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header)?;
        let header = u32::from_be_bytes(header);
        let length = (header & !LAST_FRAGMENT) as usize;
        let at = record.len();
        if at - start + length > RECORD_BYTES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "an upstream reply larger than a record may be"));
        }
        record.resize(at + length, 0);
        stream.read_exact(&mut record[at..])?;
        if header & LAST_FRAGMENT != 0 {
            return Ok(());
        }
    }
}

/// How long a connection to the upstream that no call needs is kept for
/// reuse: through the pauses of a steady load, not after a burst is over.
pub const IDLE_KEEP: Duration = Duration::from_secs(30);

/// Connections to the upstream kept for reuse: one per call in flight. A
/// burst of concurrent calls opens as many; those idle for longer than
/// `idle_keep` are closed at the next call, so the upstream is not left
/// holding a burst's connections (and their memory) for good.
pub struct Pool {
    pub address: UpstreamAddress,
    idle_keep: Duration,
    /// Each with the time it was put back; most recently used last, so the
    /// front is the longest idle (calls take from the back).
    idle: Mutex<Vec<(Connection, Instant)>>,
}

impl Pool {
    pub fn new(address: UpstreamAddress, idle_keep: Duration) -> Pool {
        Pool { address, idle_keep, idle: Mutex::new(Vec::new()) }
    }

    /// Runs `work` on a connection; one that failed is not reused. A kept
    /// connection the upstream has closed meanwhile (servers close idle
    /// ones) is replaced and the work tried once more on a new one.
    pub fn with<T>(
        &self,
        mut work: impl FnMut(&mut Connection) -> Result<T, UpstreamError>,
    ) -> Result<T, UpstreamError> {
        let idle = self.idle.lock().pop();
        let (mut connection, reused) = match idle {
            Some((connection, _)) => (connection, true),
            None => (Connection::connect(self.address.nfs)?, false),
        };
        let mut result = work(&mut connection);
        if reused && matches!(&result, Err(UpstreamError::Io(error)) if closed_meanwhile(error)) {
            connection = Connection::connect(self.address.nfs)?;
            result = work(&mut connection);
        }
        if !matches!(result, Err(UpstreamError::Io(_))) {
            self.put_back(connection);
        }
        result
    }

    /// Keeps `connection` for the next call, and closes the ones idle for
    /// longer than `idle_keep`.
    fn put_back(&self, connection: Connection) {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        debug_assert!(idle.windows(2).all(|pair| pair[0].1 <= pair[1].1), "idle connections in the order put back");
        let stale = idle.partition_point(|(_, since)| now.duration_since(*since) > self.idle_keep);
        let closing: Vec<_> = idle.drain(..stale).collect();
        idle.push((connection, now));
        drop(idle);
        if !closing.is_empty() {
            tracing::debug!(count = closing.len(), "closing upstream connections no call needed lately");
        }
    }

    fn nfs(&self, procedure: u32, arguments: &[u8]) -> Result<Vec<u8>, UpstreamError> {
        self.with(|connection| connection.call(NFS_PROGRAM, 3, procedure, arguments))
    }

    /// One call to the upstream's MOUNT service.
    fn mount_call(&self, procedure: u32, arguments: &[u8]) -> Result<Vec<u8>, UpstreamError> {
        let mut connection = Connection::connect(self.address.mount)?;
        let reply = connection.call(MOUNT_PROGRAM, 3, procedure, arguments)?;
        match results(&reply) {
            Err(UpstreamError::Refused(stat)) => Err(UpstreamError::NoMount { address: self.address.mount, stat }),
            Err(error) => Err(error),
            Ok(_) => Ok(reply),
        }
    }

    /// MOUNT `path`: the export's root handle.
    pub fn mount(&self, path: &str) -> Result<Vec<u8>, UpstreamError> {
        let reply = self.mount_call(1, &opaque(path.as_bytes()))?;
        let mut reader = results(&reply)?;
        match reader.u32()? {
            0 => Ok(args::handle(&mut reader)?.to_vec()),
            status => Err(UpstreamError::Mount { path: path.into(), status }),
        }
    }

    /// MOUNT's EXPORT: the paths the upstream exports.
    pub fn exports(&self) -> Result<Vec<String>, UpstreamError> {
        let reply = self.mount_call(5, &[])?;
        let mut reader = results(&reply)?;
        let mut exports = Vec::new();
        while reader.bool()? {
            exports.push(String::from_utf8_lossy(reader.opaque(PATH_BYTES_MAX, "export")?).into_owned());
            while reader.bool()? {
                reader.opaque(PATH_BYTES_MAX, "group")?;
            }
        }
        Ok(exports)
    }

    pub fn getattr(&self, fh: &[u8]) -> Result<Fattr, UpstreamError> {
        let reply = self.nfs(1, &opaque(fh))?;
        let mut reader = nfs_results(&reply)?;
        Ok(Fattr::decode(&mut reader)?)
    }

    /// A whole directory: (name, handle, attributes) of each entry but "."
    /// and "..". Entries the upstream sends without a handle or attributes
    /// are looked up.
    pub fn list(&self, dir: &[u8]) -> Result<Vec<Entry>, UpstreamError> {
        let (mut cookie, mut verifier) = (0u64, [0u8; 8]);
        let mut entries = Vec::new();
        loop {
            let mut arguments = opaque(dir);
            arguments.extend_from_slice(&cookie.to_be_bytes());
            arguments.extend_from_slice(&verifier);
            arguments.extend_from_slice(&LISTING_BYTES.to_be_bytes());
            arguments.extend_from_slice(&(LISTING_BYTES * 4).to_be_bytes());
            let reply = self.nfs(17, &arguments)?;
            let mut reader = nfs_results(&reply)?;
            skip_post_op_attr(&mut reader)?;
            verifier = reader.fixed::<8>("cookie verifier")?;
            while reader.bool()? {
                let _fileid = reader.u64()?;
                let name = reader.opaque(NAME_BYTES_MAX, "name")?.to_vec();
                cookie = reader.u64()?;
                let attributes = reader.bool()?.then(|| Fattr::decode(&mut reader)).transpose()?;
                let fh = reader.bool()?.then(|| args::handle(&mut reader)).transpose()?.map(<[u8]>::to_vec);
                if name == b"." || name == b".." {
                    continue;
                }
                let (fh, attributes) = match (fh, attributes) {
                    (Some(fh), Some(attributes)) => (fh, attributes),
                    _ => self.lookup(dir, &name)?,
                };
                entries.push(Entry { name, fh, attributes });
            }
            if reader.bool()? {
                return Ok(entries);
            }
        }
    }

    pub fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<(Vec<u8>, Fattr), UpstreamError> {
        let mut arguments = opaque(dir);
        arguments.extend_from_slice(&opaque(name));
        let reply = self.nfs(3, &arguments)?;
        let mut reader = nfs_results(&reply)?;
        let fh = args::handle(&mut reader)?.to_vec();
        let attributes = match reader.bool()? {
            true => Fattr::decode(&mut reader)?,
            false => self.getattr(&fh)?,
        };
        Ok((fh, attributes))
    }

    /// Up to `count` bytes at `offset`, and whether the file ends there.
    pub fn read(&self, fh: &[u8], offset: u64, count: u32) -> Result<(Vec<u8>, bool), UpstreamError> {
        let mut arguments = opaque(fh);
        arguments.extend_from_slice(&offset.to_be_bytes());
        arguments.extend_from_slice(&count.to_be_bytes());
        let reply = self.nfs(6, &arguments)?;
        let mut reader = nfs_results(&reply)?;
        skip_post_op_attr(&mut reader)?;
        let _count = reader.u32()?;
        let eof = reader.bool()?;
        Ok((reader.opaque(RECORD_BYTES_MAX, "data")?.to_vec(), eof))
    }

    pub fn readlink(&self, fh: &[u8]) -> Result<Vec<u8>, UpstreamError> {
        let reply = self.nfs(5, &opaque(fh))?;
        let mut reader = nfs_results(&reply)?;
        skip_post_op_attr(&mut reader)?;
        Ok(reader.opaque(PATH_BYTES_MAX, "symlink target")?.to_vec())
    }
}

/// The results of an NFS reply whose status is NFS3_OK.
fn nfs_results(reply: &[u8]) -> Result<XdrReader<'_>, UpstreamError> {
    let mut reader = results(reply)?;
    match reader.u32()? {
        0 => Ok(reader),
        status => Err(UpstreamError::Status(status)),
    }
}

/// XDR opaque: length, bytes, padding.
pub fn opaque(bytes: &[u8]) -> Vec<u8> {
    let mut encoded = (bytes.len() as u32).to_be_bytes().to_vec();
    encoded.extend_from_slice(bytes);
    encoded.resize(4 + bytes.len().next_multiple_of(4), 0);
    encoded
}

/// A name in an upstream directory.
pub struct Entry {
    pub name: Vec<u8>,
    pub fh: Vec<u8>,
    pub attributes: Fattr,
}

/// `fattr3`, as the proxy uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fattr {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: (u32, u32),
    pub fileid: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
}

impl Fattr {
    pub fn decode(reader: &mut XdrReader<'_>) -> Result<Fattr, Garbage> {
        let kind = match reader.u32()? {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::BlockDevice,
            4 => FileKind::CharDevice,
            5 => FileKind::Symlink,
            6 => FileKind::Socket,
            7 => FileKind::Fifo,
            other => return Err(Garbage(format!("file type {other}"))),
        };
        let mode = reader.u32()? & 0o7777;
        let _nlink = reader.u32()?;
        let (uid, gid) = (reader.u32()?, reader.u32()?);
        let size = reader.u64()?;
        let _used = reader.u64()?;
        let rdev = (reader.u32()?, reader.u32()?);
        let _fsid = reader.u64()?;
        let fileid = reader.u64()?;
        let atime = args::time(reader)?;
        let mtime = args::time(reader)?;
        let _ctime = args::time(reader)?;
        Ok(Fattr { kind, mode, uid, gid, size, rdev, fileid, atime, mtime })
    }
}

pub fn skip_post_op_attr(reader: &mut XdrReader<'_>) -> Result<Option<Fattr>, Garbage> {
    reader.bool()?.then(|| Fattr::decode(reader)).transpose()
}

/// A handle as the upstream gives it, checked for length.
pub fn upstream_handle<'a>(reader: &mut XdrReader<'a>) -> Result<&'a [u8], Garbage> {
    reader.opaque(FH_BYTES_MAX, "upstream file handle")
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn connections_a_burst_opened_are_closed_once_idle_for_longer_than_the_keep() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let nfs = listener.local_addr().unwrap();
        // Long enough that the steps before the wait cannot outlast it on
        // a loaded machine.
        let keep = Duration::from_secs(1);
        let pool = Pool::new(UpstreamAddress { nfs, mount: nfs }, keep);
        // Two calls in flight at once: two connections, both kept.
        pool.with(|_| pool.with(|_| Ok(()))).unwrap();
        let (mut outer, _) = listener.accept().unwrap();
        let (mut inner, _) = listener.accept().unwrap();
        assert_eq!(pool.idle.lock().len(), 2);
        // Within the keep, both stay.
        pool.with(|_| Ok(())).unwrap();
        assert_eq!(pool.idle.lock().len(), 2);

        let idle_since = Instant::now();
        while idle_since.elapsed() <= keep {
            std::thread::sleep(keep / 4);
        }
        // The next call reuses the connection used last (the outer call's)
        // and closes the other, idle for longer than the keep.
        pool.with(|_| Ok(())).unwrap();
        assert_eq!(pool.idle.lock().len(), 1);
        assert_eq!(inner.read(&mut [0u8; 1]).unwrap(), 0, "the idle connection is closed");
        outer.set_nonblocking(true).unwrap();
        let still_open = outer.read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(still_open.kind(), io::ErrorKind::WouldBlock, "the one reused stays open");
    }
}
