//! `bench --speculative`'s figure: prompt lookup's speed-up over plain decoding and the tokens
//! per engine step against the guesses per step, one line per weight format and workload (the
//! draft model's rows, at one k, are in the table).

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::bench::plot::{Line, Panel, Series, axis, color, log_range, unique, write_pair};

/// Two panels, SVG and PNG: speed-up against k (1: plain decoding's speed, dashed) and tokens
/// per engine step against k.
pub fn figure(dir: &Path, r: &super::SpecReport) -> Result<Vec<String>> {
    let lines: Vec<(String, String)> = unique(r.rows.iter().map(|x| x.weights.as_str()))
        .into_iter()
        .flat_map(|w| {
            unique(r.rows.iter().map(|x| x.workload.as_str()))
                .into_iter()
                .map(move |l| (w.to_string(), l.to_string()))
        })
        .collect();
    let style = |i: usize| {
        let c = match i {
            0 => color("naive"),
            1 => color("cpu-paged"),
            2 => color("cpu"),
            _ => color("cuda"),
        };
        c.stroke_width(2)
    };
    let pts = |(w, l): &(String, String), f: &dyn Fn(&super::SpecRow) -> f64| {
        r.rows
            .iter()
            .filter(|x| &x.weights == w && &x.workload == l && x.method == "ngram")
            .map(|x| (x.k as f64, f(x)))
            .collect::<Vec<_>>()
    };
    let spec_rows = || r.rows.iter().filter(|x| x.method == "ngram");
    let (xlo, xhi) = log_range(spec_rows().map(|x| x.k as f64));
    let (lo, hi) = log_range(spec_rows().map(|x| x.speedup).chain([0.5, 2.0]));
    let mut speed: Vec<Series> = vec![
        Series::new(
            vec![(xlo, 1.0), (xhi, 1.0)],
            BLACK.stroke_width(1),
            Line::Dashed(6, 4),
        )
        .key("plain decoding (1)".into(), BLACK.stroke_width(2)),
    ];
    let key = |(w, l): &(String, String)| format!("{w} weights, {l}");
    for (i, line) in lines.iter().enumerate() {
        let p = pts(line, &|x| x.speedup);
        speed.push(Series::new(p, style(i), Line::Circles).key(key(line), style(i)));
    }
    let speedup = Panel {
        title: format!("prompt lookup on {} ({} engine)", r.model, r.engine),
        x: axis(xlo..xhi, Some(2.0), "guesses per step, k (log)"),
        y: axis(lo..hi, Some(2.0), "decode speed-up over plain greedy (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: speed,
    };
    let (tlo, thi) = log_range(spec_rows().map(|x| x.tokens_per_step).chain([1.0]));
    let per_step = Panel {
        title: "tokens per engine step".into(),
        x: axis(xlo..xhi, Some(2.0), "guesses per step, k (log)"),
        y: axis(tlo..thi, Some(2.0), "tokens generated per step (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let p = pts(line, &|x| x.tokens_per_step);
                Series::new(p, style(i), Line::Circles).key(key(line), style(i))
            })
            .collect(),
    };
    write_pair(dir, "speculative", &[speedup, per_step])
}
