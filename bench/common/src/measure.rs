//! What the benchmark reads from the OS and how it summarises latencies.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};

/// Latency distribution of one batch of lookups, in nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    pub count: u64,
    pub ns_mean: u64,
    pub ns_p50: u64,
    pub ns_p99: u64,
    pub ns_p999: u64,
    pub ns_max: u64,
}

impl Latency {
    pub fn of(mut samples_ns: Vec<u64>) -> Latency {
        if samples_ns.is_empty() {
            return Latency::default();
        }
        samples_ns.sort_unstable();
        let count = samples_ns.len();
        let at = |quantile: f64| samples_ns[((quantile * count as f64).ceil() as usize).clamp(1, count) - 1];
        Latency {
            count: count as u64,
            ns_mean: samples_ns.iter().sum::<u64>() / count as u64,
            ns_p50: at(0.50),
            ns_p99: at(0.99),
            ns_p999: at(0.999),
            ns_max: samples_ns[count - 1],
        }
    }

    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "ns_mean": self.ns_mean,
            "ns_p50": self.ns_p50,
            "ns_p99": self.ns_p99,
            "ns_p999": self.ns_p999,
            "ns_max": self.ns_max,
        })
    }
}

/// Resident memory of this process, from `/proc/self/status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Resident {
    pub rss_bytes: u64,
    /// Peak RSS since the process started.
    pub hwm_bytes: u64,
}

pub fn resident() -> anyhow::Result<Resident> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|line| line.starts_with(name))
            .with_context(|| format!("no {name} in /proc/self/status"))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse()?;
        Ok(kib * 1024)
    };
    Ok(Resident { rss_bytes: field("VmRSS:")?, hwm_bytes: field("VmHWM:")? })
}

/// Bytes this process passed to read and write system calls
/// (`/proc/self/io` `rchar`/`wchar`), and bytes it made the kernel fetch from
/// the storage device (`read_bytes`: reads the OS page cache did not serve),
/// or zeros where the kernel hides them.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoCounters {
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub device_read_bytes: u64,
}

impl IoCounters {
    pub fn since(self, earlier: IoCounters) -> IoCounters {
        IoCounters {
            read_bytes: self.read_bytes - earlier.read_bytes,
            written_bytes: self.written_bytes - earlier.written_bytes,
            device_read_bytes: self.device_read_bytes - earlier.device_read_bytes,
        }
    }
}

pub fn io_counters() -> IoCounters {
    let Ok(text) = fs::read_to_string("/proc/self/io") else {
        return IoCounters::default();
    };
    let field = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)).and_then(|rest| rest.trim().parse().ok()).unwrap_or(0)
    };
    IoCounters { read_bytes: field("rchar:"), written_bytes: field("wchar:"), device_read_bytes: field("read_bytes:") }
}

/// Resets VmHWM to the current RSS (`echo 5 > /proc/self/clear_refs`), so
/// the next reading is the peak since now. Returns whether the kernel allowed it.
pub fn reset_peak_resident() -> bool {
    fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// Apparent (sum of lengths) and allocated bytes of the files below `dir`.
#[derive(Clone, Debug, Default)]
pub struct DiskUsage {
    pub file_count: u64,
    pub apparent_bytes: u64,
    pub allocated_bytes: u64,
    /// Sizes of the `*.run` files in name order, which is oldest first.
    pub run_file_bytes: Vec<u64>,
}

pub fn disk_usage(dir: &Path) -> anyhow::Result<DiskUsage> {
    let mut usage = DiskUsage::default();
    let mut runs = Vec::new();
    // The index directory is flat; one level of subdirectories is enough here.
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry?;
            let metadata = entry.metadata()?;
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                usage.file_count += 1;
                usage.apparent_bytes += metadata.len();
                usage.allocated_bytes += metadata.blocks() * 512;
                if entry.file_name().to_string_lossy().ends_with(".run") {
                    runs.push((entry.file_name(), metadata.len()));
                }
            }
        }
    }
    runs.sort();
    usage.run_file_bytes = runs.into_iter().map(|(_, size_bytes)| size_bytes).collect();
    Ok(usage)
}

/// How the OS page cache was emptied before a cold measurement.
#[derive(Clone, Debug)]
pub enum CacheDrop {
    /// `echo 1 > /proc/sys/vm/drop_caches` worked: every clean page is gone.
    DropCaches,
    /// It did not (the reason is kept); `posix_fadvise(DONTNEED)` on each file
    /// below the index directory was used instead.
    Fadvise { drop_caches_error: String, files: u64 },
}

impl CacheDrop {
    pub fn describe(&self) -> String {
        match self {
            CacheDrop::DropCaches => "drop_caches=1 ok".to_owned(),
            CacheDrop::Fadvise { drop_caches_error, files } => {
                format!("drop_caches failed ({drop_caches_error}); fadvise DONTNEED on {files} files")
            }
        }
    }
}

/// Evicts the files below `dir` from the OS page cache, as well as this
/// process can.
pub fn drop_os_cache(dir: &Path) -> anyhow::Result<CacheDrop> {
    rustix::fs::sync();
    let attempt =
        fs::OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").and_then(|mut file| file.write_all(b"1\n"));
    let drop_caches_error = match attempt {
        Ok(()) => return Ok(CacheDrop::DropCaches),
        Err(error) => error.to_string(),
    };
    let mut files = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let file = fs::File::open(entry.path())?;
            rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)?;
            files += 1;
        }
    }
    Ok(CacheDrop::Fadvise { drop_caches_error, files })
}

/// Sequential write bandwidth of the disk under `dir`, for the bound: writes
/// `size_bytes` in 1 MiB `pwrite`s, then `fdatasync`, like a run is written.
pub fn disk_write_bytes_per_second(dir: &Path, size_bytes: u64) -> anyhow::Result<f64> {
    const CHUNK_BYTES: u64 = 1 << 20;
    let path = dir.join("bandwidth-probe");
    let file = fs::OpenOptions::new().create_new(true).write(true).open(&path)?;
    // Not zeros: some layers compress or deduplicate them.
    let chunk: Vec<u8> = (0..CHUNK_BYTES).map(|index| ((index * 2_654_435_761) >> 13) as u8).collect();
    let start = Instant::now();
    let mut offset = 0;
    while offset < size_bytes {
        file.write_all_at(&chunk, offset)?;
        offset += CHUNK_BYTES;
    }
    file.sync_data()?;
    let seconds = start.elapsed().as_secs_f64();
    drop(file);
    fs::remove_file(&path)?;
    Ok(offset as f64 / seconds)
}

/// Reads every file below `dir` once, so that the OS page cache holds the
/// whole index (as far as memory allows) before the warm measurements.
/// Returns the bytes read.
pub fn warm_os_cache(dir: &Path) -> anyhow::Result<u64> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let file = fs::File::open(entry.path())?;
        let mut offset = 0;
        loop {
            let read = file.read_at(&mut buffer, offset)?;
            if read == 0 {
                break;
            }
            offset += read as u64;
        }
        total += offset;
    }
    Ok(total)
}
