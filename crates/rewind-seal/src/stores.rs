//! The sealing wrappers around the bucket's two stores.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rewind_chunks::meta_store::MetaStore;
use rewind_chunks::pack_store::{Generation, PackStore, PackUpload, StoredPack};
use rustc_hash::FxHashMap;

use crate::key::{DataKey, KeySource};
use crate::object::{plain_bytes, sealed_range, Header, Sealer, HEADER_BYTES, SEGMENT_BYTES};

/// The name a pack's segments are bound to.
fn pack_object_name(pack: u64) -> String {
    format!("packs/{pack:016x}")
}

/// Packs sealed on their way to `inner` and opened on the way back;
/// sizes are the plaintext's, as the chunk store sees them.
pub struct SealedPackStore {
    inner: Arc<dyn PackStore>,
    sealer: Arc<Sealer>,
    /// Per pack read, its sealed size and header (packs never change).
    opened: Mutex<FxHashMap<u64, (u64, Header)>>,
}

impl SealedPackStore {
    pub fn new(inner: Arc<dyn PackStore>, key: &DataKey) -> SealedPackStore {
        SealedPackStore { inner, sealer: Arc::new(Sealer::new(key)), opened: Mutex::default() }
    }

    fn plain(&self, stored: StoredPack) -> io::Result<StoredPack> {
        let bytes = plain_bytes(stored.bytes).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: {} bytes cannot be a sealed pack (truncated?)",
                    self.inner.locate(stored.pack),
                    stored.bytes
                ),
            )
        })?;
        Ok(StoredPack { bytes, ..stored })
    }

    fn opened(&self, pack: u64) -> io::Result<(u64, Header)> {
        if let Some(&opened) = self.opened.lock().get(&pack) {
            return Ok(opened);
        }
        let size = self.inner.stat(pack)?.bytes;
        let mut header = vec![0u8; HEADER_BYTES.min(size) as usize];
        self.inner.read(pack, 0, &mut header)?;
        let header = self.sealer.read_header(&self.inner.locate(pack), &header)?;
        self.opened.lock().insert(pack, (size, header));
        Ok((size, header))
    }
}

impl PackStore for SealedPackStore {
    fn locate(&self, pack: u64) -> String {
        self.inner.locate(pack)
    }

    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>> {
        let header = self.sealer.new_header()?;
        let mut inner = self.inner.create(pack)?;
        inner.append(header.as_bytes())?;
        Ok(Box::new(SealedUpload {
            inner,
            sealer: Arc::clone(&self.sealer),
            name: pack_object_name(pack),
            header,
            pending: Vec::new(),
            index: 0,
            appended: 0,
        }))
    }

    fn stat(&self, pack: u64) -> io::Result<StoredPack> {
        self.plain(self.inner.stat(pack)?)
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (size, header) = self.opened(pack)?;
        let plain = plain_bytes(size).expect("checked when opened");
        let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= plain);
        if end.is_none() {
            let message =
                format!("{} bytes at {offset} are past the end of {} ({plain} bytes)", buf.len(), self.locate(pack));
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let (first, range) = sealed_range(size, offset, buf.len() as u64);
        let mut sealed = vec![0u8; (range.end - range.start) as usize];
        self.inner.read(pack, range.start, &mut sealed)?;
        let skip = (offset - first * SEGMENT_BYTES) as usize;
        let (name, what) = (pack_object_name(pack), self.locate(pack));
        self.sealer.open_segments(&name, &what, &header, size, first, &mut sealed, skip, buf)
    }

    fn delete(&self, pack: u64) -> io::Result<()> {
        self.opened.lock().remove(&pack);
        self.inner.delete(pack)
    }

    fn list(&self) -> io::Result<Vec<StoredPack>> {
        self.inner.list()?.into_iter().map(|stored| self.plain(stored)).collect()
    }
}

/// A pack being sealed: whole segments go on as they fill; the last is
/// sealed (as the last) at the finish.
struct SealedUpload {
    inner: Box<dyn PackUpload>,
    sealer: Arc<Sealer>,
    name: String,
    header: Header,
    /// Plaintext not sealed yet: at most one segment.
    pending: Vec<u8>,
    index: u64,
    appended: u64,
}

impl PackUpload for SealedUpload {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.pending.extend_from_slice(bytes);
        self.appended += bytes.len() as u64;
        // A full segment is sealed once more follows: only then is it not the last.
        while self.pending.len() as u64 > SEGMENT_BYTES {
            let rest = self.pending.split_off(SEGMENT_BYTES as usize);
            let sealed = self.sealer.seal_segment(&self.name, &self.header, self.index, false, &self.pending);
            self.inner.append(&sealed)?;
            self.pending = rest;
            self.index += 1;
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        self.appended
    }

    fn finish(mut self: Box<Self>) -> io::Result<Generation> {
        let sealed = self.sealer.seal_segment(&self.name, &self.header, self.index, true, &self.pending);
        self.inner.append(&sealed)?;
        self.inner.finish()
    }

    fn abort(self: Box<Self>) -> io::Result<()> {
        self.inner.abort()
    }
}

/// Catalog objects sealed on their way to `inner`; their pieces are named
/// by a keyed hash.
pub struct SealedMetaStore {
    inner: Arc<dyn MetaStore>,
    sealer: Sealer,
}

impl SealedMetaStore {
    pub fn new(inner: Arc<dyn MetaStore>, key: &DataKey) -> SealedMetaStore {
        SealedMetaStore { inner, sealer: Sealer::new(key) }
    }
}

impl MetaStore for SealedMetaStore {
    fn locate(&self, name: &str) -> String {
        self.inner.locate(name)
    }

    fn put_new(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.inner.put_new(name, &self.sealer.seal(name, bytes)?)
    }

    fn get(&self, name: &str) -> io::Result<Vec<u8>> {
        let sealed = self.inner.get(name)?;
        self.sealer.open(name, &self.locate(name), &sealed)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        self.inner.delete(name)
    }

    fn content_hash(&self, bytes: &[u8]) -> [u8; 32] {
        self.sealer.content_hash(bytes)
    }
}

/// The bucket's stores as the node uses them: sealed under the bucket's
/// data key when there is one or `key` is given (a new bucket gets one),
/// as they are when neither. Refused: a sealed bucket without a key, a key
/// that does not open it, and a key for a bucket that already holds
/// unsealed history (sealing starts with an empty prefix).
pub fn seal_bucket(
    packs: Arc<dyn PackStore>,
    meta: Arc<dyn MetaStore>,
    key: Option<&KeySource>,
) -> io::Result<(Arc<dyn PackStore>, Arc<dyn MetaStore>)> {
    let sealed = DataKey::exists(&*meta)?;
    let key = match (key, sealed) {
        (None, false) => return Ok((packs, meta)),
        (None, true) => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the bucket is encrypted ({}): give its key with --key-file", meta.locate(crate::KEYS_DIR)),
            ))
        }
        (Some(source), true) => DataKey::open_or_create(&*meta, source)?,
        (Some(source), false) => {
            let holds_history = !packs.list()?.is_empty() || !meta.list("catalogs")?.is_empty();
            if holds_history {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the bucket holds history that is not encrypted (beside {}): encryption starts with an \
                         empty bucket or prefix",
                        meta.locate(crate::KEYS_DIR)
                    ),
                ));
            }
            DataKey::open_or_create(&*meta, source)?
        }
    };
    Ok((Arc::new(SealedPackStore::new(packs, &key)), Arc::new(SealedMetaStore::new(meta, &key))))
}
