//! Causal attention of a step's queries over the keys and values in a KV cache, for both cache
//! layouts: the caller says where the key and value of position j live ([`KvRows`]).
//!
//! For the query at position p and head h (KV head g = h / kv_mul, kv_mul = n_heads / n_kv_heads;
//! GQA/MQA share one KV head among kv_mul query heads):
//!   s_j = (q_h · k_{g,j}) · scale            for j in lo..=p, lo = max(0, p + 1 − window)
//!   a   = softmax(s)
//!   o_h = Σ_j a_j v_{g,j}
//! The kv_mul query heads of one KV head are computed together, so each key and value row is read
//! once per KV head, not once per query head. A row's keys are cut into partitions of
//! [`PARTITION`] positions whose softmaxes are merged in order, so its bits are the same on any
//! number of threads and beside any other rows. The work is (query row, KV head) tasks: on the
//! calling thread when the step is small, else one block of consecutive tasks per thread, each
//! row's KV heads of a block attended together run by run of positions (their keys are
//! neighbours in the cache); a lone decode row's partitions are shared among the threads.

use std::ops::Range;

use crate::simd;
use crate::threads;

mod tiled;

/// The attention shape of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads, each shared by n_heads / n_kv_heads query heads (GQA/MQA).
    pub n_kv_heads: usize,
    /// Elements of one head's query, key or value vector.
    pub head_dim: usize,
    /// Score scale, 1/√head_dim unless the model says otherwise.
    pub scale: f32,
    /// Keys visible to a query, its own included (`usize::MAX` for global layers).
    pub window: usize,
}

impl Heads {
    /// Query heads per KV head.
    pub fn kv_mul(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// First key position the query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window)
    }
}

pub use crate::kv_store::Part;

/// Where one sequence's keys and values live, as f32 rows of (kv_dim,) = all KV heads side by
/// side, whatever type the cache stores them in.
pub trait KvRows: Sync {
    /// The keys (or values) of positions `j..j + c` for some `1 ≤ c ≤ end − j`, stored one
    /// after another: (c, kv_dim), of which the columns of KV heads `kv_heads` are read. A cache
    /// of f32 returns its own rows (up to its ring wrap, a block up to its end); one of another
    /// dtype decodes them into `tile` (`crate::kv_store`), a run at a time.
    fn rows<'a>(
        &'a self,
        part: Part,
        j: usize,
        end: usize,
        kv_heads: Range<usize>,
        tile: &'a mut Vec<f32>,
    ) -> &'a [f32];

    /// The same run as [`KvRows::rows`] would give, (c, kv_dim), as the f16 cache stores it
    /// (IEEE half bits), for kernels that convert in registers instead of decoding into a tile;
    /// `None` where the run is not stored as f16 (the caller then takes [`KvRows::rows`]).
    #[inline(always)]
    fn rows_f16(&self, _part: Part, _j: usize, _end: usize) -> Option<&[u16]> {
        None
    }
}

/// Keys and values stored row after row, position j at row j, without a ring: one sequence's
/// cache as the tests and benchmarks build it. k and v are (positions, kv_dim).
#[derive(Clone, Copy, Debug)]
pub struct Contiguous<'a> {
    /// (positions, kv_dim) the keys, position j at row j.
    pub k: &'a [f32],
    /// (positions, kv_dim) the values, position j at row j.
    pub v: &'a [f32],
    /// Elements of one position's row: n_kv_heads · head_dim.
    pub kv_dim: usize,
}

impl KvRows for Contiguous<'_> {
    fn rows<'a>(
        &'a self,
        part: Part,
        j: usize,
        end: usize,
        _: Range<usize>,
        _: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        &part.pick(self.k, self.v)[j * self.kv_dim..end * self.kv_dim]
    }
}

/// Positions attention takes from one run of [`KvRows::rows`] for rows of `kv_dim` floats:
/// as many as fill 32 KiB of f32 (a run decoded from an f16 or quantized cache stays in L1
/// while the query heads of its KV heads read it), a multiple of 8 (the kernels' pass) from 8
/// to 64. Runs only cut the loops: each score and each output's sum over the keys is the same
/// for any run length.
fn run_rows(kv_dim: usize) -> usize {
    ((8192 / kv_dim.max(1)) / 8 * 8).clamp(32, 64)
}

/// What [`attend_group`] works in, reused from call to call.
#[derive(Default)]
pub struct Scratch {
    /// The scaled queries, then the scores.
    work: Vec<f32>,
    /// A run of keys or values decoded from the cache's dtype (unused for an f32 cache).
    tile: Vec<f32>,
}

