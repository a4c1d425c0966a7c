//! `rewind restore VOLUME@TIME --to PATH`: the volume as it was, written to a
//! file or a block device — sparse where the view has holes (a file keeps
//! them as holes, a device gets zeros), read and written in parallel (a few
//! threads each fetch a piece and write it), written back to the device as
//! it goes (`rewind_io::WriteBehind`), and made durable with a final sync. `--since T0` writes only the ranges that changed from
//! T0 to TIME onto a target that holds the volume as it was at T0 (MYCDP's
//! recover-to-original-disk): bytes moved = bytes changed.
//!
//! The point is resolved once to an exact time and every piece is read at
//! exactly that time: should retention drop it midway, the restore stops
//! with an error rather than mixing two points.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use rewind_io::{os_file, WriteBehind};

use crate::backend::{progress_bar, Backend, Progress};

/// The most bytes fetched at once (one API request). Measured on a 1 GiB
/// restore beside `nbdcopy` (bench/restore.py): 2, 4 and 8 MiB came out
/// alike once the target's writes overlapped; 4 MiB was best by a little.
const PIECE_BYTES: u64 = 4 << 20;
/// Threads each fetching a piece and writing it: a view is read a piece per
/// request, so one copier leaves the server's cores and the target idle in
/// turn, and one writer behind many fetchers stalls them all whenever the
/// filesystem stalls it.
const COPIERS: usize = 4;

pub struct RestoreRequest<'a> {
    pub volume: &'a str,
    pub at: &'a str,
    pub target: PathBuf,
    pub since: Option<&'a str>,
    pub force: bool,
    pub progress: Progress,
}

#[derive(Debug, Serialize)]
pub struct RestoreSummary {
    pub volume: String,
    pub at: String,
    pub at_unix_nanos: u64,
    pub target: String,
    pub block_device: bool,
    /// `--since`: the point the target held before.
    pub since: Option<String>,
    pub size_bytes: u64,
    /// Bytes read from the volume and written to the target.
    pub bytes_moved: u64,
    /// Zeros written over holes (a block device; a file keeps its holes).
    pub bytes_zeroed: u64,
    pub seconds: f64,
    pub mib_per_second: f64,
}

/// A range to write: the volume's bytes, or zeros.
#[derive(Clone, Copy, Debug)]
struct Work {
    offset: u64,
    length: u64,
    data: bool,
}

/// What the target is, checked before anything is written.
struct Target {
    file: File,
    block_device: bool,
}

