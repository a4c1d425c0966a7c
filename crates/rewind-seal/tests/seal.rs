//! Sealing (issue 14 req 4): the sealed stores keep the seams' contracts;
//! nothing readable reaches the bucket; a swapped, truncated or re-keyed
//! object fails with an error that says so; keys are checked, missing keys
//! refused, and a re-key keeps everything readable with the new key only.
//! The contracts hold on a real MinIO too.

use std::io;
use std::sync::Arc;

use rewind_chunks::conformance::{check_adopt, check_store, noise};
use rewind_chunks::meta_store::check_meta_store;
use rewind_chunks::{LocalMetaStore, LocalPackStore, MetaStore, PackStore};
use rewind_io::{OsStorage, Storage};
use rewind_seal::{rekey, seal_bucket, KeySource};

struct Bucket {
    dir: tempfile::TempDir,
    packs: Arc<dyn PackStore>,
    meta: Arc<dyn MetaStore>,
}

fn bucket() -> Bucket {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(OsStorage::new(dir.path()).unwrap());
    let packs = Arc::new(LocalPackStore::open(Arc::clone(&storage), "packs").unwrap());
    let meta = Arc::new(LocalMetaStore::open(storage, "meta").unwrap());
    Bucket { dir, packs, meta }
}

fn key(byte: u8) -> KeySource {
    KeySource::Key([byte; 32])
}

fn put(store: &dyn PackStore, pack: u64, bytes: &[u8]) {
    let mut upload = store.create(pack).unwrap();
    for piece in bytes.chunks(100_000) {
        upload.append(piece).unwrap();
    }
    upload.finish().unwrap();
}

fn read(store: &dyn PackStore, pack: u64, offset: u64, length: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; length];
    store.read(pack, offset, &mut buf).map(|()| buf)
}

#[test]
fn sealed_stores_keep_the_contracts() {
    let bucket = bucket();
    let (packs, meta) = seal_bucket(bucket.packs, bucket.meta, Some(&key(1))).unwrap();
    // Past several segments, and an exact multiple of one.
    check_store(&*packs, 1, 3 << 20);
    check_store(&*packs, 100, 128 << 10);
    // An adopted journal segment is sealed as it is copied in, never linked.
    let source = tempfile::tempdir().unwrap();
    check_adopt(&*packs, &OsStorage::new(source.path()).unwrap(), "journal", 200, false);
    check_meta_store(&*meta, "catalogs");
}

#[test]
fn sealed_stores_keep_the_contracts_on_minio() {
    let dir = tempfile::tempdir().unwrap();
    let minio = rewind_s3::minio::Minio::start(dir.path());
    let config = minio.config("sealed");
    let packs = Arc::new(rewind_s3::S3PackStore::new(&config).unwrap());
    let meta = Arc::new(rewind_s3::S3MetaStore::new(&config).unwrap());
    let (packs, meta) = seal_bucket(packs, meta, Some(&key(3))).unwrap();
    check_store(&*packs, 1, 5 << 20);
    check_meta_store(&*meta, "catalogs");
}

#[test]
fn nothing_readable_reaches_the_bucket() {
    let bucket = bucket();
    let (packs, meta) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).unwrap();
    let plain = noise(5, 300_000);
    put(&*packs, 1, &plain);
    meta.put_new("pieces/x", &plain).unwrap();
    for path in [bucket.dir.path().join("packs/0000000000000001.pack"), bucket.dir.path().join("meta/pieces/x")] {
        let stored = std::fs::read(&path).unwrap();
        assert!(stored.len() > plain.len(), "{}: header and tags", path.display());
        let found = plain.windows(32).step_by(4096).any(|probe| stored.windows(32).any(|window| window == probe));
        assert!(!found, "{} holds plaintext", path.display());
    }
    assert_eq!(read(&*packs, 1, 70_000, 100_000).unwrap(), plain[70_000..170_000], "a range across segments");
    assert_eq!(meta.get("pieces/x").unwrap(), plain);
    assert_ne!(meta.content_hash(&plain), *blake3::hash(&plain).as_bytes(), "content names are keyed");
    assert_eq!(bucket.meta.content_hash(&plain), *blake3::hash(&plain).as_bytes());
}

