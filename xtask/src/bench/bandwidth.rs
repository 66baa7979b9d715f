//! This machine's memory bandwidth, measured, as the roofline's limit.
//!
//! * copy: `dst.copy_from_slice(src)` over buffers much larger than the last-level cache,
//!   counted as 2 × bytes per pass (one read, one write, as STREAM counts Copy; the CPU in fact
//!   also reads each destination line before writing it, so the bus moves more than counted);
//! * read: a SIMD dot product of the buffer's two halves (kvlab-cpu's kernel): bytes read once
//!   per pass, the access pattern of a decode step streaming its weights.
//!
//! Each runs on 1 thread and on every logical CPU (the buffer split in contiguous chunks), a
//! pass after an untimed warm-up pass (which also faults the pages in); the best of the timed
//! passes is the bandwidth (the machine is shared: slower passes measure the neighbours). The
//! buffers are at least 4 × the last-level cache, and the measurement runs at the start and at
//! the end of the run; the roofline divides by the best of all rows.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// One kind of pass at one thread count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BandwidthRow {
    /// "start" or "end" of the run: the neighbours' load on a shared machine moves the figure,
    /// so it is measured twice.
    pub when: String,
    /// "copy" or "read".
    pub kind: String,
    pub threads: usize,
    /// Bytes counted per pass (copy: 2 × buffer bytes; read: buffer bytes).
    pub bytes_per_pass: u64,
    /// GB/s (1e9 bytes per second) over the timed passes.
    pub gb_per_s: Summary,
}

/// Every row, plus the figure the roofline divides by.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Size of each of the source and destination buffers, bytes.
    pub buffer_bytes: u64,
    pub rows: Vec<BandwidthRow>,
    /// The largest best-pass bandwidth of any row, GB/s: the roofline's memory limit (the highest
    /// measured, so that no engine is flattered by a low reference).
    pub peak_gb_per_s: f64,
    /// Which row gave the peak, e.g. "read, 2 threads".
    pub peak_from: String,
}

/// Buffer bytes for a run: the plan's size, but at least 4 × the last-level cache (so that the
/// passes stream from DRAM, not from a large shared LLC), at most 2 GiB.
pub fn buffer_bytes(planned: usize, llc_bytes: Option<u64>) -> usize {
    let llc = llc_bytes.unwrap_or(0) as usize;
    planned.max(4 * llc).min(2 << 30)
}

/// Adds the rows of a second measurement and recomputes the peak.
pub fn merge(a: Bandwidth, b: Bandwidth) -> Bandwidth {
    with_peak(a.buffer_bytes, a.rows.into_iter().chain(b.rows).collect())
}

/// The rows and the best of them.
fn with_peak(buffer_bytes: u64, rows: Vec<BandwidthRow>) -> Bandwidth {
    let best = rows
        .iter()
        .max_by(|x, y| x.gb_per_s.max.total_cmp(&y.gb_per_s.max))
        .expect("at least one row");
    Bandwidth {
        buffer_bytes,
        peak_gb_per_s: best.gb_per_s.max,
        peak_from: format!(
            "{}, {} thread(s), at the {}",
            best.kind, best.threads, best.when
        ),
        rows,
    }
}

/// Measures with buffers of `buffer_bytes` each and `passes` timed passes per row.
pub fn measure(buffer_bytes: usize, passes: usize, when: &str) -> Bandwidth {
    let n = buffer_bytes / 4;
    let src = source(n); // (n,)
    let mut dst = vec![0.0f32; n]; // (n,)
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut threads = vec![1];
    if cpus > 1 {
        threads.push(cpus);
    }
    let mut rows = Vec::new();
    for &t in &threads {
        let copy = time_passes(passes, || copy_pass(&src, &mut dst, t));
        rows.push(row(when, "copy", t, 2 * buffer_bytes as u64, &copy));
        let read = time_passes(passes, || read_pass(&src, t));
        rows.push(row(when, "read", t, buffer_bytes as u64, &read));
    }
    with_peak(buffer_bytes as u64, rows)
}

