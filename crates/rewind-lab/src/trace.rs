//! Block I/O traces: the requests the lab replays, and the formats they are
//! read from.
//!
//! | format | what it looks like | times |
//! |---|---|---|
//! | `csv` (also what `rewind trace export` and `rewind lab generate` write) | `time,op,size,lbn`: seconds, `R`/`W`, bytes, 512-byte sectors | as given |
//! | `fio` | fio's iolog, version 2 or 3 (`fio version 3 iolog`, then `ms file action offset length`) | v3: milliseconds; v2 has none: one record every `--iolog-interval` |
//! | `blkparse` | blkparse's default text output (`8,0 3 1 0.000000000 697 Q W 223490 + 8 [proc]`) | seconds; one action counted (`Q` by default) |
//! | `msr` | MSR Cambridge CSV (`Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`) | Windows file time (100 ns ticks) |
//! | `vscsi` | libCacheSim's binary vscsi records, version 1 (32 bytes) or 2 (40 bytes), as in the CloudPhysics traces: SCSI opcode, length in bytes, LBN in 512-byte sectors | microseconds |
//! | `oracle-general` | libCacheSim's `oracleGeneral` binary records (24 bytes: time, object id, size, next access); the id is read as a 512-byte sector, as libCacheSim's conversion from vscsi writes it; no read or write: every request counts as `ReadOptions::untyped_op` | seconds |
//!
//! Times must not decrease; a line or record that does, that does not
//! parse, that ends past the device or past 2⁶⁴ bytes, or that asks for more
//! than `ReadOptions::max_request_bytes` at once, is an error naming the
//! file and the line (record, in a binary trace). Lines longer than
//! [`MAX_LINE_BYTES`] and bytes that are not UTF-8 are errors too: memory
//! follows the requests read, never one line. Times are kept relative to the
//! first request.

use std::fmt;
use std::io::{BufRead, Chain, Cursor, Read};

/// The longest line a text trace may have. Real trace lines are under 200
/// bytes; anything longer is binary data or damage, and reading it whole
/// would let one line take the memory.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Binary traces count addresses in sectors of this many bytes.
const SECTOR_BYTES: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
}

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Nanoseconds after the trace's first request.
    pub time_nanos: u64,
    pub op: Op,
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

impl Request {
    /// The blocks of `block_bytes` the request touches.
    pub fn blocks(&self, block_bytes: u64) -> std::ops::Range<u64> {
        let first = self.offset_bytes / block_bytes;
        let end =
            self.offset_bytes.checked_add(self.length_bytes.max(1)).expect("the reader refuses requests past 2^64");
        first..end.div_ceil(block_bytes)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Fio,
    Blkparse,
    Msr,
    Vscsi,
    OracleGeneral,
}

impl Format {
    pub const NAMES: &'static str = "csv, fio, blkparse, msr, vscsi or oracle-general";

    pub fn parse(name: &str) -> Result<Format, String> {
        match name {
            "csv" | "rewind" => Ok(Format::Csv),
            "fio" | "iolog" => Ok(Format::Fio),
            "blkparse" => Ok(Format::Blkparse),
            "msr" => Ok(Format::Msr),
            "vscsi" => Ok(Format::Vscsi),
            "oracle-general" | "oracleGeneral" => Ok(Format::OracleGeneral),
            other => Err(format!("unknown trace format {other:?}: {}", Format::NAMES)),
        }
    }

    /// Binary formats are read as fixed-size records, not lines.
    pub fn is_binary(self) -> bool {
        matches!(self, Format::Vscsi | Format::OracleGeneral)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Csv => "csv",
            Format::Fio => "fio",
            Format::Blkparse => "blkparse",
            Format::Msr => "msr",
            Format::Vscsi => "vscsi",
            Format::OracleGeneral => "oracle-general",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("{source_name}, line {line}: {reason}")]
    Line { source_name: String, line: u64, reason: String },
    #[error("{source_name}, record {record} (byte {offset}): {reason}")]
    Record { source_name: String, record: u64, offset: u64, reason: String },
    #[error("{source_name}: {source}")]
    Io { source_name: String, source: std::io::Error },
    #[error(
        "{source_name}: cannot tell the trace's format from its first line {first:?}; \
         name it with --format ({})",
        Format::NAMES
    )]
    UnknownFormat { source_name: String, first: String },
}

