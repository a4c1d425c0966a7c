//! The mirror: recording the updates the upstream applied, and bringing the
//! whole tree (or one directory) in step with the upstream by comparing
//! them (`resync`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;

use rewind_tree::{
    Attributes, Caller, CreateHow, FileKind, Handle, Namespace, SetAttributes, SetTime, Stability, TreeError,
};
use rustc_hash::FxHashMap;

use super::upstream::{Entry, Fattr};
use super::{Proxy, ProxyError};
use crate::handle::{FileHandle, Target};
use crate::program::Failure;
use crate::update::{Applied, Update};

/// Bytes compared (and copied when they differ) per upstream READ.
const COMPARE_BYTES: u32 = 1 << 20;
/// Entries the mirror lists per call.
const LISTING_ENTRIES: usize = 4096;

/// What a comparison changed in the mirror.
#[derive(Default)]
pub(super) struct Resync {
    /// Upstream file id → the mirror's inode for it (hard links).
    seen: FxHashMap<u64, Handle>,
    /// Mirror inode → the upstream file id it stands for.
    claimed: FxHashMap<u64, u64>,
    /// Files the proxy has recorded all along (mapped to the upstream's
    /// handle they have) are taken as they are, not read and compared:
    /// for taking in a name met while running, not at a start.
    trust_mapped: bool,
    pub made: u64,
    pub removed: u64,
    pub rewritten_bytes: u64,
    pub compared_bytes: u64,
    pub attributes: u64,
}

impl Resync {
    /// For taking in names met while running (see `trust_mapped`).
    pub(super) fn trusting_mapped() -> Resync {
        Resync { trust_mapped: true, ..Resync::default() }
    }
}

impl fmt::Display for Resync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} objects compared, {} made, {} removed, {} of {} bytes rewritten, {} attributes set",
            self.seen.len(),
            self.made,
            self.removed,
            self.rewritten_bytes,
            self.compared_bytes,
            self.attributes
        )
    }
}

impl Proxy {
    /// The mirror's handle in a call (the proxy checked it is this tree's present).
    fn mirror_handle(bytes: &[u8]) -> Result<Handle, Failure> {
        match FileHandle::decode(bytes).map(|handle| handle.target) {
            Some(Target::Inode(handle)) => Ok(handle),
            _ => Err(Failure::Status(nfs3_types::nfs3::nfsstat3::NFS3ERR_BADHANDLE)),
        }
    }

