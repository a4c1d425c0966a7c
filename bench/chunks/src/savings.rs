//! `chunk-bench savings PATH...`: what zstd saves on real data, chunk by
//! chunk, and what reading it back costs: the measurement behind the share
//! a chunk must save to be stored compressed ([`SAVING_SHARE_MIN`]).
//!
//! Every file under the paths is cut into 4 KiB chunks (as a filesystem
//! lays it out in blocks; a file's last partial chunk is left out), each
//! compressed at the store's level. Per band of saving: the share of the
//! chunks in it, the share of all that zstd saves, and zstd's time to
//! decompress one of them (the cost every read of it pays). Then the bytes
//! stored for the data under the store's rule against level 3 wherever it
//! saves an eighth, the rule before.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use rewind_chunks::{Compressor, SAVING_SHARE_MIN};
use serde_json::json;

use crate::say;

#[derive(Args)]
pub struct SavingsArgs {
    /// Files or directories whose data to cut into chunks.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

const CHUNK_BYTES: usize = 4096;
/// Where the bands of saving start, as shares of a chunk; each ends where
/// the next starts.
const BANDS: [f64; 4] = [0.0, 0.125, 0.25, 0.5];

#[derive(Default)]
struct Band {
    chunks: u64,
    saved_bytes: u64,
    decode_seconds: f64,
}

#[derive(Default)]
struct Tally {
    bands: [Band; BANDS.len()],
    chunks: u64,
    /// Bytes stored under the store's rule, and under level 3 wherever it
    /// saves an eighth.
    stored_by_rule: u64,
    stored_at_an_eighth: u64,
}

impl Tally {
    fn add_file(&mut self, data: &[u8], tools: &mut Tools) -> anyhow::Result<()> {
        for chunk in data.chunks_exact(CHUNK_BYTES) {
            self.chunks += 1;
            let size = tools.level_3.compress_to_buffer(chunk, &mut tools.compressed)?;
            // Data that does not compress comes out larger than it went in.
            let saved = CHUNK_BYTES.saturating_sub(size);
            let share = saved as f64 / CHUNK_BYTES as f64;
            let band = BANDS.iter().rposition(|&start| share >= start).expect("the first band starts at 0");
            let band = &mut self.bands[band];
            band.chunks += 1;
            if share >= BANDS[1] {
                band.saved_bytes += saved as u64;
                let start = Instant::now();
                let size_back = tools.decompressor.decompress_to_buffer(&tools.compressed[..size], &mut tools.back)?;
                band.decode_seconds += start.elapsed().as_secs_f64();
                anyhow::ensure!(size_back == CHUNK_BYTES && tools.back == chunk, "zstd gave back other bytes");
                self.stored_at_an_eighth += size as u64;
            } else {
                self.stored_at_an_eighth += CHUNK_BYTES as u64;
            }
            // Stored as it is or compressed, `out` holds what is stored.
            tools.rule.compress(chunk, &mut tools.out);
            self.stored_by_rule += tools.out.len() as u64;
        }
        Ok(())
    }
}

struct Tools {
    level_3: zstd::bulk::Compressor<'static>,
    decompressor: zstd::bulk::Decompressor<'static>,
    rule: Compressor,
    compressed: Vec<u8>,
    back: Vec<u8>,
    out: Vec<u8>,
}

/// Every regular file under `path`, depth first, symbolic links not followed.
fn files_under(path: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let kind = std::fs::symlink_metadata(path)?.file_type();
    if kind.is_file() {
        files.push(path.to_owned());
    } else if kind.is_dir() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(path)?.map(|entry| Ok(entry?.path())).collect::<anyhow::Result<_>>()?;
        entries.sort();
        for entry in entries {
            files_under(&entry, files)?;
        }
    }
    Ok(())
}

pub fn run(args: &SavingsArgs, json: bool) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for path in &args.paths {
        files_under(path, &mut files)?;
    }
    let mut tools = Tools {
        level_3: zstd::bulk::Compressor::new(3)?,
        decompressor: zstd::bulk::Decompressor::new()?,
        rule: Compressor::new()?,
        compressed: vec![0; zstd::zstd_safe::compress_bound(CHUNK_BYTES)],
        back: vec![0; CHUNK_BYTES],
        out: Vec::new(),
    };
    let mut tally = Tally::default();
    for file in &files {
        // A file that cannot be read (permissions, gone meanwhile) is not data.
        let Ok(data) = std::fs::read(file) else { continue };
        tally.add_file(&data, &mut tools)?;
    }
    anyhow::ensure!(tally.chunks > 0, "no file under {:?} holds a whole {CHUNK_BYTES}-byte chunk", args.paths);
    let saved_all: u64 = tally.bands.iter().skip(1).map(|band| band.saved_bytes).sum();
    let raw = tally.chunks * CHUNK_BYTES as u64;
    say(format!(
        "{} files, {} chunks of {CHUNK_BYTES} bytes ({:.0} MiB); zstd level 3 saves {:.1}% of them where it saves an eighth",
        files.len(),
        tally.chunks,
        raw as f64 / (1u64 << 20) as f64,
        saved_all as f64 * 100.0 / raw as f64
    ));
    for (at, band) in tally.bands.iter().enumerate() {
        let end = BANDS.get(at + 1).copied().unwrap_or(1.0);
        let decode_us = match band.chunks {
            0 => 0.0,
            chunks => band.decode_seconds * 1e6 / chunks as f64,
        };
        say(format!(
            "saves {:.3}–{end:.3}: {:.2}% of the chunks, {:.2}% of what zstd saves, {decode_us:.2} µs to decompress one",
            BANDS[at],
            band.chunks as f64 * 100.0 / tally.chunks as f64,
            band.saved_bytes as f64 * 100.0 / saved_all.max(1) as f64,
        ));
        if json {
            println!(
                "{}",
                json!({
                    "measurement": "savings", "band_start": BANDS[at], "band_end": end,
                    "chunks": band.chunks, "saved_bytes": band.saved_bytes, "decode_us": decode_us,
                })
            );
        }
    }
    say(format!(
        "stored ÷ raw: {:.4} compressed where a share of {SAVING_SHARE_MIN} is saved (the store's rule), {:.4} where an eighth is",
        tally.stored_by_rule as f64 / raw as f64,
        tally.stored_at_an_eighth as f64 / raw as f64,
    ));
    if json {
        println!(
            "{}",
            json!({
                "measurement": "savings", "chunks": tally.chunks, "raw_bytes": raw,
                "stored_by_rule": tally.stored_by_rule, "stored_at_an_eighth": tally.stored_at_an_eighth,
                "saving_share_min": SAVING_SHARE_MIN,
            })
        );
    }
    Ok(())
}
