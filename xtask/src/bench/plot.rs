//! The plots, SVG and PNG, through plotters: one panel per model in each figure.
//!
//! * `decode_latency`: ms per decode step against position, by engine (log y): the naive
//!   engine's step grows linearly with the prefix it recomputes, a cached engine's stays flat;
//! * `generation_time`: cumulative generation time against positions (log y): O(N²) vs O(N);
//! * `batch_throughput`: decode tokens/s against batch size (log-log);
//! * `kv_memory`: KV bytes against context length, by engine and layout, with the formula.
//!
//! Text uses DejaVu Sans embedded in the binary (plotters' `ab_glyph` feature), so the PNGs
//! render on a machine without fontconfig; the SVGs name the font family and leave the glyphs
//! to the viewer.

use std::path::Path;

use anyhow::{Result, anyhow};
use kvlab_cli::engines::EngineKind;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Report;

/// Registers the embedded font as "sans-serif", plotters' default family.
pub fn register_font() {
    // Registering twice only replaces the entry; a failure leaves the plots without text.
    let _ =
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Colour of an engine, the same in every figure: its place in `EngineKind::ALL`.
fn color(engine: &str) -> RGBColor {
    const PALETTE: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
    ];
    EngineKind::ALL
        .iter()
        .position(|e| e.name() == engine)
        .and_then(|i| PALETTE.get(i).copied())
        .unwrap_or(RGBColor(255, 127, 14))
}

const PANEL: (u32, u32) = (560, 420);

/// Writes every figure as SVG and PNG into `dir`; returns the file names.
pub fn all(r: &Report, dir: &Path) -> Result<Vec<String>> {
    let models: Vec<String> = r.models.iter().map(|m| m.name.clone()).collect();
    if models.is_empty() {
        return Ok(Vec::new());
    }
    let size = (PANEL.0 * models.len() as u32, PANEL.1);
    let mut files = Vec::new();
    for fig in [
        Fig::DecodeLatency,
        Fig::GenerationTime,
        Fig::BatchThroughput,
        Fig::KvMemory,
    ] {
        let (svg, png) = (
            format!("{}.svg", fig.file_stem()),
            format!("{}.png", fig.file_stem()),
        );
        let path = dir.join(&svg);
        draw(
            SVGBackend::new(&path, size).into_drawing_area(),
            r,
            &models,
            fig,
        )?;
        let path = dir.join(&png);
        draw(
            BitMapBackend::new(&path, size).into_drawing_area(),
            r,
            &models,
            fig,
        )?;
        files.extend([svg, png]);
    }
    Ok(files)
}

#[derive(Clone, Copy)]
enum Fig {
    DecodeLatency,
    GenerationTime,
    BatchThroughput,
    KvMemory,
}

impl Fig {
    fn file_stem(self) -> &'static str {
        match self {
            Fig::DecodeLatency => "decode_latency",
            Fig::GenerationTime => "generation_time",
            Fig::BatchThroughput => "batch_throughput",
            Fig::KvMemory => "kv_memory",
        }
    }
}

/// One figure: a panel per model side by side.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    r: &Report,
    models: &[String],
    fig: Fig,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    for (area, m) in root.split_evenly((1, models.len())).iter().zip(models) {
        match fig {
            Fig::DecodeLatency => decode_panel(area, r, m)?,
            Fig::GenerationTime => generation_panel(area, r, m)?,
            Fig::BatchThroughput => batch_panel(area, r, m)?,
            Fig::KvMemory => memory_panel(area, r, m)?,
        }
    }
    root.present().map_err(err)
}

/// The range `lo..hi` widened by a factor on each side, for a log axis.
fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        return (0.1, 10.0);
    }
    (lo / 1.5, hi * 1.5)
}

/// The median of each window of `w` (odd) values centred on each index, clipped at the ends.
fn rolling_median(v: &[f64], w: usize) -> Vec<f64> {
    let h = w / 2;
    (0..v.len())
        .map(|i| {
            let mut win: Vec<f64> = v[i.saturating_sub(h)..(i + h + 1).min(v.len())].to_vec();
            win.sort_by(f64::total_cmp);
            win[win.len() / 2]
        })
        .collect()
}

