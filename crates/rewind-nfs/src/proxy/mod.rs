//! UCDP-O: protecting an NFSv3 server Rewind does not run. The proxy takes
//! clients' calls on one tree's export, forwards each to the upstream
//! server, and records every update the upstream applied into the tree (the
//! *mirror*), so the tree's history is the upstream's.
//!
//! ```text
//!  client ─▶ Dispatcher ─┬─ past (/.rewind, TREE@TIME) ─────────────▶ mirror's views
//!                        └─ present of a proxied tree ─▶ Proxy ─▶ upstream server
//!                                                          └─ updates ─▶ mirror (now, or by the recorder)
//! ```
//!
//! # What is recorded: the new state, after the upstream applied it
//!
//! The paper's UCDP-O logs before-images: it reads what an update will
//! overwrite and keeps that undo log beside an upstream that holds the
//! present. Rewind records the other way round, the update itself, once the
//! upstream has said it succeeded, into a mirror that holds the present as
//! well as the past:
//! - Rewind's history runs forwards (the journal and the version index
//!   answer "the tree at T" directly); an undo log would have to be applied
//!   backwards from the upstream's present, which moves under it, and a view
//!   would depend on the upstream being up.
//! - A before-image costs an extra upstream READ on every WRITE, the
//!   overhead the paper measured UCDP-O paying; the new data is in the call.
//! - An update the upstream refuses (ACCES, EXIST, NOSPC) never enters
//!   history, and the results the mirror needs (the new object's owner) come
//!   with the reply.
//!
//! The price is a copy of the upstream's tree in Rewind (deduplicated and
//! compressed), made when the proxy first starts, and the window between the
//! upstream applying an update and the mirror recording it: a proxy crash
//! there leaves the mirror behind, so every start first brings the mirror up
//! to the upstream's present ([`Proxy::start`]: the whole tree is compared,
//! as `rsync --checksum` would), recording what differs as one more point in
//! history.
//!
//! # Handles are mapped, not trusted
//!
//! Clients get the mirror's handles (tree, inode, generation), never the
//! upstream's; the proxy keeps the map between the two, built when it
//! starts and kept as it records. A client cannot name an upstream object
//! the export does not lead to, and a handle survives a proxy restart
//! (the mirror's inodes persist; the map is rebuilt by path).
//!
//! # What passes straight through (UCDP-K's Path 0, in user space)
//!
//! Reads and other calls that change nothing (GETATTR, ACCESS, READLINK,
//! READ, READDIR, FSSTAT, FSINFO, PATHCONF) go to the upstream with only
//! their handle replaced, the call's bytes sent gathered from the client's
//! record, and the reply read into the buffer it leaves from, untouched: a
//! READ's data is never copied by the proxy. LOOKUP and READDIRPLUS replies
//! have their handles replaced. Attributes are the upstream's throughout.
//!
//! # Order
//!
//! Updates take one lock per tree from the forward to the record, so the
//! mirror applies them in the order the upstream did (two clients racing on
//! one file would otherwise leave the mirror with the other outcome); one
//! file's data updates share it with other files' and take a stripe of
//! their own. Reads and COMMITs take no lock. The mirror's records reach
//! its disk after the lock is released (the journal is one ordered log: a
//! flush covers every record before it), so one update's disk write does
//! not hold up every other's forward; a synchronous COMMIT's flush runs
//! while the upstream syncs, between sending the call and reading its
//! reply.
//!
//! # Asynchronous mode (UCDP-A)
//!
//! Synchronously (UCDP-O), an update is in history, as durably as the
//! client asked of the upstream (what RFC 1813 §1.6 makes synchronous, the
//! namespace's changes and a new size, at once; data at COMMIT or when
//! written stable; a SETATTR of attributes alone with the next of those,
//! or within the mirror's commit interval), before the client hears back. With
//! [`ProxyMode::Asynchronous`] (UCDP-A), an update is answered as soon as
//! the upstream has applied it and queued for the recorder (`recorder.rs`),
//! whose records reach the disk with the journal's next flush; the queue is
//! bounded in updates and bytes, so the lag is too.

mod mirror;
mod recorder;
pub(crate) mod reply;
pub mod upstream;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nfs3_types::nfs3::nfsstat3;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use rewind_tree::{Caller, Handle, Mirror, MirrorStatus, OpenTree, TreeError, ROOT_INODE};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

