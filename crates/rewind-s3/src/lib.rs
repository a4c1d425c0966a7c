//! Packs in S3-compatible object storage (issue 14): [`S3PackStore`] keeps
//! the contract of `rewind_chunks::pack_store` on any S3 API — AWS S3,
//! MinIO, Ceph RGW — through the `object_store` crate.
//!
//! - Pack `n` is the object `PREFIX/packs/NNNN.pack` (16 hex digits). An
//!   upload is kept in memory (a pack is its target size, 32 MiB, plus a
//!   chunk at most) and sent at the finish as one PUT with
//!   `If-None-Match: *` — or, from 16 MiB, as 8 MiB parts in parallel
//!   completed with `If-None-Match: *` (`multipart`): the pack appears whole
//!   or not at all, and never over another. Its generation is the object's
//!   ETag.
//! - Reads are ranged GETs. Pack objects never change, so their sizes are
//!   remembered from the listing, a stat or the upload, and a range past
//!   the end is refused without a request.
//! - Credentials come from the AWS chain as `object_store` reads it: the
//!   environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, …), web
//!   identity, instance metadata.
//! - Errors: not found, already there and permission denied stay what they
//!   are; anything else the store or the network says once
//!   `object_store`'s retries are spent (timeouts, refused connections,
//!   5xx) is transient (`ConnectionAborted`): it fails the call, and the
//!   chunk store tries again later.
//!
//! The calls are synchronous, as the chunk store's threads make them; the
//! requests run on a small Tokio runtime of the store's own.

pub mod faulty_http;
pub mod lock;
pub mod minio;
mod multipart;
mod signed;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use lock::ObjectLock;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use parking_lot::Mutex;
use rewind_chunks::meta_store::MetaStore;
use rewind_chunks::pack_name;
use rewind_chunks::pack_store::{parse_pack_name, Generation, PackStore, PackUpload, StoredPack};
use rustc_hash::FxHashMap;
use signed::Signed;

/// Where the packs are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// The key prefix in the bucket, without leading or trailing `/`; may be empty.
    pub prefix: String,
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); AWS's when `None`.
    pub endpoint: Option<String>,
    /// The region; `AWS_REGION` or `us-east-1` when `None`.
    pub region: Option<String>,
    /// An access key and its secret, instead of the AWS credential chain.
    pub access_key: Option<(String, String)>,
    /// How long one request may take before it is given up (and retried);
    /// 30 s when `None`.
    pub request_timeout: Option<Duration>,
}

impl S3Config {
    /// `s3://BUCKET[/PREFIX]` and an optional endpoint.
    pub fn from_url(url: &str, endpoint: Option<String>) -> Result<S3Config, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{url:?} is not an S3 URL: write it as s3://BUCKET/PREFIX"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{url:?} names no bucket: write it as s3://BUCKET/PREFIX"));
        }
        let prefix = prefix.trim_matches('/').to_owned();
        Ok(S3Config {
            bucket: bucket.to_owned(),
            prefix,
            endpoint,
            region: None,
            access_key: None,
            request_timeout: None,
        })
    }

    /// `PREFIX/name`.
    fn path(&self, name: &str) -> Path {
        match self.prefix.is_empty() {
            true => Path::from(name),
            false => Path::from(format!("{}/{name}", self.prefix)),
        }
    }

    fn request_timeout(&self) -> Duration {
        self.request_timeout.unwrap_or(REQUEST_TIMEOUT)
    }

    fn url(&self) -> String {
        match self.prefix.is_empty() {
            true => format!("s3://{}", self.bucket),
            false => format!("s3://{}/{}", self.bucket, self.prefix),
        }
    }
}

/// How long one request may take, and how often a failing one is retried
/// before the call fails (with a transient error).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RETRIES_MAX: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// Sealed packs in a bucket; see the crate documentation.
pub struct S3PackStore {
    store: Arc<dyn ObjectStore>,
    /// `PREFIX/packs`.
    dir: Path,
    /// `s3://BUCKET/PREFIX/packs`, for messages.
    url: String,
    sizes: Arc<Mutex<FxHashMap<u64, u64>>>,
    runtime: tokio::runtime::Runtime,
    lock: Option<Arc<ObjectLock>>,
    /// Multipart uploads, and what `object_store` does not make.
    signed: Arc<Signed>,
}

