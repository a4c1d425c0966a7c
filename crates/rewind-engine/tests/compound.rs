//! Compound writes (`Volume::write_compound`): several extents, one record,
//! one point in time — what file trees are built on. The model test
//! (`model.rs`) mixes them with everything else through crashes; this one
//! pins what a caller relies on: a view just before sees none of it and a
//! view at its time all of it, also after a restart; a change that cannot
//! be taken whole is refused whole; and a logging-layout volume of 2^60
//! bytes (a file tree's address space) needs no file of that size.

use std::sync::Arc;

use rewind_engine::{
    BlockSize, Change, Durability, EngineError, Layout, Node, NodeConfig, Timestamp, Volume, VolumeName, VolumeSpec,
    COMPOUND_BLOCKS_MAX,
};
use rewind_io::{SimConfig, SimStorage};

const BLOCK: u64 = 4096;

fn read(volume: &Arc<Volume>, at: Option<Timestamp>, offset: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; BLOCK as usize];
    match at {
        None => volume.read(offset, &mut buffer).unwrap(),
        Some(at) => volume.view(at).unwrap().read(offset, &mut buffer).unwrap(),
    }
    buffer
}

#[test]
fn a_compound_write_is_one_point_in_time_all_or_none() {
    let storage = SimStorage::new(SimConfig::default(), 7);
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let far = 1u64 << 59;
    let spec = VolumeSpec {
        layout: Layout::Logging,
        ..VolumeSpec::new(VolumeName::new("tree").unwrap(), 1 << 60, BlockSize::new(BLOCK as u32).unwrap())
    };
    let created = Timestamp::from_unix_nanos(1_000);
    let volume = node.create_volume(spec, created).unwrap();
    volume.write(created, far, &vec![9u8; 2 * BLOCK as usize], Durability::Buffered).unwrap();
    let before = volume.timestamp_last();
    let (inode, data) = (vec![1u8; BLOCK as usize], vec![2u8; 2 * BLOCK as usize]);
    let changes = [
        Change::Write { offset: far + 8 * BLOCK, data: &data },
        Change::Zero { offset: far, length: BLOCK },
        Change::Write { offset: 0, data: &inode },
    ];
    // The clock stands still: the compound write still gets a time of its own.
    let at = volume.write_compound(before, &changes, Durability::Fua).unwrap().at;
    assert_eq!(at, before.next());
    let check = |volume: &Arc<Volume>| {
        assert_eq!(read(volume, Some(before), 0), vec![0; BLOCK as usize]);
        assert_eq!(read(volume, Some(before), far), vec![9; BLOCK as usize]);
        assert_eq!(read(volume, Some(before), far + 8 * BLOCK), vec![0; BLOCK as usize]);
        for view in [Some(at), None] {
            assert_eq!(read(volume, view, 0), inode);
            assert_eq!(read(volume, view, far), vec![0; BLOCK as usize]);
            assert_eq!(read(volume, view, far + BLOCK), vec![9; BLOCK as usize]);
            assert_eq!(read(volume, view, far + 9 * BLOCK), vec![2; BLOCK as usize]);
        }
        let timeline = volume.timeline();
        let writes: u64 = timeline.buckets.iter().map(|bucket| bucket.write_count).sum();
        let zero_bytes: u64 = timeline.buckets.iter().map(|bucket| bucket.zero_bytes).sum();
        assert_eq!((writes, zero_bytes), (2, BLOCK), "one write of data and zeros, as the timeline counts it");
    };
    check(&volume);
    // The same after a crash: the record was made durable (FUA).
    drop(volume);
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.volume("tree").unwrap();
    check(&volume);

    // Refused whole, with nothing written, when any part is wrong.
    let last = volume.timestamp_last();
    let block = vec![3u8; BLOCK as usize];
    let refused: [&[Change<'_>]; 5] = [
        &[Change::Write { offset: 0, data: &block }, Change::Zero { offset: 0, length: BLOCK }],
        &[Change::Write { offset: 0, data: &block }, Change::Write { offset: 100, data: &block }],
        &[Change::Write { offset: 0, data: &block }, Change::Zero { offset: 1 << 60, length: BLOCK }],
        &[Change::Zero { offset: BLOCK, length: (COMPOUND_BLOCKS_MAX + 1) * BLOCK }],
        &[],
    ];
    for changes in refused {
        let error = volume.write_compound(last.next(), changes, Durability::Buffered).unwrap_err();
        assert!(
            matches!(error, EngineError::InvalidArgument(_) | EngineError::OutOfRange { .. }),
            "{changes:?}: {error}"
        );
        assert_eq!(volume.timestamp_last(), last, "{changes:?}: nothing was written");
    }
    assert_eq!(read(&volume, None, 0), inode);
}
