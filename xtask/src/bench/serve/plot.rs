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

/// `--peer`'s figure, SVG and PNG: output tokens/s and TTFT p99 (log) of both servers against
/// the concurrent streams (the all-at-once points; the Poisson rates are in the table). Returns
/// the file names.
pub fn peer_report(r: &super::peer::PeerServeReport, dir: &Path) -> Result<Vec<String>> {
    crate::bench::plot::register_font();
    let pts: Vec<&super::peer::PeerPoint> =
        r.points.iter().filter(|p| p.streams.is_some()).collect();
    let x = |p: &super::peer::PeerPoint| p.streams.unwrap_or(1) as f64;
    let xmax = pts.iter().map(|p| x(p)).fold(1.0, f64::max) * 1.1;
    let ymax = pts
        .iter()
        .flat_map(|p| [p.kvlab.output_tok_per_s, p.peer.output_tok_per_s])
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.3;
    let (kvlab, peer) = (color("cpu-paged"), color("naive"));
    let title = format!(
        "{}, {} threads each, {} tokens per request",
        r.model, r.threads, r.max_tokens
    );
    let series =
        |f: &dyn Fn(&super::peer::PeerPoint) -> f64, c: RGBColor, line: Line, key: &str| {
            Series::new(
                pts.iter().map(|p| (x(p), f(p))).collect(),
                c.stroke_width(2),
                line,
            )
            .key(key.into(), c.stroke_width(3))
        };
    let throughput = Panel {
        title: format!("output tokens/s — {title}"),
        x: axis(
            0.0..xmax,
            None,
            "concurrent streams (requests sent at once)",
        ),
        y: axis(0.0..ymax, None, "output tokens/s"),
        legend: SeriesLabelPosition::UpperLeft,
        series: vec![
            series(
                &|p| p.kvlab.output_tok_per_s,
                kvlab,
                Line::Circles,
                "kvlab serve",
            ),
            series(
                &|p| p.peer.output_tok_per_s,
                peer,
                Line::Triangles,
                "llama-server",
            ),
        ],
    };
    let (lo, hi) = log_range(
        pts.iter()
            .flat_map(|p| [p.kvlab.ttft_ms.p99, p.peer.ttft_ms.p99]),
    );
    let ttft = Panel {
        title: format!("TTFT p99 — {title}"),
        x: axis(
            0.0..xmax,
            None,
            "concurrent streams (requests sent at once)",
        ),
        y: axis(lo..hi, Some(10.0), "TTFT p99, ms (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: vec![
            series(
                &|p| p.kvlab.ttft_ms.p99,
                kvlab,
                Line::Circles,
                "kvlab serve",
            ),
            series(
                &|p| p.peer.ttft_ms.p99,
                peer,
                Line::Triangles,
                "llama-server",
            ),
        ],
    };
    write_pair(dir, "serve_peer", &[throughput, ttft])
}
