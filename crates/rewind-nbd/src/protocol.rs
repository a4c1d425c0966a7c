//! NBD wire format: constants, plus pure encoders and decoders for the fixed
//! newstyle handshake, option haggling, requests and replies.
//!
//! Nothing here does I/O, so every decoder can be unit-tested and fuzzed on
//! plain byte slices. Decoders validate everything a client can get wrong and
//! return the error the spec asks for; encoders take values the server has
//! already validated and assert their preconditions.
//!
//! All integers are big-endian on the wire (spec "Conventions").

use std::fmt;

// --- Magic numbers -----------------------------------------------------------

/// `NBDMAGIC`, first word of the server greeting.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second word of the greeting and first word of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every fixed newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// --- Handshake flags (server, 16 bits) and client flags (32 bits) ------------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// What this server advertises in the greeting.
pub const HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;

pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// --- Transmission flags (16 bits; the ones this server may advertise) ----------

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// --- Options ------------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// --- Option reply types -------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;

// --- NBD_REP_INFO types ---------------------------------------------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// --- Commands and command flags ---------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
const CMD_FLAGS_KNOWN: u16 = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;

// --- Structured replies (this server sends only these chunk types) ----------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

// --- Errors (values allowed in a reply's error field; this server never sends
// ENOMEM, and EOVERFLOW only matters for DF reads larger than one chunk) --------

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// --- base:allocation ------------------------------------------------------------------

pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// The context id this server assigns to `base:allocation`. Any value works
/// (clients treat it as opaque); a fixed one keeps replies reproducible.
pub const META_BASE_ALLOCATION_ID: u32 = 1;

// --- qemu:dirty-bitmap: ------------------------------------------------------------------

/// `NBD_STATE_DIRTY` of qemu's `dirty-bitmap` contexts.
pub const STATE_DIRTY: u32 = 1 << 0;
pub const META_DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";
/// The context id of the first dirty bitmap a SET selects; the next get the
/// ids after it, in the order they were asked for.
pub const META_DIRTY_BITMAP_FIRST_ID: u32 = 2;
/// Most dirty bitmaps one SET selects, and most a SET or LIST looks up by
/// name: each costs a view held (and, selected, a comparison of two points
/// per BLOCK_STATUS), so a client cannot ask for thousands.
pub const DIRTY_BITMAPS_MAX: usize = 8;

// --- Sizes and limits -------------------------------------------------------------------

pub const GREETING_BYTES: usize = 18;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Chunk header plus the 64-bit offset of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk.
pub const READ_CHUNK_PREFIX_BYTES: usize = CHUNK_HEADER_BYTES + 8;
/// Size, flags and 124 reserved zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const EXPORT_NAME_REPLY_BYTES: usize = 8 + 2 + 124;

/// Longest string (export name, message, query) the spec allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Longest option payload accepted; every option we understand fits in far
/// less (a `SET_META_CONTEXT` with a few queries). A longer one is treated as
/// a denial of service and ends the connection, as the spec permits.
pub const OPTION_BYTES_MAX: u32 = 64 * 1024;
/// Largest `NBD_CMD_READ`/`NBD_CMD_WRITE` payload; also the maximum block size
/// advertised. The spec says lengths below 2^25 must not be treated as a
/// denial of service, so this is the smallest safe limit. A larger WRITE is
/// not read: the connection is dropped (spec "Block size constraints").
pub const PAYLOAD_BYTES_MAX: u32 = 32 * 1024 * 1024;
/// Most block status descriptors sent for one request; the spec lets a server
/// describe less than asked, and clients continue from where the reply ended.
pub const EXTENTS_PER_REPLY_MAX: usize = 16 * 1024;

