//! Writes seed inputs into `fuzz/corpus/<target>/seed-*`: valid files and
//! sessions made by Rewind's own encoders and writers, in the framing each
//! fuzz target expects (its leading choice bytes included), so that the
//! fuzzers start from inputs that get past every magic number and checksum
//! and mutate from there. Idempotent; run by `fuzz/smoke.sh` only when asked
//! (`fuzz/README.md`).

use std::path::Path;
use std::sync::Arc;

use rewind_chunks::{pack_name, Compressor, LocalPackStore, PackWriter};
use rewind_format::chunks::{
    bloom_bits, encode_dedup_page, encode_fence, encode_table_header, fence_key, DedupEntry, DedupRunHeader, TableSlot,
    DEDUP_ENTRIES_PER_PAGE, DEDUP_PAGE_BYTES,
};
use rewind_format::journal::{append_copy_record, append_write_record, append_zero_record, RecordStamp, SegmentHeader};
use rewind_format::meta::{
    Bookmark, Bookmarks, Checkpoint, IndexManifest, JournalPosition, Layout, RetentionTier, RunInfo, TimelineBucket,
    TimelineFrame, VolumeBase, VolumeKind, VolumeMeta, VolumePolicy,
};
use rewind_index::{IndexConfig, PageCache, VersionIndex};
use rewind_io::{read_file, SimConfig, SimStorage, Storage};
use rewind_nbd::protocol as p;
use rewind_types::{BlockIndex, BlockSize, BookmarkName, ChunkId, Lsn, Timestamp, Version, VersionData, VolumeName};

fn write(target: &str, name: &str, parts: &[&[u8]]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), parts.concat()).expect("seed file");
}

fn at(nanos: u64) -> Timestamp {
    Timestamp::from_unix_nanos(nanos)
}

fn metadata() {
    let meta = VolumeMeta {
        name: VolumeName::new("db").unwrap(),
        size_bytes: 1 << 30,
        block_size: BlockSize::DEFAULT,
        created: at(42),
        layout: Layout::Checkpointing,
        cache_bytes: 64 << 20,
        base: None,
        kind: VolumeKind::Blocks,
    };
    write("volume_meta", "checkpointing", &[&[0], &meta.encode()]);
    let clone = VolumeMeta {
        name: VolumeName::new("db-debug").unwrap(),
        base: Some(VolumeBase { volume: VolumeName::new("db").unwrap(), at: at(40), copied: true }),
        ..meta.clone()
    };
    write("volume_meta", "promoted-clone", &[&[0], &clone.encode()]);
    let checkpoint =
        Checkpoint { lsn: Lsn(5), replay_from: JournalPosition { segment: 1, offset: 4160 }, timestamp_last: at(9) };
    write("checkpoint", "one", &[&[0], &checkpoint.encode()]);
    let bookmark = |name: &str, nanos| Bookmark { name: BookmarkName::new(name).unwrap(), timestamp: at(nanos) };
    let bookmarks =
        Bookmarks { entries: vec![bookmark("before-upgrade", 7), bookmark("nightly", 9)], laid_out: vec![at(7)] };
    write("bookmarks", "two", &[&[0], &bookmarks.encode()]);
    let tier = |interval_nanos, age_nanos| RetentionTier { interval_nanos, age_nanos };
    let policy = VolumePolicy {
        granularity_nanos: 10,
        retention: vec![tier(0, 100), tier(20, 200), tier(60, 900)],
        retention_clock: at(1000),
        floors: vec![(40, at(500))],
        horizon_floor: at(30),
        deleted: vec![(at(1), at(2)), (at(5), at(8))],
        space_max_bytes: 200 << 30,
    };
    write("volume_policy", "tiers", &[&[0], &policy.encode()]);
    let run = |id, low, high| RunInfo { id, entry_count: 10, timestamp_min: at(low), timestamp_max: at(high) };
    let manifest = IndexManifest {
        lsn_indexed: Lsn(3),
        run_id_next: 3,
        versions_thinned: 7,
        archived_before: at(6),
        runs: vec![run(1, 1, 5), run(2, 6, 9)],
        late_entries: false,
    };
    write("index_manifest", "two-runs", &[&[0], &manifest.encode()]);
    write("index_manifest", "empty", &[&[0], &IndexManifest::default().encode()]);
    let bucket = TimelineBucket { minute: 1, write_count: 2, write_bytes: 3, zero_count: 4, zero_bytes: 5 };
    let first = TimelineFrame { lsn_last: Lsn(10), buckets: vec![bucket] };
    let second = TimelineFrame { lsn_last: Lsn(20), buckets: vec![bucket, bucket] };
    write("timeline", "two-frames", &[&[0], &first.encode(), &second.encode()]);
}

