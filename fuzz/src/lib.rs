//! What the fuzz targets share: an allocator that measures each input's
//! peak heap use (so a target can assert that memory follows the bytes it
//! was given, never a count or length field), a cursor for carving an input
//! into choices and bytes, in-memory storage holding fuzzed files, and the
//! NBD client model that checks the server's replies (`nbd`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rewind_io::{OpenMode, SimConfig, SimStorage, Storage};

pub mod nbd;

// --- Memory -------------------------------------------------------------------------

/// The system allocator, counting live bytes and their peak. Counting costs
/// two atomic operations per call, which a fuzz target can afford.
pub struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = System.alloc(layout);
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Forwarded as such: large zeroed buffers then come from fresh pages
        // and cost nothing until touched.
        let pointer = System.alloc_zeroed(layout);
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        System.dealloc(pointer, layout);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let new = System.realloc(pointer, layout, size);
        if !new.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the most heap bytes it held at once
/// beyond what was live when it started (threads it started included).
pub fn peak_heap_bytes<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(before, Ordering::Relaxed);
    let result = f();
    let peak = PEAK_BYTES.load(Ordering::Relaxed);
    (result, peak.saturating_sub(before))
}

/// Asserts that decoding `input_bytes` bytes held at most `factor` times as
/// much heap plus `slack_bytes`: memory follows the bytes read, never a
/// count or length field inside them.
#[track_caller]
pub fn assert_heap_follows_input(peak_bytes: usize, input_bytes: usize, factor: usize, slack_bytes: usize) {
    let limit = input_bytes * factor + slack_bytes;
    assert!(
        peak_bytes <= limit,
        "{peak_bytes} heap bytes held for {input_bytes} input bytes (limit {limit}): \
         an allocation was sized by a field, not by the bytes there are"
    );
}

// --- Carving inputs -----------------------------------------------------------------

/// Takes choices off the front of a fuzz input; past its end every choice is
/// zero, so short inputs still mean something.
pub struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes }
    }

    pub fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&first, rest)) => {
                self.bytes = rest;
                first
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// Up to `count` bytes.
    pub fn bytes(&mut self, count: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(count.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    /// The bytes up to the next `separator` (dropped), or the rest.
    pub fn until(&mut self, separator: &[u8]) -> &'a [u8] {
        match self.bytes.windows(separator.len()).position(|window| window == separator) {
            Some(at) => {
                let head = &self.bytes[..at];
                self.bytes = &self.bytes[at + separator.len()..];
                head
            }
            None => self.rest(),
        }
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

// --- Checksums ------------------------------------------------------------------------

/// Writes the CRC-32C of `bytes[range]` little-endian at `at`, if both fit:
/// lets a target make fuzzed bytes pass a checksum so that the checks behind
/// it are reached too.
pub fn seal_crc(bytes: &mut [u8], range: std::ops::Range<usize>, at: usize) {
    if range.end <= bytes.len() && at + 4 <= bytes.len() {
        let crc = rewind_format::crc32c(&bytes[range]);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A little-endian `u64` of `bytes` at `at`, if it fits.
pub fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().expect("8 bytes")))
}

/// A little-endian `u32` of `bytes` at `at`, if it fits.
pub fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().expect("4 bytes")))
}

// --- Storage --------------------------------------------------------------------------

/// In-memory storage holding `files` (path, contents), directories created.
pub fn storage_with(files: &[(&str, &[u8])]) -> Arc<SimStorage> {
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 0));
    for (path, contents) in files {
        storage.create_dir_all(rewind_io::parent_dir(path)).expect("in-memory storage");
        let file = storage.open_file(path, OpenMode::CreateNew).expect("in-memory storage");
        file.write_all_at(contents, 0).expect("in-memory storage");
        file.sync_data().expect("in-memory storage");
    }
    storage
}

/// Makes `bytes` one well-formed copy of a metadata envelope around whatever
/// follows its 16-byte head (`docs/format/metadata.md`): payload length set,
/// and the CRC-32C over the head's first 12 bytes and the payload; magic and
/// version left as fuzzed.
pub fn seal_envelope(bytes: &mut [u8]) {
    if bytes.len() >= 16 {
        let length = (bytes.len() - 16) as u32;
        bytes[8..12].copy_from_slice(&length.to_le_bytes());
        let crc = rewind_format::crc32c_append(rewind_format::crc32c(&bytes[..12]), &bytes[16..]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A metadata file from a fuzz input: its first byte says whether to seal
/// the rest as one envelope copy (bit 0) and whether to write that copy
/// twice, as Rewind writes the file (bit 1); the bytes are otherwise used
/// as they are.
pub fn metadata_file(input: &[u8]) -> (u8, Vec<u8>) {
    let mut input = Cursor::new(input);
    let mode = input.u8();
    let mut bytes = input.rest().to_vec();
    if mode & 1 != 0 {
        seal_envelope(&mut bytes);
    }
    if mode & 2 != 0 {
        bytes = [&bytes[..], &bytes[..]].concat();
    }
    (mode, bytes)
}

/// The checks every whole-file metadata decoder gets (`volume.meta`,
/// `checkpoint`, `policy`, `bookmarks`, the index manifest), on the file
/// `metadata_file` makes of the input: decoding must not panic and must hold
/// memory in proportion to the input, never to a count inside it; what
/// decodes re-encodes to bytes that decode the same. And the point of two
/// copies: in a file of two equal copies, one flipped bit in one copy
/// decodes to the same value and `healed` gives back the file as it was,
/// while the same bit flipped in both is rejected. Returns what decoded and
/// the file.
pub fn check_envelope<T: PartialEq + std::fmt::Debug>(
    input: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, rewind_format::FormatError>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> Option<(T, Vec<u8>)> {
    let (mode, bytes) = metadata_file(input);
    let (decoded, peak) = peak_heap_bytes(|| decode(&bytes));
    // Error messages quote invalid names with escapes (up to 6 bytes for
    // one), hence the factor.
    assert_heap_follows_input(peak, bytes.len(), 16, 1024);
    let value = decoded.ok()?;
    assert_eq!(decode(&encode(&value)).as_ref(), Ok(&value), "re-encoded value decodes differently");
    let (first, second) = bytes.split_at(bytes.len() / 2);
    if bytes.len() % 2 == 0 && first == second {
        let bit = usize::from(mode) * 7919 % (first.len() * 8);
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(decode(&damaged).as_ref(), Ok(&value), "bit {bit} of one copy flipped and the other not read");
        let healed = rewind_format::meta::healed(&damaged).map(|(healed, _)| healed);
        assert_eq!(healed.as_ref(), Some(&bytes), "one damaged copy not healed from the other");
        damaged[first.len() + bit / 8] ^= 1 << (bit % 8);
        assert!(decode(&damaged).is_err(), "bit {bit} flipped in both copies and it still decodes");
    }
    Some((value, bytes))
}
