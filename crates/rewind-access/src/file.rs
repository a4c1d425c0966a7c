//! Small files written whole: a temporary file (mode 0600, synced), renamed
//! over the old one, and the directory synced, so a crash leaves one or the
//! other.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{AccessError, Result};

/// Files here hold secrets or say who may read volumes: only the owner
/// reads them, whatever the umask.
const FILE_MODE: u32 = 0o600;

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> AccessError + '_ {
    move |source| AccessError::Io { path: path.to_owned(), source }
}

/// Reads `path`, or `None` if it does not exist.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io_error(path)(error)),
    }
}

/// Replaces `path` with `bytes`, durably.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let directory = path.parent().expect("files live in the data directory");
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = Path::new(&temporary);
    // A leftover from a crash is ours to replace; `create_new` below then
    // guarantees the mode is the one we set.
    match fs::remove_file(temporary) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error(temporary)(error)),
    }
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(temporary).map_err(io_error(temporary))?;
    file.write_all(bytes).map_err(io_error(temporary))?;
    file.sync_all().map_err(io_error(temporary))?;
    drop(file);
    fs::rename(temporary, path).map_err(io_error(path))?;
    File::open(directory).and_then(|directory| directory.sync_all()).map_err(io_error(directory))
}
