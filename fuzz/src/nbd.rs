//! The NBD targets' world: a catalog of in-memory exports that assert the
//! contract the server promises them (validated ranges only), and a client
//! model that reads the client's byte stream the way the spec frames it and
//! then walks the server's output against it.
//!
//! The model predicts only what the spec and the catalog decide — where each
//! message ends, which option enters transmission, which requests must be
//! answered — and checks that every reply is well-formed and answers what
//! was asked: greeting; for each complete option its replies, echoing the
//! option and ending in `NBD_REP_ACK` or an error; for each complete request
//! (but `NBD_CMD_DISC`) exactly one final reply to its handle, a READ's
//! with exactly its bytes, nothing structured unless negotiated. Handles are
//! rewritten to the request's sequence number before the server sees them,
//! so a reply names its request unambiguously.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_nbd::protocol as p;
use rewind_nbd::{
    BlockSizes, Catalog, Client, DirtyBitmap, DirtyExtent, Export, ExportError, ExportErrorKind, ExportListing, Extent,
    OpenError, OpenErrorKind, ZeroFlags,
};

// --- Exports ----------------------------------------------------------------------------

/// How an export behaves.
#[derive(Clone, Copy, Debug)]
pub struct ExportShape {
    pub name: &'static str,
    pub size_bytes: u64,
    pub sizes: BlockSizes,
    pub read_only: bool,
    /// Every operation fails (with an error chosen by the offset).
    pub failing: bool,
}

/// The catalog every NBD input is served from (small, because each input
/// opens its export afresh): a writable byte-addressed export, one with
/// 4 KiB blocks and a maximum below the server's, a read-only one, and one
/// whose every operation fails.
pub const EXPORTS: [ExportShape; 4] = [
    ExportShape {
        name: "disk",
        size_bytes: 256 << 10,
        sizes: BlockSizes::UNCONSTRAINED,
        read_only: false,
        failing: false,
    },
    ExportShape {
        name: "aligned",
        size_bytes: 128 << 10,
        sizes: BlockSizes { minimum: 4096, preferred: 4096, maximum: 64 << 10 },
        read_only: false,
        failing: false,
    },
    ExportShape {
        name: "view@-10m",
        size_bytes: 64 << 10,
        sizes: BlockSizes { minimum: 512, preferred: 4096, maximum: u32::MAX },
        read_only: true,
        failing: false,
    },
    ExportShape {
        name: "broken",
        size_bytes: 64 << 10,
        sizes: BlockSizes::UNCONSTRAINED,
        read_only: false,
        failing: true,
    },
];

pub fn shape(name: &str) -> Option<&'static ExportShape> {
    EXPORTS.iter().find(|shape| shape.name == name)
}

/// The dirty bitmap every export lists; any `since-…` is selected.
pub const DIRTY_BITMAP: &str = "since-start";

struct MemoryExport {
    shape: ExportShape,
    bytes: Arc<Mutex<Vec<u8>>>,
}

/// The export's dirty bitmap: the 4 KiB pieces that are not zeros.
struct MemoryBitmap {
    shape: ExportShape,
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl DirtyBitmap for MemoryBitmap {
    fn extents(&self, offset: u64, length: u64) -> Result<Vec<DirtyExtent>, ExportError> {
        let range = check_range(&self.shape, offset, length, false)?;
        let pieces = zero_pieces(&self.bytes.lock(), range);
        Ok(pieces.into_iter().map(|(length, zero)| DirtyExtent { length, dirty: !zero }).collect())
    }
}

/// `(length, all zeros)` of each 4 KiB piece of `range` (pieces aligned to
/// the export's minimum, as `range` is).
fn zero_pieces(bytes: &[u8], range: std::ops::Range<usize>) -> Vec<(u64, bool)> {
    let mut pieces = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let end = (start + 4096).min(range.end);
        // A slice comparison (memcmp), not a loop over bytes: coverage
        // instrumentation would trace every byte's comparison.
        pieces.push(((end - start) as u64, bytes[start..end] == ZEROS[..end - start]));
        start = end;
    }
    pieces
}

impl MemoryExport {
    fn check(&self, offset: u64, length: u64, writes: bool) -> Result<std::ops::Range<usize>, ExportError> {
        check_range(&self.shape, offset, length, writes)
    }
}

