//! Telling a client it cannot be served now, without a thread for it.
//!
//! A client refused by a connection limit used to see its socket closed at
//! once, which every client reports as "server disconnected unexpectedly".
//! NBD has one place to say more: an error reply to an option (the spec
//! lets a server "error inbound options until the client gets the hint").
//! So a refused connection gets the greeting, and each option it sends
//! (up to `OPTIONS_MAX`) is answered with `NBD_REP_ERR_POLICY` and a message
//! such as "server full: 32 connections from your address (limit 32)" —
//! `NBD_OPT_ABORT` with its ACK, `NBD_OPT_EXPORT_NAME` (which has no error
//! reply) by hanging up. libnbd reports "server policy prevents NBD_OPT_GO"
//! (the message itself with `LIBNBD_DEBUG=1`); qemu prints the message.
//!
//! This runs on the listener's accept thread: the socket is non-blocking,
//! the accept loop polls it with the listener, and every step is a single
//! non-blocking read or write. What one refusal may cost is bounded: a
//! greeting and replies of a few hundred bytes each (a reply that does not
//! fit in the socket's send buffer at once ends the refusal), `DEADLINE` in
//! all, and at most `ServerConfig::refusals_max` refusals per listener at
//! once (each holds one file descriptor); beyond
//! that a refused connection is closed at once, as before.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use crate::protocol as p;

/// How long a refused client has to read its message: real clients send
/// their options at once.
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);

/// Most options answered before hanging up.
const OPTIONS_MAX: u32 = 16;

enum Step {
    /// Reading the client's 4 flag bytes.
    Flags,
    /// Reading an option header.
    Header,
    /// Skipping an option's data, then answering it.
    Data { option: u32, remaining: u32 },
}

/// What a refusal does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait until the socket is readable again (or the deadline passes).
    Wait,
    /// Done: drop the socket.
    Close,
}

/// One refused connection being told why.
pub(crate) struct Refusal<S> {
    pub(crate) stream: S,
    pub(crate) deadline: Instant,
    message: String,
    step: Step,
    header: [u8; p::OPTION_HEADER_BYTES],
    filled: usize,
    options: u32,
}

impl<S: rewind_serve::transport::Transport> rewind_serve::listen::Refusal for Refusal<S> {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn readable(&mut self) -> bool {
        Refusal::readable(self) == Next::Wait
    }
}

impl<S: Read + Write> Refusal<S> {
    /// Sends the greeting on a non-blocking `stream`; `None` if it could not
    /// be sent whole (the client is gone already).
    pub(crate) fn start(mut stream: S, message: String) -> Option<Refusal<S>> {
        let greeting = p::encode_greeting();
        match stream.write(&greeting) {
            Ok(written) if written == greeting.len() => Some(Refusal {
                stream,
                deadline: Instant::now() + DEADLINE,
                message,
                step: Step::Flags,
                header: [0; p::OPTION_HEADER_BYTES],
                filled: 0,
                options: 0,
            }),
            _ => None,
        }
    }

    /// Reads what the client sent and answers it, until the socket would block.
    pub(crate) fn readable(&mut self) -> Next {
        loop {
            let wanted = match self.step {
                Step::Flags => 4,
                Step::Header => p::OPTION_HEADER_BYTES,
                Step::Data { remaining, .. } => remaining.min(p::OPTION_HEADER_BYTES as u32) as usize,
            };
            let read = match self.step {
                Step::Data { .. } => self.stream.read(&mut self.header[..wanted]),
                _ => self.stream.read(&mut self.header[self.filled..wanted]),
            };
            let count = match read {
                Ok(0) => return Next::Close,
                Ok(count) => count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Next::Wait,
                Err(_) => return Next::Close,
            };
            if self.advance(count) == Next::Close {
                return Next::Close;
            }
        }
    }

