//! S3 Object Lock on everything Rewind writes to a bucket (issue 14 req 6;
//! the contract is `rewind_chunks::retention`).
//!
//! The bucket must have been created with object lock enabled (which also
//! turns on versioning); [`ObjectLock::new`] checks it. Every object the
//! stores write is then held in *compliance* mode — nobody can delete its
//! data or shorten its hold, not even the bucket's owner — for the period
//! plus some headroom, and [`ObjectLock::extend`] (on the node's bucket
//! schedule) pushes the hold of every object still wanted forward whenever
//! less than the period is left. So every catalog, and every pack and piece
//! it names, stays in the bucket at least a period after the node last
//! wanted it: history published inside the lock survives the node's own
//! credentials used against it.
//!
//! Deletes ask first: an object whose hold has not run out is refused with
//! `Locked` and given up (its hold is no longer extended); once the hold
//! has run out, the delete removes the object's version itself (a plain
//! delete in a versioned bucket would only hide it behind a delete marker
//! and keep its bytes).
//!
//! Object lock's calls are not in `object_store`: they are made here, as
//! requests signed by `crate::signed`.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures_util::{StreamExt, TryStreamExt};
use md5::Digest;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;
use reqwest::{Method, StatusCode};
use rewind_chunks::retention::{Locked, Retention, RetentionReport};
use rustc_hash::FxHashSet;

use crate::signed::{element, Signed};
use crate::{run_on, to_io, S3Config};

/// How much longer than the period a hold is set for, so that extending
/// it is needed only now and then: a quarter of the period, at most a week.
fn headroom(period: Duration) -> Duration {
    (period / 4).min(Duration::from_secs(7 * 24 * 3600))
}

/// How many holds are asked for or set at once.
const PARALLEL_REQUESTS: usize = 16;

/// See the module documentation.
pub struct ObjectLock {
    inner: Arc<Inner>,
    runtime: tokio::runtime::Runtime,
}

struct Inner {
    period: Duration,
    signed: Signed,
    /// `PREFIX`: what [`ObjectLock::extend`] lists.
    prefix: Path,
    state: Mutex<LockState>,
}

#[derive(Default)]
struct LockState {
    /// The bucket has been listed and every hold found (after a start).
    listed: bool,
    /// Each object's hold, Unix seconds, by key.
    until: BTreeMap<String, u64>,
    given_up: FxHashSet<String>,
    /// Objects written whose hold could not be set.
    pending: FxHashSet<String>,
    extensions: u64,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

fn rfc3339(unix_seconds: u64) -> String {
    jiff::Timestamp::from_second(unix_seconds as i64).expect("a time Rewind sets is in jiff's range").to_string()
}

impl ObjectLock {
    /// The lock over `config`'s bucket, holding objects `period`; fails with
    /// what to do if the bucket has no object lock.
    pub fn new(config: &S3Config, period: Duration) -> io::Result<ObjectLock> {
        if period.as_secs() == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an object lock of less than a second"));
        }
        let lock = ObjectLock::unchecked(config, period)?;
        let inner = Arc::clone(&lock.inner);
        lock.run(async move { inner.check_bucket().await })?;
        Ok(lock)
    }

    /// The lock over `config`'s bucket, whether or not it has one.
    fn unchecked(config: &S3Config, period: Duration) -> io::Result<ObjectLock> {
        let (store, runtime) = crate::connect_s3(config)?;
        let signed = Signed::new(config, store)?;
        let inner = Arc::new(Inner { period, signed, prefix: config.path(""), state: Mutex::default() });
        Ok(ObjectLock { inner, runtime })
    }

    fn run<T: Send + 'static>(&self, future: impl std::future::Future<Output = T> + Send + 'static) -> T {
        run_on(self.runtime.handle(), future)
    }

    /// Holds the object at `location`, just written; a failure leaves it
    /// pending for the next [`ObjectLock::extend`].
    pub(crate) fn hold_new(&self, location: &Path) {
        self.want_again(location);
        let inner = Arc::clone(&self.inner);
        let key = location.to_string();
        let until = unix_now() + (self.inner.period + headroom(self.inner.period)).as_secs();
        if let Err(error) = self.run(async move { inner.put_retention(&key, until).await }) {
            tracing::warn!(object = %location, %error, "an object was written but not yet locked; trying again later");
            self.inner.state.lock().pending.insert(location.to_string());
        }
    }

    /// An object already there (a retried upload, or a content-addressed
    /// piece named again): held at the next extension.
    pub(crate) fn hold_later(&self, location: &Path) {
        self.want_again(location);
        self.inner.state.lock().pending.insert(location.to_string());
    }

    /// An object written again is wanted again, though a delete gave it up:
    /// its hold is extended from now on. (A piece a newer catalog names
    /// once more was left to run out, and then anyone could delete it.)
    fn want_again(&self, location: &Path) {
        self.inner.state.lock().given_up.remove(location.as_ref());
    }

    /// Deletes the object at `location` (its version, not hiding it behind
    /// a delete marker) unless its hold has not run out: then `Locked`, and
    /// the object is given up.
    pub(crate) fn delete(&self, location: &Path, what: &str) -> io::Result<()> {
        let inner = Arc::clone(&self.inner);
        let (location, what) = (location.clone(), what.to_owned());
        self.run(async move { inner.delete(location, what).await })
    }
}