/// A client of the store `config` names, with the runtime its requests run on.
fn connect(config: &S3Config) -> io::Result<(Arc<dyn ObjectStore>, tokio::runtime::Runtime)> {
    let (store, runtime) = connect_s3(config)?;
    Ok((Arc::new(store), runtime))
}

fn connect_s3(config: &S3Config) -> io::Result<(AmazonS3, tokio::runtime::Runtime)> {
    // reqwest's TLS takes rustls' default provider: ring, as everywhere
    // in Rewind. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&config.bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_client_options(
            ClientOptions::new().with_timeout(config.request_timeout()).with_connect_timeout(CONNECT_TIMEOUT),
        )
        .with_retry(RetryConfig { max_retries: RETRIES_MAX, retry_timeout: RETRY_TIMEOUT, ..Default::default() });
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let Some((id, secret)) = &config.access_key {
        builder = builder.with_access_key_id(id).with_secret_access_key(secret);
    }
    let store = builder.build().map_err(|error| to_io(error, &config.url()))?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("s3").enable_all().build()?;
    Ok((store, runtime))
}

impl S3PackStore {
    pub fn new(config: &S3Config) -> io::Result<S3PackStore> {
        let (s3, runtime) = connect_s3(config)?;
        let signed = Arc::new(Signed::new(config, s3.clone())?);
        Ok(S3PackStore {
            store: Arc::new(s3),
            signed,
            dir: config.path("packs"),
            url: format!("{}/packs", config.url()),
            sizes: Arc::default(),
            runtime,
            lock: None,
        })
    }

    /// Every pack written is held under `lock`, and deletes respect it.
    pub fn with_lock(self, lock: Arc<ObjectLock>) -> S3PackStore {
        S3PackStore { lock: Some(lock), ..self }
    }

    fn location(&self, pack: u64) -> Path {
        self.dir.clone().join(pack_name(pack))
    }

    /// Runs `future` on the store's runtime and waits for it: callable
    /// from any thread, async or not.
    fn run<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        run_on(self.runtime.handle(), future)
    }

    fn size_of(&self, pack: u64) -> io::Result<u64> {
        if let Some(&bytes) = self.sizes.lock().get(&pack) {
            return Ok(bytes);
        }
        Ok(self.stat(pack)?.bytes)
    }
}

fn run_on<T: Send + 'static>(runtime: &tokio::runtime::Handle, future: impl Future<Output = T> + Send + 'static) -> T {
    let (send, receive) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = send.send(future.await);
    });
    receive.recv().expect("the store's runtime lives as long as the store")
}

/// `error` as an `io::Error` of the kind the pack-store contract names.
fn to_io(error: object_store::Error, what: &str) -> io::Error {
    use object_store::Error as E;
    let kind = match &error {
        E::NotFound { .. } => io::ErrorKind::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => io::ErrorKind::AlreadyExists,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        E::NotSupported { .. } | E::NotImplemented { .. } => io::ErrorKind::Unsupported,
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::ConnectionAborted,
    };
    io::Error::new(kind, format!("{what}: {error}"))
}

fn generation(e_tag: Option<String>, version: Option<String>, what: &str) -> io::Result<Generation> {
    e_tag
        .or(version)
        .map(|tag| Generation(tag.trim_matches('"').to_owned()))
        .ok_or_else(|| io::Error::other(format!("{what}: the store gave no ETag or version for it")))
}

impl PackStore for S3PackStore {
    fn locate(&self, pack: u64) -> String {
        format!("{}/{}", self.url, pack_name(pack))
    }

