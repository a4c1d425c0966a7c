//! What a tree makes durable before a call returns, through power loss on
//! the simulated disk (which keeps nothing that was not synced): RFC 1813's
//! synchronous changes and a new size at once; a change of attributes alone
//! (which §1.6 leaves out of them) with the next synchronous change, or at
//! the volume's commit interval (checked by maintenance); a COMMIT makes
//! its file's writes durable, and waits for the disk only when they are not
//! yet.

use std::sync::Arc;

use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};
use rewind_tree::{Attributes, Caller, CreateHow, Handle, Namespace, SetAttributes, Stability, Tree};

/// Past the volume's commit interval (50 ms).
const PAST_COMMIT_INTERVAL_NANOS: u64 = 200_000_000;

struct Clock(u64);

impl Clock {
    fn tick(&mut self, nanos: u64) -> Timestamp {
        self.0 += nanos;
        Timestamp::from_unix_nanos(self.0)
    }
}

/// A new tree on a simulated disk whose power loss keeps only what was
/// synced (seeded, though nothing random is drawn with write_survival 0).
fn new_tree(seed: u64) -> (SimStorage, Clock, Node, Tree) {
    let storage = SimStorage::new(SimConfig { write_survival: 0.0, ..SimConfig::default() }, seed);
    let mut clock = Clock(1_000_000_000);
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), clock.tick(1)).unwrap();
    let tree = Tree::open(volume, clock.tick(1)).unwrap();
    (storage, clock, node, tree)
}

fn reopen(storage: &SimStorage, node: Node, tree: Tree) -> (Node, Tree) {
    drop(tree);
    drop(node);
    storage.crash();
    let node = Node::open(Arc::new(storage.clone()), NodeConfig::default()).unwrap();
    let tree = Tree::open(node.volume("t").unwrap(), Timestamp::MAX).unwrap();
    (node, tree)
}

fn attributes_of(tree: &Tree, name: &str, caller: &Caller) -> Attributes {
    tree.lookup(tree.root().unwrap(), name.as_bytes(), caller).unwrap()
}

fn set(tree: &Tree, handle: Handle, attributes: SetAttributes, caller: &Caller, now: Timestamp) {
    tree.setattr(handle, &attributes, None, caller, now).unwrap();
}

#[test]
fn attributes_alone_are_durable_with_the_next_synchronous_change_and_a_new_size_at_once() {
    let (storage, mut clock, node, tree) = new_tree(7);
    let caller = Caller::root([0; 16], 0);
    let how = CreateHow::Guarded(SetAttributes { mode: Some(0o640), ..SetAttributes::default() });
    let root = tree.root().unwrap();
    let (made, _) = tree.create(root, b"a", &how, &caller, clock.tick(1)).unwrap();
    tree.write(made.handle, 0, &[5; 10_000], Stability::FileSync, &caller, clock.tick(1)).unwrap();

    // Attributes alone: not waited for, so lost with the power.
    set(&tree, made.handle, SetAttributes { mode: Some(0o600), ..SetAttributes::default() }, &caller, clock.tick(1));
    assert_eq!(attributes_of(&tree, "a", &caller).mode, 0o600);
    let (node, tree) = reopen(&storage, node, tree);
    assert_eq!(attributes_of(&tree, "a", &caller).mode, 0o640, "the mode change returned without a flush");

    // ...but durable with the next synchronous change (the journal is one ordered log).
    let handle = attributes_of(&tree, "a", &caller).handle;
    set(&tree, handle, SetAttributes { mode: Some(0o600), ..SetAttributes::default() }, &caller, clock.tick(1));
    tree.create(tree.root().unwrap(), b"b", &how, &caller, clock.tick(1)).unwrap();
    let (node, tree) = reopen(&storage, node, tree);
    assert_eq!(attributes_of(&tree, "a", &caller).mode, 0o600, "the create after it made it durable");
    assert_eq!(attributes_of(&tree, "b", &caller).mode, 0o640);

    // ...and at the commit interval with nothing after it: maintenance
    // first sees the change waiting, then flushes once the interval passed.
    let handle = attributes_of(&tree, "a", &caller).handle;
    set(&tree, handle, SetAttributes { mode: Some(0o604), ..SetAttributes::default() }, &caller, clock.tick(1));
    node.maintain(clock.tick(1)).unwrap();
    node.maintain(clock.tick(PAST_COMMIT_INTERVAL_NANOS)).unwrap();
    let (node, tree) = reopen(&storage, node, tree);
    assert_eq!(attributes_of(&tree, "a", &caller).mode, 0o604, "the commit interval made it durable");

    // A new size changes the file's bytes: durable before SETATTR returns.
    let handle = attributes_of(&tree, "a", &caller).handle;
    set(&tree, handle, SetAttributes { size: Some(100), ..SetAttributes::default() }, &caller, clock.tick(1));
    let (_node, tree) = reopen(&storage, node, tree);
    assert_eq!(attributes_of(&tree, "a", &caller).size, 100, "a truncation survives at once");
}

fn contents_of(tree: &Tree, name: &str, caller: &Caller) -> Vec<u8> {
    let file = attributes_of(tree, name, caller).handle;
    tree.read(file, 0, 1 << 20, caller).unwrap().0
}

#[test]
fn a_commit_makes_its_files_writes_durable_and_waits_only_if_they_are_not() {
    let (storage, mut clock, node, tree) = new_tree(11);
    let caller = Caller::root([0; 16], 0);
    let how = CreateHow::Unchecked(SetAttributes::default());
    let root = tree.root().unwrap();
    let (a, _) = tree.create(root, b"a", &how, &caller, clock.tick(1)).unwrap();
    tree.create(root, b"b", &how, &caller, clock.tick(1)).unwrap();

    // A's writes, committed: durable.
    tree.write(a.handle, 0, &[1; 5000], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.commit_file(a.handle).unwrap();
    let (node, tree) = reopen(&storage, node, tree);
    assert_eq!(contents_of(&tree, "a", &caller), [1; 5000]);

    // B written after, A committed again: A's writes were durable already,
    // so that COMMIT does not flush, and B's write goes with the power.
    let (a, b) = (attributes_of(&tree, "a", &caller).handle, attributes_of(&tree, "b", &caller).handle);
    tree.write(a, 0, &[2; 3000], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.commit_file(a).unwrap();
    tree.write(b, 0, &[3; 3000], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.commit_file(a).unwrap();
    let (node, tree) = reopen(&storage, node, tree);
    assert_eq!(contents_of(&tree, "a", &caller)[..3000], [2; 3000]);
    assert_eq!(contents_of(&tree, "b", &caller), [0u8; 0], "A's second COMMIT waited for nothing");

    // B's own COMMIT flushes (and a flush by another change covers it too:
    // C's, committed, then B's COMMIT with nothing left to wait for).
    let b = attributes_of(&tree, "b", &caller).handle;
    tree.write(b, 0, &[4; 3000], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.commit_file(b).unwrap();
    let (c, _) = tree.create(tree.root().unwrap(), b"c", &how, &caller, clock.tick(1)).unwrap();
    tree.write(c.handle, 0, &[5; 100], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.write(b, 3000, &[6; 100], Stability::Unstable, &caller, clock.tick(1)).unwrap();
    tree.commit_file(c.handle).unwrap();
    tree.commit_file(b).unwrap();
    let (_node, tree) = reopen(&storage, node, tree);
    assert_eq!(contents_of(&tree, "b", &caller), [[4; 3000].as_slice(), &[6; 100]].concat());
    assert_eq!(contents_of(&tree, "c", &caller), [5; 100]);
}
