//! The report `rewind lab analyze --out DIR` writes: `report.md`, each
//! figure as SVG and PNG, and `analysis.json`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::analysis::{format_bytes, format_granularity, snapshot_model, Analysis};
use crate::replay::Architecture;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot draw {path}: {message}")]
    Plot { path: String, message: String },
}

/// How the x axis maps its values to labels.
enum XAxis {
    /// Values are log10 of nanoseconds.
    LogDuration,
    /// Values are indices into these labels.
    Categories(Vec<String>),
    Linear,
}

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    /// Markers only (a measurement), or a line (a model or a sweep).
    markers: bool,
}

struct Figure {
    /// File name without extension.
    name: String,
    title: String,
    x_label: String,
    y_label: String,
    x_axis: XAxis,
    series: Vec<Series>,
}

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans is not a valid font");
        }
    });
}

fn colour(index: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    PALETTE[index % PALETTE.len()]
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &Figure) -> Result<(), String> {
    let error = |error: DrawingAreaErrorKind<DB::ErrorType>| error.to_string();
    root.fill(&WHITE).map_err(error)?;
    let points = figure.series.iter().flat_map(|series| series.points.iter());
    let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in points {
        (x_min, x_max, y_max) = (x_min.min(x), x_max.max(x), y_max.max(y));
    }
    if x_min > x_max {
        (x_min, x_max) = (0.0, 1.0);
    }
    let pad = ((x_max - x_min) * 0.03).max(0.05);
    let mut chart = ChartBuilder::on(&root)
        .caption(&figure.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x_min - pad..x_max + pad, 0f64..(y_max * 1.1).max(1e-9))
        .map_err(error)?;
    let label_x = |x: &f64| match &figure.x_axis {
        XAxis::LogDuration => format_granularity(10f64.powf(*x).round() as u64),
        XAxis::Categories(labels) => {
            let index = x.round();
            if (x - index).abs() < 1e-6 && index >= 0.0 {
                labels.get(index as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
        XAxis::Linear => format!("{x:.2}"),
    };
    let x_labels = match &figure.x_axis {
        XAxis::Categories(labels) => labels.len() * 4 + 1,
        _ => 10,
    };
    chart
        .configure_mesh()
        .x_desc(&figure.x_label)
        .y_desc(&figure.y_label)
        .x_labels(x_labels)
        .x_label_formatter(&label_x)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    for (index, series) in figure.series.iter().enumerate() {
        let style = colour(index).stroke_width(2);
        let drawn = if series.markers {
            chart
                .draw_series(series.points.iter().map(|&point| Circle::new(point, 4, style.filled())))
                .map_err(error)?
        } else {
            chart.draw_series(LineSeries::new(series.points.iter().copied(), style)).map_err(error)?
        };
        drawn.label(&series.name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(error)?;
    root.present().map_err(error)
}

/// Writes `figure` as `DIR/NAME.svg` and `DIR/NAME.png`.
fn plot(dir: &Path, figure: &Figure) -> Result<(), ReportError> {
    register_font();
    let size = (900, 540);
    let svg = dir.join(format!("{}.svg", figure.name));
    let plot_error = |path: &Path| {
        let path = path.display().to_string();
        move |message| ReportError::Plot { path, message }
    };
    draw(SVGBackend::new(&svg, size).into_drawing_area(), figure).map_err(plot_error(&svg))?;
    let png = dir.join(format!("{}.png", figure.name));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), figure).map_err(plot_error(&png))
}

fn write_file(path: &Path, contents: &[u8]) -> Result<(), ReportError> {
    std::fs::write(path, contents).map_err(|source| ReportError::Io { path: path.display().to_string(), source })
}

/// Writes the report into `dir` (created if missing).
pub fn write_report(analysis: &Analysis, trace_name: &str, dir: &Path) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io { path: dir.display().to_string(), source })?;
    let figures = figures(analysis);
    for figure in &figures {
        plot(dir, figure)?;
    }
    let json = serde_json::to_vec_pretty(analysis).expect("an analysis serialises");
    write_file(&dir.join("analysis.json"), &json)?;
    write_file(&dir.join("report.md"), markdown(analysis, trace_name).as_bytes())
}

fn log_duration(nanos: u64) -> f64 {
    (nanos.max(1) as f64).log10()
}

fn granularity_labels(analysis: &Analysis) -> Vec<String> {
    analysis.granularities().into_iter().map(format_granularity).collect()
}

fn figures(analysis: &Analysis) -> Vec<Figure> {
    let mut figures = vec![
        Figure {
            name: "temporal-distance".into(),
            title: "T(t): writes overwritten within t".into(),
            x_label: "t".into(),
            y_label: "T(t)".into(),
            x_axis: XAxis::LogDuration,
            series: vec![Series {
                name: "T(t)".into(),
                points: analysis.temporal_distances.iter().map(|&(t, value)| (log_duration(t), value)).collect(),
                markers: false,
            }],
        },
        Figure {
            name: "retained".into(),
            title: "Retained fraction: R(g) (Claim 3.1) and replayed r".into(),
            x_label: "granularity g".into(),
            y_label: "retained fraction".into(),
            x_axis: XAxis::LogDuration,
            series: vec![
                Series {
                    name: "R(g), model".into(),
                    points: analysis.retained_curve.iter().map(|&(g, value)| (log_duration(g), value)).collect(),
                    markers: false,
                },
                Series {
                    name: "r, replayed".into(),
                    points: analysis
                        .points
                        .iter()
                        .filter(|point| point.granularity_nanos > 0)
                        .map(|point| (log_duration(point.granularity_nanos), point.retained))
                        .collect(),
                    markers: true,
                },
            ],
        },
    ];
    let granularities = analysis.granularities();
    let caches = analysis.caches();
    for &cache in &caches {
        let along = |architecture: Architecture, value: &dyn Fn(&crate::analysis::ArchitecturePoint) -> f64| {
            granularities
                .iter()
                .enumerate()
                .map(|(index, &g)| (index as f64, value(analysis.point(g, cache).architecture(architecture))))
                .collect()
        };
        figures.push(Figure {
            name: format!("ios-per-write-cache-{}", format_bytes(cache)),
            title: format!("Device I/Os per write, cache {}", format_bytes(cache)),
            x_label: "granularity g".into(),
            y_label: "I/Os per block written".into(),
            x_axis: XAxis::Categories(granularity_labels(analysis)),
            series: Architecture::ALL
                .iter()
                .map(|&architecture| Series {
                    name: architecture.name().into(),
                    points: along(architecture, &|point| point.ios_per_write),
                    markers: false,
                })
                .collect(),
        });
        if cache == *caches.last().expect("one cache at least") {
            figures.push(Figure {
                name: "space".into(),
                title: format!("Space (Figure 6, replayed r), cache {}", format_bytes(cache)),
                x_label: "granularity g".into(),
                y_label: "GiB".into(),
                x_axis: XAxis::Categories(granularity_labels(analysis)),
                series: [Architecture::Logging, Architecture::SplitStream, Architecture::Checkpointing]
                    .iter()
                    .map(|&architecture| Series {
                        name: match architecture {
                            Architecture::Logging => "logging, row".into(),
                            Architecture::SplitStream => "split-stream, split-down-stream".into(),
                            _ => "checkpointing, cow".into(),
                        },
                        points: along(architecture, &|point| point.space_bytes_model / (1u64 << 30) as f64),
                        markers: false,
                    })
                    .collect(),
            });
        }
    }
    let cache_labels: Vec<String> = caches.iter().map(|&cache| format_bytes(cache)).collect();
    for &g in &granularities {
        figures.push(Figure {
            name: format!("ios-per-write-g-{}", format_granularity(g)),
            title: format!("Device I/Os per write by cache size, g = {}", format_granularity(g)),
            x_label: "cache".into(),
            y_label: "I/Os per block written".into(),
            x_axis: XAxis::Categories(cache_labels.clone()),
            series: Architecture::ALL
                .iter()
                .map(|&architecture| Series {
                    name: architecture.name().into(),
                    points: caches
                        .iter()
                        .enumerate()
                        .map(|(index, &cache)| {
                            (index as f64, analysis.point(g, cache).architecture(architecture).ios_per_write)
                        })
                        .collect(),
                    markers: false,
                })
                .collect(),
        });
    }
    if let Some(snapshot) = analysis.snapshots.get(analysis.snapshots.len() / 2) {
        let parameters = (analysis.disk_seconds, analysis.merge_seconds);
        let sweep = |seconds: &dyn Fn(&crate::model::SnapshotModel) -> f64| {
            (0..=50)
                .map(|step| {
                    let gamma = f64::from(step) / 50.0;
                    (gamma, seconds(&snapshot_model(&analysis.trace, snapshot.interval_nanos, gamma, parameters)) * 1e3)
                })
                .collect()
        };
        let at_trace = snapshot_model(&analysis.trace, snapshot.interval_nanos, analysis.trace.write_ratio, parameters);
        figures.push(Figure {
            name: "cow-row".into(),
            title: format!(
                "COW and ROW mean response time (Xiao et al. eq. 1–3), snapshot every {}",
                format_granularity(snapshot.interval_nanos)
            ),
            x_label: "write ratio γ".into(),
            y_label: "ms".into(),
            x_axis: XAxis::Linear,
            series: vec![
                Series { name: "COW".into(), points: sweep(&|model| model.cow_seconds()), markers: false },
                Series {
                    name: "ROW, merge at runtime".into(),
                    points: sweep(&|model| model.row_seconds()),
                    markers: false,
                },
                Series {
                    name: "ROW, merge offline".into(),
                    points: sweep(&|model| model.row_offline_seconds()),
                    markers: false,
                },
                Series {
                    name: "this trace (COW, ROW offline)".into(),
                    points: vec![
                        (analysis.trace.write_ratio, at_trace.cow_seconds() * 1e3),
                        (analysis.trace.write_ratio, at_trace.row_offline_seconds() * 1e3),
                    ],
                    markers: true,
                },
            ],
        });
    }
    figures
}

fn image(out: &mut String, name: &str, alt: &str) {
    let _ = writeln!(out, "![{alt}]({name}.svg)\n\n([PNG]({name}.png))\n");
}

fn markdown(analysis: &Analysis, trace_name: &str) -> String {
    let trace = &analysis.trace;
    let mut out = String::new();
    let _ = writeln!(out, "# CDP architectures for `{trace_name}`\n");
    let _ = writeln!(out, "## Recommendation\n");
    for line in &analysis.recommendations {
        let _ = writeln!(out, "- {line}");
    }
    let _ = writeln!(
        out,
        "\nLogging (and ROW, which redirects every write to its snapshot store) never costs more write I/O \
         than the others: d per write. What they give up is a current store: the present is read through the \
         map, scattered over history. Choose a layout with a current store when reads of the present must be \
         sequential; among them the cheapest is named above. Space (Figure 6): Logging r·w, SplitStream and \
         SplitDownStream a + r·w, Checkpointing a + r·w − f.\n"
    );
    let _ = writeln!(out, "## The trace\n");
    let _ = writeln!(out, "| requests | writes | blocks written | blocks read | duration | write ratio γ | block | a (addressable) | f (written) |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {:.1} s | {:.3} | {} | {} | {} |\n",
        trace.requests,
        trace.write_requests,
        trace.block_writes,
        trace.block_reads,
        trace.duration_nanos as f64 / 1e9,
        trace.write_ratio,
        format_bytes(trace.block_bytes),
        trace.blocks_addressable,
        trace.blocks_written
    );
    image(&mut out, "temporal-distance", "T(t)");
    let _ = writeln!(out, "## Retained fraction\n");
    image(&mut out, "retained", "R(g) against replayed r");
    let _ = writeln!(out, "## I/Os per write\n");
    let _ = writeln!(
        out,
        "Device I/Os that writes cause, per block written, replayed and (in parentheses) Figure 5's model \
         with the replayed c and D(g, s) at the cache window s that c stands for. ROW's merges of each \
         snapshot back into the source store are counted apart (last column), as the model does.\n"
    );
    let names: Vec<&str> = Architecture::ALL.iter().map(|architecture| architecture.name()).collect();
    let _ = writeln!(out, "| g | cache | r (R(g)) | c | d (D(g,s)) | {} | row merges |", names.join(" | "));
    let _ = writeln!(out, "|---|---|---|---|---|{}---|", "---|".repeat(names.len()));
    for point in &analysis.points {
        let ios: Vec<String> = point
            .architectures
            .iter()
            .map(|architecture| format!("{:.3} ({:.3})", architecture.ios_per_write, architecture.ios_per_write_model))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {:.4} ({:.4}) | {:.4} | {:.4} ({:.4}) | {} | {:.3} |",
            format_granularity(point.granularity_nanos),
            format_bytes(point.cache_bytes),
            point.retained,
            point.retained_model,
            point.evicted,
            point.incurred,
            point.incurred_model,
            ios.join(" | "),
            point.architecture(Architecture::Row).merge_ios_per_write
        );
    }
    let _ = writeln!(out);
    for cache in analysis.caches() {
        image(&mut out, &format!("ios-per-write-cache-{}", format_bytes(cache)), "I/Os per write by granularity");
    }
    for g in analysis.granularities() {
        image(&mut out, &format!("ios-per-write-g-{}", format_granularity(g)), "I/Os per write by cache size");
    }
    let _ = writeln!(out, "## Space\n");
    let _ = writeln!(out, "Figure 6 with the replayed r, w = {} block writes:\n", trace.block_writes);
    let _ = writeln!(out, "| g | logging, row | split-stream, split-down-stream | checkpointing, cow |");
    let _ = writeln!(out, "|---|---|---|---|");
    let largest_cache = *analysis.caches().last().unwrap_or(&0);
    for g in analysis.granularities() {
        let point = analysis.point(g, largest_cache);
        let space = |architecture| format_bytes(point.architecture(architecture).space_bytes_model as u64);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            format_granularity(g),
            space(Architecture::Logging),
            space(Architecture::SplitStream),
            space(Architecture::Checkpointing)
        );
    }
    let _ = writeln!(out);
    image(&mut out, "space", "space by granularity");
    let _ = writeln!(out, "## COW and ROW snapshots\n");
    let _ = writeln!(
        out,
        "Xiao et al.'s model (§3, equations 1–3) at this trace's rate ({:.1} requests/s) and write ratio, \
         N = f = {} blocks, D = {} ms per disk access, σ = {} ms to merge a read, a snapshot every g:\n",
        trace.requests as f64 / (trace.duration_nanos.max(1) as f64 / 1e9),
        trace.blocks_written,
        analysis.disk_seconds * 1e3,
        analysis.merge_seconds * 1e3
    );
    let _ = writeln!(
        out,
        "| snapshot every | COW | ROW, merge at runtime | ROW, merge offline | COW slower than ROW offline above γ |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for snapshot in &analysis.snapshots {
        let _ = writeln!(
            out,
            "| {} | {:.3} ms | {:.3} ms | {:.3} ms | {} |",
            format_granularity(snapshot.interval_nanos),
            snapshot.cow_seconds * 1e3,
            snapshot.row_seconds * 1e3,
            snapshot.row_offline_seconds * 1e3,
            snapshot.cow_row_crossover.map_or("never".to_owned(), |gamma| format!("{gamma:.3}"))
        );
    }
    let _ = writeln!(out);
    if !analysis.snapshots.is_empty() {
        image(&mut out, "cow-row", "COW and ROW response times by write ratio");
    }
    out.push_str(CONVENTIONS);
    out
}

const CONVENTIONS: &str = "\
## Conventions

- A page is an extent is a block (the block size above); I/Os are counted per block, never merged.
- Granularity windows start at the trace's first request (offset 0) and are `g` long; `ew` keeps every
  write. A version is retained if it is the last write of its block in its window. The replayed r is at
  this one offset; R(g) is its expectation over offsets (Claim 3.1), so at coarse g the two differ by
  the luck of where windows fall.
- The state before the trace is a retained point (the volume's creation): its first overwrite is copied
  by Checkpointing and COW. The trace ends at a window end: each block's last write is retained and the
  cache is flushed.
- The controller cache is the IBM paper's: reads LRU, writes LRW, dirty pages limited to 3% of the pages.
  SplitStream's two caches are each the configured size.
- COW and ROW take a snapshot at every window boundary; ROW merges the blocks written since the last
  snapshot back into the source store at each one (a read and a write each, counted apart as merge I/Os
  and not in the I/Os per write).
- Reads are counted apart from the I/Os writes cause, as the paper does.
- Xiao's model spreads writes uniformly over N blocks; it has no cache, so its response times are for the
  disks alone.
";
