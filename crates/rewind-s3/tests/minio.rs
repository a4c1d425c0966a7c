//! The S3 pack store against a real MinIO (issue 14, req 1): the pack-store
//! conformance suite, the same with the fault wrapper around it, and a
//! MinIO that stops answering and comes back; the catalog's meta store's
//! contract. `scripts/test.sh` installs
//! MinIO; `REWIND_MINIO` names another binary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rewind_chunks::conformance::{check_adopt, check_faults, check_store};
use rewind_chunks::meta_store::check_meta_store;
use rewind_chunks::pack_store::FaultyPackStore;
use rewind_chunks::PackStore;
use rewind_s3::{S3MetaStore, S3PackStore};

/// A MinIO on a directory of its own, and pack stores in its bucket.
struct Minio {
    server: rewind_s3::minio::Minio,
    _dir: tempfile::TempDir,
}

impl Minio {
    fn start() -> Minio {
        let dir = tempfile::tempdir().unwrap();
        Minio { server: rewind_s3::minio::Minio::start(dir.path()), _dir: dir }
    }

    fn store(&self, prefix: &str) -> S3PackStore {
        S3PackStore::new(&self.server.config(prefix)).unwrap()
    }

    fn stop(&mut self) {
        self.server.stop();
    }

    fn run(&mut self) {
        self.server.run();
    }
}

#[test]
fn the_s3_meta_store_keeps_the_contract_on_minio() {
    let minio = Minio::start();
    check_meta_store(&S3MetaStore::new(&minio.server.config("node-a")).unwrap(), "catalogs");
    check_meta_store(&S3MetaStore::new(&minio.server.config("")).unwrap(), "top");
}

#[test]
fn the_s3_pack_store_keeps_the_contract_on_minio() {
    let minio = Minio::start();
    let store = minio.store("node-a");
    // 40 MiB: past one pack's target size of 32 MiB.
    check_store(&store, 1, 40 << 20);
    // An adopted journal segment is uploaded as any pack.
    let source = tempfile::tempdir().unwrap();
    check_adopt(&store, &rewind_io::OsStorage::new(source.path()).unwrap(), "journal", 100, false);
    // Under another prefix, a store sees none of the first one's packs.
    let other = minio.store("node-b");
    check_store(&other, 1, 1 << 20);
}

#[test]
fn faults_around_the_s3_pack_store_stay_errors_of_their_calls() {
    let minio = Minio::start();
    let faulty = FaultyPackStore::new(Arc::new(minio.store("faults")));
    check_store(&faulty, 1, 3 << 20);
    check_faults(&faulty, 100);
}

#[test]
fn a_minio_that_stops_answering_fails_calls_transiently_until_it_is_back() {
    let mut minio = Minio::start();
    let store = minio.store("outage");
    let mut upload = store.create(1).unwrap();
    upload.append(&[1; 100_000]).unwrap();
    upload.finish().unwrap();

    minio.stop();
    let started = Instant::now();
    let errors = [
        store.stat(1).map(|_| ()).expect_err("stat"),
        store.list().map(|_| ()).expect_err("list"),
        store.delete(1).expect_err("delete"),
        {
            let mut upload = store.create(2).unwrap();
            upload.append(&[2; 1000]).unwrap();
            upload.finish().map(|_| ()).expect_err("finish")
        },
    ];
    for error in &errors {
        assert!(rewind_io::is_transient(error), "a store that does not answer fails transiently: {error}");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "bounded by the retries: {:?}", started.elapsed());

    minio.run();
    let mut back = vec![0; 100_000];
    store.read(1, 0, &mut back).expect("read once MinIO is back");
    assert_eq!(back, vec![1; 100_000]);
    assert_eq!(store.list().unwrap().iter().map(|stored| stored.pack).collect::<Vec<_>>(), vec![1]);
    store.delete(1).unwrap();
}

