//! Rewind's on-disk byte formats, and nothing else: no I/O, no allocation
//! policy, no knowledge of files. Every structure carries a magic number, a
//! format version and a CRC-32C checksum, checked right after reading and
//! computed right before writing. All integers are little-endian and of fixed
//! width. The byte-level layout is documented in `docs/format/`.

mod bytes;
pub mod catalog;
pub mod chunks;
#[cfg(target_arch = "x86_64")]
mod crc_fold;
pub mod current;
pub mod groups;
pub mod index;
pub mod journal;
pub mod meta;
pub mod pack;
pub mod tree;

use std::sync::LazyLock;

pub use bytes::{Reader, Writer};

/// Which CRC-32C implementation checks a 4 KiB block fastest on this CPU
/// (nearly every check is of one block, and there is one on every read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crc32cEngine {
    /// crc-fast's carry-less multiply: chosen where the CPU has AVX-512,
    /// 42.1 GB/s against 18.8 for the other on 4 KiB blocks (an Intel Xeon,
    /// 54e58fb).
    Carryless,
    /// Rewind's own fold with 256-bit carry-less multiplies (`crc_fold`):
    /// chosen where the CPU has AVX2 and VPCLMULQDQ but not AVX-512, where
    /// crc-fast falls back to a path that is slow on short inputs. On an AMD
    /// EPYC 7003, 4 KiB blocks in the caches: the fold 15.9–20.3 GB/s, the
    /// crc32c crate 13.7–15.8, crc-fast 8.3–12.1 (`chunk-bench crc --bytes 1MiB`).
    Folded,
    /// The crc32c crate's loop of the CPU's CRC instruction: chosen
    /// elsewhere (its checks were a fifth of the server's time in a read on
    /// that EPYC). `chunk-bench crc` measures each engine this CPU runs.
    CrcInstruction,
}

impl Crc32cEngine {
    /// Every engine, whether or not this CPU runs it.
    pub const ALL: [Crc32cEngine; 3] = [Crc32cEngine::Carryless, Crc32cEngine::Folded, Crc32cEngine::CrcInstruction];

    /// Whether this CPU runs the engine (crc-fast and the crc32c crate run
    /// everywhere, each picking its best path).
    pub fn available(self) -> bool {
        match self {
            Crc32cEngine::Folded => folding_available(),
            Crc32cEngine::Carryless | Crc32cEngine::CrcInstruction => true,
        }
    }

    /// The engines this CPU runs, in the order of [`Crc32cEngine::ALL`].
    pub fn on_this_cpu() -> Vec<Crc32cEngine> {
        Crc32cEngine::ALL.into_iter().filter(|engine| engine.available()).collect()
    }
}

#[cfg(target_arch = "x86_64")]
fn folding_available() -> bool {
    crc_fold::available()
}

#[cfg(not(target_arch = "x86_64"))]
fn folding_available() -> bool {
    false
}

static CRC32C_ENGINE: LazyLock<Crc32cEngine> =
    LazyLock::new(|| match crc_fast::get_calculator_target(crc_fast::CrcAlgorithm::Crc32Iscsi).contains("avx512") {
        true => Crc32cEngine::Carryless,
        false if folding_available() => Crc32cEngine::Folded,
        false => Crc32cEngine::CrcInstruction,
    });

/// Computes the CRC-32C (Castagnoli) checksum used throughout the formats.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c_with(*CRC32C_ENGINE, bytes)
}

/// Continues a CRC-32C over further bytes.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c_append_with(*CRC32C_ENGINE, crc, bytes)
}

/// The implementation this machine checks with.
pub fn crc32c_engine() -> Crc32cEngine {
    *CRC32C_ENGINE
}

/// [`crc32c`] by a given implementation (`chunk-bench crc` times each).
/// Panics if this CPU does not run it ([`Crc32cEngine::available`]).
pub fn crc32c_with(engine: Crc32cEngine, bytes: &[u8]) -> u32 {
    match engine {
        Crc32cEngine::Carryless => crc_fast::crc32_iscsi(bytes),
        Crc32cEngine::Folded | Crc32cEngine::CrcInstruction => crc32c_append_with(engine, 0, bytes),
    }
}

