//! An HTTP proxy in front of a real S3 server that misbehaves as S3 and
//! networks do (issue 14 req 5), for tests: requests answered with 503
//! SlowDown or 500 InternalError without reaching the server, connections
//! reset before a request is sent on, and requests the server carried out
//! whose reply is lost (the connection closed instead) — a PUT that
//! succeeded but whose client never heard — and requests the server
//! carried out whose reply is held back until the client gives up waiting
//! (a timeout; the client's request timeout must be short for a test to
//! meet several). Which requests meet a fault is
//! drawn from a seed (the order requests arrive in still varies from run
//! to run), the kinds of fault taking turns; counts of each are kept.
//!
//! It speaks just enough HTTP/1.1 for S3 clients: requests framed by
//! `Content-Length`, replies by `Content-Length` or chunked, none to HEAD.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// What the proxy did to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    SlowDown,
    InternalError,
    Reset,
    LostReply,
    Stall,
}

/// How many requests met each fault.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub forwarded: AtomicU64,
    pub slow_downs: AtomicU64,
    pub internal_errors: AtomicU64,
    pub resets: AtomicU64,
    pub lost_replies: AtomicU64,
    pub stalls: AtomicU64,
}

/// See the module documentation.
pub struct FaultyProxy {
    port: u16,
    stopping: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
    accept: Option<JoinHandle<()>>,
}

struct Draw {
    state: u64,
    /// Faults per million requests.
    rate_ppm: u64,
    /// Faults drawn so far: their kinds take turns, so a few faults are
    /// enough to meet each.
    faults: u64,
}

impl Draw {
    /// splitmix64: enough to spread faults, and reproducible from a seed.
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fault(&mut self) -> Fault {
        if self.next() % 1_000_000 >= self.rate_ppm {
            return Fault::None;
        }
        self.faults += 1;
        match self.faults % 5 {
            0 => Fault::SlowDown,
            1 => Fault::InternalError,
            2 => Fault::Reset,
            3 => Fault::LostReply,
            _ => Fault::Stall,
        }
    }
}

impl FaultyProxy {
    /// Listens on a free port of 127.0.0.1 and sends requests on to
    /// `127.0.0.1:upstream`, a share `rate` (0 to 1) of them meeting a fault.
    pub fn start(upstream: u16, seed: u64, rate: f64) -> FaultyProxy {
        assert!((0.0..=1.0).contains(&rate), "a rate is a share");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        listener.set_nonblocking(true).expect("non-blocking accept");
        let stopping = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FaultCounts::default());
        let draw = Arc::new(Mutex::new(Draw { state: seed, rate_ppm: (rate * 1e6) as u64, faults: 0 }));
        let accept = {
            let (stopping, counts) = (Arc::clone(&stopping), Arc::clone(&counts));
            std::thread::Builder::new()
                .name("faulty-http".into())
                .spawn(move || {
                    while !stopping.load(Ordering::Acquire) {
                        match listener.accept() {
                            Ok((client, _)) => {
                                let (counts, draw) = (Arc::clone(&counts), Arc::clone(&draw));
                                std::thread::spawn(move || {
                                    let _ = serve(client, upstream, &counts, &draw);
                                });
                            }
                            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                                // Polled so that a stop is noticed.
                                std::thread::sleep(std::time::Duration::from_millis(5));
                            }
                            Err(_) => break,
                        }
                    }
                })
                .expect("the proxy's thread starts")
        };
        FaultyProxy { port, stopping, counts, accept: Some(accept) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// One message's head (up to the blank line) and its body.
struct Message {
    head: Vec<u8>,
    body: Vec<u8>,
}

/// The head's first line and a header's value (case-insensitive).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// Reads a message head; `None` at a clean end of stream.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        if reader.read_until(b'\n', &mut head)? == 0 {
            return match head.is_empty() {
                true => Ok(None),
                false => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a message cut short")),
            };
        }
        if &head[before..] == b"\r\n" {
            return Ok(Some(head));
        }
    }
}

/// Reads a body framed by `Content-Length`, or chunked (kept as sent).
fn read_body(reader: &mut impl BufRead, head: &str, has_body: bool) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    if !has_body {
        return Ok(body);
    }
    if header(head, "transfer-encoding").is_some_and(|value| value.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut line = Vec::new();
            reader.read_until(b'\n', &mut line)?;
            let size = usize::from_str_radix(String::from_utf8_lossy(&line).trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a bad chunk size"))?;
            body.extend_from_slice(&line);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            if size == 0 {
                return Ok(body);
            }
        }
    }
    let length: usize = header(head, "content-length").and_then(|value| value.parse().ok()).unwrap_or(0);
    body.resize(length, 0);
    reader.read_exact(&mut body)?;
    Ok(body)
}

fn read_message(reader: &mut impl BufRead, has_body: impl FnOnce(&str) -> bool) -> io::Result<Option<Message>> {
    let Some(head) = read_head(reader)? else { return Ok(None) };
    let text = String::from_utf8_lossy(&head).into_owned();
    let body = read_body(reader, &text, has_body(&text))?;
    Ok(Some(Message { head, body }))
}

fn error_reply(status: &str, code: &str) -> Vec<u8> {
    let body = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error>");
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nRetry-After: 0\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves one client connection until it closes or a fault closes it.
fn serve(client: TcpStream, upstream: u16, counts: &FaultCounts, draw: &Mutex<Draw>) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let mut to_client = client.try_clone()?;
    let mut from_client = BufReader::new(client);
    let mut server: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while let Some(request) = read_message(&mut from_client, |_| true)? {
        let fault = draw.lock().fault();
        let method_is_head = request.head.starts_with(b"HEAD ");
        match fault {
            Fault::SlowDown | Fault::InternalError => {
                let (status, code, count) = match fault {
                    Fault::SlowDown => ("503 Slow Down", "SlowDown", &counts.slow_downs),
                    _ => ("500 Internal Server Error", "InternalError", &counts.internal_errors),
                };
                count.fetch_add(1, Ordering::Relaxed);
                to_client.write_all(&error_reply(status, code))?;
                continue;
            }
            Fault::Reset => {
                counts.resets.fetch_add(1, Ordering::Relaxed);
                return to_client.shutdown(Shutdown::Both);
            }
            Fault::None | Fault::LostReply | Fault::Stall => {}
        }
        if server.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", upstream))?;
            let reader = BufReader::new(stream.try_clone()?);
            server = Some((stream, reader));
        }
        let (to_server, from_server) = server.as_mut().expect("connected above");
        to_server.write_all(&request.head)?;
        to_server.write_all(&request.body)?;
        let reply = read_message(from_server, |head| {
            let status = head.split(' ').nth(1).unwrap_or("");
            !method_is_head && status != "204" && status != "304"
        })?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed"))?;
        if fault == Fault::LostReply {
            // The server did it; the client never hears.
            counts.lost_replies.fetch_add(1, Ordering::Relaxed);
            return to_client.shutdown(Shutdown::Both);
        }
        if fault == Fault::Stall {
            // The server did it; the reply waits until the client's
            // timeout closes the connection (or a minute, whichever first).
            counts.stalls.fetch_add(1, Ordering::Relaxed);
            let connection = from_client.get_ref();
            connection.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut from_client, &mut rest);
            return Ok(());
        }
        counts.forwarded.fetch_add(1, Ordering::Relaxed);
        to_client.write_all(&reply.head)?;
        to_client.write_all(&reply.body)?;
    }
    Ok(())
}