impl Inner {
    /// Whether the bucket has object lock.
    async fn bucket_locked(&self) -> io::Result<bool> {
        let (status, body) = self.signed.send(Method::GET, "", "object-lock", &[], Vec::new()).await?;
        if status.is_success() {
            return Ok(element(&body, "ObjectLockEnabled") == Some("Enabled"));
        }
        match element(&body, "Code") {
            // Stores without object lock at all say so.
            Some("ObjectLockConfigurationNotFoundError" | "NotImplemented") => Ok(false),
            _ => {
                Err(self.signed.refused(&format!("cannot read the object lock of {}", self.signed.url), status, &body))
            }
        }
    }

    async fn check_bucket(&self) -> io::Result<()> {
        if !self.bucket_locked().await? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} has no object lock: --lock needs a bucket created with object lock enabled \
                     (`mc mb --with-lock`, `aws s3api create-bucket --object-lock-enabled-for-bucket`)",
                    self.signed.url
                ),
            ));
        }
        Ok(())
    }

    /// Sets `key`'s hold (compliance mode) to end at `until`.
    async fn put_retention(&self, key: &str, until: u64) -> io::Result<()> {
        let body = format!(
            "<Retention xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Mode>COMPLIANCE</Mode>\
             <RetainUntilDate>{}</RetainUntilDate></Retention>",
            rfc3339(until)
        )
        .into_bytes();
        let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body));
        let headers = [("content-md5", md5), ("content-type", "application/xml".to_owned())];
        let (status, reply) = self.signed.send(Method::PUT, key, "retention", &headers, body).await?;
        if !status.is_success() {
            return Err(self.signed.refused(&format!("cannot lock {}/{key}", self.signed.base), status, &reply));
        }
        let mut state = self.state.lock();
        state.until.insert(key.to_owned(), until);
        state.pending.remove(key);
        state.extensions += 1;
        Ok(())
    }

    /// When `key`'s hold ends (Unix seconds), if it has one.
    async fn get_retention(&self, key: &str) -> io::Result<Option<u64>> {
        let (status, body) = self.signed.send(Method::GET, key, "retention", &[], Vec::new()).await?;
        if !status.is_success() {
            let code = element(&body, "Code").unwrap_or("");
            if code == "NoSuchObjectLockConfiguration" || code == "ObjectLockConfigurationNotFoundError" {
                return Ok(None);
            }
            return Err(self.signed.refused(
                &format!("cannot read the lock of {}/{key}", self.signed.base),
                status,
                &body,
            ));
        }
        let until =
            element(&body, "RetainUntilDate").and_then(|date| date.parse::<jiff::Timestamp>().ok()).ok_or_else(
                || io::Error::other(format!("{}/{key}: a retention without a date: {body}", self.signed.base)),
            )?;
        Ok(Some(until.as_second().max(0) as u64))
    }

    /// The hold of `key` as known, else as asked.
    async fn until(&self, key: &str) -> io::Result<Option<u64>> {
        if let Some(&until) = self.state.lock().until.get(key) {
            return Ok(Some(until));
        }
        let until = self.get_retention(key).await?;
        if let Some(until) = until {
            self.state.lock().until.insert(key.to_owned(), until);
        }
        Ok(until)
    }

    async fn delete(&self, location: Path, what: String) -> io::Result<()> {
        let key = location.to_string();
        let until = match self.until(&key).await {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            until => until?,
        };
        if let Some(until) = until.filter(|&until| until > unix_now()) {
            self.state.lock().given_up.insert(key);
            return Err(Locked { object: what, until_unix_seconds: until }.into_io());
        }
        let version = match self.signed.store.head(&location).await {
            Ok(meta) => meta.version,
            Err(object_store::Error::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(to_io(error, &what)),
        };
        match version {
            Some(version) => {
                let query = format!("versionId={version}");
                let (status, body) = self.signed.send(Method::DELETE, &key, &query, &[], Vec::new()).await?;
                if !status.is_success() && status != StatusCode::NOT_FOUND {
                    return Err(self.signed.refused(&format!("cannot delete {what}"), status, &body));
                }
            }
            None => match self.signed.store.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(to_io(error, &what)),
            },
        }
        let mut state = self.state.lock();
        state.until.remove(&key);
        state.given_up.remove(&key);
        state.pending.remove(&key);
        Ok(())
    }

    /// Every object under the prefix, with its hold asked for (after a start).
    async fn list_holds(self: &Arc<Self>) -> io::Result<()> {
        let keys: Vec<String> = self
            .signed
            .store
            .list(Some(&self.prefix))
            .map_ok(|object| object.location.to_string())
            .try_collect()
            .await
            .map_err(|error| to_io(error, &self.signed.url))?;
        let unknown: Vec<String> = {
            let state = self.state.lock();
            keys.into_iter().filter(|key| !state.until.contains_key(key)).collect()
        };
        let found: Vec<(String, Option<u64>)> = futures_util::stream::iter(unknown)
            .map(|key| {
                let inner = Arc::clone(self);
                async move { inner.get_retention(&key).await.map(|until| (key, until)) }
            })
            .buffer_unordered(PARALLEL_REQUESTS)
            .try_collect()
            .await?;
        let mut state = self.state.lock();
        for (key, until) in found {
            match until {
                Some(until) => {
                    state.until.insert(key, until);
                }
                // Written before the lock was asked for, or its hold never set.
                None => {
                    state.pending.insert(key);
                }
            }
        }
        state.listed = true;
        Ok(())
    }

    async fn extend(self: Arc<Self>) -> io::Result<RetentionReport> {
        if !self.state.lock().listed {
            self.list_holds().await?;
        }
        // Holds end at least a period away between two extensions (an
        // upload interval apart, well within half the headroom).
        let now = unix_now();
        let headroom = headroom(self.period).as_secs();
        let wanted_until = now + self.period.as_secs() + headroom / 2;
        let new_until = now + self.period.as_secs() + headroom;
        let due: Vec<String> = {
            let state = self.state.lock();
            let short = state.until.iter().filter(|&(_, &until)| until < wanted_until).map(|(key, _)| key);
            short.chain(state.pending.iter()).filter(|key| !state.given_up.contains(*key)).cloned().collect()
        };
        futures_util::stream::iter(due)
            .map(|key| {
                let inner = Arc::clone(&self);
                async move {
                    match inner.put_retention(&key, new_until).await {
                        // Gone (deleted by someone else): nothing to hold.
                        Err(error) if error.kind() == io::ErrorKind::NotFound => {
                            let mut state = inner.state.lock();
                            state.until.remove(&key);
                            state.pending.remove(&key);
                            Ok(())
                        }
                        held => held,
                    }
                }
            })
            .buffer_unordered(PARALLEL_REQUESTS)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(self.report())
    }

    fn report(&self) -> RetentionReport {
        let state = self.state.lock();
        let wanted = state.until.iter().filter(|(key, _)| !state.given_up.contains(*key));
        RetentionReport {
            period_seconds: self.period.as_secs(),
            held: state.until.len() as u64,
            given_up: state.given_up.len() as u64,
            pending: state.pending.len() as u64,
            extensions: state.extensions,
            earliest_end_unix_seconds: wanted.map(|(_, &until)| until).min(),
        }
    }
}

