//! Two clients on one tree at once: what one reads while the other makes
//! and removes names agrees with itself. A listing or a look-up never
//! meets an inode freed under it, which read as damage (or panicked) when
//! a directory and the inodes it names were read at two moments.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};
use rewind_tree::{Caller, CreateHow, Namespace, SetAttributes, Tree, TreeError};

const ROUNDS: u64 = 200;

#[test]
fn listings_and_lookups_agree_with_themselves_while_another_client_removes() {
    let node = Node::open(Arc::new(SimStorage::new(SimConfig::default(), 3)), NodeConfig::default()).unwrap();
    let clock = Arc::new(AtomicU64::new(1_000_000_000));
    let now = {
        let clock = Arc::clone(&clock);
        move || Timestamp::from_unix_nanos(clock.fetch_add(1_000, Ordering::Relaxed))
    };
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now()).unwrap();
    let tree = Arc::new(Tree::open(volume, now()).unwrap());
    let root = tree.root().unwrap();
    let caller = Caller::root([0; 16], 0);

    let changer = thread::spawn({
        let (tree, caller) = (Arc::clone(&tree), caller.clone());
        move || {
            let how = CreateHow::Unchecked(SetAttributes::default());
            for _ in 0..ROUNDS {
                let (dir, _) = tree.mkdir(root, b"d", &SetAttributes::default(), &caller, now()).unwrap();
                tree.create(dir.handle, b"f", &how, &caller, now()).unwrap();
                tree.remove(dir.handle, b"f", false, &caller, now()).unwrap();
                tree.remove(root, b"d", true, &caller, now()).unwrap();
            }
        }
    });
    // What the reader may meet: the names, or their absence (`NotFound`
    // for a name, `Stale` for a handle whose directory went).
    let gone = |result: Result<(), TreeError>| match result {
        Ok(()) | Err(TreeError::NotFound | TreeError::Stale) => {}
        Err(error) => panic!("a read racing a removal: {error}"),
    };
    let mut reads = 0u64;
    while !changer.is_finished() {
        gone(tree.readdir(root, 0, 100, &caller).map(drop));
        gone(tree.lookup(root, b"d", &caller).and_then(|dir| {
            tree.readdir(dir.handle, 0, 100, &caller)?;
            tree.lookup(dir.handle, b"f", &caller)?;
            tree.lookup(dir.handle, b"..", &caller).map(drop)
        }));
        reads += 1;
    }
    changer.join().expect("the changer finished");
    assert!(reads > 0, "the reader ran beside the changer");
    println!("{reads} rounds of reads beside {ROUNDS} of changes");
}
