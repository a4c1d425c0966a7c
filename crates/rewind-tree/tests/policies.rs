//! The volume's policies and operations on a tree, with no code of the
//! tree's own: a granularity keeps one version a window, a history delete
//! takes a range of the past away and leaves the rest readable, stats count
//! a tree's operations and thinned versions as a volume's, and a clone of a
//! tree's volume is the tree as it was, writable on its own.

use std::sync::Arc;

use rewind_engine::{EngineError, Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};
use rewind_tree::{walk, Caller, CreateHow, Namespace, SetAttributes, Stability, Tree, TreeError};

const SECOND: u64 = 1_000_000_000;

fn at(seconds_tenths: u64) -> Timestamp {
    Timestamp::from_unix_nanos(1_000 * SECOND + seconds_tenths * SECOND / 10)
}

fn contents(namespace: &dyn Namespace, path: &str) -> Vec<u8> {
    let found = walk(namespace, path).unwrap();
    namespace.read(found.handle, 0, 1 << 20, &Caller::root([0; 16], 0)).unwrap().0
}

#[test]
fn granularity_history_deletes_and_stats_apply_to_a_tree() {
    let storage = SimStorage::new(SimConfig::default(), 5);
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let spec = VolumeSpec { granularity_nanos: SECOND, ..VolumeSpec::tree(VolumeName::new("t").unwrap()) };
    let volume = node.create_volume(spec, at(0)).unwrap();
    let tree = Tree::open(Arc::clone(&volume), at(1)).unwrap();
    let caller = Caller::root([0; 16], 0);
    let root = tree.root().unwrap();
    let how = CreateHow::Guarded(SetAttributes::default());
    let (file, _) = tree.create(root, b"a.txt", &how, &caller, at(10)).unwrap();
    // Versions: 1.0 s to 1.4 s in one window of the granularity, then one a window.
    let writes = [(11, "v1"), (12, "v2"), (14, "v3"), (25, "v4"), (35, "v5"), (45, "v6"), (65, "v7")];
    for (tenths, text) in writes {
        tree.write(file.handle, 0, text.as_bytes(), Stability::FileSync, &caller, at(tenths)).unwrap();
    }
    let history = tree.history(file.handle, 100).unwrap();
    // One version a window of 1 s for the eight changes, each seen from its
    // window's end (the newest window, still open at 6.5 s, is the present).
    let ends: Vec<u64> = history.iter().map(|version| (version.at.unix_nanos() + 1) / SECOND - 1_000).collect();
    assert_eq!(ends, [7, 5, 4, 3, 2], "{history:?}");
    let mtimes: Vec<i64> = history.iter().map(|version| version.attributes.mtime.unix_nanos() as i64).collect();
    assert_eq!(mtimes, [65, 45, 35, 25, 14].map(|tenths| at(tenths).unix_nanos() as i64), "each window's last change");

    // A history delete from 3.1 s to 5.5 s: the times in it are gone, the
    // others read as they were (a view sees the end of the window before
    // its time), and so does the present.
    let view = |tenths: u64| tree.view(at(tenths));
    assert_eq!(contents(&view(30).unwrap(), "a.txt"), b"v4");
    assert_eq!(contents(&view(60).unwrap(), "a.txt"), b"v6");
    volume.delete_history(at(31), at(55), at(70)).unwrap();
    // At 4.5 s and 5.2 s a view would see the windows ending at 4 s and 5 s,
    // inside the range.
    for tenths in [45, 52] {
        match view(tenths) {
            Err(TreeError::Engine(EngineError::HistoryDeleted { .. })) => {}
            other => panic!("a view at {tenths} tenths should be deleted history, not {:?}", other.map(|_| ())),
        }
    }
    assert_eq!(contents(&view(30).unwrap(), "a.txt"), b"v4", "before the range");
    assert_eq!(contents(&view(60).unwrap(), "a.txt"), b"v6", "after it");
    assert_eq!(contents(&tree, "a.txt"), b"v7", "the present");

    let stats = volume.stats().unwrap();
    assert_eq!(stats.writes, 9, "the create, the root's format and seven writes, one compound write each: {stats:?}");
    assert!(stats.versions_thinned > 0, "the granularity thinned: {stats:?}");
}

