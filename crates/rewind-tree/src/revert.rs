//! Putting one file or directory of a tree back as it was, the rest of the
//! tree untouched: what is at the path now is removed, and what was there
//! at the chosen time is copied back in (contents, modes, owners, times,
//! symlinks, devices, and hard links within it). Nothing is lost: the
//! state just before is kept by history and bookmarked, so reverting to
//! that bookmark undoes it.
//!
//! Each step is one operation of the tree (one compound write), so a crash
//! part-way leaves the path half put back — never a damaged tree — and
//! running the same revert again finishes it.

use rustc_hash::FxHashMap;

use rewind_types::{BookmarkName, Timestamp};

use crate::history::walk;
use crate::{
    Attributes, Caller, CreateHow, FileKind, Handle, Namespace, SetAttributes, SetTime, Stability, Tree, TreeError,
    TreeView,
};

/// What a revert did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevertReport {
    /// The tree just before the revert: a bookmark names it, and reverting
    /// the path to it undoes this one.
    pub before: Timestamp,
    pub bookmark: String,
    pub removed: u64,
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
}

/// Pieces a file is copied in.
const COPY_BYTES: u32 = 1 << 20;

impl Tree {
    /// Puts `path` (from the root, `/`-separated; "" for the whole tree)
    /// back as it was in `past`. If it did not exist then, it is removed.
    /// `caller` is who the changes are recorded as made by.
    pub fn revert_path(
        &self,
        path: &str,
        past: &TreeView,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<RevertReport, TreeError> {
        let before = self.changed_at();
        let bookmark = format!("before-revert-{}", before.unix_nanos());
        let name = BookmarkName::new(&bookmark).map_err(|error| TreeError::Invalid(error.to_string()))?;
        self.volume().create_bookmark(name, Some(before), now)?;
        let mut report = RevertReport { before, bookmark, ..RevertReport::default() };
        let components: Vec<&str> = path.split('/').filter(|name| !name.is_empty() && *name != ".").collect();
        let mut copier = Copier { tree: self, past, caller, now, links: FxHashMap::default(), report: &mut report };
        match components.split_last() {
            None => {
                // The whole tree: the root's names, then its attributes.
                let root = self.getattr_root()?;
                for name in copier.names(self, root.handle)? {
                    copier.remove(root.handle, &name)?;
                }
                let then = past.getattr_root()?;
                for name in copier.names(past, then.handle)? {
                    let child = past.lookup(then.handle, &name, caller)?;
                    copier.copy(&child, root.handle, &name)?;
                }
                copier.set_attributes(root.handle, &then)?;
            }
            Some((name, parents)) => {
                let parent = walk(self, &parents.join("/")).map_err(|error| match error {
                    TreeError::NotFound => TreeError::Invalid(format!(
                        "{} is not in the tree now: revert the directory that holds it",
                        parents.join("/")
                    )),
                    error => error,
                })?;
                let name = name.as_bytes();
                match self.lookup(parent.handle, name, caller) {
                    Ok(_) => copier.remove(parent.handle, name)?,
                    Err(TreeError::NotFound) => {}
                    Err(error) => return Err(error),
                }
                match walk(past, path) {
                    Ok(then) => copier.copy(&then, parent.handle, name)?,
                    Err(TreeError::NotFound) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(report)
    }
}

/// What is left of a copy.
enum Step {
    Copy { then: Attributes, dir: Handle, name: Vec<u8> },
    SetAttributes { made: Handle, then: Attributes },
}

struct Copier<'a> {
    tree: &'a Tree,
    past: &'a TreeView,
    caller: &'a Caller,
    now: Timestamp,
    /// Files with several names copied so far: their inode then → now.
    links: FxHashMap<u64, Handle>,
    report: &'a mut RevertReport,
}

impl Copier<'_> {
    /// The names in a directory (not "." and "..").
    fn names(&self, namespace: &dyn Namespace, dir: Handle) -> Result<Vec<Vec<u8>>, TreeError> {
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let page = namespace.readdir(dir, cookie, 1024, self.caller)?;
            for entry in page.entries {
                cookie = entry.cookie;
                if entry.name != b"." && entry.name != b".." {
                    names.push(entry.name);
                }
            }
            if page.eof {
                return Ok(names);
            }
        }
    }

    /// Removes `name` from `dir`, a directory with everything in it. Depth
    /// first on a stack of its own, not the thread's: a client can nest
    /// directories deeper than a thread's stack would go.
    fn remove(&mut self, dir: Handle, name: &[u8]) -> Result<(), TreeError> {
        // (directory, name, whether what it holds is gone already)
        let mut stack = vec![(dir, name.to_vec(), false)];
        while let Some((dir, name, emptied)) = stack.pop() {
            let found = self.tree.lookup(dir, &name, self.caller)?;
            let directory = found.kind == FileKind::Directory;
            if directory && !emptied {
                stack.push((dir, name, true));
                for child in self.names(self.tree, found.handle)? {
                    stack.push((found.handle, child, false));
                }
                continue;
            }
            self.tree.remove(dir, &name, directory, self.caller, self.now)?;
            self.report.removed += 1;
        }
        Ok(())
    }

    /// Copies `then` (an object of the past) to `name` in `dir` (present),
    /// depth first on a stack of its own (see `remove`). A directory's
    /// attributes are set once what it holds is copied (its times would
    /// change otherwise).
    fn copy(&mut self, then: &Attributes, dir: Handle, name: &[u8]) -> Result<(), TreeError> {
        let mut steps = vec![Step::Copy { then: then.clone(), dir, name: name.to_vec() }];
        while let Some(step) = steps.pop() {
            match step {
                Step::Copy { then, dir, name } => self.copy_one(then, dir, &name, &mut steps)?,
                Step::SetAttributes { made, then } => self.set_attributes(made, &then)?,
            }
        }
        Ok(())
    }

    /// Makes `name` in `dir` as `then` is; pushes what is left to do.
    fn copy_one(&mut self, then: Attributes, dir: Handle, name: &[u8], steps: &mut Vec<Step>) -> Result<(), TreeError> {
        let mode = SetAttributes { mode: Some(then.mode), ..SetAttributes::default() };
        let made = match then.kind {
            FileKind::Directory => {
                let (made, _) = self.tree.mkdir(dir, name, &mode, self.caller, self.now)?;
                let children = self.names(self.past, then.handle)?;
                steps.push(Step::SetAttributes { made: made.handle, then: then.clone() });
                // Reversed onto the stack: copied in the order listed.
                for child in children.into_iter().rev() {
                    let child_then = self.past.lookup(then.handle, &child, self.caller)?;
                    steps.push(Step::Copy { then: child_then, dir: made.handle, name: child });
                }
                self.report.directories += 1;
                return Ok(());
            }
            FileKind::Regular => {
                if let Some(&first) = self.links.get(&then.handle.ino) {
                    self.tree.link(first, dir, name, self.caller, self.now)?;
                    return Ok(());
                }
                let (made, _) = self.tree.create(dir, name, &CreateHow::Guarded(mode), self.caller, self.now)?;
                let mut offset = 0;
                while offset < then.size {
                    let (bytes, _) = self.past.read(then.handle, offset, COPY_BYTES, self.caller)?;
                    if bytes.is_empty() {
                        break;
                    }
                    // Zeros stay holes: the size below makes them.
                    if bytes.iter().any(|&byte| byte != 0) {
                        self.tree.write(made.handle, offset, &bytes, Stability::Unstable, self.caller, self.now)?;
                    }
                    offset += bytes.len() as u64;
                }
                self.report.files += 1;
                self.report.bytes += then.size;
                if then.nlink > 1 {
                    self.links.insert(then.handle.ino, made.handle);
                }
                made
            }
            FileKind::Symlink => {
                let target = self.past.readlink(then.handle)?;
                self.tree.symlink(dir, name, &target, &mode, self.caller, self.now)?.0
            }
            kind => self.tree.mknod(dir, name, kind, then.rdev, &mode, self.caller, self.now)?.0,
        };
        self.set_attributes(made.handle, &then)
    }

    /// Gives `handle` the owner, size (of a file) and times of `then`.
    fn set_attributes(&mut self, handle: Handle, then: &Attributes) -> Result<(), TreeError> {
        let attributes = SetAttributes {
            mode: Some(then.mode),
            uid: Some(then.uid),
            gid: Some(then.gid),
            size: (then.kind == FileKind::Regular).then_some(then.size),
            atime: Some(SetTime::Client(then.atime)),
            mtime: Some(SetTime::Client(then.mtime)),
        };
        self.tree.setattr(handle, &attributes, None, self.caller, self.now)?;
        Ok(())
    }
}