/// How to read a trace.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// `None`: tell from the first bytes (and, for `oracle-general`, which
    /// has no mark of its own, from the file name).
    pub format: Option<Format>,
    /// Time between records of an fio iolog v2, which has none.
    pub iolog_interval_nanos: u64,
    /// The blkparse action counted (`Q`: queued; `C`: completed; …).
    pub blkparse_action: String,
    /// The device's size: a request ending past it is an error.
    pub capacity_bytes: Option<u64>,
    /// The longest request taken. The lab keeps state per block a request
    /// touches, so one absurd length would otherwise take the memory.
    pub max_request_bytes: u64,
    /// What the requests of a format without reads and writes
    /// (`oracle-general`) count as.
    pub untyped_op: Op,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            format: None,
            iolog_interval_nanos: 1_000_000,
            blkparse_action: "Q".to_owned(),
            capacity_bytes: None,
            max_request_bytes: 1 << 30,
            untyped_op: Op::Write,
        }
    }
}

/// The bytes read to tell the format, then the rest.
type Input<R> = Chain<Cursor<Vec<u8>>, R>;

/// Bytes looked at to tell a binary format: two records of the largest.
const HEAD_BYTES: usize = 2 * VSCSI2_BYTES;
const VSCSI1_BYTES: usize = 32;
const VSCSI2_BYTES: usize = 40;
const ORACLE_GENERAL_BYTES: usize = 24;

/// A parsed request before its checks: time (in the format's clock, as
/// nanoseconds), op, offset, length.
type Parsed = (u64, Op, u64, u64);

/// Reads a trace's requests one by one.
pub struct TraceReader<R> {
    input: Input<R>,
    source_name: String,
    options: ReadOptions,
    format: Format,
    /// Lines (text) or records (binary) read so far.
    position: u64,
    /// A line read to tell the format, not yet parsed.
    pending: Option<String>,
    origin: Option<u64>,
    last_time: u64,
    /// fio v2: records so far, which make up its times.
    iolog_records: u64,
    iolog_version: u32,
    /// vscsi: 1 or 2, from the first records.
    vscsi_version: u16,
    buffer: Vec<u8>,
}

impl<R: BufRead> TraceReader<R> {
    /// Starts reading `input` (named `source_name` in errors).
    pub fn new(mut input: R, source_name: &str, options: ReadOptions) -> Result<TraceReader<R>, TraceError> {
        let io_error = |source| TraceError::Io { source_name: source_name.to_owned(), source };
        let mut head = Vec::with_capacity(HEAD_BYTES);
        (&mut input).take(HEAD_BYTES as u64).read_to_end(&mut head).map_err(io_error)?;
        let vscsi_version = vscsi_version(&head);
        let mut reader = TraceReader {
            input: Cursor::new(head).chain(input),
            source_name: source_name.to_owned(),
            options,
            format: Format::Csv,
            position: 0,
            pending: None,
            origin: None,
            last_time: 0,
            iolog_records: 0,
            iolog_version: 0,
            vscsi_version: vscsi_version.unwrap_or(0),
            buffer: Vec::new(),
        };
        reader.format = match reader.options.format {
            Some(format) => format,
            None if source_name.contains("oracleGeneral") => Format::OracleGeneral,
            None if vscsi_version.is_some() => Format::Vscsi,
            None => reader.detect_text()?,
        };
        if reader.format == Format::Vscsi && vscsi_version.is_none() {
            return Err(reader.error(0, "the first two records carry neither vscsi version 1 nor 2"));
        }
        Ok(reader)
    }

