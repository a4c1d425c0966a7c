//! The NFSv3 program (RFC 1813): each call's arguments decoded, the tree
//! asked, the results encoded with `nfs3_types`.
//!
//! # The past as directories
//!
//! `/.rewind` under a tree's root is a directory of its own (a handle of
//! kind `Past`), not stored anywhere: LOOKUP of a name in it — a bookmark
//! or any time Rewind accepts, percent-decoded — resolves the name to an
//! exact point of the tree's history and answers the root of the tree as it
//! was then (a handle carrying that time); READDIR lists the bookmarks.
//! READDIR of the root does not list `.rewind` (as `.zfs` is not), but
//! LOOKUP finds it. Everything under a time is read-only (NFS3ERR_ROFS).

use std::sync::Arc;

use nfs3_types::nfs3::{
    cookieverf3, dirlist3, dirlistplus3, entry3, entryplus3, fattr3, filename3, ftype3, nfs_fh3, nfsstat3, nfstime3,
    specdata3, stable_how, wcc_attr, wcc_data, writeverf3, ACCESS3resok, COMMIT3resok, CREATE3resok, FSINFO3resok,
    FSSTAT3resok, GETATTR3resok, LINK3resok, LOOKUP3resok, Nfs3Option, PATHCONF3resok, READ3resok, READDIR3resok,
    READDIRPLUS3resok, READLINK3resok, RENAME3resok, SETATTR3resok, WRITE3resok, FSF3_CANSETTIME, FSF3_HOMOGENEOUS,
    FSF3_LINK, FSF3_SYMLINK,
};
use nfs3_types::xdr_codec::{List, Opaque, Pack};
use rewind_tree::{
    Access, Attributes, Caller, FileKind, Handle, Namespace, Stability, TreeError, TreeView, Wcc, FILE_BYTES_MAX,
    NAME_BYTES_MAX, ROOT_INODE,
};
use rewind_types::Timestamp;

use crate::args;
use crate::handle::{FileHandle, Target};
use crate::proxy::Proxy;
use crate::rpc::{self, Accepted};
use crate::update::{self, Applied, Update};
use crate::xdr::{Garbage, XdrReader};
use jiff::tz::TimeZone;
use rewind_serve::now;
use rewind_tree::{OpenTree, Trees};
use rustc_hash::FxHashMap;

pub const PROGRAM: u32 = nfs3_types::nfs3::PROGRAM;
pub const VERSION: u32 = 3;
/// The name of the past under every tree's root.
pub const PAST_NAME: &[u8] = b".rewind";
/// The file id of `/.rewind`: above every inode number.
const PAST_FILE_ID: u64 = u64::MAX - 1;
/// Reads and writes of up to 1 MiB (FSINFO).
const TRANSFER_BYTES_MAX: u32 = 1 << 20;
/// Entries a READDIR looks at, whatever the client's count.
const DIRECTORY_ENTRIES_MAX: usize = 4096;

/// One entry of a listing: cookie, name, attributes, handle.
type Entry = (u64, Vec<u8>, fattr3, Option<nfs_fh3>);

/// What a handle resolved to.
pub(crate) enum Object {
    Present {
        tree: Arc<OpenTree>,
        handle: Handle,
    },
    Past {
        tree: Arc<OpenTree>,
        view: Arc<TreeView>,
        handle: Handle,
    },
    /// The tree's `/.rewind`.
    Directory {
        tree: Arc<OpenTree>,
    },
}

impl Object {
    pub(crate) fn tree(&self) -> &Arc<OpenTree> {
        match self {
            Object::Present { tree, .. } | Object::Past { tree, .. } | Object::Directory { tree } => tree,
        }
    }

    fn namespace(&self) -> Option<(&dyn Namespace, Handle)> {
        match self {
            Object::Present { tree, handle } => Some((&tree.tree as &dyn Namespace, *handle)),
            Object::Past { view, handle, .. } => Some((&**view as &dyn Namespace, *handle)),
            Object::Directory { .. } => None,
        }
    }

    fn at(&self) -> Option<Timestamp> {
        match self {
            Object::Past { view, .. } => Some(view.at()),
            _ => None,
        }
    }