    fn create(&self, pack: u64) -> io::Result<Box<dyn PackUpload>> {
        Ok(Box::new(S3Upload {
            store: Arc::clone(&self.store),
            location: self.location(pack),
            url: self.locate(pack),
            pack,
            bytes: Vec::new(),
            sizes: Arc::clone(&self.sizes),
            runtime: self.runtime.handle().clone(),
            lock: self.lock.clone(),
            signed: Arc::clone(&self.signed),
        }))
    }

    fn stat(&self, pack: u64) -> io::Result<StoredPack> {
        let (store, location, url) = (Arc::clone(&self.store), self.location(pack), self.locate(pack));
        let meta = self.run(async move { store.head(&location).await }).map_err(|error| to_io(error, &url))?;
        self.sizes.lock().insert(pack, meta.size);
        Ok(StoredPack { pack, bytes: meta.size, generation: generation(meta.e_tag, meta.version, &url)? })
    }

    fn read(&self, pack: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let size = self.size_of(pack)?;
        let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= size);
        let Some(end) = end else {
            let message =
                format!("{} bytes at {offset} are past the end of {} ({size} bytes)", buf.len(), self.locate(pack));
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
        };
        if buf.is_empty() {
            return Ok(());
        }
        let (store, location, url) = (Arc::clone(&self.store), self.location(pack), self.locate(pack));
        let bytes = self
            .run(async move { store.get_range(&location, offset..end).await })
            .map_err(|error| to_io(error, &url))?;
        if bytes.len() != buf.len() {
            let message =
                format!("{}: asked for {} bytes at {offset}, got {}", self.locate(pack), buf.len(), bytes.len());
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
        }
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    fn delete(&self, pack: u64) -> io::Result<()> {
        let (store, location, url) = (Arc::clone(&self.store), self.location(pack), self.locate(pack));
        // An upload of it a crash left unfinished goes too: only a pack large
        // enough for parts, or one never seen whole, can have one.
        let known = self.sizes.lock().get(&pack).copied();
        if known.is_none_or(|bytes| bytes >= multipart::MULTIPART_MIN_BYTES as u64) {
            let (signed, key) = (Arc::clone(&self.signed), location.to_string());
            self.run(async move { multipart::abort_unfinished(&signed, &key).await })?;
        }
        match &self.lock {
            Some(lock) => lock.delete(&location, &url)?,
            None => match self.run(async move { store.delete(&location).await }) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(to_io(error, &url)),
            },
        }
        self.sizes.lock().remove(&pack);
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<StoredPack>> {
        let (store, dir) = (Arc::clone(&self.store), self.dir.clone());
        let objects = self
            .run(async move { store.list(Some(&dir)).try_collect::<Vec<_>>().await })
            .map_err(|error| to_io(error, &self.url))?;
        let mut packs = Vec::new();
        for object in objects {
            let Some(pack) = object.location.filename().and_then(parse_pack_name) else {
                tracing::warn!(object = %object.location, "ignoring an object that is not a pack");
                continue;
            };
            let url = self.locate(pack);
            packs.push(StoredPack {
                pack,
                bytes: object.size,
                generation: generation(object.e_tag, object.version, &url)?,
            });
        }
        packs.sort_by_key(|stored| stored.pack);
        self.sizes.lock().extend(packs.iter().map(|stored| (stored.pack, stored.bytes)));
        Ok(packs)
    }
}

/// Writes `payload` at `location` with one PUT, if nothing is there.
fn put_new(
    runtime: &tokio::runtime::Handle,
    store: &Arc<dyn ObjectStore>,
    location: &Path,
    payload: PutPayload,
) -> object_store::Result<object_store::PutResult> {
    let (store, at) = (Arc::clone(store), location.clone());
    let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    run_on(runtime, async move { store.put_opts(&at, payload, options).await })
}

/// Holds what was written at `location` under `lock`: at once, or (an
/// object already there: a retried write) at the next extension.
fn hold<T>(lock: Option<&ObjectLock>, location: &Path, put: &io::Result<T>) {
    match (put, lock) {
        (Ok(_), Some(lock)) => lock.hold_new(location),
        (Err(error), Some(lock)) if error.kind() == io::ErrorKind::AlreadyExists => lock.hold_later(location),
        _ => {}
    }
}