/// The contract `Export` implementations (and their dirty bitmaps) are
/// promised: the server validated the range (and the alignment it
/// advertised) first.
fn check_range(
    shape: &ExportShape,
    offset: u64,
    length: u64,
    writes: bool,
) -> Result<std::ops::Range<usize>, ExportError> {
    assert!(length > 0, "server passed an empty range");
    let end = offset.checked_add(length).expect("server passed a range past u64");
    assert!(end <= shape.size_bytes, "server passed {offset}+{length} beyond {}", shape.size_bytes);
    let minimum = u64::from(shape.sizes.minimum);
    assert!(offset.is_multiple_of(minimum) && length.is_multiple_of(minimum), "server passed a misaligned range");
    assert!(!(writes && shape.read_only), "server passed a write to a read-only export");
    if shape.failing {
        let kinds = [
            ExportErrorKind::Io,
            ExportErrorKind::NoSpace,
            ExportErrorKind::NotSupported,
            ExportErrorKind::Invalid,
            ExportErrorKind::Shutdown,
        ];
        let kind = kinds[(offset % kinds.len() as u64) as usize];
        return Err(ExportError::new(kind, format!("export fails at byte {offset}")));
    }
    Ok(offset as usize..end as usize)
}

impl Export for MemoryExport {
    fn size_bytes(&self) -> u64 {
        self.shape.size_bytes
    }
    fn block_sizes(&self) -> BlockSizes {
        self.shape.sizes
    }
    fn is_read_only(&self) -> bool {
        self.shape.read_only
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    fn can_fast_zero(&self) -> bool {
        !self.shape.read_only
    }
    fn description(&self) -> String {
        format!("{} bytes in memory", self.shape.size_bytes)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let range = self.check(offset, buf.len() as u64, false)?;
        buf.copy_from_slice(&self.bytes.lock()[range]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        let range = self.check(offset, data.len() as u64, true)?;
        self.bytes.lock()[range].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        if self.shape.failing {
            return Err(ExportError::new(ExportErrorKind::Io, "flush fails"));
        }
        Ok(())
    }
    fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), ExportError> {
        let range = self.check(offset, length, true)?;
        self.bytes.lock()[range].fill(0);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), ExportError> {
        let range = self.check(offset, length, true)?;
        if flags.fast && length > 64 << 10 {
            return Err(ExportError::new(ExportErrorKind::NotSupported, "zeroing this much is slow"));
        }
        self.bytes.lock()[range].fill(0);
        Ok(())
    }
    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        let range = self.check(offset, length, false)?;
        let pieces = zero_pieces(&self.bytes.lock(), range);
        Ok(pieces.into_iter().map(|(length, zero)| Extent { length, hole: zero, zero }).collect())
    }
    fn dirty_bitmaps(&self) -> Vec<String> {
        vec![DIRTY_BITMAP.to_owned()]
    }
    fn dirty_bitmap(&self, leaf: &str) -> Option<Arc<dyn DirtyBitmap>> {
        let bitmap = MemoryBitmap { shape: self.shape, bytes: Arc::clone(&self.bytes) };
        leaf.starts_with("since-").then(|| Arc::new(bitmap) as Arc<dyn DirtyBitmap>)
    }
}

static ZEROS: [u8; 4096] = [0; 4096];

struct MemoryCatalog;

impl Catalog for MemoryCatalog {
    fn list(&self, _client: &Client) -> Vec<ExportListing> {
        EXPORTS.iter().map(|shape| ExportListing { name: shape.name.to_owned(), description: String::new() }).collect()
    }

    fn open(&self, name: &str, _client: &Client) -> Result<Arc<dyn Export>, OpenError> {
        let shape = *shape(name)
            .ok_or_else(|| OpenError { kind: OpenErrorKind::NotFound, message: format!("no export named {name:?}") })?;
        let bytes = Arc::new(Mutex::new(vec![0; shape.size_bytes as usize]));
        Ok(Arc::new(MemoryExport { shape, bytes }))
    }
}

pub fn catalog() -> Arc<dyn Catalog> {
    Arc::new(MemoryCatalog)
}

// --- The client's stream ------------------------------------------------------------------

/// One complete message of the client stream, as the spec frames it.
#[derive(Clone, Debug)]
enum Message {
    Option { option: u32, data: Vec<u8> },
    Request(p::RequestHeader),
}

