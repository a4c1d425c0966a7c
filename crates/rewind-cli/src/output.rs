//! What commands print for people (`--json` prints the API's types instead).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use indicatif::HumanBytes;
use serde::Serialize;

use indicatif::{ProgressBar, ProgressStyle};
use rewind_http::api::{
    BookmarkInfo, Changes, GcReport, NodeReport, RepairSummary, StoreIo, Timeline, ViewInfo, VolumeDetail, VolumeInfo,
    VolumeReport,
};

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
                volume.layout.clone(),
                volume.created.clone(),
                volume.last_write.clone().unwrap_or_else(|| "-".into()),
                volume.bookmark_count.to_string(),
                match volume.state.as_str() {
                    "ok" => "ok".to_owned(),
                    other => other.to_uppercase(),
                },
            ]
        })
        .collect();
    table(&["NAME", "SIZE", "BLOCK", "LAYOUT", "PROTECTED SINCE", "LAST WRITE", "BOOKMARKS", "STATE"], &rows);
    for volume in volumes {
        if let Some(problem) = &volume.problem {
            println!("{}: {problem}", volume.name);
        }
    }
}

/// What `rewind volume repair` found and did.
pub fn repair(summary: &RepairSummary) {
    if summary.steps.is_empty() && summary.repaired {
        println!("volume {} is not damaged: nothing to repair", summary.volume);
        return;
    }
    for (index, step) in summary.steps.iter().enumerate() {
        println!("{}. found:  {}", index + 1, step.problem);
        let verb = if summary.planned_only { "would" } else { "did" };
        println!("   {verb}:  {}", step.action);
        if let Some(loss) = &step.loss {
            println!("   lost:   {loss}");
        }
    }
    match (&summary.unrepairable, summary.repaired, summary.planned_only) {
        (Some(why), _, _) => println!("cannot repair: {why}"),
        (None, true, _) => println!("volume {} is repaired and served again", summary.volume),
        (None, false, true) => println!(
            "nothing was changed (more damage may show once this is repaired); `rewind volume repair {} --yes` repairs it",
            summary.volume
        ),
        (None, false, false) => println!("volume {} is still damaged", summary.volume),
    }
}

/// What history a volume keeps, for people.
pub fn kept_history(info: &VolumeInfo) -> String {
    let writes = if info.granularity_nanos == 0 {
        "every write".to_owned()
    } else {
        format!("each block's last write per {}", info.granularity)
    };
    let kept = match info.retention.as_str() {
        "forever" => writes,
        retention => format!("{writes}, retention {retention}"),
    };
    match info.space_max.as_str() {
        "none" => kept,
        space_max => format!("{kept}, at most {space_max} archived"),
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
    if info.cache_bytes > 0 {
        println!("cache           {} (controller cache, 3% dirty)", HumanBytes(info.cache_bytes));
    }
    match &info.base {
        Some(base) if base.copied => {
            println!("clone of        {} as of {} (promoted: has its own copy)", base.volume, base.at)
        }
        Some(base) => println!("clone of        {} as of {}", base.volume, base.at),
        None => {}
    }
    println!("protected since {}", info.created);
    if let Some(last) = &info.last_revert {
        let times = if info.revert_count == 1 { "once".to_owned() } else { format!("{} times", info.revert_count) };
        println!(
            "reverted        {times}, last at {} back to {} (`rewind revert {} --undo` goes back)",
            last.at, last.to, info.name
        );
    }
    println!("last write      {}", info.last_write.as_deref().unwrap_or("never"));
    println!("bookmarks       {}", info.bookmark_count);
    println!("keeps           {}", kept_history(info));
    if let Some(oldest) = &info.oldest_kept {
        println!("oldest kept     {oldest} (older history dropped by retention; bookmarks stay)");
    }
    println!(
        "state           {}",
        info.problem
            .as_deref()
            .map_or(info.state.clone(), |problem| format!("{}: {problem}", info.state.to_uppercase()))
    );
    for note in &info.notes {
        println!("note            {note}");
    }
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
        "archived        {} versions in the chunk store, {} still in the journal",
        stats.versions_archived, stats.versions_in_journal
    );
    if stats.versions_archiving > 0 {
        println!(
            "archiving       a pass is under way: {} of its {} versions done (they leave the journal as it ends)",
            stats.versions_archiving_done, stats.versions_archiving
        );
    }
    if stats.bookmarks_awaiting_layout > 0 {
        println!(
            "bookmarks       {} archived, their history to be laid out in block order while the volume is quiet \
             (views of them read faster once it is)",
            stats.bookmarks_awaiting_layout
        );
    }
    println!(
        "journal         {} (LSN {} written, {} durable; {} reclaimable at the next checkpoint)",
        HumanBytes(stats.journal_bytes),
        stats.lsn_last,
        stats.lsn_durable,
        HumanBytes(stats.journal_bytes_reclaimable)
    );
    if stats.revert_copy_blocks_left > 0 {
        println!(
            "after revert    copying back into the current store in the background: {} blocks to look at \
             (reads are correct meanwhile, and faster as it goes)",
            stats.revert_copy_blocks_left
        );
    }
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

/// Which volumes a token reaches, for people.
pub fn token_volumes(token: &rewind_access::TokenInfo) -> String {
    match &token.volumes {
        None => "every volume".to_owned(),
        Some(volumes) => format!("volumes {}", volumes.join(", ")),
    }
}

pub fn tokens(tokens: &[rewind_access::TokenInfo]) {
    if tokens.is_empty() {
        println!("no tokens; `rewind serve` makes the admin token at its first start");
        return;
    }
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|token| {
            vec![
                token.id.clone(),
                token.name.clone(),
                token.role.as_str().to_owned(),
                token_volumes(token),
                token.created.clone(),
            ]
        })
        .collect();
    table(&["ID", "NAME", "ROLE", "VOLUMES", "CREATED"], &rows);
}

