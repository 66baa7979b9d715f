//! The plots, SVG and PNG, through plotters: one panel per model in each figure.
//!
//! * `decode_latency`: ms per decode step against position, by engine (log y): the naive
//!   engine's step grows linearly with the prefix it recomputes, a cached engine's stays flat;
//! * `generation_time`: cumulative generation time against positions (log y): O(N²) vs O(N);
//! * `batch_throughput`: decode tokens/s against batch size (log-log);
//! * `kv_memory`: KV bytes against context length, by engine and layout, with the formula.
//!
//! The side benches draw their own figures with the helpers here (`Panel`, `Series`, `axis`,
//! `write_pair`, ...): `serve/plot.rs`, `tiers/plot.rs`, `eviction/plot.rs`.
//!
//! Text uses DejaVu Sans embedded in the binary (plotters' `ab_glyph` feature), so the PNGs
//! render on a machine without fontconfig; the SVGs name the font family and leave the glyphs
//! to the viewer.

use std::ops::Range;
use std::path::Path;

use anyhow::{Result, anyhow};
use kvlab_engines::EngineKind;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::models::ModelInfo;
use super::report::Report;
use super::suite::Results;

/// Registers the embedded font as "sans-serif", plotters' default family.
pub fn register_font() {
    // Registering twice only replaces the entry; a failure leaves the plots without text.
    let _ =
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
}

pub(super) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Colour of an engine, the same in every figure: its place in `EngineKind::ALL`.
pub(super) fn color(engine: &str) -> RGBColor {
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

/// How a figure draws one model's panel.
type PanelOf = fn(&Results, &ModelInfo) -> Panel;

/// The figures: each one's file stem and panel.
const FIGURES: [(&str, PanelOf); 4] = [
    ("decode_latency", decode_panel),
    ("generation_time", generation_panel),
    ("batch_throughput", batch_panel),
    ("kv_memory", memory_panel),
];

/// Writes every figure as SVG and PNG into `dir`; returns the file names.
pub fn all(r: &Report, dir: &Path) -> Result<Vec<String>> {
    if r.models.is_empty() {
        return Ok(Vec::new());
    }
    let size = (PANEL.0 * r.models.len() as u32, PANEL.1);
    let mut files = Vec::new();
    for (stem, panel) in FIGURES {
        let panels: Vec<Panel> = r.models.iter().map(|m| panel(&r.results, m)).collect();
        let (svg, png) = (format!("{stem}.svg"), format!("{stem}.png"));
        draw(
            SVGBackend::new(&dir.join(&svg), size).into_drawing_area(),
            &panels,
        )?;
        draw(
            BitMapBackend::new(&dir.join(&png), size).into_drawing_area(),
            &panels,
        )?;
        files.extend([svg, png]);
    }
    Ok(files)
}

/// One figure: a panel per model side by side.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, panels: &[Panel]) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    for (area, p) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        p.draw(area)?;
    }
    root.present().map_err(err)
}

/// One model's panel of a figure, as data: every figure is drawn by `Panel::draw`.
pub(super) struct Panel {
    pub(super) title: String,
    pub(super) x: Axis,
    pub(super) y: Axis,
    pub(super) legend: SeriesLabelPosition,
    pub(super) series: Vec<Series>,
}

/// An axis: its range, its description, and the base of its log scale (`None`: linear).
pub(super) struct Axis {
    range: Range<f64>,
    desc: &'static str,
    log: Option<f64>,
}

pub(super) fn axis(range: Range<f64>, log: Option<f64>, desc: &'static str) -> Axis {
    Axis { range, desc, log }
}

/// A line of a panel and its legend entry, if any.
pub(super) struct Series {
    pts: Vec<(f64, f64)>,
    style: ShapeStyle,
    line: Line,
    /// The legend's label and the style of its key (a short stroke).
    key: Option<(String, ShapeStyle)>,
}

/// How a series is drawn: a solid line, a dashed one (dash and gap lengths, pixels), or a solid
/// one with a marker at each point.
#[derive(Clone, Copy)]
pub(super) enum Line {
    Solid,
    Dashed(u32, u32),
    Circles,
    Triangles,
}

impl Series {
    pub(super) fn new(pts: Vec<(f64, f64)>, style: ShapeStyle, line: Line) -> Series {
        Series {
            pts,
            style,
            line,
            key: None,
        }
    }

    pub(super) fn key(self, label: String, style: ShapeStyle) -> Series {
        Series {
            key: Some((label, style)),
            ..self
        }
    }
}

