//! Changed-block tracking against an oracle, in every layout: random writes
//! and zeroes with maintenance, checkpoints and archiving between them, then
//! the changes between every pair of recorded points (and from each to the
//! present) must be exactly the blocks written in between — except blocks
//! that read as zeros at both points, which are unchanged. (Every write's
//! bytes are unique, so no two versions share a deduplicated chunk.)
//!
//! Seeded: each case prints its seed; `REWIND_SEED=<n>` replays one.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rewind_engine::{
    BlockSize, BlockStatus, ChangeExtent, Durability, Layout, LayoutRules, Node, NodeConfig, Timestamp, VolumeName,
    VolumeSpec, ZeroMode,
};
use rewind_io::{SimConfig, SimStorage};

const SECOND: u64 = 1_000_000_000;
const BLOCKS: u64 = 96;
const BLOCK: u64 = 4096;

/// What the oracle knows of one point: per block, the number of the last
/// operation that touched it, and whether it reads as zeros.
#[derive(Clone)]
struct Point {
    at: Timestamp,
    last_op: Vec<u64>,
    zero: Vec<bool>,
}

fn changed_blocks(extents: &[ChangeExtent]) -> Vec<bool> {
    let mut blocks = Vec::new();
    for extent in extents {
        assert_eq!(extent.length % BLOCK, 0, "aligned ranges give whole-block extents");
        blocks.extend(std::iter::repeat_n(extent.changed, (extent.length / BLOCK) as usize));
    }
    blocks
}

/// Per block of `0..length`, whether its status says it reads as zeros,
/// asking on from where each answer ends.
fn zero_blocks(status: impl Fn(u64, u64) -> Vec<BlockStatus>, length: u64) -> Vec<bool> {
    let mut blocks = Vec::new();
    let mut offset = 0;
    while offset < length {
        for extent in status(offset, length - offset) {
            assert_eq!(extent.length % BLOCK, 0, "aligned ranges give whole-block extents");
            blocks.extend(std::iter::repeat_n(extent.zero, (extent.length / BLOCK) as usize));
            offset += extent.length;
        }
    }
    assert_eq!(offset, length, "extents end where asked");
    blocks
}

fn expected(before: &Point, after: &Point) -> Vec<bool> {
    (0..BLOCKS as usize)
        .map(|block| before.last_op[block] != after.last_op[block] && !(before.zero[block] && after.zero[block]))
        .collect()
}

