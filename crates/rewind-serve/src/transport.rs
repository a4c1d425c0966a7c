//! Connected byte streams a server serves: TCP, Unix domain sockets, and
//! the plaintext end of a TLS session.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A connected byte stream: TCP or a Unix domain socket (also the plaintext
/// end of a TLS session). `Sync` because the transmission workers share one
/// handle for `shutdown`; `AsFd` for the TLS pump's `poll`.
pub trait Transport: Read + Write + AsFd + Send + Sync + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn read_timeout(&self) -> io::Result<Option<Duration>>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// Transport-specific tuning, done once after accept.
    fn configure(&self) -> io::Result<()>;
    /// Writes all of `bytes`, a reply's header, saying that its data follows
    /// at once (`MSG_MORE` on TCP). Measured with fio 1 MiB reads over NBD at
    /// queue depth 4, five alternating runs: 0.83x `nbdkit file` against
    /// 0.66x when header and data went in one `writev` (nbdkit sends them
    /// this way too).
    fn write_header(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_all(bytes)
    }
}

impl Transport for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
    fn read_timeout(&self) -> io::Result<Option<Duration>> {
        TcpStream::read_timeout(self)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpStream::set_nonblocking(self, nonblocking)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        TcpStream::shutdown(self, how)
    }
    fn configure(&self) -> io::Result<()> {
        // Replies are written whole, in one call; Nagle would only hold back
        // the last segment of each one waiting for an ACK (NBD's spec asks
        // for TCP_NODELAY on both sides; RPC replies are the same shape).
        self.set_nodelay(true)
    }
    fn write_header(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match rustix::net::send(&*self, bytes, rustix::net::SendFlags::MORE) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(sent) => bytes = &bytes[sent..],
                Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}

impl Transport for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
    fn read_timeout(&self) -> io::Result<Option<Duration>> {
        UnixStream::read_timeout(self)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, timeout)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixStream::set_nonblocking(self, nonblocking)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        UnixStream::shutdown(self, how)
    }
    fn configure(&self) -> io::Result<()> {
        Ok(())
    }
}

/// How long a server's connection polls for the next request before it
/// sleeps in `read` (NBD in transmission, NFS). A client at queue depth 1
/// sends its next request a few tens of microseconds after our reply; a
/// thread that sleeps for it leaves its CPU idle, and where idle CPUs halt
/// (this project's virtual machines: cpuidle `haltpoll` with
/// `guest_halt_poll_ns` 0) the wake-up costs more than the request. fio
/// 4 KiB random writes at depth 1 over NBD, 3 s, two rounds: 54 MiB/s
/// without polling, 131 / 124 / 130 MiB/s polling 50 / 100 / 200 µs; reads
/// alike (50 → 134); depth 32 level. One NFS client's operations: 1.69×
/// (BENCHMARKS.md). The shortest window that won: it is spent whenever a
/// client goes quiet.
pub const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Reads what arrives on `stream` within [`POLL_BEFORE_SLEEP`] without
/// sleeping, yielding the CPU between tries: `Some(0)` at the end of the
/// stream, `None` if nothing came in time or the stream is no socket (the
/// caller then blocks in `read`, which reports any error).
pub fn poll_briefly<S: Transport>(stream: &S, buf: &mut [u8]) -> Option<usize> {
    // The clock is read only once nothing has come: a busy connection's
    // reads find data at the first try.
    let mut start = None;
    loop {
        match rustix::net::recv(stream.as_fd(), &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((read, _)) => return Some(read),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR)
                if start.get_or_insert_with(Instant::now).elapsed() < POLL_BEFORE_SLEEP =>
            {
                // Whatever else this CPU has to run goes first.
                std::thread::yield_now();
            }
            Err(_) => return None,
        }
    }
}

/// A transport whose reads poll first ([`poll_briefly`]), then block.
pub struct PollFirst<S>(pub S);

impl<S: Transport> Read for PollFirst<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match poll_briefly(&self.0, buf) {
            Some(read) => Ok(read),
            None => self.0.read(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_reads_what_has_arrived_and_gives_up_on_silence() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        (&client).write_all(b"request").unwrap();
        assert_eq!(poll_briefly(&server, &mut buf), Some(7));
        assert_eq!(&buf[..7], b"request");

        let start = Instant::now();
        assert_eq!(poll_briefly(&server, &mut buf), None, "nothing sent: the caller sleeps in read");
        assert!(start.elapsed() >= POLL_BEFORE_SLEEP, "polled for the whole window first");

        drop(client);
        assert_eq!(poll_briefly(&server, &mut buf), Some(0), "the end of the stream is a read of 0");
    }

    #[test]
    fn a_polling_reader_reads_what_comes_after_the_window_by_blocking() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut reader = PollFirst(server);
        let sender = std::thread::spawn(move || {
            // Past the poll's window, so the read has gone to sleep by then
            // (or, on a slow machine, still polls: either way it reads it).
            std::thread::sleep(POLL_BEFORE_SLEEP * 4);
            (&client).write_all(b"late").unwrap();
            client
        });
        let mut buf = [0u8; 4];
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late");
        drop(sender.join().unwrap());
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
    }
}
