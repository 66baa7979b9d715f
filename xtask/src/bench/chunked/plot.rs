//! `bench --chunked-prefill`'s figure: how long each step takes while the long prompt is
//! prefilled, whole and in chunks, and the decodes' inter-token latency per configuration.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::bench::plot::{Line, Panel, Series, axis, color, log_range, write_pair};

/// Colour and stroke of configuration `i` (0: whole prefill).
fn style(i: usize) -> ShapeStyle {
    let c = match i {
        0 => color("naive"),
        1 => color("cpu-paged"),
        2 => color("cpu"),
        3 => color("cuda"),
        _ => RGBColor(140, 86, 75),
    };
    c.stroke_width(2)
}

/// Two panels, SVG and PNG: each step's wall time against the time it started (the last
/// repetition; whole prefill is one tall step, chunks a plateau of shorter ones), and the
/// decodes' ITL p50 and p99 per configuration.
pub fn figure(dir: &Path, r: &super::ChunkedReport) -> Result<Vec<String>> {
    let all = r.steps.iter().flat_map(|(_, s)| s);
    let xmax = all.clone().map(|s| (s.0 + s.1) / 1e3).fold(0.0, f64::max);
    let (lo, hi) = log_range(all.map(|s| s.1));
    let timeline = Panel {
        title: format!(
            "a {}-token prompt among {} decodes — {}",
            r.prompt_len, r.decodes, r.model
        ),
        x: axis(0.0..xmax * 1.05, None, "time since the run began, s"),
        y: axis(lo..hi, Some(10.0), "step time, ms (log)"),
        legend: SeriesLabelPosition::UpperRight,
        series: r
            .steps
            .iter()
            .enumerate()
            .map(|(i, (label, steps))| {
                // A staircase: each step a plateau from its start to its end.
                let pts = steps
                    .iter()
                    .flat_map(|s| [(s.0 / 1e3, s.1), ((s.0 + s.1) / 1e3, s.1)])
                    .collect();
                Series::new(pts, style(i), Line::Solid).key(label.clone(), style(i))
            })
            .collect(),
    };
    let (lo, hi) = log_range(
        r.rows
            .iter()
            .flat_map(|x| [x.itl_p50_ms.median, x.itl_p99_ms.median]),
    );
    let (xlo, xhi) = log_range(r.rows.iter().map(|x| x.budget as f64));
    let pts = |f: &dyn Fn(&super::ChunkedRow) -> f64| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = r.rows.iter().map(|x| (x.budget as f64, f(x))).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let itl = Panel {
        title: "the decodes' inter-token latency".into(),
        x: axis(
            xlo..xhi,
            Some(2.0),
            "max_num_batched_tokens (log); the rightmost prefills whole",
        ),
        y: axis(lo..hi, Some(10.0), "inter-token latency, ms (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: vec![
            Series::new(pts(&|x| x.itl_p99_ms.median), style(0), Line::Triangles)
                .key("p99".into(), style(0)),
            Series::new(pts(&|x| x.itl_p50_ms.median), style(1), Line::Circles)
                .key("p50".into(), style(1)),
        ],
    };
    write_pair(dir, "chunked_prefill", &[timeline, itl])
}