pub use recorder::ProxyMode;
use reply::Found;
use upstream::{opaque, Fattr, Pool, UpstreamAddress, UpstreamError};

use crate::args::{self, NAME_BYTES_MAX};
use crate::handle::{FileHandle, Target};
use crate::program::{Failure, PAST_NAME};
use crate::update::{is_update, Update};
use crate::xdr::XdrReader;

/// What `rewind proxy` is told.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub upstream: UpstreamAddress,
    /// The upstream export; `None`: the only one it has.
    pub export: Option<String>,
    pub mode: ProxyMode,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the mirror tree: {0}")]
    Tree(#[from] TreeError),
    #[error("{0}")]
    Setup(String),
}

impl ProxyError {
    /// Whether trying again later may succeed: the mirror's disk is full.
    fn is_transient(&self) -> bool {
        matches!(self, ProxyError::Tree(TreeError::Engine(error)) if error.is_transient())
    }
}

/// A handle in a call: where it is in the arguments, and what it names in
/// the mirror and upstream.
struct CallHandle {
    at: Range<usize>,
    mirror: Handle,
    upstream: Vec<u8>,
}

/// The map between the mirror's handles and the upstream's.
#[derive(Default)]
struct HandleMap {
    upstream_of: FxHashMap<u64, (u32, Vec<u8>)>,
    mirror_of: std::collections::HashMap<Vec<u8>, Handle>,
}

impl HandleMap {
    fn insert(&mut self, mirror: Handle, upstream: &[u8]) {
        if let Some((_, old)) = self.upstream_of.insert(mirror.ino, (mirror.generation, upstream.to_vec())) {
            if old != upstream {
                self.mirror_of.remove(&old);
            }
        }
        self.mirror_of.insert(upstream.to_vec(), mirror);
    }

    fn upstream(&self, mirror: Handle) -> Option<Vec<u8>> {
        let (generation, fh) = self.upstream_of.get(&mirror.ino)?;
        (*generation == mirror.generation).then(|| fh.clone())
    }

    fn forget(&mut self, mirror: Handle) {
        if self.upstream(mirror).is_some() {
            let (_, fh) = self.upstream_of.remove(&mirror.ino).expect("mapped");
            self.mirror_of.remove(&fh);
        }
    }
}

impl Mirror for Proxy {
    fn status(&self) -> MirrorStatus {
        let mut status = self.stats.lock().clone();
        status.lag = self.recorder.as_ref().map(recorder::Recorder::lag);
        status.in_step = !self.diverged.load(Ordering::Acquire);
        status
    }
}

/// The pauses between comparisons while the mirror is out of step.
const RESYNC_PAUSE_MIN: Duration = Duration::from_millis(100);
const RESYNC_PAUSE_MAX: Duration = Duration::from_secs(10);

struct Retry {
    at: Instant,
    pause: Duration,
}

/// Locks striping the order of one file's data updates.
const FILE_STRIPES: usize = 64;

/// The order an update holds from its forward to its record.
enum Turn<'a> {
    File {
        _order: RwLockReadGuard<'a, ()>,
        _file: MutexGuard<'a, ()>,
    },
    Namespace {
        _order: RwLockWriteGuard<'a, ()>,
    },
    /// A COMMIT changes nothing to order: the writes it covers were
    /// recorded before their replies, so before it was sent.
    Unordered,
}

/// One proxied tree.
pub struct Proxy {
    tree: Arc<OpenTree>,
    pool: Pool,
    export_root: Vec<u8>,
    handles: Mutex<HandleMap>,
    /// Held from an update's forward to its record (or queueing), so the
    /// mirror applies updates in the upstream's order: shared by updates
    /// of one file's data (with the file's stripe of `files`), exclusive for
    /// namespace changes and comparisons.
    order: RwLock<()>,
    files: Vec<Mutex<()>>,
    recorder: Option<recorder::Recorder>,
    /// An update went unrecorded: the mirror is out of step until a
    /// comparison with the upstream succeeds (`catch_up`). Updates
    /// meanwhile are forwarded and not recorded.
    diverged: AtomicBool,
    /// When to try that comparison next. It reads the whole tree, and while
    /// the mirror's disk is full it fails, so it is retried after a pause
    /// that doubles up to `RESYNC_PAUSE_MAX`, not before every update.
    retry: Mutex<Retry>,
    stats: Mutex<MirrorStatus>,
}