/// The chunk store with its packs in MinIO: chunks stored, read back,
/// found again by dedup after reopening from the same directory and
/// bucket, and garbage collected from the bucket.
#[test]
fn the_chunk_store_keeps_its_packs_in_minio() {
    use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting};
    use rewind_io::{OsStorage, Storage};

    let minio = Minio::start();
    let local = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(local.path()).unwrap());
    let config = ChunkStoreConfig { pack_bytes_target: 256 << 10, ..ChunkStoreConfig::default() };
    let open = || {
        let packs: Arc<dyn PackStore> = Arc::new(minio.store("chunks"));
        ChunkStore::open_with_packs(Arc::clone(&storage), "chunks", config, packs).unwrap()
    };
    // Bytes that do not compress: 200 blocks fill several packs.
    let blocks: Vec<Vec<u8>> = (0..200u64).map(|index| rewind_chunks::conformance::noise(index, 4096)).collect();
    let store = open();
    store.finish_open(Counting::Exact).unwrap();
    let mut session = store.session().unwrap();
    let ids: Vec<_> = blocks.iter().map(|block| session.put(block).unwrap()).collect();
    session.finish().unwrap();
    let in_bucket = minio.store("chunks").list().unwrap();
    assert!(in_bucket.len() >= 2, "several packs of 256 KiB: {in_bucket:?}");
    assert!(local.path().join("chunks/packs").read_dir().is_err(), "no pack is kept locally");
    drop(store);

    let store = open();
    for (id, block) in ids.iter().zip(&blocks) {
        store.mark(*id, block.len() as u32).unwrap();
    }
    store.finish_open(Counting::Exact).unwrap();
    let mut out = vec![0; 4096];
    for (id, block) in ids.iter().zip(&blocks) {
        store.read(*id, &mut out).unwrap();
        assert_eq!(&out, block);
    }
    let mut session = store.session().unwrap();
    assert_eq!(session.put(&blocks[7]).unwrap(), ids[7], "dedup finds the chunk in the bucket's packs");
    session.finish().unwrap();

    // Every reference let go: collection deletes the packs from the bucket.
    for (index, (id, block)) in ids.iter().zip(&blocks).enumerate() {
        store.release(*id, block.len() as u32);
        if index == 7 {
            store.release(*id, block.len() as u32);
        }
    }
    store.collect(&mut |_, _, _| {}).unwrap();
    assert!(minio.store("chunks").list().unwrap().is_empty(), "collected from the bucket");
}

/// A chunk store whose bucket does not answer at open fails to open, with
/// an error that passes, and deletes nothing; it opens once the bucket is back.
#[test]
fn a_chunk_store_opened_while_its_bucket_is_down_fails_and_deletes_nothing() {
    use rewind_chunks::tiered::{TierConfig, TieredPackStore};
    use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting, LocalPackStore};
    use rewind_io::{OsStorage, Storage};

    let mut minio = Minio::start();
    let local = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(local.path()).unwrap());
    let tier = TierConfig { cache_bytes_max: 0, newest_kept: 0, ..TierConfig::default() };
    let open = |minio: &Minio| -> Result<(ChunkStore, Arc<TieredPackStore>), rewind_chunks::ChunkError> {
        let local = LocalPackStore::open(Arc::clone(&storage), "chunks/packs").unwrap();
        let remote: Arc<dyn PackStore> = Arc::new(minio.store("down"));
        let tiered = Arc::new(
            TieredPackStore::open(Arc::new(local), remote, tier)
                .map_err(|source| rewind_chunks::ChunkError::Io { path: "tiers".into(), source })?,
        );
        let packs = Arc::clone(&tiered) as Arc<dyn PackStore>;
        let store = ChunkStore::open_with_packs(Arc::clone(&storage), "chunks", ChunkStoreConfig::default(), packs)?;
        Ok((store, tiered))
    };
    let (store, tiered) = open(&minio).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut session = store.session().unwrap();
    let id = session.put(&[5; 4096]).unwrap();
    session.finish().unwrap();
    while tiered.upload_next().unwrap().is_some() {}
    assert!(tiered.evict().unwrap() > 0, "evicted: only the bucket has it now");
    drop((store, tiered));

    minio.stop();
    let error = open(&minio).err().expect("the open fails while the bucket is down");
    assert!(error.is_transient(), "{error}");
    minio.run();
    let (store, _) = open(&minio).unwrap();
    store.mark(id, 4096).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut out = vec![0; 4096];
    store.read(id, &mut out).unwrap();
    assert_eq!(out, vec![5; 4096], "nothing was deleted");
}

