//! Creating and opening a volume: its parts made or found, the journal after
//! the last checkpoint replayed into the current store (or, where the layout
//! files history at destage, back into the overlay), the index and the
//! timeline, and the volume assembled from them. A damaged tail is reported,
//! never cut in silence (see `rewind_journal::DroppedTail`).

use super::destage::CACHE_DIRTY_FRACTION;
use super::maintenance::write_checkpoint;
use super::promote::BaseCopy;
use super::*;
use rewind_format::journal::CompoundExtent;

/// Re-applies one record's extents to the current store: `data` holds the
/// data extents' blocks in order, `metas` every block's entry.
fn apply_extents(
    current: &CurrentStore,
    extents: &[CompoundExtent],
    data: &[u8],
    metas: &[BlockMeta],
    block_bytes: usize,
) -> Result<(), EngineError> {
    let (mut data_at, mut meta_at) = (0, 0);
    for extent in extents {
        let count = extent.block_count as usize;
        let metas = &metas[meta_at..meta_at + count];
        meta_at += count;
        match extent.zero {
            true => current.zero_blocks(extent.block_first, metas)?,
            false => {
                current.write_blocks(extent.block_first, &data[data_at..data_at + count * block_bytes], metas)?;
                data_at += count * block_bytes;
            }
        }
    }
    Ok(())
}

/// The storage parts a volume is assembled from.
pub(super) struct Parts {
    journal: Journal,
    index: VersionIndex,
    current: Option<CurrentStore>,
    history: History,
    io: VolumeIo,
}

/// What recovery hands the volume it opens.
pub(super) struct Recovered {
    /// Time of the newest record replayed.
    timestamp_last: Timestamp,
    /// Versions replayed that go back to the overlay (COW and the other
    /// layouts that file history as it leaves the overlay).
    pending: Vec<Pending>,
    /// The journal tail cut off, if any.
    dropped: Option<rewind_journal::DroppedTail>,
    /// Some records could not be re-applied to the current store.
    unsettled: bool,
}

pub(super) fn corrupt_file(path: &str, error: rewind_format::FormatError) -> EngineError {
    EngineError::Corrupt {
        volume: path.split('/').nth(1).unwrap_or(path).to_owned(),
        detail: format!("{path}: {error}"),
    }
}