thread_local! {
    /// Each thread's scratch for [`attend_group`] and a buffer for the stats it returns (where
    /// the caller has nowhere else to put them), reused from step to step.
    static SCRATCH: std::cell::RefCell<(Scratch, Vec<f32>)> =
        std::cell::RefCell::new((Scratch::default(), Vec::new()));
}

/// Below this many multiply-adds a step's attention runs on the calling thread: handing tasks
/// to other threads costs microseconds, more than a short context takes.
const PAR_MIN_WORK: usize = 1 << 15;

/// out (rows, n_heads·head_dim) ← attention of every query row, where row r is the query at
/// position `pos_of(r)` of sequence `seq_of(r)`, whose keys `rows_of(r)` reads. A sequence's
/// rows are consecutive, at consecutive positions.
///
/// A step of several rows per sequence (a prompt, a chunk, speculative guesses) goes to the
/// query-tiled kernel (`attention/tiled.rs`) where the CPU has it; a sequence's only row, and
/// every row elsewhere, to [`attend_group`].
pub fn attention<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    heads: &Heads,
    pos_of: impl Fn(usize) -> usize + Sync,
    seq_of: impl Fn(usize) -> usize + Sync,
    rows_of: impl Fn(usize) -> R + Sync,
) {
    let hd = heads.head_dim;
    let group = heads.kv_mul() * hd; // one task's slice of a row: the heads of one KV head
    let n_rows = out.len() / (heads.n_heads * hd);
    let keys_of = |r: usize| heads.first_visible(pos_of(r))..pos_of(r) + 1;
    let work: usize = (0..n_rows).map(|r| keys_of(r).len()).sum::<usize>() * 2 * heads.n_heads * hd;
    if n_rows > 1 && tiled::available(hd) {
        let threads = if work < PAR_MIN_WORK {
            1
        } else {
            threads::num_threads()
        };
        return attention_tiled(out, q, heads, threads, &pos_of, &seq_of, &rows_of);
    }
    // Attention of row r's KV heads gs over all its visible keys, written to o (its slice of out).
    let run = |r: usize, gs: Range<usize>, o: &mut [f32]| {
        let q = &q[r * heads.n_heads * hd + gs.start * group..][..gs.len() * group];
        attend_row(o, q, gs, keys_of(r), &rows_of(r), heads);
    };
    let per_row = heads.n_kv_heads * group;
    let threads = threads::num_threads();
    if work < PAR_MIN_WORK || threads == 1 {
        for (r, o) in out.chunks_exact_mut(per_row).enumerate() {
            run(r, 0..heads.n_kv_heads, o);
        }
    } else if n_rows == 1 && (partitions(&keys_of(0)) > 1 || heads.n_kv_heads == 1) {
        // One decode query of several partitions: its partitions across the threads
        // (flash-decoding), each thread all KV heads over consecutive partitions, then the
        // partitions' softmaxes merged. A thread reads whole rows of the cache, one after
        // another, which the prefetchers follow (split by KV head, each read a few lines of
        // every row: 18% slower on the stories15M shape at 1,024 positions), and an MQA model's
        // one KV head still uses every thread. (A row of one partition and several KV heads
        // takes the tasks below: its KV heads shared among the threads.)
        split_partitions(out, q, keys_of(0), &rows_of(0), heads, threads);
    } else {
        // One block of consecutive (row, KV head) tasks per thread, each row's part of a block in
        // one call: its KV heads' keys sit side by side in a row of the cache, so a thread that
        // takes them together reads whole stretches of cache lines.
        let n_tasks = out.len() / group;
        let per = n_tasks.div_ceil(threads);
        threads::for_each_chunk_mut(out, per * group, |b, block| {
            let (mut t, end) = (b * per, b * per + block.len() / group);
            let mut block = block;
            while t < end {
                let (r, g) = (t / heads.n_kv_heads, t % heads.n_kv_heads);
                let g_end = heads.n_kv_heads.min(g + end - t);
                let (o, rest) = block.split_at_mut((g_end - g) * group);
                run(r, g..g_end, o);
                block = rest;
                t += g_end - g;
            }
        });
    }
}