/// Object lock (issue 14 req 6) on a MinIO bucket made with it: what the
/// stores write is held; a delete inside the hold is refused — Rewind's own
/// (`Locked`, the object given up) and a delete of the object's version by
/// anyone with the same credentials — and succeeds once the hold has run
/// out; a restarted node finds the holds and extends those still wanted.
#[test]
fn a_locked_bucket_keeps_what_was_written_until_its_hold_runs_out() {
    use rewind_chunks::meta_store::MetaStore;
    use rewind_chunks::retention::{locked, Retention};
    use rewind_s3::lock::{delete_version, ObjectLock};

    let minio = Minio::start();
    let refused = ObjectLock::new(&minio.server.config("plain"), Duration::from_secs(3600)).err().unwrap();
    assert!(refused.to_string().contains("has no object lock"), "{refused}");
    minio.server.create_locked_bucket();
    let config = minio.server.locked_config("held");
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();

    // A long hold: nothing deletes inside it.
    let day = Duration::from_secs(24 * 3600);
    let lock = Arc::new(ObjectLock::new(&config, day).unwrap());
    let packs = S3PackStore::new(&config).unwrap().with_lock(Arc::clone(&lock));
    let meta = S3MetaStore::new(&config).unwrap().with_lock(Arc::clone(&lock));
    let mut upload = packs.create(1).unwrap();
    upload.append(&[7; 1000]).unwrap();
    upload.finish().unwrap();
    meta.put_new("catalogs/0000000000000001", b"a catalog").unwrap();
    let report = lock.report();
    assert_eq!((report.held, report.pending, report.given_up), (2, 0, 0), "{report:?}");
    assert!(report.earliest_end_unix_seconds.unwrap() >= now() + day.as_secs(), "{report:?}");

    let error = packs.delete(1).unwrap_err();
    assert!(locked(&error).is_some_and(|held| held.until_unix_seconds > now()), "{error}");
    assert_eq!(packs.stat(1).unwrap().bytes, 1000, "still there");
    assert_eq!(lock.report().given_up, 1);
    // AWS says 403 AccessDenied; MinIO 400 "Object is WORM protected".
    let error = delete_version(&config, "packs/0000000000000001.pack").unwrap_err();
    let message = error.to_string();
    assert!(message.contains("AccessDenied") || message.contains("WORM protected"), "{error}");
    assert_eq!(packs.stat(1).unwrap().bytes, 1000, "still there");
    let error = meta.delete("catalogs/0000000000000001").unwrap_err();
    assert!(locked(&error).is_some(), "{error}");
    assert_eq!(meta.get("catalogs/0000000000000001").unwrap(), b"a catalog");
    // Written again (as a content-addressed piece a newer catalog names
    // once more is): wanted again, so held again at the next extension.
    let again = meta.put_new("catalogs/0000000000000001", b"a catalog").unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    let report = lock.report();
    assert_eq!((report.given_up, report.pending), (1, 1), "the catalog is wanted again: {report:?}");
    let report = lock.extend().unwrap();
    assert_eq!((report.given_up, report.pending, report.extensions), (1, 0, 3), "{report:?}");

    // A restarted node, with a longer lock: it finds both holds and extends them.
    let longer = ObjectLock::new(&config, 2 * day).unwrap();
    let report = longer.extend().unwrap();
    assert_eq!((report.held, report.extensions), (2, 2), "{report:?}");
    assert!(report.earliest_end_unix_seconds.unwrap() >= now() + 2 * day.as_secs(), "{report:?}");
    let report = longer.extend().unwrap();
    assert_eq!(report.extensions, 2, "not due again: {report:?}");

    // A short hold runs out, and then the delete removes the object's version.
    let short = Duration::from_secs(2);
    let lock = Arc::new(ObjectLock::new(&config, short).unwrap());
    let packs = S3PackStore::new(&config).unwrap().with_lock(Arc::clone(&lock));
    let mut upload = packs.create(2).unwrap();
    upload.append(&[8; 10]).unwrap();
    upload.finish().unwrap();
    let until = lock.report().earliest_end_unix_seconds.unwrap();
    assert!(locked(&packs.delete(2).unwrap_err()).is_some());
    // The hold is wall-clock time: wait until it has passed.
    while now() <= until {
        std::thread::sleep(Duration::from_millis(200));
    }
    packs.delete(2).unwrap();
    assert_eq!(packs.stat(2).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    assert!(packs.list().unwrap().iter().all(|stored| stored.pack != 2));
}

/// S3 misbehaving (issue 14 req 5), through a proxy in front of MinIO that
/// answers a share of requests with 503 SlowDown or 500, resets
/// connections, loses the replies of requests MinIO carried out (a PUT
/// that succeeded, unheard) and holds others back until the client times
/// out: a chunk store's packs all reach the bucket,
/// whole and once each, and read back from it, with every failure a
/// transient error its caller tries again. Prints its seed.
#[test]
fn packs_reach_the_bucket_through_s3_errors_resets_lost_replies_and_timeouts() {
    use rewind_chunks::conformance::noise;
    use rewind_chunks::tiered::{TierConfig, TieredPackStore};
    use rewind_chunks::{ChunkStore, ChunkStoreConfig, Counting, LocalPackStore};
    use rewind_io::{OsStorage, Storage};
    use rewind_s3::faulty_http::FaultyProxy;

    let seed = std::env::var("REWIND_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (REWIND_SEED={seed} draws the same faults)");
    let minio = Minio::start();
    let proxy = FaultyProxy::start(minio.server.port(), seed, 0.3);
    // A short request timeout, so that the replies the proxy holds back
    // (stalls) cost seconds, not minutes.
    let config = rewind_s3::S3Config {
        endpoint: Some(proxy.endpoint()),
        request_timeout: Some(std::time::Duration::from_secs(2)),
        ..minio.server.config("faults")
    };
    // Every call the bucket fails is transient, and tried again.
    let mut failures = 0;
    let mut again = |error: &dyn std::fmt::Display, transient: bool| {
        assert!(transient, "seed {seed}: not transient: {error}");
        failures += 1;
        assert!(failures < 2000, "seed {seed}: still failing: {error}");
    };

    let local = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(local.path()).unwrap());
    let tier = TierConfig { cache_bytes_max: 0, newest_kept: 0, ..TierConfig::default() };
    let tiered = loop {
        let packs = LocalPackStore::open(Arc::clone(&storage), "chunks/packs").unwrap();
        let remote: Arc<dyn PackStore> = Arc::new(S3PackStore::new(&config).unwrap());
        match TieredPackStore::open(Arc::new(packs), remote, tier) {
            Ok(tiered) => break Arc::new(tiered),
            Err(error) => again(&error, error.kind() == std::io::ErrorKind::ConnectionAborted),
        }
    };
    let packs = Arc::clone(&tiered) as Arc<dyn PackStore>;
    let store =
        ChunkStore::open_with_packs(Arc::clone(&storage), "chunks", ChunkStoreConfig::default(), packs).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    // Sixteen packs of sixteen distinct chunks, and one of 20 MiB, which
    // goes up in parts.
    let mut written = Vec::new();
    for session in 0..17u64 {
        let mut open = store.session().unwrap();
        for chunk in 0..if session < 16 { 16 } else { 1280 } {
            let bytes = noise(session * 16 + chunk, 16 << 10);
            written.push((open.put(&bytes).unwrap(), bytes));
        }
        open.finish().unwrap();
    }
    loop {
        match tiered.upload_next() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(error) => again(&error, error.kind() == std::io::ErrorKind::ConnectionAborted),
        }
    }
    assert!(tiered.waiting().is_empty(), "seed {seed}: every pack uploaded");
    while let Err(error) = tiered.evict() {
        again(&error, error.kind() == std::io::ErrorKind::ConnectionAborted);
    }
    assert_eq!(tiered.stats().local_packs, 0, "seed {seed}: only the bucket has them");
    for (id, bytes) in &written {
        let mut out = vec![0; bytes.len()];
        while let Err(error) = store.read(*id, &mut out) {
            again(&error, error.is_transient());
        }
        assert!(out == *bytes, "seed {seed}: chunk {id:?} read back from the bucket");
    }

    // In the bucket, straight from MinIO: each pack once, whole.
    let direct = minio.store("faults");
    let listed = direct.list().unwrap();
    assert_eq!(listed.iter().map(|stored| stored.pack).collect::<Vec<_>>(), tiered.packs(), "seed {seed}");
    assert!(listed.iter().any(|stored| stored.bytes >= 20 << 20), "seed {seed}: a pack in parts: {listed:?}");
    let counts = proxy.counts();
    let count = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "seed {seed}: {} forwarded, {} SlowDown, {} InternalError, {} resets, {} lost replies, {} stalls; {failures} \
         calls failed",
        count(&counts.forwarded),
        count(&counts.slow_downs),
        count(&counts.internal_errors),
        count(&counts.resets),
        count(&counts.lost_replies),
        count(&counts.stalls)
    );
    assert!(count(&counts.slow_downs) > 0 && count(&counts.internal_errors) > 0, "seed {seed}");
    assert!(count(&counts.resets) > 0 && count(&counts.lost_replies) > 0, "seed {seed}");
    assert!(count(&counts.stalls) > 0, "seed {seed}: requests timed out");
}