impl Volume {
    pub(crate) fn create(
        storage: Arc<dyn Storage>,
        dir: &str,
        meta: VolumeMeta,
        policy: VolumePolicy,
        config: VolumeConfig,
        shared: &Shared,
        base: Option<Base>,
    ) -> Result<Arc<Volume>, EngineError> {
        assert_eq!(meta.base, base.as_ref().map(Base::origin), "a clone is created with its base, lent");
        storage.create_dir_all(dir).map_err(EngineError::io(dir))?;
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let io = VolumeIo::new(&storage);
        let journal_dir = format!("{dir}/journal");
        let journal = Journal::create(io.journal(), &journal_dir, meta.block_size, config.journal, meta.created)?
            .sharing_recent_memory(Arc::clone(&shared.journal_memory));
        let cache = Arc::clone(&shared.cache);
        let rules = LayoutRules::of(meta.layout);
        let index_config = IndexConfig { late_entries: rules.history_at_destage(), ..config.index };
        let index = VersionIndex::create(io.index(), &format!("{dir}/index"), index_config, cache)?;
        let current = match rules.has_current_store() {
            true => {
                let current =
                    CurrentStore::open(&*io.current(), dir, meta.block_size, block_count, OpenMode::CreateNew)?;
                current.sync()?;
                Some(current)
            }
            false => None,
        };
        let history = History::create(&*storage, dir, policy)?;
        index.set_thinning(history.thinning(meta.created));
        let checkpoint =
            Checkpoint { lsn: Lsn::ZERO, replay_from: journal.position_next(), timestamp_last: meta.created };
        write_checkpoint(&*storage, dir, &checkpoint)?;
        // Written last: a directory without it is an unfinished creation.
        let path = format!("{dir}/volume.meta");
        write_file_atomic(&*storage, &path, &meta.encode()).map_err(EngineError::io(&path))?;
        let parts = Parts { journal, index, current, history, io };
        let recovered =
            Recovered { timestamp_last: meta.created, pending: Vec::new(), dropped: None, unsettled: false };
        Ok(Arc::new(Volume::assemble(storage, dir, meta, config, parts, checkpoint, shared, recovered, base)))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &str,
        meta: VolumeMeta,
        config: VolumeConfig,
        Parts { journal, index, current, history, io }: Parts,
        checkpoint: Checkpoint,
        shared: &Shared,
        Recovered { timestamp_last, pending, dropped: recovered, unsettled }: Recovered,
        base: Option<Base>,
    ) -> Volume {
        let chunks = Arc::clone(&shared.chunks);
        let cache = LayoutRules::of(meta.layout).has_controller_cache().then(|| {
            let block_bytes = u64::from(meta.block_size.bytes());
            ControllerCache::new(CacheConfig::new(meta.cache_bytes, block_bytes, CACHE_DIRTY_FRACTION))
        });
        // A volume's overlay holds at most its every block, and at most its limit.
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let overlay_blocks_max = usize::try_from(block_count).unwrap_or(usize::MAX).min(config.overlay_versions_max);
        let absorbs = LayoutRules::of(meta.layout).overlay_absorbs_overwrites();
        let overlay = Overlay::new(cache, pending, absorbs, overlay_blocks_max);
        let (overlay_versions, overlay_held) = (overlay.versions(), overlay.held());
        let zero_block_crc32c = rewind_format::crc32c(&vec![0u8; meta.block_size.bytes() as usize]);
        // Every write after a revert is after it, whatever the journal holds;
        // so is every write after a bookmark made "now" (a point pinned on the
        // clock, after the last record — a restart must not stamp a later
        // write with it, which would change what the bookmark shows).
        let reverted = history.reverts.lock().entries.last().map_or(Timestamp::MIN, |revert| revert.at);
        let bookmarked = history.bookmarks.lock().entries.iter().map(|bookmark| bookmark.timestamp).max();
        let reverted = reverted.max(bookmarked.unwrap_or(Timestamp::MIN));
        index.set_release_hook(Arc::new(crate::volume::archive::ReleaseChunks {
            chunks: Arc::clone(&chunks),
            block_bytes: meta.block_size.bytes(),
        }));
        Volume {
            dir: dir.to_owned(),
            storage,
            config,
            write: Mutex::new(WriteState {
                timestamp_last: checkpoint.timestamp_last.max(timestamp_last).max(reverted),
                timestamp_floor: index.archived_before(),
                overlay,
                timeline_unsaved: BTreeMap::new(),
                crcs: Vec::new(),
                versions: Vec::new(),
            }),
            destage: Mutex::new(DestageState { lsn_applied: journal.lsn_durable(), sweep_next: 0 }),
            room: Mutex::new(()),
            room_made: parking_lot::Condvar::new(),
            writers_waiting_for_room: AtomicUsize::new(0),
            maintenance: Mutex::new(MaintenanceState::after(&checkpoint)),
            history_work: Mutex::new(HistoryWork::after(&checkpoint)),
            bookmark_layout: Mutex::default(),
            journal,
            index,
            current,
            chunks,
            io,
            overlay_versions: AtomicUsize::new(overlay_versions),
            overlay_held: AtomicUsize::new(overlay_held),
            poisoned: Mutex::new(None),
            closed: AtomicBool::new(false),
            history,
            adopted_segments: Mutex::default(),
            space: Mutex::new(None),
            space_tally: Mutex::new(None),
            counters: Counters::default(),
            written_at_nanos: AtomicU64::new(0),
            undurable_since_nanos: AtomicU64::new(0),
            burst_began_nanos: AtomicU64::new(0),
            reads_seen: AtomicU64::new(0),
            read_bytes_seen: AtomicU64::new(0),
            reads_small: AtomicBool::new(false),
            read_at_nanos: AtomicU64::new(0),
            clients: crate::volume::clients::Clients::default(),
            damage: crate::volume::damage::HistoryDamage::default(),
            fault: Mutex::new(None),
            fault_logged: Mutex::new(None),
            recovered,
            settled: AtomicBool::new(!unsettled),
            disk: Arc::clone(&shared.space),
            passes_wanted: Arc::clone(&shared.passes_wanted),
            clock: Arc::clone(&shared.clock),
            work: Arc::clone(&shared.work),
            journal_work: Arc::clone(&shared.journal_work),
            zero_block_crc32c,
            meta,
            base: Mutex::new(base.map(Arc::new)),
            clones: Mutex::new(BTreeMap::new()),
            promoting: AtomicBool::new(false),
            revert_copy: Mutex::new(None),
            revert_copying: Mutex::new(()),
        }
    }

    /// Reads what the volume in `dir` was created as (healing a damaged copy).
    pub(crate) fn read_meta(storage: &dyn Storage, dir: &str) -> Result<VolumeMeta, EngineError> {
        let meta_path = format!("{dir}/volume.meta");
        let bytes = read_file_healing(storage, &meta_path, healed).map_err(EngineError::io(&meta_path))?;
        VolumeMeta::decode(&bytes).map_err(|error| corrupt_file(&meta_path, error))
    }

