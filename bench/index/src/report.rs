//! The human-readable table (metrics down, stages across) and the JSON lines.

use rewind_index::IndexConfig;
use serde_json::{json, Value};

use crate::workload::{BLOCK_BYTES, RECORD_BLOCKS_MAX, RECORD_INTERVAL_NANOS};
use crate::{BaselineStage, Lookups, StageReport};

/// Bytes of one index entry on disk (`rewind_format::index::ENTRY_BYTES`).
const ENTRY_BYTES: f64 = 32.0;

pub struct Config {
    pub blocks: u64,
    pub memtable_versions_max: u64,
    pub page_cache_bytes: u64,
    pub seed: u64,
    pub dir: String,
    pub index_config: IndexConfig,
}

/// Where output goes: with `--json`, stdout carries only JSON lines and
/// everything for humans goes to stderr.
pub struct Out {
    json: bool,
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json }
    }

    fn human(&self, text: &str) {
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    pub fn progress(&self, text: &str) {
        eprintln!("[index-bench] {text}");
    }

    pub fn header(&self, config: &Config) {
        self.human(&format!(
            "Version index microbenchmark (rewind-index on OsStorage at {dir})\n\
             workload: volume of {blocks} blocks x {block_bytes} B ({volume}); each journal record writes \
             1-{record_max} consecutive blocks at a uniformly random position\n\
             \x20         (40% 1 block, 30% 2-8, 30% 9-16: mean 5.65), all versions of a record share one time, \
             records {interval} ns apart; seed {seed}\n\
             index: IndexConfig {{ merge_fanin: {fanin}, runs_soft_max: {base} }}, page cache {cache}, \
             seal at {memtable} versions, then persist + compact until idle (inline, single thread)",
            dir = config.dir,
            blocks = config.blocks,
            block_bytes = BLOCK_BYTES,
            volume = bytes(config.blocks * BLOCK_BYTES),
            record_max = RECORD_BLOCKS_MAX,
            interval = RECORD_INTERVAL_NANOS,
            seed = config.seed,
            fanin = config.index_config.merge_fanin,
            base = config.index_config.runs_soft_max,
            cache = bytes(config.page_cache_bytes),
            memtable = config.memtable_versions_max,
        ));
    }

    pub fn finish(&self, config: &Config, stages: &[StageReport], seconds_wall: f64) {
        self.human(&table(stages));
        for stage in stages {
            let sizes: Vec<String> = stage
                .disk
                .run_file_bytes
                .iter()
                .map(|&size| format!("{:.0}", size as f64 / (1u64 << 20) as f64))
                .collect();
            self.human(&format!(
                "runs at stage {} (MiB, oldest first; ~32 MiB per 2^20 versions): [{}]",
                count(stage.target),
                sizes.join(" ")
            ));
        }
        self.human(&format!("wall time {seconds_wall:.1} s"));
        if self.json {
            for stage in stages {
                println!("{}", stage.to_json(config));
            }
        }
    }
}

pub fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

pub fn count_f(value: f64) -> String {
    count(value.round() as u64)
}

pub fn bytes(value: u64) -> String {
    let value = value as f64;
    if value >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", value / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", value / (1u64 << 20) as f64)
    }
}

pub fn rate_bytes(bytes_per_second: f64) -> String {
    format!("{:.0} MiB/s", bytes_per_second / (1u64 << 20) as f64)
}

pub fn micros(ns: u64) -> String {
    format!("{:.2} µs", ns as f64 / 1000.0)
}

fn ratio(numerator: f64, denominator: f64) -> String {
    if denominator == 0.0 {
        "-".to_owned()
    } else {
        format!("{:.2}x", numerator / denominator)
    }
}

impl StageReport {
    fn bytes_written_per_version(&self) -> f64 {
        (self.grown.io_persist.written_bytes + self.grown.io_compact.written_bytes) as f64
            / self.grown.version_count as f64
    }

    fn write_amplification_total(&self) -> f64 {
        (self.io_total.persist.written_bytes + self.io_total.compact.written_bytes) as f64
            / (self.version_count as f64 * ENTRY_BYTES)
    }

