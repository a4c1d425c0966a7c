//! Packs: round trips through real files, and golden fixtures of the format
//! (a sealed pack, the same pack with one stored byte flipped, and the same
//! pack cut off mid-record as a crash leaves it).
//!
//! The fixtures are committed; `REWIND_REGENERATE_FIXTURES=1 cargo test -p
//! rewind-chunks --test pack` rewrites them (only for a deliberate format
//! change, which also bumps `FORMAT_VERSION`).

use std::path::{Path, PathBuf};

use rand::{RngCore, SeedableRng};
use rewind_chunks::{chunk_hash, Check, ChunkError, Codec, Compressor, PackReader, PackWriter};
use rewind_format::pack::RecordHeader;
use rewind_io::OsStorage;
use std::sync::Arc;

use rewind_chunks::{LocalPackStore, PackStore};

/// The packs in `dir`, as the chunk store keeps them locally.
fn packs_in(dir: &Path) -> Arc<dyn PackStore> {
    Arc::new(LocalPackStore::open(Arc::new(OsStorage::new(dir).unwrap()), ".").unwrap())
}
use rewind_types::ChunkId;

const FIXTURE_PACK: u64 = 0x2a;

/// The chunks of the fixture pack: compressible, incompressible, all zeros,
/// and a 512-byte block.
fn fixture_chunks() -> Vec<Vec<u8>> {
    let text: Vec<u8> = b"Rewind keeps every write. ".iter().copied().cycle().take(4096).collect();
    let mut noise = vec![0; 4096];
    rand_chacha::ChaCha8Rng::seed_from_u64(7).fill_bytes(&mut noise);
    let small: Vec<u8> = (0..512u32).map(|index| (index * 7 % 251) as u8).collect();
    vec![text, noise, vec![0; 4096], small]
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Adds `raw` to `writer` as chunk `id`, compressed where that pays, as an
/// archive pass stores it.
fn add(writer: &mut PackWriter, id: u64, raw: &[u8]) -> rewind_chunks::ChunkLocation {
    let mut stored = Vec::new();
    let codec = Compressor::new().unwrap().compress(raw, &mut stored);
    writer.add_stored(ChunkId(id), chunk_hash(raw), codec, &stored, raw.len() as u32).unwrap()
}

/// Writes the fixture pack into `dir` and returns its path.
fn write_fixture_pack(dir: &Path) -> PathBuf {
    let packs = packs_in(dir);
    let mut writer = PackWriter::create(&*packs, FIXTURE_PACK).unwrap();
    for (index, chunk) in fixture_chunks().iter().enumerate() {
        add(&mut writer, 100 + index as u64, chunk);
    }
    writer.seal().unwrap();
    dir.join(rewind_chunks::pack_name(FIXTURE_PACK))
}

/// Opens a copy of fixture `name` as pack `FIXTURE_PACK`.
fn open_fixture(name: &str) -> (tempfile::TempDir, Result<PackReader, ChunkError>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures_dir().join(name), dir.path().join(rewind_chunks::pack_name(FIXTURE_PACK))).unwrap();
    let reader = PackReader::open(&packs_in(dir.path()), FIXTURE_PACK);
    (dir, reader)
}

/// The corrupt and torn fixtures, made from the sealed one.
fn derive_damaged(sealed: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (first, _) = RecordHeader::decode_record(&sealed[64..]).unwrap();
    let second = 64 + first.record_bytes() as usize;
    // One byte of the second chunk's stored bytes flipped.
    let mut corrupt = sealed.to_vec();
    corrupt[second + 56 + 100] ^= 0x10;
    // Cut off inside the third record (the second is 4096 raw bytes), as a
    // crash while writing would leave it.
    let torn = sealed[..second + 56 + 4096 + 30].to_vec();
    (corrupt, torn)
}

#[test]
fn fixtures_follow_their_recipe() {
    let dir = fixtures_dir();
    if std::env::var_os("REWIND_REGENERATE_FIXTURES").is_some() {
        let scratch = tempfile::tempdir().unwrap();
        let sealed = std::fs::read(write_fixture_pack(scratch.path())).unwrap();
        let (corrupt, torn) = derive_damaged(&sealed);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sealed.pack"), &sealed).unwrap();
        std::fs::write(dir.join("corrupt.pack"), corrupt).unwrap();
        std::fs::write(dir.join("torn.pack"), torn).unwrap();
    }
    let sealed = std::fs::read(dir.join("sealed.pack")).unwrap();
    let (corrupt, torn) = derive_damaged(&sealed);
    assert!(std::fs::read(dir.join("corrupt.pack")).unwrap() == corrupt, "corrupt.pack is not sealed.pack damaged");
    assert!(std::fs::read(dir.join("torn.pack")).unwrap() == torn, "torn.pack is not sealed.pack cut short");
}