const _: () = assert!(PAYLOAD_BYTES_MAX.is_power_of_two());
// A read reply is a single OFFSET_DATA chunk, whose length field holds 8 bytes
// of offset plus the data.
const _: () = assert!(PAYLOAD_BYTES_MAX as u64 + 8 <= u32::MAX as u64);
// Every advertised minimum block size (a power of two <= 64 KiB) divides it,
// it being a power of two itself.
const _: () = assert!(PAYLOAD_BYTES_MAX >= 64 * 1024);
const _: () = assert!(STRING_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(OPTION_BYTES_MAX as usize >= 4 + STRING_BYTES_MAX + 2 + 8);

// --- Handshake ----------------------------------------------------------------------------

/// The server's first message: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting() -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&HANDSHAKE_FLAGS.to_be_bytes());
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Decodes the client's 32-bit flags. Unknown bits are an error: the spec
/// says the server MUST then drop the connection.
pub fn decode_client_flags(bytes: [u8; 4]) -> Result<ClientFlags, u32> {
    let raw = u32::from_be_bytes(bytes);
    let unknown = raw & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    if unknown != 0 {
        return Err(raw);
    }
    Ok(ClientFlags { fixed_newstyle: raw & FLAG_C_FIXED_NEWSTYLE != 0, no_zeroes: raw & FLAG_C_NO_ZEROES != 0 })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Decodes `IHAVEOPT`, option, length. A wrong magic means the stream is not
/// (or no longer) NBD; the only sane answer is to hang up.
pub fn decode_option_header(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, u64> {
    let magic = u64::from_be_bytes(bytes[0..8].try_into().unwrap());
    if magic != IHAVEOPT {
        return Err(magic);
    }
    Ok(OptionHeader {
        option: u32::from_be_bytes(bytes[8..12].try_into().unwrap()),
        length: u32::from_be_bytes(bytes[12..16].try_into().unwrap()),
    })
}

/// Why an option's payload was rejected with `NBD_REP_ERR_INVALID`; the
/// `Display` text goes to the client as the error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionError {
    /// The option takes no data but some was sent.
    UnexpectedData,
    /// A length field points past the end of the option data.
    Truncated(&'static str),
    /// Bytes left over after the last field.
    TrailingData,
    /// `NBD_OPT_INFO`/`GO`: the information request list has the wrong size.
    InfoCount,
    StringTooLong(&'static str),
    StringNotUtf8(&'static str),
    StringHasNul(&'static str),
    /// A metadata context query without a `namespace:` prefix.
    QueryWithoutNamespace,
    /// `SET`/`LIST_META_CONTEXT` before `NBD_OPT_STRUCTURED_REPLY`.
    NeedsStructuredReplies,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionError::UnexpectedData => f.write_str("option takes no data"),
            OptionError::Truncated(what) => write!(f, "option data too short for {what}"),
            OptionError::TrailingData => f.write_str("unexpected bytes after the last field"),
            OptionError::InfoCount => f.write_str("number of information requests does not match option length"),
            OptionError::StringTooLong(what) => {
                write!(f, "{what} is longer than {STRING_BYTES_MAX} bytes")
            }
            OptionError::StringNotUtf8(what) => write!(f, "{what} is not valid UTF-8"),
            OptionError::StringHasNul(what) => write!(f, "{what} contains a NUL byte"),
            OptionError::QueryWithoutNamespace => f.write_str("metadata context query lacks a 'namespace:' prefix"),
            OptionError::NeedsStructuredReplies => f.write_str("negotiate NBD_OPT_STRUCTURED_REPLY first"),
        }
    }
}

/// A spec "string": UTF-8, no NUL, at most 4096 bytes.
pub fn decode_string<'a>(bytes: &'a [u8], what: &'static str) -> Result<&'a str, OptionError> {
    if bytes.len() > STRING_BYTES_MAX {
        return Err(OptionError::StringTooLong(what));
    }
    let s = std::str::from_utf8(bytes).map_err(|_| OptionError::StringNotUtf8(what))?;
    if s.contains('\0') {
        return Err(OptionError::StringHasNul(what));
    }
    Ok(s)
}

/// Takes `n` bytes off the front of `data`.
fn take<'a>(data: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], OptionError> {
    if data.len() < n {
        return Err(OptionError::Truncated(what));
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

fn take_u32(data: &mut &[u8], what: &'static str) -> Result<u32, OptionError> {
    Ok(u32::from_be_bytes(take(data, 4, what)?.try_into().unwrap()))
}

fn take_u16(data: &mut &[u8], what: &'static str) -> Result<u16, OptionError> {
    Ok(u16::from_be_bytes(take(data, 2, what)?.try_into().unwrap()))
}

fn take_string<'a>(data: &mut &'a [u8], what: &'static str) -> Result<&'a str, OptionError> {
    let length = take_u32(data, what)?;
    // A u32 always fits a usize on the platforms we build for; `take` then
    // bounds it by the option data actually received.
    decode_string(take(data, length as usize, what)?, what)
}

/// `NBD_OPT_EXPORT_NAME`: the whole payload is the name.
pub fn decode_export_name(data: &[u8]) -> Result<&str, OptionError> {
    decode_string(data, "export name")
}

/// `NBD_OPT_INFO` / `NBD_OPT_GO` payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a str,
    /// Big-endian `u16` information types, validated to be whole.
    requests: &'a [u8],
}

impl InfoRequest<'_> {
    pub fn requests(&self, info: u16) -> bool {
        self.requests.chunks_exact(2).any(|pair| u16::from_be_bytes([pair[0], pair[1]]) == info)
    }
}

pub fn decode_info_request(data: &[u8]) -> Result<InfoRequest<'_>, OptionError> {
    let mut rest = data;
    let name = take_string(&mut rest, "export name")?;
    let count = take_u16(&mut rest, "information request count")?;
    if rest.len() != usize::from(count) * 2 {
        return Err(OptionError::InfoCount);
    }
    Ok(InfoRequest { name, requests: rest })
}

/// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    pub export_name: &'a str,
    pub queries: Vec<MetaQuery<'a>>,
}

/// What one metadata context query asks for, as far as this server cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaQuery<'a> {
    /// `base:allocation`.
    BaseAllocation,
    /// `base:` — every `base` context when listing; ignored when setting.
    BaseWildcard,
    /// `qemu:dirty-bitmap:LEAF`, holding the leaf.
    DirtyBitmap(&'a str),
    /// `qemu:` or `qemu:dirty-bitmap:` — every dirty bitmap when listing;
    /// ignored when setting.
    DirtyBitmapWildcard,
    /// A leaf or namespace this server does not offer; the spec says ignore it.
    Other,
}

pub fn classify_meta_query(query: &str) -> Result<MetaQuery<'_>, OptionError> {
    let Some((namespace, leaf)) = query.split_once(':') else {
        return Err(OptionError::QueryWithoutNamespace);
    };
    if namespace.is_empty() {
        return Err(OptionError::QueryWithoutNamespace);
    }
    Ok(match (namespace, leaf) {
        ("base", "allocation") => MetaQuery::BaseAllocation,
        ("base", "") => MetaQuery::BaseWildcard,
        ("qemu", "" | "dirty-bitmap:") => MetaQuery::DirtyBitmapWildcard,
        ("qemu", leaf) => match leaf.strip_prefix("dirty-bitmap:") {
            Some(bitmap) => MetaQuery::DirtyBitmap(bitmap),
            None => MetaQuery::Other,
        },
        _ => MetaQuery::Other,
    })
}

/// Decodes the payload. The claimed query count is only trusted as far as the
/// data goes: memory is proportional to bytes received, never to the count.
pub fn decode_meta_context_request(data: &[u8]) -> Result<MetaContextRequest<'_>, OptionError> {
    let mut rest = data;
    let export_name = take_string(&mut rest, "export name")?;
    let count = take_u32(&mut rest, "query count")?;
    let mut queries = Vec::new();
    for _ in 0..count {
        let query = take_string(&mut rest, "metadata context query")?;
        queries.push(classify_meta_query(query)?);
    }
    if !rest.is_empty() {
        return Err(OptionError::TrailingData);
    }
    Ok(MetaContextRequest { export_name, queries })
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).expect("option reply payload exceeds u32")
}

/// Appends one option reply (header and payload) to `out`.
pub fn push_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, payload: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&len_u32(payload.len()).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends an option reply whose payload is built by `build`, patching the
/// length afterwards so no temporary buffer is needed.
fn push_option_reply_with(out: &mut Vec<u8>, option: u32, reply_type: u32, build: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    push_option_reply(out, option, reply_type, &[]);
    build(out);
    let length = len_u32(out.len() - start - OPTION_REPLY_HEADER_BYTES);
    out[start + 16..start + 20].copy_from_slice(&length.to_be_bytes());
}

/// An error reply (`reply_type` has bit 31 set) with a human-readable message.
pub fn push_option_error(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    assert!(reply_type & REP_ERR != 0, "not an error reply type: {reply_type:#x}");
    push_option_reply(out, option, reply_type, truncate_str(message, STRING_BYTES_MAX).as_bytes());
}

