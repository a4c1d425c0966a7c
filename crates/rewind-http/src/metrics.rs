//! `/metrics` in the Prometheus text exposition format.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use rewind_engine::{IoStats, Node, Timestamp};

use crate::ApiState;

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(String, u64)>,
}

pub async fn metrics(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    let text =
        tokio::task::spawn_blocking(move || render(&state.node)).await.expect("metrics rendering does not panic");
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Device I/O by store: each volume's journal, current store and index,
/// and the node's chunk store.
fn store_io_families(node: &Node) -> Vec<Family> {
    let mut stores: Vec<(String, IoStats)> = Vec::new();
    for volume in node.volumes() {
        let io = volume.io_stats();
        for (store, stats) in [("journal", io.journal), ("current", io.current), ("index", io.index)] {
            stores.push((format!("volume=\"{}\",store=\"{store}\"", volume.name()), stats));
        }
    }
    stores.push(("store=\"chunks\"".to_owned(), node.chunk_io_stats()));
    type Field = (&'static str, &'static str, fn(&IoStats) -> u64);
    let fields: [Field; 6] = [
        ("rewind_store_reads_total", "Device reads, by store.", |io| io.reads),
        ("rewind_store_read_bytes_total", "Bytes read from the device, by store.", |io| io.read_bytes),
        ("rewind_store_writes_total", "Device writes, by store.", |io| io.writes),
        ("rewind_store_write_bytes_total", "Bytes written to the device, by store.", |io| io.write_bytes),
        ("rewind_store_sequential_total", "Reads and writes that began where the store's previous one ended.", |io| {
            io.sequential
        }),
        ("rewind_store_syncs_total", "fsyncs (data and directories), by store.", |io| io.syncs),
    ];
    fields
        .into_iter()
        .map(|(name, help, field)| Family {
            name,
            kind: "counter",
            help,
            samples: stores.iter().map(|(labels, stats)| (labels.clone(), field(stats))).collect(),
        })
        .collect()
}

fn render(node: &Node) -> String {
    let mut families: Vec<Family> = [
        ("rewind_volume_writes_total", "counter", "Write requests."),
        ("rewind_volume_write_bytes_total", "counter", "Bytes written."),
        ("rewind_volume_zeroes_total", "counter", "Zeroing requests (TRIM, WRITE_ZEROES)."),
        ("rewind_volume_zero_bytes_total", "counter", "Bytes zeroed."),
        ("rewind_volume_reads_total", "counter", "Read requests, live and views."),
        ("rewind_volume_read_bytes_total", "counter", "Bytes read, live and views."),
        ("rewind_volume_flushes_total", "counter", "Flushes (journal group commits requested)."),
        ("rewind_volume_checkpoints_total", "counter", "Checkpoints."),
        ("rewind_volume_versions", "gauge", "Block versions kept in history."),
        (
            "rewind_volume_versions_thinned_total",
            "counter",
            "Block versions dropped by granularity, retention and history deletes.",
        ),
        ("rewind_volume_granularity_nanoseconds", "gauge", "Protection granularity (0: every write is kept)."),
        (
            "rewind_volume_oldest_kept_seconds",
            "gauge",
            "Unix time of the oldest state retention keeps (0: retention has dropped nothing).",
        ),
        ("rewind_volume_versions_archived", "gauge", "Kept versions archived into the chunk store (or zeros)."),
        ("rewind_volume_index_runs", "gauge", "Version index runs on disk."),
        ("rewind_volume_index_memory_bytes", "gauge", "Memory pinned by the version index."),
        ("rewind_volume_journal_bytes", "gauge", "Bytes in the journal."),
        (
            "rewind_volume_journal_reclaimable_bytes",
            "gauge",
            "Journal bytes holding only archived history, given back at the next checkpoint.",
        ),
        (
            "rewind_volume_journal_reclaimed_bytes_total",
            "counter",
            "Journal bytes given back since the server started.",
        ),
        ("rewind_volume_current_bytes", "gauge", "Apparent size of the current store (sparse files)."),
        (
            "rewind_volume_pack_bytes",
            "gauge",
            "Stored bytes of the distinct chunks the volume's history refers to (measured at each scrape; kept between while that history is unchanged).",
        ),
        ("rewind_volume_space_max_bytes", "gauge", "Space cap of the archived history (0: none)."),
        ("rewind_volume_pending_destage_versions", "gauge", "Versions not yet copied to the current store."),
        ("rewind_volume_writers_waiting_for_room", "gauge", "Writers waiting now for destaging to make room."),
        (
            "rewind_volume_revert_copied_blocks_total",
            "counter",
            "Blocks the background copy after a revert put back into the current store since the server started.",
        ),
        (
            "rewind_volume_revert_copy_left_blocks",
            "gauge",
            "Blocks the background copy after the last revert has yet to look at (0: finished or none).",
        ),
        ("rewind_volume_size_bytes", "gauge", "Volume size."),
        ("rewind_volume_poisoned", "gauge", "1 if the volume refuses writes after a failed fsync."),
        (
            "rewind_volume_failing",
            "gauge",
            "1 while the volume's background work meets a transient error (a full disk), retried by itself.",
        ),
        ("rewind_volume_recovering", "gauge", "1 while recovery waits for free space: views wait."),
        (
            "rewind_volume_journal_tail_dropped_bytes",
            "gauge",
            "Bytes cut off the journal's end when the volume was opened (nothing later vouched for them).",
        ),
        ("rewind_volume_history_damage", "gauge", "Notes of damaged or lost history (see rewind volume info)."),
    ]
    .into_iter()
    .map(|(name, kind, help)| Family { name, kind, help, samples: Vec::new() })
    .collect();
    for volume in node.volumes() {
        let Ok(stats) = volume.stats() else { continue };
        let values = [
            stats.writes,
            stats.write_bytes,
            stats.zeroes,
            stats.zero_bytes,
            stats.reads,
            stats.read_bytes,
            stats.flushes,
            stats.checkpoints,
            stats.versions_in_memory + stats.versions_in_runs,
            stats.versions_thinned,
            volume.granularity_nanos(),
            volume.retention_horizon().map_or(0, |horizon| horizon.unix_seconds()),
            stats.versions_archived,
            stats.index_runs,
            stats.index_memory_bytes,
            stats.journal_bytes,
            stats.journal_bytes_reclaimable,
            stats.journal_bytes_reclaimed,
            stats.current_bytes,
            // A failed measurement (a damaged chunk table) says so in
            // `rewind stats`; here the last one stands.
            volume
                .measure_space(crate::server::now())
                .ok()
                .or_else(|| volume.space())
                .map_or(0, |space| space.chunk_stored_bytes),
            volume.space_max_bytes(),
            stats.versions_pending_destage,
            stats.writers_waiting_for_room,
            stats.revert_blocks_copied,
            stats.revert_copy.map_or(0, |copy| copy.blocks_total.saturating_sub(copy.blocks_done)),
            volume.size_bytes(),
            u64::from(stats.poisoned),
            u64::from(volume.fault().is_some()),
            u64::from(!volume.is_settled()),
            volume.journal_tail_dropped().map_or(0, |dropped| dropped.bytes),
            volume.history_damage().len() as u64,
        ];
        let label = format!("volume=\"{}\"", volume.name());
        for (family, value) in families.iter_mut().zip(values) {
            family.samples.push((label.clone(), value));
        }
    }
    let chunks = node.chunk_stats();
    let space = node.space();
    let node_families: [(&'static str, &'static str, &'static str, u64); 30] = [
        ("rewind_disk_total_bytes", "gauge", "Size of the data directory's filesystem.", space.total_bytes),
        ("rewind_disk_free_bytes", "gauge", "Free space on the data directory's filesystem.", space.free_bytes),
        (
            "rewind_disk_reserve_bytes",
            "gauge",
            "Free space client writes leave alone (--reserve).",
            space.reserve_bytes,
        ),
        (
            "rewind_disk_space_low",
            "gauge",
            "1 below twice the reserve, 2 below the reserve (writes get ENOSPC), 0 otherwise.",
            space.state as u64,
        ),
        ("rewind_volumes_damaged", "gauge", "Volumes that do not open.", node.damaged_volumes().len() as u64),
        (
            "rewind_chunks_missing",
            "gauge",
            "Chunks history refers to that are damaged or missing.",
            chunks.chunks_missing,
        ),
        (
            "rewind_chunk_packs_footer_damaged",
            "gauge",
            "Packs read through the chunk table because their footer is damaged.",
            chunks.packs_footer_damaged,
        ),
        (
            "rewind_chunk_recount_pending",
            "gauge",
            "1 while collection waits for every chunk reference to be counted again.",
            u64::from(chunks.recount_pending.is_some()),
        ),
        ("rewind_chunks_live", "gauge", "Chunks history refers to.", chunks.chunks_live),
        ("rewind_chunks_dead", "gauge", "Chunks nothing refers to, not yet collected.", chunks.chunks_dead),
        ("rewind_chunk_references", "gauge", "References from versions to chunks.", chunks.references),
        (
            "rewind_chunk_logical_bytes",
            "gauge",
            "Archived versions' bytes without deduplication or compression.",
            chunks.logical_bytes,
        ),
        ("rewind_chunk_unique_raw_bytes", "gauge", "Raw bytes of the chunks held.", chunks.unique_raw_bytes),
        (
            "rewind_chunk_unique_stored_bytes",
            "gauge",
            "Stored (compressed) bytes of the chunks held.",
            chunks.unique_stored_bytes,
        ),
        ("rewind_chunk_packs", "gauge", "Pack files.", chunks.pack_count),
        ("rewind_chunk_pack_bytes", "gauge", "Bytes in pack files.", chunks.pack_bytes),
        (
            "rewind_chunk_reclaimable_bytes",
            "gauge",
            "Pack bytes garbage collection can give back.",
            chunks.reclaimable_bytes,
        ),
        ("rewind_chunk_dedup_runs", "gauge", "Runs of the dedup index on disk.", chunks.dedup_runs),
        (
            "rewind_chunk_memory_bytes",
            "gauge",
            "Heap memory of reference counts and dedup filters.",
            chunks.memory_bytes,
        ),
        ("rewind_chunks_written_total", "counter", "Chunks stored since the server started.", chunks.chunks_written),
        (
            "rewind_chunk_raw_bytes_written_total",
            "counter",
            "Raw bytes of the chunks stored.",
            chunks.raw_bytes_written,
        ),
        (
            "rewind_chunk_stored_bytes_written_total",
            "counter",
            "Bytes the chunks stored took after compression.",
            chunks.stored_bytes_written,
        ),
        (
            "rewind_chunk_adopted_bytes_total",
            "counter",
            "Raw bytes of the chunks stored that were left where they lay in an adopted journal segment.",
            chunks.adopted_bytes,
        ),
        (
            "rewind_chunk_dedup_hits_total",
            "counter",
            "Archived versions whose bytes were already stored.",
            chunks.dedup_hits,
        ),
        ("rewind_chunk_collections_total", "counter", "Garbage collections run.", chunks.collections),
        ("rewind_chunks_freed_total", "counter", "Chunks freed by garbage collection.", chunks.chunks_freed),
        (
            "rewind_chunks_relocated_total",
            "counter",
            "Chunks copied by defrags to lay views out in block order.",
            chunks.chunks_relocated,
        ),
        ("rewind_chunk_packs_deleted_total", "counter", "Packs deleted by garbage collection.", chunks.packs_deleted),
        (
            "rewind_chunk_packs_rewritten_total",
            "counter",
            "Mostly dead packs rewritten by garbage collection.",
            chunks.packs_rewritten,
        ),
        (
            "rewind_chunk_store_poisoned",
            "gauge",
            "1 if a failed sync stopped archiving and collection until restart.",
            u64::from(chunks.poisoned.is_some()),
        ),
    ];
    for (name, kind, help, value) in node_families {
        families.push(Family { name, kind, help, samples: vec![(String::new(), value)] });
    }
    families.extend(store_io_families(node));
    if let Some(bucket) = node.bucket_stats() {
        let lag_nanos = node.bucket_upload_lag_nanos(crate::server::now()).unwrap_or(0);
        families.extend(bucket_families(&bucket, lag_nanos / 1_000_000_000));
        if let Some(catalog) = node.catalog_status() {
            families.push(catalog_family(&catalog, crate::server::now()));
        }
    }
    let cache = node.page_cache_stats();
    families.push(Family {
        name: "rewind_index_cache_hits_total",
        kind: "counter",
        help: "Version index page cache hits.",
        samples: vec![(String::new(), cache.hits)],
    });
    families.push(Family {
        name: "rewind_index_cache_misses_total",
        kind: "counter",
        help: "Version index page cache misses.",
        samples: vec![(String::new(), cache.misses)],
    });
    let mut text = String::new();
    for family in families {
        let _ = writeln!(text, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(text, "# TYPE {} {}", family.name, family.kind);
        for (labels, value) in family.samples {
            if labels.is_empty() {
                let _ = writeln!(text, "{} {value}", family.name);
            } else {
                let _ = writeln!(text, "{}{{{labels}}} {value}", family.name);
            }
        }
    }
    text
}

/// Per volume, how far behind the present its point in the newest catalog
/// is: what a lost disk would lose of it (the RPO).
fn catalog_family(catalog: &rewind_engine::catalog::CatalogStatus, now: Timestamp) -> Family {
    Family {
        name: "rewind_bucket_recovery_point_age_seconds",
        kind: "gauge",
        help: "Per volume, how old the newest point a recovery from the bucket rebuilds is (whole seconds).",
        samples: catalog
            .volumes
            .iter()
            .map(|(name, at)| {
                let age = now.unix_nanos().saturating_sub(at.unix_nanos()) / 1_000_000_000;
                (format!("volume=\"{name}\""), age)
            })
            .collect(),
    }
}

/// The packs' tiers with `--bucket`: where packs are, the upload lag, and
/// requests and bytes each way.
fn bucket_families(bucket: &rewind_engine::TierStats, upload_lag_seconds: u64) -> Vec<Family> {
    let one = |name, kind, help, value| Family { name, kind, help, samples: vec![(String::new(), value)] };
    let reads = Family {
        name: "rewind_bucket_pack_reads_total",
        kind: "counter",
        help: "Pack reads by where they were served: the local disk, memory, the bucket.",
        samples: vec![
            ("from=\"local\"".to_owned(), bucket.local_reads),
            ("from=\"memory\"".to_owned(), bucket.memory_reads),
            ("from=\"bucket\"".to_owned(), bucket.remote_reads),
        ],
    };
    vec![
        one("rewind_bucket_packs", "gauge", "Packs in the bucket.", bucket.remote_packs),
        one("rewind_bucket_bytes", "gauge", "Bytes of packs in the bucket.", bucket.remote_bytes),
        one("rewind_bucket_local_packs", "gauge", "Packs on the local disk.", bucket.local_packs),
        one("rewind_bucket_local_bytes", "gauge", "Bytes of packs on the local disk.", bucket.local_bytes),
        one(
            "rewind_bucket_upload_waiting_packs",
            "gauge",
            "Packs sealed here and not yet in the bucket (the upload lag).",
            bucket.upload_waiting_packs,
        ),
        one(
            "rewind_bucket_upload_waiting_bytes",
            "gauge",
            "Bytes of packs not yet in the bucket: what losing this disk would lose of the archived history.",
            bucket.upload_waiting_bytes,
        ),
        one(
            "rewind_bucket_upload_lag_seconds",
            "gauge",
            "How long the oldest pack not yet in the bucket has waited (whole seconds).",
            upload_lag_seconds,
        ),
        one("rewind_bucket_uploads_total", "counter", "Packs uploaded (PUT requests).", bucket.uploads),
        one("rewind_bucket_uploaded_bytes_total", "counter", "Bytes uploaded.", bucket.uploaded_bytes),
        one(
            "rewind_bucket_read_bytes_total",
            "counter",
            "Bytes read from the bucket (ranged GET requests).",
            bucket.remote_read_bytes,
        ),
        one("rewind_bucket_deletes_total", "counter", "Packs deleted from the bucket.", bucket.remote_deletes),
        one(
            "rewind_bucket_retired_packs",
            "gauge",
            "Packs deleted here whose bucket copies wait: for the next catalog, or for other nodes sharing the bucket.",
            bucket.retired_packs,
        ),
        one(
            "rewind_bucket_evictions_total",
            "counter",
            "Uploaded packs evicted from the local disk.",
            bucket.evictions,
        ),
        reads,
    ]
}
