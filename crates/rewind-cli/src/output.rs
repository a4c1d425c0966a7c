//! What commands print for people (`--json` prints the API's types instead).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use indicatif::HumanBytes;
use serde::Serialize;

use rewind_http::api::{BookmarkInfo, Timeline, ViewInfo, VolumeDetail, VolumeInfo};

pub fn json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub fn confirm(question: &str) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// Prints rows as left-aligned columns.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|title| title.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|title| title.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub fn volumes(volumes: &[VolumeInfo]) {
    if volumes.is_empty() {
        println!("no volumes yet; create one with `rewind volume create NAME --size 10GiB`");
        return;
    }
    let rows: Vec<Vec<String>> = volumes
        .iter()
        .map(|volume| {
            vec![
                volume.name.clone(),
                HumanBytes(volume.size_bytes).to_string(),
                HumanBytes(u64::from(volume.block_size)).to_string(),
                volume.created.clone(),
                volume.last_write.clone().unwrap_or_else(|| "-".into()),
                volume.bookmark_count.to_string(),
                if volume.poisoned { "POISONED: restart the server".into() } else { "ok".into() },
            ]
        })
        .collect();
    table(&["NAME", "SIZE", "BLOCK", "PROTECTED SINCE", "LAST WRITE", "BOOKMARKS", "STATE"], &rows);
}

/// What history a volume keeps, for people.
pub fn kept_history(info: &VolumeInfo) -> String {
    let writes = if info.granularity_nanos == 0 {
        "every write".to_owned()
    } else {
        format!("each block's last write per {}", info.granularity)
    };
    match info.retention.as_str() {
        "forever" => writes,
        retention => format!("{writes}, retention {retention}"),
    }
}

pub fn volume_detail(detail: &VolumeDetail) {
    let info = &detail.info;
    let stats = &detail.stats;
    println!("volume          {}", info.name);
    println!(
        "size            {} ({} bytes), {} blocks",
        HumanBytes(info.size_bytes),
        info.size_bytes,
        HumanBytes(u64::from(info.block_size))
    );
    println!("layout          {}", info.layout);
    println!("protected since {}", info.created);
    println!("last write      {}", info.last_write.as_deref().unwrap_or("never"));
    println!("bookmarks       {}", info.bookmark_count);
    println!("keeps           {}", kept_history(info));
    if let Some(oldest) = &info.oldest_kept {
        println!("oldest kept     {oldest} (older history dropped by retention; bookmarks stay)");
    }
    println!(
        "state           {}",
        if info.poisoned { "POISONED (a write or fsync failed): restart the server" } else { "ok" }
    );
    println!("writes          {} ({})", stats.writes, HumanBytes(stats.write_bytes));
    println!("zeroings        {} ({})", stats.zeroes, HumanBytes(stats.zero_bytes));
    println!("reads           {} ({})", stats.reads, HumanBytes(stats.read_bytes));
    println!("flushes         {}", stats.flushes);
    println!(
        "versions        {} kept of {} written (r = {:.3}); {} in memory, {} index runs, {} index memory",
        stats.versions,
        stats.versions_written,
        stats.retained_fraction,
        stats.versions_in_memory,
        stats.index_runs,
        HumanBytes(stats.index_memory_bytes)
    );
    println!(
        "journal         {} (LSN {} written, {} durable)",
        HumanBytes(stats.journal_bytes),
        stats.lsn_last,
        stats.lsn_durable
    );
    println!("export          {} (and {}@TIME)", info.export, info.export);
}

pub fn bookmarks(bookmarks: &[BookmarkInfo]) {
    if bookmarks.is_empty() {
        println!("no bookmarks; add one with `rewind bookmark VOLUME NAME`");
        return;
    }
    let rows: Vec<Vec<String>> = bookmarks
        .iter()
        .map(|bookmark| vec![bookmark.name.clone(), bookmark.at.clone(), bookmark.export.clone()])
        .collect();
    table(&["NAME", "TIME", "EXPORT"], &rows);
}

const BUCKETS: [(u64, &str); 9] = [
    (60, "1m"),
    (300, "5m"),
    (900, "15m"),
    (3600, "1h"),
    (6 * 3600, "6h"),
    (86400, "1d"),
    (7 * 86400, "7d"),
    (30 * 86400, "30d"),
    (365 * 86400, "365d"),
];