/// The distinct items in order of first appearance.
fn unique<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// An axis number without trailing ".0" noise, two significant digits below 1: 30000, 12.5,
/// 0.25, 0.0012.
fn num(v: &f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{}", (v * 10.0).round() / 10.0)
    } else {
        let decimals = ((-a.log10()).floor() as usize + 2).min(8);
        let s = format!("{v:.decimals$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// At most `max` points of a series, evenly spaced (plots of 1,000-position runs stay small).
fn thin(pts: Vec<(f64, f64)>, max: usize) -> Vec<(f64, f64)> {
    let step = pts.len().div_ceil(max).max(1);
    let last = pts.last().copied();
    let mut out: Vec<(f64, f64)> = pts.into_iter().step_by(step).collect();
    if let Some(l) = last.filter(|l| out.last().is_some_and(|o| o.0 != l.0)) {
        out.push(l);
    }
    out
}

fn subtitle(r: &Report, model: &str) -> String {
    r.models
        .iter()
        .find(|m| m.name == model)
        .map_or(model.to_string(), |m| {
            format!(
                "{model} ({}, {:.1} M params)",
                m.format,
                m.n_params as f64 / 1e6
            )
        })
}

fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    pos: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)
}

fn decode_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &Report,
    model: &str,
) -> Result<()> {
    let runs: Vec<_> = r.decode.iter().filter(|d| d.model == model).collect();
    let xmax = runs.iter().map(|d| d.positions).max().unwrap_or(2) as f64;
    // A linear time axis: the naive engine's step grows as a straight line with the position
    // (it recomputes the prefix), a cached engine's hugs the floor. On a shared machine single
    // steps are hit by the neighbours' bursts, which only ever add time: the line is the fastest
    // repetition of each position (min), smoothed by a rolling median, and the raw minima are
    // drawn faintly behind it.
    let window = (xmax as usize / 64) | 1;
    let hi = runs
        .iter()
        .flat_map(|d| rolling_median(&d.step_ms.min[1..], window))
        .fold(0.0f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("decode step time — {}", subtitle(r, model)),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..xmax, 0f64..hi.max(1e-3))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("position (tokens already in the sequence)")
        .y_desc("ms per decode step")
        .x_label_formatter(&num)
        .y_label_formatter(&num)
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for d in &runs {
        let c = color(&d.engine);
        let raw: Vec<(f64, f64)> = (1..d.positions)
            .map(|p| (p as f64, d.step_ms.min[p].min(hi)))
            .collect();
        chart
            .draw_series(LineSeries::new(raw, c.mix(0.25).stroke_width(1)))
            .map_err(err)?;
        let smooth = rolling_median(&d.step_ms.min[1..], window);
        let pts: Vec<(f64, f64)> = smooth
            .into_iter()
            .enumerate()
            .map(|(i, y)| ((i + 1) as f64, y))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(err)?
            .label(format!(
                "{} (min of {} reps, rolling median of {window})",
                d.engine, d.reps
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn generation_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &Report,
    model: &str,
) -> Result<()> {
    let runs: Vec<_> = r.decode.iter().filter(|d| d.model == model).collect();
    let xmax = runs.iter().map(|d| d.positions).max().unwrap_or(2) as f64;
    let cum = |d: &super::decode::DecodeRun| -> Vec<(f64, f64)> {
        let mut acc = 0.0;
        d.step_ms
            .median
            .iter()
            .enumerate()
            .map(|(p, ms)| {
                acc += ms;
                ((p + 1) as f64, acc / 1e3)
            })
            .collect()
    };
    let (lo, hi) = log_range(runs.iter().flat_map(|d| cum(d).into_iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("generation time — {}", subtitle(r, model)),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..xmax, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("tokens generated (positions)")
        .y_labels(10)
        .y_desc("total seconds (log)")
        .x_label_formatter(&num)
        .y_label_formatter(&num)
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for d in &runs {
        let c = color(&d.engine);
        chart
            .draw_series(LineSeries::new(thin(cum(d), 400), c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} (median steps)", d.engine))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

fn batch_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &Report,
    model: &str,
) -> Result<()> {
    let rows: Vec<_> = r.batch.iter().filter(|b| b.model == model).collect();
    let bmax = rows.iter().map(|b| b.batch).max().unwrap_or(2).max(2) as f64;
    let (lo, hi) = log_range(rows.iter().map(|b| b.tok_per_s.median));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("decode throughput — {}", subtitle(r, model)),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (1f64..bmax * 1.2).log_scale().base(2.0),
            (lo..hi).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("batch size (sequences, log)")
        .y_labels(10)
        .y_desc("decode tokens/s, all sequences (log)")
        .y_label_formatter(&num)
        .x_label_formatter(&|v| format!("{}", v.round()))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let engines = unique(rows.iter().map(|b| b.engine.as_str()));
    for e in engines {
        let c = color(e);
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|b| b.engine == e)
            .map(|b| (b.batch as f64, b.tok_per_s.median))
            .collect();
        let mode = rows
            .iter()
            .find(|b| b.engine == e)
            .map_or("", |b| b.mode.as_str());
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{e} ({mode})"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

fn memory_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &Report,
    model: &str,
) -> Result<()> {
    let rows: Vec<_> = r
        .kv_memory
        .iter()
        .filter(|k| k.model == model && k.engine != EngineKind::REFERENCE)
        .collect();
    let Some(info) = r.models.iter().find(|m| m.name == model) else {
        return Ok(());
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    // The formula runs on to the model's own context when the run stopped short of it.
    let xmax = info.context.max(info.native_context).max(2) as f64;
    let xs: Vec<f64> = (0..)
        .map(|k| (1u64 << k) as f64)
        .take_while(|&x| x <= xmax)
        .chain([xmax])
        .collect();
    let formula: Vec<(f64, f64)> = xs
        .iter()
        .map(|&x| (x, mib(info.kv_bytes_per_token * x as u64)))
        .collect();
    let (lo, hi) = log_range(
        formula.iter().map(|p| p.1).chain(
            rows.iter()
                .flat_map(|k| [mib(k.used_bytes), mib(k.reserved_bytes)]),
        ),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("KV cache memory — {}", subtitle(r, model)),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (1f64..xmax * 1.2).log_scale().base(2.0),
            (lo..hi).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("positions held (context length, log)")
        .y_labels(10)
        .y_desc("KV cache MiB (log); naive holds none")
        .y_label_formatter(&num)
        .x_label_formatter(&|v| format!("{}", v.round()))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(formula, 6, 4, BLACK.stroke_width(2)))
        .map_err(err)?
        .label("formula: 2·layers·kv_heads·head_dim·4 B·positions")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    let engines = unique(rows.iter().map(|k| k.engine.as_str()));
    for e in engines {
        let c = color(e);
        let pts = |f: &dyn Fn(&super::memory::KvRow) -> u64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|k| k.engine == e)
                .map(|k| (k.positions as f64, mib(f(k))))
                .collect()
        };
        let paged = e.contains("paged");
        // A contiguous engine reserves max_seq_len positions for the sequence; a paged engine
        // reserves its whole block pool up front (shared by every sequence) and a sequence holds
        // whole blocks.
        let reserved = pts(&|k| k.reserved_bytes);
        let label = if paged {
            format!("{e}: pool reserved (all sequences)")
        } else {
            format!("{e}: reserved (max_seq_len)")
        };
        chart
            .draw_series(DashedLineSeries::new(
                reserved.clone(),
                3,
                3,
                c.stroke_width(2),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(1)));
        let used = pts(&|k| k.used_bytes);
        let label = if paged {
            format!("{e}: held (whole blocks)")
        } else {
            format!("{e}: used")
        };
        chart
            .draw_series(LineSeries::new(used.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
        chart
            .draw_series(
                used.into_iter()
                    .map(|p| TriangleMarker::new(p, 5, c.filled())),
            )
            .map_err(err)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}
