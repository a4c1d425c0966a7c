//! ONC RPC (RFC 5531) over TCP: record marking, the call header with its
//! AUTH_SYS credentials, and reply headers.

use std::io::{self, Read, Write};

use crate::xdr::{Garbage, XdrReader};

/// The largest record a client may send: a 1 MiB WRITE with its headers.
pub const RECORD_BYTES_MAX: usize = (1 << 20) + (64 << 10);
const LAST_FRAGMENT: u32 = 1 << 31;
/// AUTH_SYS: at most 16 supplementary groups, a machine name of 255 bytes.
const GIDS_MAX: usize = 16;
const MACHINE_NAME_BYTES_MAX: usize = 255;
const AUTH_BODY_BYTES_MAX: usize = 400;

const AUTH_NONE: u32 = 0;
const AUTH_SYS: u32 = 1;

/// Reads one record (all its fragments) into `record`. `Ok(false)` at a
/// clean end of stream between records.
pub fn read_record(stream: &mut impl Read, record: &mut Vec<u8>) -> io::Result<bool> {
    record.clear();
    loop {
        let mut header = [0u8; 4];
        if let Err(error) = stream.read_exact(&mut header) {
            if error.kind() == io::ErrorKind::UnexpectedEof && record.is_empty() {
                return Ok(false);
            }
            return Err(error);
        }
        let header = u32::from_be_bytes(header);
        let length = (header & !LAST_FRAGMENT) as usize;
        if record.len() + length > RECORD_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a record of more than {RECORD_BYTES_MAX} bytes (the connection cannot be resynchronised)"),
            ));
        }
        let start = record.len();
        record.resize(start + length, 0);
        stream.read_exact(&mut record[start..])?;
        if header & LAST_FRAGMENT != 0 {
            return Ok(true);
        }
    }
}

/// Writes `reply` as one record, in one write.
pub fn write_record(stream: &mut impl Write, reply: &mut [u8]) -> io::Result<()> {
    let length = reply.len() - 4;
    assert!(length < LAST_FRAGMENT as usize, "replies fit one fragment");
    reply[..4].copy_from_slice(&(LAST_FRAGMENT | length as u32).to_be_bytes());
    stream.write_all(reply)
}

/// Who a call says it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// AUTH_NONE: treated as the anonymous user.
    None,
    Sys {
        uid: u32,
        gid: u32,
        gids: Vec<u32>,
    },
}

/// A call's header; its arguments follow at `arguments`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub xid: u32,
    pub program: u32,
    pub version: u32,
    pub procedure: u32,
    pub credentials: Credentials,
    /// Offset of the arguments in the record.
    pub arguments: usize,
}

/// What a call header may be instead of a call we can serve.
#[derive(Debug, PartialEq, Eq)]
pub enum BadCall {
    /// Not even an xid: nothing can be answered.
    Unreadable,
    /// A reply, or not RPC version 2: answered with RPC_MISMATCH.
    RpcMismatch {
        xid: u32,
    },
    /// Credentials we do not take: AUTH_ERROR.
    Auth {
        xid: u32,
        stat: u32,
    },
    Garbage {
        xid: u32,
        reason: String,
    },
}

/// auth_stat: AUTH_BADCRED (1), AUTH_TOOWEAK (5).
pub const AUTH_BADCRED: u32 = 1;
pub const AUTH_TOOWEAK: u32 = 5;

pub fn decode_call(record: &[u8]) -> Result<Call, BadCall> {
    let mut reader = XdrReader::new(record);
    let xid = reader.u32().map_err(|_| BadCall::Unreadable)?;
    let garbage = |Garbage(reason)| BadCall::Garbage { xid, reason };
    if reader.u32().map_err(garbage)? != 0 {
        return Err(BadCall::RpcMismatch { xid });
    }
    if reader.u32().map_err(garbage)? != 2 {
        return Err(BadCall::RpcMismatch { xid });
    }
    let (program, version, procedure) =
        (reader.u32().map_err(garbage)?, reader.u32().map_err(garbage)?, reader.u32().map_err(garbage)?);
    let flavor = reader.u32().map_err(garbage)?;
    let body = reader.opaque(AUTH_BODY_BYTES_MAX, "credentials").map_err(garbage)?;
    let credentials = match flavor {
        AUTH_NONE => Credentials::None,
        AUTH_SYS => {
            let bad = |_| BadCall::Auth { xid, stat: AUTH_BADCRED };
            let mut auth = XdrReader::new(body);
            let _stamp = auth.u32().map_err(bad)?;
            auth.opaque(MACHINE_NAME_BYTES_MAX, "machine name").map_err(bad)?;
            let (uid, gid) = (auth.u32().map_err(bad)?, auth.u32().map_err(bad)?);
            let count = auth.u32().map_err(bad)? as usize;
            if count > GIDS_MAX {
                return Err(BadCall::Auth { xid, stat: AUTH_BADCRED });
            }
            let gids = (0..count).map(|_| auth.u32()).collect::<Result<Vec<u32>, _>>().map_err(bad)?;
            auth.finish().map_err(bad)?;
            Credentials::Sys { uid, gid, gids }
        }
        _ => return Err(BadCall::Auth { xid, stat: AUTH_TOOWEAK }),
    };
    // The verifier (AUTH_NONE for AUTH_SYS calls) is not checked.
    reader.u32().map_err(garbage)?;
    reader.opaque(AUTH_BODY_BYTES_MAX, "verifier").map_err(garbage)?;
    Ok(Call { xid, program, version, procedure, credentials, arguments: reader.position() })
}