fn crc32c_append_with(engine: Crc32cEngine, crc: u32, bytes: &[u8]) -> u32 {
    match engine {
        Crc32cEngine::Carryless => {
            // The digest's state is the register before the final inversion.
            let mut digest = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
            digest.update(bytes);
            digest.finalize() as u32
        }
        Crc32cEngine::Folded => folded_append(crc, bytes),
        Crc32cEngine::CrcInstruction => ::crc32c::crc32c_append(crc, bytes),
    }
}

#[cfg(target_arch = "x86_64")]
fn folded_append(crc: u32, bytes: &[u8]) -> u32 {
    crc_fold::crc32c_append(crc, bytes)
}

#[cfg(not(target_arch = "x86_64"))]
fn folded_append(_crc: u32, _bytes: &[u8]) -> u32 {
    panic!("CRC-32C folding runs on x86-64 only")
}

/// The CRC-32C of bytes `A` followed by `B`, from `crc_a` (of `A`), `crc_b`
/// (of `B`) and the length of `B`, without reading either again: a pack
/// record's CRC (header, then stored bytes) checked from the CRC of its
/// stored bytes, which the reader of a block version needs anyway. CRC-32C
/// is linear: feeding `B`'s length of zero bytes through `crc_a` is a
/// 32 × 32 bit matrix, one per power of two of the length, made once.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    let zeros = crc32c_zero_operators();
    let mut crc = crc_a;
    for (power, operator) in zeros.iter().enumerate() {
        if len_b >> power & 1 == 1 {
            crc = apply_operator(operator, crc);
        }
    }
    crc ^ crc_b
}

/// A linear map of 32-bit CRC registers: column `i` is the image of bit `i`.
type CrcOperator = [u32; 32];

fn apply_operator(operator: &CrcOperator, crc: u32) -> u32 {
    let mut image = 0;
    let mut bits = crc;
    while bits != 0 {
        image ^= operator[bits.trailing_zeros() as usize];
        bits &= bits - 1;
    }
    image
}

