//! `rewind tree restore TREE@TIME[/PATH] --to DIR`: a file or a subtree of
//! a tree, as it was at one exact point, copied out to the local file
//! system — contents, modes, times, hard links and symlinks, and owners
//! when run as root. Special files (devices, sockets, FIFOs) are counted,
//! not made. The listing is taken first (one exact point for all of it),
//! then each file is read in pieces of at most 32 MiB.

use std::collections::HashMap;
use std::fs::{self, File, FileTimes, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rewind_http::api::{TreeEntry, TreeFileQuery, TreeListingQuery, DATA_BYTES_MAX};
use serde::Serialize;

use crate::backend::{progress_bar, Backend, Progress};

#[derive(Debug, Serialize)]
pub struct TreeRestoreSummary {
    pub tree: String,
    pub path: String,
    pub at: String,
    pub at_unix_nanos: u64,
    pub target: String,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    /// Devices, sockets and FIFOs: listed, not made.
    pub special_files_skipped: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// `TREE@TIME/PATH` (or `TREE/PATH`, `TREE@TIME`, `TREE`): the tree, the
/// time (the present if none) and the path in it.
pub fn parse_point(point: &str) -> Result<(String, Option<String>, String)> {
    let (head, path) = match point.split_once('/') {
        Some((head, path)) => (head, path.to_owned()),
        None => (point, String::new()),
    };
    let (tree, at) = rewind_serve::split_point(head);
    if tree.is_empty() {
        bail!("{point:?}: name the tree first, as in home@before-cleanup/projects");
    }
    Ok((tree.to_owned(), at.map(str::to_owned), path))
}

fn nanos_to_time(nanos: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
}

pub fn restore(backend: &dyn Backend, point: &str, target: &Path, progress: Progress) -> Result<TreeRestoreSummary> {
    let (tree, at, path) = parse_point(point)?;
    if target.exists() && fs::read_dir(target).map(|mut entries| entries.next().is_some()).unwrap_or(true) {
        bail!("{} exists and is not an empty directory: restore into a new one", target.display());
    }
    let listing = backend.tree_listing(&tree, &TreeListingQuery { path: path.clone(), at })?;
    let started = Instant::now();
    let bar = (progress == Progress::Bar)
        .then(|| progress_bar(listing.file_bytes, &format!("restoring {tree}@{}", listing.at)));
    // The listing's path itself lands at `target`, what is under it inside.
    let place = |entry: &TreeEntry| -> PathBuf {
        match entry.path.is_empty() {
            true => target.to_owned(),
            false => target.join(&entry.path),
        }
    };
    let as_root = rustix::process::geteuid().is_root();
    let mut summary = TreeRestoreSummary {
        tree: tree.clone(),
        path,
        at: listing.at.clone(),
        at_unix_nanos: listing.at_unix_nanos,
        target: target.display().to_string(),
        files: 0,
        directories: 0,
        symlinks: 0,
        hard_links: 0,
        special_files_skipped: 0,
        bytes: 0,
        seconds: 0.0,
    };
    // Where each inode with several names was put first.
    let mut linked: HashMap<u64, PathBuf> = HashMap::new();
    for entry in &listing.entries {
        let destination = place(entry);
        let what = || format!("cannot restore {}", destination.display());
        match entry.kind.as_str() {
            "directory" => {
                fs::create_dir_all(&destination).with_context(what)?;
                summary.directories += 1;
            }
            "file" => {
                if let Some(first) = linked.get(&entry.ino) {
                    fs::hard_link(first, &destination).with_context(what)?;
                    summary.hard_links += 1;
                    continue;
                }
                let file = OpenOptions::new().write(true).create_new(true).open(&destination).with_context(what)?;
                copy_file(backend, &tree, listing.at_unix_nanos, entry, &file, bar.as_ref()).with_context(what)?;
                summary.bytes += entry.size_bytes;
                summary.files += 1;
                if entry.nlink > 1 {
                    linked.insert(entry.ino, destination.clone());
                }
            }
            "symlink" => {
                symlink(entry.target.as_deref().unwrap_or_default(), &destination).with_context(what)?;
                summary.symlinks += 1;
                continue;
            }
            _ => {
                summary.special_files_skipped += 1;
                continue;
            }
        }
        if as_root {
            std::os::unix::fs::lchown(&destination, Some(entry.uid), Some(entry.gid)).with_context(what)?;
        }
    }
    // Modes and times last, deepest first: a read-only directory is filled
    // before it is made read-only, and filling it would change its times.
    for entry in listing.entries.iter().rev().filter(|entry| matches!(entry.kind.as_str(), "file" | "directory")) {
        let destination = place(entry);
        let what = || format!("cannot set the mode and times of {}", destination.display());
        let times = FileTimes::new()
            .set_accessed(nanos_to_time(entry.atime_unix_nanos))
            .set_modified(nanos_to_time(entry.mtime_unix_nanos));
        File::open(&destination).and_then(|file| file.set_times(times)).with_context(what)?;
        fs::set_permissions(&destination, fs::Permissions::from_mode(entry.mode)).with_context(what)?;
    }
    // The names, directories, modes and times durable too, not only the
    // files' bytes: one sync of the file system the target is on (a
    // directory may by now be one nobody can open to sync it alone). Of the
    // target itself, not its parent: it may be a mount point, and a target
    // the restore made is on its parent's file system anyway.
    File::open(target)
        .and_then(|target| rustix::fs::syncfs(&target).map_err(std::io::Error::from))
        .with_context(|| format!("cannot make the restore in {} durable", target.display()))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Copies one file's bytes, then makes them durable.
fn copy_file(
    backend: &dyn Backend,
    tree: &str,
    at: u64,
    entry: &TreeEntry,
    mut file: &File,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<()> {
    let mut offset = 0;
    while offset < entry.size_bytes {
        let length = (entry.size_bytes - offset).min(DATA_BYTES_MAX);
        let query = TreeFileQuery { generation: entry.generation, at, offset, length };
        let bytes = backend.tree_file(tree, entry.ino, &query)?;
        if bytes.is_empty() {
            bail!("the server had {offset} of {} bytes of {}", entry.size_bytes, entry.path);
        }
        file.write_all(&bytes)?;
        offset += bytes.len() as u64;
        if let Some(bar) = bar {
            bar.inc(bytes.len() as u64);
        }
    }
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_name_a_tree_a_time_and_a_path() {
        let point = |text: &str| parse_point(text).unwrap();
        assert_eq!(point("home"), ("home".into(), None, String::new()));
        assert_eq!(point("home@-1h/a/b"), ("home".into(), Some("-1h".into()), "a/b".into()));
        assert_eq!(point("home/a"), ("home".into(), None, "a".into()));
        assert!(parse_point("@-1h/a").is_err());
    }
}