    /// The insert rate if the disk's sequential write bandwidth were the only
    /// limit; `None` for a stage that wrote nothing.
    fn versions_per_second_disk_bound(&self) -> Option<f64> {
        let bytes_per_version = self.bytes_written_per_version();
        (bytes_per_version > 0.0).then(|| self.disk_bytes_per_second / bytes_per_version)
    }

    pub fn one_line(&self) -> String {
        format!(
            "stage {}: {}/s insert (persist {:.1} s, compact {:.1} s), find_le p50 {} p99 {} p99.9 {}, \
             RSS {} HWM {}, {} runs, {} on disk",
            count(self.target),
            count_f(self.grown.versions_per_second()),
            self.grown.seconds_persist,
            self.grown.seconds_compact,
            micros(self.history.latency.ns_p50),
            micros(self.history.latency.ns_p99),
            micros(self.history.latency.ns_p999),
            bytes(self.resident.rss_bytes),
            bytes(self.resident.hwm_bytes),
            self.index_stats.run_count,
            bytes(self.disk.allocated_bytes),
        )
    }

    pub fn to_json(&self, config: &Config) -> Value {
        let lookups = |lookups: &Lookups| {
            json!({
                "latency": lookups.latency.to_json(),
                "found": lookups.found,
                "page_cache_hits": lookups.cache_hits,
                "page_cache_misses": lookups.cache_misses,
                "device_read_bytes": lookups.device_read_bytes,
            })
        };
        let grown = &self.grown;
        json!({
            "stage_versions": self.target,
            "workload": {
                "blocks": config.blocks,
                "block_bytes": BLOCK_BYTES,
                "record_blocks": "1-16 consecutive at a uniform random position (40% 1, 30% 2-8, 30% 9-16)",
                "record_interval_ns": RECORD_INTERVAL_NANOS,
                "seed": config.seed,
                "memtable_versions_max": config.memtable_versions_max,
                "page_cache_bytes": config.page_cache_bytes,
                "merge_fanin": config.index_config.merge_fanin,
                "runs_soft_max": config.index_config.runs_soft_max,
            },
            "versions": self.version_count,
            "records": self.record_count,
            "ingest": {
                "versions": grown.version_count,
                "seconds": grown.seconds_total,
                "versions_per_second": grown.versions_per_second(),
                "seconds_insert": grown.seconds_insert(),
                "seconds_seal": grown.seconds_seal,
                "seconds_persist": grown.seconds_persist,
                "seconds_compact": grown.seconds_compact,
                "seconds_persist_max": grown.seconds_persist_max,
                "seconds_merge_max": grown.seconds_merge_max,
                "runs_written": grown.runs_written,
                "merges": grown.merges,
                "persist_written_bytes": grown.io_persist.written_bytes,
                "compact_written_bytes": grown.io_compact.written_bytes,
                "compact_read_bytes": grown.io_compact.read_bytes,
                "write_amplification_total": self.write_amplification_total(),
                "disk_write_bytes_per_second": self.disk_bytes_per_second,
                "versions_per_second_disk_bound": self.versions_per_second_disk_bound(),
            },
            "lookups_history_warm": lookups(&self.history),
            "lookups_now": lookups(&self.now),
            "lookups_cold": self.cold.as_ref().map(|(cold, drop)| json!({
                "os_cache_drop": drop.describe(),
                "open_seconds": cold.open_seconds,
                "lookups": lookups(cold),
            })),
            "memory": {
                "vm_rss_bytes": self.resident.rss_bytes,
                "vm_hwm_bytes": self.resident.hwm_bytes,
                "vm_hwm_since_stage_start": self.peak_reset,
                "index_memory_bytes": self.index_stats.memory_bytes,
                "versions_in_memory": self.index_stats.versions_in_memory,
                "versions_in_runs": self.index_stats.versions_in_runs,
                "run_count": self.index_stats.run_count,
                "page_cache_pages": self.cache_pages,
            },
            "disk": {
                "files": self.disk.file_count,
                "apparent_bytes": self.disk.apparent_bytes,
                "allocated_bytes": self.disk.allocated_bytes,
                "run_file_bytes": self.disk.run_file_bytes,
            },
            "baseline_btreemap": self.baseline.map(|baseline| json!({
                "versions": baseline.version_count,
                "seconds_insert": baseline.seconds_insert,
                "versions_per_second": baseline.version_count as f64 / baseline.seconds_insert,
                "lookups_history": lookups(&baseline.history),
                "rss_growth_bytes": baseline.rss_growth_bytes,
                "oracle_checks": baseline.oracle_checks,
            })),
        })
    }
}