    /// Each point in time is a file system of its own to clients.
    fn fsid(&self) -> u64 {
        self.tree().id ^ self.at().map_or(0, Timestamp::unix_nanos)
    }

    /// The handle of this object itself.
    pub(crate) fn own_handle(&self) -> FileHandle {
        let target = match self {
            Object::Present { handle, .. } | Object::Past { handle, .. } => Target::Inode(*handle),
            Object::Directory { .. } => Target::Past,
        };
        FileHandle { tree: self.tree().id, target, at: self.at() }
    }

    pub(crate) fn file_handle(&self, handle: Handle) -> nfs_fh3 {
        let target = Target::Inode(handle);
        fh(FileHandle { tree: self.tree().id, target, at: self.at() })
    }

    /// The attributes of what the handle names.
    fn attributes(&self) -> Result<fattr3, TreeError> {
        match self.namespace() {
            Some((namespace, handle)) => Ok(fattr(&namespace.getattr(handle)?, self.fsid())),
            None => {
                let root = self.tree().tree.getattr(self.tree().tree.root()?)?;
                Ok(past_attributes(&root, self.fsid()))
            }
        }
    }

    fn post_op(&self) -> Nfs3Option<fattr3> {
        self.attributes().map_or(Nfs3Option::None, Nfs3Option::Some)
    }
}

fn fh(handle: FileHandle) -> nfs_fh3 {
    nfs_fh3 { data: Opaque::owned(handle.encode()) }
}

fn nfs_time(time: Timestamp) -> nfstime3 {
    let nanos = time.unix_nanos();
    nfstime3 {
        seconds: u32::try_from(nanos / 1_000_000_000).unwrap_or(u32::MAX),
        nseconds: (nanos % 1_000_000_000) as u32,
    }
}

fn ftype(kind: FileKind) -> ftype3 {
    match kind {
        FileKind::Regular => ftype3::NF3REG,
        FileKind::Directory => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::CharDevice => ftype3::NF3CHR,
        FileKind::BlockDevice => ftype3::NF3BLK,
        FileKind::Socket => ftype3::NF3SOCK,
        FileKind::Fifo => ftype3::NF3FIFO,
    }
}

fn fattr(attributes: &Attributes, fsid: u64) -> fattr3 {
    fattr3 {
        type_: ftype(attributes.kind),
        mode: attributes.mode,
        nlink: attributes.nlink,
        uid: attributes.uid,
        gid: attributes.gid,
        size: attributes.size,
        used: attributes.used_bytes,
        rdev: specdata3 { specdata1: attributes.rdev.0, specdata2: attributes.rdev.1 },
        fsid,
        fileid: attributes.handle.ino,
        atime: nfs_time(attributes.atime),
        mtime: nfs_time(attributes.mtime),
        ctime: nfs_time(attributes.ctime),
    }
}

/// `/.rewind`: read-only, owned by root, its times the root's.
fn past_attributes(root: &Attributes, fsid: u64) -> fattr3 {
    fattr3 {
        type_: ftype3::NF3DIR,
        mode: 0o555,
        nlink: 2,
        uid: 0,
        gid: 0,
        size: 4096,
        used: 4096,
        rdev: specdata3::default(),
        fsid,
        fileid: PAST_FILE_ID,
        atime: nfs_time(root.atime),
        mtime: nfs_time(root.mtime),
        ctime: nfs_time(root.ctime),
    }
}

fn wcc(change: &Wcc, fsid: u64) -> wcc_data {
    let before = &change.before;
    wcc_data {
        before: Nfs3Option::Some(wcc_attr {
            size: before.size,
            mtime: nfs_time(before.mtime),
            ctime: nfs_time(before.ctime),
        }),
        after: Nfs3Option::Some(fattr(&change.after, fsid)),
    }
}

