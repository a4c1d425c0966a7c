//! Reverting one path of a tree: it reads as it did then, hard links and
//! symlinks too, the rest is untouched, and the revert is undone by
//! reverting to the bookmark it leaves.

use std::sync::Arc;

use rewind_engine::{Node, NodeConfig, Timestamp, VolumeName, VolumeSpec};
use rewind_io::{SimConfig, SimStorage};
use rewind_tree::{walk, Caller, CreateHow, FileKind, Namespace, SetAttributes, Stability, Tree};

fn root() -> Caller {
    Caller::root([0; 16], 0)
}

/// Every path under `path` with its kind, size, mode, link count and
/// contents (or target), sorted: what two trees must agree on.
fn describe(namespace: &dyn Namespace, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let start = match walk(namespace, path) {
        Ok(start) => start,
        Err(_) => return out,
    };
    let mut stack = vec![(path.to_owned(), start)];
    while let Some((path, attributes)) = stack.pop() {
        let content = match attributes.kind {
            FileKind::Regular => {
                let (bytes, _) = namespace.read(attributes.handle, 0, 1 << 20, &root()).unwrap();
                format!("{:?}", String::from_utf8_lossy(&bytes))
            }
            FileKind::Symlink => {
                format!("-> {:?}", String::from_utf8_lossy(&namespace.readlink(attributes.handle).unwrap()))
            }
            _ => String::new(),
        };
        let links = if attributes.kind == FileKind::Directory { 0 } else { attributes.nlink };
        out.push(format!("{path} {:?} {} {:o} {links} {content}", attributes.kind, attributes.size, attributes.mode));
        if attributes.kind == FileKind::Directory {
            let listing = namespace.readdir(attributes.handle, 0, 1000, &root()).unwrap();
            for entry in listing.entries.into_iter().filter(|entry| entry.name != b"." && entry.name != b"..") {
                stack.push((format!("{path}/{}", String::from_utf8_lossy(&entry.name)), entry.attributes));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_path_goes_back_the_rest_stays_and_the_revert_is_undone() {
    let storage = SimStorage::new(SimConfig::default(), 3);
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let mut clock = 1_000_000_000u64;
    let mut now = || {
        clock += 1_000;
        Timestamp::from_unix_nanos(clock)
    };
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now()).unwrap();
    let tree = Tree::open(volume, now()).unwrap();
    let caller = root();
    let top = tree.root().unwrap();
    let mode = |bits| SetAttributes { mode: Some(bits), ..SetAttributes::default() };
    let file = |dir, name: &str, data: &[u8], now: Timestamp| {
        let (made, _) = tree.create(dir, name.as_bytes(), &CreateHow::Guarded(mode(0o640)), &caller, now).unwrap();
        tree.write(made.handle, 0, data, Stability::FileSync, &caller, now).unwrap();
        made.handle
    };
    let (a, _) = tree.mkdir(top, b"a", &mode(0o750), &caller, now()).unwrap();
    let x = file(a.handle, "x", b"x then", now());
    let y = file(a.handle, "y", b"y, linked", now());
    tree.link(y, a.handle, b"z", &caller, now()).unwrap();
    tree.symlink(a.handle, b"s", b"x", &SetAttributes::default(), &caller, now()).unwrap();
    let (deep, _) = tree.mkdir(a.handle, b"deep", &mode(0o700), &caller, now()).unwrap();
    file(deep.handle, "sparse", b"", now());
    let sparse = walk(&tree, "a/deep/sparse").unwrap().handle;
    tree.write(sparse, 9000, b"end", Stability::FileSync, &caller, now()).unwrap();
    file(top, "top.txt", b"top then", now());
    let then = tree.changed_at();
    let was_a = describe(&tree, "a");
    let was_all = describe(&tree, "");

    // The present moves on, inside `a` and outside it.
    tree.write(x, 0, b"X NOW, longer", Stability::FileSync, &caller, now()).unwrap();
    tree.remove(a.handle, b"y", false, &caller, now()).unwrap();
    file(a.handle, "new", b"new", now());
    tree.remove(deep.handle, b"sparse", false, &caller, now()).unwrap();
    tree.remove(a.handle, b"deep", true, &caller, now()).unwrap();
    tree.rename(top, b"top.txt", top, b"renamed.txt", &caller, now()).unwrap();
    file(top, "later.txt", b"later", now());
    assert_ne!(describe(&tree, "a"), was_a);
    let outside_now: Vec<String> = describe(&tree, "").into_iter().filter(|line| !line.starts_with("/a")).collect();

    // `a` goes back; the rest stays as it is now.
    let past = tree.view(then).unwrap();
    let report = tree.revert_path("a", &past, &caller, now()).unwrap();
    assert_eq!(describe(&tree, "a"), was_a, "a reads as it did then, hard links and the sparse file too");
    let outside: Vec<String> = describe(&tree, "").into_iter().filter(|line| !line.starts_with("/a")).collect();
    assert_eq!(outside, outside_now, "the rest of the tree is untouched");
    assert!(report.removed >= 3 && report.files == 3 && report.directories == 2, "{report:?}");
    let undo_point = report.before;
    assert!(node.volume("t").unwrap().bookmarks().iter().any(|bookmark| bookmark.name.as_str() == report.bookmark));

    // The whole tree goes back too.
    tree.revert_path("", &past, &caller, now()).unwrap();
    assert_eq!(describe(&tree, ""), was_all);

    // And the first revert is undone by reverting to the point before it.
    let before_first = tree.view(undo_point).unwrap();
    tree.revert_path("a", &before_first, &caller, now()).unwrap();
    let undone: Vec<String> = describe(&tree, "a");
    assert_eq!(undone, describe(&before_first, "a"));
    assert!(undone.iter().any(|line| line.contains("X NOW, longer")), "{undone:?}");

    // A path that did not exist then is removed by going back.
    tree.revert_path("later.txt", &past, &caller, now()).unwrap();
    assert!(walk(&tree, "later.txt").is_err());
}

/// A client can nest directories as deep as it likes (no PATH_MAX binds an
/// NFS client); reverting such a tree, both ways, runs within a small
/// thread stack. The copy and the removal recursed a level per directory,
/// and a stack overflow aborts the whole server.
#[test]
fn a_tree_nested_deeper_than_a_stack_reverts_both_ways() {
    const DEPTH: usize = 300;
    let storage = SimStorage::new(SimConfig::default(), 5);
    let node = Node::open(Arc::new(storage), NodeConfig::default()).unwrap();
    let mut clock = 1_000_000_000u64;
    let mut now = move || {
        // Apart by more than the engine's clock moves within one revert.
        clock += 1_000_000_000;
        Timestamp::from_unix_nanos(clock)
    };
    let volume = node.create_volume(VolumeSpec::tree(VolumeName::new("t").unwrap()), now()).unwrap();
    let tree = Tree::open(volume, now()).unwrap();
    let caller = root();
    let top = tree.root().unwrap();
    let empty = tree.changed_at();
    let mut chain = vec![top];
    for _ in 0..DEPTH {
        let (made, _) = tree.mkdir(*chain.last().unwrap(), b"d", &SetAttributes::default(), &caller, now()).unwrap();
        chain.push(made.handle);
    }
    let nested = tree.changed_at();
    for dir in chain.iter().rev().skip(1) {
        tree.remove(*dir, b"d", true, &caller, now()).unwrap();
    }
    let depth = |tree: &Tree| {
        let mut dir = tree.root().unwrap();
        let mut depth = 0;
        while let Ok(found) = tree.lookup(dir, b"d", &root()) {
            (dir, depth) = (found.handle, depth + 1);
        }
        depth
    };
    assert_eq!(depth(&tree), 0);

    // 128 KiB of stack: less than a level per directory needs.
    let small_stack = std::thread::Builder::new().stack_size(128 << 10);
    let (copied, removed) = std::thread::scope(|scope| {
        small_stack
            .spawn_scoped(scope, || {
                let copied = tree.revert_path("", &tree.view(nested).unwrap(), &caller, now()).unwrap();
                assert_eq!(depth(&tree), DEPTH);
                let removed = tree.revert_path("", &tree.view(empty).unwrap(), &caller, now()).unwrap();
                (copied, removed)
            })
            .unwrap()
            .join()
            .unwrap()
    });
    assert_eq!((copied.directories, removed.removed), (DEPTH as u64, DEPTH as u64));
    assert_eq!(depth(&tree), 0);
}