/// accept_stat values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    Success = 0,
    ProgramUnavailable = 1,
    ProgramMismatch = 2,
    ProcedureUnavailable = 3,
    GarbageArguments = 4,
}

/// Starts a reply in `out` (after 4 bytes left for the record mark): an
/// accepted one with `stat`; the results follow on success, the supported
/// version range (`low`, `high`) on a program mismatch.
pub fn accepted(out: &mut Vec<u8>, xid: u32, stat: Accepted, versions: (u32, u32)) {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    for word in [xid, 1, 0, AUTH_NONE, 0, stat as u32] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    if stat == Accepted::ProgramMismatch {
        out.extend_from_slice(&versions.0.to_be_bytes());
        out.extend_from_slice(&versions.1.to_be_bytes());
    }
}

/// A denied reply: RPC version 2 only, or the credentials refused.
pub fn denied(out: &mut Vec<u8>, xid: u32, auth_stat: Option<u32>) {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    let words: &[u32] = match auth_stat {
        None => &[xid, 1, 1, 0, 2, 2],
        Some(stat) => &[xid, 1, 1, 1, stat],
    };
    for word in words {
        out.extend_from_slice(&word.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(flavor: u32, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for word in [7u32, 0, 2, 100_003, 3, 1, flavor, body.len() as u32] {
            bytes.extend_from_slice(&word.to_be_bytes());
        }
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(b"args");
        bytes
    }

    fn auth_sys(gids: u32) -> Vec<u8> {
        let mut body = Vec::new();
        for word in [1u32, 4] {
            body.extend_from_slice(&word.to_be_bytes());
        }
        body.extend_from_slice(b"host");
        for word in [1000u32, 100, gids] {
            body.extend_from_slice(&word.to_be_bytes());
        }
        for gid in 0..gids {
            body.extend_from_slice(&(10 + gid).to_be_bytes());
        }
        body
    }

    #[test]
    fn calls_decode_and_bad_credentials_are_refused_not_trusted() {
        let bytes = call(AUTH_SYS, &auth_sys(2));
        let decoded = decode_call(&bytes).unwrap();
        assert_eq!(decoded.credentials, Credentials::Sys { uid: 1000, gid: 100, gids: vec![10, 11] });
        assert_eq!((decoded.xid, decoded.program, decoded.procedure), (7, 100_003, 1));
        assert_eq!(&bytes[decoded.arguments..], b"args");
        assert_eq!(decode_call(&call(AUTH_SYS, &auth_sys(17))), Err(BadCall::Auth { xid: 7, stat: AUTH_BADCRED }));
        assert_eq!(decode_call(&call(6, &[])), Err(BadCall::Auth { xid: 7, stat: AUTH_TOOWEAK }));
        assert_eq!(decode_call(&[0, 0]), Err(BadCall::Unreadable));
        let mut reply = call(AUTH_NONE, &[]);
        reply[7] = 1;
        assert_eq!(decode_call(&reply), Err(BadCall::RpcMismatch { xid: 7 }));
    }

    #[test]
    fn records_join_their_fragments_and_are_bounded() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&3u32.to_be_bytes());
        stream.extend_from_slice(b"abc");
        stream.extend_from_slice(&(LAST_FRAGMENT | 2).to_be_bytes());
        stream.extend_from_slice(b"de");
        let mut record = Vec::new();
        let mut reader = &stream[..];
        assert!(read_record(&mut reader, &mut record).unwrap());
        assert_eq!(record, b"abcde");
        assert!(!read_record(&mut reader, &mut record).unwrap(), "a clean end");
        let huge = (LAST_FRAGMENT | (RECORD_BYTES_MAX as u32 + 1)).to_be_bytes();
        assert!(read_record(&mut &huge[..], &mut record).is_err());
        let mut reply = vec![0; 4];
        reply.extend_from_slice(b"xyz");
        let mut written = Vec::new();
        write_record(&mut written, &mut reply).unwrap();
        assert_eq!(written, [&(LAST_FRAGMENT | 3).to_be_bytes()[..], b"xyz"].concat());
    }
}
