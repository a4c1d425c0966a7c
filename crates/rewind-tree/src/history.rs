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
    /// `limit`. Each is shown by the view at its time; with a granularity,
    /// a version is seen at the end of its window, so `at` is that end.
    pub fn history(&self, handle: Handle, limit: usize) -> Result<Vec<FileVersion>, TreeError> {
        let times = self.volume().version_times(inode_block(handle.ino), limit)?;
        let mut versions: Vec<FileVersion> = Vec::with_capacity(times.len());
        for time in times {
            let view = TreeView::new(self.volume().view(time)?);
            let inode = view.inode(handle.ino)?;
            if inode.kind.is_none() || inode.generation != handle.generation {
                // Before this file was made (its number was another's).
                break;
            }
            let version = FileVersion { at: view.at(), attributes: Attributes::of(&inode) };
            if versions.last().is_none_or(|last| last.at != version.at) {
                versions.push(version);
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
