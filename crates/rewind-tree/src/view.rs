//! A tree as it was: the same format read from the volume's view at T.
//! Nothing in it changes, so what its caches hold stays true.

use std::sync::Arc;

use parking_lot::Mutex;
use rewind_engine::View;
use rewind_format::tree::Inode;
use rewind_types::Timestamp;

use crate::namespace::{load_directory, load_inode, Directory, Store};
use crate::present::{Bounded, DIRECTORIES_CACHED_MAX, INODES_CACHED_MAX};
use crate::TreeError;

/// A read-only tree at one point in time (see [`crate::Namespace`]).
pub struct TreeView {
    view: View,
    inodes: Mutex<Bounded<Inode>>,
    directories: Mutex<Bounded<Arc<Directory>>>,
}

impl TreeView {
    pub(crate) fn new(view: View) -> TreeView {
        TreeView {
            view,
            inodes: Mutex::new(Bounded::new(INODES_CACHED_MAX)),
            directories: Mutex::new(Bounded::new(DIRECTORIES_CACHED_MAX)),
        }
    }

    /// The exact time it shows.
    pub fn at(&self) -> Timestamp {
        self.view.at()
    }
}

impl Store for TreeView {
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), TreeError> {
        Ok(self.view.read(offset, buf)?)
    }

    fn inode(&self, ino: u64) -> Result<Inode, TreeError> {
        if let Some(inode) = self.inodes.lock().map.get(&ino) {
            return Ok(inode.clone());
        }
        let inode = load_inode(self, ino)?;
        self.inodes.lock().insert(ino, inode.clone());
        Ok(inode)
    }

    fn directory(&self, dir: &Inode) -> Result<Arc<Directory>, TreeError> {
        if let Some(directory) = self.directories.lock().map.get(&dir.ino) {
            return Ok(Arc::clone(directory));
        }
        let directory = Arc::new(load_directory(self, dir)?);
        self.directories.lock().insert(dir.ino, Arc::clone(&directory));
        Ok(directory)
    }

    fn writable(&self) -> bool {
        false
    }

    fn at_one_moment<R>(&self, read: impl FnOnce(&dyn Store) -> R) -> R {
        read(self)
    }
}
