//! The pack-store seam (issue 14): the local store passes the conformance
//! suite on a real filesystem and on the simulated disk, faults injected
//! around it stay errors of their calls, and the chunk store over a faulty
//! store reports flipped bits as corruption and an unreachable store as a
//! passing error, and works again once it answers. A local pack leaves the
//! page cache behind its writing.

use std::sync::Arc;

use rewind_chunks::conformance::{check_adopt, check_faults, check_store};
use rewind_chunks::meta_store::{check_meta_store, MetaStore, Within};
use rewind_chunks::pack_store::{Fault, FaultyPackStore};
use rewind_chunks::tiered::{TierConfig, TieredPackStore};
use rewind_chunks::{ChunkError, ChunkStore, ChunkStoreConfig, Counting, LocalMetaStore, LocalPackStore, PackStore};
use rewind_io::{OsStorage, SimConfig, SimStorage, Storage};

#[test]
fn the_local_pack_store_keeps_the_contract_on_a_real_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let store = LocalPackStore::open(Arc::clone(&storage), "packs").unwrap();
    check_store(&store, 1, 12 << 20);
    check_adopt(&store, &*storage, "journal", 100, true);
    let left: Vec<String> = storage.list_dir("packs").unwrap();
    assert!(left.is_empty(), "no upload leaves a file behind: {left:?}");
}

/// The bytes of `path`'s first `len` that are in the page cache (`mincore`).
fn resident_bytes(path: &std::path::Path, len: usize) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only shared mapping of an open file, unmapped before
    // returning; `mincore` writes one byte per page into a vector that big.
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mapped = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(mapped, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let mut pages = vec![0u8; len.div_ceil(page)];
        let answered = libc::mincore(mapped, len, pages.as_mut_ptr());
        libc::munmap(mapped, len);
        assert_eq!(answered, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|&&page_state| page_state & 1 == 1).count() * page
    }
}

/// Archiving writes gigabytes of packs nobody reads soon: a local pack is
/// written directly, so what lies more than `rewind_io::WRITE_BEHIND_BYTES`
/// behind the end (the most a filesystem refusing direct I/O keeps, written
/// behind) has reached the device and is not in the page cache while the
/// pack is still being written (it would otherwise push the present out of
/// the cache and, on a VM, touch fresh memory for every byte).
#[test]
fn a_local_pack_leaves_the_page_cache_behind_its_writing() {
    // A disk filesystem (the build directory's): tmpfs keeps every page.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let store = LocalPackStore::open(Arc::clone(&storage), "packs").unwrap();
    let mut upload = store.create(1).unwrap();
    let piece: Vec<u8> = (0..1 << 20).map(|byte: u32| (byte * 7 % 251) as u8).collect();
    let written = 48 << 20;
    for _ in 0..written >> 20 {
        upload.append(&piece).unwrap();
    }
    let part = dir.path().join("packs").join(format!("{}.part", rewind_chunks::pack_name(1)));
    let behind = written - 2 * rewind_io::WRITE_BEHIND_BYTES as usize;
    let resident = resident_bytes(&part, behind);
    assert!(resident <= behind / 8, "{resident} of the first {behind} bytes written are still in the page cache");
    upload.finish().unwrap();
    let mut back = vec![0u8; piece.len()];
    store.read(1, 0, &mut back).unwrap();
    assert_eq!(back, piece, "what left the cache reads back from the device");
}

#[test]
fn the_local_meta_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    check_meta_store(&LocalMetaStore::open(storage, "bucket").unwrap(), "catalogs");
}

#[test]
fn a_directory_of_a_meta_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let bucket: Arc<dyn MetaStore> = Arc::new(LocalMetaStore::open(storage, "bucket").unwrap());
    check_meta_store(&Within::new(Arc::clone(&bucket), "nodes/a"), "catalogs");
    Within::new(Arc::clone(&bucket), "nodes/a").put_new("catalogs/1", b"one").unwrap();
    assert_eq!(bucket.get("nodes/a/catalogs/1").unwrap(), b"one", "under its directory");
    assert!(Within::new(bucket, "nodes/b").list("catalogs").unwrap().is_empty(), "and no other");
}