/// [`attention`] by tiles of consecutive rows of one sequence ([`tiled::attend_tile`]; a
/// sequence's only row by [`attend_group`]), on `threads` threads each taking consecutive rows
/// with about the same number of keys to attend (a prompt's last rows see more keys than its
/// first).
fn attention_tiled<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    heads: &Heads,
    threads: usize,
    pos_of: &(impl Fn(usize) -> usize + Sync),
    seq_of: &(impl Fn(usize) -> usize + Sync),
    rows_of: &(impl Fn(usize) -> R + Sync),
) {
    let row_len = heads.n_heads * heads.head_dim;
    let n_rows = out.len() / row_len;
    // cuts[k] = the first row of thread k's share: where the running count of keys passes k/threads
    // of all of them.
    let keys = |r: usize| pos_of(r) + 1 - heads.first_visible(pos_of(r));
    let total: usize = (0..n_rows).map(keys).sum();
    let mut cuts = Vec::with_capacity(threads + 1);
    let mut seen = 0;
    for r in 0..n_rows {
        if seen * threads >= cuts.len() * total && cuts.len() < threads {
            cuts.push(r);
        }
        seen += keys(r);
    }
    cuts.push(n_rows);
    let bounds: Vec<usize> = cuts.iter().map(|r| r * row_len).collect();
    let per_tile = tiled::rows_per_tile(heads.kv_mul());
    // A sequence's rows take the tiled kernel's arithmetic whenever it has several in the step,
    // even a row left alone in a tile by a thread's cut, so that its results do not depend on
    // its batch-mates; a sequence's only row (a decode step) takes attend_row's, as it does
    // alone.
    let alone = |r: usize| {
        (r == 0 || seq_of(r - 1) != seq_of(r)) && (r + 1 == n_rows || seq_of(r + 1) != seq_of(r))
    };
    threads::for_each_part_mut(out, &bounds, |k, part| {
        let mut r = cuts[k];
        let end = cuts[k + 1];
        let mut part = part;
        while r < end {
            let mut t = 1;
            while t < per_tile && r + t < end && seq_of(r + t) == seq_of(r) {
                t += 1;
            }
            let (o, rest) = part.split_at_mut(t * row_len);
            let q = &q[r * row_len..][..t * row_len];
            if t == 1 && alone(r) {
                let keys = heads.first_visible(pos_of(r))..pos_of(r) + 1;
                attend_row(o, q, 0..heads.n_kv_heads, keys, &rows_of(r), heads);
            } else {
                TILE_SCRATCH.with_borrow_mut(|scratch| {
                    tiled::attend_tile(o, q, pos_of(r), &rows_of(r), heads, scratch)
                });
            }
            part = rest;
            r += t;
        }
    });
}

thread_local! {
    /// Each thread's scratch for [`tiled::attend_tile`], reused from step to step.
    static TILE_SCRATCH: std::cell::RefCell<tiled::TileScratch> =
        std::cell::RefCell::new(tiled::TileScratch::default());
}

/// The part of one query row a call of [`attend_group`] attends: KV heads `kv_heads` (with the
/// kv_mul query heads of each) over the key positions `keys`.
#[derive(Clone, Debug)]
pub struct Span {
    /// The KV heads attended (each with its kv_mul query heads).
    pub kv_heads: Range<usize>,
    /// The key positions attended, a sub-range of the query's visible keys.
    pub keys: Range<usize>,
}

/// Keys per partition of a query row's attention: a row's visible keys are cut at the multiples
/// of `PARTITION` positions (vLLM's paged attention v2 cuts at its `partition_size` the same
/// way), each partition is attended on its own ([`attend_group`]) and their softmaxes are merged
/// in order ([`merge_spans`]). The cuts depend on the row's positions only, never on the thread
/// count or on the rows beside it, so a decode row's bits are the same alone or in a batch, on
/// 1 thread or on many: only which thread attends a partition changes. 256 keys keep a
/// partition's scores in L1 (Llama 3's 32 query heads × 256 × 4 bytes = 32 KiB) and cost one
/// merge per 256 keys (n_heads·head_dim multiply-adds, ~1% of the partition's work).
pub const PARTITION: usize = 256;

/// How many partitions `keys` spans, and the i-th of them.
fn partitions(keys: &Range<usize>) -> usize {
    keys.end.div_ceil(PARTITION) - keys.start / PARTITION
}
fn partition(keys: &Range<usize>, i: usize) -> Range<usize> {
    let start = (keys.start / PARTITION + i) * PARTITION;
    start.max(keys.start)..(start + PARTITION).min(keys.end)
}