    /// Records one update the upstream applied. `made`: the object a
    /// create made upstream (its handle and attributes). Returns the
    /// mirror's object for it.
    pub(super) fn record(
        &self,
        update: &Update<'_>,
        made: Option<(&[u8], &Fattr)>,
        author: &Caller,
    ) -> Result<Option<Handle>, Failure> {
        let tree = &self.tree.tree;
        if matches!(update, Update::Commit { .. }) {
            // The mirror records lazily (`Tree::record_lazily`): a
            // synchronous proxy flushes after the record, an asynchronous
            // one leaves it to the journal's next flush.
            return Ok(None);
        }
        // What the upstream decided is not decided again: a SETATTR's guard
        // was the upstream's ctime, a create's mode was the upstream's.
        let owned_by = |fattr: &Fattr, attributes: &SetAttributes| SetAttributes {
            mode: Some(fattr.mode),
            uid: Some(fattr.uid),
            gid: Some(fattr.gid),
            ..attributes.clone()
        };
        let adjusted = match (update, made) {
            (Update::SetAttr { file, attributes, .. }, _) => {
                Update::SetAttr { file: file.clone(), attributes: attributes.clone(), guard: None }
            }
            (Update::Create { dir, name, how }, Some((_, fattr))) => {
                let size = match how {
                    CreateHow::Unchecked(attributes) | CreateHow::Guarded(attributes) => attributes.size,
                    CreateHow::Exclusive(_) => None,
                };
                let attributes = SetAttributes { size, ..owned_by(fattr, &SetAttributes::default()) };
                Update::Create { dir: dir.clone(), name: name.clone(), how: CreateHow::Unchecked(attributes) }
            }
            (Update::Mkdir { dir, name, attributes }, Some((_, fattr))) => {
                Update::Mkdir { dir: dir.clone(), name: name.clone(), attributes: owned_by(fattr, attributes) }
            }
            (Update::Symlink { dir, name, target, attributes }, Some((_, fattr))) => Update::Symlink {
                dir: dir.clone(),
                name: name.clone(),
                target: target.clone(),
                attributes: owned_by(fattr, attributes),
            },
            (Update::Mknod { dir, name, kind, rdev, attributes }, Some((_, fattr))) => Update::Mknod {
                dir: dir.clone(),
                name: name.clone(),
                kind: *kind,
                rdev: *rdev,
                attributes: owned_by(fattr, attributes),
            },
            _ => update.clone(),
        };
        // What a REMOVE or RENAME may unlink, to forget its handle if it goes.
        let unlinked = match &adjusted {
            Update::Remove { dir, name, .. } | Update::Rename { to_dir: dir, to_name: name, .. } => {
                let dir = Proxy::mirror_handle(dir)?;
                tree.lookup(dir, name, author).ok().map(|found| found.handle)
            }
            _ => None,
        };
        let applied = adjusted.apply(tree, Proxy::mirror_handle, author, rewind_serve::now())?;
        if let Some(gone) = unlinked.filter(|&handle| tree.getattr(handle).is_err()) {
            self.handles.lock().forget(gone);
        }
        match (applied, made) {
            (Applied::Made(attributes, _), Some((fh, _))) => {
                self.handles.lock().insert(attributes.handle, fh);
                Ok(Some(attributes.handle))
            }
            _ => Ok(None),
        }
    }

    /// Who the history says made a change found by comparing: the upstream.
    fn upstream_author(&self) -> Caller {
        let (address, port) = match self.pool.address.nfs {
            SocketAddr::V4(v4) => (v4.ip().to_ipv6_mapped().octets(), v4.port()),
            SocketAddr::V6(v6) => (v6.ip().octets(), v6.port()),
        };
        Caller::root(address, port)
    }

    /// Brings the whole mirror in step with the upstream. The caller holds
    /// the order lock.
    pub(super) fn resync(&self) -> Result<Resync, ProxyError> {
        self.stats.lock().resyncs += 1;
        let root = self.tree.tree.root()?;
        self.handles.lock().insert(root, &self.export_root);
        let mut run = Resync::default();
        self.resync_directory(root, &self.export_root.clone(), true, &mut run)?;
        let attributes = self.pool.getattr(&self.export_root)?;
        self.settle(root, &attributes, &mut run)?;
        self.tree.tree.commit_writes()?;
        Ok(run)
    }