    /// Opens a volume and recovers it: replays the journal after the last
    /// checkpoint into the current store, the index and the timeline. A
    /// clone gets its base from `lend` (the base is open already).
    /// `branch_points` are where this volume's clones start: they hold them
    /// only once opened, after it, and recovery thins the index (its
    /// checkpoint persists the replayed versions), so it keeps them exact.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: &str,
        config: VolumeConfig,
        shared: &Shared,
        lend: &dyn Fn(&VolumeMeta) -> Result<Option<Base>, EngineError>,
        branch_points: &[Timestamp],
    ) -> Result<Arc<Volume>, EngineError> {
        let meta = Volume::read_meta(&*storage, dir)?;
        let base = match &meta.base {
            Some(origin) if origin.copied => Some(Base::Copied(BaseCopy::open(&storage, dir, &meta)?)),
            _ => {
                BaseCopy::remove_unfinished(&*storage, dir)?;
                lend(&meta)?
            }
        };
        let volume_name = meta.name.to_string();
        let checkpoint_path = format!("{dir}/checkpoint");
        let bytes =
            read_file_healing(&*storage, &checkpoint_path, healed).map_err(EngineError::io(&checkpoint_path))?;
        let checkpoint = Checkpoint::decode(&bytes).map_err(|error| corrupt_file(&checkpoint_path, error))?;
        let block_count = meta.size_bytes / u64::from(meta.block_size.bytes());
        let cache = Arc::clone(&shared.cache);
        let io = VolumeIo::new(&storage);
        let rules = LayoutRules::of(meta.layout);
        let index_config = IndexConfig { late_entries: rules.history_at_destage(), ..config.index };
        let index = VersionIndex::open(io.index(), &format!("{dir}/index"), index_config, cache)?;
        let current = match rules.has_current_store() {
            true => Some(CurrentStore::open(&*io.current(), dir, meta.block_size, block_count, OpenMode::Existing)?),
            false => None,
        };
        let history = History::open(&*storage, dir)?;
        index.set_thinning(history.thinning_pinning(meta.created, branch_points));
        let lsn_indexed = index.lsn_indexed();
        // In COW only copy records are indexed: the last may be older.
        if lsn_indexed < checkpoint.lsn && !rules.history_at_destage() {
            return Err(EngineError::Corrupt {
                volume: volume_name,
                detail: format!(
                    "the version index covers the journal up to LSN {lsn_indexed}, but the checkpoint says {}",
                    checkpoint.lsn
                ),
            });
        }
        let mut recovery = Journal::recover(
            io.journal(),
            &format!("{dir}/journal"),
            meta.block_size,
            config.journal,
            checkpoint.replay_from,
            checkpoint.lsn.next(),
            checkpoint.timestamp_last,
        )?;
        let block_bytes = meta.block_size.bytes() as usize;
        let zero_block_crc32c = rewind_format::crc32c(&vec![0u8; block_bytes]);
        let mut timestamp_last = checkpoint.timestamp_last;
        let mut timeline = BTreeMap::new();
        let mut versions = Vec::new();
        let mut metas = Vec::new();
        // COW: writes since the checkpoint go back to the overlay, to be
        // destaged with their copies; its copy records go back to the index.
        let copies_history = rules.history_at_destage();
        let mut recovered = Vec::new();
        // Records that could not be re-applied to the current store (a full
        // disk) wait in the overlay, as COW's do, and the volume is unsettled.
        let mut unsettled = false;
        while let Some(record) = recovery.next_record()? {
            let header = record.header;
            if header.kind == RecordKind::Copy {
                if header.lsn > lsn_indexed {
                    index.insert(header.lsn, &record.copies()?);
                }
                continue;
            }
            let extents = match header.kind {
                RecordKind::Write | RecordKind::Zero => vec![CompoundExtent {
                    block_first: header.block_first,
                    block_count: header.block_count,
                    zero: header.kind == RecordKind::Zero,
                }],
                RecordKind::Compound => record.extents()?,
                RecordKind::Copy => unreachable!("handled above"),
                RecordKind::Vouch | RecordKind::Lost => unreachable!("recovery reads these records itself"),
            };
            if extents.iter().any(|extent| extent.block_first.0 + u64::from(extent.block_count) > block_count) {
                return Err(EngineError::Corrupt {
                    volume: volume_name,
                    detail: format!("journal record {} addresses blocks past the end of the volume", header.lsn),
                });
            }
            versions.clear();
            metas.clear();
            // A revert's copy takes effect from the revert (see `revert_copy.rs`).
            let timestamp = header.revert.unwrap_or(header.timestamp);
            let mut data_blocks = 0u32;
            for extent in &extents {
                for block in extent.block_first.0..extent.block_first.0 + u64::from(extent.block_count) {
                    let (data, crc32c, state) = match extent.zero {
                        true => (VersionData::Zero, zero_block_crc32c, BlockState::Zero),
                        false => {
                            let offset = record.data_offset() + data_blocks * meta.block_size.bytes();
                            let crc32c = record.block_crc(data_blocks);
                            data_blocks += 1;
                            (VersionData::Journal { segment: record.segment, offset }, crc32c, BlockState::Data)
                        }
                    };
                    versions.push(Version { block: BlockIndex(block), timestamp, data, crc32c });
                    metas.push(BlockMeta { state, crc32c, timestamp });
                }
            }
            // Re-applied (for ROW, an early merge) unless COW must copy first.
            let lsn = header.lsn;
            let pending = |versions: &Vec<Version>| -> Vec<Pending> {
                versions.iter().map(|&version| Pending { lsn, version }).collect()
            };
            match &current {
                None => {}
                Some(_) if copies_history || unsettled => recovered.extend(pending(&versions)),
                Some(current) => match apply_extents(current, &extents, record.data, &metas, block_bytes) {
                    Ok(()) => {}
                    Err(error) if error.is_transient() => {
                        tracing::warn!(
                            volume = %volume_name, %error,
                            "cannot re-apply the journal to the current store; the rest waits in memory, and \
                             views wait until it is applied"
                        );
                        unsettled = true;
                        recovered.extend(pending(&versions));
                    }
                    Err(error) => return Err(error),
                },
            }
            // (A repair may replay from further back than the index covers:
            // what is archived is in archived runs already.)
            // A revert's copy is neither history nor a write.
            let is_write = header.revert.is_none();
            if is_write && header.lsn > lsn_indexed && !copies_history && header.timestamp >= index.archived_before() {
                index.insert(header.lsn, &versions);
            }
            if is_write && header.lsn > history.timeline_lsn() {
                let zero_blocks = metas.iter().filter(|meta| meta.state == BlockState::Zero).count() as u64;
                add_record_to_timeline(
                    &mut timeline,
                    header.timestamp,
                    metas.len() as u64,
                    zero_blocks,
                    block_bytes as u64,
                );
            }
            timestamp_last = header.timestamp;
        }
        let (journal, report) = recovery.finish()?;
        let journal = journal.sharing_recent_memory(Arc::clone(&shared.journal_memory));
        if lsn_indexed > journal.lsn_durable() {
            return Err(EngineError::Corrupt {
                volume: volume_name,
                detail: format!(
                    "the version index covers LSN {lsn_indexed} but the journal ends at {}",
                    journal.lsn_durable()
                ),
            });
        }
        if report.records_replayed > 0 {
            tracing::info!(volume = %meta.name, records = report.records_replayed, "recovered volume from its journal");
        }
        if let Some(dropped) = &report.dropped {
            let lsn = dropped.lsn_first;
            let bytes = dropped.bytes;
            let reason = &dropped.reason;
            match dropped.whole {
                true => tracing::warn!(
                    volume = %meta.name, lsn_from = %lsn, bytes, %reason,
                    "dropped the end of the journal: a record there was whole but failed its checks, which could \
                     be a torn write or damage, and no later record vouched for it"
                ),
                false => tracing::info!(
                    volume = %meta.name, lsn_from = %lsn, bytes, %reason,
                    "dropped a torn write from the end of the journal"
                ),
            }
        }
        let recovered = Recovered { timestamp_last, pending: recovered, dropped: report.dropped, unsettled };
        let parts = Parts { journal, index, current, history, io };
        let volume = Volume::assemble(storage, dir, meta, config, parts, checkpoint, shared, recovered, base);
        debug_assert_eq!(volume.zero_block_crc32c, zero_block_crc32c);
        volume.write.lock().timeline_unsaved = timeline;
        volume.resume_revert_copy()?;
        // Make the replay durable so the next start need not repeat it. In
        // COW that destages, which copies into the chunk store: the node
        // does it once the store has counted its references. On a full disk
        // it waits: recovery itself needs no new space.
        if !volume.rules().history_at_destage() {
            if let Err(error) = volume.checkpoint(timestamp_last) {
                if !error.is_transient() {
                    return Err(error);
                }
                tracing::warn!(volume = %volume.name(), %error, "cannot checkpoint after recovery yet; maintenance tries again");
            }
        }
        Ok(Arc::new(volume))
    }
}
