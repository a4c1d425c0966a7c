//! Checks the architecture invariants of ARCHITECTURE.md that the compiler
//! does not: what the engine and the storage parts below it may depend on and
//! call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The engine, everything below it, and the file trees built on it: time,
/// threads and the network come to them from the front ends.
const CORE: [&str; 8] = [
    "rewind-types",
    "rewind-format",
    "rewind-io",
    "rewind-journal",
    "rewind-index",
    "rewind-chunks",
    "rewind-engine",
    "rewind-tree",
];

/// Crates that would bring sockets, an async runtime or serde into the core.
const FORBIDDEN: [&str; 9] = ["tokio", "axum", "hyper", "mio", "socket2", "serde", "serde_json", "ureq", "rewind-http"];

/// Source patterns that read the clock, spawn threads, use global randomness or the network.
const FORBIDDEN_CALLS: [&str; 7] =
    ["SystemTime::now", "Instant::now", "thread::spawn", "thread_rng", "rand::rng()", "std::net", "tokio::"];

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).expect("crates/rewind-engine")
}

/// Normal (non-dev, non-build) dependency graph by package name.
fn dependency_graph() -> BTreeMap<String, BTreeSet<String>> {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(workspace_root().join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| (package["id"].as_str().expect("id"), package["name"].as_str().expect("name")))
        .collect();
    let mut graph = BTreeMap::new();
    for node in metadata["resolve"]["nodes"].as_array().expect("resolve nodes") {
        let name = names[node["id"].as_str().expect("id")].to_owned();
        let normal = node["deps"].as_array().expect("deps").iter().filter(|dependency| {
            dependency["dep_kinds"].as_array().expect("dep_kinds").iter().any(|kind| kind["kind"].is_null())
        });
        let dependencies: BTreeSet<String> =
            normal.map(|dependency| names[dependency["pkg"].as_str().expect("pkg")].to_owned()).collect();
        graph.entry(name).or_insert_with(BTreeSet::new).extend(dependencies);
    }
    graph
}

fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(name) = stack.pop() {
        for dependency in graph.get(&name).into_iter().flatten() {
            if seen.insert(dependency.clone()) {
                stack.push(dependency.clone());
            }
        }
    }
    seen
}

#[test]
fn the_core_depends_on_no_runtime_network_or_serde() {
    let graph = dependency_graph();
    // The check can see such dependencies: the front end has them.
    let front_end = reachable(&graph, "rewind-http");
    assert!(front_end.contains("serde") && front_end.contains("tokio"), "{front_end:?}");
    for core in CORE {
        let reached = reachable(&graph, core);
        for forbidden in FORBIDDEN {
            assert!(!reached.contains(forbidden), "{core} depends (maybe transitively) on {forbidden}");
        }
    }
}

#[test]
fn the_storage_parts_do_not_depend_on_each_other() {
    let graph = dependency_graph();
    assert!(!reachable(&graph, "rewind-journal").contains("rewind-index"));
    assert!(!reachable(&graph, "rewind-index").contains("rewind-journal"));
    for storage in ["rewind-journal", "rewind-index"] {
        assert!(!reachable(&graph, storage).contains("rewind-chunks"), "{storage} depends on rewind-chunks");
        assert!(!reachable(&graph, "rewind-chunks").contains(storage), "rewind-chunks depends on {storage}");
    }
}

#[test]
fn the_core_reads_no_clock_and_spawns_no_threads() {
    let mut checked = 0;
    for core in CORE {
        let mut pending = vec![workspace_root().join("crates").join(core).join("src")];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("source directory") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let source = std::fs::read_to_string(&path).expect("source file");
                for call in FORBIDDEN_CALLS {
                    assert!(!source.contains(call), "{} uses {call}", path.display());
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= CORE.len(), "found the sources ({checked} files)");
}