    /// Reads up to the first line with something on it and tells the format from it.
    fn detect_text(&mut self) -> Result<Format, TraceError> {
        while let Some(text) = self.read_line() {
            let text = text?;
            if !text.trim().is_empty() {
                let format = detect(&text).ok_or_else(|| TraceError::UnknownFormat {
                    source_name: self.source_name.clone(),
                    first: text.chars().take(80).collect(),
                })?;
                self.position -= 1;
                self.pending = Some(text);
                return Ok(format);
            }
        }
        Ok(Format::Csv)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn record_bytes(&self) -> usize {
        match (self.format, self.vscsi_version) {
            (Format::Vscsi, 1) => VSCSI1_BYTES,
            (Format::Vscsi, _) => VSCSI2_BYTES,
            _ => ORACLE_GENERAL_BYTES,
        }
    }

    /// An error at line (or record) `position`.
    fn error(&self, position: u64, reason: impl Into<String>) -> TraceError {
        let (source_name, reason) = (self.source_name.clone(), reason.into());
        if self.format.is_binary() {
            let offset = position.saturating_sub(1) * self.record_bytes() as u64;
            TraceError::Record { source_name, record: position, offset, reason }
        } else {
            TraceError::Line { source_name, line: position, reason }
        }
    }

    /// An error at the line or record just read.
    fn here(&self, reason: impl Into<String>) -> TraceError {
        self.error(self.position, reason)
    }

    /// The next line, without its end; at most [`MAX_LINE_BYTES`] are held.
    fn read_line(&mut self) -> Option<Result<String, TraceError>> {
        self.position += 1;
        if let Some(pending) = self.pending.take() {
            return Some(Ok(pending));
        }
        self.buffer.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        match (&mut self.input).take(limit).read_until(b'\n', &mut self.buffer) {
            Err(source) => return Some(Err(TraceError::Io { source_name: self.source_name.clone(), source })),
            Ok(0) => return None,
            Ok(_) => {}
        }
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
        } else if self.buffer.len() > MAX_LINE_BYTES {
            let reason = format!(
                "the line is longer than {} KiB, which no text trace has; a binary trace? \
                 name its format with --format ({})",
                MAX_LINE_BYTES >> 10,
                Format::NAMES
            );
            return Some(Err(self.here(reason)));
        }
        if self.buffer.last() == Some(&b'\r') {
            self.buffer.pop();
        }
        Some(match std::str::from_utf8(&self.buffer) {
            Ok(text) => Ok(text.to_owned()),
            Err(_) => Err(self.here(format!(
                "not text (bytes that are not UTF-8); a binary trace? name its format with --format ({})",
                Format::NAMES
            ))),
        })
    }

    /// The next record of a binary trace into `self.buffer`; false at the end.
    fn read_record(&mut self) -> Result<bool, TraceError> {
        let size = self.record_bytes();
        self.buffer.clear();
        self.position += 1;
        (&mut self.input)
            .take(size as u64)
            .read_to_end(&mut self.buffer)
            .map_err(|source| TraceError::Io { source_name: self.source_name.clone(), source })?;
        match self.buffer.len() {
            0 => Ok(false),
            read if read < size => {
                Err(self.here(format!("cut short: {read} of its {size} bytes (the file is truncated)")))
            }
            _ => Ok(true),
        }
    }