pub fn parse_bucket(text: &str) -> Result<u64> {
    let duration = humantime_seconds(text)?;
    if duration < 60 || duration % 60 != 0 {
        bail!("bucket {text} must be a whole number of minutes");
    }
    Ok(duration)
}

fn humantime_seconds(text: &str) -> Result<u64> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let count: u64 = digits.parse().with_context(|| format!("bad bucket {text:?}; write it like 15m, 1h or 1d"))?;
    let unit_seconds = match unit {
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86400,
        "w" => 7 * 86400,
        _ => bail!("bad bucket {text:?}; write it like 15m, 1h or 1d"),
    };
    Ok(count * unit_seconds)
}

/// A bucket size that shows the history in at most about 30 rows.
pub fn auto_bucket(timeline: &Timeline) -> u64 {
    let (Some(first), Some(last)) = (timeline.buckets.first(), timeline.buckets.last()) else { return 60 };
    let span = last.start_unix_seconds - first.start_unix_seconds;
    BUCKETS.iter().map(|&(seconds, _)| seconds).find(|seconds| span / seconds < 30).unwrap_or(365 * 86400)
}

fn bucket_name(seconds: u64) -> String {
    BUCKETS
        .iter()
        .find(|&&(size, _)| size == seconds)
        .map_or_else(|| format!("{}m", seconds / 60), |(_, name)| (*name).to_owned())
}

pub fn timeline(timeline: &Timeline) {
    println!("volume {}: protected since {}", timeline.volume, timeline.created);
    match &timeline.last_write {
        Some(last) => println!("last write {last}"),
        None => println!("nothing written yet"),
    }
    if timeline.buckets.is_empty() && timeline.bookmarks.is_empty() {
        return;
    }
    println!(
        "\nwrites per {} (█ = bytes written, ░ = bytes zeroed), bookmarks marked ◆\n",
        bucket_name(timeline.bucket_seconds)
    );
    let widest = timeline.buckets.iter().map(|bucket| bucket.write_bytes + bucket.zero_bytes).max().unwrap_or(0).max(1);
    const BAR: u64 = 40;
    let mut bookmarks = timeline.bookmarks.iter().peekable();
    for bucket in &timeline.buckets {
        let end = bucket.start_unix_seconds + timeline.bucket_seconds;
        while let Some(bookmark) = bookmarks.peek() {
            if bookmark.at_unix_nanos / 1_000_000_000 >= bucket.start_unix_seconds {
                break;
            }
            println!("  ◆ {:<20} {}", bookmark.name, bookmark.at);
            bookmarks.next();
        }
        let written = (bucket.write_bytes * BAR).div_ceil(widest) as usize;
        let zeroed = (bucket.zero_bytes * BAR).div_ceil(widest) as usize;
        println!(
            "{}  {:<40}  {:>10} in {} writes{}",
            bucket.start.trim_end_matches('Z').replace('T', " "),
            format!("{}{}", "█".repeat(written), "░".repeat(zeroed)),
            HumanBytes(bucket.write_bytes).to_string(),
            bucket.writes,
            if bucket.zeroes > 0 { format!(", {} zeroed", HumanBytes(bucket.zero_bytes)) } else { String::new() }
        );
        while let Some(bookmark) = bookmarks.peek() {
            if bookmark.at_unix_nanos / 1_000_000_000 >= end {
                break;
            }
            println!("  ◆ {:<20} {}", bookmark.name, bookmark.at);
            bookmarks.next();
        }
    }
    for bookmark in bookmarks {
        println!("  ◆ {:<20} {}", bookmark.name, bookmark.at);
    }
}

pub fn view(view: &ViewInfo, nbd_address: Option<&String>) {
    let address = nbd_address.map_or("127.0.0.1:10809", String::as_str);
    println!("{} as of {}", view.volume, view.at);
    println!("export  {}", view.export);
    println!("uri     nbd://{address}/{}", view.export);
    println!();
    println!("for example:");
    println!("  nbdinfo nbd://{address}/{}", view.export);
    println!("  nbdcopy nbd://{address}/{} restored.raw", view.export);
    println!("  qemu-img convert -f raw -O qcow2 nbd://{address}/{} restored.qcow2", view.export);
}