thread_local! {
    /// The calling thread's buffer of partition outputs for [`split_partitions`], reused from
    /// step to step (1 MiB for Llama 3.2 1B's rows at 32k positions: not worth allocating per
    /// layer).
    static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// o (|kv_heads|·kv_mul, head_dim) ← attention of one row's queries q (|kv_heads|·kv_mul,
/// head_dim) of KV heads `kv_heads` over `keys`, on the calling thread: each partition of the
/// keys ([`PARTITION`]) attended, then merged in order; a row of one partition attended
/// directly. Each KV head's outputs are the same whichever other heads the call covers.
fn attend_row<R: KvRows>(
    o: &mut [f32],
    q: &[f32],
    kv_heads: Range<usize>,
    keys: Range<usize>,
    kv: &R,
    heads: &Heads,
) {
    let m = kv_heads.len() * heads.kv_mul(); // query heads
    let part = m * heads.head_dim + 2 * m; // a partition's outputs, then its (max, sum) per head
    let n_parts = partitions(&keys);
    SCRATCH.with_borrow_mut(|(scratch, parts)| {
        if n_parts <= 1 {
            parts.resize(2 * m, 0.0);
            let span = Span { kv_heads, keys };
            return attend_group(o, parts, q, span, kv, heads, scratch);
        }
        parts.resize(n_parts * part, 0.0);
        for (i, p) in parts.chunks_exact_mut(part).enumerate() {
            let (po, stats) = p.split_at_mut(m * heads.head_dim);
            let span = Span {
                kv_heads: kv_heads.clone(),
                keys: partition(&keys, i),
            };
            attend_group(po, stats, q, span, kv, heads, scratch);
        }
        merge_spans(o, parts, m, heads.head_dim);
    });
}

/// out (n_heads·head_dim) ← attention of one query row q over `keys`, as [`attend_row`] over
/// all KV heads computes it, its partitions shared among `threads` threads, consecutive ones
/// to each.
fn split_partitions<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    keys: Range<usize>,
    kv: &R,
    heads: &Heads,
    threads: usize,
) {
    let n_parts = partitions(&keys);
    if threads <= 1 || n_parts <= 1 {
        return attend_row(out, q, 0..heads.n_kv_heads, keys, kv, heads);
    }
    let (n_heads, hd) = (heads.n_heads, heads.head_dim);
    // parts (n_parts, n_heads·head_dim + 2·n_heads): each partition's outputs, then its stats.
    let part = n_heads * hd + 2 * n_heads;
    let per = n_parts.div_ceil(threads);
    PARTS.with_borrow_mut(|parts| {
        parts.resize(n_parts * part, 0.0);
        threads::for_each_chunk_mut(parts, per * part, |t, share| {
            for (i, p) in share.chunks_exact_mut(part).enumerate() {
                let (o, stats) = p.split_at_mut(n_heads * hd);
                let span = Span {
                    kv_heads: 0..heads.n_kv_heads,
                    keys: partition(&keys, t * per + i),
                };
                SCRATCH.with_borrow_mut(|(s, _)| attend_group(o, stats, q, span, kv, heads, s));
            }
        });
        merge_spans(out, parts, n_heads, hd);
    });
}

/// o_h ← Σ_s w_s·l_s·o_{s,h} / Σ_s w_s·l_s with w_s = e^(m_s − max_s m_s), for spans s whose
/// outputs o_s are each normalised by their own l_s = Σ_j e^(s_j − m_s): the softmax over all
/// the keys, assembled from its parts (as FlashAttention's and flash-decoding's reductions do).
/// `parts` is (spans, n_heads·head_dim + 2·n_heads): outputs, then (m, l) per head.
pub fn merge_spans(out: &mut [f32], parts: &[f32], n_heads: usize, hd: usize) {
    let part = n_heads * hd + 2 * n_heads;
    for (h, o) in out.chunks_exact_mut(hd).enumerate() {
        let stat = |p: &[f32]| (p[n_heads * hd + 2 * h], p[n_heads * hd + 2 * h + 1]);
        let max = parts
            .chunks_exact(part)
            .map(|p| stat(p).0)
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        o.fill(0.0);
        for p in parts.chunks_exact(part) {
            let (m, l) = stat(p);
            let w = (m - max).exp() * l;
            total += w;
            o.iter_mut()
                .zip(&p[h * hd..][..hd])
                .for_each(|(o, x)| *o += w * x);
        }
        o.iter_mut().for_each(|o| *o /= total);
    }
}