    /// Parses one line: `None` for lines that carry no request.
    fn parse_line(&mut self, text: &str) -> Result<Option<Parsed>, TraceError> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        match self.format {
            Format::Csv => self.parse_csv(text),
            Format::Fio => self.parse_fio(text),
            Format::Blkparse => self.parse_blkparse(text),
            Format::Msr => self.parse_msr(text),
            Format::Vscsi | Format::OracleGeneral => unreachable!("binary formats are read by record"),
        }
    }

    fn parse_csv(&self, text: &str) -> Result<Option<Parsed>, TraceError> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.first().is_some_and(|field| field.eq_ignore_ascii_case("time")) {
            return Ok(None); // The header.
        }
        let [time, op, size, lbn] = fields[..] else {
            return Err(self.here(format!("expected time,op,size,lbn; found {} fields", fields.len())));
        };
        let time = seconds_to_nanos(time).ok_or_else(|| self.here(format!("time {time:?} is not seconds")))?;
        let op = parse_op(op).ok_or_else(|| self.here(format!("op {op:?} is neither R nor W")))?;
        let size = self.number(size, "size")?;
        let offset = self.sectors(self.number(lbn, "lbn")?, "lbn")?;
        Ok(Some((time, op, offset, size)))
    }

    fn parse_fio(&mut self, text: &str) -> Result<Option<Parsed>, TraceError> {
        if let Some(version) = text.strip_prefix("fio version ").and_then(|rest| rest.strip_suffix(" iolog")) {
            self.iolog_version = match version {
                "2" => 2,
                "3" => 3,
                other => return Err(self.here(format!("fio iolog version {other} (this reads 2 and 3)"))),
            };
            return Ok(None);
        }
        if self.iolog_version == 0 {
            return Err(self.here("an fio iolog starts with `fio version 2 iolog` or `fio version 3 iolog`"));
        }
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (time, rest) = if self.iolog_version == 3 {
            let Some((time, rest)) = fields.split_first() else { return Ok(None) };
            let millis = self.number(time, "timestamp")?;
            (millis.checked_mul(1_000_000).ok_or_else(|| self.here("timestamp is too large"))?, rest)
        } else {
            let time = self.iolog_records.checked_mul(self.options.iolog_interval_nanos);
            (time.ok_or_else(|| self.here("the record's time passes 2^64 ns"))?, &fields[..])
        };
        // `file action [offset length]`; add, open, close, wait and syncs carry no I/O.
        let (op, offset, length) = match rest {
            [_, action, offset, length] if matches!(*action, "read" | "write" | "trim") => {
                let op = if *action == "read" { Op::Read } else { Op::Write };
                (op, self.number(offset, "offset")?, self.number(length, "length")?)
            }
            [_, action, ..] if matches!(*action, "add" | "open" | "close" | "wait" | "sync" | "datasync") => {
                return Ok(None);
            }
            _ => return Err(self.here(format!("not an fio iolog v{} record", self.iolog_version))),
        };
        self.iolog_records += 1;
        Ok(Some((time, op, offset, length)))
    }

    fn parse_blkparse(&self, text: &str) -> Result<Option<Parsed>, TraceError> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        // The summary blkparse prints at the end, and events without a range.
        if !fields.first().is_some_and(|device| is_device(device)) {
            return Ok(None);
        }
        let [_, _, _, time, _, action, rwbs, sector, "+", count, ..] = fields[..] else { return Ok(None) };
        if action != self.options.blkparse_action {
            return Ok(None);
        }
        let op = if rwbs.contains('W') || rwbs.contains('D') {
            Op::Write
        } else if rwbs.contains('R') {
            Op::Read
        } else {
            return Ok(None); // Flushes and other requests without data.
        };
        let time = seconds_to_nanos(time).ok_or_else(|| self.here(format!("time {time:?} is not seconds")))?;
        let offset = self.sectors(self.number(sector, "sector")?, "sector")?;
        let length = self.sectors(self.number(count, "sector count")?, "sector count")?;
        Ok(Some((time, op, offset, length)))
    }

    fn parse_msr(&self, text: &str) -> Result<Option<Parsed>, TraceError> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.first().is_some_and(|field| field.eq_ignore_ascii_case("timestamp")) {
            return Ok(None);
        }
        let [ticks, _host, _disk, kind, offset, size, _response] = fields[..] else {
            return Err(self.here(format!("expected 7 MSR fields; found {}", fields.len())));
        };
        let ticks = self.number(ticks, "timestamp")?;
        let op = parse_op(kind).ok_or_else(|| self.here(format!("type {kind:?} is neither Read nor Write")))?;
        let time = ticks.checked_mul(100).ok_or_else(|| self.here("timestamp is too large"))?;
        Ok(Some((time, op, self.number(offset, "offset")?, self.number(size, "size")?)))
    }

    /// Parses the record in `self.buffer`: `None` for SCSI commands without data.
    fn parse_record(&self) -> Result<Option<Parsed>, TraceError> {
        let record = &self.buffer[..];
        let u16_at = |at: usize| u16::from_le_bytes(record[at..at + 2].try_into().expect("2 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
        if self.format == Format::OracleGeneral {
            // clock_time u32 (s), obj_id u64, obj_size u32, next_access_vtime i64.
            let time = u64::from(u32_at(0)) * 1_000_000_000;
            let offset = self.sectors(u64_at(4), "object id")?;
            return Ok(Some((time, self.options.untyped_op, offset, u64::from(u32_at(12)))));
        }
        // v1: sn u32, len u32, nSG u32, cmd u16, ver u16, lbn u64, ts u64.
        // v2: cmd u16, ver u16, sn u32, len u32, nSG u32, lbn u64, ts u64, rt u64.
        let (command, version, length) = match self.vscsi_version {
            1 => (u16_at(12), u16_at(14), u32_at(4)),
            _ => (u16_at(0), u16_at(2), u32_at(8)),
        };
        if version >> 8 != self.vscsi_version {
            let reason = format!(
                "its version byte says vscsi {}; the trace began as vscsi {}",
                version >> 8,
                self.vscsi_version
            );
            return Err(self.here(reason));
        }
        let op = match command {
            0x08 | 0x28 | 0xa8 | 0x88 => Op::Read,
            0x0a | 0x2a | 0xaa | 0x8a => Op::Write,
            _ => return Ok(None), // TEST UNIT READY, SYNCHRONIZE CACHE, INQUIRY, …
        };
        let time = u64_at(24).checked_mul(1_000).ok_or_else(|| self.here("timestamp is too large"))?;
        Ok(Some((time, op, self.sectors(u64_at(16), "lbn")?, u64::from(length))))
    }

    fn number(&self, text: &str, what: &str) -> Result<u64, TraceError> {
        text.parse().map_err(|_| self.here(format!("{what} {text:?} is not a whole number")))
    }

    fn sectors(&self, sectors: u64, what: &str) -> Result<u64, TraceError> {
        sectors
            .checked_mul(SECTOR_BYTES)
            .ok_or_else(|| self.here(format!("{what} {sectors} is past 2^64 bytes in 512-byte sectors")))
    }

    /// The next request as parsed, before its checks.
    fn next_parsed(&mut self) -> Option<Result<Parsed, TraceError>> {
        loop {
            let parsed = if self.format.is_binary() {
                match self.read_record() {
                    Ok(true) => self.parse_record(),
                    Ok(false) => return None,
                    Err(error) => return Some(Err(error)),
                }
            } else {
                match self.read_line()? {
                    Ok(text) => self.parse_line(&text),
                    Err(error) => return Some(Err(error)),
                }
            };
            match parsed {
                Ok(Some(parsed)) => return Some(Ok(parsed)),
                Ok(None) => continue,
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// Checks a parsed request against the device and the reader's limits.
    fn check(&mut self, (time, op, offset_bytes, length_bytes): Parsed) -> Result<Request, TraceError> {
        let Some(end) = offset_bytes.checked_add(length_bytes) else {
            return Err(self.here(format!("offset {offset_bytes} + size {length_bytes} passes 2^64 bytes")));
        };
        if length_bytes > self.options.max_request_bytes {
            return Err(self.here(format!(
                "a request of {length_bytes} bytes, more than the {} the lab takes at once (--max-request)",
                self.options.max_request_bytes
            )));
        }
        if let Some(capacity) = self.options.capacity_bytes.filter(|&capacity| end > capacity) {
            return Err(self.here(format!("the request ends at byte {end}, past the device's {capacity} (--capacity)")));
        }
        let origin = *self.origin.get_or_insert(time);
        let Some(time_nanos) = time.checked_sub(origin).filter(|&time| time >= self.last_time) else {
            return Err(self.here("its time is before the previous request's; the lab replays traces in time order"));
        };
        self.last_time = time_nanos;
        Ok(Request { time_nanos, op, offset_bytes, length_bytes })
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let parsed = self.next_parsed()?;
        Some(parsed.and_then(|parsed| self.check(parsed)))
    }
}

/// The vscsi version both of the first two records carry, as libCacheSim
/// tells it (the high byte of `ver`); text never has those bytes there.
fn vscsi_version(head: &[u8]) -> Option<u16> {
    let version_at = |record: usize, size: usize, at: usize| {
        let start = record * size + at;
        head.get(start..start + 2).map(|bytes| u16::from_le_bytes([bytes[0], bytes[1]]) >> 8)
    };
    [(2u16, VSCSI2_BYTES, 2usize), (1, VSCSI1_BYTES, 14)].into_iter().find_map(|(version, size, at)| {
        (version_at(0, size, at) == Some(version) && version_at(1, size, at) == Some(version)).then_some(version)
    })
}

fn detect(first: &str) -> Option<Format> {
    let first = first.trim();
    if first.starts_with("fio version") {
        return Some(Format::Fio);
    }
    if first.split_whitespace().next().is_some_and(is_device) {
        return Some(Format::Blkparse);
    }
    let fields: Vec<&str> = first.split(',').map(str::trim).collect();
    match fields.len() {
        7 => Some(Format::Msr),
        4 => Some(Format::Csv),
        _ => first.starts_with('#').then_some(Format::Csv),
    }
}

/// `8,0`-style major,minor device numbers.
fn is_device(field: &str) -> bool {
    field.split_once(',').is_some_and(|(major, minor)| {
        !major.is_empty() && !minor.is_empty() && (major.to_owned() + minor).bytes().all(|byte| byte.is_ascii_digit())
    })
}

fn parse_op(text: &str) -> Option<Op> {
    match text.to_ascii_lowercase().as_str() {
        "r" | "read" => Some(Op::Read),
        "w" | "write" => Some(Op::Write),
        _ => None,
    }
}

/// Decimal seconds (`12.000004500`) to nanoseconds, exactly.
fn seconds_to_nanos(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 9 || !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let fraction: u64 = if fraction.is_empty() { 0 } else { format!("{fraction:0<9}").parse().ok()? };
    whole.checked_mul(1_000_000_000)?.checked_add(fraction)
}

/// Writes requests as the `csv` format (`time,op,size,lbn`).
pub struct CsvWriter<W: std::io::Write> {
    out: W,
}

impl<W: std::io::Write> CsvWriter<W> {
    /// Starts a trace with `comment` (lines starting with `#`) and the header.
    pub fn new(mut out: W, comment: &str) -> std::io::Result<CsvWriter<W>> {
        for line in comment.lines() {
            writeln!(out, "# {line}")?;
        }
        writeln!(out, "time,op,size,lbn")?;
        Ok(CsvWriter { out })
    }

    pub fn write(&mut self, request: &Request) -> std::io::Result<()> {
        assert!(request.offset_bytes.is_multiple_of(512), "lbn counts 512-byte sectors");
        let op = match request.op {
            Op::Read => 'R',
            Op::Write => 'W',
        };
        writeln!(
            self.out,
            "{}.{:09},{op},{},{}",
            request.time_nanos / 1_000_000_000,
            request.time_nanos % 1_000_000_000,
            request.length_bytes,
            request.offset_bytes / 512
        )
    }

    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads a whole trace into memory.
pub fn read_all<R: BufRead>(input: R, source_name: &str, options: ReadOptions) -> Result<Vec<Request>, TraceError> {
    TraceReader::new(input, source_name, options)?.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, options: ReadOptions) -> Result<Vec<Request>, TraceError> {
        read_all(text.as_bytes(), "test", options)
    }

    fn write(time_nanos: u64, offset_bytes: u64, length_bytes: u64) -> Request {
        Request { time_nanos, op: Op::Write, offset_bytes, length_bytes }
    }

    #[test]
    fn csv_round_trips_through_the_writer() {
        let requests = vec![write(0, 4096, 4096), Request { op: Op::Read, ..write(1_500_000_001, 0, 512) }];
        let mut writer = CsvWriter::new(Vec::new(), "rewind trace export\nvolume db").unwrap();
        for request in &requests {
            writer.write(request).unwrap();
        }
        let text = String::from_utf8(writer.finish().unwrap()).unwrap();
        assert!(text.starts_with("# rewind trace export\n# volume db\ntime,op,size,lbn\n0.000000000,W,4096,8\n"));
        assert_eq!(read(&text, ReadOptions::default()).unwrap(), requests);
    }

    #[test]
    fn each_format_reads_its_example() {
        let fio3 = "fio version 3 iolog\n0 /dev/sdb add\n0 /dev/sdb open\n5 /dev/sdb write 8192 4096\n7 /dev/sdb read 0 512\n9 /dev/sdb close\n";
        assert_eq!(
            read(fio3, ReadOptions::default()).unwrap(),
            vec![write(0, 8192, 4096), Request { op: Op::Read, ..write(2_000_000, 0, 512) }]
        );
        let fio2 = "fio version 2 iolog\n/dev/sdb add\n/dev/sdb write 0 4096\n/dev/sdb write 4096 4096\n";
        assert_eq!(read(fio2, ReadOptions::default()).unwrap(), vec![write(0, 0, 4096), write(1_000_000, 4096, 4096)]);
        let blkparse = "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n  \
                        8,0    3        2     0.000001000   697  C   W 223490 + 8 [0]\n  \
                        8,0    1        7     0.500000000   700  Q  RA 16 + 1 [cat]\n\nCPU3 (8,0):\n";
        assert_eq!(
            read(blkparse, ReadOptions::default()).unwrap(),
            vec![write(0, 223490 * 512, 4096), Request { op: Op::Read, ..write(500_000_000, 8192, 512) }]
        );
        let msr =
            "128166372003061629,hm,1,Read,383496192,32768,5387\n128166372016382155,hm,1,Write,3221225472,4096,1000\n";
        let msr = read(msr, ReadOptions::default()).unwrap();
        assert_eq!(msr[1], write((128166372016382155 - 128166372003061629) * 100, 3221225472, 4096));
    }

    #[test]
    fn bad_lines_are_named() {
        let error = read("time,op,size,lbn\n0.1,W,4096,8\n0.2,X,4096,8\n", ReadOptions::default()).unwrap_err();
        assert_eq!(error.to_string(), "test, line 3: op \"X\" is neither R nor W");
        let error = read("0.5,W,4096,8\n0.2,W,4096,8\n", ReadOptions::default()).unwrap_err();
        assert!(error.to_string().starts_with("test, line 2: its time is before"), "{error}");
        let error = read("fio version 3 iolog\n0 /dev/sdb write 0\n", ReadOptions::default()).unwrap_err();
        assert_eq!(error.to_string(), "test, line 2: not an fio iolog v3 record");
        let error = read("hello world\n", ReadOptions::default()).unwrap_err();
        assert!(error.to_string().contains("cannot tell the trace's format"), "{error}");
        let error = read("1.5,W,4k,8\n", ReadOptions::default()).unwrap_err();
        assert_eq!(error.to_string(), "test, line 1: size \"4k\" is not a whole number");
    }

    /// A vscsi v1 record as libCacheSim lays it out.
    fn vscsi1(command: u16, length: u32, lbn: u64, micros: u64) -> Vec<u8> {
        let mut record = Vec::with_capacity(32);
        record.extend_from_slice(&7u32.to_le_bytes()); // sn
        record.extend_from_slice(&length.to_le_bytes());
        record.extend_from_slice(&1u32.to_le_bytes()); // nSG
        record.extend_from_slice(&command.to_le_bytes());
        record.extend_from_slice(&0x100u16.to_le_bytes()); // ver: 1 << 8
        record.extend_from_slice(&lbn.to_le_bytes());
        record.extend_from_slice(&micros.to_le_bytes());
        record
    }

    fn vscsi2(command: u16, length: u32, lbn: u64, micros: u64) -> Vec<u8> {
        let mut record = Vec::with_capacity(40);
        record.extend_from_slice(&command.to_le_bytes());
        record.extend_from_slice(&0x200u16.to_le_bytes());
        record.extend_from_slice(&7u32.to_le_bytes()); // sn
        record.extend_from_slice(&length.to_le_bytes());
        record.extend_from_slice(&1u32.to_le_bytes()); // nSG
        record.extend_from_slice(&lbn.to_le_bytes());
        record.extend_from_slice(&micros.to_le_bytes());
        record.extend_from_slice(&250u64.to_le_bytes()); // response time
        record
    }

    fn oracle_general(seconds: u32, id: u64, size: u32) -> Vec<u8> {
        let mut record = Vec::with_capacity(24);
        record.extend_from_slice(&seconds.to_le_bytes());
        record.extend_from_slice(&id.to_le_bytes());
        record.extend_from_slice(&size.to_le_bytes());
        record.extend_from_slice(&(-1i64).to_le_bytes());
        record
    }

    fn read_bytes(bytes: &[u8], name: &str, options: ReadOptions) -> Result<Vec<Request>, TraceError> {
        read_all(bytes, name, options)
    }

    #[test]
    fn binary_traces_read_their_records() {
        let read_at = |micros: u64| Request { op: Op::Read, ..write(micros * 1000, 0, 512) };
        // v1: a write, a SYNCHRONIZE CACHE (no data), a read; told from the version bytes.
        let v1 = [vscsi1(0x2a, 4096, 8, 1_000), vscsi1(0x35, 0, 0, 1_500), vscsi1(0x28, 512, 0, 2_000)].concat();
        let requests = read_bytes(&v1, "trace.vscsi", ReadOptions::default()).unwrap();
        assert_eq!(requests, vec![write(0, 4096, 4096), read_at(1_000)]);
        let v2 = [vscsi2(0x8a, 4096, 8, 1_000), vscsi2(0x88, 512, 0, 2_000)].concat();
        assert_eq!(read_bytes(&v2, "x", ReadOptions::default()).unwrap(), vec![write(0, 4096, 4096), read_at(1_000)]);
        // oracleGeneral has no mark: told by its name, or --format.
        let oracle = [oracle_general(10, 16, 4096), oracle_general(12, 0, 512)].concat();
        let expected = vec![write(0, 8192, 4096), write(2_000_000_000, 0, 512)];
        assert_eq!(read_bytes(&oracle, "w.oracleGeneral.bin", ReadOptions::default()).unwrap(), expected);
        let as_reads = ReadOptions { format: Some(Format::OracleGeneral), untyped_op: Op::Read, ..Default::default() };
        assert!(read_bytes(&oracle, "w", as_reads).unwrap().iter().all(|request| request.op == Op::Read));
    }

    #[test]
    fn damaged_binary_traces_name_the_record() {
        let mut cut = [vscsi1(0x2a, 4096, 8, 1_000), vscsi1(0x2a, 4096, 8, 2_000)].concat();
        cut.extend_from_slice(&[1, 2, 3]);
        let error = read_bytes(&cut, "t", ReadOptions::default()).unwrap_err();
        assert_eq!(error.to_string(), "t, record 3 (byte 64): cut short: 3 of its 32 bytes (the file is truncated)");
        let mut mixed = [vscsi1(0x2a, 4096, 8, 1_000), vscsi1(0x2a, 4096, 8, 2_000)].concat();
        mixed.extend_from_slice(&vscsi2(0x2a, 4096, 8, 3_000)[..32]);
        let error = read_bytes(&mixed, "t", ReadOptions::default()).unwrap_err();
        assert!(error.to_string().starts_with("t, record 3 (byte 64): its version byte says vscsi 0"), "{error}");
        let forced = ReadOptions { format: Some(Format::Vscsi), ..Default::default() };
        let error = read_bytes(b"time,op,size,lbn\n0,W,512,0\n", "t", forced).unwrap_err();
        assert!(error.to_string().contains("neither vscsi version 1 nor 2"), "{error}");
    }

    #[test]
    fn hostile_traces_are_errors_with_their_line_and_cost_no_memory() {
        let limits = ReadOptions::default();
        // One request of 1 TiB; one of u64::MAX bytes.
        let error = read("0,W,1099511627776,0\n", limits.clone()).unwrap_err();
        assert!(error.to_string().starts_with("test, line 1: a request of 1099511627776 bytes, more than"), "{error}");
        let error = read("0,W,4096,0\n1,W,18446744073709551615,8\n", limits.clone()).unwrap_err();
        assert!(
            error.to_string().starts_with("test, line 2: offset 4096 + size 18446744073709551615 passes 2^64"),
            "{error}"
        );
        // An LBN near 2^55: the end wraps past 2^64; at 2^55 the offset itself does.
        let near = (1u64 << 55) - 1;
        let error = read(&format!("0,W,4096,{near}\n"), limits.clone()).unwrap_err();
        assert!(error.to_string().contains("passes 2^64 bytes"), "{error}");
        let error = read(&format!("0,W,4096,{}\n", 1u64 << 55), limits.clone()).unwrap_err();
        assert_eq!(error.to_string(), "test, line 1: lbn 36028797018963968 is past 2^64 bytes in 512-byte sectors");
        let blkparse = format!("8,0 0 1 0.1 7 Q W {} + 8 [x]\n", 1u64 << 55);
        assert!(read(&blkparse, limits.clone())
            .unwrap_err()
            .to_string()
            .contains("sector 36028797018963968 is past 2^64"));
        // The device's size, when given, bounds every request.
        let small = ReadOptions { capacity_bytes: Some(1 << 20), ..limits.clone() };
        let error = read("0,W,4096,0\n1,W,4096,2048\n", small).unwrap_err();
        assert_eq!(
            error.to_string(),
            "test, line 2: the request ends at byte 1052672, past the device's 1048576 (--capacity)"
        );
        // A line of 1 GB is refused after 64 KiB: the reader never holds more.
        let endless = std::io::repeat(b'7').take(1 << 30);
        let error = read_all(std::io::BufReader::new(endless), "big", limits.clone()).unwrap_err();
        assert!(error.to_string().starts_with("big, line 1: the line is longer than 64 KiB"), "{error}");
        let error = read_all(
            std::io::BufReader::new(b"0,W,4096,0\n0".chain(std::io::repeat(b'1').take(1 << 20))),
            "big",
            limits.clone(),
        )
        .unwrap_err();
        assert!(error.to_string().starts_with("big, line 2: the line is longer than 64 KiB"), "{error}");
        // Binary garbage: named, once, with what to do.
        let garbage: Vec<u8> = (0..4096u32).map(|index| (index.wrapping_mul(2654435761) >> 13) as u8 | 0x80).collect();
        let error = read_bytes(&garbage, "noise", limits).unwrap_err();
        assert!(error.to_string().starts_with("noise, line 1: not text (bytes that are not UTF-8)"), "{error}");
        assert!(error.to_string().contains("--format"), "{error}");
    }

    #[test]
    fn requests_cover_whole_blocks() {
        assert_eq!(write(0, 4000, 200).blocks(4096), 0..2);
        assert_eq!(write(0, 8192, 4096).blocks(4096), 2..3);
        assert_eq!(write(0, 8192, 0).blocks(4096), 2..3, "an empty request still touches its block");
    }
}
