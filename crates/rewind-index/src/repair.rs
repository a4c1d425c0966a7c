//! Repairs of an index whose runs are damaged, done while the volume is
//! closed (`rewind volume repair`). Two cases, by what can be rebuilt:
//!
//! - A *recent* run holds versions whose data is still in the journal: the
//!   journal is the redo log of the index, so all recent runs are dropped
//!   and recovery files their versions again ([`drop_recent_runs`]).
//! - An *archived* run is the only record of which chunk each of its
//!   versions is: it is rewritten from its pages that verify, and the
//!   versions on the others are lost ([`salvage_run`]), reported by key
//!   range so the operator knows which blocks and times.

use rewind_format::index::{decode_fence, key_of, Page, RunHeader, ENTRIES_PER_PAGE, PAGE_BYTES};
use rewind_format::meta::{healed, IndexManifest, RunInfo};
use rewind_io::{read_file_healing, write_file_atomic, OpenMode, Storage};
use rewind_types::{Lsn, Timestamp, Version};

use crate::run::RunWriter;
use crate::{run_name, IndexError, MANIFEST};

/// Which run a damage report names, from its path (`…/index/0000000004.run`).
pub fn run_id_of(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    name.strip_suffix(".run").filter(|digits| digits.len() == 10)?.parse().ok()
}

/// The manifest of the index in `dir`, and whether run `id` in it is
/// archived (its versions' data is in the chunk store).
pub fn run_is_archived(storage: &dyn Storage, dir: &str, id: u64) -> Result<Option<bool>, IndexError> {
    let manifest = read_manifest(storage, dir)?;
    let archived = |run: &RunInfo| manifest.late_entries || run.timestamp_max < manifest.archived_before;
    Ok(manifest.runs.iter().find(|run| run.id == id).map(archived))
}

/// Drops every recent run (versions at or after `archived before`, whose
/// data is in the journal) and sets the LSN the runs cover to
/// `lsn_indexed`, from which recovery files the journal's versions again.
/// Returns how many versions were dropped (to be filed again).
pub fn drop_recent_runs(storage: &dyn Storage, dir: &str, lsn_indexed: Lsn) -> Result<u64, IndexError> {
    let mut manifest = read_manifest(storage, dir)?;
    assert!(!manifest.late_entries, "late entries are all archived");
    let (recent, archived): (Vec<RunInfo>, Vec<RunInfo>) =
        manifest.runs.iter().partition(|run| run.timestamp_min >= manifest.archived_before);
    manifest.runs = archived;
    manifest.lsn_indexed = manifest.lsn_indexed.min(lsn_indexed);
    write_manifest(storage, dir, &manifest)?;
    for run in &recent {
        let path = format!("{dir}/{}", run_name(run.id));
        storage.remove_file(&path).map_err(IndexError::io(&path))?;
    }
    Ok(recent.iter().map(|run| run.entry_count).sum())
}

/// What [`salvage_run`] kept and lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Salvage {
    pub kept: u64,
    pub lost: u64,
    /// Keys of the first version of each lost page (block, time), where
    /// the run's fence still says; the run's time range otherwise.
    pub lost_from: Vec<(u64, Timestamp)>,
    pub timestamp_min: Timestamp,
    pub timestamp_max: Timestamp,
    /// The lost versions themselves are unknown; those on pages that could
    /// be read but not trusted are not counted twice.
    pub pages_lost: u64,
}

/// Rewrites run `id` of the index in `dir` from its data pages that verify
/// (each page checks itself), as a new run in its place. The pages are
/// found from the manifest's entry count, so a damaged header or fence
/// does not stop it.
pub fn salvage_run(storage: &dyn Storage, dir: &str, id: u64) -> Result<Salvage, IndexError> {
    let mut manifest = read_manifest(storage, dir)?;
    let position = manifest.runs.iter().position(|run| run.id == id).ok_or_else(|| IndexError::Corrupt {
        path: format!("{dir}/{MANIFEST}"),
        reason: format!("run {id} is not in the manifest"),
    })?;
    let info = manifest.runs[position];
    let path = format!("{dir}/{}", run_name(id));
    let file = storage.open_file(&path, OpenMode::Existing).map_err(IndexError::io(&path))?;
    let pages = info.entry_count.div_ceil(ENTRIES_PER_PAGE as u64);
    // The fence names each page's first key: what a lost page held.
    let fence = {
        let mut header = vec![0u8; PAGE_BYTES];
        file.read_exact_at(&mut header, 0).ok().and_then(|()| RunHeader::decode(&header).ok()).and_then(|header| {
            let mut bytes = vec![0u8; header.fence_bytes() as usize];
            file.read_exact_at(&mut bytes, header.fence_offset()).ok()?;
            decode_fence(&bytes, &header).ok()
        })
    };
    let mut salvage =
        Salvage { timestamp_min: info.timestamp_min, timestamp_max: info.timestamp_max, ..Salvage::default() };
    let mut kept: Vec<Version> = Vec::new();
    let mut bytes = vec![0u8; PAGE_BYTES];
    for number in 0..pages {
        let read = file.read_exact_at(&mut bytes, (1 + number) * PAGE_BYTES as u64);
        let entries = read
            .ok()
            .and_then(|()| Page::verify(&bytes, number).ok())
            .and_then(|page| (0..page.len()).map(|index| page.entry(index).ok()).collect::<Option<Vec<Version>>>());
        match entries {
            // Keys strictly increase across pages; a page out of order is not trusted.
            Some(entries) if kept.last().is_none_or(|last| key_of(last) < key_of(&entries[0])) => kept.extend(entries),
            _ => {
                salvage.pages_lost += 1;
                if let Some(&(block, nanos)) = fence.as_ref().and_then(|fence| fence.get(number as usize)) {
                    salvage.lost_from.push((block, Timestamp::from_unix_nanos(nanos)));
                }
            }
        }
    }
    salvage.kept = kept.len() as u64;
    salvage.lost = info.entry_count.saturating_sub(salvage.kept);
    if kept.is_empty() {
        manifest.runs.remove(position);
    } else {
        let new_id = manifest.run_id_next;
        manifest.run_id_next += 1;
        let mut writer = RunWriter::create(storage, &format!("{dir}/{}", run_name(new_id)))?;
        for version in kept {
            writer.push(version)?;
        }
        manifest.runs[position] = writer.finish(new_id)?;
    }
    write_manifest(storage, dir, &manifest)?;
    drop(file);
    storage.remove_file(&path).map_err(IndexError::io(&path))?;
    Ok(salvage)
}

fn read_manifest(storage: &dyn Storage, dir: &str) -> Result<IndexManifest, IndexError> {
    let path = format!("{dir}/{MANIFEST}");
    let bytes = read_file_healing(storage, &path, healed).map_err(IndexError::io(&path))?;
    IndexManifest::decode(&bytes).map_err(IndexError::corrupt(&path))
}

fn write_manifest(storage: &dyn Storage, dir: &str, manifest: &IndexManifest) -> Result<(), IndexError> {
    let path = format!("{dir}/{MANIFEST}");
    write_file_atomic(storage, &path, &manifest.encode()).map_err(IndexError::io(&path))
}