/// o (|kv_heads|·kv_mul, head_dim) ← attention of one row's queries q (|kv_heads|·kv_mul,
/// head_dim) of KV heads `span.kv_heads` (kv_mul query heads share each) over the key positions
/// `span.keys`, and stats (|kv_heads|·kv_mul, 2) ← each query head's (max score, Σ_j e^(s_j − max))
/// over those keys: what [`merge_spans`] needs to combine spans of one row's keys.
///
/// The body is compiled once per instruction set and chosen at run time ([`simd::isa`]), so its
/// small per-key loops vectorize with the widest registers the CPU has.
pub fn attend_group<R: KvRows>(
    o: &mut [f32],
    stats: &mut [f32],
    q: &[f32],
    span: Span,
    kv: &R,
    heads: &Heads,
    scratch: &mut Scratch,
) {
    match simd::isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: isa() returns only levels the CPU supports; the body is safe code.
        simd::Isa::Avx512 => unsafe { attend_group_avx512(o, stats, q, span, kv, heads, scratch) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        simd::Isa::Avx2Fma => unsafe { attend_group_avx2(o, stats, q, span, kv, heads, scratch) },
        _ => attend_group_body::<R, simd::PlainHeads>(o, stats, q, span, kv, heads, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_group_avx512<R: KvRows>(
    o: &mut [f32],
    stats: &mut [f32],
    q: &[f32],
    span: Span,
    kv: &R,
    heads: &Heads,
    scratch: &mut Scratch,
) {
    attend_group_body::<R, tiled::Avx512Tiles>(o, stats, q, span, kv, heads, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_group_avx2<R: KvRows>(
    o: &mut [f32],
    stats: &mut [f32],
    q: &[f32],
    span: Span,
    kv: &R,
    heads: &Heads,
    scratch: &mut Scratch,
) {
    attend_group_body::<R, simd::Avx2Heads>(o, stats, q, span, kv, heads, scratch)
}

// ANCHOR: attend_group
#[inline(always)]
fn attend_group_body<R: KvRows, K: simd::HeadKernels>(
    o: &mut [f32],
    stats: &mut [f32],
    q: &[f32],
    span: Span,
    kv: &R,
    heads: &Heads,
    scratch: &mut Scratch,
) {
    let hd = heads.head_dim;
    let kv_dim = heads.n_kv_heads * hd; // the stride from one position's row to the next
    let (gs, Range { start: lo, end }) = (span.kv_heads, span.keys);
    let n = end - lo; // keys this call attends to
    let run_len = run_rows(kv_dim);
    // scratch: the queries times the scale (|gs|·kv_mul, head_dim), then the scores
    // (|gs|·kv_mul, n); m counts the query heads of gs.
    let (kv_mul, group) = (heads.kv_mul(), heads.kv_mul() * hd);
    let Scratch { work, tile } = scratch;
    work.resize(q.len() + gs.len() * kv_mul * n, 0.0);
    let (q_scaled, scores) = work.split_at_mut(q.len());
    q_scaled
        .iter_mut()
        .zip(q)
        .for_each(|(s, q)| *s = q * heads.scale);
    // s[m][j − lo] = (q_m · scale) · k_{g,j}, each key row read once for the kv_mul heads of its KV
    // head g. Keys come in runs stored one after another (`KvRows::rows`), so the kernel walks
    // them at stride kv_dim, eight keys per pass summed into one vector of eight scores (of two
    // heads, where a head is 8 wide and the CPU has AVX-512).
    // An f16 cache's runs go to the kernel as stored where it converts them in registers.
    let f16 = K::f16_heads(kv_mul, hd);
    let mut j = lo;
    while j < end {
        let stop = (j + run_len).min(end);
        let c = match f16.then(|| kv.rows_f16(Part::Keys, j, stop)).flatten() {
            Some(run) => {
                let c = run.len() / kv_dim; // positions j..j + c
                for (i, g) in gs.clone().enumerate() {
                    let s = &mut scores[i * kv_mul * n..][..kv_mul * n];
                    let q = &q_scaled[i * group..][..group];
                    K::dot_heads_f16(s, n, j - lo..j - lo + c, q, hd, &run[g * hd..], kv_dim);
                }
                c
            }
            None => {
                let run = kv.rows(Part::Keys, j, stop, gs.clone(), tile);
                let c = run.len() / kv_dim;
                for (i, g) in gs.clone().enumerate() {
                    let k = &run[g * hd..]; // key b of the run for KV head g at k[b·kv_dim..][..hd]
                    let s = &mut scores[i * kv_mul * n..][..kv_mul * n];
                    let q = &q_scaled[i * group..][..group];
                    K::dot_heads(s, n, j - lo..j - lo + c, q, hd, k, kv_dim);
                }
                c
            }
        };
        j += c;
    }
    // e[m][j] = exp(s[m][j] − max_j s[m][j]); softmax divides by their sum, which is done
    // below on the head_dim outputs instead of on the n weights.
    for (s, st) in scores.chunks_exact_mut(n).zip(stats.chunks_exact_mut(2)) {
        let (max, sum) = crate::softmax::exp_shifted::<K::MulAdd>(s);
        (st[0], st[1]) = (max, sum);
    }
    // o_m = Σ_j e[m][j] v_{g,j} / Σ_j e[m][j], each run of value rows read once for the kv_mul
    // heads of a KV head while their o_m stay in registers.
    o.fill(0.0);
    let mut j = lo;
    while j < end {
        let stop = (j + run_len).min(end);
        let c = match f16.then(|| kv.rows_f16(Part::Values, j, stop)).flatten() {
            Some(run) => {
                let c = run.len() / kv_dim;
                for (i, g) in gs.clone().enumerate() {
                    let (o, s) = (&mut o[i * group..][..group], &scores[i * kv_mul * n..]);
                    let (v, cols) = (&run[g * hd..], j - lo..j - lo + c);
                    K::axpy_heads_f16(o, hd, &s[..kv_mul * n], n, cols, v, kv_dim);
                }
                c
            }
            None => {
                let run = kv.rows(Part::Values, j, stop, gs.clone(), tile);
                let c = run.len() / kv_dim;
                for (i, g) in gs.clone().enumerate() {
                    let (o, s) = (&mut o[i * group..][..group], &scores[i * kv_mul * n..]);
                    let (v, cols) = (&run[g * hd..], j - lo..j - lo + c);
                    K::axpy_heads(o, hd, &s[..kv_mul * n], n, cols, v, kv_dim);
                }
                c
            }
        };
        j += c;
    }
    for (o_m, st) in o.chunks_exact_mut(hd).zip(stats.chunks_exact(2)) {
        let inv = 1.0 / st[1];
        o_m.iter_mut().for_each(|o| *o *= inv);
    }
}
// ANCHOR_END: attend_group

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Heads of this shape, scaled by 1/√head_dim.
    fn shape(n_heads: usize, n_kv_heads: usize, head_dim: usize, window: usize) -> Heads {
        Heads {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
        }
    }

    /// n floats drawn uniformly from [−2, 2).
    fn uniform(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
    }

    /// The definition, head by head, in f64.
    fn reference(q: &[f32], c: Contiguous, heads: &Heads, pos: usize) -> Vec<f32> {
        let hd = heads.head_dim;
        let mut out = vec![0.0f32; heads.n_heads * hd];
        for h in 0..heads.n_heads {
            let g = h / heads.kv_mul();
            let keys = heads.first_visible(pos)..pos + 1;
            let s: Vec<f64> = keys
                .clone()
                .map(|j| {
                    let k = &c.k[j * c.kv_dim + g * hd..][..hd];
                    q[h * hd..][..hd]
                        .iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * heads.scale as f64
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (j, e) in keys.zip(&e) {
                let v = &c.v[j * c.kv_dim + g * hd..][..hd];
                for d in 0..hd {
                    out[h * hd + d] += (e / sum * v[d] as f64) as f32;
                }
            }
        }
        out
    }

    /// Every path of `attention` for one decode row — on the calling thread (short), its KV
    /// heads or its partitions across the threads (long: flash-decoding's merge), with a
    /// sliding window, GQA with
    /// an odd group, query heads in fours — against the definition; and a NaN in the cache
    /// reaches the output.
    #[test]
    fn one_row_matches_the_definition_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for (n_heads, n_kv_heads, head_dim, ctx, window) in [
            (4, 2, 16, 20, usize::MAX),
            (4, 2, 16, 700, usize::MAX),
            (6, 2, 8, 999, 300),
            (8, 4, 8, 513, usize::MAX),
            (2, 1, 48, 1025, usize::MAX),
            // Query heads in fours on a KV head (Gemma 3's MQA, Llama 3's GQA): the tiles'
            // products on AVX-512 (attention/tiled.rs's Avx512Tiles), short and split by keys.
            (4, 1, 256, 40, usize::MAX),
            (4, 1, 256, 3000, 512),
            (8, 2, 64, 1500, usize::MAX),
            (16, 2, 32, 900, usize::MAX),
        ] {
            let heads = shape(n_heads, n_kv_heads, head_dim, window);
            let kv_dim = n_kv_heads * head_dim;
            let mut draw = |n: usize| uniform(&mut rng, n);
            let (q, k, v) = (
                draw(n_heads * head_dim),
                draw(ctx * kv_dim),
                draw(ctx * kv_dim),
            );
            let c = Contiguous {
                k: &k,
                v: &v,
                kv_dim,
            };
            let pos = ctx - 1;
            let mut out = vec![f32::NAN; n_heads * head_dim];
            attention(&mut out, &q, &heads, |_| pos, |_| 0, |_| c);
            let want = reference(&q, c, &heads, pos);
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "ctx {ctx} [{i}]: {a} vs {b}"
                );
            }
            let mut v_nan = v.clone();
            v_nan[(pos / 2) * kv_dim] = f32::NAN; // KV head 0, one position every query sees
            let c = Contiguous {
                k: &k,
                v: &v_nan,
                kv_dim,
            };
            attention(&mut out, &q, &heads, |_| pos, |_| 0, |_| c);
            if heads.first_visible(pos) <= pos / 2 {
                assert!(out[0].is_nan(), "ctx {ctx}: a NaN value must reach head 0");
            }
        }
    }

    /// A decode row's bits do not depend on how its work is shared: alone or beside other
    /// sequences' rows (the tiled path's lone rows and the (row, KV head) tasks), its partitions
    /// on 1 to 7 threads' shares, its KV heads attended together or apart — all give the
    /// partitioned attention's bits, for contexts of one partition and of several, cut or not
    /// at a partition's edge, with a sliding window.
    #[test]
    fn a_decode_rows_bits_do_not_depend_on_threads_or_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for (n_heads, n_kv_heads, head_dim, ctx, window) in [
            (4, 1, 256, 1300, usize::MAX),
            (8, 2, 64, 1025, usize::MAX),
            (6, 2, 8, 999, 300),
            (6, 6, 48, 200, usize::MAX),
            (4, 2, 16, 512, usize::MAX),
        ] {
            let heads = shape(n_heads, n_kv_heads, head_dim, window);
            let (kv_dim, row_len) = (n_kv_heads * head_dim, n_heads * head_dim);
            let mut draw = |n: usize| uniform(&mut rng, n);
            let (k, v) = (draw(ctx * kv_dim), draw(ctx * kv_dim));
            // Row 0 is the row under test; rows 1..4 are other sequences' decode rows.
            let q = draw(4 * row_len);
            let c = Contiguous {
                k: &k,
                v: &v,
                kv_dim,
            };
            let pos = ctx - 1;
            let keys = heads.first_visible(pos)..pos + 1;
            let mut want = vec![f32::NAN; row_len];
            attend_row(
                &mut want,
                &q[..row_len],
                0..n_kv_heads,
                keys.clone(),
                &c,
                &heads,
            );
            let same = |got: &[f32], how: &str| {
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{n_heads}/{n_kv_heads}×{head_dim} ctx {ctx} {how} [{i}]: {a} vs {b}"
                    );
                }
            };
            for threads in 1..=7 {
                let mut out = vec![f32::NAN; row_len];
                split_partitions(&mut out, &q[..row_len], keys.clone(), &c, &heads, threads);
                same(&out, &format!("on {threads} threads"));
            }
            let mut out = vec![f32::NAN; row_len];
            let group = heads.kv_mul() * head_dim;
            for g in 0..n_kv_heads {
                let o = &mut out[g * group..][..group];
                attend_row(
                    o,
                    &q[g * group..][..group],
                    g..g + 1,
                    keys.clone(),
                    &c,
                    &heads,
                );
            }
            same(&out, "head by head");
            let mut out = vec![f32::NAN; row_len];
            attention(&mut out, &q[..row_len], &heads, |_| pos, |_| 0, |_| c);
            same(&out, "alone");
            let mut out = vec![f32::NAN; 4 * row_len];
            let pos_of = |r: usize| if r == 0 { pos } else { 40 * r };
            attention(&mut out, &q, &heads, pos_of, |r| r, |_| c);
            same(&out[..row_len], "in a batch");
        }
    }

    /// A step of several rows per sequence — two sequences at different positions, one longer
    /// than a tile, one of a single row — through the tiled kernel where the CPU has it (and
    /// attend_group elsewhere), on one thread and on the team, against the definition, for
    /// MHA/GQA/MQA, head_dim 16..256 and 8 (no tile), with and without a window; a NaN value
    /// reaches the rows that see it.
    #[test]
    fn rows_of_a_step_match_the_definition_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for (n_heads, n_kv_heads, head_dim, window) in [
            (4, 1, 256, usize::MAX),
            (4, 1, 256, 37),
            (6, 6, 48, usize::MAX),
            (8, 2, 64, 50),
            (2, 2, 16, usize::MAX),
            (32, 1, 16, 9),
            (6, 3, 8, 20),
        ] {
            let heads = shape(n_heads, n_kv_heads, head_dim, window);
            let kv_dim = n_kv_heads * head_dim;
            let row_len = n_heads * head_dim;
            // (first position, rows, cache length) per sequence: a longer than a tile, b a row
            // alone, c from position 0 (7 rows: a tile and a rest), d 5 rows (a tile of 4 for
            // Gemma's shape and a row left alone in a tile); c alone is small enough to stay on
            // the calling thread.
            for seqs in [
                &[(40, 23, 63), (5, 1, 6), (0, 7, 7), (9, 5, 14)][..],
                &[(0, 7, 7)],
            ] {
                let mut draw = |n: usize| uniform(&mut rng, n);
                let mut caches: Vec<(Vec<f32>, Vec<f32>)> = seqs
                    .iter()
                    .map(|&(_, _, len)| (draw(len * kv_dim), draw(len * kv_dim)))
                    .collect();
                let n_rows: usize = seqs.iter().map(|s| s.1).sum();
                let q = draw(n_rows * row_len);
                let row_seq: Vec<usize> = (0..seqs.len())
                    .flat_map(|s| std::iter::repeat_n(s, seqs[s].1))
                    .collect();
                let row0 = |s: usize| seqs[..s].iter().map(|s| s.1).sum::<usize>();
                let pos_of = |r: usize| seqs[row_seq[r]].0 + r - row0(row_seq[r]);
                let run = |caches: &[(Vec<f32>, Vec<f32>)]| {
                    let cache = |s: usize| Contiguous {
                        k: &caches[s].0,
                        v: &caches[s].1,
                        kv_dim,
                    };
                    let mut out = vec![f32::NAN; n_rows * row_len];
                    attention(
                        &mut out,
                        &q,
                        &heads,
                        pos_of,
                        |r| row_seq[r],
                        |r| cache(row_seq[r]),
                    );
                    out
                };
                let out = run(&caches);
                for r in 0..n_rows {
                    let cache = Contiguous {
                        k: &caches[row_seq[r]].0,
                        v: &caches[row_seq[r]].1,
                        kv_dim,
                    };
                    let want = reference(&q[r * row_len..][..row_len], cache, &heads, pos_of(r));
                    for (i, (a, b)) in out[r * row_len..][..row_len].iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "{n_heads}/{n_kv_heads}×{head_dim} window {window} row {r} [{i}]: \
                             {a} vs {b}"
                        );
                    }
                }
                // A NaN value at position 5 of the last sequence: its rows that see it are NaN.
                let last = seqs.len() - 1;
                caches[last].1[5 * kv_dim] = f32::NAN;
                let out = run(&caches);
                for r in row0(last)..n_rows {
                    let p = pos_of(r);
                    if p >= 5 && heads.first_visible(p) <= 5 {
                        assert!(out[r * row_len].is_nan(), "row {r} at {p} must see the NaN");
                    }
                }
            }
        }
    }

    /// The tiled kernel's pieces against plain loops: the 16-lane sums are the scalar tree's
    /// bits, scores and weighted values at ragged key counts and padded query blocks.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn tile_products_match_plain_loops() {
        if !tiled::available(16) {
            eprintln!("skipping: this CPU has no AVX-512 (the tiled kernel is not used here)");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (hd, m_pad, c, stride) in [
            (16, 4, 1, 16),
            (48, 8, 7, 96),
            (256, 16, 13, 256),
            (80, 4, 4, 80),
        ] {
            let mut draw =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
            let (q, k) = (draw(m_pad * hd), draw(c * stride));
            let (n, col0) = (c + 5, 3);
            let mut s = vec![f32::NAN; m_pad * n];
            tiled::test_scores(&mut s, n, col0, &q, hd, &k, stride, c);
            for i in 0..m_pad {
                for b in 0..c {
                    let want = tiled::sum16_scalar(&std::array::from_fn(|l| {
                        (0..hd / 16).fold(0.0f32, |a, d| {
                            q[i * hd + 16 * d + l].mul_add(k[b * stride + 16 * d + l], a)
                        })
                    }));
                    let got = s[i * n + col0 + b];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "hd {hd} s[{i}][{b}]: {got} vs {want}"
                    );
                }
            }
            let w = draw(m_pad * n);
            let v = draw(c * stride);
            let mut o = draw(m_pad * hd);
            let mut want = o.clone();
            tiled::test_weighted_values(&mut o, hd, &w, n, col0, &v, stride, c);
            for i in 0..m_pad {
                for d in 0..hd {
                    for b in 0..c {
                        want[i * hd + d] =
                            w[i * n + col0 + b].mul_add(v[b * stride + d], want[i * hd + d]);
                    }
                    assert_eq!(
                        o[i * hd + d].to_bits(),
                        want[i * hd + d].to_bits(),
                        "hd {hd} o[{i}][{d}]"
                    );
                }
            }
        }
    }
}