/// `NBD_REP_SERVER` for `NBD_OPT_LIST`: name, then description for humans.
pub fn push_rep_server(out: &mut Vec<u8>, name: &str, description: &str) {
    let name = truncate_str(name, STRING_BYTES_MAX);
    let description = truncate_str(description, STRING_BYTES_MAX);
    push_option_reply_with(out, OPT_LIST, REP_SERVER, |out| {
        out.extend_from_slice(&len_u32(name.len()).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(description.as_bytes());
    });
}

/// `NBD_REP_INFO` / `NBD_INFO_EXPORT`: size and transmission flags.
pub fn push_info_export(out: &mut Vec<u8>, option: u32, size_bytes: u64, flags: u16) {
    push_option_reply_with(out, option, REP_INFO, |out| {
        out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        out.extend_from_slice(&size_bytes.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    });
}

/// `NBD_REP_INFO` carrying a string (`NBD_INFO_NAME`, `NBD_INFO_DESCRIPTION`).
pub fn push_info_string(out: &mut Vec<u8>, option: u32, info: u16, value: &str) {
    assert!(info == INFO_NAME || info == INFO_DESCRIPTION);
    let value = truncate_str(value, STRING_BYTES_MAX);
    push_option_reply_with(out, option, REP_INFO, |out| {
        out.extend_from_slice(&info.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    });
}

pub fn push_info_block_size(out: &mut Vec<u8>, option: u32, min: u32, preferred: u32, max: u32) {
    push_option_reply_with(out, option, REP_INFO, |out| {
        out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        out.extend_from_slice(&min.to_be_bytes());
        out.extend_from_slice(&preferred.to_be_bytes());
        out.extend_from_slice(&max.to_be_bytes());
    });
}

pub fn push_meta_context(out: &mut Vec<u8>, option: u32, context_id: u32, name: &str) {
    push_option_reply_with(out, option, REP_META_CONTEXT, |out| {
        out.extend_from_slice(&context_id.to_be_bytes());
        out.extend_from_slice(name.as_bytes());
    });
}

/// The reply that ends the handshake after `NBD_OPT_EXPORT_NAME`; returns how
/// many bytes of `out` to send (the 124 zeroes are left off when the client
/// negotiated `NBD_FLAG_C_NO_ZEROES`).
pub fn encode_export_name_reply(
    size_bytes: u64,
    flags: u16,
    no_zeroes: bool,
    out: &mut [u8; EXPORT_NAME_REPLY_BYTES],
) -> usize {
    out.fill(0);
    out[0..8].copy_from_slice(&size_bytes.to_be_bytes());
    out[8..10].copy_from_slice(&flags.to_be_bytes());
    if no_zeroes {
        10
    } else {
        EXPORT_NAME_REPLY_BYTES
    }
}

pub fn option_name(option: u32) -> &'static str {
    match option {
        OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        OPT_ABORT => "NBD_OPT_ABORT",
        OPT_LIST => "NBD_OPT_LIST",
        OPT_PEEK_EXPORT => "NBD_OPT_PEEK_EXPORT",
        OPT_STARTTLS => "NBD_OPT_STARTTLS",
        OPT_INFO => "NBD_OPT_INFO",
        OPT_GO => "NBD_OPT_GO",
        OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

// --- Transmission -------------------------------------------------------------------------------

/// What an export offers, as far as the transmission flags are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportFeatures {
    pub read_only: bool,
    pub multi_conn: bool,
    pub fast_zero: bool,
}

/// The transmission flags advertised for an export. Write-related features
/// are left off read-only exports so well-behaved clients never try them;
/// `NBD_FLAG_SEND_DF` needs structured replies (spec "Transmission flags").
pub fn transmission_flags(features: ExportFeatures, structured_replies: bool) -> u16 {
    let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
    if features.read_only {
        flags |= FLAG_READ_ONLY;
    } else {
        flags |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
        if features.fast_zero {
            flags |= FLAG_SEND_FAST_ZERO;
        }
    }
    if features.multi_conn {
        flags |= FLAG_CAN_MULTI_CONN;
    }
    if structured_replies {
        flags |= FLAG_SEND_DF;
    }
    flags
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Decodes a request header; a wrong magic (returned as the error) means the
/// stream is out of sync and the connection must be dropped.
pub fn decode_request_header(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, u32> {
    let magic = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        return Err(magic);
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(bytes[4..6].try_into().unwrap()),
        command: u16::from_be_bytes(bytes[6..8].try_into().unwrap()),
        handle: u64::from_be_bytes(bytes[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(bytes[16..24].try_into().unwrap()),
        length: u32::from_be_bytes(bytes[24..28].try_into().unwrap()),
    })
}

/// Everything request validation needs to know about the negotiated session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    pub size_bytes: u64,
    /// Transmission flags as advertised to the client.
    pub flags: u16,
    /// Advertised minimum block size; offsets and lengths must be multiples.
    pub block_min: u32,
    /// Advertised maximum block size; bounds READ and WRITE lengths.
    pub block_max: u32,
    pub structured_replies: bool,
    /// A metadata context (`base:allocation`, a dirty bitmap) was selected
    /// for the export in use.
    pub meta_contexts: bool,
}

/// How `NBD_CMD_WRITE_ZEROES` was asked to zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroMode {
    pub fua: bool,
    pub no_hole: bool,
    pub fast: bool,
}

/// A request that passed validation: in range, flags allowed, negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read { offset: u64, length: u32 },
    Write { offset: u64, length: u32, fua: bool },
    Disconnect,
    Flush,
    Trim { offset: u64, length: u32, fua: bool },
    WriteZeroes { offset: u64, length: u32, mode: ZeroMode },
    BlockStatus { offset: u64, length: u32, req_one: bool },
}

/// What was wrong with a request; the `Display` text is sent to the client in
/// structured error replies and logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestFault {
    UnknownCommand { command: u16 },
    UnknownFlags { command: u16, flags: u16 },
    FlagNotAllowed { command: u16, flag: &'static str },
    NotNegotiated { command: u16, what: &'static str },
    ReadOnly { command: u16 },
    FlushNotZero { offset: u64, length: u32 },
    ZeroLength { command: u16 },
    OutOfRange { command: u16, offset: u64, length: u32, size_bytes: u64 },
    Misaligned { command: u16, offset: u64, length: u32, block_min: u32 },
    TooLarge { command: u16, length: u32, block_max: u32 },
}

impl fmt::Display for RequestFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RequestFault::UnknownCommand { command } => write!(f, "unknown command {command}"),
            RequestFault::UnknownFlags { command, flags } => {
                write!(f, "{}: unknown flags {flags:#06x}", command_name(command))
            }
            RequestFault::FlagNotAllowed { command, flag } => {
                write!(f, "{}: flag {flag} not allowed here", command_name(command))
            }
            RequestFault::NotNegotiated { command, what } => {
                write!(f, "{}: {what} was not negotiated", command_name(command))
            }
            RequestFault::ReadOnly { command } => {
                write!(f, "{}: export is read-only", command_name(command))
            }
            RequestFault::FlushNotZero { offset, length } => {
                write!(f, "NBD_CMD_FLUSH: offset {offset} and length {length} must be zero")
            }
            RequestFault::ZeroLength { command } => {
                write!(f, "{}: zero length", command_name(command))
            }
            RequestFault::OutOfRange { command, offset, length, size_bytes } => write!(
                f,
                "{}: offset {offset} + length {length} is beyond the export size {size_bytes}",
                command_name(command)
            ),
            RequestFault::Misaligned { command, offset, length, block_min } => write!(
                f,
                "{}: offset {offset} and length {length} must be multiples of {block_min}",
                command_name(command)
            ),
            RequestFault::TooLarge { command, length, block_max } => {
                write!(f, "{}: length {length} exceeds the maximum block size {block_max}", command_name(command))
            }
        }
    }
}

