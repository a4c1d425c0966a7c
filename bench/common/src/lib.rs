//! Shared by Rewind's benchmark binaries (`bench/index`, `bench/chunks`).

pub mod measure;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};

/// Marks a data directory as a benchmark's, so `--dir` never removes
/// anything else.
const MARKER_FILE: &str = ".rewind-bench";

/// A count written plainly or in scientific notation (`1e7`).
pub fn parse_count(text: &str) -> Result<u64, String> {
    if let Ok(count) = text.parse::<u64>() {
        return Ok(count);
    }
    let value: f64 = text.parse().map_err(|_| format!("{text:?} is not a count"))?;
    if value.fract() != 0.0 || !(0.0..=9e18).contains(&value) {
        return Err(format!("{text:?} is not a whole, non-negative count"));
    }
    Ok(value as u64)
}

/// A benchmark's data directory: created empty, removed when dropped.
pub struct DataDir {
    path: PathBuf,
}

impl DataDir {
    pub fn fresh(path: &Path) -> anyhow::Result<DataDir> {
        if path.exists() {
            let marked = path.join(MARKER_FILE).exists();
            let empty = fs::read_dir(path)?.next().is_none();
            ensure!(
                marked || empty,
                "{} exists and is not a benchmark's (no {MARKER_FILE}); not removing it",
                path.display()
            );
            fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))?;
        }
        fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        fs::write(path.join(MARKER_FILE), b"a Rewind benchmark's data directory\n")?;
        Ok(DataDir { path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if let Err(error) = fs::remove_dir_all(&self.path) {
            eprintln!("warning: could not remove {}: {error}", self.path.display());
        }
    }
}
