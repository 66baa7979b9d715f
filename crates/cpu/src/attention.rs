//! Causal attention of a step's queries over the keys and values in a KV cache, for both cache
//! layouts: the caller says where the key and value of position j live ([`KvRows`]).
//!
//! For the query at position p and head h (KV head g = h / kv_mul, kv_mul = n_heads / n_kv_heads;
//! GQA/MQA share one KV head among kv_mul query heads):
//!   s_j = (q_h · k_{g,j}) · scale            for j in lo..=p, lo = max(0, p + 1 − window)
//!   a   = softmax(s)
//!   o_h = Σ_j a_j v_{g,j}
//! The kv_mul query heads of one KV head are computed together, so each key and value row is read
//! once per KV head, not once per query head. The work is (query row, KV head) tasks: on the
//! calling thread when the step is small, else one block of consecutive tasks per thread, each
//! row's KV heads of a block attended together run by run of positions (their keys are
//! neighbours in the cache).

use std::ops::Range;

use crate::simd;
use crate::threads;

/// The attention shape of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
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

/// Where one sequence's keys and values live: `key(j)` and `value(j)` are the (kv_dim,) rows of
/// position j, all KV heads side by side.
pub trait KvRows: Sync {
    fn key(&self, j: usize) -> &[f32];
    fn value(&self, j: usize) -> &[f32];
    /// The keys of positions `j..j + c` for some `1 ≤ c ≤ end − j`, stored one after another:
    /// a slice of c·kv_dim floats (the cache up to its ring wrap, a block up to its end). The
    /// default is one row.
    fn keys(&self, j: usize, end: usize) -> &[f32] {
        debug_assert!(j < end);
        self.key(j)
    }
    /// The values of a run of positions, as [`KvRows::keys`].
    fn values(&self, j: usize, end: usize) -> &[f32] {
        debug_assert!(j < end);
        self.value(j)
    }
}

/// Most positions attention takes from one run of [`KvRows::keys`] (or values): the kv_mul query
/// heads of a KV head each read the run, and the second reads it from L1 if it is short.
const RUN: usize = 64;

/// Below this many multiply-adds a step's attention runs on the calling thread: handing tasks
/// to other threads costs microseconds, more than a short context takes.
const PAR_MIN_WORK: usize = 1 << 15;