#[test]
fn the_local_pack_store_keeps_the_contract_on_the_simulated_disk() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(SimConfig::default(), 1));
    let store = LocalPackStore::open(storage, "packs").unwrap();
    check_store(&store, 1 << 40, 3 << 20);
}

/// Where the filesystem refuses direct I/O, packs are written through the
/// page cache, behind, and keep the contract as well.
#[test]
fn the_local_pack_store_keeps_the_contract_where_direct_io_is_refused() {
    let config = SimConfig { direct_io: false, ..SimConfig::default() };
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(config, 4));
    let store = LocalPackStore::open(storage, "packs").unwrap();
    check_store(&store, 1 << 40, 3 << 20);
}

#[test]
fn a_half_written_upload_is_gone_after_a_crash() {
    let storage = SimStorage::new(SimConfig::default(), 2);
    let store = LocalPackStore::open(Arc::new(storage.clone()), "packs").unwrap();
    let mut upload = store.create(7).unwrap();
    upload.append(&[7; 10_000]).unwrap();
    std::mem::forget(upload);
    storage.crash();
    let store = LocalPackStore::open(Arc::new(storage.clone()), "packs").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert!(storage.list_dir("packs").unwrap().is_empty(), "{:?}", storage.list_dir("packs"));
}

#[test]
fn faults_around_the_local_pack_store_stay_errors_of_their_calls() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let faulty = FaultyPackStore::new(Arc::new(LocalPackStore::open(storage, "packs").unwrap()));
    check_store(&faulty, 1, 3 << 20);
    check_faults(&faulty, 100);
}

#[test]
fn the_chunk_store_over_a_faulty_pack_store_reports_and_recovers() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let local = LocalPackStore::open(Arc::new(storage.clone()), "chunks/packs").unwrap();
    let faulty = Arc::new(FaultyPackStore::new(Arc::new(local)));
    let packs: Arc<dyn PackStore> = Arc::clone(&faulty) as Arc<dyn PackStore>;
    let store =
        ChunkStore::open_with_packs(Arc::new(storage.clone()), "chunks", ChunkStoreConfig::default(), packs).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let block: Vec<u8> = (0..4096u32).map(|index| (index * 7 % 251) as u8).collect();
    let mut session = store.session().unwrap();
    let id = session.put(&block).unwrap();
    session.finish().unwrap();

    // A bit flipped on the way is corruption, reported, never returned.
    faulty.set(Some(Fault::FlipBit));
    let mut out = vec![0; 4096];
    let error = store.read(id, &mut out).unwrap_err();
    assert!(matches!(error, ChunkError::Corrupt { .. }), "{error}");

    // An unreachable store fails the session that needed it, with an error
    // that passes; nothing is poisoned, and the next session works.
    faulty.set(Some(Fault::Unreachable));
    let failed = (|| {
        let mut session = store.session()?;
        session.put(&[9; 4096])?;
        session.finish()
    })();
    let error = failed.expect_err("the pack cannot be stored");
    assert!(error.is_transient(), "{error}");
    assert!(!store.is_poisoned());
    faulty.set(None);
    let mut session = store.session().unwrap();
    let again = session.put(&[9; 4096]).unwrap();
    session.finish().unwrap();
    store.read(again, &mut out).unwrap();
    assert_eq!(out, vec![9; 4096]);
    store.read(id, &mut out).unwrap();
    assert_eq!(out, block, "the first chunk reads right once the bits arrive as written");
}

/// Two local stores, the second standing in for the bucket.
fn two_tiers(config: TierConfig) -> (tempfile::TempDir, Arc<dyn PackStore>, Arc<FaultyPackStore>, TieredPackStore) {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let local: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(Arc::clone(&storage), "local").unwrap());
    let remote = Arc::new(FaultyPackStore::new(Arc::new(LocalPackStore::open(storage, "remote").unwrap())));
    let tiered = TieredPackStore::open(Arc::clone(&local), Arc::clone(&remote) as Arc<dyn PackStore>, config).unwrap();
    (dir, local, remote, tiered)
}