/// The client stream read as the server must read it.
#[derive(Debug, Default)]
pub struct Plan {
    /// The client flags were complete and acceptable.
    flags_accepted: bool,
    no_zeroes: bool,
    messages: Vec<Message>,
    /// The option that enters transmission, by index into `messages`.
    transmission_from: Option<usize>,
    /// The export transmission is with.
    export: Option<&'static ExportShape>,
}

/// Reads `client` as a client stream, rewriting each request's handle to its
/// sequence number (so replies name requests unambiguously), and returns
/// the rewritten stream with what the server must make of it.
pub fn plan(client: &[u8]) -> (Vec<u8>, Plan) {
    let mut stream = client.to_vec();
    let mut plan = Plan::default();
    let mut at = 0;
    let take = |at: &mut usize, count: usize| -> Option<std::ops::Range<usize>> {
        let end = at.checked_add(count).filter(|&end| end <= client.len())?;
        let range = *at..end;
        *at = end;
        Some(range)
    };
    let Some(flags) = take(&mut at, 4) else { return (stream, plan) };
    let Ok(flags) = p::decode_client_flags(client[flags].try_into().expect("4 bytes")) else {
        return (stream, plan);
    };
    plan.flags_accepted = true;
    plan.no_zeroes = flags.no_zeroes;

    // Option haggling.
    for _ in 0..rewind_nbd::server::OPTIONS_PER_HANDSHAKE_MAX {
        let Some(header) = take(&mut at, p::OPTION_HEADER_BYTES) else { return (stream, plan) };
        let Ok(header) = p::decode_option_header(client[header].try_into().expect("16 bytes")) else {
            return (stream, plan);
        };
        if header.length > p::OPTION_BYTES_MAX {
            return (stream, plan);
        }
        let Some(data) = take(&mut at, header.length as usize) else { return (stream, plan) };
        let data = client[data].to_vec();
        // Which export, if any, this option enters transmission with.
        let enters = match header.option {
            p::OPT_EXPORT_NAME => Some(p::decode_export_name(&data).ok().and_then(shape)),
            p::OPT_GO => p::decode_info_request(&data).ok().and_then(|request| shape(request.name)).map(Some),
            _ => None,
        };
        let option = header.option;
        plan.messages.push(Message::Option { option, data });
        match enters {
            Some(Some(export)) => {
                plan.transmission_from = Some(plan.messages.len() - 1);
                plan.export = Some(export);
                break;
            }
            // EXPORT_NAME of an export that cannot be opened: hang up.
            Some(None) => return (stream, plan),
            None if option == p::OPT_ABORT => return (stream, plan),
            None => {}
        }
    }
    if plan.export.is_none() {
        return (stream, plan);
    }

    // Transmission.
    let mut sequence = 0u64;
    while let Some(magic) = take(&mut at, 4) {
        if client[magic] != p::REQUEST_MAGIC.to_be_bytes() {
            break;
        }
        let Some(rest) = take(&mut at, p::REQUEST_HEADER_BYTES - 4) else { break };
        let start = rest.start - 4;
        sequence += 1;
        stream[start + 8..start + 16].copy_from_slice(&sequence.to_be_bytes());
        let header =
            p::decode_request_header(stream[start..rest.end].try_into().expect("28 bytes")).expect("magic checked");
        if header.command == p::CMD_DISC {
            break;
        }
        if header.command == p::CMD_WRITE {
            // Too large a payload ends the connection before it is read.
            if header.length > p::PAYLOAD_BYTES_MAX || take(&mut at, header.length as usize).is_none() {
                break;
            }
        }
        plan.messages.push(Message::Request(header));
    }
    (stream, plan)
}

// --- The server's output --------------------------------------------------------------------

/// Reads the server's output; running out is `None`.
struct Output<'a> {
    bytes: &'a [u8],
}