/// out (rows, n_heads·head_dim) ← attention of every query row, where row r is the query at
/// position `pos_of(r)` of the sequence whose keys `rows_of(r)` reads.
pub fn attention<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    heads: &Heads,
    pos_of: impl Fn(usize) -> usize + Sync,
    rows_of: impl Fn(usize) -> R + Sync,
) {
    let hd = heads.head_dim;
    let group = heads.kv_mul() * hd; // one task's slice of a row: the heads of one KV head
    let n_rows = out.len() / (heads.n_heads * hd);
    let work: usize = (0..n_rows)
        .map(|r| pos_of(r) + 1 - heads.first_visible(pos_of(r)))
        .sum::<usize>()
        * 2
        * heads.n_heads
        * hd;
    thread_local! {
        /// Each thread's scratch for [`attend_group`], reused from step to step.
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Attention of row r's KV heads gs, written to o (its slice of out).
    let run = |r: usize, gs: Range<usize>, o: &mut [f32]| {
        let q = &q[r * heads.n_heads * hd + gs.start * group..][..gs.len() * group];
        SCRATCH.with_borrow_mut(|s| attend_group(o, q, gs, pos_of(r), &rows_of(r), heads, s));
    };
    let per_row = heads.n_kv_heads * group;
    if work < PAR_MIN_WORK {
        for (r, o) in out.chunks_exact_mut(per_row).enumerate() {
            run(r, 0..heads.n_kv_heads, o);
        }
    } else {
        // One block of consecutive (row, KV head) tasks per thread, each row's part of a block in
        // one call: its KV heads' keys sit side by side in a row of the cache, so a thread that
        // takes them together reads whole stretches of cache lines.
        let n_tasks = out.len() / group;
        let per = n_tasks.div_ceil(threads::num_threads());
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

/// o (|gs|, kv_mul, head_dim) ← attention of the queries q (|gs|, kv_mul, head_dim) at position
/// `pos` of KV heads `gs` (kv_mul query heads share each), over keys `first_visible(pos)..=pos`.
/// `scratch` is reused between calls.
///
/// The body is compiled once per instruction set and chosen at run time ([`simd::isa`]), so its
/// small per-key loops vectorize with the widest registers the CPU has.
pub fn attend_group<R: KvRows>(
    o: &mut [f32],
    q: &[f32],
    gs: Range<usize>,
    pos: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut Vec<f32>,
) {
    match simd::isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: isa() returns only levels the CPU supports; the body is safe code.
        simd::Isa::Avx512 => unsafe { attend_group_avx512(o, q, gs, pos, kv, heads, scratch) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        simd::Isa::Avx2Fma => unsafe { attend_group_avx2(o, q, gs, pos, kv, heads, scratch) },
        _ => attend_group_body::<R, simd::PlainHeads>(o, q, gs, pos, kv, heads, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_group_avx512<R: KvRows>(
    o: &mut [f32],
    q: &[f32],
    gs: Range<usize>,
    pos: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut Vec<f32>,
) {
    attend_group_body::<R, simd::Avx512Heads>(o, q, gs, pos, kv, heads, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_group_avx2<R: KvRows>(
    o: &mut [f32],
    q: &[f32],
    gs: Range<usize>,
    pos: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut Vec<f32>,
) {
    attend_group_body::<R, simd::Avx2Heads>(o, q, gs, pos, kv, heads, scratch)
}

// ANCHOR: attend_group
#[inline(always)]
fn attend_group_body<R: KvRows, K: simd::HeadKernels>(
    o: &mut [f32],
    q: &[f32],
    gs: Range<usize>,
    pos: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut Vec<f32>,
) {
    let hd = heads.head_dim;
    let kv_dim = heads.n_kv_heads * hd; // the stride from one position's row to the next
    let lo = heads.first_visible(pos);
    let n = pos + 1 - lo; // keys visible to this query
    // scratch: the queries times the scale (|gs|·kv_mul, head_dim), 1 / Σ_j e[m][j] (|gs|·kv_mul,),
    // then the scores (|gs|·kv_mul, n); m counts the query heads of gs.
    let (kv_mul, group) = (heads.kv_mul(), heads.kv_mul() * hd);
    let heads_here = gs.len() * kv_mul;
    scratch.resize(q.len() + heads_here + heads_here * n, 0.0);
    let (q_scaled, rest) = scratch.split_at_mut(q.len());
    let (inv_sum, scores) = rest.split_at_mut(heads_here);
    q_scaled
        .iter_mut()
        .zip(q)
        .for_each(|(s, q)| *s = q * heads.scale);
    // s[m][j − lo] = (q_m · scale) · k_{g,j}, each key row read once for the kv_mul heads of its KV
    // head g. Keys come in runs stored one after another (`KvRows::keys`), so the kernel walks
    // them at stride kv_dim, eight keys per pass summed into one vector of eight scores (of two
    // heads, where a head is 8 wide and the CPU has AVX-512).
    let mut j = lo;
    while j <= pos {
        let run = kv.keys(j, (j + RUN).min(pos + 1));
        let c = run.len() / kv_dim; // positions j..j + c
        for (i, g) in gs.clone().enumerate() {
            let k = &run[g * hd..]; // key b of the run for KV head g at k[b·kv_dim..][..hd]
            let s = &mut scores[i * kv_mul * n..][..kv_mul * n];
            K::dot_heads(
                s,
                n,
                j - lo..j - lo + c,
                &q_scaled[i * group..][..group],
                hd,
                k,
                kv_dim,
            );
        }
        j += c;
    }
    // e[m][j] = exp(s[m][j] − max_j s[m][j]); softmax divides by their sum, which is done
    // below on the head_dim outputs instead of on the n weights.
    for (s, inv) in scores.chunks_exact_mut(n).zip(inv_sum.iter_mut()) {
        *inv = 1.0 / crate::softmax::exp_shifted::<K::MulAdd>(s);
    }
    // o_m = Σ_j e[m][j] v_{g,j} / Σ_j e[m][j], each run of value rows read once for the kv_mul
    // heads of a KV head while their o_m stay in registers.
    o.fill(0.0);
    let mut j = lo;
    while j <= pos {
        let run = kv.values(j, (j + RUN).min(pos + 1));
        let c = run.len() / kv_dim;
        for (i, g) in gs.clone().enumerate() {
            let (v, s) = (&run[g * hd..], &scores[i * kv_mul * n..][..kv_mul * n]);
            K::axpy_heads(
                &mut o[i * group..][..group],
                hd,
                s,
                n,
                j - lo..j - lo + c,
                v,
                kv_dim,
            );
        }
        j += c;
    }
    for (o_m, inv) in o.chunks_exact_mut(hd).zip(inv_sum.iter()) {
        o_m.iter_mut().for_each(|o| *o *= inv);
    }
}
// ANCHOR_END: attend_group
