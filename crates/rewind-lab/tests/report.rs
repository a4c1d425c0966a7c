//! `rewind lab analyze`'s report: Markdown, every figure in SVG and PNG, and the numbers as JSON.

use rewind_lab::analysis::{analyze, AnalyzeConfig};
use rewind_lab::replay::Convention;
use rewind_lab::report::write_report;
use rewind_lab::spc1::Spc1;
use rewind_lab::trace::{read_all, ReadOptions, Request};

#[test]
fn a_report_has_its_tables_figures_and_conventions() {
    let seed = 11;
    println!("seed {seed}");
    let spc1 = Spc1 { bsu: 1, capacity_bytes: 256 << 20, duration_nanos: 120_000_000_000, seed };
    let requests: Vec<_> = spc1.requests().collect();
    let config = AnalyzeConfig {
        granularities_nanos: vec![0, 1_000_000_000, 60_000_000_000],
        caches_bytes: vec![1 << 20, 64 << 20],
        block_bytes: 4096,
        dirty_fraction: 0.03,
        capacity_bytes: Some(256 << 20),
        disk_seconds: 0.005,
        merge_seconds: 0.0005,
        convention: Convention::Paper,
        max_blocks: 1 << 20,
    };
    let analysis = analyze(&requests, &config, &mut |_, _| {}).expect("within the block limit");
    let dir = tempfile::tempdir().expect("temporary directory");
    write_report(&analysis, "spc1.trace", dir.path()).expect("report written");

    let markdown = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    for wanted in ["## Recommendation", "## I/Os per write", "| 1m | 64MiB |", "## Conventions", "cow-row.svg"] {
        assert!(markdown.contains(wanted), "report.md lacks {wanted:?}:\n{markdown}");
    }
    for figure in
        ["temporal-distance", "retained", "ios-per-write-cache-64MiB", "ios-per-write-g-ew", "space", "cow-row"]
    {
        let svg = std::fs::read_to_string(dir.path().join(format!("{figure}.svg"))).expect("svg");
        assert!(svg.starts_with("<svg") && svg.contains("<text"), "{figure}.svg has no labelled plot");
        let png = std::fs::read(dir.path().join(format!("{figure}.png"))).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{figure}.png is not a PNG");
        assert!(markdown.contains(&format!("({figure}.svg)")), "report.md does not show {figure}");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("analysis.json")).expect("analysis.json")).expect("json");
    assert_eq!(json["points"].as_array().map(Vec::len), Some(6));
    assert_eq!(json["trace"]["requests"].as_u64(), Some(requests.len() as u64));
}

/// `report.md` of `requests` against `tests/golden/NAME-CONVENTION.md`;
/// `REWIND_BLESS=1` writes the golden file instead (then read the diff).
fn check_golden(name: &str, requests: &[Request], config: &AnalyzeConfig) {
    let analysis = analyze(requests, config, &mut |_, _| {}).expect("within the block limit");
    let dir = tempfile::tempdir().expect("temporary directory");
    write_report(&analysis, &format!("{name}.trace"), dir.path()).expect("report written");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/{name}-{}.md", config.convention.name()));
    if std::env::var_os("REWIND_BLESS").is_some() {
        std::fs::write(&golden, &markdown).expect("golden file written");
        return;
    }
    let expected = std::fs::read_to_string(&golden).expect("the golden report (REWIND_BLESS=1 writes it)");
    if markdown != expected {
        let first = markdown.lines().zip(expected.lines()).position(|(got, want)| got != want);
        panic!(
            "{} differs from this run's report at line {}:\n{}\n(REWIND_BLESS=1 rewrites it; review the diff)",
            golden.display(),
            first.map_or(markdown.lines().count().min(expected.lines().count()) + 1, |line| line + 1),
            first.map_or(String::new(), |line| format!(
                "got:  {}\nwant: {}",
                markdown.lines().nth(line).unwrap_or_default(),
                expected.lines().nth(line).unwrap_or_default()
            ))
        );
    }
}

fn golden_config(granularities_nanos: Vec<u64>, caches_bytes: Vec<u64>, dirty_fraction: f64) -> AnalyzeConfig {
    AnalyzeConfig {
        granularities_nanos,
        caches_bytes,
        block_bytes: 4096,
        dirty_fraction,
        capacity_bytes: None,
        disk_seconds: 0.005,
        merge_seconds: 0.0005,
        convention: Convention::Paper,
        max_blocks: 1 << 20,
    }
}

#[test]
fn golden_reports_of_two_small_traces_under_both_conventions() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/overwrites.trace");
    let text = std::fs::read(path).expect("the hand-made trace");
    let overwrites = read_all(&text[..], "overwrites.trace", ReadOptions::default()).expect("a valid trace");
    let seed = 3;
    println!("seed {seed}");
    let spc1 = Spc1 { bsu: 1, capacity_bytes: 64 << 20, duration_nanos: 60_000_000_000, seed };
    let spc1: Vec<Request> = spc1.requests().collect();
    for convention in [Convention::Paper, Convention::SteadyState] {
        let small = golden_config(vec![0, 1_000_000_000, 10_000_000_000], vec![0, 8 << 10, 64 << 10], 0.5);
        check_golden("overwrites", &overwrites, &AnalyzeConfig { convention, ..small });
        let spc1_config = golden_config(vec![0, 1_000_000_000, 10_000_000_000], vec![256 << 10, 4 << 20], 0.03);
        check_golden("spc1-1bsu-60s", &spc1, &AnalyzeConfig { convention, ..spc1_config });
    }
}