impl<'a> Output<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(bytes[at..at + 2].try_into().expect("2 bytes"))
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks the server's `output` against the client stream's `plan`.
/// `output_refused`: the client stopped taking replies, so they may end early
/// (but what was sent must still be well-formed).
pub fn check(plan: &Plan, output: &[u8], output_refused: bool) {
    let mut out = Output { bytes: output };
    // Running out of output where more is owed is a bug unless the client
    // stopped reading.
    macro_rules! owed {
        ($value:expr, $what:expr) => {
            match $value {
                Some(value) => value,
                None => {
                    assert!(output_refused, "server output ends where {} is owed", $what);
                    return;
                }
            }
        };
    }
    let greeting = owed!(out.take(p::GREETING_BYTES), "the greeting");
    assert_eq!(greeting, p::encode_greeting(), "greeting");
    let mut structured = false;
    let mut session: Option<(u64, u16)> = None;

    for (index, message) in plan.messages.iter().enumerate() {
        let Message::Option { option, data } = message else { break };
        let option = *option;
        let entering = plan.transmission_from == Some(index);
        if option == p::OPT_EXPORT_NAME {
            if !entering {
                // No export by that name: the only answer is to hang up.
                break;
            }
            let size_bytes = owed!(out.u64(), "the EXPORT_NAME reply");
            let flags = owed!(out.u16(), "the EXPORT_NAME reply");
            if !plan.no_zeroes {
                let zeroes = owed!(out.take(124), "the EXPORT_NAME reply's zeroes");
                assert!(zeroes.iter().all(|&byte| byte == 0), "EXPORT_NAME reply padding");
            }
            check_export_info(plan, size_bytes, flags, structured);
            session = Some((size_bytes, flags));
            break;
        }
        // Replies to this option until the final one.
        let mut info_export: Option<(u64, u16)> = None;
        let final_type = loop {
            let magic = owed!(out.u64(), "an option reply");
            assert_eq!(magic, p::OPTION_REPLY_MAGIC, "option reply magic");
            let echoed = owed!(out.u32(), "an option reply");
            assert_eq!(echoed, option, "option reply for option {echoed} to option {option}");
            let reply_type = owed!(out.u32(), "an option reply");
            let length = owed!(out.u32(), "an option reply");
            assert!(length <= p::OPTION_BYTES_MAX, "option reply of {length} bytes");
            let payload = owed!(out.take(length as usize), "an option reply's payload");
            match reply_type {
                p::REP_ACK => {
                    assert!(payload.is_empty(), "ACK with a payload");
                    break reply_type;
                }
                p::REP_SERVER => {
                    assert_eq!(option, p::OPT_LIST, "REP_SERVER to another option");
                    assert!(payload.len() >= 4, "REP_SERVER without a name length");
                    let name_bytes = be_u32(payload, 0) as usize;
                    assert!(name_bytes <= payload.len() - 4, "REP_SERVER name runs past the reply");
                    let name = std::str::from_utf8(&payload[4..4 + name_bytes]).expect("export name is UTF-8");
                    assert!(shape(name).is_some(), "listed an export the catalog does not have: {name}");
                }
                p::REP_INFO => {
                    assert!(matches!(option, p::OPT_INFO | p::OPT_GO), "REP_INFO to option {option}");
                    assert!(payload.len() >= 2, "REP_INFO without a type");
                    match be_u16(payload, 0) {
                        p::INFO_EXPORT => {
                            assert_eq!(payload.len(), 12, "INFO_EXPORT size");
                            info_export = Some((be_u64(payload, 2), be_u16(payload, 10)));
                        }
                        p::INFO_NAME | p::INFO_DESCRIPTION => {
                            assert!(payload.len() - 2 <= p::STRING_BYTES_MAX, "info string too long");
                            std::str::from_utf8(&payload[2..]).expect("info string is UTF-8");
                        }
                        p::INFO_BLOCK_SIZE => {
                            assert_eq!(payload.len(), 14, "INFO_BLOCK_SIZE size");
                            let sizes = BlockSizes {
                                minimum: be_u32(payload, 2),
                                preferred: be_u32(payload, 6),
                                maximum: be_u32(payload, 10),
                            };
                            sizes.check().expect("advertised block sizes keep the spec's rules");
                            assert!(sizes.maximum <= p::PAYLOAD_BYTES_MAX, "maximum above the payload limit");
                        }
                        other => panic!("REP_INFO of unknown type {other}"),
                    }
                }
                p::REP_META_CONTEXT => {
                    assert!(matches!(option, p::OPT_LIST_META_CONTEXT | p::OPT_SET_META_CONTEXT));
                    assert!(structured, "a metadata context before structured replies");
                    assert!(payload.len() >= 4);
                    let name = std::str::from_utf8(&payload[4..]).expect("a context name is UTF-8");
                    let leaf = name.strip_prefix(p::META_DIRTY_BITMAP_PREFIX);
                    assert!(
                        name == p::META_BASE_ALLOCATION || leaf.is_some_and(|leaf| leaf.starts_with("since-")),
                        "unknown metadata context {name:?}"
                    );
                }
                error if error & (1 << 31) != 0 => {
                    assert!(payload.len() <= p::STRING_BYTES_MAX, "error message too long");
                    std::str::from_utf8(payload).expect("error message is UTF-8");
                    break reply_type;
                }
                other => panic!("option reply of unknown type {other:#x}"),
            }
        };
        match option {
            p::OPT_ABORT => {
                assert_eq!(final_type, p::REP_ACK, "ABORT is acknowledged");
                break;
            }
            p::OPT_STRUCTURED_REPLY if final_type == p::REP_ACK => {
                assert!(data.is_empty(), "STRUCTURED_REPLY with data acknowledged");
                structured = true;
            }
            p::OPT_INFO | p::OPT_GO if final_type == p::REP_ACK => {
                let (size_bytes, flags) = info_export.expect("INFO_EXPORT before the ACK of INFO/GO");
                check_export_info(plan, size_bytes, flags, structured);
                if option == p::OPT_GO {
                    session = Some((size_bytes, flags));
                }
            }
            _ => {}
        }
        assert_eq!(entering, option == p::OPT_GO && final_type == p::REP_ACK, "GO entered transmission or not");
        if entering {
            break;
        }
    }

    let Some((size_bytes, flags)) = session else {
        assert!(out.bytes.is_empty(), "{} bytes of output after the handshake ended", out.bytes.len());
        return;
    };
    let requests: HashMap<u64, p::RequestHeader> = plan
        .messages
        .iter()
        .filter_map(|message| match message {
            Message::Request(header) => Some((header.handle, *header)),
            Message::Option { .. } => None,
        })
        .collect();
    let _ = (size_bytes, flags);
    check_replies(&mut out, &requests, structured, output_refused);
}