impl Proxy {
    /// Mounts the upstream's export, brings the mirror (`tree`) to the
    /// upstream's present, and returns the proxy, ready to serve.
    pub fn start(tree: Arc<OpenTree>, config: ProxyConfig) -> Result<Arc<Proxy>, ProxyError> {
        let pool = Pool::new(config.upstream.clone(), upstream::IDLE_KEEP);
        let export = match config.export {
            Some(export) => export,
            None => match pool.exports()?.as_slice() {
                [only] => only.clone(),
                exports => {
                    return Err(ProxyError::Setup(format!(
                        "the upstream exports {exports:?}: name the one to protect with --upstream-export"
                    )))
                }
            },
        };
        let export_root = pool.mount(&export)?;
        let stats = MirrorStatus {
            upstream: format!("{}:{export}", config.upstream.nfs),
            asynchronous: matches!(config.mode, ProxyMode::Asynchronous { .. }),
            ..MirrorStatus::default()
        };
        let proxy = Arc::new_cyclic(|proxy| Proxy {
            recorder: match config.mode {
                ProxyMode::Synchronous => None,
                ProxyMode::Asynchronous { updates_max, bytes_max } => {
                    Some(recorder::Recorder::start(proxy.clone(), updates_max, bytes_max))
                }
            },
            tree,
            pool,
            export_root,
            handles: Mutex::new(HandleMap::default()),
            order: RwLock::new(()),
            files: (0..FILE_STRIPES).map(|_| Mutex::new(())).collect(),
            diverged: AtomicBool::new(false),
            retry: Mutex::new(Retry { at: Instant::now(), pause: Duration::ZERO }),
            stats: Mutex::new(stats),
        });
        // Synchronously too: the proxy flushes after releasing its order
        // (`Proxy::update`), so one update's disk write does not hold up
        // every other's forward.
        proxy.tree.tree.record_lazily();
        let mirror: Weak<dyn Mirror> = Arc::downgrade(&proxy) as Weak<dyn Mirror>;
        if !proxy.tree.set_mirror(mirror) {
            return Err(ProxyError::Setup(format!("{} is proxied already", proxy.tree.name)));
        }
        let report = {
            let _order = proxy.order.write();
            proxy.resync()?
        };
        info!(tree = %proxy.tree.name, upstream = %proxy.stats.lock().upstream, %report, "mirror in step with the upstream");
        Ok(proxy)
    }

    pub fn tree_id(&self) -> u64 {
        self.tree.id
    }

    /// Waits until every update queued so far is recorded.
    pub fn drain(&self) {
        if let Some(recorder) = &self.recorder {
            recorder.drain();
        }
    }

    /// Whether a call's first handle is this proxy's present (and not the
    /// way into the past, `/.rewind`, which the mirror answers).
    pub(crate) fn takes(procedure: u32, arguments: &[u8]) -> Option<u64> {
        let mut reader = XdrReader::new(arguments);
        let handle = FileHandle::decode(args::handle(&mut reader).ok()?)?;
        let Target::Inode(inode) = handle.target else { return None };
        if handle.at.is_some() {
            return None;
        }
        if procedure == 3 && inode.ino == ROOT_INODE && reader.opaque(NAME_BYTES_MAX, "name").ok()? == PAST_NAME {
            return None;
        }
        Some(handle.tree)
    }

    /// Forwards one NFS call (`record`, its arguments at `at`) and leaves
    /// the reply to pass on in `out`, after 4 bytes kept for its mark.
    pub(crate) fn forward(
        &self,
        procedure: u32,
        record: &[u8],
        at: usize,
        caller: &Caller,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let arguments = &record[at..];
        let targets = self.targets(procedure, arguments)?;
        self.stats.lock().forwarded += 1;
        if is_update(procedure) {
            let update = Update::decode(procedure, &mut XdrReader::new(arguments))?;
            return self.update(update, record, at, &targets, caller, out);
        }
        self.exchange(record, at, &targets, out)?;
        if matches!(procedure, 3 | 17) {
            self.map_reply(procedure, &targets, out)?;
        }
        if procedure == 17 {
            // The client's maxcount follows the directory's handle, the
            // cookie, the cookie verifier and dircount.
            let maxcount_at = targets[0].at.end + 20;
            if let Some(maxcount) = arguments.get(maxcount_at..maxcount_at + 4) {
                let maxcount = u32::from_be_bytes(maxcount.try_into().expect("4 bytes"));
                reply::fit_listing(out, 4, maxcount).map_err(|reply::TooSmall| nfsstat3::NFS3ERR_TOOSMALL)?;
            }
        }
        Ok(())
    }