impl Panel {
    /// Draws the panel into `area`; each axis's scale picks plotters' coordinate type.
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let (x, y) = (self.x.range.clone(), self.y.range.clone());
        match (self.x.log, self.y.log) {
            (None, None) => self.draw_in(area, x, y),
            (None, Some(b)) => self.draw_in(area, x, y.log_scale().base(b)),
            (Some(a), None) => self.draw_in(area, x.log_scale().base(a), y),
            (Some(a), Some(b)) => self.draw_in(area, x.log_scale().base(a), y.log_scale().base(b)),
        }
    }

    fn draw_in<DB, X, Y>(&self, area: &DrawingArea<DB, Shift>, x: X, y: Y) -> Result<()>
    where
        DB: DrawingBackend,
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        // A log x axis counts things (sequences, positions): whole numbers.
        let round = |v: &f64| format!("{}", v.round());
        let x_fmt: &dyn Fn(&f64) -> String = if self.x.log.is_some() { &round } else { &num };
        // A log y axis has a tick at every 1..9 of each decade: labels at 1, 2 and 5 only, so
        // that 700, 800, 900, 1000 do not print on top of each other.
        let y_fmt: &dyn Fn(&f64) -> String = if self.y.log.is_some() {
            &one_two_five
        } else {
            &num
        };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(self.x.desc)
            .y_desc(self.y.desc)
            .x_label_formatter(x_fmt)
            .y_label_formatter(y_fmt)
            .label_style(("sans-serif", 12))
            .axis_desc_style(("sans-serif", 13));
        if self.y.log.is_some() {
            // Enough ticks that every decade gets its 1, 2 and 5.
            mesh.y_labels(40);
        }
        // A log axis subdivides every decade (or octave) into light lines that merged into a
        // grey band at this size: no light lines, and faint ones at the ticks.
        if self.x.log.is_some() || self.y.log.is_some() {
            mesh.light_line_style(TRANSPARENT)
                .bold_line_style(BLACK.mix(0.1));
        }
        mesh.draw().map_err(err)?;
        for s in &self.series {
            let pts = s.pts.iter().copied();
            let drawn = match s.line {
                Line::Dashed(dash, gap) => {
                    chart.draw_series(DashedLineSeries::new(pts, dash, gap, s.style))
                }
                _ => chart.draw_series(LineSeries::new(pts, s.style)),
            }
            .map_err(err)?;
            if let Some((label, key)) = &s.key {
                let key = *key;
                drawn
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], key));
            }
            let fill = s.style.color.filled();
            match s.line {
                Line::Circles => chart.draw_series(s.pts.iter().map(|&p| Circle::new(p, 3, fill))),
                Line::Triangles => {
                    chart.draw_series(s.pts.iter().map(|&p| TriangleMarker::new(p, 5, fill)))
                }
                _ => continue,
            }
            .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(self.legend.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)
    }
}

/// The range `lo..hi` widened by a factor on each side, for a log axis.
pub(super) fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
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
pub(super) fn unique<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
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
/// [`num`] for 1, 2 and 5 times a power of ten; nothing for the other ticks of a log axis.
fn one_two_five(v: &f64) -> String {
    if *v <= 0.0 || !v.is_finite() {
        return String::new();
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6)
    {
        num(v)
    } else {
        String::new()
    }
}

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

fn subtitle(m: &ModelInfo) -> String {
    format!(
        "{} ({}, {:.1} M params)",
        m.name,
        m.format,
        m.n_params as f64 / 1e6
    )
}

fn decode_panel(r: &Results, m: &ModelInfo) -> Panel {
    let runs: Vec<_> = r.decode.iter().filter(|d| d.model == m.name).collect();
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
    let mut series = Vec::new();
    for d in &runs {
        let c = color(&d.engine);
        let raw: Vec<(f64, f64)> = (1..d.positions)
            .map(|p| (p as f64, d.step_ms.min[p].min(hi)))
            .collect();
        series.push(Series::new(raw, c.mix(0.25).stroke_width(1), Line::Solid));
        let smooth = rolling_median(&d.step_ms.min[1..], window);
        let pts: Vec<(f64, f64)> = smooth
            .into_iter()
            .enumerate()
            .map(|(i, y)| ((i + 1) as f64, y))
            .collect();
        let label = format!(
            "{} (min of {} reps, rolling median of {window})",
            d.engine, d.reps
        );
        series.push(Series::new(pts, c.stroke_width(2), Line::Solid).key(label, c.stroke_width(3)));
    }
    Panel {
        title: format!("decode step time — {}", subtitle(m)),
        x: axis(0.0..xmax, None, "position (tokens already in the sequence)"),
        y: axis(0.0..hi.max(1e-3), None, "ms per decode step"),
        legend: SeriesLabelPosition::UpperLeft,
        series,
    }
}

