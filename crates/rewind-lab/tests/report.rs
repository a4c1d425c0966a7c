//! `rewind lab analyze`'s report: Markdown, every figure in SVG and PNG, and the numbers as JSON.

use rewind_lab::analysis::{analyze, AnalyzeConfig};
use rewind_lab::report::write_report;
use rewind_lab::spc1::Spc1;

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
    };
    let analysis = analyze(&requests, &config, &mut |_, _| {});
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