    /// Brings directory `dir` (the upstream's `fh`) in step: names only the
    /// mirror has go, names only the upstream has are made, and what both
    /// have is compared (kind, contents, attributes), into subdirectories
    /// when `recursive`. Depth first, in the order a recursion would take,
    /// on a stack of its own: an upstream's tree can be deeper than a
    /// thread's stack.
    pub(super) fn resync_directory(
        &self,
        dir: Handle,
        fh: &[u8],
        recursive: bool,
        run: &mut Resync,
    ) -> Result<(), ProxyError> {
        let mut steps = vec![Step::Directory { dir, fh: fh.to_vec() }];
        while let Some(step) = steps.pop() {
            match step {
                Step::Directory { dir, fh } => {
                    let upstream = self.pool.list(&fh)?;
                    let mut mirror = self.mirror_entries(dir)?;
                    let wanted: HashSet<&[u8]> = upstream.iter().map(|entry| &entry.name[..]).collect();
                    let extra: Vec<Vec<u8>> =
                        mirror.keys().filter(|name| !wanted.contains(&name[..])).cloned().collect();
                    for name in extra {
                        let entry = mirror.remove(&name).expect("listed");
                        self.remove_subtree(dir, &name, &entry, run)?;
                    }
                    // Reversed, so that they come off the stack in order.
                    for entry in upstream.into_iter().rev() {
                        let mirrored = mirror.remove(&entry.name);
                        steps.push(Step::Entry { dir, entry, mirrored });
                    }
                }
                Step::Entry { dir, entry, mirrored } => {
                    let Entry { name, fh: entry_fh, attributes: fattr } = entry;
                    let existing = mirrored.as_ref().filter(|existing| {
                        existing.kind == fattr.kind
                            && run.seen.get(&fattr.fileid).is_none_or(|&linked| linked == existing.handle)
                            && run.claimed.get(&existing.handle.ino).is_none_or(|&fileid| fileid == fattr.fileid)
                    });
                    let handle = match existing {
                        Some(existing) => existing.handle,
                        None => {
                            if let Some(stale) = &mirrored {
                                self.remove_subtree(dir, &name, stale, run)?;
                            }
                            self.make_like(dir, &name, &entry_fh, &fattr, run)?
                        }
                    };
                    let first_sight = run.seen.insert(fattr.fileid, handle).is_none();
                    run.claimed.insert(handle.ino, fattr.fileid);
                    let known = self.handles.lock().mirror_of.get(&entry_fh) == Some(&handle);
                    if known && run.trust_mapped {
                        continue;
                    }
                    match fattr.kind {
                        FileKind::Regular if first_sight => {
                            self.compare_contents(handle, &entry_fh, fattr.size, run)?
                        }
                        FileKind::Directory if recursive => {
                            // Settled and mapped once what is under it is.
                            steps.push(Step::Settle { handle, fh: entry_fh.clone(), fattr });
                            steps.push(Step::Directory { dir: handle, fh: entry_fh });
                            continue;
                        }
                        _ => {}
                    }
                    self.settle_and_map(handle, &entry_fh, &fattr, run)?;
                }
                Step::Settle { handle, fh, fattr } => self.settle_and_map(handle, &fh, &fattr, run)?,
            }
        }
        Ok(())
    }

    /// Gives `handle` the upstream's attributes, then maps it to `fh`:
    /// mapped only once taken in whole, so a run that fails before (a full
    /// disk) leaves it to be compared again, not trusted.
    fn settle_and_map(&self, handle: Handle, fh: &[u8], fattr: &Fattr, run: &mut Resync) -> Result<(), ProxyError> {
        self.settle(handle, fattr, run)?;
        self.handles.lock().insert(handle, fh);
        Ok(())
    }

    /// The mirror's entries of `dir` but "." and "..", by name.
    fn mirror_entries(&self, dir: Handle) -> Result<HashMap<Vec<u8>, Attributes>, TreeError> {
        let (mut entries, mut cookie) = (HashMap::new(), 0);
        let caller = Caller::root([0; 16], 0);
        loop {
            let listing = self.tree.tree.readdir(dir, cookie, LISTING_ENTRIES, &caller)?;
            for entry in listing.entries {
                cookie = entry.cookie;
                if entry.name != b"." && entry.name != b".." {
                    entries.insert(entry.name, entry.attributes);
                }
            }
            if listing.eof {
                return Ok(entries);
            }
        }
    }

    /// Removes `name` from the mirror's `dir`, and what is under it first,
    /// on a stack of its own (see `resync_directory`).
    fn remove_subtree(&self, dir: Handle, name: &[u8], entry: &Attributes, run: &mut Resync) -> Result<(), TreeError> {
        // (directory, name, what it is, whether what is under it is gone)
        let mut steps = vec![(dir, name.to_vec(), entry.clone(), false)];
        while let Some((dir, name, entry, emptied)) = steps.pop() {
            let is_directory = entry.kind == FileKind::Directory;
            if is_directory && !emptied {
                let children = self.mirror_entries(entry.handle)?;
                steps.push((dir, name, entry.clone(), true));
                steps.extend(children.into_iter().map(|(child, attributes)| (entry.handle, child, attributes, false)));
                continue;
            }
            self.tree.tree.remove(dir, &name, is_directory, &self.upstream_author(), rewind_serve::now())?;
            if self.tree.tree.getattr(entry.handle).is_err() {
                self.handles.lock().forget(entry.handle);
            }
            run.removed += 1;
        }
        Ok(())
    }

