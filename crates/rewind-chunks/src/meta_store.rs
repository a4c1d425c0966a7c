//! Where a node's catalog lives beside its packs (issue 14 req 3): small
//! named objects, written once. The engine's catalog (`rewind_engine::catalog`)
//! keeps in it what a node needs besides its packs to be rebuilt — the
//! catalogs themselves and the content-addressed pieces they name — through
//! [`MetaStore`]; a local directory ([`LocalMetaStore`]) and S3-compatible
//! object storage (`rewind_s3::S3MetaStore`) implement it, and
//! [`check_meta_store`] is the suite both pass.
//!
//! The contract is object storage's, as for packs: an object is written
//! whole under a name not yet taken (S3 `If-None-Match: *`), or not at all;
//! it is never written over; names are `/`-separated, listed one directory
//! at a time. Errors are `std::io::Error`s with the kinds
//! `rewind_chunks::pack_store` names.

use std::io;
use std::sync::Arc;

use rewind_io::{parent_dir, read_file, write_file_atomic, Storage};

/// Named objects written once; see the module documentation.
pub trait MetaStore: Send + Sync {
    /// Where object `name` is, for messages: a path or a URL.
    fn locate(&self, name: &str) -> String;
    /// Stores `bytes` durably as `name`; `AlreadyExists` if `name` is taken.
    fn put_new(&self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// The whole of object `name`; `NotFound` if there is none.
    fn get(&self, name: &str) -> io::Result<Vec<u8>>;
    /// The names of the objects in directory `dir` (`dir/NAME`), sorted.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    /// Removes object `name`; one that is not there is not an error.
    fn delete(&self, name: &str) -> io::Result<()>;
    /// The name-worthy hash of `bytes` (objects named by their contents):
    /// BLAKE3, or a keyed hash where the store must not let its owner test
    /// for known contents.
    fn content_hash(&self, bytes: &[u8]) -> [u8; 32] {
        *blake3::hash(bytes).as_bytes()
    }
}

/// Objects as files under a directory of a [`Storage`], each written to a
/// temporary name, synced and renamed (see [`write_file_atomic`]).
pub struct LocalMetaStore {
    storage: Arc<dyn Storage>,
    dir: String,
}

impl LocalMetaStore {
    pub fn open(storage: Arc<dyn Storage>, dir: &str) -> io::Result<LocalMetaStore> {
        storage.create_dir_all(dir)?;
        Ok(LocalMetaStore { storage, dir: dir.to_owned() })
    }

    fn path(&self, name: &str) -> String {
        assert!(!name.is_empty() && !name.starts_with('/') && !name.contains(".."), "object name {name:?}");
        format!("{}/{name}", self.dir)
    }
}

impl MetaStore for LocalMetaStore {
    fn locate(&self, name: &str) -> String {
        self.path(name)
    }

    fn put_new(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.path(name);
        if self.storage.exists(&path)? {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{path} exists")));
        }
        self.storage.create_dir_all(parent_dir(&path))?;
        write_file_atomic(&*self.storage, &path, bytes)
    }

    fn get(&self, name: &str) -> io::Result<Vec<u8>> {
        read_file(&*self.storage, &self.path(name))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let path = format!("{}/{dir}", self.dir);
        let mut names = match self.storage.list_dir(&path) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            listed => listed?,
        };
        // Temporary files of a write a crash interrupted are not objects.
        names.retain(|name| !name.ends_with(".tmp"));
        names.sort();
        Ok(names)
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        let path = self.path(name);
        match self.storage.remove_file(&path) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            removed => removed,
        }
    }
}

/// The objects of another store under one of its directories: a node's
/// own objects in a bucket shared by several (`crate::peers`).
pub struct Within {
    store: Arc<dyn MetaStore>,
    dir: String,
}

impl Within {
    pub fn new(store: Arc<dyn MetaStore>, dir: &str) -> Within {
        assert!(!dir.is_empty() && !dir.starts_with('/') && !dir.ends_with('/'), "directory {dir:?}");
        Within { store, dir: dir.to_owned() }
    }

    fn name(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }
}

impl MetaStore for Within {
    fn locate(&self, name: &str) -> String {
        self.store.locate(&self.name(name))
    }

    fn put_new(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.store.put_new(&self.name(name), bytes)
    }

    fn get(&self, name: &str) -> io::Result<Vec<u8>> {
        self.store.get(&self.name(name))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.store.list(&self.name(dir))
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        self.store.delete(&self.name(name))
    }

    fn content_hash(&self, bytes: &[u8]) -> [u8; 32] {
        self.store.content_hash(bytes)
    }
}

/// The contract of [`MetaStore`], checked on `store` (empty under `dir`).
/// Panics with what broke it.
pub fn check_meta_store(store: &dyn MetaStore, dir: &str) {
    let kind = |result: io::Result<Vec<u8>>| result.expect_err("an error").kind();
    assert_eq!(store.list(dir).unwrap(), Vec::<String>::new(), "the suite starts from an empty {dir}");
    let (a, b) = (format!("{dir}/b-object"), format!("{dir}/a-object"));
    let bytes = crate::conformance::noise(7, 300_000);
    store.put_new(&a, &bytes).expect("put a");
    assert_eq!(store.get(&a).unwrap(), bytes, "read back whole");
    let taken = store.put_new(&a, b"other").expect_err("a name is written once");
    assert_eq!(taken.kind(), io::ErrorKind::AlreadyExists, "{taken}");
    assert_eq!(store.get(&a).unwrap(), bytes, "never written over");
    assert_eq!(kind(store.get(&b)), io::ErrorKind::NotFound, "a missing object");
    store.put_new(&b, b"").expect("put an empty object");
    assert_eq!(store.get(&b).unwrap(), Vec::<u8>::new());
    assert_eq!(store.list(dir).unwrap(), vec!["a-object".to_owned(), "b-object".to_owned()], "sorted names");
    assert_eq!(store.list(&format!("{dir}/none")).unwrap(), Vec::<String>::new(), "an empty directory");
    store.delete(&a).expect("delete a");
    store.delete(&a).expect("deleting what is not there is not an error");
    assert_eq!(kind(store.get(&a)), io::ErrorKind::NotFound, "deleted");
    store.put_new(&a, b"again").expect("a deleted name may be written again");
    assert_eq!(store.get(&a).unwrap(), b"again");
    store.delete(&a).unwrap();
    store.delete(&b).unwrap();
    assert_eq!(store.list(dir).unwrap(), Vec::<String>::new(), "everything deleted");
}