/// Entry `k`: what feeding 2^k zero bytes does to a CRC-32C register.
fn crc32c_zero_operators() -> &'static [CrcOperator; 64] {
    static OPERATORS: std::sync::OnceLock<[CrcOperator; 64]> = std::sync::OnceLock::new();
    OPERATORS.get_or_init(|| {
        /// The Castagnoli polynomial, bit-reversed (CRC-32C shifts right).
        const POLYNOMIAL: u32 = 0x82f6_3b78;
        let mut operators = [[0; 32]; 64];
        for (bit, column) in operators[0].iter_mut().enumerate() {
            let mut register = 1u32 << bit;
            for _ in 0..8 {
                register = (register >> 1) ^ if register & 1 == 1 { POLYNOMIAL } else { 0 };
            }
            *column = register;
        }
        for power in 1..64 {
            let half = operators[power - 1];
            operators[power] = half.map(|column| apply_operator(&half, column));
        }
        operators
    })
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{what}: bad magic number {found:#010x}")]
    BadMagic { what: &'static str, found: u32 },
    #[error("{what}: unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion { what: &'static str, found: u32, supported: u32 },
    #[error("{what}: damaged (checksum mismatch: stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { what: &'static str, stored: u32, computed: u32 },
    /// The bytes are all there but not what was written.
    #[error("{what}: damaged: {reason}")]
    Damaged { what: &'static str, reason: String },
    #[error("{what}: truncated ({available} bytes, need {needed})")]
    Truncated { what: &'static str, available: usize, needed: usize },
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

/// Checks that a structure's format version is the one this build reads.
pub(crate) fn check_version(what: &'static str, found: u32, supported: u32) -> Result<(), FormatError> {
    if found == supported {
        Ok(())
    } else {
        Err(FormatError::UnsupportedVersion { what, found, supported })
    }
}

/// Checks a stored checksum against the computed one.
pub fn verify_crc(what: &'static str, stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored == computed {
        Ok(())
    } else {
        Err(FormatError::Checksum { what, stored, computed })
    }
}

#[cfg(test)]
mod tests {
    use super::{crc32c, crc32c_append, crc32c_append_with, crc32c_combine, crc32c_engine, crc32c_with, Crc32cEngine};

    /// Checksums on disk were computed by any of the implementations, as the
    /// machine chose (a volume moves between machines): each gives the
    /// check value of the CRC-32C catalogue, and appending in any split
    /// agrees with the whole and with the others, whichever this machine
    /// uses.
    #[test]
    fn crc32c_is_the_castagnoli_checksum_in_any_split_by_every_engine() {
        let bytes: Vec<u8> = (0..20_000u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let whole = crc32c(&bytes);
        let engines = Crc32cEngine::on_this_cpu();
        eprintln!("engines this CPU runs: {engines:?}");
        assert!(engines.contains(&crc32c_engine()), "the chosen engine runs here");
        for engine in engines {
            assert_eq!(crc32c_with(engine, b"123456789"), 0xe306_9283, "{engine:?}");
            assert_eq!(crc32c_with(engine, b""), 0, "{engine:?}");
            assert_eq!(crc32c_with(engine, &[0u8; 32]), 0x8a91_36aa, "{engine:?}");
            for length in [1, 15, 16, 64, 255, 256, 300, 4095, 4096, 4160, 20_000] {
                assert_eq!(crc32c_with(engine, &bytes[..length]), crc32c(&bytes[..length]), "{engine:?}, {length}");
            }
            for split in [0, 1, 7, 8, 63, 64, 4096, 9_999, 20_000] {
                let (head, tail) = bytes.split_at(split);
                assert_eq!(crc32c_append_with(engine, crc32c(head), tail), whole, "{engine:?}, split at {split}");
                assert_eq!(crc32c_append(crc32c(head), tail), whole, "split at {split}");
            }
        }
    }

    /// Combining the CRCs of the parts gives the CRC of the whole, for every
    /// length's bits (powers of two and not, 0 included).
    #[test]
    fn crc32c_of_a_whole_combines_from_its_parts() {
        let bytes: Vec<u8> = (0..70_000u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for (head_len, tail_len) in
            [(0, 0), (5, 0), (0, 9), (48, 4096), (48, 4095), (1, 65_536), (4096, 1), (7, 62_001)]
        {
            let (head, tail) = (&bytes[..head_len], &bytes[head_len..head_len + tail_len]);
            let whole = crc32c(&bytes[..head_len + tail_len]);
            let combined = crc32c_combine(crc32c(head), crc32c(tail), tail_len as u64);
            assert_eq!(combined, whole, "{head_len} bytes then {tail_len}");
        }
    }
}

/// Regression tests for what the fuzz targets in `fuzz/` found; each case's
/// crashing input is kept under `fuzz/regressions/`.
#[cfg(test)]
mod fuzz_regressions {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use crate::meta::{open_envelope_for_tests, Bookmarks, IndexManifest, TimelineFrame, VolumePolicy};
    use crate::{chunks, pack, Writer};

    thread_local! {
        static LARGEST_BYTES: Cell<usize> = const { Cell::new(0) };
    }

    /// Records the largest allocation each thread makes, so a test can
    /// measure its own decoding while other tests run.
    struct Recording;

    unsafe impl GlobalAlloc for Recording {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = LARGEST_BYTES.try_with(|largest| largest.set(largest.get().max(layout.size())));
            System.alloc(layout)
        }
        unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
            System.dealloc(pointer, layout)
        }
    }

    #[global_allocator]
    static ALLOCATOR: Recording = Recording;

    fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LARGEST_BYTES.with(|largest| largest.set(0));
        let result = f();
        (result, LARGEST_BYTES.with(Cell::get))
    }

    /// An envelope (`magic`) whose payload is `fields` and nothing more.
    fn envelope(magic: &[u8; 4], fields: Writer) -> Vec<u8> {
        let bytes = crate::meta::seal_envelope(*magic, fields);
        assert!(open_envelope_for_tests(&bytes, *magic), "test envelope is well-formed");
        bytes
    }

    #[test]
    fn a_count_in_a_short_file_reserves_nothing() {
        // Each file claims the most entries its format allows and holds none.
        let mut manifest = Writer::new();
        manifest.u64(1).u64(2).u64(0).u64(0).u32(1 << 16);
        let mut bookmarks = Writer::new();
        bookmarks.u32(1 << 16);
        let mut policy = Writer::new();
        policy.u64(0).u64(0).u32(0).u64(0).u32(0).u32(1 << 16);
        let mut dedup = Writer::new();
        dedup.u64(0).u64(1).u32(1 << 12);
        let mut timeline = Writer::new();
        timeline.u32(u32::from_le_bytes(*b"RWTL")).u64(1).u32(1 << 20);
        type Refused = fn(&[u8]) -> bool;
        let cases: [(&str, Vec<u8>, Refused); 5] = [
            ("index manifest", envelope(b"RWIM", manifest), |b| IndexManifest::decode(b).is_err()),
            ("bookmarks", envelope(b"RWBM", bookmarks), |b| Bookmarks::decode(b).is_err()),
            ("policy", envelope(b"RWPO", policy), |b| VolumePolicy::decode(b).is_err()),
            ("dedup manifest", envelope(b"RWDM", dedup), |b| chunks::DedupManifest::decode(b).is_err()),
            ("timeline", timeline.into_bytes(), |b| TimelineFrame::decode_all(b).0.is_empty()),
        ];
        for (what, bytes, refused) in cases {
            let (refused, largest) = largest_allocation(|| refused(&bytes));
            assert!(refused, "{what}: a file with no entries decoded");
            assert!(largest <= 256, "{what}: {} bytes reserved {largest} bytes at once", bytes.len());
        }
    }

    #[test]
    fn run_headers_whose_layout_overflows_are_refused() {
        // Consistent counts, but the pages would end past u64: the offsets
        // readers compute from them must not overflow.
        let entry_count = u64::MAX;
        let index = crate::index::RunHeader {
            entry_count,
            data_page_count: entry_count.div_ceil(crate::index::ENTRIES_PER_PAGE as u64),
            timestamp_min: rewind_types::Timestamp::MIN,
            timestamp_max: rewind_types::Timestamp::MAX,
            fence_crc32c: 0,
        };
        let error = crate::index::RunHeader::decode(&index.encode()).unwrap_err();
        assert!(error.to_string().contains("do not fit in a file"), "{error}");
        let dedup = chunks::DedupRunHeader {
            entry_count,
            data_page_count: entry_count.div_ceil(chunks::DEDUP_ENTRIES_PER_PAGE as u64),
            bloom_bits: 64,
            bloom_hashes: 7,
            fence_crc32c: 0,
            bloom_crc32c: 0,
        };
        let error = chunks::DedupRunHeader::decode(&dedup.encode()).unwrap_err();
        assert!(error.to_string().contains("do not fit in a file"), "{error}");
    }

    #[test]
    fn footer_entries_and_table_slots_larger_than_a_chunk_are_refused() {
        let entry = |stored_bytes, raw_bytes| {
            let mut bytes = Vec::new();
            let id = rewind_types::ChunkId(1);
            pack::FooterEntry { hash: [1; 32], id, offset: 64, stored_bytes, raw_bytes }.encode(&mut bytes);
            bytes
        };
        let max = pack::CHUNK_BYTES_MAX;
        assert!(pack::FooterEntry::decode_all(&entry(max, max)).is_ok());
        for (stored, raw) in [(max + 1, max), (100, u32::MAX)] {
            let error = pack::FooterEntry::decode_all(&entry(stored, raw)).unwrap_err();
            assert!(error.to_string().contains("larger than a block can be"), "{error}");
        }
        let slot = |stored_bytes, raw_bytes| chunks::TableSlot {
            hash: [2; 32],
            pack: 3,
            offset: 64,
            stored_bytes,
            raw_bytes,
            bare_crc32c: None,
        };
        let id = rewind_types::ChunkId(9);
        assert!(chunks::TableSlot::decode(&slot(max, max).encode(id), id).is_ok());
        let error = chunks::TableSlot::decode(&slot(u32::MAX, 10).encode(id), id).unwrap_err();
        assert!(error.to_string().contains("larger than a block can be"), "{error}");
    }
}