fn run(seed: u64) {
    let layout = Layout::ALL[seed as usize % Layout::ALL.len()];
    println!("seed {seed}: layout {}", layout.name());
    let mut rng = StdRng::seed_from_u64(seed);
    let storage = SimStorage::new(SimConfig::default(), seed);
    let mut config = NodeConfig::default();
    config.volume.journal.segment_bytes_max = 64 << 10;
    config.volume.archive_age_nanos = 0;
    config.volume.archive_interval_nanos = 1;
    let node = Node::open(Arc::new(storage), config).unwrap();
    let mut clock = 1_000 * SECOND;
    let mut now = || {
        clock += 1_000;
        Timestamp::from_unix_nanos(clock)
    };
    let spec = VolumeSpec {
        layout,
        cache_bytes: if LayoutRules::of(layout).has_controller_cache() { 280 * BLOCK } else { 0 },
        ..VolumeSpec::new(VolumeName::new("v").unwrap(), BLOCKS * BLOCK, BlockSize::new(BLOCK as u32).unwrap())
    };
    let volume = node.create_volume(spec, now()).unwrap();
    let mut state = Point {
        at: Timestamp::from_unix_nanos(0),
        last_op: vec![0; BLOCKS as usize],
        zero: vec![true; BLOCKS as usize],
    };
    let mut points = Vec::new();
    for op in 1..=400u64 {
        let first = rng.random_range(0..BLOCKS);
        let count = rng.random_range(1..=4).min(BLOCKS - first);
        if rng.random_ratio(1, 5) {
            volume.zero(now(), first * BLOCK, count * BLOCK, ZeroMode::Deallocate, Durability::Buffered).unwrap();
        } else {
            // Each block's bytes unique to the write and the block, and never
            // all zeros: the chunk store deduplicates equal blocks, and two
            // points reading one chunk are (rightly) unchanged.
            let mut data = vec![1u8; (count * BLOCK) as usize];
            for (index, block) in data.chunks_exact_mut(BLOCK as usize).enumerate() {
                block[..8].copy_from_slice(&op.to_le_bytes());
                block[8..16].copy_from_slice(&(first + index as u64).to_le_bytes());
            }
            volume.write(now(), first * BLOCK, &data, Durability::Buffered).unwrap();
        }
        let zeroed = volume.block_status(first * BLOCK, count * BLOCK).unwrap().iter().all(|extent| extent.zero);
        for block in first..first + count {
            state.last_op[block as usize] = op;
            state.zero[block as usize] = zeroed;
        }
        match rng.random_range(0..10) {
            0 => drop(node.maintain(now()).unwrap()),
            1 => drop(node.maintain_history(now()).unwrap()),
            2 => node.checkpoint_all(now()).unwrap(),
            _ => {}
        }
        if op % 40 == 0 {
            volume.flush().unwrap();
            state.at = volume.timestamp_last();
            points.push(state.clone());
        }
    }
    let views: Vec<_> = points.iter().map(|point| volume.view(point.at).unwrap()).collect();
    // Block status says which blocks read as zeros, at every point and now.
    for (i, (point, view)) in points.iter().zip(&views).enumerate() {
        let zeros = zero_blocks(|offset, length| view.block_status(offset, length).unwrap(), BLOCKS * BLOCK);
        assert_eq!(zeros, point.zero, "seed {seed} ({}): zeros at point {i}", layout.name());
    }
    let zeros = zero_blocks(|offset, length| volume.block_status(offset, length).unwrap(), BLOCKS * BLOCK);
    assert_eq!(zeros, state.zero, "seed {seed} ({}): zeros in the present", layout.name());
    for (i, before) in points.iter().enumerate() {
        for (j, after) in points.iter().enumerate().skip(i) {
            let extents = views[j].changes_since(&views[i], 0, BLOCKS * BLOCK).unwrap();
            assert_eq!(
                changed_blocks(&extents),
                expected(before, after),
                "seed {seed} ({}): changes from point {i} to point {j}",
                layout.name()
            );
        }
        let extents = volume.changes_since(&views[i], 0, BLOCKS * BLOCK).unwrap();
        assert_eq!(
            changed_blocks(&extents),
            expected(before, &state),
            "seed {seed} ({}): changes from point {i} to the present",
            layout.name()
        );
    }
    // A range inside: extents cover exactly what was asked, unaligned ends too.
    let extents = volume.changes_since(&views[0], 5 * BLOCK + 100, 7 * BLOCK).unwrap();
    assert_eq!(extents.iter().map(|extent| extent.length).sum::<u64>(), 7 * BLOCK);
}

#[test]
fn changes_between_two_points_are_the_blocks_written_in_between() {
    if let Ok(seed) = std::env::var("REWIND_SEED") {
        return run(seed.parse().expect("a number"));
    }
    for seed in 0..(Layout::ALL.len() as u64 * 3) {
        run(seed);
    }
}

