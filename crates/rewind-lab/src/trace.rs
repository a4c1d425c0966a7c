//! Block I/O traces: the requests the lab replays, and the formats they are
//! read from.
//!
//! | format | what it looks like | times |
//! |---|---|---|
//! | `csv` (also what `rewind trace export` and `rewind lab generate` write) | `time,op,size,lbn`: seconds, `R`/`W`, bytes, 512-byte sectors | as given |
//! | `fio` | fio's iolog, version 2 or 3 (`fio version 3 iolog`, then `ms file action offset length`) | v3: milliseconds; v2 has none: one record every `--iolog-interval` |
//! | `blkparse` | blkparse's default text output (`8,0 3 1 0.000000000 697 Q W 223490 + 8 [proc]`) | seconds; one action counted (`Q` by default) |
//! | `msr` | MSR Cambridge CSV (`Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`) | Windows file time (100 ns ticks) |
//!
//! Times must not decrease; a line that does, or that does not parse, is
//! an error naming its line. Times are kept relative to the first request.

use std::fmt;
use std::io::BufRead;

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
        let end = (self.offset_bytes + self.length_bytes.max(1)).div_ceil(block_bytes);
        first..end
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Fio,
    Blkparse,
    Msr,
}

impl Format {
    pub fn parse(name: &str) -> Result<Format, String> {
        match name {
            "csv" | "rewind" => Ok(Format::Csv),
            "fio" | "iolog" => Ok(Format::Fio),
            "blkparse" => Ok(Format::Blkparse),
            "msr" => Ok(Format::Msr),
            other => Err(format!("unknown trace format {other:?}: csv, fio, blkparse or msr")),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Csv => "csv",
            Format::Fio => "fio",
            Format::Blkparse => "blkparse",
            Format::Msr => "msr",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("{source_name}, line {line}: {reason}")]
    Line { source_name: String, line: u64, reason: String },
    #[error("{source_name}: {source}")]
    Io { source_name: String, source: std::io::Error },
    #[error(
        "{source_name}: cannot tell the trace's format from its first line {first:?}; \
         name it with --format (csv, fio, blkparse, msr)"
    )]
    UnknownFormat { source_name: String, first: String },
}

/// How to read a trace.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// `None`: tell from the first line.
    pub format: Option<Format>,
    /// Time between records of an fio iolog v2, which has none.
    pub iolog_interval_nanos: u64,
    /// The blkparse action counted (`Q`: queued; `C`: completed; …).
    pub blkparse_action: String,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { format: None, iolog_interval_nanos: 1_000_000, blkparse_action: "Q".to_owned() }
    }
}

/// Reads a trace's requests one by one.
pub struct TraceReader<R> {
    lines: std::io::Lines<R>,
    source_name: String,
    options: ReadOptions,
    format: Format,
    line: u64,
    /// A line read to tell the format, not yet parsed.
    pending: Option<String>,
    origin: Option<u64>,
    last_time: u64,
    /// fio v2: records so far, which make up its times.
    iolog_records: u64,
    iolog_version: u32,
}

