//! One file's history: every version of its inode, each the file as a
//! change left it (size, times, owner, and who changed it).

use rewind_format::tree::inode_block;
use rewind_types::Timestamp;

use crate::namespace::Store;
use crate::{Attributes, Caller, Handle, Namespace, Tree, TreeError, TreeView};

/// The file as one change left it, and the point in time that shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileVersion {
    pub at: Timestamp,
    pub attributes: Attributes,
}

impl Tree {
    /// The versions of what `handle` names (this incarnation of its inode,
    /// not what the inode number held before), newest first, at most
    /// `limit`. With a granularity, a version is seen from the end of its
    /// window on, so `at` is that end: for the newest version, in a window
    /// still open, a time to come (its attributes are the present's).
    pub fn history(&self, handle: Handle, limit: usize) -> Result<Vec<FileVersion>, TreeError> {
        let volume = self.volume();
        let times = volume.version_times(inode_block(handle.ino), limit)?;
        let granularity = volume.granularity_nanos();
        let mut versions: Vec<FileVersion> = Vec::with_capacity(times.len());
        for time in times {
            let seen_from = match granularity {
                0 => time,
                window => Timestamp::from_unix_nanos((time.unix_nanos() / window + 1).saturating_mul(window) - 1),
            };
            let (at, inode) = match seen_from > volume.timestamp_last() {
                true => (seen_from, self.inode(handle.ino)?),
                false => {
                    let view = TreeView::new(volume.view(seen_from)?);
                    (view.at(), view.inode(handle.ino)?)
                }
            };
            if inode.kind.is_none() || inode.generation != handle.generation {
                // Before this file was made (its number was another's).
                break;
            }
            if versions.last().is_none_or(|last| last.at != at) {
                versions.push(FileVersion { at, attributes: Attributes::of(&inode) });
            }
        }
        Ok(versions)
    }
}

/// The attributes of `path` (names joined by `/`, from the root; empty for
/// the root), walked as root: for administrative tools, not clients.
pub fn walk(namespace: &dyn Namespace, path: &str) -> Result<Attributes, TreeError> {
    let root = Caller::root([0; 16], 0);
    let mut attributes = namespace.getattr_root()?;
    for name in path.split('/').filter(|name| !name.is_empty() && *name != ".") {
        attributes = namespace.lookup(attributes.handle, name.as_bytes(), &root)?;
    }
    Ok(attributes)
}