#[test]
fn the_tiered_pack_store_keeps_the_contract() {
    let (dir, _, _, tiered) = two_tiers(TierConfig::default());
    check_store(&tiered, 1, 3 << 20);
    let storage = OsStorage::new(dir.path()).unwrap();
    check_adopt(&tiered, &storage, "journal", 100, true);
}

fn put(store: &dyn PackStore, pack: u64, byte: u8, bytes: usize) {
    let mut upload = store.create(pack).unwrap();
    upload.append(&vec![byte; bytes]).unwrap();
    upload.finish().unwrap();
}

#[test]
fn packs_are_uploaded_then_evicted_least_recently_read_first_and_read_back_from_the_bucket() {
    let config =
        TierConfig { cache_bytes_max: 3 << 20, newest_kept: 2, memory_bytes_max: 1 << 20, ..TierConfig::default() };
    let (dir, local, remote, tiered) = two_tiers(config);
    for pack in 1..=6 {
        put(&tiered, pack, pack as u8, 1 << 20);
    }
    let stats = tiered.stats();
    assert_eq!((stats.local_packs, stats.upload_waiting_packs, stats.remote_packs), (6, 6, 0));
    // Nothing is evicted before it is uploaded.
    assert_eq!(tiered.evict().unwrap(), 0);

    // The bucket does not answer: the upload fails, transiently, and waits.
    remote.set(Some(Fault::Unreachable));
    let error = tiered.upload_next().unwrap_err();
    assert!(rewind_io::is_transient(&error), "{error}");
    remote.set(None);
    let mut uploaded = Vec::new();
    while let Some(pack) = tiered.upload_next().unwrap() {
        uploaded.push(pack);
    }
    assert_eq!(uploaded, vec![1, 2, 3, 4, 5, 6], "oldest first");
    assert_eq!(remote.list().unwrap().len(), 6);

    // Pack 1 was read lately: 2 and 3 go first; 5 and 6 are the newest.
    let mut buf = vec![0; 4096];
    tiered.read(1, 0, &mut buf).unwrap();
    assert_eq!(tiered.evict().unwrap(), 3 << 20);
    let on_disk: Vec<u64> = local.list().unwrap().iter().map(|stored| stored.pack).collect();
    assert_eq!(on_disk, vec![1, 5, 6]);

    // An evicted pack reads from the bucket, then from memory.
    tiered.read(2, 4096, &mut buf).unwrap();
    assert_eq!(buf, vec![2; 4096]);
    tiered.read(2, 4096, &mut buf).unwrap();
    let stats = tiered.stats();
    assert_eq!((stats.remote_reads, stats.memory_reads, stats.local_reads), (1, 1, 1), "{stats:?}");
    assert_eq!((stats.local_packs, stats.remote_packs, stats.upload_waiting_packs), (3, 6, 0));

    // Opened again, each pack is found where it is; a new pack waits for
    // its upload; a deleted one is gone here at once, and from the bucket
    // once a capture begun after the delete is published.
    put(&tiered, 7, 7, 1000);
    drop(tiered);
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let local: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(Arc::clone(&storage), "local").unwrap());
    let tiered = TieredPackStore::open(local, Arc::clone(&remote) as Arc<dyn PackStore>, config).unwrap();
    let stats = tiered.stats();
    assert_eq!((stats.local_packs, stats.remote_packs, stats.upload_waiting_packs), (4, 6, 1), "{stats:?}");
    tiered.read(3, 0, &mut buf).unwrap();
    assert_eq!(buf, vec![3; 4096]);
    let before = tiered.begin_capture();
    tiered.delete(3).unwrap();
    assert!(tiered.stat(3).is_err() && !tiered.packs().contains(&3), "gone here");
    assert!(remote.stat(3).is_ok(), "a catalog taken before the delete may name it");
    assert_eq!(tiered.delete_retired(before).unwrap(), 0, "not before a capture begun after it");
    let after = tiered.begin_capture();
    assert_eq!(tiered.delete_retired(after).unwrap(), 1);
    assert!(remote.stat(3).is_err(), "gone from the bucket");
    assert_eq!(tiered.stats().remote_deletes, 1);
}