impl<R: BufRead> TraceReader<R> {
    /// Starts reading `input` (named `source_name` in errors).
    pub fn new(input: R, source_name: &str, options: ReadOptions) -> Result<TraceReader<R>, TraceError> {
        let mut lines = input.lines();
        let mut line = 0u64;
        let mut first = None;
        for text in lines.by_ref() {
            line += 1;
            let text = text.map_err(|source| TraceError::Io { source_name: source_name.to_owned(), source })?;
            if !text.trim().is_empty() {
                first = Some(text);
                break;
            }
        }
        let format = match (options.format, &first) {
            (Some(format), _) => format,
            (None, None) => Format::Csv,
            (None, Some(first)) => detect(first).ok_or_else(|| TraceError::UnknownFormat {
                source_name: source_name.to_owned(),
                first: first.chars().take(80).collect(),
            })?,
        };
        Ok(TraceReader {
            lines,
            source_name: source_name.to_owned(),
            options,
            format,
            line: line.saturating_sub(1),
            pending: first,
            origin: None,
            last_time: 0,
            iolog_records: 0,
            iolog_version: 0,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn error(&self, reason: impl Into<String>) -> TraceError {
        TraceError::Line { source_name: self.source_name.clone(), line: self.line, reason: reason.into() }
    }

    fn next_line(&mut self) -> Option<Result<String, TraceError>> {
        self.line += 1;
        if let Some(pending) = self.pending.take() {
            return Some(Ok(pending));
        }
        let text = self.lines.next()?;
        Some(text.map_err(|source| TraceError::Io { source_name: self.source_name.clone(), source }))
    }

    /// Parses one line: `None` for lines that carry no request.
    fn parse(&mut self, text: &str) -> Result<Option<(u64, Op, u64, u64)>, TraceError> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        match self.format {
            Format::Csv => self.parse_csv(text),
            Format::Fio => self.parse_fio(text),
            Format::Blkparse => self.parse_blkparse(text),
            Format::Msr => self.parse_msr(text),
        }
    }

    fn parse_csv(&self, text: &str) -> Result<Option<(u64, Op, u64, u64)>, TraceError> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.first().is_some_and(|field| field.eq_ignore_ascii_case("time")) {
            return Ok(None); // The header.
        }
        let [time, op, size, lbn] = fields[..] else {
            return Err(self.error(format!("expected time,op,size,lbn; found {} fields", fields.len())));
        };
        let time = seconds_to_nanos(time).ok_or_else(|| self.error(format!("time {time:?} is not seconds")))?;
        let op = parse_op(op).ok_or_else(|| self.error(format!("op {op:?} is neither R nor W")))?;
        let size = self.number(size, "size")?;
        let lbn = self.number(lbn, "lbn")?;
        let offset = lbn.checked_mul(512).ok_or_else(|| self.error("lbn is too large"))?;
        Ok(Some((time, op, offset, size)))
    }

    fn parse_fio(&mut self, text: &str) -> Result<Option<(u64, Op, u64, u64)>, TraceError> {
        if let Some(version) = text.strip_prefix("fio version ").and_then(|rest| rest.strip_suffix(" iolog")) {
            self.iolog_version = match version {
                "2" => 2,
                "3" => 3,
                other => return Err(self.error(format!("fio iolog version {other} (this reads 2 and 3)"))),
            };
            return Ok(None);
        }
        if self.iolog_version == 0 {
            return Err(self.error("an fio iolog starts with `fio version 2 iolog` or `fio version 3 iolog`"));
        }
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (time, rest) = if self.iolog_version == 3 {
            let Some((time, rest)) = fields.split_first() else { return Ok(None) };
            let millis = self.number(time, "timestamp")?;
            (millis.checked_mul(1_000_000).ok_or_else(|| self.error("timestamp is too large"))?, rest)
        } else {
            (self.iolog_records * self.options.iolog_interval_nanos, &fields[..])
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
            _ => return Err(self.error(format!("not an fio iolog v{} record", self.iolog_version))),
        };
        self.iolog_records += 1;
        Ok(Some((time, op, offset, length)))
    }

    fn parse_blkparse(&self, text: &str) -> Result<Option<(u64, Op, u64, u64)>, TraceError> {
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
        let time = seconds_to_nanos(time).ok_or_else(|| self.error(format!("time {time:?} is not seconds")))?;
        let sector = self.number(sector, "sector")?;
        let count = self.number(count, "sector count")?;
        Ok(Some((time, op, sector * 512, count * 512)))
    }

    fn parse_msr(&self, text: &str) -> Result<Option<(u64, Op, u64, u64)>, TraceError> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.first().is_some_and(|field| field.eq_ignore_ascii_case("timestamp")) {
            return Ok(None);
        }
        let [ticks, _host, _disk, kind, offset, size, _response] = fields[..] else {
            return Err(self.error(format!("expected 7 MSR fields; found {}", fields.len())));
        };
        let ticks = self.number(ticks, "timestamp")?;
        let op = parse_op(kind).ok_or_else(|| self.error(format!("type {kind:?} is neither Read nor Write")))?;
        let time = ticks.checked_mul(100).ok_or_else(|| self.error("timestamp is too large"))?;
        Ok(Some((time, op, self.number(offset, "offset")?, self.number(size, "size")?)))
    }

    fn number(&self, text: &str, what: &str) -> Result<u64, TraceError> {
        text.parse().map_err(|_| self.error(format!("{what} {text:?} is not a whole number")))
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let text = match self.next_line()? {
                Ok(text) => text,
                Err(error) => return Some(Err(error)),
            };
            let (time, op, offset_bytes, length_bytes) = match self.parse(&text) {
                Ok(Some(parsed)) => parsed,
                Ok(None) => continue,
                Err(error) => return Some(Err(error)),
            };
            let origin = *self.origin.get_or_insert(time);
            let Some(time_nanos) = time.checked_sub(origin).filter(|&time| time >= self.last_time) else {
                let reason = "its time is before the previous request's; the lab replays traces in time order";
                return Some(Err(self.error(reason)));
            };
            self.last_time = time_nanos;
            return Some(Ok(Request { time_nanos, op, offset_bytes, length_bytes }));
        }
    }
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

    #[test]
    fn requests_cover_whole_blocks() {
        assert_eq!(write(0, 4000, 200).blocks(4096), 0..2);
        assert_eq!(write(0, 8192, 4096).blocks(4096), 2..3);
        assert_eq!(write(0, 8192, 0).blocks(4096), 2..3, "an empty request still touches its block");
    }
}