    /// The handles a call names (where they are in its arguments, the
    /// mirror's handle and the upstream's).
    fn targets(&self, procedure: u32, arguments: &[u8]) -> Result<Vec<CallHandle>, Failure> {
        let mut reader = XdrReader::new(arguments);
        let mut targets = Vec::with_capacity(2);
        for index in 0..2 {
            if index == 1 {
                match procedure {
                    14 => drop(reader.opaque(NAME_BYTES_MAX, "name")?),
                    15 => {}
                    _ => break,
                }
            }
            let start = reader.position();
            let bytes = args::handle(&mut reader)?;
            let handle = FileHandle::decode(bytes).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
            let inode = match (handle.target, handle.at) {
                (Target::Inode(inode), None) if handle.tree == self.tree.id => inode,
                (_, Some(_)) | (Target::Past, _) => return Err(nfsstat3::NFS3ERR_ROFS.into()),
                _ => return Err(nfsstat3::NFS3ERR_XDEV.into()),
            };
            let upstream = self.handles.lock().upstream(inode).ok_or(nfsstat3::NFS3ERR_STALE)?;
            targets.push(CallHandle { at: start..reader.position(), mirror: inode, upstream });
        }
        Ok(targets)
    }

    /// Sends the call with the upstream's handles in place of ours, the
    /// rest of its bytes as the client sent them.
    fn exchange(&self, record: &[u8], at: usize, targets: &[CallHandle], out: &mut Vec<u8>) -> Result<(), Failure> {
        self.exchange_doing(record, at, targets, out, &|| {})
    }

    /// As `exchange`, doing `meanwhile` while the upstream works on the
    /// call (again if a closed connection makes it send the call again).
    fn exchange_doing(
        &self,
        record: &[u8],
        at: usize,
        targets: &[CallHandle],
        out: &mut Vec<u8>,
        meanwhile: &dyn Fn(),
    ) -> Result<(), Failure> {
        let arguments = &record[at..];
        let encoded: Vec<Vec<u8>> = targets.iter().map(|target| opaque(&target.upstream)).collect();
        let mut parts: Vec<&[u8]> = vec![&record[..at]];
        let mut copied = 0;
        for (target, fh) in targets.iter().zip(&encoded) {
            parts.push(&arguments[copied..target.at.start]);
            parts.push(fh);
            copied = target.at.end;
        }
        parts.push(&arguments[copied..]);
        self.pool.with(|connection| Ok(connection.exchange_doing(&parts, out, 4, meanwhile)?)).map_err(|error| {
            warn!(%error, "upstream NFS server unreachable: the client is told to try again");
            Failure::Status(nfsstat3::NFS3ERR_JUKEBOX)
        })
    }

    /// Replaces the upstream handles in a LOOKUP or READDIRPLUS reply by
    /// the mirror's; names the mirror does not know yet (made on the
    /// upstream behind the proxy's back, or not yet recorded) are brought in.
    fn map_reply(&self, procedure: u32, targets: &[CallHandle], out: &mut Vec<u8>) -> Result<(), Failure> {
        let found = reply::handles_in(procedure, &out[4..]).map_err(|garbage| {
            warn!(reason = %garbage.0, "an upstream reply that does not decode");
            Failure::Status(nfsstat3::NFS3ERR_SERVERFAULT)
        })?;
        let (dir, dir_fh) = (targets[0].mirror, &targets[0].upstream);
        let mut ours = self.mirror_handles(&found);
        // A name the mirror does not know; not ".." of the export's root,
        // which leads out of it (its handle is left out).
        if ours.iter().zip(&found).any(|(ours, found)| ours.is_none() && !found.dots) {
            self.adopt(dir, dir_fh)?;
            ours = self.mirror_handles(&found);
        }
        // (A LOOKUP the upstream refused has no handle to follow.)
        if procedure == 3 && matches!(ours.first(), Some(None)) {
            warn!("the upstream found a name the mirror cannot follow");
            return Err(nfsstat3::NFS3ERR_SERVERFAULT.into());
        }
        let replacements: Vec<_> = found.iter().zip(ours).collect();
        reply::replace(out, 4, &replacements);
        Ok(())
    }