/// The protocol's error for a tree's.
pub(crate) fn status(error: &TreeError) -> nfsstat3 {
    use rewind_engine::EngineError;
    match error {
        TreeError::NotFound => nfsstat3::NFS3ERR_NOENT,
        TreeError::Exists => nfsstat3::NFS3ERR_EXIST,
        TreeError::NotDirectory => nfsstat3::NFS3ERR_NOTDIR,
        TreeError::IsDirectory => nfsstat3::NFS3ERR_ISDIR,
        TreeError::NotEmpty => nfsstat3::NFS3ERR_NOTEMPTY,
        TreeError::NameTooLong(_) => nfsstat3::NFS3ERR_NAMETOOLONG,
        TreeError::Invalid(_) | TreeError::NotSymlink => nfsstat3::NFS3ERR_INVAL,
        TreeError::Stale => nfsstat3::NFS3ERR_STALE,
        TreeError::FileTooLarge => nfsstat3::NFS3ERR_FBIG,
        TreeError::NoInodes => nfsstat3::NFS3ERR_NOSPC,
        TreeError::ReadOnly => nfsstat3::NFS3ERR_ROFS,
        TreeError::AccessDenied => nfsstat3::NFS3ERR_ACCES,
        TreeError::NotPermitted => nfsstat3::NFS3ERR_PERM,
        TreeError::NotSync => nfsstat3::NFS3ERR_NOT_SYNC,
        TreeError::Engine(EngineError::NoSpace { .. }) => nfsstat3::NFS3ERR_NOSPC,
        TreeError::Engine(
            EngineError::BeforeHistory { .. }
            | EngineError::HistoryDeleted { .. }
            | EngineError::HistoryExpired { .. }
            | EngineError::InFuture { .. }
            | EngineError::BookmarkNotFound { .. }
            | EngineError::TimeSpec(_),
        ) => nfsstat3::NFS3ERR_NOENT,
        TreeError::Engine(EngineError::InvalidArgument(_)) => nfsstat3::NFS3ERR_INVAL,
        _ => nfsstat3::NFS3ERR_IO,
    }
}

/// Why a call got no results: an NFS status (with the procedure's failure
/// body), or arguments that did not decode.
#[derive(Debug)]
pub(crate) enum Failure {
    Status(nfsstat3),
    Garbage(Garbage),
}

impl From<Garbage> for Failure {
    fn from(garbage: Garbage) -> Self {
        Failure::Garbage(garbage)
    }
}

impl From<TreeError> for Failure {
    fn from(error: TreeError) -> Self {
        if matches!(error, TreeError::Damaged(_) | TreeError::Engine(_)) {
            tracing::warn!(%error, "NFS call failed");
        }
        Failure::Status(status(&error))
    }
}

impl From<nfsstat3> for Failure {
    fn from(status: nfsstat3) -> Self {
        Failure::Status(status)
    }
}

/// Serves the NFS and MOUNT programs for the node's trees.
pub struct Dispatcher {
    pub(crate) trees: Arc<Trees>,
    /// For local times in `.rewind` names.
    pub(crate) zone: TimeZone,
    /// WRITE and COMMIT's verifier: a new one each time the server starts,
    /// so clients resend unstable writes a crash may have lost.
    verifier: writeverf3,
    /// Trees whose present is an upstream server's, by tree id.
    proxies: FxHashMap<u64, Arc<Proxy>>,
}

impl Dispatcher {
    pub fn new(trees: Arc<Trees>, proxies: &[Arc<Proxy>]) -> Dispatcher {
        Dispatcher {
            trees,
            zone: TimeZone::system(),
            verifier: writeverf3(now().unix_nanos().to_be_bytes()),
            proxies: proxies.iter().map(|proxy| (proxy.tree_id(), Arc::clone(proxy))).collect(),
        }
    }

    /// The proxy that forwards a call, if its first handle is the present
    /// of a proxied tree.
    pub(crate) fn proxy_for(&self, procedure: u32, arguments: &[u8]) -> Option<&Arc<Proxy>> {
        if procedure == 0 || self.proxies.is_empty() {
            return None;
        }
        self.proxies.get(&Proxy::takes(procedure, arguments)?)
    }

    /// Resolves a handle from a call.
    pub(crate) fn object(&self, bytes: &[u8]) -> Result<Object, Failure> {
        let handle = FileHandle::decode(bytes).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
        let tree = self.trees.by_id(handle.tree, now())?;
        Ok(match (handle.target, handle.at) {
            (Target::Past, _) => Object::Directory { tree },
            (Target::Inode(inode), None) => Object::Present { tree, handle: inode },
            (Target::Inode(inode), Some(at)) => {
                // A time no longer kept is as gone as a removed file.
                let view = tree.view(at, now()).map_err(|_| nfsstat3::NFS3ERR_STALE)?;
                Object::Past { tree, view, handle: inode }
            }
        })
    }