fn check_export_info(plan: &Plan, size_bytes: u64, flags: u16, structured: bool) {
    let export = plan.export.filter(|export| export.size_bytes == size_bytes);
    let export = export.or_else(|| EXPORTS.iter().find(|export| export.size_bytes == size_bytes));
    assert!(export.is_some(), "export size {size_bytes} is none of the catalog's");
    assert!(flags & p::FLAG_HAS_FLAGS != 0, "transmission flags without HAS_FLAGS");
    assert_eq!(flags & p::FLAG_SEND_DF != 0, structured, "SEND_DF without structured replies");
}

/// Each reply answers an outstanding request once, completely.
fn check_replies(
    out: &mut Output<'_>,
    requests: &HashMap<u64, p::RequestHeader>,
    structured: bool,
    output_refused: bool,
) {
    let mut answered: HashMap<u64, u64> = HashMap::new(); // READ bytes covered so far
    let mut done: std::collections::HashSet<u64> = std::collections::HashSet::new();
    // Contexts a BLOCK_STATUS was answered for so far.
    let mut contexts_answered: HashMap<u64, Vec<u32>> = HashMap::new();
    while !out.bytes.is_empty() {
        let Some(magic) = out.u32() else {
            assert!(output_refused, "a partial reply magic");
            return;
        };
        match magic {
            p::SIMPLE_REPLY_MAGIC => {
                let (Some(errno), Some(handle)) = (out.u32(), out.u64()) else {
                    assert!(output_refused, "a partial simple reply");
                    return;
                };
                let request = requests.get(&handle).unwrap_or_else(|| panic!("reply to unknown handle {handle}"));
                assert!(done.insert(handle), "second reply to handle {handle}");
                if errno == 0 {
                    assert_ne!(request.command, p::CMD_BLOCK_STATUS, "BLOCK_STATUS answered with a simple reply");
                    if request.command == p::CMD_READ {
                        assert!(!structured, "READ data in a simple reply after structured replies");
                        if out.take(request.length as usize).is_none() {
                            assert!(output_refused, "READ data cut short");
                            return;
                        }
                    }
                } else {
                    check_errno(errno);
                }
            }
            p::STRUCTURED_REPLY_MAGIC => {
                assert!(structured, "a structured reply without structured replies negotiated");
                let (Some(chunk_flags), Some(reply_type), Some(handle), Some(length)) =
                    (out.u16(), out.u16(), out.u64(), out.u32())
                else {
                    assert!(output_refused, "a partial chunk header");
                    return;
                };
                let Some(payload) = out.take(length as usize) else {
                    assert!(output_refused, "a chunk's payload cut short");
                    return;
                };
                let request = requests.get(&handle).unwrap_or_else(|| panic!("chunk for unknown handle {handle}"));
                assert!(!done.contains(&handle), "chunk after the final reply to handle {handle}");
                assert_eq!(chunk_flags & !p::REPLY_FLAG_DONE, 0, "unknown chunk flags");
                match reply_type {
                    p::REPLY_TYPE_OFFSET_DATA => {
                        assert_eq!(request.command, p::CMD_READ, "data for a {}", p::command_name(request.command));
                        assert!(payload.len() > 8, "OFFSET_DATA without data");
                        let offset = be_u64(payload, 0);
                        let data_bytes = (payload.len() - 8) as u64;
                        let end = u64::from(request.length) + request.offset;
                        assert!(offset >= request.offset && offset + data_bytes <= end, "data outside the READ");
                        *answered.entry(handle).or_default() += data_bytes;
                        if chunk_flags & p::REPLY_FLAG_DONE != 0 {
                            assert_eq!(answered[&handle], u64::from(request.length), "READ answered in part");
                        }
                    }
                    p::REPLY_TYPE_ERROR => {
                        assert!(payload.len() >= 6, "error chunk too short");
                        check_errno(be_u32(payload, 0));
                        let message_bytes = usize::from(be_u16(payload, 4));
                        assert_eq!(message_bytes, payload.len() - 6, "error message length");
                        std::str::from_utf8(&payload[6..]).expect("error message is UTF-8");
                    }
                    p::REPLY_TYPE_BLOCK_STATUS => {
                        assert_eq!(request.command, p::CMD_BLOCK_STATUS, "block status for another command");
                        assert!(payload.len() >= 12 && (payload.len() - 4) % 8 == 0, "block status size");
                        let context = be_u32(payload, 0);
                        let bitmaps =
                            p::META_DIRTY_BITMAP_FIRST_ID..p::META_DIRTY_BITMAP_FIRST_ID + p::DIRTY_BITMAPS_MAX as u32;
                        assert!(
                            context == p::META_BASE_ALLOCATION_ID || bitmaps.contains(&context),
                            "context id {context}"
                        );
                        let contexts = contexts_answered.entry(handle).or_default();
                        assert!(!contexts.contains(&context), "context {context} answered twice for handle {handle}");
                        contexts.push(context);
                        let known = if context == p::META_BASE_ALLOCATION_ID {
                            p::STATE_HOLE | p::STATE_ZERO
                        } else {
                            p::STATE_DIRTY
                        };
                        let descriptors = (payload.len() - 4) / 8;
                        assert!(descriptors <= p::EXTENTS_PER_REPLY_MAX, "{descriptors} descriptors");
                        let req_one = request.flags & p::CMD_FLAG_REQ_ONE != 0;
                        assert!(!req_one || descriptors == 1, "REQ_ONE answered with {descriptors} extents");
                        let mut covered = 0u64;
                        let mut status_last = None;
                        for descriptor in payload[4..].chunks_exact(8) {
                            let (length, status) = (be_u32(descriptor, 0), be_u32(descriptor, 4));
                            assert!(length > 0, "an empty extent");
                            assert_eq!(status & !known, 0, "unknown extent status {status} of context {context}");
                            assert_ne!(status_last, Some(status), "neighbouring extents of one status");
                            status_last = Some(status);
                            covered += u64::from(length);
                        }
                        assert!(covered <= u64::from(request.length), "extents past the request");
                    }
                    other => panic!("chunk of unknown type {other}"),
                }
                if chunk_flags & p::REPLY_FLAG_DONE != 0 {
                    done.insert(handle);
                }
            }
            other => panic!("reply magic {other:#010x}"),
        }
    }
    if !output_refused {
        let mut missing: Vec<u64> = requests.keys().filter(|handle| !done.contains(handle)).copied().collect();
        missing.sort_unstable();
        assert!(missing.is_empty(), "requests never answered: {missing:?}");
    }
}

fn check_errno(errno: u32) {
    assert!(
        matches!(errno, p::EPERM | p::EIO | p::EINVAL | p::ENOSPC | p::ENOTSUP | p::ESHUTDOWN),
        "errno {errno} is not one the spec names"
    );
}