fn journal() {
    let block_size = BlockSize::new(512).unwrap();
    let stamp = |lsn: u64| RecordStamp {
        block_size,
        lsn: Lsn(lsn),
        lsn_committed: Lsn(lsn - 1),
        timestamp: at(100 + lsn),
        block_first: BlockIndex(lsn * 3),
        revert: None,
    };
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let mut write_record = Vec::new();
    append_write_record(&mut write_record, &mut Vec::new(), stamp(1), &data);
    let mut zero_record = Vec::new();
    append_zero_record(&mut zero_record, stamp(2), 8);
    let versions = [
        Version { block: BlockIndex(7), timestamp: at(3), data: VersionData::Zero, crc32c: 11 },
        Version { block: BlockIndex(2), timestamp: at(4), data: VersionData::Chunk(ChunkId(99)), crc32c: 12 },
    ];
    let mut copy_record = Vec::new();
    append_copy_record(&mut copy_record, stamp(3), &versions);
    write("journal_record", "write", &[&[0], &write_record]);
    write("journal_record", "zero", &[&[0], &zero_record]);
    write("journal_record", "copy", &[&[0], &copy_record]);
    let mut revert_copy_record = Vec::new();
    append_write_record(
        &mut revert_copy_record,
        &mut Vec::new(),
        RecordStamp { revert: Some(at(2)), ..stamp(5) },
        &data,
    );
    write("journal_record", "revert-copy", &[&[0], &revert_copy_record]);
    let header = |segment, lsn_first| {
        SegmentHeader {
            segment,
            block_size,
            lsn_first: Lsn(lsn_first),
            timestamp_before: at(1),
            recycled: false,
            written_ahead: false,
        }
        .encode()
    };
    write("journal_record", "segment-header", &[&[1], &header(1, 1)]);
    let mut fourth = Vec::new();
    append_write_record(&mut fourth, &mut Vec::new(), stamp(4), &data[..512]);
    write(
        "journal_record",
        "two-segments",
        &[&[2], &header(1, 1), &write_record, &zero_record, &copy_record, b"NEXTSEGMENT", &header(2, 4), &fourth],
    );
    // A torn tail: the last record cut short.
    write("journal_record", "torn-tail", &[&[2], &header(1, 1), &write_record, &zero_record[..40]]);
}

fn index_run() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 1));
    let index =
        VersionIndex::create(Arc::clone(&storage), "index", IndexConfig::default(), PageCache::new(1 << 20)).unwrap();
    let versions: Vec<Version> = (0..300u64)
        .map(|i| Version {
            block: BlockIndex(i / 2),
            timestamp: at(1000 + i),
            data: match i % 3 {
                0 => VersionData::Zero,
                1 => VersionData::Journal { segment: 1, offset: 64 + 4096 * i as u32 },
                _ => VersionData::Chunk(ChunkId(i)),
            },
            crc32c: i as u32,
        })
        .collect();
    // One journal record per version, as the engine files them.
    for (lsn, version) in versions.iter().enumerate() {
        index.insert(Lsn(lsn as u64 + 1), std::slice::from_ref(version));
    }
    index.seal();
    index.persist(Lsn(versions.len() as u64)).unwrap();
    let run = read_file(&*storage, "index/0000000001.run").unwrap();
    // Lookups: (block u16, time u64) four times.
    let mut lookups = Vec::new();
    for (block, time) in [(3u16, 1010u64), (100, 1300), (0, 999), (149, u64::MAX)] {
        lookups.extend_from_slice(&block.to_le_bytes());
        lookups.extend_from_slice(&time.to_le_bytes());
    }
    write("index_run", "three-pages", &[&[0], &lookups, &run]);
}