    /// A present inode to change, or ROFS for the past.
    fn present(&self, bytes: &[u8]) -> Result<(Arc<OpenTree>, Handle), Failure> {
        match self.object(bytes)? {
            Object::Present { tree, handle } => Ok((tree, handle)),
            Object::Past { .. } | Object::Directory { .. } => Err(nfsstat3::NFS3ERR_ROFS.into()),
        }
    }

    /// Answers an NFS call into `out` (accepted, success or a status).
    pub(crate) fn nfs(&self, procedure: u32, arguments: &[u8], caller: &Caller, xid: u32, out: &mut Vec<u8>) {
        let mut reader = XdrReader::new(arguments);
        let result = match procedure {
            0 => Ok(Vec::new()),
            1 => self.getattr(&mut reader),
            3 => self.lookup(&mut reader, caller),
            4 => self.access(&mut reader, caller),
            5 => self.readlink(&mut reader),
            6 => self.read(&mut reader, caller),
            16 | 17 => self.readdir(procedure == 17, &mut reader, caller),
            18 => self.fsstat(&mut reader),
            19 => self.fsinfo(&mut reader),
            20 => self.pathconf(&mut reader),
            procedure if update::is_update(procedure) => self.update(procedure, &mut reader, caller),
            _ => {
                rpc::accepted(out, xid, Accepted::ProcedureUnavailable, (0, 0));
                return;
            }
        };
        reply(out, xid, procedure, result);
    }

    fn getattr(&self, reader: &mut XdrReader<'_>) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        reader.finish()?;
        Ok(packed(&GETATTR3resok { obj_attributes: object.attributes()? }))
    }

    /// SETATTR, WRITE, CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME,
    /// LINK and COMMIT.
    fn update(&self, procedure: u32, reader: &mut XdrReader<'_>, caller: &Caller) -> Result<Vec<u8>, Failure> {
        let update = Update::decode(procedure, reader)?;
        let (tree, _) = self.present(update.handles()[0])?;
        let past_named = |dir: &[u8], name: &[u8]| {
            name == PAST_NAME && self.present(dir).is_ok_and(|(_, dir)| dir.ino == ROOT_INODE)
        };
        // `/.rewind` is there, read-only: it cannot be removed or renamed,
        // and nothing else can take its name.
        if update.names().into_iter().any(|(dir, name)| past_named(dir, name)) {
            return Err(match &update {
                Update::Remove { .. } | Update::Rename { .. } => nfsstat3::NFS3ERR_ROFS,
                _ => nfsstat3::NFS3ERR_EXIST,
            }
            .into());
        }
        let resolve = |bytes: &[u8]| {
            let (other, handle) = self.present(bytes)?;
            match other.id == tree.id {
                true => Ok(handle),
                false => Err(Failure::Status(nfsstat3::NFS3ERR_XDEV)),
            }
        };
        let applied = update.apply(&tree.tree, resolve, caller, now())?;
        let id = tree.id;
        Ok(match (&update, applied) {
            (Update::SetAttr { .. }, Applied::Changed(change)) => packed(&SETATTR3resok { obj_wcc: wcc(&change, id) }),
            (Update::Write { data, stability, .. }, Applied::Changed(change)) => {
                let committed = match stability {
                    Stability::Unstable => stable_how::UNSTABLE,
                    // Both are made durable with the file's attributes (FUA).
                    Stability::DataSync | Stability::FileSync => stable_how::FILE_SYNC,
                };
                let count = data.len() as u32;
                packed(&WRITE3resok { file_wcc: wcc(&change, id), count, committed, verf: self.verifier })
            }
            (_, Applied::Made(attributes, change)) => {
                let handle = fh(FileHandle { tree: id, target: Target::Inode(attributes.handle), at: None });
                packed(&CREATE3resok {
                    obj: Nfs3Option::Some(handle),
                    obj_attributes: Nfs3Option::Some(fattr(&attributes, id)),
                    dir_wcc: wcc(&change, id),
                })
            }
            // REMOVE3resok and RMDIR3resok are both one wcc_data.
            (Update::Remove { .. }, Applied::Changed(change)) => packed(&wcc(&change, id)),
            (_, Applied::Renamed(from, to)) => {
                packed(&RENAME3resok { fromdir_wcc: wcc(&from, id), todir_wcc: wcc(&to, id) })
            }
            (_, Applied::Linked(attributes, change)) => packed(&LINK3resok {
                file_attributes: Nfs3Option::Some(fattr(&attributes, id)),
                linkdir_wcc: wcc(&change, id),
            }),
            (Update::Commit { .. }, Applied::Changed(change)) => {
                packed(&COMMIT3resok { file_wcc: wcc(&change, id), verf: self.verifier })
            }
            _ => unreachable!("each update has its own result"),
        })
    }