#[test]
fn sealed_fixture_reads_back_every_chunk() {
    let (_dir, reader) = open_fixture("sealed.pack");
    let reader = reader.unwrap();
    let chunks = fixture_chunks();
    let entries = reader.footer().unwrap();
    assert_eq!(entries.len(), chunks.len());
    for (index, (entry, chunk)) in entries.iter().zip(&chunks).enumerate() {
        assert_eq!(entry.hash, chunk_hash(chunk));
        assert_eq!(entry.id, ChunkId(100 + index as u64));
        let mut out = vec![0; entry.raw_bytes as usize];
        reader.read(reader.location(entry), &entry.hash, &mut out, Check::Hash).unwrap();
        assert_eq!(&out, chunk);
    }
    assert_eq!(reader.verify().unwrap(), 4);
}

#[test]
fn sealed_fixture_compresses_what_pays_and_stores_the_rest() {
    let (_dir, reader) = open_fixture("sealed.pack");
    let reader = reader.unwrap();
    let stored: Vec<(u32, u32)> =
        reader.footer().unwrap().iter().map(|entry| (entry.stored_bytes, entry.raw_bytes)).collect();
    assert!(stored[0].0 < 200, "repeated text compresses: {stored:?}");
    assert_eq!(stored[1], (4096, 4096), "random bytes are stored as they are");
    assert!(stored[2].0 < 100, "zeros compress: {stored:?}");
    assert_eq!(stored[3].1, 512);
}

#[test]
fn writing_the_fixture_today_reads_the_same() {
    // The committed fixture and a pack written by this build hold the same
    // chunks at the same offsets (compressed bytes may differ between zstd
    // releases, so the bytes are not compared).
    let dir = tempfile::tempdir().unwrap();
    write_fixture_pack(dir.path());
    let fresh = PackReader::open(&packs_in(dir.path()), FIXTURE_PACK).unwrap();
    let (_fixture_dir, fixture) = open_fixture("sealed.pack");
    let fixture = fixture.unwrap();
    let hashes =
        |reader: &PackReader| reader.footer().unwrap().iter().map(|entry| (entry.hash, entry.id)).collect::<Vec<_>>();
    assert_eq!(hashes(&fresh), hashes(&fixture));
    assert_eq!(fresh.verify().unwrap(), 4);
}

#[test]
fn corrupt_fixture_fails_that_chunk_only() {
    let (_dir, reader) = open_fixture("corrupt.pack");
    let reader = reader.expect("the footer and trailer are intact");
    let entries = reader.footer().unwrap();
    for (index, entry) in entries.iter().enumerate() {
        let mut out = vec![0; entry.raw_bytes as usize];
        let result = reader.read(reader.location(entry), &entry.hash, &mut out, Check::Hash);
        if index == 1 {
            let error = result.unwrap_err();
            assert!(
                matches!(&error, ChunkError::Corrupt { offset, .. } if *offset == entry.offset),
                "unexpected error: {error}"
            );
            assert!(error.to_string().contains("checksum mismatch"), "{error}");
        } else {
            result.unwrap();
        }
    }
    assert!(matches!(reader.verify(), Err(ChunkError::Corrupt { .. })));
}

#[test]
fn torn_fixture_is_unsealed_not_corrupt() {
    let (_dir, reader) = open_fixture("torn.pack");
    let error = reader.err().expect("a torn pack does not open");
    assert!(matches!(error, ChunkError::Unsealed { .. }), "unexpected error: {error}");
    assert!(error.to_string().contains("never sealed"), "{error}");
}

#[test]
fn a_record_that_names_another_chunk_is_corruption() {
    let (_dir, reader) = open_fixture("sealed.pack");
    let reader = reader.unwrap();
    let entry = reader.footer().unwrap()[0];
    let mut out = vec![0; entry.raw_bytes as usize];
    let error = reader.read(reader.location(&entry), &[9; 32], &mut out, Check::Hash).unwrap_err();
    assert!(error.to_string().contains("not the chunk"), "{error}");
}