fn chunks() {
    let slot = TableSlot { hash: [9; 32], pack: 1, offset: 64, stored_bytes: 100, raw_bytes: 4096, bare_crc32c: None };
    write("chunk_table_slot", "slot", &[&[0], &77u64.to_le_bytes(), &slot.encode(ChunkId(77))]);
    let bare = TableSlot { stored_bytes: 4096, bare_crc32c: Some(0x1234_5678), ..slot };
    write("chunk_table_slot", "bare", &[&[0], &78u64.to_le_bytes(), &bare.encode(ChunkId(78))]);
    write("chunk_table_slot", "header", &[&[1], &encode_table_header()]);
    let table = [encode_table_header(), slot.encode(ChunkId(1)), [0; 64], slot.encode(ChunkId(3))].concat();
    write("chunk_table_slot", "table", &[&[2, 1, 2, 3, 4], &table]);

    // A pack written by the real writer: compressible, random-ish and
    // repeated chunks.
    let storage = Arc::new(SimStorage::new(SimConfig::default(), 1));
    let packs = LocalPackStore::open(Arc::clone(&storage) as Arc<dyn Storage>, "packs").unwrap();
    let mut writer = PackWriter::create(&packs, 7).unwrap();
    let mut compressor = Compressor::new().unwrap();
    let mut stored = Vec::new();
    let chunks: [Vec<u8>; 3] = [
        vec![5; 4096],
        (0..512u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect(),
        b"rewind".repeat(100),
    ];
    for (index, chunk) in chunks.iter().enumerate() {
        let hash: [u8; 32] = blake3_hash(chunk);
        let codec = compressor.compress(chunk, &mut stored);
        writer.add_stored(ChunkId(index as u64 + 1), hash, codec, &stored, chunk.len() as u32).unwrap();
    }
    writer.seal().unwrap();
    let pack = read_file(&*storage, &format!("packs/{}", pack_name(7))).unwrap();
    write("pack", "three-chunks", &[&[1], &pack]);
    // Header and records only: the target builds footer and trailer.
    let footer_offset = u64::from_le_bytes(pack[pack.len() - 24..pack.len() - 16].try_into().unwrap()) as usize;
    write("pack", "records", &[&[0x11], &pack[..footer_offset]]);
    write("pack", "record", &[&[0x04], &pack[64..footer_offset.min(64 + 56 + 4096)]]);
    write("pack", "trailer", &[&[0x08], &(pack.len() as u32).to_le_bytes(), &pack[pack.len() - 32..]]);

    // Two dedup runs, encoded as the index writes them.
    let run = |seed: u8, count: usize| {
        let mut entries: Vec<DedupEntry> = (0..count)
            .map(|i| DedupEntry {
                hash: std::array::from_fn(|byte| (i as u8).wrapping_mul(37).wrapping_add(seed ^ byte as u8)),
                id: ChunkId(i as u64 + 1),
            })
            .collect();
        entries.sort_unstable();
        let bloom_bits_count = (count as u64 * 10).next_multiple_of(64);
        let mut bloom = vec![0u64; (bloom_bits_count / 64) as usize];
        let mut out = vec![0u8; DEDUP_PAGE_BYTES];
        let mut fence = Vec::new();
        for page in entries.chunks(DEDUP_ENTRIES_PER_PAGE) {
            let mut encoded = [0u8; DEDUP_PAGE_BYTES];
            encode_dedup_page(fence.len() as u64, page, &mut encoded);
            fence.push(fence_key(&page[0].hash));
            out.extend_from_slice(&encoded);
        }
        for entry in &entries {
            for bit in bloom_bits(&entry.hash, bloom_bits_count, 7) {
                bloom[(bit / 64) as usize] |= 1 << (bit % 64);
            }
        }
        let fence_bytes = encode_fence(&fence);
        let bloom_bytes: Vec<u8> = bloom.iter().flat_map(|word| word.to_le_bytes()).collect();
        let header = DedupRunHeader {
            entry_count: count as u64,
            data_page_count: fence.len() as u64,
            bloom_bits: bloom_bits_count,
            bloom_hashes: 7,
            fence_crc32c: rewind_format::crc32c(&fence_bytes),
            bloom_crc32c: rewind_format::crc32c(&bloom_bytes),
        };
        out[..DEDUP_PAGE_BYTES].copy_from_slice(&header.encode());
        out.extend_from_slice(&fence_bytes);
        out.extend_from_slice(&bloom_bytes);
        (out, entries[0].hash)
    };
    let (first, probe) = run(1, 150);
    let (second, _) = run(2, 20);
    write("dedup_run", "one-run", &[&[0], &probe, &[0; 32], &first]);
    write("dedup_run", "two-runs", &[&[4], &probe, &[0; 32], &first, b"NEXTRUN", &second]);
}

fn blake3_hash(bytes: &[u8]) -> [u8; 32] {
    // The pack writer only checks this in debug builds; seeds use the real
    // hash through the reader's own function.
    rewind_chunks::chunk_hash(bytes)
}

// --- NBD -----------------------------------------------------------------------------

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&p::IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn string(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

fn request(out: &mut Vec<u8>, command: u16, flags: u16, offset: u64, length: u32) {
    out.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&0u64.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    if command == p::CMD_WRITE {
        out.extend((0..length).map(|i| i as u8));
    }
}

fn nbd() {
    // What nbdinfo and qemu send: flags, structured replies, a listing,
    // INFO, base:allocation, GO, then a few requests of each kind.
    let mut session = Vec::new();
    session.extend_from_slice(&(p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES).to_be_bytes());
    option(&mut session, p::OPT_STRUCTURED_REPLY, &[]);
    option(&mut session, p::OPT_LIST, &[]);
    let mut info = Vec::new();
    string(&mut info, "disk");
    info.extend_from_slice(&3u16.to_be_bytes());
    for request in [p::INFO_NAME, p::INFO_DESCRIPTION, p::INFO_BLOCK_SIZE] {
        info.extend_from_slice(&request.to_be_bytes());
    }
    option(&mut session, p::OPT_INFO, &info);
    let mut meta = Vec::new();
    string(&mut meta, "disk");
    meta.extend_from_slice(&1u32.to_be_bytes());
    string(&mut meta, p::META_BASE_ALLOCATION);
    option(&mut session, p::OPT_LIST_META_CONTEXT, &meta);
    option(&mut session, p::OPT_SET_META_CONTEXT, &meta);
    option(&mut session, p::OPT_STARTTLS, &[]);
    option(&mut session, 77, b"unknown");
    option(&mut session, p::OPT_GO, &info);
    let mut requests = Vec::new();
    request(&mut requests, p::CMD_WRITE, p::CMD_FLAG_FUA, 4096, 1024);
    request(&mut requests, p::CMD_READ, 0, 0, 8192);
    request(&mut requests, p::CMD_READ, p::CMD_FLAG_DF, 4096, 512);
    request(&mut requests, p::CMD_BLOCK_STATUS, 0, 0, 65536);
    request(&mut requests, p::CMD_BLOCK_STATUS, p::CMD_FLAG_REQ_ONE, 0, 65536);
    request(&mut requests, p::CMD_TRIM, 0, 8192, 4096);
    request(&mut requests, p::CMD_WRITE_ZEROES, p::CMD_FLAG_NO_HOLE, 0, 4096);
    request(&mut requests, p::CMD_WRITE_ZEROES, p::CMD_FLAG_FAST_ZERO, 0, 1 << 20);
    request(&mut requests, p::CMD_FLUSH, 0, 0, 0);
    request(&mut requests, p::CMD_READ, 0, 1 << 20, 1);
    request(&mut requests, p::CMD_CACHE, 0, 0, 512);
    request(&mut requests, p::CMD_DISC, 0, 0, 0);
    write("nbd_handshake", "nbdinfo-and-qemu", &[&session, &requests]);
    let mut old_style = Vec::new();
    old_style.extend_from_slice(&p::FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    option(&mut old_style, p::OPT_EXPORT_NAME, b"aligned");
    write("nbd_handshake", "export-name", &[&old_style, &requests]);
    let mut abort = Vec::new();
    abort.extend_from_slice(&0u32.to_be_bytes());
    option(&mut abort, p::OPT_ABORT, &[]);
    write("nbd_handshake", "abort", &[&abort]);

    // The transmission target builds the handshake from its first byte; the
    // second picks limits and raw (0x80) or built requests, 12 bytes each.
    for (name, choice) in [("disk-go-structured", 0x1c_u8), ("aligned-export-name", 0x21), ("view", 0x16)] {
        write("nbd_transmission", &format!("{name}-raw"), &[&[choice, 0x88], &requests]);
        let mut built = Vec::new();
        for (command, flags, offset, length) in [
            (1u8, 0u8, 4096u32, 4096u32),
            (0, 0, 0, 8192),
            (7, 0, 0, 65536),
            (3, 0, 0, 0),
            (6, 0x02, 0, 4096),
            (4, 0, 0, 512),
            (2, 0, 0, 0),
        ] {
            built.extend_from_slice(&[command, flags]);
            built.extend_from_slice(&offset.to_le_bytes());
            built.extend_from_slice(&length.to_le_bytes());
        }
        write("nbd_transmission", &format!("{name}-built"), &[&[choice, 0x08], &built]);
    }
}

fn text() {
    let now = 1_763_805_792_000_000_000u64.to_le_bytes();
    for (name, zone, input) in [
        ("relative", 0u8, "-10m"),
        ("ago", 0, "10 minutes ago"),
        ("rfc3339", 0, "2025-11-22T10:03:12Z"),
        ("offset", 1, "2025-11-22T11:03:12+01:00"),
        ("local", 2, "2025-11-22 10:03:12"),
        ("time-of-day", 2, "10:03:12"),
        ("unix", 0, "@1763805792"),
        ("unix-ms", 0, "1763805792000"),
        ("now", 0, "now"),
        ("bookmark", 0, "before-upgrade"),
        ("granularity", 0, "1h30m"),
    ] {
        // A fixed offset (zone 1) takes two more bytes: +2 hours.
        let zone: &[u8] = if zone == 1 { &[1, 0x10, 0x0e] } else { &[zone] };
        write("time_expression", name, &[&now, zone, input.as_bytes()]);
    }
    for (name, input) in
        [("tiers", "all:2h, 1m:24h, 1h:7d, 1d:30d"), ("forever", "forever"), ("months", "1h:1month, 1d:1y")]
    {
        write("retention_policy", name, &[&[1], input.as_bytes()]);
    }
    for (kind, name, body) in [
        (
            0u8,
            "create",
            r#"{"name":"db","size_bytes":1073741824,"block_size":4096,"layout":"checkpointing","cache":"64MiB","granularity":"5m","retention":"all:2h, 1m:24h","space_max":"200GiB"}"#,
        ),
        (0, "create-minimal", r#"{"name":"db","size_bytes":1048576}"#),
        (1, "update", r#"{"granularity":"0","retention":"forever","space_max":"none"}"#),
        (2, "bookmark", r#"{"name":"before-upgrade","at":"-10m"}"#),
    ] {
        write("api_json", name, &[&[kind], body.as_bytes()]);
    }
}

fn main() {
    metadata();
    journal();
    index_run();
    chunks();
    nbd();
    text();
}