pub fn grants(grants: &[rewind_access::GrantInfo]) {
    if grants.is_empty() {
        println!(
            "no access grants: NBD clients on this machine without a certificate open every volume; \
             others open nothing (`rewind access grant VOLUME IDENTITY`)"
        );
        return;
    }
    let rows: Vec<Vec<String>> = grants
        .iter()
        .map(|grant| vec![grant.volume.clone(), grant.identity.clone(), grant.access.as_str().to_owned()])
        .collect();
    table(&["VOLUME", "IDENTITY", "ACCESS"], &rows);
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
    // Bookmarks and reverts, in time order, between the buckets they fall in.
    let mut marks: Vec<(u64, String)> = timeline
        .bookmarks
        .iter()
        .map(|bookmark| (bookmark.at_unix_nanos, format!("  ◆ {:<20} {}", bookmark.name, bookmark.at)))
        .chain(timeline.reverts.iter().map(|revert| {
            (revert.at_unix_nanos, format!("  ↶ {:<20} {} back to {}", "reverted", revert.at, revert.to))
        }))
        .collect();
    marks.sort();
    if timeline.buckets.is_empty() && marks.is_empty() {
        return;
    }
    println!(
        "\nwrites per {} (█ = bytes written, ░ = bytes zeroed), bookmarks marked ◆, reverts ↶\n",
        bucket_name(timeline.bucket_seconds)
    );
    let widest = timeline.buckets.iter().map(|bucket| bucket.write_bytes + bucket.zero_bytes).max().unwrap_or(0).max(1);
    const BAR: u64 = 40;
    let mut marks = marks.into_iter().peekable();
    let mut print_marks_before = |seconds: u64| {
        while let Some((_, line)) = marks.next_if(|(at, _)| at / 1_000_000_000 < seconds) {
            println!("{line}");
        }
    };
    for bucket in &timeline.buckets {
        print_marks_before(bucket.start_unix_seconds);
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
        print_marks_before(bucket.start_unix_seconds + timeline.bucket_seconds);
    }
    print_marks_before(u64::MAX);
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

/// Where a tree's past is over NFS (`rewind tree view`): the exact point,
/// whichever way it was named, so the path stays the same moment.
pub fn tree_view(view: &ViewInfo) {
    let (tree, at) = (&view.volume, view.at_unix_nanos);
    println!("{tree} as of {}", view.at);
    println!("export  /{tree}@{at}   (read-only)");
    println!("path    /{tree}/.rewind/{at}/");
    println!();
    println!("for example (NFS on the server's --nfs port, 2049 unless told):");
    println!("  nfs-ls 'nfs://127.0.0.1/{tree}/.rewind/{at}/?version=3&nfsport=2049&mountport=2049'");
    println!("  rewind tree restore {tree}@{at} --to ./restored --progress");
}

/// What changed between two points (`rewind diff`).
pub fn changes(changes: &Changes) {
    let to = if changes.to_present { format!("now ({})", changes.to) } else { changes.to.clone() };
    println!("{} from {} to {}", changes.volume, changes.from, to);
    println!(
        "{} changed of {} ({:.2}%) in {} ranges",
        HumanBytes(changes.changed_bytes),
        HumanBytes(changes.size_bytes),
        100.0 * changes.changed_bytes as f64 / changes.size_bytes.max(1) as f64,
        changes.ranges.len()
    );
    if changes.ranges.is_empty() {
        return;
    }
    println!();
    let rows: Vec<Vec<String>> = changes
        .ranges
        .iter()
        .map(|range| vec![range.offset.to_string(), range.length.to_string(), HumanBytes(range.length).to_string()])
        .collect();
    table(&["offset", "length", ""], &rows);
}

pub fn restored(summary: &crate::restore::RestoreSummary) {
    let what = match &summary.since {
        Some(since) => format!("the changes since {since}"),
        None => "the whole volume".to_owned(),
    };
    println!("restored {}@{} to {}: {what}", summary.volume, summary.at, summary.target);
    println!(
        "{} moved{}, {:.1} s, {:.0} MiB/s, synced",
        HumanBytes(summary.bytes_moved),
        if summary.bytes_zeroed > 0 {
            format!(", {} of holes zeroed", HumanBytes(summary.bytes_zeroed))
        } else {
            String::new()
        },
        summary.seconds,
        summary.mib_per_second
    );
}

fn ratio(value: f64) -> String {
    format!("{value:.2}x")
}

fn ratios(dedup: f64, compression: f64) {
    println!(
        "ratios          dedup {}, compression {}, together {}",
        ratio(dedup),
        ratio(compression),
        ratio(dedup * compression)
    );
}

/// A volume's history, measured (`rewind stats VOLUME`).
pub fn volume_report(report: &VolumeReport) {
    println!("volume          {}", report.volume);
    println!(
        "versions        {} kept of {} written (r = {:.3}); {} dropped by granularity, retention and deletes",
        report.versions_kept, report.versions_written, report.retained_fraction, report.versions_thinned
    );
    println!(
        "archived        {} versions; {} still in the journal",
        report.versions_archived, report.versions_in_journal
    );
    println!(
        "chunk store     {} logical in {} distinct chunks: {} raw, {} in packs",
        HumanBytes(report.logical_bytes),
        report.unique_chunks,
        HumanBytes(report.unique_raw_bytes),
        HumanBytes(report.pack_bytes)
    );
    ratios(report.dedup_ratio, report.compression_ratio);
    println!(
        "journal         {} ({} reclaimable at the next checkpoint)",
        HumanBytes(report.journal_bytes),
        HumanBytes(report.journal_bytes_reclaimable)
    );
    println!("current store   {} (sparse)", HumanBytes(report.current_bytes));
    println!("space cap       {}", report.space_max);
    if let Some(oldest) = &report.oldest_kept {
        println!("oldest kept     {oldest}");
    }
    println!("measured at     {}", report.measured_at);
    store_io(&report.io);
}

/// Device I/O by store since the server started.
fn store_io(io: &StoreIo) {
    println!(
        "device I/O      {:<8} {:>10} {:>10} {:>10} {:>10} {:>7} {:>8}",
        "store", "reads", "read", "writes", "written", "seq", "syncs"
    );
    let stores = [
        ("journal", Some(io.journal)),
        ("current", Some(io.current)),
        ("index", Some(io.index)),
        ("chunks", io.chunks),
    ];
    for (name, store) in stores {
        let Some(store) = store else { continue };
        let all = store.reads + store.writes;
        println!(
            "                {name:<8} {:>10} {:>10} {:>10} {:>10} {:>6.1}% {:>8}",
            store.reads,
            HumanBytes(store.read_bytes).to_string(),
            store.writes,
            HumanBytes(store.write_bytes).to_string(),
            100.0 * store.sequential as f64 / all.max(1) as f64,
            store.syncs
        );
    }
}

/// The node and its volumes (`rewind stats`).
pub fn node_report(report: &NodeReport) {
    println!(
        "versions        {} kept of {} written (r = {:.3})",
        report.versions_kept, report.versions_written, report.retained_fraction
    );
    println!(
        "chunks          {} live, {} dead (not yet collected), {} references",
        report.chunks_live, report.chunks_dead, report.references
    );
    println!(
        "chunk store     {} logical, {} distinct raw, {} stored in {} packs of {}",
        HumanBytes(report.logical_bytes),
        HumanBytes(report.unique_raw_bytes),
        HumanBytes(report.unique_stored_bytes),
        report.pack_count,
        HumanBytes(report.pack_bytes)
    );
    ratios(report.dedup_ratio, report.compression_ratio);
    println!(
        "reclaimable     {} in packs (`rewind gc`), {} of journal (next checkpoints)",
        HumanBytes(report.reclaimable_bytes),
        HumanBytes(report.journal_bytes_reclaimable)
    );
    println!(
        "bytes by place  journal {}, packs {}, current stores {} (sparse), chunk table {}",
        HumanBytes(report.journal_bytes),
        HumanBytes(report.pack_bytes),
        HumanBytes(report.current_bytes),
        HumanBytes(report.chunk_table_bytes)
    );
    println!(
        "memory          {} for chunk counts and dedup filters ({} dedup entries)",
        HumanBytes(report.chunk_memory_bytes),
        report.dedup_index_entries
    );
    if let Some(cause) = &report.chunk_store_poisoned {
        println!("STOPPED         archiving and collection stopped until restart: {cause}");
    }
    if let Some(cause) = &report.collection_waits {
        println!("gc waits        {cause}");
    }
    if report.chunks_missing > 0 || report.packs_footer_damaged > 0 {
        println!(
            "damage          {} chunks damaged or missing (see `rewind volume info` of the volumes named in the log); \
             {} packs with a damaged footer, rewritten by the next `rewind gc`",
            report.chunks_missing, report.packs_footer_damaged
        );
    }
    let disk_state = match report.disk_state.as_str() {
        "exhausted" => "BELOW THE RESERVE: writes get ENOSPC; free space with `rewind history delete`, retention, `rewind gc` or `rewind volume delete`",
        "low" => "LOW: under twice the reserve",
        _ => "ok",
    };
    println!(
        "disk            {} free of {}; reserve {}: {disk_state}",
        HumanBytes(report.disk_free_bytes),
        HumanBytes(report.disk_total_bytes),
        HumanBytes(report.disk_reserve_bytes)
    );
    if let Some(bucket) = &report.bucket {
        println!(
            "bucket          {} in {} packs; here {} in {} packs; waiting for upload {} in {} packs (oldest {:.1} s)",
            HumanBytes(bucket.bucket_bytes),
            bucket.bucket_packs,
            HumanBytes(bucket.local_bytes),
            bucket.local_packs,
            HumanBytes(bucket.upload_waiting_bytes),
            bucket.upload_waiting_packs,
            bucket.upload_lag_seconds
        );
        if bucket.kept_packs > 0 {
            println!(
                "  kept here     {} packs the present of logging volumes reads, whatever --cache-max",
                bucket.kept_packs
            );
        }
        println!(
            "bucket traffic  {} uploads ({}), {} reads from the bucket ({}), {} evictions; cache hit ratio {:.3}",
            bucket.uploads,
            HumanBytes(bucket.uploaded_bytes),
            bucket.bucket_reads,
            HumanBytes(bucket.bucket_read_bytes),
            bucket.evictions,
            bucket.cache_hit_ratio
        );
        if let Some(alert) = &bucket.alert {
            println!("ALERT           {alert}");
        }
        match &bucket.catalog {
            None => println!("catalog         none published yet: `rewind node recover` has nothing to rebuild from"),
            Some(catalog) => {
                println!(
                    "catalog         generation {}, taken {}, current as of {:.1} s ago",
                    catalog.generation, catalog.taken, catalog.age_seconds
                );
                for volume in &catalog.volumes {
                    println!(
                        "  {:<14}recoverable to {} ({:.1} s ago)",
                        volume.name, volume.recoverable_to, volume.rpo_seconds
                    );
                }
                if let Some(pool) = &catalog.pool {
                    let others: Vec<String> = pool
                        .other_nodes
                        .iter()
                        .map(|peer| match &peer.catalog_taken {
                            Some(taken) => format!("{} (catalog {})", peer.name, taken),
                            None => format!("{} (no catalog yet)", peer.name),
                        })
                        .collect();
                    println!(
                        "shared bucket   node {} (number {}); others: {}",
                        pool.node_name,
                        pool.node_number,
                        if others.is_empty() { "none".to_owned() } else { others.join(", ") }
                    );
                    println!(
                        "  borrowed      {} chunks ({}) kept in other nodes' packs; {} lendable; {} packs of ours wait \
                         to leave the bucket",
                        pool.chunks_borrowed,
                        HumanBytes(pool.bytes_borrowed),
                        pool.chunks_lendable,
                        bucket.retired_packs
                    );
                }
                if let Some(lock) = &catalog.lock {
                    println!(
                        "object lock     {} held, each for {} past its last use ({} waiting to expire, {} pending); \
                         {} older catalogs kept (node recover --as-of)",
                        lock.held,
                        humantime::format_duration(std::time::Duration::from_secs(lock.period_seconds)),
                        lock.waiting_to_expire,
                        lock.pending,
                        catalog.held_catalogs
                    );
                }
            }
        }
    }
    for damaged in &report.volumes_damaged {
        println!("DAMAGED         {}: {}", damaged.name, damaged.problem.as_deref().unwrap_or_default());
    }
    store_io(&report.io);
    if report.volumes.is_empty() {
        return;
    }
    println!();
    let rows: Vec<Vec<String>> = report
        .volumes
        .iter()
        .map(|volume| {
            vec![
                volume.volume.clone(),
                volume.versions_written.to_string(),
                volume.versions_kept.to_string(),
                format!("{:.3}", volume.retained_fraction),
                HumanBytes(volume.logical_bytes).to_string(),
                HumanBytes(volume.pack_bytes).to_string(),
                ratio(volume.dedup_ratio),
                ratio(volume.compression_ratio),
                HumanBytes(volume.journal_bytes).to_string(),
                volume.space_max.clone(),
            ]
        })
        .collect();
    table(&["VOLUME", "WRITTEN", "KEPT", "R", "LOGICAL", "PACKS", "DEDUP", "COMPRESS", "JOURNAL", "CAP"], &rows);
}

pub fn gc_progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:30} {wide_bar} {pos}/{len} {percent}% ETA {eta}").expect("valid template"),
    );
    bar
}

pub fn gc_progress(bar: &ProgressBar, phase: &str, done: u64, total: u64) {
    if bar.message() != phase {
        bar.set_message(phase.to_owned());
        bar.reset();
    }
    bar.set_length(total);
    bar.set_position(done);
}

pub fn gc_report(report: &GcReport) {
    println!(
        "freed {} chunks; deleted {} packs, rewrote {} into {} ({} chunks moved); {} given back",
        report.chunks_freed,
        report.packs_deleted,
        report.packs_rewritten,
        report.packs_written,
        report.chunks_moved,
        HumanBytes(report.bytes_reclaimed)
    );
}