/// A record whose bytes are intact but are not the chunk it names (a writer
/// that hashed one buffer and stored another): the CRC-32C every read checks
/// cannot see it, the BLAKE3 hash that scrubs and copies check does.
#[test]
fn only_the_hash_check_sees_a_record_whose_bytes_are_another_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let packs = packs_in(dir.path());
    let mut writer = PackWriter::create(&*packs, 1).unwrap();
    let (named, stored) = (vec![1u8; 4096], vec![2u8; 4096]);
    let location = writer.add_stored(ChunkId(1), chunk_hash(&named), Codec::Raw, &stored, 4096).unwrap();
    writer.seal().unwrap();
    let reader = PackReader::open(&packs, 1).unwrap();
    let mut out = vec![0; 4096];
    reader.read(location, &chunk_hash(&named), &mut out, Check::Crc).unwrap();
    assert_eq!(out, stored);
    let error = reader.read(location, &chunk_hash(&named), &mut out, Check::Hash).unwrap_err();
    assert!(error.to_string().contains("hash to something else"), "{error}");
    let error = reader.verify().unwrap_err();
    assert!(error.to_string().contains("hash to something else"), "{error}");
}

#[test]
fn many_chunks_round_trip_through_a_large_pack() {
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let packs = packs_in(dir.path());
    let mut writer = PackWriter::create(&*packs, 1).unwrap();
    let mut chunks = Vec::new();
    for index in 0..2000usize {
        // Half compressible (a repeated byte with some noise), half random.
        let mut chunk = vec![(index % 256) as u8; 4096];
        if index % 2 == 0 {
            rng.fill_bytes(&mut chunk);
        } else {
            rng.fill_bytes(&mut chunk[..64]);
        }
        let location = add(&mut writer, index as u64 + 1, &chunk);
        chunks.push((location, chunk));
    }
    let sealed = writer.seal().unwrap();
    assert_eq!(sealed.chunk_count, 2000);
    assert_eq!(sealed.raw_bytes, 2000 * 4096);
    assert!(sealed.bytes < sealed.raw_bytes * 6 / 10, "half the chunks compress well: {sealed:?}");
    let reader = PackReader::open(&packs, 1).unwrap();
    let mut codecs = [0; 2];
    for (location, chunk) in &chunks {
        let mut out = vec![0; 4096];
        reader.read(*location, &chunk_hash(chunk), &mut out, Check::Hash).unwrap();
        assert_eq!(&out, chunk);
        codecs[usize::from(location.stored_bytes < location.raw_bytes)] += 1;
    }
    assert_eq!(codecs, [1000, 1000], "random chunks raw, the others {:?}", Codec::Zstd);
}

#[test]
fn a_pack_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture_pack(dir.path());
    let before = std::fs::read(&path).unwrap();
    let mut writer = PackWriter::create(&*packs_in(dir.path()), FIXTURE_PACK).unwrap();
    add(&mut writer, 1, &[1; 4096]);
    let error = writer.seal().unwrap_err();
    assert!(error.to_string().contains("already exists"), "{error}");
    assert!(!error.is_transient());
    assert_eq!(std::fs::read(&path).unwrap(), before, "the sealed pack is unchanged");
}

/// Each reading thread keeps one zstd context for every frame it
/// decompresses: a frame that fails leaves nothing behind that changes the
/// next. The fixture's compressed chunk is decoded with its frame damaged
/// (and its record's CRC made to match, so the damage reaches zstd), then
/// as it is, on the same thread, twice over.
#[test]
fn a_frame_that_fails_to_decompress_leaves_the_next_one_whole() {
    let (_dir, reader) = open_fixture("sealed.pack");
    let reader = reader.unwrap();
    let text = &fixture_chunks()[0];
    let entry = reader.footer().unwrap()[0];
    let location = reader.location(&entry);
    let sealed = std::fs::read(fixtures_dir().join("sealed.pack")).unwrap();
    let record = &sealed[location.offset as usize..][..56 + entry.stored_bytes as usize];
    assert_eq!(RecordHeader::decode_record(record).unwrap().0.codec, Codec::Zstd);
    let mut damaged = record.to_vec();
    for byte in &mut damaged[56 + 4..] {
        *byte ^= 0x5a;
    }
    let crc = rewind_format::crc32c_append(rewind_format::crc32c(&damaged[..48]), &damaged[56..]);
    damaged[48..52].copy_from_slice(&crc.to_le_bytes());
    for round in 0..2 {
        let mut out = vec![0; 4096];
        let failed = reader.decode(location, &entry.hash, &damaged, &mut out, Check::Hash);
        let reached_zstd =
            matches!(&failed, Err(error @ ChunkError::Corrupt { .. }) if error.to_string().contains("zstd"));
        assert!(reached_zstd, "round {round}: {failed:?}");
        let mut out = vec![0; 4096];
        assert_eq!(reader.decode(location, &entry.hash, record, &mut out, Check::Hash).unwrap(), Codec::Zstd);
        assert!(&out == text, "round {round}: the whole frame after a damaged one");
    }
}