#[test]
fn a_clone_of_a_tree_is_the_tree_as_it_was_and_goes_its_own_way() {
    let storage = SimStorage::new(SimConfig::default(), 6);
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), at(0)).unwrap();
    let tree = Tree::open(volume, at(1)).unwrap();
    let caller = Caller::root([0; 16], 0);
    let root = tree.root().unwrap();
    let how = CreateHow::Guarded(SetAttributes::default());
    let (file, _) = tree.create(root, b"a.txt", &how, &caller, at(10)).unwrap();
    tree.write(file.handle, 0, b"then", Stability::FileSync, &caller, at(11)).unwrap();
    tree.write(file.handle, 0, b"later", Stability::FileSync, &caller, at(20)).unwrap();
    tree.create(root, b"b.txt", &how, &caller, at(21)).unwrap();

    // A clone at 1.5 s: immediate, and a tree of its own.
    let cloned = node.clone_volume("t", Some(at(15)), VolumeName::new("c").unwrap(), at(30)).unwrap();
    let clone = Tree::open(cloned, at(31)).unwrap();
    assert_eq!(contents(&clone, "a.txt"), b"then");
    assert!(walk(&clone, "b.txt").is_err(), "made after the clone's point");
    let in_clone = walk(&clone, "a.txt").unwrap();
    clone.write(in_clone.handle, 0, b"CLONE", Stability::FileSync, &caller, at(40)).unwrap();
    tree.write(file.handle, 0, b"source", Stability::FileSync, &caller, at(41)).unwrap();
    assert_eq!(contents(&clone, "a.txt"), b"CLONE");
    assert_eq!(contents(&tree, "a.txt"), b"source");
    assert_eq!(contents(&clone.view(at(35)).unwrap(), "a.txt"), b"then", "the clone's own past");
}

#[test]
fn a_space_cap_drops_a_trees_oldest_unbookmarked_history() {
    let storage = SimStorage::new(SimConfig::default(), 7);
    let mut config = NodeConfig::default();
    (config.volume.archive_age_nanos, config.volume.archive_interval_nanos) = (0, 1);
    (config.volume.retention_interval_nanos, config.volume.burst_quiet_nanos) = (1, 0);
    let node = Node::open(Arc::new(storage), config).unwrap();
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), at(0)).unwrap();
    let tree = Tree::open(Arc::clone(&volume), at(1)).unwrap();
    let caller = Caller::root([0; 16], 0);
    let how = CreateHow::Guarded(SetAttributes::default());
    let (file, _) = tree.create(tree.root().unwrap(), b"data.bin", &how, &caller, at(2)).unwrap();
    // Four generations of 256 KiB, nothing alike; the first bookmarked.
    let generation_bytes = 256 << 10;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut generations = Vec::new();
    for generation in 0..4u64 {
        let data: Vec<u8> = (0..generation_bytes)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (state >> 56) as u8
            })
            .collect();
        tree.write(file.handle, 0, &data, Stability::FileSync, &caller, at(10 + generation * 10)).unwrap();
        if generation == 0 {
            let name = rewind_engine::BookmarkName::new("first").unwrap();
            volume.create_bookmark(name, None, at(15)).unwrap();
        }
        generations.push(data);
    }
    let cap = generation_bytes as u64 * 5 / 2;
    let change = rewind_engine::PolicyChange { space_max_bytes: Some(cap), ..rewind_engine::PolicyChange::default() };
    volume.set_policy(change).unwrap();
    for pass in 0..6 {
        node.maintain(at(70 + pass)).unwrap();
        node.maintain_history(at(70 + pass)).unwrap();
    }
    let used = volume.measure_space(at(80)).unwrap().chunk_stored_bytes;
    assert!(used <= cap, "{used} bytes of history kept, over the cap of {cap}");
    assert!(tree.view(at(25)).is_err(), "the second generation went");
    assert!(contents(&tree.view(at(15)).unwrap(), "data.bin") == generations[0], "the bookmark stays");
    assert!(contents(&tree, "data.bin") == generations[3], "the present stays");
    // A tree's 2^60-byte address space is not laid out in block order,
    // neither in the background nor on demand.
    assert_eq!(volume.stats().unwrap().bookmarks_awaiting_layout, 0);
    let refused = volume.view(at(15)).unwrap().defrag(&mut |_, _| {}).unwrap_err().to_string();
    assert!(refused.contains("is a file tree"), "{refused}");
}