#[test]
fn swapped_truncated_and_foreign_objects_fail_to_open() {
    let bucket = bucket();
    let (packs, meta) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).unwrap();
    put(&*packs, 1, &noise(1, 200_000));
    put(&*packs, 2, &noise(2, 200_000));
    let path = |pack: u64| bucket.dir.path().join(format!("packs/{pack:016x}.pack"));

    // Pack 1's object under pack 2's name.
    std::fs::copy(path(1), path(2)).unwrap();
    let (packs, _) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).unwrap();
    let error = read(&*packs, 2, 0, 10).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("swapped for another object"), "{error}");

    // Cut short by part of a segment, and by exactly its last segment.
    let file = std::fs::OpenOptions::new().write(true).open(path(1)).unwrap();
    let size = file.metadata().unwrap().len();
    file.set_len(size - 100).unwrap();
    let (packs, _) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).unwrap();
    let plain = packs.stat(1).unwrap().bytes;
    let error = read(&*packs, 1, plain - 10, 10).unwrap_err();
    assert!(error.to_string().contains("does not open"), "{error}");
    let segment_and_tag = 64 * 1024 + 16;
    file.set_len(64 + 3 * segment_and_tag).unwrap();
    let (packs, _) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).unwrap();
    let error = read(&*packs, 1, 3 * 65536 - 10, 10).unwrap_err();
    assert!(error.to_string().contains("truncated"), "a full segment that was not sealed as the last: {error}");

    // A catalog object swapped for another.
    meta.put_new("catalogs/a", b"one").unwrap();
    meta.put_new("catalogs/b", b"two").unwrap();
    std::fs::copy(bucket.dir.path().join("meta/catalogs/a"), bucket.dir.path().join("meta/catalogs/b")).unwrap();
    let error = meta.get("catalogs/b").unwrap_err();
    assert!(error.to_string().contains("swapped"), "{error}");

    // An object written without sealing, read through the sealed store.
    bucket.packs.create(3).and_then(|mut upload| upload.append(&[7; 5000]).and_then(|()| upload.finish())).unwrap();
    let error = read(&*packs, 3, 0, 10).unwrap_err();
    assert!(error.to_string().contains("not sealed"), "{error}");
}

#[test]
fn keys_are_checked_and_a_rekey_opens_with_the_new_key_only() {
    let bucket = bucket();
    let passphrase = bucket.dir.path().join("passphrase");
    std::fs::write(&passphrase, "correct horse battery staple\n").unwrap();
    let words = KeySource::from_file(&passphrase).unwrap();
    assert!(matches!(words, KeySource::Passphrase(ref text) if text == "correct horse battery staple"));
    let (packs, _) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&words)).unwrap();
    put(&*packs, 1, &noise(9, 70_000));

    let error = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), None).err().expect("refused");
    assert!(error.to_string().contains("the bucket is encrypted"), "{error}");
    std::fs::write(&passphrase, "not the passphrase").unwrap();
    let wrong = KeySource::from_file(&passphrase).unwrap();
    let error = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&wrong)).err().expect("refused");
    assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
    assert!(error.to_string().contains("does not open"), "{error}");
    let error = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&key(1))).err().expect("refused");
    assert!(error.to_string().contains("wrapped with a passphrase"), "{error}");

    // Re-keyed to a 32-byte key (written as hex): the packs are untouched.
    let hex = bucket.dir.path().join("key.hex");
    std::fs::write(&hex, format!("{}\n", "ab".repeat(32))).unwrap();
    let new = KeySource::from_file(&hex).unwrap();
    assert!(matches!(new, KeySource::Key(key) if key == [0xab; 32]));
    rekey(&*bucket.meta, &words, &new).unwrap();
    assert_eq!(bucket.meta.list("keys").unwrap(), ["data-key-0000000000000002"], "the old wrapping is gone");
    let (packs, _) = seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&new)).unwrap();
    assert_eq!(read(&*packs, 1, 0, 70_000).unwrap(), noise(9, 70_000));
    assert!(seal_bucket(Arc::clone(&bucket.packs), Arc::clone(&bucket.meta), Some(&words)).is_err());

    // A key for a bucket that holds unsealed history is refused.
    let plain = self::bucket();
    put(&*plain.packs, 1, b"plain");
    let error = seal_bucket(plain.packs, plain.meta, Some(&key(2))).err().expect("refused");
    assert!(error.to_string().contains("not encrypted"), "{error}");
    std::fs::write(&passphrase, "short").unwrap();
    assert!(KeySource::from_file(&passphrase).unwrap_err().to_string().contains("too weak"));
}
