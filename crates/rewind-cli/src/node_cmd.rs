//! `rewind node recover`: a lost node rebuilt from its bucket (issue 14
//! req 3; `rewind_engine::catalog`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use jiff::tz::TimeZone;
use rewind_engine::timespec::{parse_point_in_time, DisplayTime, PointInTime};
use rewind_engine::{Node, NodeConfig, Timestamp};
use rewind_io::OsStorage;
use rewind_s3::{S3Config, S3MetaStore};
use rewind_seal::KeySource;
use serde::Serialize;

use crate::backend::progress_bar;
use crate::serve::{BucketRecord, LOCK_FILE};

#[derive(Subcommand)]
pub enum NodeCommand {
    /// Rebuild a lost node from its bucket onto an empty data directory:
    /// every volume, with its bookmarks, policies and every point in time
    /// uploaded (`rewind node recover --bucket s3://backups/rewind
    /// --endpoint URL --data-dir ./rewind-data`); then `rewind serve` it
    /// with the same `--bucket`.
    Recover(RecoverArgs),
    /// Wrap an encrypted bucket's data key under a new key (`--key-file
    /// OLD --new-key-file NEW`): nothing else in the bucket changes, and
    /// the old key no longer opens it.
    Rekey(RekeyArgs),
}

#[derive(Args)]
pub struct RekeyArgs {
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    bucket: String,
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The key that opens the bucket now.
    #[arg(long, value_name = "FILE")]
    key_file: PathBuf,
    /// The key to open it with from now on (32 bytes, 64 hex digits, or a passphrase).
    #[arg(long, value_name = "FILE")]
    new_key_file: PathBuf,
}

fn rekey(args: RekeyArgs) -> Result<()> {
    let s3 = S3Config::from_url(&args.bucket, args.endpoint).map_err(anyhow::Error::msg)?;
    let meta = S3MetaStore::new(&s3).with_context(|| format!("cannot use the bucket {}", args.bucket))?;
    let old = KeySource::from_file(&args.key_file)?;
    let new = KeySource::from_file(&args.new_key_file)?;
    let name = rewind_seal::rekey(&meta, &old, &new).with_context(|| format!("cannot re-key {}", args.bucket))?;
    println!("the data key of {} is now wrapped by {} ({name})", args.bucket, args.new_key_file.display());
    Ok(())
}

