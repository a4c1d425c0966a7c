//! The MOUNT v3 program (RFC 1813, appendix I), on the NFS port: a path is
//! `/TREE`, `/TREE@TIME` (the tree as it was, read-only), or any directory
//! inside one — through `.rewind/TIME` too — as the kernel's nfsd lets
//! clients mount any directory of an export.

use std::sync::Arc;

use nfs3_types::mount::{dirpath, export_node, fhandle3, mountres3, mountres3_ok, mountstat3};
use nfs3_types::nfs3::{ftype3, nfsstat3};
use nfs3_types::xdr_codec::{List, Opaque};
use rewind_tree::{Caller, Namespace, TreeError};

use crate::args::PATH_BYTES_MAX;
use crate::handle::FileHandle;
use crate::program::{pack, status, Dispatcher, Failure, Object};
use crate::rpc::{self, Accepted};
use crate::xdr::XdrReader;
use rewind_serve::now;

pub const PROGRAM: u32 = nfs3_types::mount::PROGRAM;
pub const VERSION: u32 = 3;
/// Flavors a mount may use: AUTH_SYS.
const AUTH_FLAVORS: [u32; 1] = [1];

impl Dispatcher {
    /// Answers a MOUNT call into `out`.
    pub(crate) fn mount(&self, procedure: u32, arguments: &[u8], caller: &Caller, xid: u32, out: &mut Vec<u8>) {
        let mut reader = XdrReader::new(arguments);
        let path = match procedure {
            1 | 3 => match reader.opaque(PATH_BYTES_MAX, "path") {
                Ok(path) => Some(path),
                Err(error) => {
                    tracing::debug!(reason = %error.0, "garbage MOUNT arguments");
                    return rpc::accepted(out, xid, Accepted::GarbageArguments, (0, 0));
                }
            },
            _ => None,
        };
        if reader.finish().is_err() {
            return rpc::accepted(out, xid, Accepted::GarbageArguments, (0, 0));
        }
        match (procedure, path) {
            // NULL, UMNT (nothing is recorded, so nothing to forget), UMNTALL.
            (0, _) | (3, _) | (4, _) => rpc::accepted(out, xid, Accepted::Success, (0, 0)),
            (1, Some(path)) => {
                rpc::accepted(out, xid, Accepted::Success, (0, 0));
                let result = match self.mount_path(path, caller) {
                    Ok(handle) => mountres3::Ok(mountres3_ok {
                        fhandle: fhandle3(Opaque::owned(handle.encode())),
                        auth_flavors: AUTH_FLAVORS.to_vec(),
                    }),
                    Err(stat) => {
                        tracing::info!(path = %String::from_utf8_lossy(path), status = %stat, "mount refused");
                        mountres3::Err(stat)
                    }
                };
                pack(out, &result);
            }
            (2, _) => {
                // DUMP: mounts are not recorded (a list of none).
                rpc::accepted(out, xid, Accepted::Success, (0, 0));
                pack(out, &false);
            }
            (5, _) => {
                rpc::accepted(out, xid, Accepted::Success, (0, 0));
                let exports: Vec<export_node<'_, '_>> = self
                    .trees
                    .names()
                    .into_iter()
                    .map(|name| export_node {
                        ex_dir: dirpath(Opaque::owned(format!("/{name}").into_bytes())),
                        ex_groups: List(Vec::new()),
                    })
                    .collect();
                pack(out, &List(exports));
            }
            _ => rpc::accepted(out, xid, Accepted::ProcedureUnavailable, (0, 0)),
        }
    }

    /// The directory a mount path names.
    fn mount_path(&self, path: &[u8], caller: &Caller) -> Result<FileHandle, mountstat3> {
        let path = std::str::from_utf8(path).map_err(|_| mountstat3::MNT3ERR_NOENT)?;
        let mut components = path.split('/').filter(|component| !component.is_empty());
        let export = components.next().ok_or(mountstat3::MNT3ERR_NOENT)?;
        let (name, time) = match export.split_once('@') {
            Some((name, time)) => (name, Some(time)),
            None => (export, None),
        };
        let tree = self.trees.by_name(name, now()).map_err(mount_status)?;
        let root = tree.tree.root().map_err(mount_status)?;
        let mut object = match time {
            None => Object::Present { tree: Arc::clone(&tree), handle: root },
            Some(time) => {
                let at = tree.resolve(time, now(), &self.zone).map_err(mount_status)?;
                let view = tree.view(at, now()).map_err(mount_status)?;
                let handle = view.getattr_root().map_err(mount_status)?.handle;
                Object::Past { tree: Arc::clone(&tree), view, handle }
            }
        };
        for component in components {
            let (found, attributes) = match self.lookup_in(&object, component.as_bytes(), caller) {
                Ok(found) => found,
                Err(Failure::Status(stat)) => return Err(from_nfs(stat)),
                Err(Failure::Garbage(_)) => return Err(mountstat3::MNT3ERR_INVAL),
            };
            if attributes.type_ != ftype3::NF3DIR {
                return Err(mountstat3::MNT3ERR_NOTDIR);
            }
            object = self.object(&found.data).map_err(|_| mountstat3::MNT3ERR_NOENT)?;
        }
        Ok(object.own_handle())
    }
}

fn mount_status(error: TreeError) -> mountstat3 {
    from_nfs(status(&error))
}

fn from_nfs(status: nfsstat3) -> mountstat3 {
    match status {
        nfsstat3::NFS3ERR_NOENT | nfsstat3::NFS3ERR_STALE => mountstat3::MNT3ERR_NOENT,
        nfsstat3::NFS3ERR_ACCES => mountstat3::MNT3ERR_ACCES,
        nfsstat3::NFS3ERR_PERM => mountstat3::MNT3ERR_PERM,
        nfsstat3::NFS3ERR_NOTDIR => mountstat3::MNT3ERR_NOTDIR,
        nfsstat3::NFS3ERR_INVAL => mountstat3::MNT3ERR_INVAL,
        nfsstat3::NFS3ERR_NAMETOOLONG => mountstat3::MNT3ERR_NAMETOOLONG,
        _ => mountstat3::MNT3ERR_IO,
    }
}