    /// Makes in the mirror what the upstream has at `name` (a hard link to
    /// a file already seen in this comparison, when it is one).
    fn make_like(
        &self,
        dir: Handle,
        name: &[u8],
        fh: &[u8],
        fattr: &Fattr,
        run: &mut Resync,
    ) -> Result<Handle, ProxyError> {
        let (tree, author, now) = (&self.tree.tree, self.upstream_author(), rewind_serve::now());
        run.made += 1;
        if let Some(&linked) = run.seen.get(&fattr.fileid).filter(|_| fattr.kind != FileKind::Directory) {
            tree.link(linked, dir, name, &author, now)?;
            return Ok(linked);
        }
        let attributes = SetAttributes {
            mode: Some(fattr.mode),
            uid: Some(fattr.uid),
            gid: Some(fattr.gid),
            ..SetAttributes::default()
        };
        let (made, _) = match fattr.kind {
            FileKind::Regular => tree.create(dir, name, &CreateHow::Guarded(attributes), &author, now)?,
            FileKind::Directory => tree.mkdir(dir, name, &attributes, &author, now)?,
            FileKind::Symlink => tree.symlink(dir, name, &self.pool.readlink(fh)?, &attributes, &author, now)?,
            kind => tree.mknod(dir, name, kind, fattr.rdev, &attributes, &author, now)?,
        };
        Ok(made.handle)
    }

    /// Makes the mirror's file hold what the upstream's does, reading both
    /// and writing only the pieces that differ.
    fn compare_contents(&self, file: Handle, fh: &[u8], size: u64, run: &mut Resync) -> Result<(), ProxyError> {
        let (tree, author) = (&self.tree.tree, self.upstream_author());
        if tree.getattr(file)?.size > size {
            let truncate = SetAttributes { size: Some(size), ..SetAttributes::default() };
            tree.setattr(file, &truncate, None, &author, rewind_serve::now())?;
        }
        let mut offset = 0;
        while offset < size {
            let (theirs, eof) = self.pool.read(fh, offset, COMPARE_BYTES)?;
            if theirs.is_empty() {
                break;
            }
            let (ours, _) = tree.read(file, offset, theirs.len() as u32, &author)?;
            run.compared_bytes += theirs.len() as u64;
            if ours != theirs {
                tree.write(file, offset, &theirs, Stability::Unstable, &author, rewind_serve::now())?;
                run.rewritten_bytes += theirs.len() as u64;
            }
            offset += theirs.len() as u64;
            if eof {
                break;
            }
        }
        Ok(())
    }

    /// Gives the mirror's object the upstream's mode, owner, size and times
    /// where they differ.
    fn settle(&self, handle: Handle, fattr: &Fattr, run: &mut Resync) -> Result<(), TreeError> {
        let tree = &self.tree.tree;
        let ours = tree.getattr(handle)?;
        // Sizes agree already (`compare_contents`).
        if (ours.mode, ours.uid, ours.gid, ours.mtime) == (fattr.mode, fattr.uid, fattr.gid, fattr.mtime) {
            return Ok(());
        }
        let attributes = SetAttributes {
            mode: Some(fattr.mode),
            uid: Some(fattr.uid),
            gid: Some(fattr.gid),
            size: None,
            atime: Some(SetTime::Client(fattr.atime)),
            mtime: Some(SetTime::Client(fattr.mtime)),
        };
        tree.setattr(handle, &attributes, None, &self.upstream_author(), rewind_serve::now())?;
        run.attributes += 1;
        Ok(())
    }
}

/// A piece of `Proxy::resync_directory`'s walk.
enum Step {
    /// List a directory and compare its names.
    Directory { dir: Handle, fh: Vec<u8> },
    /// Bring one of its entries in step (`mirrored`: the mirror's entry of that name).
    Entry { dir: Handle, entry: Entry, mirrored: Option<Attributes> },
    /// Settle a directory once what is under it is in step.
    Settle { handle: Handle, fh: Vec<u8>, fattr: Fattr },
}