#[derive(Args)]
pub struct RecoverArgs {
    /// The bucket the lost node published to: `s3://BUCKET/PREFIX`.
    /// Credentials come from the AWS chain (AWS_ACCESS_KEY_ID, …).
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    bucket: String,
    /// The S3-compatible endpoint (MinIO, Ceph RGW, …), e.g. http://127.0.0.1:9000.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The key the bucket was encrypted with (`rewind serve --key-file`).
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Recover the node as its newest catalog taken at or before this time
    /// said it was (RFC 3339, Unix seconds, `-2h`, …): before its history
    /// was deleted, from the older catalogs a bucket's object lock keeps.
    #[arg(long, value_name = "TIME")]
    as_of: Option<String>,
    /// The bucket's object lock (`rewind serve --lock`), needed for a
    /// bucket that has one; recorded for `rewind serve`.
    #[arg(long, value_name = "PERIOD")]
    lock: Option<String>,
    /// The lost node's name in a bucket shared by several nodes
    /// (`rewind serve --node-name`): it is recovered under it, with its
    /// node number.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Show progress bars.
    #[arg(long)]
    progress: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct RecoveredVolume {
    name: String,
    /// The point it was recovered at: its present, and its newest history.
    at: String,
    blocks: u64,
    bookmarks: usize,
    bookmarks_left_out: Vec<String>,
    reverts_left_out: usize,
}

#[derive(Serialize)]
struct LeftOut {
    name: String,
    reason: String,
}

#[derive(Serialize)]
struct RecoverSummary {
    catalog_generation: u64,
    catalog_taken: String,
    volumes: Vec<RecoveredVolume>,
    left_out: Vec<LeftOut>,
    catalog_bytes: u64,
    seconds: f64,
}

pub fn run(data_dir: &Path, command: NodeCommand) -> Result<()> {
    let args = match command {
        NodeCommand::Recover(args) => args,
        NodeCommand::Rekey(args) => return rekey(args),
    };
    let started = Instant::now();
    // The bucket and its key first: a wrong key writes nothing.
    let as_of = args
        .as_of
        .as_deref()
        .map(|text| {
            match parse_point_in_time(text, Timestamp::from_system_time(SystemTime::now()), &TimeZone::system())? {
                PointInTime::At(at) => Ok(at),
                PointInTime::Bookmark(_) => {
                    bail!("--as-of {text:?}: a time, not a bookmark (catalogs are found by time)")
                }
            }
        })
        .transpose()?;
    let record =
        BucketRecord::new(&args.bucket, args.endpoint.clone(), args.key_file.as_deref(), args.lock.as_deref())?
            .in_pool(args.node_name.clone(), None)?;
    let bucket = record.open_member()?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let storage = OsStorage::new(data_dir)?;
    let _lock = storage.lock_exclusive(LOCK_FILE).context("the data directory is in use by another rewind process")?;
    let storage = Arc::new(storage);
    let mut bar: Option<(String, indicatif::ProgressBar)> = None;
    let mut progress = |what: &str, done: u64, total: u64| {
        if !args.progress {
            return;
        }
        if bar.as_ref().is_none_or(|(shown, _)| shown != what) {
            if let Some((_, old)) = bar.take() {
                old.finish_and_clear();
            }
            bar = Some((what.to_owned(), progress_bar(total, what)));
        }
        let (_, shown) = bar.as_ref().expect("set above");
        shown.set_length(total);
        shown.set_position(done);
    };
    let recovered = Node::recover(Arc::clone(&storage) as _, &NodeConfig::default(), bucket, as_of, &mut progress)
        .with_context(|| format!("cannot recover a node from {}", args.bucket))?;
    if let Some((_, bar)) = bar.take() {
        bar.finish_and_clear();
    }
    // Opened once as the server will: every volume, its history counted.
    let bucket = record.open(None)?;
    let node = Node::open_with_bucket(storage, NodeConfig::default(), Some(bucket))
        .context("the recovered node does not open")?;
    let damaged = node.damaged_volumes();
    // An older catalog (--as-of) can name packs deleted from the bucket
    // since (rewritten by a collection after it was taken): its history
    // then refers to chunks the store lacks.
    let lacking: Vec<(String, String)> = node
        .volumes()
        .iter()
        .filter_map(|volume| volume.history_damage().first().map(|note| (volume.name().to_string(), note.clone())))
        .collect();
    node.shut_down(crate::serve::now()).context("cannot close the recovered node")?;
    if let Some(volume) = damaged.first() {
        anyhow::bail!("the recovered volume {} does not open: {}", volume.name, volume.problem);
    }
    if let Some((volume, note)) = lacking.first() {
        anyhow::bail!(
            "catalog {} (taken {}) cannot be recovered whole: the history of volume {volume} in it is damaged \
             ({note}), and of {} recovered volumes in all; packs it names were likely deleted from the bucket \
             after newer catalogs were published. Recover from a newer catalog (a later --as-of, or none) into \
             an empty directory",
            recovered.generation,
            DisplayTime(recovered.taken),
            lacking.len()
        );
    }
    // `rewind serve` on this directory serves it with this bucket.
    record.write(data_dir)?;
    let summary = RecoverSummary {
        catalog_generation: recovered.generation,
        catalog_taken: DisplayTime(recovered.taken).to_string(),
        volumes: recovered
            .volumes
            .iter()
            .map(|volume| RecoveredVolume {
                name: volume.name.clone(),
                at: DisplayTime(volume.at).to_string(),
                blocks: volume.blocks,
                bookmarks: volume.bookmarks,
                bookmarks_left_out: volume.bookmarks_left_out.clone(),
                reverts_left_out: volume.reverts_left_out,
            })
            .collect(),
        left_out: recovered
            .left_out
            .iter()
            .map(|(name, reason)| LeftOut { name: name.clone(), reason: reason.clone() })
            .collect(),
        catalog_bytes: recovered.bytes_downloaded,
        seconds: started.elapsed().as_secs_f64(),
    };
    if args.json {
        return crate::output::json(&summary);
    }
    println!(
        "recovered {} volume{} from catalog {} of {} (taken {}) in {:.1} s",
        summary.volumes.len(),
        if summary.volumes.len() == 1 { "" } else { "s" },
        summary.catalog_generation,
        args.bucket,
        summary.catalog_taken,
        summary.seconds
    );
    for volume in &summary.volumes {
        let plural = if volume.bookmarks == 1 { "" } else { "s" };
        println!("  {}: as of {}, {} bookmark{plural}", volume.name, volume.at, volume.bookmarks);
        if !volume.bookmarks_left_out.is_empty() {
            println!("    left out (after the last upload): bookmarks {}", volume.bookmarks_left_out.join(", "));
        }
        if volume.reverts_left_out > 0 {
            println!("    left out (after the last upload): {} reverts", volume.reverts_left_out);
        }
    }
    for left in &summary.left_out {
        println!("  {} was not recovered: {}", left.name, left.reason);
    }
    println!(
        "serve it with: rewind --data-dir {} serve (the bucket, its endpoint and key file are recorded in its bucket.json)",
        data_dir.display()
    );
    Ok(())
}
