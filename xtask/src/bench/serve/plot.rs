//! The load test's figure: throughput and TTFT against the request rate.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::ServeReport;
use crate::bench::plot::{Line, Panel, Series, axis, color, log_range, write_pair};

/// The figure: throughput and TTFT against the request rate ("inf" drawn at twice the largest
/// finite rate).
pub fn report(r: &ServeReport, dir: &Path) -> Result<Vec<String>> {
    crate::bench::plot::register_font();
    let max_finite = r
        .rates
        .iter()
        .filter_map(|x| x.rate_req_per_s)
        .fold(0.0, f64::max);
    let inf_x = if max_finite > 0.0 {
        max_finite * 2.0
    } else {
        1.0
    };
    let pts: Vec<ServePoint> = r
        .rates
        .iter()
        .map(|x| ServePoint {
            rate: x.rate_req_per_s.unwrap_or(inf_x),
            tok_s: x.output_tok_per_s,
            ttft_p50_ms: x.ttft_ms.median,
            ttft_p99_ms: x.ttft_ms.p99,
        })
        .collect();
    let title = format!("{}, {} × {} tokens", r.model, r.requests, r.max_tokens);
    let paired: Vec<(f64, f64)> = r
        .pairs
        .iter()
        .map(|p| (inf_x, p.server_output_tok_per_s))
        .collect();
    figure(
        dir,
        "serve_load",
        &title,
        &pts,
        &paired,
        r.batch_output_tok_per_s_median,
    )
}

/// One request rate of the load test: output tokens/s and TTFT (ms) at it.
struct ServePoint {
    /// Requests/s (the caller places "all at once" past the largest finite rate).
    rate: f64,
    tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
}

/// The load test's figure, SVG and PNG: output tokens/s against the request rate with
/// `kvlab batch`'s throughput as a dashed line and the paired saturation runs' throughputs
/// (`paired`: (x, tokens/s)) as triangles, and TTFT p50 and p99 (log) against the rate.
/// Returns the file names.
fn figure(
    dir: &Path,
    stem: &str,
    title: &str,
    pts: &[ServePoint],
    paired: &[(f64, f64)],
    batch_tok_s: f64,
) -> Result<Vec<String>> {
    let xmax = pts.iter().map(|p| p.rate).fold(1.0, f64::max) * 1.1;
    let blue = color("cpu-paged");
    let black = BLACK.stroke_width(2);
    let ymax = pts
        .iter()
        .map(|p| p.tok_s)
        .chain(paired.iter().map(|p| p.1))
        .chain([batch_tok_s])
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.5;
    let throughput = Panel {
        title: format!("kvlab serve throughput — {title}"),
        x: axis(
            0.0..xmax,
            None,
            "request rate, req/s (last point: all at once)",
        ),
        y: axis(0.0..ymax, None, "output tokens/s"),
        legend: SeriesLabelPosition::UpperLeft,
        series: vec![
            Series::new(
                vec![(0.0, batch_tok_s), (xmax, batch_tok_s)],
                black,
                Line::Dashed(6, 4),
            )
            .key(
                "kvlab batch (same prompts, no HTTP, prefix cache off)".into(),
                black,
            ),
            Series::new(
                pts.iter().map(|p| (p.rate, p.tok_s)).collect(),
                blue.stroke_width(2),
                Line::Circles,
            )
            .key(
                "kvlab serve (streamed), the sweep".into(),
                blue.stroke_width(3),
            ),
            Series::new(
                paired.to_vec(),
                color("cpu").stroke_width(0),
                Line::Triangles,
            )
            .key(
                "kvlab serve, all at once, prefix cache off, beside each batch run".into(),
                color("cpu").stroke_width(3),
            ),
        ],
    };
    let (lo, hi) = log_range(pts.iter().flat_map(|p| [p.ttft_p50_ms, p.ttft_p99_ms]));
    let red = color("naive");
    let ttft = Panel {
        title: format!("kvlab serve TTFT — {title}"),
        x: axis(
            0.0..xmax,
            None,
            "request rate, req/s (last point: all at once)",
        ),
        y: axis(lo..hi, Some(10.0), "TTFT, ms (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: vec![
            Series::new(
                pts.iter().map(|p| (p.rate, p.ttft_p50_ms)).collect(),
                blue.stroke_width(2),
                Line::Circles,
            )
            .key("p50".into(), blue.stroke_width(3)),
            Series::new(
                pts.iter().map(|p| (p.rate, p.ttft_p99_ms)).collect(),
                red.stroke_width(2),
                Line::Triangles,
            )
            .key("p99".into(), red.stroke_width(3)),
        ],
    };
    write_pair(dir, stem, &[throughput, ttft])
}
