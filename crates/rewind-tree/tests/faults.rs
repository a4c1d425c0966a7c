//! A full disk under a tree: operations fail with the engine's transient
//! error, having changed nothing a client can see, the tree stays whole,
//! and everything works again once space is freed — no restart.

use std::sync::Arc;

use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};
use rewind_tree::{walk, Caller, CreateHow, Namespace, SetAttributes, Stability, Tree, TreeError};

#[test]
fn a_full_disk_fails_operations_whole_and_the_tree_carries_on_when_space_is_freed() {
    let storage = SimStorage::new(SimConfig::default(), 11);
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let mut clock = 1_000_000_000u64;
    let mut now = || {
        clock += 1_000_000;
        Timestamp::from_unix_nanos(clock)
    };
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now()).unwrap();
    let tree = Tree::open(volume, now()).unwrap();
    let caller = Caller::root([0; 16], 0);
    let root = tree.root().unwrap();
    let how = CreateHow::Guarded(SetAttributes::default());
    let block = vec![7u8; 1 << 20];

    // Writes go on until the disk, a little above what is used, is full.
    storage.set_capacity(Some(storage.used_bytes() + (24 << 20)));
    let mut written = Vec::new();
    let error = (0..200)
        .find_map(|index| {
            let now = now();
            let _ = node.maintain(now);
            let name = format!("f{index}");
            let made = match tree.create(root, name.as_bytes(), &how, &caller, now) {
                Ok((made, _)) => made,
                Err(error) => return Some(error),
            };
            match tree.write(made.handle, 0, &block, Stability::FileSync, &caller, now) {
                Ok(_) => {
                    written.push(name);
                    None
                }
                Err(error) => Some(error),
            }
        })
        .expect("a full disk refuses something within 200 MiB");
    let TreeError::Engine(engine) = &error else { panic!("the engine's error, not {error:?}") };
    assert!(engine.is_transient(), "full, not poisoned: {engine}");
    assert!(!written.is_empty(), "some files fit first");

    // Whatever was acknowledged reads back whole; the tree lists cleanly.
    for name in &written {
        let file = walk(&tree, name).unwrap();
        assert_eq!(tree.read(file.handle, 0, 2 << 20, &caller).unwrap().0, block, "{name}");
    }
    tree.readdir(root, 0, 1000, &caller).unwrap();

    // Space is freed: no restart, the next operations work.
    storage.set_capacity(None);
    let now = now();
    node.maintain(now).unwrap();
    let (made, _) = tree.create(root, b"after", &how, &caller, now).unwrap();
    tree.write(made.handle, 0, b"again", Stability::FileSync, &caller, now).unwrap();
    assert_eq!(tree.read(made.handle, 0, 10, &caller).unwrap().0, b"again");
}

/// A sparse file whose only data is far out (one byte at the last block a
/// file may have, 16.7 M blocks up) is shrunk and removed by zeroing the
/// blocks that hold data, not every block up to its high-water mark:
/// that wrote 16.7 M zero versions under the tree's lock. A block of data
/// low in the file and the far byte are all the history gets, plus the
/// inode's changes; and the past still reads both.
#[test]
fn a_sparse_file_is_shrunk_and_removed_by_zeroing_only_its_data() {
    use rewind_format::tree::FILE_BYTES_MAX;
    let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 13)), NodeConfig::default()).unwrap();
    let mut clock = 1_000_000_000u64;
    let mut now = || {
        clock += 1_000_000;
        Timestamp::from_unix_nanos(clock)
    };
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now()).unwrap();
    let tree = Tree::open(Arc::clone(&volume), now()).unwrap();
    let caller = Caller::root([0; 16], 0);
    let root = tree.root().unwrap();
    let how = CreateHow::Guarded(SetAttributes::default());
    let (file, _) = tree.create(root, b"sparse", &how, &caller, now()).unwrap();
    tree.write(file.handle, 4096, &[1; 4096], Stability::FileSync, &caller, now()).unwrap();
    tree.write(file.handle, FILE_BYTES_MAX - 1, &[2], Stability::FileSync, &caller, now()).unwrap();
    let written = now();
    let versions = |volume: &rewind_engine::Volume| {
        let stats = volume.stats().unwrap();
        stats.versions_in_memory + stats.versions_in_runs
    };
    let before = versions(&volume);

    let shrink = SetAttributes { size: Some(8192), ..SetAttributes::default() };
    tree.setattr(file.handle, &shrink, None, &caller, now()).unwrap();
    tree.remove(root, b"sparse", false, &caller, now()).unwrap();
    let added = versions(&volume) - before;
    assert!(added < 64, "{added} versions to shrink and remove a file of two blocks of data");

    let past = tree.view(written).unwrap();
    let file = walk(&past, "sparse").unwrap();
    let (low, _) = past.read(file.handle, 4096, 4096, &caller).unwrap();
    let (far, end) = past.read(file.handle, FILE_BYTES_MAX - 1, 1, &caller).unwrap();
    assert!(low == [1; 4096] && far == [2] && end, "the past reads the data the present no longer has");
    println!("{added} versions to shrink and remove it");
}