#[test]
fn an_upload_whose_reply_was_lost_is_found_there_by_the_next_try() {
    let (_dir, _, remote, tiered) = two_tiers(TierConfig::default());
    put(&tiered, 1, 1, 5000);
    remote.set(Some(Fault::LoseFinishReply));
    assert!(tiered.upload_next().is_err());
    remote.set(None);
    assert_eq!(tiered.stats().upload_waiting_packs, 1);
    assert_eq!(tiered.upload_next().unwrap(), Some(1));
    assert_eq!(tiered.stats().upload_waiting_packs, 0);
}

#[test]
fn a_pack_sealed_wakes_the_uploaders() {
    let (_dir, _, _, tiered) = two_tiers(TierConfig::default());
    let woken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = Arc::clone(&woken);
    tiered.wake_on_sealed(Box::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    let mut upload = tiered.create(1).unwrap();
    upload.append(&[1; 100]).unwrap();
    assert_eq!(woken.load(std::sync::atomic::Ordering::Relaxed), 0, "not before the pack is sealed");
    upload.finish().unwrap();
    assert_eq!(woken.load(std::sync::atomic::Ordering::Relaxed), 1);
    let mut aborted = tiered.create(2).unwrap();
    aborted.append(&[2; 100]).unwrap();
    aborted.abort().unwrap();
    assert_eq!(woken.load(std::sync::atomic::Ordering::Relaxed), 1, "nothing to upload");
}

/// Small packs do not become small objects (issue 14 req 2): the
/// background uploads pass them by, and once put together by the chunk
/// store they go up as one pack; every chunk reads as it was written.
#[test]
fn small_packs_wait_and_go_up_together() {
    let (dir, _, remote, tiered) = two_tiers(TierConfig { batch_below_bytes: 1 << 20, ..TierConfig::default() });
    let tiered = Arc::new(tiered);
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let packs = Arc::clone(&tiered) as Arc<dyn PackStore>;
    let store = ChunkStore::open_with_packs(storage, "chunks", ChunkStoreConfig::default(), packs).unwrap();
    store.finish_open(Counting::Exact).unwrap();
    let mut written = Vec::new();
    for session in 0..5u8 {
        let mut open = store.session().unwrap();
        for chunk in 0..4u8 {
            let bytes = vec![session * 16 + chunk; 4096];
            written.push((open.put(&bytes).unwrap(), bytes));
        }
        open.finish().unwrap();
    }
    let small = tiered.waiting_small();
    assert_eq!(small.len(), 5, "one small pack per session: {small:?}");
    assert_eq!(tiered.upload_next_large().unwrap(), None, "the background uploads pass them by");
    assert_eq!(store.coalesce(&small).unwrap(), 5);
    // Still small (20 chunks); the catalog's upload takes it as it is.
    let together = tiered.waiting_small();
    assert!(together.len() == 1 && !small.contains(&together[0]), "one pack of the five: {together:?}");
    assert_eq!(store.coalesce(&together).unwrap(), 0, "one pack alone is not rewritten");
    assert_eq!(tiered.upload_next().unwrap(), Some(together[0]));
    assert_eq!(tiered.upload_next().unwrap(), None);
    assert_eq!(remote.list().unwrap().len(), 1, "one object in the bucket");
    let mut out = vec![0; 4096];
    for (id, bytes) in &written {
        store.read(*id, &mut out).unwrap();
        assert_eq!(&out, bytes);
    }
}

/// The packs the embedder keeps local (the present's: MYCDP's hot set) are
/// never evicted, whatever the budget, and one evicted before it was kept
/// comes back from the bucket, whole.
#[test]
fn kept_packs_stay_on_the_disk_and_come_back() {
    let config = TierConfig { cache_bytes_max: 0, newest_kept: 0, ..TierConfig::default() };
    let (_dir, local, _remote, tiered) = two_tiers(config);
    for pack in 1..=3 {
        put(&tiered, pack, pack as u8, 1 << 20);
    }
    while tiered.upload_next().unwrap().is_some() {}
    tiered.keep_local([2].into_iter().collect());
    assert_eq!(tiered.evict().unwrap(), 2 << 20);
    let on_disk = || local.list().unwrap().iter().map(|stored| stored.pack).collect::<Vec<_>>();
    assert_eq!(on_disk(), vec![2]);

    tiered.keep_local([2, 3].into_iter().collect());
    assert_eq!(tiered.fetch_next_kept().unwrap(), Some(3));
    assert_eq!(tiered.fetch_next_kept().unwrap(), None, "nothing else to fetch");
    assert_eq!(on_disk(), vec![2, 3]);
    let mut buf = vec![0; 4096];
    tiered.read(3, 1 << 19, &mut buf).unwrap();
    assert_eq!(buf, vec![3; 4096]);
    let stats = tiered.stats();
    assert_eq!((stats.local_reads, stats.remote_reads, stats.kept_packs), (1, 0, 2), "{stats:?}");
    assert_eq!(tiered.evict().unwrap(), 0, "both kept");
}

/// A remote tier whose uploads stop at their start until let go.
struct HeldUploads {
    inner: Arc<dyn PackStore>,
    /// (an upload is waiting, uploads are let go)
    gate: parking_lot::Mutex<(bool, bool)>,
    changed: parking_lot::Condvar,
}

impl HeldUploads {
    fn wait_for_an_upload(&self) {
        let mut gate = self.gate.lock();
        while !gate.0 {
            self.changed.wait(&mut gate);
        }
    }

    fn let_go(&self) {
        self.gate.lock().1 = true;
        self.changed.notify_all();
    }
}

impl PackStore for HeldUploads {
    fn locate(&self, pack: u64) -> String {
        self.inner.locate(pack)
    }

    fn create(&self, pack: u64) -> std::io::Result<Box<dyn rewind_chunks::pack_store::PackUpload>> {
        let mut gate = self.gate.lock();
        gate.0 = true;
        self.changed.notify_all();
        while !gate.1 {
            self.changed.wait(&mut gate);
        }
        drop(gate);
        self.inner.create(pack)
    }

    fn stat(&self, pack: u64) -> std::io::Result<rewind_chunks::pack_store::StoredPack> {
        self.inner.stat(pack)
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(pack, offset, buf)
    }

    fn delete(&self, pack: u64) -> std::io::Result<()> {
        self.inner.delete(pack)
    }

    fn list(&self) -> std::io::Result<Vec<rewind_chunks::pack_store::StoredPack>> {
        self.inner.list()
    }
}

/// A collection that deletes a pack while it is being uploaded waits for
/// the upload: the delete succeeds (it failed, and the failure stopped the
/// chunk store until a restart). A catalog may name a pack that was in the
/// bucket when deleted here, and not one deleted before its upload.
#[test]
fn a_delete_during_an_upload_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let local: Arc<dyn PackStore> = Arc::new(LocalPackStore::open(Arc::clone(&storage), "local").unwrap());
    let remote = Arc::new(HeldUploads {
        inner: Arc::new(LocalPackStore::open(storage, "remote").unwrap()),
        gate: parking_lot::Mutex::new((false, false)),
        changed: parking_lot::Condvar::new(),
    });
    let tiered = Arc::new(
        TieredPackStore::open(local, Arc::clone(&remote) as Arc<dyn PackStore>, TierConfig::default()).unwrap(),
    );
    put(&*tiered, 1, 1, 5000);
    let uploader = std::thread::spawn({
        let tiered = Arc::clone(&tiered);
        move || tiered.upload_next()
    });
    remote.wait_for_an_upload();
    let (deleting, delete_called) = std::sync::mpsc::channel();
    let deleter = std::thread::spawn({
        let tiered = Arc::clone(&tiered);
        move || {
            deleting.send(()).unwrap();
            tiered.delete(1)
        }
    });
    delete_called.recv().unwrap();
    remote.let_go();
    deleter.join().unwrap().expect("the delete waits for the upload");
    assert_eq!(uploader.join().unwrap().unwrap(), Some(1));
    assert!(tiered.stat(1).is_err() && !tiered.packs().contains(&1), "deleted here");
    assert!(tiered.all_uploaded(&[1]), "in the bucket when deleted");

    put(&*tiered, 2, 2, 5000);
    tiered.delete(2).unwrap();
    assert!(!tiered.all_uploaded(&[2]), "deleted before its upload");
}