/// Why a request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Reply with `errno`; the connection carries on (after skipping a WRITE's
    /// payload).
    Reply { errno: u32, fault: RequestFault },
    /// A WRITE whose payload is too large to read: hard disconnect, as the
    /// spec allows for payloads that would be a denial of service.
    Disconnect { length: u32 },
}

/// Validates a request against the session, in the order the spec's errors
/// take precedence: read-only before flags, range before alignment.
pub fn validate_request(header: &RequestHeader, session: &Session) -> Result<Command, Refusal> {
    let RequestHeader { flags, command, offset, length, .. } = *header;
    let reject = |errno, fault| Err(Refusal::Reply { errno, fault });

    if command == CMD_WRITE && length > PAYLOAD_BYTES_MAX {
        return Err(Refusal::Disconnect { length });
    }
    let writes = matches!(command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    match command {
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_WRITE_ZEROES | CMD_BLOCK_STATUS => {}
        // Offset, length and flags of a disconnect are meaningless; it ends
        // the session whatever they say.
        CMD_DISC => return Ok(Command::Disconnect),
        _ => return reject(EINVAL, RequestFault::UnknownCommand { command }),
    }
    if writes && session.flags & FLAG_READ_ONLY != 0 {
        return reject(EPERM, RequestFault::ReadOnly { command });
    }

    if flags & !CMD_FLAGS_KNOWN != 0 {
        return reject(EINVAL, RequestFault::UnknownFlags { command, flags });
    }
    let not_allowed = |flag| reject(EINVAL, RequestFault::FlagNotAllowed { command, flag });
    if flags & CMD_FLAG_FUA != 0 && session.flags & FLAG_SEND_FUA == 0 {
        return not_allowed("NBD_CMD_FLAG_FUA");
    }
    if flags & CMD_FLAG_NO_HOLE != 0 && command != CMD_WRITE_ZEROES {
        return not_allowed("NBD_CMD_FLAG_NO_HOLE");
    }
    if flags & CMD_FLAG_DF != 0 && (command != CMD_READ || session.flags & FLAG_SEND_DF == 0) {
        return not_allowed("NBD_CMD_FLAG_DF");
    }
    if flags & CMD_FLAG_REQ_ONE != 0 && command != CMD_BLOCK_STATUS {
        return not_allowed("NBD_CMD_FLAG_REQ_ONE");
    }
    if flags & CMD_FLAG_FAST_ZERO != 0 && (command != CMD_WRITE_ZEROES || session.flags & FLAG_SEND_FAST_ZERO == 0) {
        return not_allowed("NBD_CMD_FLAG_FAST_ZERO");
    }

    let not_negotiated = |what| reject(EINVAL, RequestFault::NotNegotiated { command, what });
    match command {
        CMD_FLUSH if session.flags & FLAG_SEND_FLUSH == 0 => return not_negotiated("flush"),
        CMD_TRIM if session.flags & FLAG_SEND_TRIM == 0 => return not_negotiated("trim"),
        CMD_WRITE_ZEROES if session.flags & FLAG_SEND_WRITE_ZEROES == 0 => return not_negotiated("write zeroes"),
        CMD_BLOCK_STATUS if !session.structured_replies => return not_negotiated("structured replies"),
        CMD_BLOCK_STATUS if !session.meta_contexts => return not_negotiated("a metadata context"),
        CMD_FLUSH => {
            if offset != 0 || length != 0 {
                return reject(EINVAL, RequestFault::FlushNotZero { offset, length });
            }
            return Ok(Command::Flush);
        }
        _ => {}
    }

    if length == 0 {
        return reject(EINVAL, RequestFault::ZeroLength { command });
    }
    let end = offset.checked_add(u64::from(length));
    if end.is_none_or(|end| end > session.size_bytes) {
        // The spec asks for ENOSPC when a write runs off the end, EINVAL for
        // everything else.
        let errno = if matches!(command, CMD_WRITE | CMD_WRITE_ZEROES) { ENOSPC } else { EINVAL };
        let size_bytes = session.size_bytes;
        return reject(errno, RequestFault::OutOfRange { command, offset, length, size_bytes });
    }
    let block_min = session.block_min;
    if block_min > 1 && (offset % u64::from(block_min) != 0 || length % block_min != 0) {
        return reject(EINVAL, RequestFault::Misaligned { command, offset, length, block_min });
    }
    // Only READ and WRITE carry payloads; TRIM, WRITE_ZEROES and BLOCK_STATUS
    // cost no memory per byte, so any in-range length is served.
    if matches!(command, CMD_READ | CMD_WRITE) && length > session.block_max {
        let block_max = session.block_max;
        return reject(EINVAL, RequestFault::TooLarge { command, length, block_max });
    }

    let fua = flags & CMD_FLAG_FUA != 0;
    Ok(match command {
        CMD_READ => Command::Read { offset, length },
        CMD_WRITE => Command::Write { offset, length, fua },
        CMD_TRIM => Command::Trim { offset, length, fua },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            mode: ZeroMode { fua, no_hole: flags & CMD_FLAG_NO_HOLE != 0, fast: flags & CMD_FLAG_FAST_ZERO != 0 },
        },
        CMD_BLOCK_STATUS => Command::BlockStatus { offset, length, req_one: flags & CMD_FLAG_REQ_ONE != 0 },
        _ => unreachable!("command {command} was matched above"),
    })
}

pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "NBD_CMD_READ",
        CMD_WRITE => "NBD_CMD_WRITE",
        CMD_DISC => "NBD_CMD_DISC",
        CMD_FLUSH => "NBD_CMD_FLUSH",
        CMD_TRIM => "NBD_CMD_TRIM",
        CMD_CACHE => "NBD_CMD_CACHE",
        CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        _ => "unknown command",
    }
}

pub fn encode_simple_reply(handle: u64, errno: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out
}

pub fn encode_chunk_header(flags: u16, reply_type: u16, handle: u64, length: u32) -> [u8; CHUNK_HEADER_BYTES] {
    let mut out = [0u8; CHUNK_HEADER_BYTES];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&reply_type.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out[16..20].copy_from_slice(&length.to_be_bytes());
    out
}

/// Header of the single, final `NBD_REPLY_TYPE_OFFSET_DATA` chunk that answers
/// a whole READ; the data follows. Marking the data chunk DONE is allowed
/// because the data is in memory before the header is sent, so no error can
/// turn up while it is being transmitted.
pub fn encode_read_chunk_prefix(handle: u64, offset: u64, data_bytes: u32) -> [u8; READ_CHUNK_PREFIX_BYTES] {
    assert!(data_bytes > 0 && data_bytes <= PAYLOAD_BYTES_MAX);
    let mut out = [0u8; READ_CHUNK_PREFIX_BYTES];
    let header = encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, handle, data_bytes + 8);
    out[..CHUNK_HEADER_BYTES].copy_from_slice(&header);
    out[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    out
}