pub fn restore(backend: &dyn Backend, request: RestoreRequest<'_>) -> Result<RestoreSummary> {
    let RestoreRequest { volume, at, target, since, force, progress } = request;
    let view = backend.resolve_view(volume, at)?;
    let size = backend.volume(volume)?.info.size_bytes;
    let target_file = open_target(&target, backend.data_dir().as_deref(), size, since.is_some(), force)?;
    let (work, since_at) = match since {
        Some(since) => {
            let earlier = backend.resolve_view(volume, since)?;
            let later = view.at_unix_nanos.to_string();
            let changes = backend.changes(volume, &earlier.at_unix_nanos.to_string(), Some(&later))?;
            let work =
                changes.ranges.iter().map(|range| Work { offset: range.offset, length: range.length, data: true });
            (work.collect(), Some(earlier.at))
        }
        None => (allocation(backend, volume, view.at_unix_nanos, size, target_file.block_device)?, None),
    };
    let started = Instant::now();
    let total: u64 = work.iter().map(|work| work.length).sum();
    let bar = (progress == Progress::Bar).then(|| progress_bar(total, &format!("restoring {volume}@{}", view.at)));
    let (moved, zeroed) = copy(backend, volume, view.at_unix_nanos, &work, &target_file.file, bar.as_ref())?;
    target_file.file.sync_all().with_context(|| format!("cannot make {} durable", target.display()))?;
    if !target_file.block_device {
        // A new file's name is durable once its directory is synced.
        let parent = target.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .with_context(|| format!("cannot make the directory of {} durable", target.display()))?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(RestoreSummary {
        volume: volume.to_owned(),
        at: view.at,
        at_unix_nanos: view.at_unix_nanos,
        target: target.display().to_string(),
        block_device: target_file.block_device,
        since: since_at,
        size_bytes: size,
        bytes_moved: moved,
        bytes_zeroed: zeroed,
        seconds,
        mib_per_second: (moved + zeroed) as f64 / (1 << 20) as f64 / seconds.max(1e-9),
    })
}

/// Opens `path` for the restore after the checks that keep it from doing
/// harm: not inside the data directory, not an existing file or device
/// without `--force` (a full restore), big enough, and for `--since` a
/// target that exists already.
fn open_target(path: &Path, data_dir: Option<&Path>, size: u64, since: bool, force: bool) -> Result<Target> {
    let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let resolved = parent.canonicalize().with_context(|| format!("cannot restore into {}", parent.display()))?;
    if let Some(data_dir) = data_dir.and_then(|data_dir| data_dir.canonicalize().ok()) {
        if resolved.starts_with(&data_dir) {
            bail!(
                "{} is inside the data directory {}: a restore there could overwrite Rewind's own files; \
                 choose a path outside it",
                path.display(),
                data_dir.display()
            );
        }
    }
    let existing = std::fs::metadata(path).ok();
    let block_device = existing.as_ref().is_some_and(|metadata| metadata.file_type().is_block_device());
    if existing.as_ref().is_some_and(|metadata| !metadata.is_file() && !block_device) {
        bail!("{} is neither a file nor a block device", path.display());
    }
    match (&existing, since) {
        (None, true) => bail!(
            "{} does not exist: --since writes only what changed onto a copy of the volume as it was then",
            path.display()
        ),
        (Some(_), false) if !force => {
            bail!("{} exists; pass --force to overwrite it with the volume", path.display())
        }
        _ => {}
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(existing.is_none())
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let target_bytes = match block_device {
        true => file.seek(SeekFrom::End(0))?,
        false => file.metadata()?.len(),
    };
    if (block_device || since) && target_bytes < size {
        bail!("{} holds {target_bytes} bytes, the volume {size}: too small (nothing was written)", path.display());
    }
    if !block_device && !since {
        // Holes of the view stay holes: a fresh, sparse file of the size.
        file.set_len(0)?;
        file.set_len(size)?;
    }
    Ok(Target { file, block_device })
}

/// The view's allocation as work: data ranges, and (for a device, which
/// keeps whatever it held) zeros over the holes.
fn allocation(backend: &dyn Backend, volume: &str, at: u64, size: u64, zero_holes: bool) -> Result<Vec<Work>> {
    let mut work: Vec<Work> = Vec::new();
    let mut offset = 0;
    while offset < size {
        let extents = backend.allocation(volume, at, offset, size - offset)?;
        if extents.is_empty() {
            bail!("the server reported no allocation at offset {offset}");
        }
        for extent in extents {
            if extent.allocated || zero_holes {
                match work.last_mut() {
                    Some(last) if last.data == extent.allocated && last.offset + last.length == offset => {
                        last.length += extent.length
                    }
                    _ => work.push(Work { offset, length: extent.length, data: extent.allocated }),
                }
            }
            offset += extent.length;
        }
    }
    Ok(work)
}

/// Writes `work` to `target` with `COPIERS` threads, each fetching a piece
/// of the volume and writing it where it belongs (the target's writes, like
/// the fetches, overlap: one writer would stall every fetcher whenever the
/// filesystem stalls it). Returns (bytes moved, bytes zeroed).
fn copy(
    backend: &dyn Backend,
    volume: &str,
    at: u64,
    work: &[Work],
    target: &File,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<(u64, u64)> {
    let pieces = work.iter().flat_map(|work| {
        (0..work.length.div_ceil(PIECE_BYTES)).map(move |index| {
            let offset = work.offset + index * PIECE_BYTES;
            Work { offset, length: PIECE_BYTES.min(work.offset + work.length - offset), data: work.data }
        })
    });
    let pieces = Mutex::new(pieces);
    let (sender, receiver) = mpsc::channel::<Result<Work>>();
    let failed = &AtomicBool::new(false);
    let target_io = &os_file(target.try_clone().context("cannot open the target again")?);
    std::thread::scope(|scope| {
        for _ in 0..COPIERS {
            let (sender, pieces) = (sender.clone(), &pieces);
            scope.spawn(move || {
                let mut buffer = Vec::new();
                // Written back as it goes (see `WriteBehind`): the device
                // works while pieces are fetched, and the page cache is
                // reused rather than filled with an image nobody reads.
                let mut behind = WriteBehind::new(&**target_io);
                while !failed.load(Ordering::Relaxed) {
                    let Some(piece) = pieces.lock().expect("no copier panics holding it").next() else { return };
                    buffer.resize(piece.length as usize, 0);
                    let copied = match piece.data {
                        true => backend.read(volume, at, piece.offset, &mut buffer),
                        false => {
                            buffer.fill(0);
                            Ok(())
                        }
                    }
                    .and_then(|()| target.write_all_at(&buffer, piece.offset).context("cannot write the target"))
                    .and_then(|()| behind.written(piece.offset, piece.length).context("cannot write the target"));
                    if copied.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    if sender.send(copied.map(|()| piece)).is_err() {
                        return;
                    }
                }
            });
        }
        // The copiers hold the only senders: the channel ends when they do.
        drop(sender);
        let (mut moved, mut zeroed) = (0, 0);
        for copied in receiver {
            let piece = copied?;
            match piece.data {
                true => moved += piece.length,
                false => zeroed += piece.length,
            }
            if let Some(bar) = bar {
                bar.inc(piece.length);
            }
        }
        Ok((moved, zeroed))
    })
}