/// Packs from 16 MiB go up in parts (issue 14 req 2), still only where no
/// object is; an upload a crash left unfinished is aborted when the pack is
/// uploaded again, or deleted (req 5).
#[test]
fn large_packs_go_up_in_parts_and_unfinished_uploads_are_aborted() {
    use object_store::aws::AmazonS3Builder;
    use object_store::multipart::MultipartStore;
    use rewind_chunks::conformance::noise;

    let minio = Minio::start();
    let store = minio.store("parts");
    let bytes = noise(3, (40 << 20) + 12345);
    let mut upload = store.create(1).unwrap();
    upload.append(&bytes).unwrap();
    let generation = upload.finish().unwrap();
    assert!(generation.0.ends_with("-6"), "an ETag of six parts: {generation:?}");
    let stored = store.stat(1).unwrap();
    assert_eq!((stored.bytes, stored.generation), (bytes.len() as u64, generation));
    let mut back = vec![0; bytes.len()];
    store.read(1, 0, &mut back).unwrap();
    assert!(back == bytes, "read back whole");
    let mut again = store.create(1).unwrap();
    again.append(&noise(4, 20 << 20)).unwrap();
    let error = again.finish().unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{error}");
    store.read(1, 0, &mut back).unwrap();
    assert!(back == bytes, "not overwritten");

    // A node that crashed mid-upload left a part behind.
    let config = minio.server.config("parts");
    let s3 = AmazonS3Builder::new()
        .with_bucket_name(&config.bucket)
        .with_endpoint(config.endpoint.clone().unwrap())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(rewind_s3::minio::USER)
        .with_secret_access_key(rewind_s3::minio::PASSWORD)
        .build()
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let location = object_store::path::Path::from("parts/packs/0000000000000002.pack");
    let (id, part) = runtime.block_on(async {
        let id = s3.create_multipart(&location).await.unwrap();
        let part = s3.put_part(&location, &id, 0, noise(5, 5 << 20).into()).await.unwrap();
        (id, part)
    });
    let restarted = minio.store("parts");
    assert_eq!(restarted.list().unwrap().iter().map(|stored| stored.pack).collect::<Vec<_>>(), [1]);
    let mut upload = restarted.create(2).unwrap();
    upload.append(&bytes).unwrap();
    upload.finish().unwrap();
    let completed = runtime.block_on(s3.complete_multipart(&location, &id, vec![part]));
    assert!(completed.is_err(), "the unfinished upload was aborted: {completed:?}");
    store.read(2, 0, &mut back).unwrap();
    assert!(back == bytes, "the pack uploaded again");
    // And one left by a pack deleted before it was uploaded again.
    let location = object_store::path::Path::from("parts/packs/0000000000000003.pack");
    let (id, part) = runtime.block_on(async {
        let id = s3.create_multipart(&location).await.unwrap();
        let part = s3.put_part(&location, &id, 0, noise(6, 5 << 20).into()).await.unwrap();
        (id, part)
    });
    restarted.delete(3).unwrap();
    let completed = runtime.block_on(s3.complete_multipart(&location, &id, vec![part]));
    assert!(completed.is_err(), "the unfinished upload was aborted: {completed:?}");
}