/// A pack on its way: its bytes wait in memory for the finish's one PUT.
struct S3Upload {
    store: Arc<dyn ObjectStore>,
    location: Path,
    url: String,
    pack: u64,
    bytes: Vec<u8>,
    sizes: Arc<Mutex<FxHashMap<u64, u64>>>,
    runtime: tokio::runtime::Handle,
    lock: Option<Arc<ObjectLock>>,
    signed: Arc<Signed>,
}

impl PackUpload for S3Upload {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn finish(self: Box<Self>) -> io::Result<Generation> {
        let S3Upload { store, location, url, pack, bytes, sizes, runtime, lock, signed } = *self;
        let size = bytes.len() as u64;
        let put = match bytes.len() >= multipart::MULTIPART_MIN_BYTES {
            true => {
                let (at, what) = (location.clone(), url.clone());
                run_on(&runtime, async move { multipart::put_new(&signed, &at, bytes, &what).await })
                    .map(|completed| Generation(completed.e_tag))
            }
            false => put_new(&runtime, &store, &location, PutPayload::from(bytes))
                .map_err(|error| to_io(error, &url))
                .and_then(|put| generation(put.e_tag, put.version, &url)),
        };
        hold(lock.as_deref(), &location, &put);
        if put.is_ok() {
            sizes.lock().insert(pack, size);
        }
        put
    }

    fn abort(self: Box<Self>) -> io::Result<()> {
        // Nothing was sent.
        Ok(())
    }
}

/// A node's catalog objects in the bucket, under `PREFIX/` (see
/// `rewind_chunks::meta_store`). Written with one PUT with `If-None-Match: *`.
pub struct S3MetaStore {
    store: Arc<dyn ObjectStore>,
    config: S3Config,
    runtime: tokio::runtime::Runtime,
    lock: Option<Arc<ObjectLock>>,
}

impl S3MetaStore {
    pub fn new(config: &S3Config) -> io::Result<S3MetaStore> {
        let (store, runtime) = connect(config)?;
        Ok(S3MetaStore { store, config: config.clone(), runtime, lock: None })
    }

    /// Every object written is held under `lock`, and deletes respect it.
    pub fn with_lock(self, lock: Arc<ObjectLock>) -> S3MetaStore {
        S3MetaStore { lock: Some(lock), ..self }
    }

    fn run<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        run_on(self.runtime.handle(), future)
    }
}

impl MetaStore for S3MetaStore {
    fn locate(&self, name: &str) -> String {
        format!("{}/{name}", self.config.url())
    }

    fn put_new(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let location = self.config.path(name);
        let put = put_new(self.runtime.handle(), &self.store, &location, PutPayload::from(bytes.to_vec()))
            .map_err(|error| to_io(error, &self.locate(name)));
        hold(self.lock.as_deref(), &location, &put);
        put.map(drop)
    }

    fn get(&self, name: &str) -> io::Result<Vec<u8>> {
        let (store, location) = (Arc::clone(&self.store), self.config.path(name));
        let bytes = self
            .run(async move { store.get(&location).await?.bytes().await })
            .map_err(|error| to_io(error, &self.locate(name)))?;
        Ok(bytes.to_vec())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let (store, location) = (Arc::clone(&self.store), self.config.path(dir));
        let listed = self
            .run(async move { store.list_with_delimiter(Some(&location)).await })
            .map_err(|error| to_io(error, &self.locate(dir)))?;
        let mut names: Vec<String> =
            listed.objects.iter().filter_map(|object| object.location.filename().map(str::to_owned)).collect();
        names.sort();
        Ok(names)
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        let (store, location) = (Arc::clone(&self.store), self.config.path(name));
        if let Some(lock) = &self.lock {
            return lock.delete(&location, &self.locate(name));
        }
        match self.run(async move { store.delete(&location).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(to_io(error, &self.locate(name))),
        }
    }
}