/// Metrics down, one column per stage.
fn table(stages: &[StageReport]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: &str, cell: &dyn Fn(&StageReport) -> String| {
        rows.push((label.to_owned(), stages.iter().map(cell).collect()));
    };
    let section = "";
    row("stage (versions)", &|s| count(s.target));
    row("versions / records", &|s| format!("{} / {}", count(s.version_count), count(s.record_count)));
    row(section, &|_| String::new());
    row("INGEST (this stage)", &|_| String::new());
    row("wall", &|s| format!("{:.2} s", s.grown.seconds_total));
    row("insert rate (all work)", &|s| format!("{}/s", count_f(s.grown.versions_per_second())));
    row("  insert() + generation", &|s| {
        format!(
            "{:.2} s ({}/s)",
            s.grown.seconds_insert(),
            count_f(s.grown.version_count as f64 / s.grown.seconds_insert())
        )
    });
    row("  seal()", &|s| format!("{:.3} s", s.grown.seconds_seal));
    row("  persist()", &|s| format!("{:.2} s, {} runs", s.grown.seconds_persist, s.grown.runs_written));
    row("  compact()", &|s| format!("{:.2} s, {} merges", s.grown.seconds_compact, s.grown.merges));
    row("  longest persist() / merge", &|s| {
        format!("{:.3} s / {:.2} s", s.grown.seconds_persist_max, s.grown.seconds_merge_max)
    });
    row("written by persist", &|s| bytes(s.grown.io_persist.written_bytes));
    row("written / read by merges", &|s| {
        format!("{} / {}", bytes(s.grown.io_compact.written_bytes), bytes(s.grown.io_compact.read_bytes))
    });
    row("bytes written per version", &|s| format!("{:.1} B", s.bytes_written_per_version()));
    row("write amplification (cumul.)", &|s| format!("{:.2}x of 32 B", s.write_amplification_total()));
    row("disk-bound insert rate", &|s| {
        s.versions_per_second_disk_bound().map_or("-".to_owned(), |bound| {
            format!("{}/s (at {})", count_f(bound), percent(s.grown.versions_per_second() / bound))
        })
    });
    row(section, &|_| String::new());
    lookup_rows(&mut row, "FIND_LE, random block & time, warm", &|s| Some(s.history));
    row("  found", &|s| percent(s.history.found as f64 / s.history.latency.count as f64));
    lookup_rows(&mut row, "FIND_LE, recent block at now", &|s| Some(s.now));
    lookup_rows(&mut row, "FIND_LE, cold (reopened, OS cache dropped)", &|s| s.cold.as_ref().map(|(cold, _)| *cold));
    row("  OS cache drop", &|s| s.cold.as_ref().map_or("-".to_owned(), |(_, drop)| drop.describe()));
    row("  open()", &|s| {
        s.cold.as_ref().map_or("-".to_owned(), |(cold, _)| format!("{:.1} ms", cold.open_seconds * 1e3))
    });
    row(section, &|_| String::new());
    row("MEMORY (end of stage)", &|_| String::new());
    row("VmRSS / VmHWM (this stage)", &|s| {
        let peak = if s.peak_reset { "" } else { " (since start)" };
        format!("{} / {}{peak}", bytes(s.resident.rss_bytes), bytes(s.resident.hwm_bytes))
    });
    row("index memory_bytes", &|s| bytes(s.index_stats.memory_bytes));
    row("versions in memory / runs", &|s| {
        format!("{} / {}", count(s.index_stats.versions_in_memory), count(s.index_stats.versions_in_runs))
    });
    row("runs", &|s| s.index_stats.run_count.to_string());
    row("page cache pages", &|s| format!("{} ({})", count(s.cache_pages), bytes(s.cache_pages * 4096)));
    row("on disk (allocated)", &|s| {
        format!(
            "{} in {} files, {:.1} B/version",
            bytes(s.disk.allocated_bytes),
            s.disk.file_count,
            s.disk.allocated_bytes as f64 / s.version_count as f64
        )
    });
    if stages.iter().any(|stage| stage.baseline.is_some()) {
        row(section, &|_| String::new());
        row("BASELINE std BTreeMap (all in RAM)", &|_| String::new());
        row(
            "insert rate (index/baseline)",
            &baseline_cell(&|s, b| {
                let rate = b.version_count as f64 / b.seconds_insert;
                format!("{}/s ({})", count_f(rate), ratio(s.grown.versions_per_second(), rate))
            }),
        );
        row(
            "find_le p50 (index/baseline)",
            &baseline_cell(&|s, b| {
                format!(
                    "{} ({})",
                    micros(b.history.latency.ns_p50),
                    ratio(s.history.latency.ns_p50 as f64, b.history.latency.ns_p50 as f64)
                )
            }),
        );
        row(
            "find_le p99 (index/baseline)",
            &baseline_cell(&|s, b| {
                format!(
                    "{} ({})",
                    micros(b.history.latency.ns_p99),
                    ratio(s.history.latency.ns_p99 as f64, b.history.latency.ns_p99 as f64)
                )
            }),
        );
        row(
            "find_le max (index/baseline)",
            &baseline_cell(&|s, b| {
                format!(
                    "{} ({})",
                    micros(b.history.latency.ns_max),
                    ratio(s.history.latency.ns_max as f64, b.history.latency.ns_max as f64)
                )
            }),
        );
        row(
            "RSS growth (index RSS/it)",
            &baseline_cell(&|s, b| {
                format!(
                    "{}, {:.0} B/version ({})",
                    bytes(b.rss_growth_bytes),
                    b.rss_growth_bytes as f64 / b.version_count as f64,
                    ratio(s.resident.rss_bytes as f64, b.rss_growth_bytes as f64)
                )
            }),
        );
        row("index == baseline answers", &baseline_cell(&|_, b| format!("{} lookups", count(b.oracle_checks))));
    }
    let label_width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..stages.len())
        .map(|column| rows.iter().map(|(_, cells)| cells[column].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for (label, cells) in &rows {
        let mut line = format!("{label:<label_width$}");
        for (cell, width) in cells.iter().zip(&widths) {
            line.push_str(&format!("  {cell:>width$}"));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn baseline_cell<'a>(cell: &'a dyn Fn(&StageReport, &BaselineStage) -> String) -> impl Fn(&StageReport) -> String + 'a {
    move |s| s.baseline.as_ref().map_or("-".to_owned(), |b| cell(s, b))
}

fn lookup_cell<'a>(
    pick: &'a dyn Fn(&StageReport) -> Option<Lookups>,
    format: &'a dyn Fn(&Lookups) -> String,
) -> impl Fn(&StageReport) -> String + 'a {
    move |s| pick(s).map_or("-".to_owned(), |l| format(&l))
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

fn lookup_rows(
    row: &mut impl FnMut(&str, &dyn Fn(&StageReport) -> String),
    title: &str,
    pick: &dyn Fn(&StageReport) -> Option<Lookups>,
) {
    row(title, &|_| String::new());
    let cell = |format| lookup_cell(pick, format);
    row("  lookups", &cell(&|l| count(l.latency.count)));
    row("  p50 / p99", &cell(&|l| format!("{} / {}", micros(l.latency.ns_p50), micros(l.latency.ns_p99))));
    row("  p99.9 / max", &cell(&|l| format!("{} / {}", micros(l.latency.ns_p999), micros(l.latency.ns_max))));
    row("  mean", &cell(&|l| micros(l.latency.ns_mean)));
    row(
        "  index pages read / lookup",
        &cell(&|l| format!("{:.2}", (l.cache_hits + l.cache_misses) as f64 / l.latency.count as f64)),
    );
    row(
        "  page cache misses",
        &cell(&|l| format!("{} ({:.2}/lookup)", count(l.cache_misses), l.cache_misses as f64 / l.latency.count as f64)),
    );
    row("  read from the device (OS miss)", &cell(&|l| bytes(l.device_read_bytes)));
}