    fn lookup(&self, reader: &mut XdrReader<'_>, caller: &Caller) -> Result<Vec<u8>, Failure> {
        let (dir, name) = args::dir_name(reader)?;
        reader.finish()?;
        let dir = self.object(dir)?;
        let (object, attributes) = self.lookup_in(&dir, name, caller)?;
        Ok(packed(&LOOKUP3resok {
            object,
            obj_attributes: Nfs3Option::Some(attributes),
            dir_attributes: dir.post_op(),
        }))
    }

    /// `name` in `dir`, with `/.rewind` and its times.
    pub(crate) fn lookup_in(&self, dir: &Object, name: &[u8], caller: &Caller) -> Result<(nfs_fh3, fattr3), Failure> {
        let tree = dir.tree();
        let past_directory = || {
            let object = Object::Directory { tree: Arc::clone(tree) };
            Ok::<_, Failure>((fh(FileHandle { tree: tree.id, target: Target::Past, at: None }), object.attributes()?))
        };
        match dir {
            Object::Directory { tree } => match name {
                b"." => past_directory(),
                b".." => {
                    let root = Object::Present { tree: Arc::clone(tree), handle: tree.tree.root()? };
                    Ok((root.file_handle(tree.tree.root()?), root.attributes()?))
                }
                _ => {
                    let text = std::str::from_utf8(name).map_err(|_| nfsstat3::NFS3ERR_NOENT)?;
                    let at = tree.resolve(text, now(), &self.zone)?;
                    let view = tree.view(at, now())?;
                    let handle = view.getattr_root()?.handle;
                    let object = Object::Past { tree: Arc::clone(tree), view, handle };
                    Ok((object.file_handle(handle), object.attributes()?))
                }
            },
            Object::Present { handle, .. } if name == PAST_NAME && handle.ino == ROOT_INODE => past_directory(),
            Object::Past { handle, .. } if name == b".." && handle.ino == ROOT_INODE => past_directory(),
            _ => {
                let (namespace, handle) = dir.namespace().expect("not the past directory");
                let found = namespace.lookup(handle, name, caller)?;
                Ok((dir.file_handle(found.handle), fattr(&found, dir.fsid())))
            }
        }
    }

    fn access(&self, reader: &mut XdrReader<'_>, caller: &Caller) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        let wanted = reader.u32()?;
        reader.finish()?;
        let access = match object.namespace() {
            Some((namespace, handle)) => namespace.access(handle, caller, wanted)?,
            None => wanted & (Access::READ | Access::LOOKUP | Access::EXECUTE),
        };
        Ok(packed(&ACCESS3resok { obj_attributes: object.post_op(), access }))
    }

    fn readlink(&self, reader: &mut XdrReader<'_>) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        reader.finish()?;
        let (namespace, handle) = object.namespace().ok_or(nfsstat3::NFS3ERR_INVAL)?;
        let target = namespace.readlink(handle)?;
        let data = nfs3_types::nfs3::nfspath3(Opaque::owned(target));
        Ok(packed(&READLINK3resok { symlink_attributes: object.post_op(), data }))
    }

    fn read(&self, reader: &mut XdrReader<'_>, caller: &Caller) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        let (offset, count) = (reader.u64()?, reader.u32()?);
        reader.finish()?;
        let (namespace, handle) = object.namespace().ok_or(nfsstat3::NFS3ERR_ISDIR)?;
        let (data, eof) = namespace.read(handle, offset, count.min(TRANSFER_BYTES_MAX), caller)?;
        let count = data.len() as u32;
        Ok(packed(&READ3resok { file_attributes: object.post_op(), count, eof, data: Opaque::owned(data) }))
    }

