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
    let replay = ["lab", "replay", path, "--layout", "split-down-stream", "--granularity", "1m", "--cache", "64MiB"];
    let steady = json(&run(REWIND, &[&replay[..], &["--convention", "steady-state", "--json"]].concat()));
    let result = &steady["split-down-stream"];
    assert_eq!((result["block_writes"].as_u64(), result["counted_writes"].as_u64()), (Some(16 + 2 + 1), Some(19)));
    // One window: block 0's first version is superseded within it; the cache
    // absorbs it, and the flush at the end writes each of the 18 blocks to both stores.
    assert_eq!((result["retained"].as_u64(), result["history"]["writes"].as_u64()), (Some(18), Some(18)));
    assert_eq!((result["current"]["writes"].as_u64(), result["evicted"].as_u64()), (Some(18), Some(18)));
    // The paper's convention (the default) counts only block 0's first
    // version, the one write with a subsequent write; the cache absorbed it.
    let paper = json(&run(REWIND, &[&replay[..], &["--json"]].concat()));
    let result = &paper["split-down-stream"];
    assert_eq!(result["convention"], "paper");
    assert_eq!((result["counted_writes"].as_u64(), result["retained"].as_u64()), (Some(1), Some(0)));
    assert_eq!((result["history"]["writes"].as_u64(), result["current"]["writes"].as_u64()), (Some(0), Some(0)));
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
    assert_eq!(analysis["convention"], "paper", "the paper's convention by default");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Recommendation") && report.contains("## Conventions"), "{report}");
    assert!(report.contains("Convention: **paper**"), "{report}");
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

/// The directory `scripts/fetch-traces.sh` keeps the CloudPhysics trace in
/// (fetched once from PyPI's libcachesim source package, checked by SHA-256).
fn cloudphysics() -> std::path::PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-traces.sh");
    std::path::PathBuf::from(run("bash", &[script]).trim())
}

#[test]
fn the_cloudphysics_trace_reads_alike_as_vscsi_and_oracle_general() {
    let dir = cloudphysics();
    let vscsi = dir.join("cloudPhysicsIO.vscsi");
    let oracle = dir.join("cloudPhysicsIO.oracleGeneral.bin");
    let replay = |path: &std::path::Path, extra: &[&str]| {
        let args = [&["lab", "replay", path.to_str().unwrap(), "--layout", "logging", "--json"][..], extra].concat();
        json(&run(REWIND, &args))["logging"].clone()
    };
    // Told from their bytes and name; 113,872 requests, 66,898 of them
    // SCSI WRITE(10). oracleGeneral has no op: counted as --untyped-op.
    let from_vscsi = replay(&vscsi, &[]);
    assert_eq!((from_vscsi["requests"].as_u64(), from_vscsi["write_requests"].as_u64()), (Some(113_872), Some(66_898)));
    let from_oracle = replay(&oracle, &[]);
    assert_eq!(
        (from_oracle["requests"].as_u64(), from_oracle["write_requests"].as_u64()),
        (Some(113_872), Some(113_872))
    );
    let as_reads = replay(&oracle, &["--untyped-op", "read"]);
    assert_eq!(
        (as_reads["write_requests"].as_u64(), as_reads["block_reads"].as_u64()),
        (Some(0), from_oracle["block_writes"].as_u64())
    );
    // Request by request the same addresses and (to the second) times.
    // oracleGeneral gives an object one size, so 13,671 lengths differ.
    let read = |path: &std::path::Path| {
        let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
        rewind_lab::trace::read_all(file, &path.display().to_string(), Default::default()).unwrap()
    };
    let (from_vscsi, from_oracle) = (read(&vscsi), read(&oracle));
    assert_eq!(from_vscsi.len(), from_oracle.len());
    let mut lengths_differ = 0;
    for (vscsi, oracle) in from_vscsi.iter().zip(&from_oracle) {
        assert_eq!(vscsi.offset_bytes, oracle.offset_bytes);
        let whole_seconds = |nanos: u64| nanos / 1_000_000_000;
        assert!(
            whole_seconds(vscsi.time_nanos).abs_diff(whole_seconds(oracle.time_nanos)) <= 1,
            "{vscsi:?} {oracle:?}"
        );
        lengths_differ += usize::from(vscsi.length_bytes != oracle.length_bytes);
    }
    assert_eq!(lengths_differ, 13_671);
    // A named format that the bytes contradict is an error naming why.
    let error = run_failing(REWIND, &["lab", "replay", oracle.to_str().unwrap(), "--format", "vscsi"]);
    assert!(error.contains("neither vscsi version 1 nor 2"), "{error}");
}

#[test]
fn hostile_traces_get_an_error_naming_file_and_line_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    // Under a 2 GiB address-space limit: the reader before the fix took 8.6 GB
    // on the long line, and grew per-block state on the 1 TiB request until it died.
    let limited = |path: &str| {
        let command = format!("ulimit -v 2097152; exec {REWIND} lab replay '{path}' --layout logging");
        run_failing("sh", &["-c", &command])
    };
    let tebibyte = write("tib.trace", "0,W,4096,0\n1,W,1099511627776,8\n");
    let error = limited(&tebibyte);
    assert!(error.contains("tib.trace, line 2: a request of 1099511627776 bytes"), "{error}");
    let huge = write("max.trace", "0,W,18446744073709551615,0\n");
    let error = limited(&huge);
    assert!(error.contains("max.trace, line 1: a request of 18446744073709551615 bytes"), "{error}");
    let wraps = write("wrap.trace", &format!("0,W,4096,0\n1,W,4096,{}\n", (1u64 << 55) - 1));
    let error = limited(&wraps);
    assert!(error.contains("wrap.trace, line 2: offset 18446744073709551104 + size 4096 passes 2^64 bytes"), "{error}");
    // A single line of 1 GB (sparse: NUL bytes and no newline).
    let long = dir.path().join("long.trace");
    std::fs::File::create(&long).unwrap().set_len(1 << 30).unwrap();
    let error = limited(long.to_str().unwrap());
    assert!(error.contains("long.trace, line 1: the line is longer than 64 KiB"), "{error}");
    // Binary garbage: one error, with its line and what to do.
    let noise = dir.path().join("noise.bin");
    std::fs::write(&noise, common::pattern(5, 1 << 20)).unwrap();
    let error = limited(noise.to_str().unwrap());
    assert!(error.contains("noise.bin, line 1: not text") && error.contains("--format"), "{error}");
    assert_eq!(error.matches("not text").count(), 1, "{error}");
    // The device's size, when given, bounds the requests.
    let past = write("past.trace", "0,W,4096,0\n1,W,4096,2048\n");
    let error = run_failing(REWIND, &["lab", "replay", &past, "--capacity", "1MiB"]);
    assert!(
        error.contains("past.trace, line 2: the request ends at byte 1052672, past the device's 1048576"),
        "{error}"
    );
    // More distinct blocks than allowed: refused before any state is kept for them.
    let many = write("many.trace", "0,W,1048576,0\n");
    let error = run_failing(REWIND, &["lab", "analyze", &many, "--max-blocks", "100", "--out", "/nonexistent"]);
    assert!(error.contains("more than 100 distinct blocks of 4096 bytes") && error.contains("--max-blocks"), "{error}");
}
