//! A minimal NBD client (fixed newstyle, NBD_OPT_GO, simple replies), so a
//! test can know exactly which writes and flushes were acknowledged.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const INFO_EXPORT: u16 = 0;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;

pub struct NbdClient {
    stream: TcpStream,
    pub size_bytes: u64,
    handle: u64,
}

fn read_u16(stream: &mut TcpStream) -> io::Result<u16> {
    let mut bytes = [0u8; 2];
    stream.read_exact(&mut bytes)?;
    Ok(u16::from_be_bytes(bytes))
}

fn read_u32(stream: &mut TcpStream) -> io::Result<u32> {
    let mut bytes = [0u8; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn read_u64(stream: &mut TcpStream) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

fn protocol_error(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl NbdClient {
    pub fn connect(address: SocketAddr, export: &str) -> io::Result<NbdClient> {
        let mut stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        if read_u64(&mut stream)? != u64::from_be_bytes(*b"NBDMAGIC") || read_u64(&mut stream)? != IHAVEOPT {
            return Err(protocol_error("not an NBD newstyle server".into()));
        }
        let _handshake_flags = read_u16(&mut stream)?;
        stream.write_all(&3u32.to_be_bytes())?; // FIXED_NEWSTYLE | NO_ZEROES
        let mut option = Vec::new();
        option.extend_from_slice(&IHAVEOPT.to_be_bytes());
        option.extend_from_slice(&OPT_GO.to_be_bytes());
        option.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
        option.extend_from_slice(&(export.len() as u32).to_be_bytes());
        option.extend_from_slice(export.as_bytes());
        option.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&option)?;
        let mut size_bytes = None;
        loop {
            if read_u64(&mut stream)? != OPTION_REPLY_MAGIC {
                return Err(protocol_error("bad option reply magic".into()));
            }
            let _option = read_u32(&mut stream)?;
            let reply = read_u32(&mut stream)?;
            let length = read_u32(&mut stream)?;
            let mut data = vec![0u8; length as usize];
            stream.read_exact(&mut data)?;
            if reply & 0x8000_0000 != 0 {
                return Err(protocol_error(format!("GO refused: {}", String::from_utf8_lossy(&data))));
            }
            if reply == REP_ACK {
                break;
            }
            if data.len() >= 10 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT {
                size_bytes = Some(u64::from_be_bytes(data[2..10].try_into().expect("8 bytes")));
            }
        }
        let size_bytes = size_bytes.ok_or_else(|| protocol_error("no NBD_INFO_EXPORT".into()))?;
        Ok(NbdClient { stream, size_bytes, handle: 0 })
    }

    fn request(&mut self, command: u16, offset: u64, length: u32, data: &[u8]) -> io::Result<()> {
        self.handle += 1;
        let mut header = Vec::with_capacity(28 + data.len());
        header.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&command.to_be_bytes());
        header.extend_from_slice(&self.handle.to_be_bytes());
        header.extend_from_slice(&offset.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(data);
        self.stream.write_all(&header)
    }

    fn reply(&mut self) -> io::Result<()> {
        if read_u32(&mut self.stream)? != SIMPLE_REPLY_MAGIC {
            return Err(protocol_error("bad reply magic".into()));
        }
        let error = read_u32(&mut self.stream)?;
        let handle = read_u64(&mut self.stream)?;
        if handle != self.handle {
            return Err(protocol_error(format!("reply for handle {handle}, expected {}", self.handle)));
        }
        if error != 0 {
            return Err(io::Error::other(format!("NBD error {error}")));
        }
        Ok(())
    }

    /// Returns once the server acknowledged the write.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.request(CMD_WRITE, offset, data.len() as u32, data)?;
        self.reply()
    }

    /// Returns once the server acknowledged the flush.
    pub fn flush(&mut self) -> io::Result<()> {
        self.request(CMD_FLUSH, 0, 0, &[])?;
        self.reply()
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.request(CMD_READ, offset, buf.len() as u32, &[])?;
        self.reply()?;
        self.stream.read_exact(buf)
    }

    /// The socket, for tests that misbehave on purpose.
    pub fn raw_stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    pub fn disconnect(mut self) -> io::Result<()> {
        self.request(CMD_DISC, 0, 0, &[])
    }
}