/// Appends a final `NBD_REPLY_TYPE_ERROR` chunk with a message for humans.
pub fn push_error_chunk(out: &mut Vec<u8>, handle: u64, errno: u32, message: &str) {
    assert!(errno != 0);
    let message = truncate_str(message, STRING_BYTES_MAX);
    let length = len_u32(4 + 2 + message.len());
    out.extend_from_slice(&encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, length));
    out.extend_from_slice(&errno.to_be_bytes());
    // Fits: STRING_BYTES_MAX <= u16::MAX, checked at compile time.
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// Appends one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk, the answer of metadata
/// context `context_id`, from the `(length, status)` extents the export
/// reported; `done` makes it the reply's last chunk (a request gets one
/// chunk per context selected).
///
/// Adjacent extents with the same status are merged (the spec asks for
/// differing consecutive statuses), the list is cut at
/// `EXTENTS_PER_REPLY_MAX` descriptors, and with `req_one` only the first
/// extent is sent. The export promised extents that cover at least the first
/// byte and no more than the request; that is asserted, not trusted.
pub fn push_block_status_chunk(
    out: &mut Vec<u8>,
    handle: u64,
    context_id: u32,
    extents: impl IntoIterator<Item = (u64, u32)>,
    request_length: u32,
    req_one: bool,
    done: bool,
) {
    let start = out.len();
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    out.extend_from_slice(&encode_chunk_header(flags, REPLY_TYPE_BLOCK_STATUS, handle, 0));
    out.extend_from_slice(&context_id.to_be_bytes());

    let mut covered: u64 = 0;
    let mut descriptors: usize = 0;
    // The pending descriptor, extended while the status stays the same.
    let mut pending: Option<(u64, u32)> = None;
    for (extent_length, status) in extents {
        assert!(extent_length > 0, "export reported an empty extent");
        covered += extent_length;
        assert!(covered <= u64::from(request_length), "export reported extents past the request");
        match &mut pending {
            Some((length, pending_status)) if *pending_status == status => {
                *length += extent_length;
            }
            _ => {
                if let Some((length, status)) = pending.take() {
                    push_descriptor(out, length, status);
                    descriptors += 1;
                    if req_one || descriptors == EXTENTS_PER_REPLY_MAX {
                        break;
                    }
                }
                pending = Some((extent_length, status));
            }
        }
    }
    assert!(covered > 0, "export reported no extents");
    if let Some((length, status)) = pending {
        if descriptors < EXTENTS_PER_REPLY_MAX && !(req_one && descriptors == 1) {
            push_descriptor(out, length, status);
        }
    }
    let length = len_u32(out.len() - start - CHUNK_HEADER_BYTES);
    out[start + 16..start + 20].copy_from_slice(&length.to_be_bytes());
}