    fn mirror_handles(&self, found: &[reply::Found]) -> Vec<Option<Vec<u8>>> {
        let handles = self.handles.lock();
        found
            .iter()
            .map(|found| {
                let mirror = *handles.mirror_of.get(&found.fh)?;
                Some(FileHandle { tree: self.tree.id, target: Target::Inode(mirror), at: None }.encode())
            })
            .collect()
    }

    /// Brings one directory of the mirror in step with the upstream's.
    fn adopt(&self, dir: Handle, dir_fh: &[u8]) -> Result<(), Failure> {
        let _order = self.order.write();
        self.drain();
        let mut run = mirror::Resync::trusting_mapped();
        self.resync_directory(dir, dir_fh, false, &mut run).map_err(|error| {
            warn!(%error, "the mirror could not take in what the upstream has");
            // It may have taken in part: the next update compares it all.
            self.fall_out_of_step();
            // A full mirror: the client is told to try again later.
            match error.is_transient() {
                true => Failure::Status(nfsstat3::NFS3ERR_JUKEBOX),
                false => Failure::Status(nfsstat3::NFS3ERR_SERVERFAULT),
            }
        })
    }

    /// Forwards an update and records it once the upstream applied it.
    fn update(
        &self,
        update: Update<'_>,
        record: &[u8],
        at: usize,
        targets: &[CallHandle],
        caller: &Caller,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        if self.diverged.load(Ordering::Acquire) {
            self.catch_up();
        }
        // Updates of different files' data commute; everything else is
        // ordered against everything.
        let turn = match &update {
            Update::Commit { .. } => Turn::Unordered,
            Update::Write { .. } | Update::SetAttr { .. } => {
                let stripe = &self.files[(targets[0].mirror.ino % FILE_STRIPES as u64) as usize];
                Turn::File { _order: self.order.read(), _file: stripe.lock() }
            }
            _ => Turn::Namespace { _order: self.order.write() },
        };
        // A synchronous proxy's COMMIT makes the mirror durable while the
        // upstream syncs, not after: the writes it covers were recorded
        // before their replies went out, so the two flushes need not wait
        // for each other (one that was not owed, if the upstream refuses,
        // does no harm).
        let durable_meanwhile = self.recorder.is_none() && matches!(update, Update::Commit { .. });
        let meanwhile = || {
            if durable_meanwhile && !self.diverged.load(Ordering::Acquire) {
                self.make_durable(Some(targets[0].mirror));
            }
        };
        self.exchange_doing(record, at, targets, out, &meanwhile)?;
        let applied = upstream::results(&out[4..]).ok().and_then(|mut reader| reader.u32().ok()) == Some(0);
        if !applied {
            // Refused upstream: passed on as it is, nothing to record.
            return Ok(());
        }
        let made = match update.made_name() {
            Some(name) => Some(self.made(&out[4..], &targets[0].upstream, name)?),
            None => None,
        };
        let author = Caller::acting_for(caller.uid, caller.address, caller.port);
        let created = match &self.recorder {
            None => {
                let created =
                    self.record_or_resync(&update, made.as_ref().map(|(fh, fattr, _)| (&fh[..], fattr)), &author);
                drop(turn);
                // Out of step, nothing was recorded: no flush is owed, and
                // one that failed on a full disk would fail (and warn) on
                // every update until the comparison catches up.
                if update.durable_on_return() && !durable_meanwhile && !self.diverged.load(Ordering::Acquire) {
                    self.make_durable(None);
                }
                created
            }
            Some(recorder) => {
                let creates = made.is_some();
                let made_owned = made.as_ref().map(|(fh, fattr, _)| (fh.clone(), fattr.clone()));
                let ticket = recorder.submit(update.into_owned(), made_owned, author);
                drop(turn);
                if creates {
                    recorder.wait(ticket)
                } else {
                    None
                }
            }
        };
        if let Some((_, _, Some(found))) = made {
            let ours = created
                .map(|handle| FileHandle { tree: self.tree.id, target: Target::Inode(handle), at: None }.encode());
            reply::replace(out, 4, &[(&found, ours)]);
        }
        Ok(())
    }