fn generation_panel(r: &Results, m: &ModelInfo) -> Panel {
    let runs: Vec<_> = r.decode.iter().filter(|d| d.model == m.name).collect();
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
    let series = runs
        .iter()
        .map(|d| {
            let c = color(&d.engine);
            let label = format!("{} (median steps)", d.engine);
            Series::new(thin(cum(d), 400), c.stroke_width(2), Line::Solid)
                .key(label, c.stroke_width(3))
        })
        .collect();
    Panel {
        title: format!("generation time — {}", subtitle(m)),
        x: axis(0.0..xmax, None, "tokens generated (positions)"),
        y: axis(lo..hi, Some(10.0), "total seconds (log)"),
        legend: SeriesLabelPosition::LowerRight,
        series,
    }
}

fn batch_panel(r: &Results, m: &ModelInfo) -> Panel {
    let rows: Vec<_> = r.batch.iter().filter(|b| b.model == m.name).collect();
    let bmax = rows.iter().map(|b| b.batch).max().unwrap_or(2).max(2) as f64;
    let (lo, hi) = log_range(rows.iter().map(|b| b.tok_per_s.median));
    let series = unique(rows.iter().map(|b| b.engine.as_str()))
        .into_iter()
        .map(|e| {
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
            Series::new(pts, c.stroke_width(2), Line::Circles)
                .key(format!("{e} ({mode})"), c.stroke_width(3))
        })
        .collect();
    Panel {
        title: format!("decode throughput — {}", subtitle(m)),
        x: axis(1.0..bmax * 1.2, Some(2.0), "batch size (sequences, log)"),
        y: axis(lo..hi, Some(10.0), "decode tokens/s, all sequences (log)"),
        legend: SeriesLabelPosition::LowerRight,
        series,
    }
}

fn memory_panel(r: &Results, info: &ModelInfo) -> Panel {
    let rows: Vec<_> = r
        .kv_memory
        .iter()
        .filter(|k| k.model == info.name && k.engine != EngineKind::REFERENCE)
        .collect();
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
    let black = BLACK.stroke_width(2);
    let label = "formula: 2·layers·kv_heads·head_dim·4 B·positions";
    let mut series = vec![Series::new(formula, black, Line::Dashed(6, 4)).key(label.into(), black)];
    for e in unique(rows.iter().map(|k| k.engine.as_str())) {
        let c = color(e);
        let pts = |f: &dyn Fn(&super::memory::KvRow) -> u64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|k| k.engine == e)
                .map(|k| (k.positions as f64, mib(f(k))))
                .collect()
        };
        // A contiguous engine reserves max_seq_len positions for the sequence; a paged engine
        // reserves its whole block pool up front (shared by every sequence) and a sequence holds
        // whole blocks.
        let (reserved, used) = if e.contains("paged") {
            ("pool reserved (all sequences)", "held (whole blocks)")
        } else {
            ("reserved (max_seq_len)", "used")
        };
        series.push(
            Series::new(
                pts(&|k| k.reserved_bytes),
                c.stroke_width(2),
                Line::Dashed(3, 3),
            )
            .key(format!("{e}: {reserved}"), c.stroke_width(1)),
        );
        series.push(
            Series::new(pts(&|k| k.used_bytes), c.stroke_width(2), Line::Triangles)
                .key(format!("{e}: {used}"), c.stroke_width(3)),
        );
    }
    Panel {
        title: format!("KV cache memory — {}", subtitle(info)),
        x: axis(
            1.0..xmax * 1.2,
            Some(2.0),
            "positions held (context length, log)",
        ),
        y: axis(lo..hi, Some(10.0), "KV cache MiB (log); naive holds none"),
        legend: SeriesLabelPosition::LowerRight,
        series,
    }
}

/// A side bench's figures: `draw`'s files when `plots` (the font registered first), else none.
pub(super) fn draw_if(
    plots: bool,
    draw: impl FnOnce() -> Result<Vec<String>>,
) -> Result<Vec<String>> {
    if !plots {
        return Ok(Vec::new());
    }
    register_font();
    draw()
}

/// Draws `panels` side by side into `stem`.svg and `stem`.png in `dir`; returns the names.
pub(super) fn write_pair(dir: &Path, stem: &str, panels: &[Panel]) -> Result<Vec<String>> {
    let size = (PANEL.0 * panels.len() as u32, PANEL.1);
    let (svg, png) = (format!("{stem}.svg"), format!("{stem}.png"));
    draw(
        SVGBackend::new(&dir.join(&svg), size).into_drawing_area(),
        panels,
    )?;
    draw(
        BitMapBackend::new(&dir.join(&png), size).into_drawing_area(),
        panels,
    )?;
    Ok(vec![svg, png])
}

#[cfg(test)]
mod tests {
    use super::one_two_five;

    #[test]
    fn a_log_axis_labels_one_two_and_five_only() {
        let labels: Vec<String> = [100.0, 200.0, 300.0, 500.0, 700.0, 900.0, 1000.0, 0.02]
            .iter()
            .map(one_two_five)
            .collect();
        assert_eq!(labels, ["100", "200", "", "500", "", "", "1000", "0.02"]);
    }
}