fn push_descriptor(out: &mut Vec<u8>, length: u64, status: u32) {
    // Bounded by the request length, a u32.
    let length = u32::try_from(length).expect("extent longer than the request");
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&status.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::Extent;

    fn option_reply_parts(bytes: &[u8]) -> (u32, u32, &[u8]) {
        assert_eq!(u64::from_be_bytes(bytes[0..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
        let option = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        let reply = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        assert_eq!(bytes.len(), 20 + length, "one reply, length field matches");
        (option, reply, &bytes[20..])
    }

    fn session() -> Session {
        Session {
            size_bytes: 1 << 20,
            flags: transmission_flags(ExportFeatures { read_only: false, multi_conn: true, fast_zero: true }, true),
            block_min: 1,
            block_max: PAYLOAD_BYTES_MAX,
            structured_replies: true,
            meta_contexts: true,
        }
    }

    fn request(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader { flags, command, handle: 7, offset, length }
    }

    fn errno_of(result: Result<Command, Refusal>) -> u32 {
        match result {
            Err(Refusal::Reply { errno, .. }) => errno,
            other => panic!("expected a refusal with errno, got {other:?}"),
        }
    }

    #[test]
    fn greeting_bytes() {
        let g = encode_greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    }

    #[test]
    fn client_flags() {
        assert_eq!(decode_client_flags([0, 0, 0, 3]), Ok(ClientFlags { fixed_newstyle: true, no_zeroes: true }));
        assert_eq!(decode_client_flags([0, 0, 0, 0]), Ok(ClientFlags { fixed_newstyle: false, no_zeroes: false }));
        assert_eq!(decode_client_flags([0, 0, 0, 4]), Err(4));
        assert_eq!(decode_client_flags([0x80, 0, 0, 1]), Err(0x8000_0001));
    }

    #[test]
    fn option_header() {
        let mut bytes = [0u8; 16];
        bytes[0..8].copy_from_slice(b"IHAVEOPT");
        bytes[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        bytes[12..16].copy_from_slice(&77u32.to_be_bytes());
        assert_eq!(decode_option_header(&bytes), Ok(OptionHeader { option: OPT_GO, length: 77 }));
        bytes[0] = b'X';
        assert!(decode_option_header(&bytes).is_err());
    }

    #[test]
    fn strings_are_validated() {
        assert_eq!(decode_export_name(b"volume@2026-01-01T00:00:00Z"), Ok("volume@2026-01-01T00:00:00Z"));
        assert_eq!(decode_export_name(b""), Ok(""));
        assert_eq!(decode_export_name(b"a\0b"), Err(OptionError::StringHasNul("export name")));
        assert_eq!(decode_export_name(&[0xff, 0xfe]), Err(OptionError::StringNotUtf8("export name")));
        let long = vec![b'a'; STRING_BYTES_MAX + 1];
        assert_eq!(decode_export_name(&long), Err(OptionError::StringTooLong("export name")));
        assert!(decode_export_name(&long[..STRING_BYTES_MAX]).is_ok());
    }

    fn info_payload(name: &[u8], count: u16, infos: &[u16]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name);
        data.extend_from_slice(&count.to_be_bytes());
        for info in infos {
            data.extend_from_slice(&info.to_be_bytes());
        }
        data
    }

    #[test]
    fn info_request_decodes() {
        let data = info_payload(b"db", 2, &[INFO_NAME, INFO_BLOCK_SIZE]);
        let request = decode_info_request(&data).unwrap();
        assert_eq!(request.name, "db");
        assert!(request.requests(INFO_NAME));
        assert!(request.requests(INFO_BLOCK_SIZE));
        assert!(!request.requests(INFO_DESCRIPTION));
        let data = info_payload(b"", 0, &[]);
        let empty = decode_info_request(&data).unwrap();
        assert_eq!(empty.name, "");
        assert!(!empty.requests(INFO_EXPORT));
    }

    #[test]
    fn info_request_rejects_malformed() {
        assert_eq!(decode_info_request(&[]), Err(OptionError::Truncated("export name")));
        assert_eq!(decode_info_request(&info_payload(b"db", 3, &[1, 2])), Err(OptionError::InfoCount));
        assert_eq!(decode_info_request(&info_payload(b"db", 1, &[1, 2])), Err(OptionError::InfoCount));
        let mut odd = info_payload(b"db", 1, &[1]);
        odd.push(0);
        assert_eq!(decode_info_request(&odd), Err(OptionError::InfoCount));
        // Name length claims more than the payload holds.
        let mut lying = info_payload(b"db", 0, &[]);
        lying[0..4].copy_from_slice(&1000u32.to_be_bytes());
        assert_eq!(decode_info_request(&lying), Err(OptionError::Truncated("export name")));
        let mut huge = info_payload(b"db", 0, &[]);
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_info_request(&huge), Err(OptionError::Truncated("export name")));
        // No count after the name.
        assert_eq!(decode_info_request(&[0, 0, 0, 0]), Err(OptionError::Truncated("information request count")));
    }

    fn meta_payload(name: &str, count: u32, queries: &[&str]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&count.to_be_bytes());
        for q in queries {
            data.extend_from_slice(&(q.len() as u32).to_be_bytes());
            data.extend_from_slice(q.as_bytes());
        }
        data
    }

    #[test]
    fn meta_context_request_decodes() {
        let queries = ["base:allocation", "base:", "qemu:dirty-bitmap:x", "base:other", "qemu:", "qemu:dirty-bitmap:"];
        let data = meta_payload("db", 7, &[&queries[..], &["qemu:other"]].concat());
        let request = decode_meta_context_request(&data).unwrap();
        assert_eq!(request.export_name, "db");
        assert_eq!(
            request.queries,
            vec![
                MetaQuery::BaseAllocation,
                MetaQuery::BaseWildcard,
                MetaQuery::DirtyBitmap("x"),
                MetaQuery::Other,
                MetaQuery::DirtyBitmapWildcard,
                MetaQuery::DirtyBitmapWildcard,
                MetaQuery::Other,
            ]
        );
        let data = meta_payload("", 0, &[]);
        let none = decode_meta_context_request(&data).unwrap();
        assert!(none.queries.is_empty());
    }

    #[test]
    fn meta_context_request_rejects_malformed() {
        assert_eq!(
            decode_meta_context_request(&meta_payload("db", 2, &["base:allocation"])),
            Err(OptionError::Truncated("metadata context query"))
        );
        assert_eq!(
            decode_meta_context_request(&meta_payload("db", 1, &["base:allocation", "x:y"])),
            Err(OptionError::TrailingData)
        );
        assert_eq!(
            decode_meta_context_request(&meta_payload("db", 1, &["allocation"])),
            Err(OptionError::QueryWithoutNamespace)
        );
        assert_eq!(
            decode_meta_context_request(&meta_payload("db", 1, &[":allocation"])),
            Err(OptionError::QueryWithoutNamespace)
        );
        // A count of four billion with no data behind it costs nothing.
        assert_eq!(
            decode_meta_context_request(&meta_payload("db", u32::MAX, &[])),
            Err(OptionError::Truncated("metadata context query"))
        );
        assert_eq!(decode_meta_context_request(&[0, 0, 0, 0]), Err(OptionError::Truncated("query count")));
    }

    #[test]
    fn option_replies_encode() {
        let mut out = Vec::new();
        push_option_reply(&mut out, OPT_ABORT, REP_ACK, &[]);
        assert_eq!(option_reply_parts(&out), (OPT_ABORT, REP_ACK, &[][..]));

        out.clear();
        push_rep_server(&mut out, "volume", "live volume");
        let (option, reply, payload) = option_reply_parts(&out);
        assert_eq!((option, reply), (OPT_LIST, REP_SERVER));
        assert_eq!(&payload[0..4], &6u32.to_be_bytes());
        assert_eq!(&payload[4..10], b"volume");
        assert_eq!(&payload[10..], b"live volume");

        out.clear();
        push_info_export(&mut out, OPT_GO, 1 << 30, FLAG_HAS_FLAGS | FLAG_READ_ONLY);
        let (_, reply, payload) = option_reply_parts(&out);
        assert_eq!(reply, REP_INFO);
        assert_eq!(payload.len(), 12);
        assert_eq!(&payload[0..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(&payload[2..10], &(1u64 << 30).to_be_bytes());
        assert_eq!(&payload[10..12], &3u16.to_be_bytes());

        out.clear();
        push_info_block_size(&mut out, OPT_INFO, 512, 4096, PAYLOAD_BYTES_MAX);
        let (option, _, payload) = option_reply_parts(&out);
        assert_eq!(option, OPT_INFO);
        assert_eq!(payload.len(), 14);
        assert_eq!(&payload[10..14], &PAYLOAD_BYTES_MAX.to_be_bytes());

        out.clear();
        push_info_string(&mut out, OPT_GO, INFO_DESCRIPTION, "hello");
        let (_, _, payload) = option_reply_parts(&out);
        assert_eq!(&payload[0..2], &INFO_DESCRIPTION.to_be_bytes());
        assert_eq!(&payload[2..], b"hello");

        out.clear();
        push_meta_context(&mut out, OPT_SET_META_CONTEXT, 1, META_BASE_ALLOCATION);
        let (_, reply, payload) = option_reply_parts(&out);
        assert_eq!(reply, REP_META_CONTEXT);
        assert_eq!(&payload[0..4], &1u32.to_be_bytes());
        assert_eq!(&payload[4..], b"base:allocation");

        out.clear();
        let long = "é".repeat(STRING_BYTES_MAX);
        push_option_error(&mut out, OPT_GO, REP_ERR_UNKNOWN, &long);
        let (_, reply, payload) = option_reply_parts(&out);
        assert_eq!(reply, REP_ERR_UNKNOWN);
        assert_eq!(payload.len(), STRING_BYTES_MAX);
        assert!(std::str::from_utf8(payload).is_ok(), "cut on a character boundary");
    }

    #[test]
    fn export_name_reply_honours_no_zeroes() {
        let mut out = [0xffu8; EXPORT_NAME_REPLY_BYTES];
        assert_eq!(encode_export_name_reply(4096, 0x0103, false, &mut out), 134);
        assert_eq!(&out[0..8], &4096u64.to_be_bytes());
        assert_eq!(&out[8..10], &0x0103u16.to_be_bytes());
        assert!(out[10..].iter().all(|&b| b == 0));
        assert_eq!(encode_export_name_reply(4096, 0x0103, true, &mut out), 10);
    }

    #[test]
    fn transmission_flags_follow_features() {
        let rw = ExportFeatures { read_only: false, multi_conn: false, fast_zero: false };
        let flags = transmission_flags(rw, false);
        assert_eq!(flags, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES);
        let all = ExportFeatures { read_only: false, multi_conn: true, fast_zero: true };
        let flags = transmission_flags(all, true);
        assert!(flags & FLAG_SEND_FAST_ZERO != 0);
        assert!(flags & FLAG_CAN_MULTI_CONN != 0);
        assert!(flags & FLAG_SEND_DF != 0);
        let ro = ExportFeatures { read_only: true, multi_conn: false, fast_zero: true };
        let flags = transmission_flags(ro, true);
        assert!(flags & FLAG_READ_ONLY != 0);
        assert_eq!(flags & (FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO), 0);
    }

    #[test]
    fn request_header_decodes() {
        let mut bytes = [0u8; REQUEST_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        bytes[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        bytes[8..16].copy_from_slice(&0xdead_beef_u64.to_be_bytes());
        bytes[16..24].copy_from_slice(&4096u64.to_be_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_be_bytes());
        assert_eq!(
            decode_request_header(&bytes),
            Ok(RequestHeader {
                flags: CMD_FLAG_FUA,
                command: CMD_WRITE,
                handle: 0xdead_beef,
                offset: 4096,
                length: 512
            })
        );
        bytes[3] ^= 1;
        assert_eq!(decode_request_header(&bytes), Err(REQUEST_MAGIC ^ 1));
    }

    #[test]
    fn valid_requests_pass() {
        let s = session();
        assert_eq!(validate_request(&request(CMD_READ, 0, 0, 4096), &s), Ok(Command::Read { offset: 0, length: 4096 }));
        assert_eq!(
            validate_request(&request(CMD_READ, CMD_FLAG_DF, 0, 1), &s),
            Ok(Command::Read { offset: 0, length: 1 })
        );
        assert_eq!(
            validate_request(&request(CMD_WRITE, CMD_FLAG_FUA, (1 << 20) - 512, 512), &s),
            Ok(Command::Write { offset: (1 << 20) - 512, length: 512, fua: true })
        );
        assert_eq!(validate_request(&request(CMD_FLUSH, 0, 0, 0), &s), Ok(Command::Flush));
        assert_eq!(
            validate_request(&request(CMD_TRIM, 0, 0, 1 << 20), &s),
            Ok(Command::Trim { offset: 0, length: 1 << 20, fua: false })
        );
        assert_eq!(
            validate_request(
                &request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA, 8, 8),
                &s
            ),
            Ok(Command::WriteZeroes { offset: 8, length: 8, mode: ZeroMode { fua: true, no_hole: true, fast: true } })
        );
        assert_eq!(
            validate_request(&request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 100), &s),
            Ok(Command::BlockStatus { offset: 0, length: 100, req_one: true })
        );
        // A disconnect ends the session whatever else it carries.
        assert_eq!(validate_request(&request(CMD_DISC, 0xffff, 5, 5), &s), Ok(Command::Disconnect));
    }

    #[test]
    fn invalid_requests_get_the_spec_errno() {
        let s = session();
        assert_eq!(errno_of(validate_request(&request(99, 0, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_CACHE, 0, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 1 << 9, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE, CMD_FLAG_REQ_ONE, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_TRIM, CMD_FLAG_FAST_ZERO, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE, CMD_FLAG_DF, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_FLUSH, 0, 1, 0), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 0, 0), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE, 0, 0, 0), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 1 << 20, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, u64::MAX, 2), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_TRIM, 0, (1 << 20) - 1, 2), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_BLOCK_STATUS, 0, 1 << 20, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE, 0, (1 << 20) - 1, 2), &s)), ENOSPC);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE_ZEROES, 0, u64::MAX, 1), &s)), ENOSPC);
    }

    #[test]
    fn read_only_export_refuses_writes_with_eperm() {
        let mut s = session();
        s.flags = transmission_flags(ExportFeatures { read_only: true, multi_conn: false, fast_zero: false }, true);
        for command in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES] {
            // EPERM wins over flags and range problems.
            assert_eq!(errno_of(validate_request(&request(command, CMD_FLAG_FUA, u64::MAX, 1), &s)), EPERM);
        }
        assert!(validate_request(&request(CMD_READ, 0, 0, 1), &s).is_ok());
        assert!(validate_request(&request(CMD_FLUSH, 0, 0, 0), &s).is_ok());
        // FUA was not advertised for a read-only export.
        assert_eq!(errno_of(validate_request(&request(CMD_READ, CMD_FLAG_FUA, 0, 1), &s)), EINVAL);
    }

    #[test]
    fn negotiation_gates_commands_and_flags() {
        let mut s = session();
        s.meta_contexts = false;
        assert_eq!(errno_of(validate_request(&request(CMD_BLOCK_STATUS, 0, 0, 1), &s)), EINVAL);
        s.structured_replies = false;
        s.flags &= !FLAG_SEND_DF;
        assert_eq!(errno_of(validate_request(&request(CMD_BLOCK_STATUS, 0, 0, 1), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, CMD_FLAG_DF, 0, 1), &s)), EINVAL);
        s.flags &= !FLAG_SEND_FAST_ZERO;
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), &s)), EINVAL);
    }

    #[test]
    fn block_size_limits() {
        let mut s = session();
        s.block_min = 512;
        s.block_max = 1 << 16;
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 1, 512), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 0, 511), &s)), EINVAL);
        assert!(validate_request(&request(CMD_READ, 0, 512, 1024), &s).is_ok());
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 0, 1 << 17), &s)), EINVAL);
        assert_eq!(errno_of(validate_request(&request(CMD_WRITE, 0, 0, 1 << 17), &s)), EINVAL);
        // Commands without payload are not bound by the maximum block size.
        assert!(validate_request(&request(CMD_TRIM, 0, 0, 1 << 18), &s).is_ok());
        assert!(validate_request(&request(CMD_WRITE_ZEROES, 0, 0, 1 << 18), &s).is_ok());
    }

    #[test]
    fn oversized_write_payload_disconnects() {
        let s = session();
        let length = PAYLOAD_BYTES_MAX + 1;
        assert_eq!(validate_request(&request(CMD_WRITE, 0, 0, length), &s), Err(Refusal::Disconnect { length }));
        // Reads of the same size carry no client payload: a plain error.
        assert_eq!(errno_of(validate_request(&request(CMD_READ, 0, 0, length), &s)), EINVAL);
        assert!(validate_request(&request(CMD_WRITE, 0, 0, PAYLOAD_BYTES_MAX), &Session { size_bytes: u64::MAX, ..s })
            .is_ok());
    }

    #[test]
    fn replies_encode() {
        let simple = encode_simple_reply(0x0102_0304_0506_0708, EPERM);
        assert_eq!(&simple[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&simple[4..8], &EPERM.to_be_bytes());
        assert_eq!(&simple[8..16], &0x0102_0304_0506_0708u64.to_be_bytes());

        let prefix = encode_read_chunk_prefix(9, 4096, 512);
        assert_eq!(&prefix[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&prefix[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&prefix[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&prefix[8..16], &9u64.to_be_bytes());
        assert_eq!(&prefix[16..20], &520u32.to_be_bytes());
        assert_eq!(&prefix[20..28], &4096u64.to_be_bytes());

        let mut out = Vec::new();
        push_error_chunk(&mut out, 3, EIO, "disk on fire");
        assert_eq!(&out[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&out[16..20], &(6 + 12u32).to_be_bytes());
        assert_eq!(&out[20..24], &EIO.to_be_bytes());
        assert_eq!(&out[24..26], &12u16.to_be_bytes());
        assert_eq!(&out[26..], b"disk on fire");
    }

    fn descriptors(out: &[u8]) -> Vec<(u32, u32)> {
        assert_eq!(&out[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        let length = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert_eq!(out.len(), CHUNK_HEADER_BYTES + length);
        assert_eq!(&out[20..24], &META_BASE_ALLOCATION_ID.to_be_bytes());
        out[24..]
            .chunks_exact(8)
            .map(|d| (u32::from_be_bytes(d[0..4].try_into().unwrap()), u32::from_be_bytes(d[4..8].try_into().unwrap())))
            .collect()
    }

    fn extent(length: u64, hole: bool) -> (u64, u32) {
        (length, Extent { length, hole, zero: hole }.status())
    }

    fn push_allocation(out: &mut Vec<u8>, extents: &[(u64, u32)], request_length: u32, req_one: bool) {
        push_block_status_chunk(
            out,
            1,
            META_BASE_ALLOCATION_ID,
            extents.iter().copied(),
            request_length,
            req_one,
            true,
        );
    }

    #[test]
    fn block_status_merges_and_limits() {
        let mut out = Vec::new();
        let extents = [extent(512, false), extent(512, false), extent(1024, true), extent(512, false)];
        push_allocation(&mut out, &extents, 4096, false);
        assert_eq!(descriptors(&out), vec![(1024, 0), (1024, STATE_HOLE | STATE_ZERO), (512, 0)]);

        out.clear();
        push_allocation(&mut out, &extents, 4096, true);
        assert_eq!(descriptors(&out), vec![(1024, 0)]);

        out.clear();
        push_allocation(&mut out, &[extent(100, true)], 100, true);
        assert_eq!(descriptors(&out), vec![(100, STATE_HOLE | STATE_ZERO)]);

        let many: Vec<(u64, u32)> = (0..EXTENTS_PER_REPLY_MAX as u64 + 10).map(|i| extent(1, i % 2 == 0)).collect();
        out.clear();
        push_allocation(&mut out, &many, u32::MAX, false);
        assert_eq!(descriptors(&out).len(), EXTENTS_PER_REPLY_MAX);
    }

    #[test]
    #[should_panic(expected = "past the request")]
    fn block_status_asserts_export_contract() {
        push_allocation(&mut Vec::new(), &[extent(513, false)], 512, false);
    }

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        fn session_strategy() -> impl Strategy<Value = Session> {
            (any::<u64>(), any::<u16>(), 0u32..=16, any::<u32>(), any::<bool>(), any::<bool>()).prop_map(
                |(size_bytes, flags, min_shift, block_max, structured_replies, meta_contexts)| Session {
                    size_bytes,
                    flags: flags | FLAG_HAS_FLAGS,
                    block_min: 1 << min_shift,
                    block_max: block_max.min(PAYLOAD_BYTES_MAX),
                    structured_replies,
                    meta_contexts,
                },
            )
        }

        proptest! {
            /// Whatever a client sends, the option decoders return a value
            /// or an error, never panic, and never read past the data.
            #[test]
            fn option_decoders_are_total(data in vec(any::<u8>(), 0..600)) {
                let _ = decode_export_name(&data);
                if let Ok(request) = decode_info_request(&data) {
                    prop_assert!(request.name.len() + 6 <= data.len());
                }
                if let Ok(request) = decode_meta_context_request(&data) {
                    prop_assert!(request.queries.len() * 4 + 8 <= data.len());
                }
                let mut header = [0u8; OPTION_HEADER_BYTES];
                let n = data.len().min(OPTION_HEADER_BYTES);
                header[..n].copy_from_slice(&data[..n]);
                let _ = decode_option_header(&header);
            }

            /// Encoded requests decode to what was sent.
            #[test]
            fn info_requests_round_trip(name in "[a-z@:0-9-]{0,64}", infos in vec(any::<u16>(), 0..8)) {
                let mut data = (name.len() as u32).to_be_bytes().to_vec();
                data.extend_from_slice(name.as_bytes());
                data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
                for info in &infos {
                    data.extend_from_slice(&info.to_be_bytes());
                }
                let request = decode_info_request(&data).unwrap();
                prop_assert_eq!(request.name, name.as_str());
                for info in infos {
                    prop_assert!(request.requests(info));
                }
            }

            /// Every request that passes validation is one the export may be
            /// handed: in range, non-empty, aligned, within the payload
            /// limit, and not a write to a read-only export. This is the
            /// contract `Export` implementations rely on.
            #[test]
            fn validated_requests_keep_the_export_contract(
                session in session_strategy(),
                flags in any::<u16>(),
                command in 0u16..10,
                offset in prop_oneof![any::<u64>(), 0u64..(1 << 20)],
                length in prop_oneof![any::<u32>(), 0u32..(1 << 16)],
            ) {
                let header = RequestHeader { flags, command, handle: 1, offset, length };
                let range = |offset: u64, length: u32| {
                    prop_assert!(length > 0);
                    let end = offset.checked_add(u64::from(length));
                    prop_assert!(end.is_some_and(|end| end <= session.size_bytes));
                    prop_assert_eq!(offset % u64::from(session.block_min), 0);
                    prop_assert_eq!(length % session.block_min, 0);
                    Ok(())
                };
                let read_only = session.flags & FLAG_READ_ONLY != 0;
                match validate_request(&header, &session) {
                    Ok(Command::Read { offset, length }) => {
                        range(offset, length)?;
                        prop_assert!(length <= session.block_max);
                    }
                    Ok(Command::Write { offset, length, .. }) => {
                        range(offset, length)?;
                        prop_assert!(length <= session.block_max && !read_only);
                    }
                    Ok(Command::Trim { offset, length, .. })
                    | Ok(Command::WriteZeroes { offset, length, .. }) => {
                        range(offset, length)?;
                        prop_assert!(!read_only);
                    }
                    Ok(Command::BlockStatus { offset, length, .. }) => {
                        range(offset, length)?;
                        prop_assert!(session.structured_replies && session.meta_contexts);
                    }
                    Ok(Command::Flush) => prop_assert_eq!((offset, length), (0, 0)),
                    Ok(Command::Disconnect) => prop_assert_eq!(command, CMD_DISC),
                    Err(Refusal::Reply { errno, .. }) => {
                        prop_assert!([EPERM, EINVAL, ENOSPC].contains(&errno));
                    }
                    Err(Refusal::Disconnect { length }) => {
                        prop_assert!(command == CMD_WRITE && length > PAYLOAD_BYTES_MAX);
                    }
                }
            }
        }
    }
}