impl Retention for ObjectLock {
    fn extend(&self) -> io::Result<RetentionReport> {
        let inner = Arc::clone(&self.inner);
        self.run(inner.extend())
    }

    fn report(&self) -> RetentionReport {
        self.inner.report()
    }
}

/// Whether `config`'s bucket has object lock: one request.
/// Credentials that may not read a bucket's lock configuration are not a
/// reason to refuse it: the bucket is taken as unlocked, with a warning.
pub fn has_lock(config: &S3Config) -> io::Result<bool> {
    let lock = ObjectLock::unchecked(config, Duration::from_secs(1))?;
    let inner = Arc::clone(&lock.inner);
    match lock.run(async move { inner.bucket_locked().await }) {
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            tracing::warn!(bucket = %config.url(), %error, "cannot tell whether the bucket has object lock; taken as not");
            Ok(false)
        }
        locked => locked,
    }
}

/// Creates `config`'s bucket with object lock enabled (for tests: a
/// bucket's lock can only be chosen when it is made).
pub fn create_locked_bucket(config: &S3Config) -> io::Result<()> {
    let lock = ObjectLock::unchecked(config, Duration::from_secs(60))?;
    let inner = Arc::clone(&lock.inner);
    lock.run(async move {
        let headers = [("x-amz-bucket-object-lock-enabled", "true".to_owned())];
        let (status, body) = inner.signed.send(Method::PUT, "", "", &headers, Vec::new()).await?;
        match status.is_success() {
            true => Ok(()),
            false => Err(inner.signed.refused(&format!("cannot create {}", inner.signed.url), status, &body)),
        }
    })
}

/// Deletes one version of the object `name` under `config`'s prefix with
/// `config`'s credentials, as anyone holding them could: what a lock refuses.
pub fn delete_version(config: &S3Config, name: &str) -> io::Result<()> {
    let lock = ObjectLock::new(config, Duration::from_secs(60))?;
    let inner = Arc::clone(&lock.inner);
    let location = config.path(name);
    lock.run(async move {
        let meta = inner.signed.store.head(&location).await.map_err(|error| to_io(error, location.as_ref()))?;
        let version = meta.version.ok_or_else(|| io::Error::other(format!("{location} has no version id")))?;
        let (status, body) = inner
            .signed
            .send(Method::DELETE, location.as_ref(), &format!("versionId={version}"), &[], Vec::new())
            .await?;
        match status.is_success() {
            true => Ok(()),
            false => Err(inner.signed.refused(&format!("cannot delete {location}"), status, &body)),
        }
    })
}