    fn advance(&mut self, count: usize) -> Next {
        match self.step {
            Step::Flags | Step::Header => {
                self.filled += count;
                let complete = if matches!(self.step, Step::Flags) { 4 } else { p::OPTION_HEADER_BYTES };
                if self.filled < complete {
                    return Next::Wait;
                }
                self.filled = 0;
                if matches!(self.step, Step::Flags) {
                    // Whatever the flags, the answer is the same.
                    self.step = Step::Header;
                    return Next::Wait;
                }
                let Ok(header) = p::decode_option_header(&self.header) else { return Next::Close };
                if header.option == p::OPT_EXPORT_NAME || header.length > p::OPTION_BYTES_MAX {
                    // EXPORT_NAME cannot be answered with an error (the spec
                    // says hang up); an absurd length is not a real client.
                    return Next::Close;
                }
                self.step = Step::Data { option: header.option, remaining: header.length };
                if header.length == 0 {
                    return self.answer(header.option);
                }
                Next::Wait
            }
            Step::Data { option, remaining } => {
                let remaining = remaining - count as u32;
                self.step = Step::Data { option, remaining };
                if remaining == 0 {
                    return self.answer(option);
                }
                Next::Wait
            }
        }
    }

    fn answer(&mut self, option: u32) -> Next {
        let mut reply = Vec::with_capacity(p::OPTION_REPLY_HEADER_BYTES + self.message.len());
        let last = if option == p::OPT_ABORT {
            p::push_option_reply(&mut reply, option, p::REP_ACK, &[]);
            true
        } else {
            p::push_option_error(&mut reply, option, p::REP_ERR_POLICY, &self.message);
            self.options += 1;
            self.options >= OPTIONS_MAX
        };
        // A few hundred bytes fit in any socket's send buffer; a client that
        // has not read earlier replies and filled it is not worth waiting for.
        match self.stream.write(&reply) {
            Ok(written) if written == reply.len() && !last => {
                self.step = Step::Header;
                Next::Wait
            }
            _ => Next::Close,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted peer: reads come from `input` (then WouldBlock), writes
    /// are collected.
    struct Script {
        input: Vec<u8>,
        position: usize,
        output: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.position == self.input.len() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            // One byte at a time: the worst a client can do.
            buf[0] = self.input[self.position];
            self.position += 1;
            Ok(1)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn option(option: u32, data: &[u8]) -> Vec<u8> {
        let mut message = p::IHAVEOPT.to_be_bytes().to_vec();
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        message
    }

    fn refusal(input: Vec<u8>) -> Refusal<Script> {
        Refusal::start(Script { input, position: 0, output: Vec::new() }, "server full".into()).unwrap()
    }

    #[test]
    fn options_get_policy_errors_with_the_message_and_abort_its_ack() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(option(p::OPT_STRUCTURED_REPLY, &[]));
        input.extend(option(p::OPT_GO, b"\0\0\0\x04disk\0\0"));
        let mut refusal = refusal(input);
        assert_eq!(refusal.readable(), Next::Wait);
        let mut expected = p::encode_greeting().to_vec();
        p::push_option_error(&mut expected, p::OPT_STRUCTURED_REPLY, p::REP_ERR_POLICY, "server full");
        p::push_option_error(&mut expected, p::OPT_GO, p::REP_ERR_POLICY, "server full");
        assert_eq!(refusal.stream.output, expected);

        refusal.stream.input.extend(option(p::OPT_ABORT, &[]));
        assert_eq!(refusal.readable(), Next::Close);
        p::push_option_reply(&mut expected, p::OPT_ABORT, p::REP_ACK, &[]);
        assert_eq!(refusal.stream.output, expected);
    }

    #[test]
    fn export_name_bad_magic_and_huge_options_hang_up() {
        for input in [
            option(p::OPT_EXPORT_NAME, b"disk"),
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            option(p::OPT_GO, &[]).into_iter().take(12).chain((p::OPTION_BYTES_MAX + 1).to_be_bytes()).collect(),
        ] {
            let mut refusal = refusal([0, 0, 0, 3].into_iter().chain(input).collect());
            assert_eq!(refusal.readable(), Next::Close);
            assert_eq!(refusal.stream.output, p::encode_greeting());
        }
    }

    #[test]
    fn answers_at_most_a_few_options() {
        let mut input = 3u32.to_be_bytes().to_vec();
        for _ in 0..100 {
            input.extend(option(p::OPT_LIST, &[]));
        }
        let mut refusal = refusal(input);
        assert_eq!(refusal.readable(), Next::Close);
        assert_eq!(refusal.options, OPTIONS_MAX);
    }
}