    /// READDIR and READDIRPLUS: entries until the client's byte counts.
    fn readdir(&self, plus: bool, reader: &mut XdrReader<'_>, caller: &Caller) -> Result<Vec<u8>, Failure> {
        let dir = self.object(args::handle(reader)?)?;
        let cookie = reader.u64()?;
        let _verifier = reader.fixed::<8>("cookie verifier")?;
        let dircount = reader.u32()?;
        let maxcount = if plus { reader.u32()? } else { dircount };
        reader.finish()?;
        let dir_attributes = dir.attributes()?;
        let verifier = cookieverf3(u64::from(dir_attributes.mtime.seconds).to_be_bytes());
        let (entries, eof) = self.entries(&dir, cookie, caller)?;
        // Room for the fixed part of the reply; each entry then counts its size.
        let mut room = (maxcount as usize).saturating_sub(128).min(TRANSFER_BYTES_MAX as usize);
        let mut taken = 0;
        let mut plain = Vec::new();
        let mut full = Vec::new();
        for (cookie, name, attributes, handle) in entries.iter().cloned() {
            let name = filename3(Opaque::owned(name));
            let size = match plus {
                true => {
                    let entry = entryplus3 {
                        fileid: attributes.fileid,
                        name,
                        cookie,
                        name_attributes: Nfs3Option::Some(attributes),
                        name_handle: handle.map_or(Nfs3Option::None, Nfs3Option::Some),
                    };
                    let size = entry.packed_size() + 4;
                    if size <= room {
                        full.push(entry);
                    }
                    size
                }
                false => {
                    let entry = entry3 { fileid: attributes.fileid, name, cookie };
                    let size = entry.packed_size() + 4;
                    if size <= room {
                        plain.push(entry);
                    }
                    size
                }
            };
            if size > room {
                break;
            }
            room -= size;
            taken += 1;
        }
        if taken == 0 && !entries.is_empty() {
            return Err(nfsstat3::NFS3ERR_TOOSMALL.into());
        }
        let eof = eof && taken == entries.len();
        let dir_attributes = Nfs3Option::Some(dir_attributes);
        Ok(match plus {
            true => packed(&READDIRPLUS3resok {
                dir_attributes,
                cookieverf: verifier,
                reply: dirlistplus3 { entries: List(full), eof },
            }),
            false => packed(&READDIR3resok {
                dir_attributes,
                cookieverf: verifier,
                reply: dirlist3 { entries: List(plain), eof },
            }),
        })
    }

    /// The listing of `dir` after `cookie`: cookie, name, attributes and
    /// handle of each entry, and whether it is the end.
    fn entries(&self, dir: &Object, cookie: u64, caller: &Caller) -> Result<(Vec<Entry>, bool), Failure> {
        let fsid = dir.fsid();
        let tree = dir.tree();
        let past_directory = || -> Result<(fattr3, nfs_fh3), Failure> {
            let object = Object::Directory { tree: Arc::clone(tree) };
            Ok((object.attributes()?, fh(FileHandle { tree: tree.id, target: Target::Past, at: None })))
        };
        match dir.namespace() {
            Some((namespace, handle)) => {
                let listing = namespace.readdir(handle, cookie, DIRECTORY_ENTRIES_MAX, caller)?;
                let mut entries = Vec::with_capacity(listing.entries.len());
                for entry in listing.entries {
                    let (attributes, handle) = match dir {
                        // The past's root has `/.rewind` for "..".
                        Object::Past { .. } if handle.ino == ROOT_INODE && entry.name == b".." => past_directory()?,
                        _ => (fattr(&entry.attributes, fsid), dir.file_handle(entry.attributes.handle)),
                    };
                    entries.push((entry.cookie, entry.name, attributes, Some(handle)));
                }
                Ok((entries, listing.eof))
            }
            None => {
                let (own, own_handle) = past_directory()?;
                let root = Object::Present { tree: Arc::clone(tree), handle: tree.tree.root()? };
                let root_handle = root.file_handle(tree.tree.root()?);
                let mut entries = vec![
                    (1, b".".to_vec(), own, Some(own_handle)),
                    (2, b"..".to_vec(), root.attributes()?, Some(root_handle)),
                ];
                for (index, bookmark) in tree.tree.volume().bookmarks().iter().enumerate() {
                    // (A bookmark whose point retention has dropped is not listed.)
                    let Ok(view) = tree.view(bookmark.timestamp, now()) else { continue };
                    let Ok(attributes) = view.getattr_root() else { continue };
                    let object = Object::Past { tree: Arc::clone(tree), view, handle: attributes.handle };
                    let entry_handle = object.file_handle(attributes.handle);
                    let name = bookmark.name.as_str().as_bytes().to_vec();
                    entries.push((3 + index as u64, name, fattr(&attributes, object.fsid()), Some(entry_handle)));
                }
                entries.retain(|entry| entry.0 > cookie);
                Ok((entries, true))
            }
        }
    }