/// The status of a thin volume's never-written blocks comes from the
/// holes of the current store's metadata, not from reading it: of 16,384
/// blocks' 256 KiB of metadata, the status of all reads a few pages, at a
/// time before a write and now, and says where the two written blocks
/// are, in every layout (logging, without a current store, only the latter).
#[test]
fn the_status_of_blocks_never_written_reads_no_metadata() {
    const THIN_BLOCKS: u64 = 16_384;
    for layout in Layout::ALL {
        let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 3)), NodeConfig::default()).unwrap();
        let start = Timestamp::from_unix_nanos(1_000 * SECOND);
        let spec = VolumeSpec {
            layout,
            cache_bytes: if LayoutRules::of(layout).has_controller_cache() { 280 * BLOCK } else { 0 },
            ..VolumeSpec::new(VolumeName::new("v").unwrap(), THIN_BLOCKS * BLOCK, BlockSize::new(BLOCK as u32).unwrap())
        };
        let volume = node.create_volume(spec, start).unwrap();
        let written = [3, 10_000];
        for (index, block) in written.into_iter().enumerate() {
            let at = start.saturating_add_nanos((index as u64 + 1) * SECOND);
            volume.write(at, block * BLOCK, &[index as u8 + 1; BLOCK as usize], Durability::Fua).unwrap();
        }
        let between = start.saturating_add_nanos(SECOND + SECOND / 2);
        let end = start.saturating_add_nanos(3 * SECOND);
        node.maintain(end).unwrap();
        node.checkpoint_all(end).unwrap();
        let view = volume.view(between).unwrap();
        let read_before = volume.io_stats().current.read_bytes;
        let now = zero_blocks(|offset, length| volume.block_status(offset, length).unwrap(), THIN_BLOCKS * BLOCK);
        let then = zero_blocks(|offset, length| view.block_status(offset, length).unwrap(), THIN_BLOCKS * BLOCK);
        let read = volume.io_stats().current.read_bytes - read_before;
        let nonzero =
            |zeros: &[bool]| -> Vec<u64> { (0..THIN_BLOCKS).filter(|&block| !zeros[block as usize]).collect() };
        assert_eq!(nonzero(&now), written, "{}: the present's data", layout.name());
        assert_eq!(nonzero(&then), [written[0]], "{}: the data before the second write", layout.name());
        println!(
            "{}: {read} bytes of the current store read for the status of {THIN_BLOCKS} blocks twice",
            layout.name()
        );
        // Logging has no current store: its map is the index.
        if layout != Layout::Logging {
            assert!(
                read > 0 && read <= 64 << 10,
                "{}: {read} bytes read for the status of unwritten blocks",
                layout.name()
            );
        }

        // A clone's blocks never written are its base's: their status is
        // asked of the base, and they are unchanged between its points.
        let clone = node.clone_volume("v", None, VolumeName::new("c").unwrap(), end).unwrap();
        let cloned = end.saturating_add_nanos(SECOND);
        clone.write(cloned, 5_000 * BLOCK, &[9; BLOCK as usize], Durability::Fua).unwrap();
        let at_creation = clone.view(end).unwrap();
        let read_before = clone.io_stats().current.read_bytes;
        let now = zero_blocks(|offset, length| clone.block_status(offset, length).unwrap(), THIN_BLOCKS * BLOCK);
        let then = zero_blocks(|offset, length| at_creation.block_status(offset, length).unwrap(), THIN_BLOCKS * BLOCK);
        let changes = clone.changes_since(&at_creation, 0, THIN_BLOCKS * BLOCK).unwrap();
        let read = clone.io_stats().current.read_bytes - read_before;
        assert_eq!(nonzero(&now), [written[0], 5_000, written[1]], "{}: the clone's data", layout.name());
        assert_eq!(nonzero(&then), written, "{}: the clone's data as created", layout.name());
        let changed = changed_blocks(&changes);
        let changed: Vec<u64> = (0..THIN_BLOCKS).filter(|&block| changed[block as usize]).collect();
        assert_eq!(changed, [5_000], "{}: the clone's change since it was made", layout.name());
        println!("{}: {read} bytes of the clone's current store read", layout.name());
        if layout != Layout::Logging {
            assert!(read <= 64 << 10, "{}: {read} bytes of the clone's store read", layout.name());
        }
    }
}

#[test]
fn changes_are_between_points_of_one_volume() {
    let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 1)), NodeConfig::default()).unwrap();
    let start = Timestamp::from_unix_nanos(1_000 * SECOND);
    let spec = |name: &str| VolumeSpec::new(VolumeName::new(name).unwrap(), 1 << 20, BlockSize::new(4096).unwrap());
    let a = node.create_volume(spec("a"), start).unwrap();
    let b = node.create_volume(spec("b"), start).unwrap();
    let later = start.saturating_add_nanos(SECOND);
    a.write(later, 0, &[1; 4096], Durability::Fua).unwrap();
    let view_of_b = b.view(later).unwrap();
    let error = a.changes_since(&view_of_b, 0, 4096).unwrap_err().to_string();
    assert!(error.contains("cannot compare a with a view of b"), "{error}");
}