fn row(when: &str, kind: &str, threads: usize, bytes: u64, seconds: &[f64]) -> BandwidthRow {
    let gbs: Vec<f64> = seconds.iter().map(|s| bytes as f64 / s / 1e9).collect();
    BandwidthRow {
        when: when.into(),
        kind: kind.into(),
        threads,
        bytes_per_pass: bytes,
        gb_per_s: Summary::of(&gbs),
    }
}

/// One untimed warm-up pass, then `passes` timed ones; seconds per pass.
fn time_passes(passes: usize, mut f: impl FnMut() -> f32) -> Vec<f64> {
    std::hint::black_box(f());
    (0..passes)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64()
        })
        .collect()
}

fn copy_pass(src: &[f32], dst: &mut [f32], threads: usize) -> f32 {
    let chunk = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, sr) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            s.spawn(move || d.copy_from_slice(sr));
        }
    });
    dst[dst.len() / 2]
}

/// The read bandwidth, GB/s, over a buffer of `bytes` that fits in the last-level cache, the
/// working set of a decode step whose weights stay there: `threads` threads, each reading its
/// contiguous chunk ([`read_chunk`]) `passes` times (both at least 1) in a row after a warm-up
/// pass that brings it into the cache; the slowest thread's time counts. The best of 3 such runs
/// (the machine is shared). A decode step reads its weights once per token, so where DRAM is not
/// the limit this is about the fastest it can go (a kernel with more streams per thread may beat
/// this two-stream read by a few percent).
pub fn read_in_cache(bytes: usize, threads: usize, passes: usize) -> f64 {
    let (threads, passes) = (threads.max(1), passes.max(1));
    let n = (bytes / 4).max(threads * 32);
    let src = source(n); // (n,)
    let chunk = n.div_ceil(threads);
    let run = || {
        let start = std::sync::Barrier::new(src.chunks(chunk).len());
        std::thread::scope(|s| {
            let hs: Vec<_> = src
                .chunks(chunk)
                .map(|c| {
                    let start = &start;
                    s.spawn(move || {
                        std::hint::black_box(read_chunk(c));
                        start.wait();
                        let t = Instant::now();
                        for _ in 0..passes {
                            std::hint::black_box(read_chunk(c));
                        }
                        t.elapsed().as_secs_f64()
                    })
                })
                .collect();
            let slowest = hs.into_iter().map(|h| h.join().expect("no panic"));
            slowest.fold(0.0, f64::max)
        })
    };
    // At least a nanosecond: a tiny buffer's passes may finish within the clock's resolution.
    let best = (0..3)
        .map(|_| run())
        .fold(f64::INFINITY, f64::min)
        .max(1e-9);
    (4 * n * passes) as f64 / best / 1e9
}

/// n floats to read: small values, not all equal.
fn source(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 1021) as f32 * 1e-3).collect()
}

/// Reads every float of `c` once: a SIMD dot product of its two halves (kvlab-cpu's kernel).
fn read_chunk(c: &[f32]) -> f32 {
    let (a, b) = c.split_at(c.len() / 2);
    kvlab_cpu::simd::dot(a, b)
}

fn read_pass(src: &[f32], threads: usize) -> f32 {
    let chunk = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = src
            .chunks(chunk)
            .map(|c| s.spawn(move || read_chunk(c)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("no panic")).sum()
    })
}

#[cfg(test)]
mod tests {
    /// Any size, thread count and pass count (0 included, taken as 1) gives a finite positive
    /// rate.
    #[test]
    fn an_in_cache_read_is_a_finite_positive_rate_at_any_size() {
        for (bytes, threads, passes) in [(0, 0, 0), (4, 1, 1), (100_003, 3, 2), (1 << 20, 2, 3)] {
            let gbs = super::read_in_cache(bytes, threads, passes);
            assert!(
                gbs.is_finite() && gbs > 0.0,
                "{bytes} B, {threads} threads, {passes} passes: {gbs} GB/s"
            );
        }
    }
}
