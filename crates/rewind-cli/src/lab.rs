//! `rewind lab`: replay, analyse and generate block traces. Pure
//! computation on files; no server is involved.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use rewind_engine::timespec::parse_granularity;
use rewind_lab::analysis::{analyze, format_bytes, format_granularity, AnalyzeConfig};
use rewind_lab::cache::CacheConfig;
use rewind_lab::replay::{replay_all, Architecture, Census, Convention, ReplaySetup, MAX_BLOCKS_DEFAULT};
use rewind_lab::report::write_report;
use rewind_lab::spc1::Spc1;
use rewind_lab::trace::{read_all, CsvWriter, Format, Op, ReadOptions, Request};

use crate::backend::Backend;
use crate::{output, parse_block_size, parse_bytes};

#[derive(Subcommand)]
pub enum LabCommand {
    /// Replay a trace through one layout (or all: `--layout all`) and count
    /// the device I/Os of each store.
    Replay {
        #[command(flatten)]
        trace: TraceArgs,
        /// logging, split-stream, split-down-stream, checkpointing, cow, row, or all.
        #[arg(long, default_value = "all")]
        layout: String,
        /// Protection granularity: ew (every write) or a duration like 1m.
        #[arg(long, default_value = "ew")]
        granularity: String,
        /// Controller cache size (3% of its pages may be dirty).
        #[arg(long, default_value = "64MiB")]
        cache: String,
        #[command(flatten)]
        accounting: AccountingArgs,
        #[arg(long)]
        json: bool,
    },
    /// Replay a trace at several granularities and cache sizes, set it
    /// against the IBM and Xiao models, and write a report (Markdown, SVG
    /// and PNG figures, JSON) with a recommendation.
    Analyze {
        #[command(flatten)]
        trace: TraceArgs,
        /// Comma-separated granularities: ew, 1s, 10s, 1m, ...
        #[arg(long, default_value = "ew,1s,10s,1m,5m,30m,60m")]
        granularities: String,
        /// Comma-separated cache sizes.
        #[arg(long, default_value = "64MiB,256MiB,4GiB")]
        caches: String,
        /// The time of one disk access, for the COW/ROW model (D).
        #[arg(long, default_value = "5ms")]
        disk_time: String,
        /// The time to merge a read across a ROW snapshot, for the model (σ).
        #[arg(long, default_value = "500us")]
        merge_time: String,
        #[command(flatten)]
        accounting: AccountingArgs,
        /// Where to write the report.
        #[arg(long)]
        out: PathBuf,
        /// Also print the analysis as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate a trace (on standard output, csv).
    #[command(subcommand)]
    Generate(GenerateCommand),
}

#[derive(Subcommand)]
pub enum GenerateCommand {
    /// An SPC-1-like OLTP workload: 50 IOPS per BSU, 60% writes, three
    /// ASUs with SPC-1's hot spots and sequential streams. Seeded.
    Spc1 {
        /// Business scaling units.
        #[arg(long, default_value_t = 20)]
        bsu: u32,
        #[arg(long, default_value = "20GiB")]
        capacity: String,
        #[arg(long, default_value = "1h")]
        duration: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Which writes the lab counts, and how much state it may keep.
#[derive(Args)]
pub struct AccountingArgs {
    /// paper: the IBM paper's (footnote 3), only writes that have a
    /// subsequent write are counted; steady-state: every write, each
    /// block's last write and the state before the trace retained.
    #[arg(long, default_value = "paper")]
    convention: String,
    /// The most distinct blocks written the lab keeps state for (about 150
    /// bytes each); a trace writing more is refused.
    #[arg(long, default_value_t = MAX_BLOCKS_DEFAULT)]
    max_blocks: u64,
}

impl AccountingArgs {
    fn convention(&self) -> Result<Convention> {
        Convention::parse(&self.convention).map_err(anyhow::Error::msg)
    }
}

#[derive(Args)]
pub struct TraceArgs {
    /// The trace file (`-`: standard input).
    trace: PathBuf,
    /// csv, fio, blkparse, msr, vscsi or oracle-general (default: told
    /// from the first bytes; oracle-general, which has no mark of its own,
    /// from a file name containing `oracleGeneral`).
    #[arg(long)]
    format: Option<String>,
    /// Time between records of an fio iolog v2, which has none.
    #[arg(long, default_value = "1ms")]
    iolog_interval: String,
    /// Which blkparse action to count: Q (queued), D (issued), C (completed).
    #[arg(long, default_value = "Q")]
    blkparse_action: String,
    /// Block (page) size of the replay.
    #[arg(long, default_value = "4KiB")]
    block_size: String,
    /// The traced device's size: a request past it is an error naming its
    /// line (default: the highest extent the trace touches).
    #[arg(long)]
    capacity: Option<String>,
    /// The longest request taken; a longer one is an error naming its line.
    #[arg(long, default_value = "1GiB")]
    max_request: String,
    /// What the requests of oracle-general traces, which have no read or
    /// write, count as: write or read.
    #[arg(long, default_value = "write")]
    untyped_op: String,
}

fn parse_duration_nanos(text: &str, what: &str) -> Result<u64> {
    let duration = humantime::parse_duration(text)
        .with_context(|| format!("cannot read {text:?} as a {what}; write it like 1h, 10m, 5ms"))?;
    u64::try_from(duration.as_nanos()).with_context(|| format!("{what} {text:?} is too long"))
}

fn parse_list<T>(text: &str, parse: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    let items: Vec<T> =
        text.split(',').map(str::trim).filter(|item| !item.is_empty()).map(parse).collect::<Result<_>>()?;
    if items.is_empty() {
        bail!("the list {text:?} is empty");
    }
    Ok(items)
}

fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

impl TraceArgs {
    fn block_bytes(&self) -> Result<u64> {
        Ok(u64::from(parse_block_size(&self.block_size)?))
    }

    fn capacity_bytes(&self) -> Result<Option<u64>> {
        self.capacity.as_deref().map(|text| parse_bytes(text, "capacity")).transpose()
    }

    fn read(&self) -> Result<Vec<Request>> {
        let options = ReadOptions {
            format: self.format.as_deref().map(Format::parse).transpose().map_err(anyhow::Error::msg)?,
            iolog_interval_nanos: parse_duration_nanos(&self.iolog_interval, "iolog interval")?,
            blkparse_action: self.blkparse_action.clone(),
            capacity_bytes: self.capacity_bytes()?,
            max_request_bytes: parse_bytes(&self.max_request, "largest request")?,
            untyped_op: match self.untyped_op.as_str() {
                "write" => Op::Write,
                "read" => Op::Read,
                other => bail!("--untyped-op {other:?}: write or read"),
            },
        };
        let name = self.trace.display().to_string();
        let input: Box<dyn BufRead> = if self.trace == Path::new("-") {
            Box::new(std::io::stdin().lock())
        } else {
            let file = std::fs::File::open(&self.trace).with_context(|| format!("cannot open the trace {name}"))?;
            Box::new(BufReader::with_capacity(1 << 20, file))
        };
        let bar = spinner(&format!("reading {name}"));
        let requests = read_all(input, &name, options);
        bar.finish_and_clear();
        let requests = requests?;
        if requests.is_empty() {
            bail!("the trace {name} has no requests");
        }
        Ok(requests)
    }
}

/// `rewind trace export`: a volume's kept writes as a csv trace on
/// standard output, as they arrive (a long history has millions).
pub fn export(backend: &dyn Backend, volume: &str) -> Result<()> {
    let block_size = backend.volume(volume)?.info.block_size;
    let comment = format!(
        "writes kept in the history of volume {volume} (block size {block_size}), exported by rewind {}",
        env!("CARGO_PKG_VERSION")
    );
    write_trace(&comment, |emit| {
        backend.write_history(volume, &mut |[time_nanos, offset_bytes, length_bytes]| {
            emit(Request { time_nanos, op: Op::Write, offset_bytes, length_bytes })
        })
    })
}

/// Writes a csv trace to standard output, of the requests `produce` emits.
fn write_trace(comment: &str, produce: impl FnOnce(&mut dyn FnMut(Request) -> Result<()>) -> Result<()>) -> Result<()> {
    let stdout = std::io::stdout().lock();
    let mut writer = CsvWriter::new(std::io::BufWriter::with_capacity(1 << 20, stdout), comment)?;
    produce(&mut |request| Ok(writer.write(&request)?))?;
    writer.finish()?.flush()?;
    Ok(())
}

pub fn run(command: LabCommand) -> Result<()> {
    match command {
        LabCommand::Replay { trace, layout, granularity, cache, accounting, json } => {
            let architectures = match layout.as_str() {
                "all" => Architecture::ALL.to_vec(),
                name => vec![Architecture::parse(name).map_err(anyhow::Error::msg)?],
            };
            let granularity_nanos = parse_granularity(&granularity).map_err(anyhow::Error::msg)?;
            let cache_bytes = parse_bytes(&cache, "cache size")?;
            let block_bytes = trace.block_bytes()?;
            let convention = accounting.convention()?;
            let requests = trace.read()?;
            let census = Census::of(&requests, block_bytes, accounting.max_blocks)?;
            let setup = ReplaySetup {
                granularity_nanos,
                offset_nanos: 0,
                cache: CacheConfig::new(cache_bytes, block_bytes, 0.03),
                block_bytes,
                convention,
            };
            let replays = replay_all(&requests, setup, &census);
            let results: Vec<_> = architectures
                .iter()
                .map(|&architecture| (architecture.name(), &replays[architecture as usize]))
                .collect();
            if json {
                let map: serde_json::Map<String, serde_json::Value> = results
                    .iter()
                    .map(|(name, result)| ((*name).to_owned(), serde_json::to_value(result).expect("serialisable")))
                    .collect();
                return output::json(&map);
            }
            println!(
                "{} requests ({} writes), g = {}, cache {}, {} blocks; {} block writes, w = {} counted",
                requests.len(),
                results[0].1.write_requests,
                format_granularity(granularity_nanos),
                format_bytes(cache_bytes),
                format_bytes(block_bytes),
                results[0].1.block_writes,
                results[0].1.counted_writes,
            );
            println!("convention: {}", convention.describe());
            println!(
                "{:<18} {:>9} {:>7} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}",
                "layout",
                "I/O/write",
                "r",
                "c",
                "d",
                "cur reads",
                "cur writes",
                "cur seq",
                "his reads",
                "his writes",
                "his seq",
                "merge/write"
            );
            for (name, result) in &results {
                println!(
                    "{:<18} {:>9.3} {:>7.4} {:>7.4} {:>7.4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11.3}",
                    name,
                    result.write_ios_per_write(),
                    result.retained_fraction(),
                    result.evicted_fraction(),
                    result.incurred_fraction(),
                    result.current.reads + result.current.reads_for_writes,
                    result.current.writes,
                    result.current.sequential,
                    result.history.reads + result.history.reads_for_writes,
                    result.history.writes,
                    result.history.sequential,
                    result.merge_ios_per_write(),
                );
            }
            Ok(())
        }
        LabCommand::Analyze { trace, granularities, caches, disk_time, merge_time, accounting, out, json } => {
            let config = AnalyzeConfig {
                granularities_nanos: parse_list(&granularities, |item| {
                    parse_granularity(item).map_err(anyhow::Error::msg)
                })?,
                caches_bytes: parse_list(&caches, |item| parse_bytes(item, "cache size"))?,
                block_bytes: trace.block_bytes()?,
                dirty_fraction: 0.03,
                capacity_bytes: trace.capacity_bytes()?,
                disk_seconds: parse_duration_nanos(&disk_time, "disk time")? as f64 / 1e9,
                merge_seconds: parse_duration_nanos(&merge_time, "merge time")? as f64 / 1e9,
                convention: accounting.convention()?,
                max_blocks: accounting.max_blocks,
            };
            let requests = trace.read()?;
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("replaying {wide_bar} {pos}/{len} ETA {eta}").expect("valid template"),
            );
            let analysis = analyze(&requests, &config, &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            bar.finish_and_clear();
            let trace_name = trace.trace.file_name().map_or("-".into(), |name| name.to_string_lossy().into_owned());
            write_report(&analysis, &trace_name, &out)?;
            if json {
                return output::json(&analysis);
            }
            println!("convention: {}", analysis.convention.describe());
            for line in &analysis.recommendations {
                println!("{line}");
            }
            println!("report: {}", out.join("report.md").display());
            Ok(())
        }
        LabCommand::Generate(GenerateCommand::Spc1 { bsu, capacity, duration, seed }) => {
            let spc1 = Spc1 {
                bsu,
                capacity_bytes: parse_bytes(&capacity, "capacity")?,
                duration_nanos: parse_duration_nanos(&duration, "duration")?,
                seed,
            };
            spc1.check().map_err(anyhow::Error::msg)?;
            let comment = format!(
                "SPC-1-like trace generated by rewind {}: --bsu {bsu} --capacity {capacity} --duration {duration} --seed {seed}",
                env!("CARGO_PKG_VERSION")
            );
            write_trace(&comment, |emit| spc1.requests().try_for_each(emit))
        }
    }
}