    fn fsstat(&self, reader: &mut XdrReader<'_>) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        reader.finish()?;
        let space = self.trees.node().space();
        let (used, max) = object.tree().tree.inode_counts();
        Ok(packed(&FSSTAT3resok {
            obj_attributes: object.post_op(),
            tbytes: space.total_bytes,
            fbytes: space.free_bytes,
            abytes: space.free_bytes.saturating_sub(space.reserve_bytes),
            tfiles: max,
            ffiles: max - used,
            afiles: max - used,
            invarsec: 0,
        }))
    }

    fn fsinfo(&self, reader: &mut XdrReader<'_>) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        reader.finish()?;
        Ok(packed(&FSINFO3resok {
            obj_attributes: object.post_op(),
            rtmax: TRANSFER_BYTES_MAX,
            rtpref: TRANSFER_BYTES_MAX,
            rtmult: 4096,
            wtmax: TRANSFER_BYTES_MAX,
            wtpref: TRANSFER_BYTES_MAX,
            wtmult: 4096,
            dtpref: 64 << 10,
            maxfilesize: FILE_BYTES_MAX,
            time_delta: nfstime3 { seconds: 0, nseconds: 1 },
            properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
        }))
    }

    fn pathconf(&self, reader: &mut XdrReader<'_>) -> Result<Vec<u8>, Failure> {
        let object = self.object(args::handle(reader)?)?;
        reader.finish()?;
        Ok(packed(&PATHCONF3resok {
            obj_attributes: object.post_op(),
            linkmax: u32::MAX,
            name_max: NAME_BYTES_MAX as u32,
            no_trunc: true,
            chown_restricted: true,
            case_insensitive: false,
            case_preserving: true,
        }))
    }
}

/// Encodes a call's outcome as its reply into `out`.
pub(crate) fn reply(out: &mut Vec<u8>, xid: u32, procedure: u32, result: Result<Vec<u8>, Failure>) {
    match result {
        Ok(results) => {
            rpc::accepted(out, xid, Accepted::Success, (0, 0));
            if procedure != 0 {
                pack(out, &nfsstat3::NFS3_OK);
            }
            out.extend_from_slice(&results);
        }
        Err(Failure::Garbage(Garbage(reason))) => {
            tracing::debug!(procedure, %reason, "garbage arguments");
            rpc::accepted(out, xid, Accepted::GarbageArguments, (0, 0));
        }
        Err(Failure::Status(status)) => {
            rpc::accepted(out, xid, Accepted::Success, (0, 0));
            pack(out, &status);
            // Every failure body starts with post-op attributes or wcc
            // data, all optional: "not sent" is always a valid body
            // (RENAME's has two).
            let absent_words = match procedure {
                1 => 0,
                14 => 4,
                15 => 3,
                2 | 7..=13 | 21 => 2,
                _ => 1,
            };
            out.extend(std::iter::repeat_n(0u8, 4 * absent_words));
        }
    }
}

pub(crate) fn pack(out: &mut Vec<u8>, value: &impl Pack) {
    value.pack(out).expect("packing into a Vec cannot fail");
}

pub(crate) fn packed(value: &impl Pack) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.packed_size());
    pack(&mut out, value);
    out
}