    /// The object a CREATE, MKDIR, SYMLINK or MKNOD made upstream: its
    /// handle and attributes, and where the handle is in the reply (none
    /// there, as RFC 1813 allows: then it is looked up, and the client gets
    /// none either, and will LOOKUP).
    fn made(
        &self,
        reply: &[u8],
        dir_fh: &[u8],
        name: &[u8],
    ) -> Result<(Vec<u8>, Fattr, Option<reply::Found>), Failure> {
        let serverfault = |error: String| {
            warn!(%error, "an upstream reply to a create that does not decode");
            Failure::Status(nfsstat3::NFS3ERR_SERVERFAULT)
        };
        let found = reply::handles_in(8, reply).map_err(|garbage| serverfault(garbage.0))?.into_iter().next();
        let (fh, attributes) = match &found {
            Some(Found { fh, attributes: Some(attributes), .. }) => (fh.clone(), attributes.clone()),
            Some(Found { fh, attributes: None, .. }) => {
                (fh.clone(), self.pool.getattr(fh).map_err(|error| serverfault(error.to_string()))?)
            }
            None => self.pool.lookup(dir_fh, name).map_err(|error| serverfault(error.to_string()))?,
        };
        Ok((fh, attributes, found))
    }

    /// Makes what the mirror recorded durable (a synchronous update's
    /// record, before its reply): all of it, or for a COMMIT what it
    /// recorded of `file`. If that fails (a full disk, or a failed flush
    /// that poisoned the mirror's volume) the upstream keeps serving and the
    /// mirror is out of step.
    fn make_durable(&self, file: Option<Handle>) {
        let made = match file {
            Some(file) => self.tree.tree.commit_file(file),
            None => self.tree.tree.commit_writes(),
        };
        if let Err(error) = made {
            warn!(%error, "the mirror's records could not be made durable: it is out of step with the upstream");
            self.stats.lock().unrecorded += 1;
            self.fall_out_of_step();
        }
    }

    /// Records an update into the mirror; if it cannot be, the mirror is
    /// compared with the upstream at once (so the present is right, if not
    /// every step to it), and if that fails too it is out of step. Returns
    /// the object made, if any.
    fn record_or_resync(&self, update: &Update<'_>, made: Option<(&[u8], &Fattr)>, author: &Caller) -> Option<Handle> {
        if self.diverged.load(Ordering::Acquire) {
            // Recorded onto a mirror that lacks what it builds on, an
            // update could fail or go wrong; the comparison will take it in.
            self.stats.lock().unrecorded += 1;
            return None;
        }
        match self.record(update, made, author) {
            Ok(created) => {
                self.stats.lock().recorded += 1;
                created
            }
            Err(error) => {
                warn!(
                    ?error,
                    "an update the upstream applied could not be recorded: comparing the mirror with the upstream"
                );
                self.stats.lock().unrecorded += 1;
                if let Err(error) = self.resync() {
                    warn!(%error, "the mirror is out of step with the upstream: comparing again shortly");
                    self.fall_out_of_step();
                }
                made.and_then(|(fh, _)| self.handles.lock().mirror_of.get(fh).copied())
            }
        }
    }

    /// Marks the mirror out of step; the next comparison waits a pause that
    /// doubles with each failure.
    fn fall_out_of_step(&self) {
        let mut retry = self.retry.lock();
        retry.pause = (retry.pause * 2).clamp(RESYNC_PAUSE_MIN, RESYNC_PAUSE_MAX);
        retry.at = Instant::now() + retry.pause;
        self.diverged.store(true, Ordering::Release);
    }

    /// Compares the out-of-step mirror with the upstream, if its pause is
    /// over, ordered against every update.
    fn catch_up(&self) {
        if Instant::now() < self.retry.lock().at {
            return;
        }
        let _order = self.order.write();
        if !self.diverged.load(Ordering::Acquire) || Instant::now() < self.retry.lock().at {
            return;
        }
        self.drain();
        match self.resync() {
            Ok(report) => {
                self.diverged.store(false, Ordering::Release);
                self.retry.lock().pause = Duration::ZERO;
                info!(%report, "the mirror is in step with the upstream again");
            }
            Err(error) => {
                warn!(%error, "the mirror is still out of step with the upstream");
                self.fall_out_of_step();
            }
        }
    }
}
