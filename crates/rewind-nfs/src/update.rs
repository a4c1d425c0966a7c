//! The NFSv3 calls that change a tree, decoded once and applied to a tree:
//! by the server to the tree it serves, and by the proxy to the mirror of
//! an upstream server (after the upstream applied it, possibly later, so an
//! update can own its bytes).

use std::borrow::Cow;

use nfs3_types::nfs3::nfsstat3;
use rewind_tree::{Attributes, Caller, CreateHow, FileKind, Handle, Namespace, SetAttributes, Stability, Tree, Wcc};
use rewind_types::Timestamp;

use crate::args;
use crate::program::Failure;
use crate::xdr::{Garbage, XdrReader};

type Bytes<'a> = Cow<'a, [u8]>;

/// One change, its handles as the call gave them.
#[derive(Clone, Debug)]
pub enum Update<'a> {
    SetAttr { file: Bytes<'a>, attributes: SetAttributes, guard: Option<Timestamp> },
    Write { file: Bytes<'a>, offset: u64, data: Bytes<'a>, stability: Stability },
    Create { dir: Bytes<'a>, name: Bytes<'a>, how: CreateHow },
    Mkdir { dir: Bytes<'a>, name: Bytes<'a>, attributes: SetAttributes },
    Symlink { dir: Bytes<'a>, name: Bytes<'a>, target: Bytes<'a>, attributes: SetAttributes },
    Mknod { dir: Bytes<'a>, name: Bytes<'a>, kind: FileKind, rdev: (u32, u32), attributes: SetAttributes },
    Remove { dir: Bytes<'a>, name: Bytes<'a>, directory: bool },
    Rename { from_dir: Bytes<'a>, from_name: Bytes<'a>, to_dir: Bytes<'a>, to_name: Bytes<'a> },
    Link { file: Bytes<'a>, dir: Bytes<'a>, name: Bytes<'a> },
    Commit { file: Bytes<'a> },
}

/// What applying an update returns, for the reply.
pub enum Applied {
    /// SETATTR, WRITE, REMOVE, RMDIR, COMMIT: the one object's change.
    Changed(Wcc),
    /// CREATE, MKDIR, SYMLINK, MKNOD: the new object, and its directory's change.
    Made(Attributes, Wcc),
    Renamed(Wcc, Wcc),
    /// The file's attributes, and the directory's change.
    Linked(Attributes, Wcc),
}

/// Whether `procedure` changes a tree.
pub fn is_update(procedure: u32) -> bool {
    matches!(procedure, 2 | 7..=15 | 21)
}

fn borrowed(bytes: &[u8]) -> Bytes<'_> {
    Cow::Borrowed(bytes)
}

impl<'a> Update<'a> {
    /// Whether NFS wants the change durable before its reply: every update
    /// RFC 1813 §1.6 lists as synchronous, so all but an UNSTABLE WRITE and
    /// a SETATTR that sets no size (a COMMIT is that wish itself).
    pub fn durable_on_return(&self) -> bool {
        match self {
            Update::Write { stability, .. } => *stability != Stability::Unstable,
            Update::SetAttr { attributes, .. } => attributes.size.is_some(),
            _ => true,
        }
    }

    /// Decodes the arguments of an update procedure (`is_update`).
    pub fn decode(procedure: u32, reader: &mut XdrReader<'a>) -> Result<Update<'a>, Failure> {
        let update = match procedure {
            2 => {
                let file = borrowed(args::handle(reader)?);
                let attributes = args::set_attributes(reader)?;
                let guard = reader.bool()?.then(|| args::time(reader)).transpose()?;
                Update::SetAttr { file, attributes, guard }
            }
            7 => {
                let file = borrowed(args::handle(reader)?);
                let (offset, count) = (reader.u64()?, reader.u32()?);
                let stability = match reader.u32()? {
                    0 => Stability::Unstable,
                    1 => Stability::DataSync,
                    2 => Stability::FileSync,
                    other => return Err(Garbage(format!("stable_how {other}")).into()),
                };
                let data = reader.opaque(args::WRITE_BYTES_MAX, "data")?;
                if count as usize != data.len() {
                    reader.finish()?;
                    return Err(nfsstat3::NFS3ERR_INVAL.into());
                }
                Update::Write { file, offset, data: borrowed(data), stability }
            }
            8..=11 => {
                let (dir, name) = args::dir_name(reader)?;
                let (dir, name) = (borrowed(dir), borrowed(name));
                match procedure {
                    8 => Update::Create { dir, name, how: args::create_how(reader)? },
                    9 => Update::Mkdir { dir, name, attributes: args::set_attributes(reader)? },
                    10 => {
                        let attributes = args::set_attributes(reader)?;
                        let target = borrowed(reader.opaque(args::PATH_BYTES_MAX, "symlink target")?);
                        Update::Symlink { dir, name, target, attributes }
                    }
                    _ => {
                        let (kind, rdev, attributes) = match reader.u32()? {
                            code @ (3 | 4) => {
                                let attributes = args::set_attributes(reader)?;
                                let rdev = (reader.u32()?, reader.u32()?);
                                let kind = if code == 3 { FileKind::BlockDevice } else { FileKind::CharDevice };
                                (kind, rdev, attributes)
                            }
                            code @ (6 | 7) => {
                                let kind = if code == 6 { FileKind::Socket } else { FileKind::Fifo };
                                (kind, (0, 0), args::set_attributes(reader)?)
                            }
                            1 | 2 | 5 => return Err(nfsstat3::NFS3ERR_BADTYPE.into()),
                            other => return Err(Garbage(format!("ftype3 {other}")).into()),
                        };
                        Update::Mknod { dir, name, kind, rdev, attributes }
                    }
                }
            }
            12 | 13 => {
                let (dir, name) = args::dir_name(reader)?;
                Update::Remove { dir: borrowed(dir), name: borrowed(name), directory: procedure == 13 }
            }
            14 => {
                let (from_dir, from_name) = args::dir_name(reader)?;
                let (to_dir, to_name) = args::dir_name(reader)?;
                Update::Rename {
                    from_dir: borrowed(from_dir),
                    from_name: borrowed(from_name),
                    to_dir: borrowed(to_dir),
                    to_name: borrowed(to_name),
                }
            }
            15 => {
                let file = borrowed(args::handle(reader)?);
                let (dir, name) = args::dir_name(reader)?;
                Update::Link { file, dir: borrowed(dir), name: borrowed(name) }
            }
            21 => {
                let file = borrowed(args::handle(reader)?);
                let (_offset, _count) = (reader.u64()?, reader.u32()?);
                Update::Commit { file }
            }
            _ => unreachable!("procedure {procedure} changes nothing"),
        };
        reader.finish()?;
        Ok(update)
    }

    /// Every handle the update names, the object or directory first.
    pub fn handles(&self) -> Vec<&[u8]> {
        match self {
            Update::SetAttr { file, .. } | Update::Write { file, .. } | Update::Commit { file } => vec![file],
            Update::Create { dir, .. }
            | Update::Mkdir { dir, .. }
            | Update::Symlink { dir, .. }
            | Update::Mknod { dir, .. }
            | Update::Remove { dir, .. } => vec![dir],
            Update::Rename { from_dir, to_dir, .. } => vec![from_dir, to_dir],
            Update::Link { file, dir, .. } => vec![file, dir],
        }
    }

    /// Every name the update makes, removes or renames, with its directory.
    pub fn names(&self) -> Vec<(&[u8], &[u8])> {
        match self {
            Update::SetAttr { .. } | Update::Write { .. } | Update::Commit { .. } => vec![],
            Update::Create { dir, name, .. }
            | Update::Mkdir { dir, name, .. }
            | Update::Symlink { dir, name, .. }
            | Update::Mknod { dir, name, .. }
            | Update::Remove { dir, name, .. }
            | Update::Link { dir, name, .. } => vec![(dir.as_ref(), name.as_ref())],
            Update::Rename { from_dir, from_name, to_dir, to_name } => {
                vec![(from_dir.as_ref(), from_name.as_ref()), (to_dir.as_ref(), to_name.as_ref())]
            }
        }
    }

    /// The name of the object a CREATE, MKDIR, SYMLINK or MKNOD makes.
    pub fn made_name(&self) -> Option<&[u8]> {
        match self {
            Update::Create { name, .. }
            | Update::Mkdir { name, .. }
            | Update::Symlink { name, .. }
            | Update::Mknod { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Bytes the update holds (what a queue of them costs).
    pub fn bytes(&self) -> usize {
        match self {
            Update::Write { data, .. } => data.len(),
            _ => 0,
        }
    }

    pub fn into_owned(self) -> Update<'static> {
        fn owned(bytes: Bytes<'_>) -> Bytes<'static> {
            Cow::Owned(bytes.into_owned())
        }
        match self {
            Update::SetAttr { file, attributes, guard } => Update::SetAttr { file: owned(file), attributes, guard },
            Update::Write { file, offset, data, stability } => {
                Update::Write { file: owned(file), offset, data: owned(data), stability }
            }
            Update::Create { dir, name, how } => Update::Create { dir: owned(dir), name: owned(name), how },
            Update::Mkdir { dir, name, attributes } => Update::Mkdir { dir: owned(dir), name: owned(name), attributes },
            Update::Symlink { dir, name, target, attributes } => {
                Update::Symlink { dir: owned(dir), name: owned(name), target: owned(target), attributes }
            }
            Update::Mknod { dir, name, kind, rdev, attributes } => {
                Update::Mknod { dir: owned(dir), name: owned(name), kind, rdev, attributes }
            }
            Update::Remove { dir, name, directory } => Update::Remove { dir: owned(dir), name: owned(name), directory },
            Update::Rename { from_dir, from_name, to_dir, to_name } => Update::Rename {
                from_dir: owned(from_dir),
                from_name: owned(from_name),
                to_dir: owned(to_dir),
                to_name: owned(to_name),
            },
            Update::Link { file, dir, name } => Update::Link { file: owned(file), dir: owned(dir), name: owned(name) },
            Update::Commit { file } => Update::Commit { file: owned(file) },
        }
    }

    /// Applies the update to `tree`, its handles resolved by `resolve`.
    pub fn apply(
        &self,
        tree: &Tree,
        resolve: impl Fn(&[u8]) -> Result<Handle, Failure>,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<Applied, Failure> {
        Ok(match self {
            Update::SetAttr { file, attributes, guard } => {
                Applied::Changed(tree.setattr(resolve(file)?, attributes, *guard, caller, now)?)
            }
            Update::Write { file, offset, data, stability } => {
                Applied::Changed(tree.write(resolve(file)?, *offset, data, *stability, caller, now)?)
            }
            Update::Create { dir, name, how } => {
                let (made, change) = tree.create(resolve(dir)?, name, how, caller, now)?;
                Applied::Made(made, change)
            }
            Update::Mkdir { dir, name, attributes } => {
                let (made, change) = tree.mkdir(resolve(dir)?, name, attributes, caller, now)?;
                Applied::Made(made, change)
            }
            Update::Symlink { dir, name, target, attributes } => {
                let (made, change) = tree.symlink(resolve(dir)?, name, target, attributes, caller, now)?;
                Applied::Made(made, change)
            }
            Update::Mknod { dir, name, kind, rdev, attributes } => {
                let (made, change) = tree.mknod(resolve(dir)?, name, *kind, *rdev, attributes, caller, now)?;
                Applied::Made(made, change)
            }
            Update::Remove { dir, name, directory } => {
                Applied::Changed(tree.remove(resolve(dir)?, name, *directory, caller, now)?)
            }
            Update::Rename { from_dir, from_name, to_dir, to_name } => {
                let (from, to) = tree.rename(resolve(from_dir)?, from_name, resolve(to_dir)?, to_name, caller, now)?;
                Applied::Renamed(from, to)
            }
            Update::Link { file, dir, name } => {
                let (attributes, change) = tree.link(resolve(file)?, resolve(dir)?, name, caller, now)?;
                Applied::Linked(attributes, change)
            }
            Update::Commit { file } => {
                let file = resolve(file)?;
                let before = tree.getattr(file)?;
                tree.commit_file(file)?;
                Applied::Changed(Wcc { after: before.clone(), before })
            }
        })
    }
}
