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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Line {
    Solid,
    /// Long dashes: a line drawn over another of the same values lets it show.
    Dashed,
    /// Short dots: a model beside its measurement.
    Dotted,
    None,
}

#[derive(Clone, Copy)]
enum Marker {
    Dot,
    Triangle,
    OpenTriangle,
    Cross,
    /// An open ring, large enough to circle a `Dot` at the same point.
    Ring,
}

struct Series {
    /// The legend entry; `None`: no entry of its own.
    name: Option<String>,
    points: Vec<(f64, f64)>,
    colour: usize,
    line: Line,
    marker: Option<Marker>,
}

impl Series {
    fn line(name: &str, colour: usize, points: Vec<(f64, f64)>) -> Series {
        Series { name: Some(name.to_owned()), points, colour, line: Line::Solid, marker: None }
    }

    fn markers(name: &str, colour: usize, marker: Marker, points: Vec<(f64, f64)>) -> Series {
        Series { name: Some(name.to_owned()), points, colour, line: Line::None, marker: Some(marker) }
    }
}

struct Figure {
    /// File name without extension.
    name: String,
    title: String,
    x_label: String,
    y_label: String,
    x_axis: XAxis,
    series: Vec<Series>,
    /// A line under the legend (the convention the figure counts by).
    note: String,
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

/// Names a series drawn with markers in the legend, with its marker.
fn label<'a, DB: DrawingBackend + 'a, E: IntoDynElement<'a, DB, (i32, i32)>>(
    drawn: Option<(&mut plotters::chart::SeriesAnno<'a, DB>, impl Fn((i32, i32)) -> E + 'a)>,
    name: Option<String>,
) {
    if let (Some((drawn, legend)), Some(name)) = (drawn, name) {
        drawn.label(name).legend(legend);
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &Figure) -> Result<(), String> {
    let error = |error: DrawingAreaErrorKind<DB::ErrorType>| error.to_string();
    root.fill(&WHITE).map_err(error)?;
    let points = figure.series.iter().flat_map(|series| series.points.iter());
    let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in points {
        (x_min, x_max, y_max) = (x_min.min(x), x_max.max(x), y_max.max(y));
    }
    let (x_range, x_labels) = match &figure.x_axis {
        // Half a category either side, and one label a category: every
        // category gets its label, the last one included.
        XAxis::Categories(labels) => (-0.5..labels.len() as f64 - 0.5, labels.len()),
        _ => {
            if x_min > x_max {
                (x_min, x_max) = (0.0, 1.0);
            }
            let pad = ((x_max - x_min) * 0.03).max(0.05);
            (x_min - pad..x_max + pad, 10)
        }
    };
    let (body, note_area) = root.split_vertically(root.dim_in_pixel().1 - 24);
    let mut chart = ChartBuilder::on(&body)
        .caption(&figure.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x_range, 0f64..(y_max * 1.4).max(1e-9))
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
    chart
        .configure_mesh()
        .x_desc(&figure.x_label)
        .y_desc(&figure.y_label)
        .x_labels(x_labels)
        .x_label_formatter(&label_x)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    for series in &figure.series {
        let style = colour(series.colour).stroke_width(2);
        let points = series.points.iter().copied();
        let drawn = match series.line {
            Line::Solid => Some(chart.draw_series(LineSeries::new(points, style)).map_err(error)?),
            Line::Dashed => Some(chart.draw_series(DashedLineSeries::new(points, 10, 6, style)).map_err(error)?),
            Line::Dotted => {
                let thin = colour(series.colour).stroke_width(1);
                Some(chart.draw_series(DashedLineSeries::new(points, 2, 4, thin)).map_err(error)?)
            }
            Line::None => None,
        };
        // A marker of each kind at every point; its legend entry is the
        // marker on a stroke of the series' line (plain when it has none).
        let stroke = if series.line == Line::None { Vec::new() } else { vec![(-11, 0), (11, 0)] };
        macro_rules! marked {
            ($shape:ident, $size:expr, $style:expr) => {{
                let shape_style: ShapeStyle = $style;
                let markers = series.points.iter().map(|&point| $shape::new(point, $size, shape_style));
                let drawn = chart.draw_series(markers).map_err(error)?;
                let stroke = stroke.clone();
                Some((drawn, move |(x, y): (i32, i32)| {
                    EmptyElement::at((x + 11, y))
                        + PathElement::new(stroke.clone(), style)
                        + $shape::new((0, 0), $size, shape_style)
                }))
            }};
        }
        let name = series.name.clone();
        match series.marker {
            Some(Marker::Dot) => label(marked!(Circle, 4, style.filled()), name),
            Some(Marker::Ring) => label(marked!(Circle, 8, style), name),
            Some(Marker::Triangle) => label(marked!(TriangleMarker, 8, style.filled()), name),
            Some(Marker::OpenTriangle) => label(marked!(TriangleMarker, 7, style), name),
            Some(Marker::Cross) => label(marked!(Cross, 5, style), name),
            None => {
                if let (Some(name), Some(drawn)) = (name, drawn) {
                    drawn.label(name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
                }
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(error)?;
    note_area
        .draw(&Text::new(figure.note.clone(), (14, 2), ("sans-serif", 13).into_font().color(&BLACK.mix(0.7))))
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

/// How each architecture is drawn: colour and marker by architecture,
/// the same in every figure. ROW costs what Logging does (d), so its line is
/// dashed and its marker a ring around Logging's dot: both stay visible.
fn architecture_style(architecture: Architecture) -> (usize, Marker, Line) {
    match architecture {
        Architecture::Logging => (0, Marker::Dot, Line::Solid),
        Architecture::SplitStream => (1, Marker::Triangle, Line::Solid),
        Architecture::SplitDownStream => (2, Marker::Cross, Line::Solid),
        Architecture::Checkpointing => (3, Marker::OpenTriangle, Line::Solid),
        Architecture::Cow => (4, Marker::Dot, Line::Solid),
        Architecture::Row => (5, Marker::Ring, Line::Dashed),
    }
}

/// Every architecture's replayed I/Os per write (markers on lines) and
/// Figure 5's model (dotted, the same colour) along `points`.
fn ios_series(points: &[&crate::analysis::Point]) -> Vec<Series> {
    let along = |architecture: Architecture, value: &dyn Fn(&crate::analysis::ArchitecturePoint) -> f64| {
        points
            .iter()
            .enumerate()
            .map(|(index, point)| (index as f64, value(point.architecture(architecture))))
            .collect()
    };
    let mut series = Vec::new();
    for architecture in Architecture::ALL {
        let (colour, marker, line) = architecture_style(architecture);
        series.push(Series {
            name: None,
            points: along(architecture, &|point| point.ios_per_write_model),
            colour,
            line: Line::Dotted,
            marker: None,
        });
        series.push(Series {
            name: Some(architecture.name().to_owned()),
            points: along(architecture, &|point| point.ios_per_write),
            colour,
            line,
            marker: Some(marker),
        });
    }
    // One legend entry for all the model lines.
    series.push(Series {
        name: Some("dotted, same colours: Figure 5's model".into()),
        points: Vec::new(),
        colour: 7,
        line: Line::Dotted,
        marker: None,
    });
    series
}

fn figures(analysis: &Analysis) -> Vec<Figure> {
    let note = format!("convention: {}", analysis.convention.describe());
    let mut figures = vec![
        Figure {
            name: "temporal-distance".into(),
            title: "T(t): counted writes overwritten within t (as Figure 7)".into(),
            x_label: "t".into(),
            y_label: "T(t)".into(),
            x_axis: XAxis::LogDuration,
            series: vec![Series::line(
                "T(t)",
                0,
                analysis.temporal_distances.iter().map(|&(t, value)| (log_duration(t), value)).collect(),
            )],
            note: note.clone(),
        },
        Figure {
            name: "retained".into(),
            title: "Retained fraction: R(g) (Claim 3.1) and replayed r (as Figure 8)".into(),
            x_label: "granularity g".into(),
            y_label: "retained fraction".into(),
            x_axis: XAxis::LogDuration,
            series: vec![
                Series::line(
                    "R(g), model",
                    0,
                    analysis.retained_curve.iter().map(|&(g, value)| (log_duration(g), value)).collect(),
                ),
                Series::markers(
                    "r, replayed",
                    1,
                    Marker::Dot,
                    analysis
                        .points
                        .iter()
                        .filter(|point| point.granularity_nanos > 0)
                        .map(|point| (log_duration(point.granularity_nanos), point.retained))
                        .collect(),
                ),
            ],
            note: note.clone(),
        },
    ];
    let granularities = analysis.granularities();
    let caches = analysis.caches();
    for &cache in &caches {
        let points: Vec<_> = granularities.iter().map(|&g| analysis.point(g, cache)).collect();
        figures.push(Figure {
            name: format!("ios-per-write-cache-{}", format_bytes(cache)),
            title: format!("Device I/Os per write (Figure 5), cache {}", format_bytes(cache)),
            x_label: "granularity g".into(),
            y_label: "I/Os per write counted".into(),
            x_axis: XAxis::Categories(granularity_labels(analysis)),
            series: ios_series(&points),
            note: note.clone(),
        });
    }
    if let Some(&largest) = caches.last() {
        let space = |architecture: Architecture, name: &str| {
            let (colour, marker, _) = architecture_style(architecture);
            let points = granularities
                .iter()
                .enumerate()
                .map(|(index, &g)| {
                    let bytes = analysis.point(g, largest).architecture(architecture).space_bytes_model;
                    (index as f64, bytes / (1u64 << 30) as f64)
                })
                .collect();
            Series { name: Some(name.to_owned()), points, colour, line: Line::Solid, marker: Some(marker) }
        };
        figures.push(Figure {
            name: "space".into(),
            title: format!("Space (Figure 6, replayed retained versions), cache {}", format_bytes(largest)),
            x_label: "granularity g".into(),
            y_label: "GiB".into(),
            x_axis: XAxis::Categories(granularity_labels(analysis)),
            series: vec![
                space(Architecture::Logging, "logging, row"),
                space(Architecture::SplitStream, "split-stream, split-down-stream"),
                space(Architecture::Checkpointing, "checkpointing, cow"),
            ],
            note: note.clone(),
        });
    }
    let cache_labels: Vec<String> = caches.iter().map(|&cache| format_bytes(cache)).collect();
    for &g in &granularities {
        let points: Vec<_> = caches.iter().map(|&cache| analysis.point(g, cache)).collect();
        figures.push(Figure {
            name: format!("ios-per-write-g-{}", format_granularity(g)),
            title: format!("Device I/Os per write (Figure 5) by cache size, g = {}", format_granularity(g)),
            x_label: "cache".into(),
            y_label: "I/Os per write counted".into(),
            x_axis: XAxis::Categories(cache_labels.clone()),
            series: ios_series(&points),
            note: note.clone(),
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
            y_label: "ms per I/O".into(),
            x_axis: XAxis::Linear,
            series: vec![
                Series::line("COW (eq. 1)", 4, sweep(&|model| model.cow_seconds())),
                Series::line("ROW, merge at runtime (eq. 2 per I/O)", 5, sweep(&|model| model.row_seconds())),
                Series {
                    line: Line::Dashed,
                    ..Series::line("ROW, merge offline (eq. 3)", 0, sweep(&|model| model.row_offline_seconds()))
                },
                Series::markers(
                    "this trace (COW, ROW offline)",
                    3,
                    Marker::Dot,
                    vec![
                        (analysis.trace.write_ratio, at_trace.cow_seconds() * 1e3),
                        (analysis.trace.write_ratio, at_trace.row_offline_seconds() * 1e3),
                    ],
                ),
            ],
            note: format!(
                "D = {} ms, σ = {} ms, N = {} blocks; eq. 2's merge term N·P1·2D·μ divided by λ (time per I/O)",
                analysis.disk_seconds * 1e3,
                analysis.merge_seconds * 1e3,
                analysis.trace.blocks_written
            ),
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
    let _ = writeln!(
        out,
        "Convention: **{}** — {}. Every fraction and every per-write figure below counts by it \
         (`--convention paper|steady-state`; the conversion is under Conventions).\n",
        analysis.convention.name(),
        analysis.convention.describe()
    );
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
    let _ = writeln!(out, "| requests | writes | blocks written | w (counted) | blocks read | duration | write ratio γ | block | a (addressable) | f (written) |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {:.1} s | {:.3} | {} | {} | {} |\n",
        trace.requests,
        trace.write_requests,
        trace.block_writes,
        trace.counted_writes,
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
        "Device I/Os that writes cause, per write counted, replayed and (in parentheses) Figure 5's model \
         with R(g), the replayed c and D(g, s) at the cache window s that c stands for. COW's model is \
         c + r(1 + m), m the share of its copies that read the old data from disk rather than the cache \
         (measured, as c is; the paper's c + 2r is m = 1). ROW's merges of each snapshot back into the \
         source store are counted apart (last column), as the model does. With the replayed r and d in \
         place of R(g) and D(g, s) the formulas give the replayed figures exactly.\n"
    );
    let names: Vec<&str> = Architecture::ALL.iter().map(|architecture| architecture.name()).collect();
    let _ = writeln!(out, "| g | cache | r (R(g)) | c | d (D(g,s)) | m | {} | row merges |", names.join(" | "));
    let _ = writeln!(out, "|---|---|---|---|---|---|{}---|", "---|".repeat(names.len()));
    for point in &analysis.points {
        let ios: Vec<String> = point
            .architectures
            .iter()
            .map(|architecture| format!("{:.3} ({:.3})", architecture.ios_per_write, architecture.ios_per_write_model))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {:.4} ({:.4}) | {:.4} | {:.4} ({:.4}) | {:.3} | {} | {:.3} |",
            format_granularity(point.granularity_nanos),
            format_bytes(point.cache_bytes),
            point.retained,
            point.retained_model,
            point.evicted,
            point.incurred,
            point.incurred_model,
            point.copy_misses,
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
    let _ = writeln!(
        out,
        "Figure 6 with the replayed retained versions (each block's last one among them, whatever the \
         convention: the figure's a + rw − f for Checkpointing counts it), {} block writes:\n",
        trace.block_writes
    );
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
         N = f = {} blocks, D = {} ms per disk access, σ = {} ms to merge a read, a snapshot every g. \
         Equation 2's merge term N·P1·2D·μ, taken literally, is disk time per second (it has no unit of \
         time per I/O and, added to a response time, weighs by whatever unit D is in); here it is divided \
         by λ, the I/Os of that second, to give the merge work each I/O carries.\n",
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

- Which writes are counted (`--convention`). **paper** (the IBM paper's footnote 3, the default): only
  writes that have a subsequent write to their block; every fraction (T, r, c, d, I/Os per write) is of
  those, and an I/O is charged to the version it writes or preserves, so a block's last write and the
  copy of the state before the trace cost nothing. T(t) reaches 1. **steady-state**: every write; each
  block's last write is retained (the trace ends at a window end) and the state before the trace is a
  retained point that Checkpointing and COW copy once. T(t) levels off at the fraction of writes that are
  overwritten. With w writes to f blocks, n = w − f have a subsequent write, and a figure converts as
  X_steady = (n·X_paper + k·f) / w, with k = 1 for T's complement, r, c, d, Logging and ROW, 2 for
  SplitStream and SplitDownStream, 3 for Checkpointing, and for COW 2 plus the share of its first copies
  that read the disk (the rest find the old data in the cache).
- Either way the replay and the model count the same events: the flush of the cache at the end is part of
  c (steady state) or of nothing (paper), so Figure 5's formulas hold exactly for the replayed r, c, d.
- A page is an extent is a block (the block size above); I/Os are counted per block, never merged.
- Granularity windows start at the trace's first request (offset 0) and are `g` long; `ew` keeps every
  write. A version is retained if it is the last write of its block in its window. The replayed r is at
  this one offset; R(g) is its expectation over offsets (Claim 3.1), so at coarse g the two differ by
  the luck of where windows fall.
- The controller cache is the IBM paper's: reads LRU, writes LRW, dirty pages limited to 3% of the pages.
  SplitStream's two caches are each the configured size.
- COW and ROW take a snapshot at every window boundary; ROW merges the blocks written since the last
  snapshot back into the source store at each one (a read and a write each, counted apart as merge I/Os
  and not in the I/Os per write). COW's copy reads nothing when the old data is in the cache.
- Reads are counted apart from the I/Os writes cause, as the paper does.
- Xiao's model spreads writes uniformly over N blocks; it has no cache, so its response times are for the
  disks alone.
";
