//! The lab from the command line, and the engine's own device I/O counts: a protected volume's history exported as
//! a trace and replayed, an SPC-1-like trace generated and analysed into a
//! report, and bad traces refused with their line.

mod common;

use common::{json, require, run, run_failing, Server, REWIND};

#[test]
fn a_volumes_history_is_a_trace_the_lab_replays() {
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&["volume", "create", "db", "--size", "16MiB"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 1 0 64k", &server.uri("db")]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 2 1M 8k", &server.uri("db")]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 3 0 4k", &server.uri("db")]);

    // Device I/O by store: the journal took every byte, synced at each flush.
    let stats = json(&server.rewind(&["stats", "db", "--json"]));
    let journal = &stats["io"]["journal"];
    assert!(journal["write_bytes"].as_u64().unwrap() >= (64 + 8 + 4) << 10, "{stats}");
    assert!(journal["syncs"].as_u64().unwrap() >= 3, "{stats}");
    let metrics = ureq::get(&format!("{}/metrics", server.api()))
        .header("Authorization", format!("Bearer {}", server.token))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    assert!(metrics.contains("rewind_store_write_bytes_total{volume=\"db\",store=\"journal\"}"), "{metrics}");
    assert!(metrics.contains("rewind_store_reads_total{store=\"chunks\"}"), "{metrics}");

    let trace = server.rewind(&["trace", "export", "db"]);
    let rows: Vec<Vec<&str>> =
        trace.lines().filter(|line| !line.starts_with('#')).skip(1).map(|line| line.split(',').collect()).collect();
    let shapes: Vec<(&str, &str, &str)> = rows.iter().map(|row| (row[1], row[2], row[3])).collect();
    assert_eq!(shapes, vec![("W", "65536", "0"), ("W", "8192", "2048"), ("W", "4096", "0")], "{trace}");
    let times: Vec<f64> = rows.iter().map(|row| row[0].parse().unwrap()).collect();
    assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "{trace}");

    let path = dir.path().join("db.trace");
    std::fs::write(&path, &trace).unwrap();
    let path = path.to_str().unwrap();
    let replayed = json(&run(
        REWIND,
        &["lab", "replay", path, "--layout", "split-down-stream", "--granularity", "1m", "--cache", "64MiB", "--json"],
    ));
    let result = &replayed["split-down-stream"];
    assert_eq!(result["block_writes"], 16 + 2 + 1);
    // One window: block 0's first version is superseded within it; the cache
    // absorbs it, and the flush at the end writes each of the 18 blocks to both stores.
    assert_eq!((result["retained"].as_u64(), result["history"]["writes"].as_u64()), (Some(18), Some(18)));
    assert_eq!(result["current"]["writes"], 18);
    let table = run(REWIND, &["lab", "replay", path]);
    for layout in ["logging", "split-stream", "split-down-stream", "checkpointing", "cow", "row"] {
        assert!(table.contains(layout), "{table}");
    }
}

/// Streamed, not one document: a history of 400,000 writes is 16 MB of
/// JSON, past what a client reads as one answer (the export used to fail).
#[test]
fn a_long_history_exports_every_write() {
    require("fio");
    const WRITES: usize = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.rewind(&["volume", "create", "db", "--size", "1GiB"]);
    let uri = format!("--uri={}", server.uri("db"));
    let ios = format!("--number_ios={WRITES}");
    // Blocks may be written more than once: each write is a version of its own.
    let args = [
        "--name=many",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=1G",
        "--io_size=4G",
        "--norandommap",
        &ios,
        &uri,
    ];
    run("fio", &args);
    let trace = server.rewind(&["trace", "export", "db"]);
    let rows: Vec<&str> = trace.lines().filter(|line| !line.starts_with('#')).skip(1).collect();
    assert_eq!(rows.len(), WRITES, "one row per write: {}", &trace[..trace.len().min(300)]);
    assert!(rows.iter().all(|row| row.contains(",W,4096,")), "{}", &trace[..trace.len().min(300)]);
}

#[test]
fn an_spc1_trace_is_generated_seeded_and_analysed_into_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let generate = ["lab", "generate", "spc1", "--bsu", "2", "--capacity", "1GiB", "--duration", "5m", "--seed", "7"];
    let trace = run(REWIND, &generate);
    assert_eq!(trace, run(REWIND, &generate), "the same seed generates the same trace");
    let requests = trace.lines().filter(|line| !line.starts_with('#')).count() - 1;
    // 50 IOPS per BSU for 300 s, Poisson: 30,000 ± a few hundred.
    assert!((29_000..31_000).contains(&requests), "{requests} requests");
    let path = dir.path().join("spc1.trace");
    std::fs::write(&path, &trace).unwrap();
    let out = dir.path().join("report");
    let args = [
        "lab",
        "analyze",
        path.to_str().unwrap(),
        "--granularities",
        "ew,1s,1m",
        "--caches",
        "1MiB,64MiB",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    let analysis = json(&run(REWIND, &args));
    assert_eq!(analysis["points"].as_array().unwrap().len(), 6);
    assert_eq!(analysis["trace"]["requests"].as_u64(), Some(requests as u64));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Recommendation") && report.contains("## Conventions"), "{report}");
    for figure in ["retained.svg", "retained.png", "cow-row.svg", "space.png", "ios-per-write-cache-64MiB.svg"] {
        assert!(out.join(figure).exists(), "{figure} missing");
    }
}

#[test]
fn bad_traces_and_options_get_specific_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.trace");
    std::fs::write(&path, "time,op,size,lbn\n0.1,W,4096,0\n0.2,W,4096,x\n").unwrap();
    let path = path.to_str().unwrap();
    let error = run_failing(REWIND, &["lab", "replay", path]);
    assert!(error.contains("line 3"), "{error}");
    let error = run_failing(REWIND, &["lab", "replay", path, "--layout", "lvm"]);
    assert!(error.contains("lvm") && error.contains("checkpointing"), "{error}");
    let error = run_failing(REWIND, &["lab", "replay", path, "--granularity", "soon"]);
    assert!(error.contains("bad granularity"), "{error}");
    let error = run_failing(REWIND, &["lab", "generate", "spc1", "--bsu", "0"]);
    assert!(error.contains("bsu"), "{error}");
}
