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
