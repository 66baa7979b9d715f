//! Attention of several query rows of one sequence at once: a prompt, a chunk of one, a
//! speculative step's guesses. [`super::attend_group`] reads every key and value row once per
//! query row; here a tile of consecutive rows (positions p0..p0 + t) reads them once per tile,
//! as FlashAttention tiles its queries (Dao et al., 2022, §3.1), so that prefill's attention is
//! bound by arithmetic instead of by loads.
//!
//! For KV head g the tile's query vectors are its rows' kv_mul heads of g, m = t·kv_mul of them,
//! and the keys it reads are the union of its rows' visible ones, lo = first_visible(p0) up to
//! p0 + t. Per run of keys the scores S (m, keys) = Q Kᵀ come four query vectors by four keys
//! at a time (sixteen accumulators); each row's softmax is taken over its own visible keys, the
//! others' weights set to 0; then O (m, head_dim) += P V, four query vectors by 64 columns at a
//! time. A key or value a row cannot see is thus multiplied by a weight of 0: a NaN or infinite
//! value among the tile's other rows' keys reaches this row's output too (0·NaN = NaN), more
//! than the per-row kernel would, never less.
//!
//! Each score is one vector's FMA chain over head_dim, 16 lanes, summed by the same tree
//! whatever its place in the tile, and each output element one FMA chain over the keys in
//! order, so a query's result does not depend on its tile; it differs from the per-row kernel's
//! in rounding only (its scores sum 8 lanes).

use super::{Heads, KvRows, Part};
use crate::simd::{self, HeadKernels};

/// Most rows in a tile.
pub(super) const MAX_ROWS: usize = 8;

/// Rows per tile for a model whose KV heads each serve `kv_mul` query heads: enough rows that
/// a tile has 16 query vectors (the kernel's four blocks of four), at least 2 and at most
/// [`MAX_ROWS`].
pub(super) fn rows_per_tile(kv_mul: usize) -> usize {
    (16 / kv_mul.max(1)).clamp(2, MAX_ROWS)
}

/// Whether this CPU and head size have the tiled kernel: AVX-512 and head_dim a multiple of 16.
pub(super) fn available(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(16) && simd::isa() == simd::Isa::Avx512
}

/// What [`attend_tile`] works in, reused from call to call.
#[derive(Default)]
pub(super) struct TileScratch {
    /// (m_pad, head_dim) the tile's query vectors of one KV head, times the scale; rows past m
    /// are 0.
    q: Vec<f32>,
    /// (m_pad, n) their scores over the tile's keys, then their weights.
    s: Vec<f32>,
    /// (m_pad, head_dim) their weighted sums of values, not yet divided by Σ weights.
    o: Vec<f32>,
    /// (m,) 1 / Σ_j e^(s_j − max) per query vector.
    inv_sum: Vec<f32>,
    /// A run of keys or values decoded from the cache's dtype (unused for an f32 cache).
    tile: Vec<f32>,
}

/// out (t, n_heads·head_dim) ← attention of the t query rows q (t, n_heads·head_dim) at
/// positions `p0..p0 + t` of the sequence whose keys and values `kv` reads, all KV heads.
///
/// # Panics
/// If [`available`] is false for `heads.head_dim` (the caller checks), or if `q` and `out`
/// differ in length.
pub(super) fn attend_tile<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    p0: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut TileScratch,
) {
    assert!(available(heads.head_dim), "attend_tile needs AVX-512");
    assert_eq!(
        q.len(),
        out.len(),
        "attend_tile: q and out differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: available() checked that the CPU has AVX-512F (simd::isa).
    unsafe {
        attend_tile_avx512(out, q, p0, kv, heads, scratch)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_tile_avx512<R: KvRows>(
    out: &mut [f32],
    q: &[f32],
    p0: usize,
    kv: &R,
    heads: &Heads,
    scratch: &mut TileScratch,
) {
    type MulAdd = <simd::Avx512Heads as HeadKernels>::MulAdd;
    let (hd, kv_mul) = (heads.head_dim, heads.kv_mul());
    let (row_len, kv_dim) = (heads.n_heads * hd, heads.n_kv_heads * hd);
    let t = out.len() / row_len;
    let (m, m_pad) = (t * kv_mul, (t * kv_mul).next_multiple_of(4));
    let (lo, end) = (heads.first_visible(p0), p0 + t);
    let n = end - lo; // the tile's keys: every one visible to at least its last row
    let run_len = super::run_rows(kv_dim);
    let TileScratch {
        q: qs,
        s,
        o,
        inv_sum,
        tile,
    } = scratch;
    qs.resize(m_pad * hd, 0.0);
    s.resize(m_pad * n, 0.0);
    o.resize(m_pad * hd, 0.0);
    inv_sum.resize(m, 0.0);
    for g in 0..heads.n_kv_heads {
        // Query vector i·kv_mul + h is row i's head g·kv_mul + h, times the scale.
        for (i, row) in q.chunks_exact(row_len).enumerate() {
            let src = &row[g * kv_mul * hd..][..kv_mul * hd];
            for (d, x) in qs[i * kv_mul * hd..][..kv_mul * hd].iter_mut().zip(src) {
                *d = x * heads.scale;
            }
        }
        qs[m * hd..].fill(0.0);
        let mut j = lo;
        while j < end {
            let stop = (j + run_len).min(end);
            // An f16 run as stored, converted in registers; else as f32 (decoded into tile).
            let c = match kv.rows_f16(Part::Keys, j, stop) {
                Some(run) => {
                    let c = run.len() / kv_dim; // positions j..j + c
                    // SAFETY: this function runs only where the CPU has AVX-512F (attend_tile);
                    // `scores` checks the shapes itself.
                    unsafe { x86::scores(s, n, j - lo, qs, hd, &run[g * hd..], kv_dim, c) };
                    c
                }
                None => {
                    let run = kv.rows(Part::Keys, j, stop, g..g + 1, tile);
                    let c = run.len() / kv_dim;
                    // SAFETY: this function runs only where the CPU has AVX-512F (attend_tile);
                    // `scores` checks the shapes itself.
                    unsafe { x86::scores(s, n, j - lo, qs, hd, &run[g * hd..], kv_dim, c) };
                    c
                }
            };
            j += c;
        }
        // Row i's weights: e^(s − max) over its visible keys lo_i..=p0 + i, 0 elsewhere.
        for (i, rows) in s[..m * n].chunks_exact_mut(kv_mul * n).enumerate() {
            let (vis_lo, vis_end) = (heads.first_visible(p0 + i) - lo, p0 + i + 1 - lo);
            for (h, w) in rows.chunks_exact_mut(n).enumerate() {
                w[..vis_lo].fill(0.0);
                w[vis_end..].fill(0.0);
                let (_, sum) = crate::softmax::exp_shifted::<MulAdd>(&mut w[vis_lo..vis_end]);
                inv_sum[i * kv_mul + h] = 1.0 / sum;
            }
        }
        s[m * n..].fill(0.0);
        o.fill(0.0);
        let mut j = lo;
        while j < end {
            let stop = (j + run_len).min(end);
            let c = match kv.rows_f16(Part::Values, j, stop) {
                Some(run) => {
                    let c = run.len() / kv_dim;
                    // SAFETY: as for the scores; `weighted_values` checks the shapes itself.
                    unsafe { x86::weighted_values(o, hd, s, n, j - lo, &run[g * hd..], kv_dim, c) };
                    c
                }
                None => {
                    let run = kv.rows(Part::Values, j, stop, g..g + 1, tile);
                    let c = run.len() / kv_dim;
                    // SAFETY: as for the scores; `weighted_values` checks the shapes itself.
                    unsafe { x86::weighted_values(o, hd, s, n, j - lo, &run[g * hd..], kv_dim, c) };
                    c
                }
            };
            j += c;
        }
        for (i, row) in out.chunks_exact_mut(row_len).enumerate() {
            let dst = &mut row[g * kv_mul * hd..][..kv_mul * hd];
            for (h, d) in dst.chunks_exact_mut(hd).enumerate() {
                let (src, inv) = (&o[(i * kv_mul + h) * hd..][..hd], inv_sum[i * kv_mul + h]);
                d.iter_mut().zip(src).for_each(|(d, x)| *d = x * inv);
            }
        }
    }
}

/// [`HeadKernels`] for [`super::attend_group`] (one query row) on AVX-512: where the query
/// heads that share a KV head come in fours (kv_mul a multiple of 4: Gemma 3's MQA, Llama 3's
/// GQA) and head_dim is a multiple of 16, they take the tile's products, four query vectors by
/// four keys ([`x86::scores`]) and by 64 value columns ([`x86::weighted_values`]): each key and
/// value is loaded once for all of them, 16 lanes wide, where [`simd::Avx512Heads`] reads it
/// once per pair of heads (once per head above head_dim 8). Other shapes as
/// [`simd::Avx512Heads`]. Only for code that runs after [`simd::isa`] reported AVX-512.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512Tiles;

/// Whether `len` floats of queries (or outputs) of `hd` each are whole blocks of four heads
/// the tile's products take.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn in_fours(len: usize, hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(16) && (len / hd).is_multiple_of(4)
}

#[cfg(target_arch = "x86_64")]
impl HeadKernels for Avx512Tiles {
    type MulAdd = <simd::Avx512Heads as HeadKernels>::MulAdd;
    #[inline(always)]
    fn dot_rows(s: &mut [f32], q: &[f32], x: &[f32], stride: usize) {
        simd::Avx512Heads::dot_rows(s, q, x, stride)
    }
    #[inline(always)]
    fn axpy_rows(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) {
        simd::Avx512Heads::axpy_rows(y, a, x, stride)
    }
    #[inline(always)]
    fn dot_rows2(s: [&mut [f32]; 2], q: [&[f32]; 2], x: &[f32], stride: usize) {
        simd::Avx512Heads::dot_rows2(s, q, x, stride)
    }
    #[inline(always)]
    fn axpy_rows2(y: [&mut [f32]; 2], a: [&[f32]; 2], x: &[f32], stride: usize) {
        simd::Avx512Heads::axpy_rows2(y, a, x, stride)
    }
    #[inline(always)]
    fn dot_heads(
        s: &mut [f32],
        n: usize,
        cols: std::ops::Range<usize>,
        q: &[f32],
        hd: usize,
        x: &[f32],
        stride: usize,
    ) {
        if !in_fours(q.len(), hd) {
            return simd::Avx512Heads::dot_heads(s, n, cols, q, hd, x, stride);
        }
        debug_assert!(is_x86_feature_detected!("avx512f"));
        // SAFETY: Avx512Tiles runs only in the attention kernel compiled for AVX-512, which
        // runs only where isa() found AVX-512F; `scores` checks the shapes itself.
        unsafe { x86::scores(s, n, cols.start, q, hd, x, stride, cols.len()) }
    }
    #[inline(always)]
    fn axpy_heads(
        y: &mut [f32],
        hd: usize,
        a: &[f32],
        n: usize,
        cols: std::ops::Range<usize>,
        x: &[f32],
        stride: usize,
    ) {
        if !in_fours(y.len(), hd) {
            return simd::Avx512Heads::axpy_heads(y, hd, a, n, cols, x, stride);
        }
        // SAFETY: as for dot_heads; `weighted_values` checks the shapes itself.
        unsafe { x86::weighted_values(y, hd, a, n, cols.start, x, stride, cols.len()) }
    }
    #[inline(always)]
    fn f16_heads(kv_mul: usize, hd: usize) -> bool {
        in_fours(kv_mul * hd, hd)
    }
    #[inline(always)]
    fn dot_heads_f16(
        s: &mut [f32],
        n: usize,
        cols: std::ops::Range<usize>,
        q: &[f32],
        hd: usize,
        x: &[u16],
        stride: usize,
    ) {
        assert!(in_fours(q.len(), hd), "dot_heads_f16: heads not in fours");
        // SAFETY: as for dot_heads.
        unsafe { x86::scores(s, n, cols.start, q, hd, x, stride, cols.len()) }
    }
    #[inline(always)]
    fn axpy_heads_f16(
        y: &mut [f32],
        hd: usize,
        a: &[f32],
        n: usize,
        cols: std::ops::Range<usize>,
        x: &[u16],
        stride: usize,
    ) {
        assert!(in_fours(y.len(), hd), "axpy_heads_f16: heads not in fours");
        // SAFETY: as for dot_heads.
        unsafe { x86::weighted_values(y, hd, a, n, cols.start, x, stride, cols.len()) }
    }
}

/// The tile's two products with AVX-512F.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// What the products read keys and values as: f32, or f16 bits (an f16 cache's rows as
    /// stored), 16 at a time as f32 ([`load16`]); the arithmetic is the same for both.
    pub(crate) trait Elem: Copy {
        const F16: bool;
    }
    impl Elem for f32 {
        const F16: bool = false;
    }
    impl Elem for u16 {
        const F16: bool = true;
    }

    /// The 16 elements at p as f32 (f16 converted exactly by `vcvtph2ps`).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; p must point to 16 readable elements.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16<T: Elem>(p: *const T) -> __m512 {
        // SAFETY: 16 elements at p (the caller's contract).
        unsafe {
            if T::F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
            } else {
                _mm512_loadu_ps(p.cast())
            }
        }
    }

    /// How far ahead of the key or value row being read the products prefetch the same columns:
    /// the rows that follow in memory ~64 KiB on (a few runs of [`super::super::run_rows`]
    /// away in a contiguous cache). A decode step reads each key and value once, from memory,
    /// in runs of a few rows of a few lines each, which the hardware prefetchers alone follow
    /// too late (Gemma 3's global layers at 32k positions: ~12 GB/s without this). The distance
    /// is in bytes of rows, so a KV head's few lines of a wide row (Llama 3's 8 KV heads: 128
    /// of a row's 1,024 bytes) are fetched as many rows ahead as its work needs: on the 2-core
    /// Xeon, the Llama-3.2-1B shape's attention at 32,768 positions took ~72 ms a step with
    /// 16 KiB and ~55–60 ms with 32 to 512 KiB, Gemma 3 270M's the same with 16 or 64 KiB
    /// (the contiguous cache; in the paged pool, 16-row blocks of 1 KiB rows, 64 KiB ahead is
    /// 4 blocks on, where a block table may point anywhere: not measured there).
    /// Past the end of the cache, or of a block, the prefetch is a wasted hint, never a fault.
    #[inline(always)]
    fn rows_ahead<T>(stride: usize) -> usize {
        ((64 << 10) / (stride * size_of::<T>()).max(1)).max(1)
    }

    /// s[i·n + col0 + b] = q_i · k_b for every query vector i of q (m_pad, hd), m_pad a multiple
    /// of 4, and key b in 0..c, k_b = k[b·stride..][..hd]: four query vectors by four keys per
    /// pass ([`dot4x4`]), prefetching each key's columns [`rows_ahead`] rows on.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(clippy::too_many_arguments)] // one call site; the shapes are the arguments
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores<T: Elem>(
        s: &mut [f32],
        n: usize,
        col0: usize,
        q: &[f32],
        hd: usize,
        k: &[T],
        stride: usize,
        c: usize,
    ) {
        let m_pad = q.len() / hd;
        assert!(hd.is_multiple_of(16) && m_pad.is_multiple_of(4) && col0 + c <= n);
        assert!(s.len() >= m_pad * n, "scores: s is smaller than (m_pad, n)");
        assert!(
            c == 0 || k.len() >= (c - 1) * stride + hd,
            "scores: k holds fewer than c keys"
        );
        let ahead = rows_ahead::<T>(stride) * stride;
        let mut b = 0;
        while b < c {
            let nk = (c - b).min(4);
            for i in 0..nk {
                let row = k.as_ptr().wrapping_add((b + i) * stride + ahead);
                crate::quant::prefetch(row.cast(), hd * size_of::<T>());
            }
            // A pass of fewer than four keys repeats its last key; those lanes are not stored.
            // SAFETY: key b + min(i, nk − 1) < c starts at most (c − 1)·stride, and
            // (c − 1)·stride + hd ≤ k.len() (asserted above).
            let keys: [*const T; 4] =
                std::array::from_fn(|i| unsafe { k.as_ptr().add((b + i.min(nk - 1)) * stride) });
            for mb in (0..m_pad).step_by(4) {
                // SAFETY: rows mb..mb + 4 ≤ m_pad of q are (4, hd) at q[mb·hd..]; the keys as
                // above; the CPU has AVX-512F (this function's contract).
                let lanes = unsafe { dot4x4(q.as_ptr().add(mb * hd), hd, keys) };
                // Four keys: each head's four scores stored straight from the vector (a
                // copy of a run-time length calls memmove, which cost ~20% of a decode row's
                // attention on the Llama-3.2-1B shape with its cache in L2).
                if nk == 4 {
                    // SAFETY: s[(mb + i)·n + col0 + b..][..4] lies inside s: mb + i < m_pad,
                    // col0 + b + 4 ≤ col0 + c ≤ n and s.len() ≥ m_pad·n (asserted above).
                    unsafe {
                        let base = s.as_mut_ptr();
                        let at = |i: usize| base.add((mb + i) * n + col0 + b);
                        _mm_storeu_ps(at(0), _mm512_castps512_ps128(lanes));
                        _mm_storeu_ps(at(1), _mm512_extractf32x4_ps::<1>(lanes));
                        _mm_storeu_ps(at(2), _mm512_extractf32x4_ps::<2>(lanes));
                        _mm_storeu_ps(at(3), _mm512_extractf32x4_ps::<3>(lanes));
                    }
                } else {
                    let mut l = [0.0f32; 16];
                    // SAFETY: `l` holds 16 floats; the CPU has AVX-512F.
                    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), lanes) };
                    for i in 0..4 {
                        s[(mb + i) * n + col0 + b..][..nk].copy_from_slice(&l[4 * i..][..nk]);
                    }
                }
            }
            b += nk;
        }
    }

    /// The 16 dot products of four query vectors (4, hd) at `q` with four keys of hd floats:
    /// lane 4i + b = q_i · k_b, each an FMA chain of 16 lanes over hd then [`sum16`]'s tree.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `q` must hold 4·hd floats and each key hd, hd a multiple
    /// of 16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot4x4<T: Elem>(q: *const f32, hd: usize, k: [*const T; 4]) -> __m512 {
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut d = 0;
        while d < hd {
            // SAFETY: d + 16 ≤ hd, inside each query vector and key (the caller's contract).
            unsafe {
                let kv: [__m512; 4] = std::array::from_fn(|b| load16(k[b].add(d)));
                for i in 0..4 {
                    let qv = _mm512_loadu_ps(q.add(i * hd + d));
                    for b in 0..4 {
                        acc[4 * i + b] = _mm512_fmadd_ps(qv, kv[b], acc[4 * i + b]);
                    }
                }
            }
            d += 16;
        }
        // SAFETY: the CPU has AVX-512F (this function's contract).
        unsafe { sum16(acc) }
    }

    /// Lane i of the result = Σ of acc[i]'s 16 lanes, for every i at once in 45 shuffles and
    /// adds: each 128-bit quarter (e0..e3) folds to (e0 + e2) + (e1 + e3), then the quarters
    /// (Q0 + Q1) + (Q2 + Q3), the same tree for every i.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum16(acc: [__m512; 16]) -> __m512 {
        // Pairs: per quarter [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
        let t: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (acc[2 * i], acc[2 * i + 1]);
            _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
        });
        // Fours: per quarter the folded quarter of acc[4g..4g + 4].
        let u: [__m512; 4] = std::array::from_fn(|g| {
            let (a, b) = (t[2 * g], t[2 * g + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(a, b),
                _mm512_shuffle_ps::<0xEE>(a, b),
            )
        });
        // Quarters 0 + 1 and 2 + 3 of u[2h] and u[2h + 1].
        let w: [__m512; 2] = std::array::from_fn(|h| {
            let (a, b) = (u[2 * h], u[2 * h + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            )
        });
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(w[0], w[1]),
            _mm512_shuffle_f32x4::<0xDD>(w[0], w[1]),
        )
    }

    /// o (m_pad, hd) += P V over keys 0..c: o_i += Σ_b s[i·n + col0 + b]·v_b, v_b =
    /// v[b·stride..][..hd], four query vectors by up to 64 columns per pass, each output
    /// element one FMA chain over b in order.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(clippy::too_many_arguments)] // one call site; the shapes are the arguments
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_values<T: Elem>(
        o: &mut [f32],
        hd: usize,
        s: &[f32],
        n: usize,
        col0: usize,
        v: &[T],
        stride: usize,
        c: usize,
    ) {
        let m_pad = o.len() / hd;
        assert!(hd.is_multiple_of(16) && m_pad.is_multiple_of(4) && col0 + c <= n);
        assert!(
            s.len() >= m_pad * n,
            "weighted_values: s is smaller than (m_pad, n)"
        );
        if c == 0 {
            return;
        }
        assert!(
            v.len() >= (c - 1) * stride + hd,
            "weighted_values: v holds fewer than c rows"
        );
        let chunks = hd / 16;
        for cb in (0..chunks).step_by(4) {
            for mb in (0..m_pad).step_by(4) {
                // SAFETY: rows mb..mb + 4 of o and of s exist (m_pad rows, asserted), columns
                // 16·cb.. + 16·w ≤ hd of o and of every value row b < c (asserted above), and
                // s's columns col0..col0 + c ≤ n; the CPU has AVX-512F.
                unsafe {
                    let (o, s) = (o.as_mut_ptr().add(mb * hd + cb * 16), s.as_ptr());
                    let (s, v) = (s.add(mb * n + col0), v.as_ptr().add(cb * 16));
                    // The first pass prefetches whole rows: the later ones read them again.
                    let pf = if cb == 0 && mb == 0 { hd } else { 0 };
                    match chunks - cb {
                        1 => pv4::<1, T>(o, hd, s, n, v, stride, c, pf),
                        2 => pv4::<2, T>(o, hd, s, n, v, stride, c, pf),
                        3 => pv4::<3, T>(o, hd, s, n, v, stride, c, pf),
                        _ => pv4::<4, T>(o, hd, s, n, v, stride, c, pf),
                    }
                }
            }
        }
    }

    /// Four rows of o (stride hd), W chunks of 16 columns, += Σ_b s_i[b]·v_b over b in 0..c,
    /// s_i = s[i·n..], v_b = v[b·stride..]: 4·W accumulators in registers. Prefetches the first
    /// `pf` elements of each row [`rows_ahead`] rows on (0: none).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; the four rows of o and of s and c rows of v must hold
    /// what is read and written.
    #[allow(clippy::too_many_arguments)] // one caller; the shapes are the arguments
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pv4<const W: usize, T: Elem>(
        o: *mut f32,
        hd: usize,
        s: *const f32,
        n: usize,
        v: *const T,
        stride: usize,
        c: usize,
        pf: usize,
    ) {
        let ahead = rows_ahead::<T>(stride) * stride;
        // SAFETY: every pointer stays within what the caller's contract gives.
        unsafe {
            let mut acc: [[__m512; W]; 4] = std::array::from_fn(|i| {
                std::array::from_fn(|w| _mm512_loadu_ps(o.add(i * hd + 16 * w)))
            });
            for b in 0..c {
                if pf > 0 {
                    let row = v.wrapping_add(b * stride + ahead);
                    crate::quant::prefetch(row.cast(), pf * size_of::<T>());
                }
                let vb: [__m512; W] = std::array::from_fn(|w| load16(v.add(b * stride + 16 * w)));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*s.add(i * n + b));
                    for w in 0..W {
                        acc[w] = _mm512_fmadd_ps(p, vb[w], acc[w]);
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                for (w, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(o.add(i * hd + 16 * w), *a);
                }
            }
        }
    }
}

/// [`x86::scores`] for the tests (which check that AVX-512 is there).
#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(super) fn test_scores(
    s: &mut [f32],
    n: usize,
    col0: usize,
    q: &[f32],
    hd: usize,
    k: &[f32],
    stride: usize,
    c: usize,
) {
    assert!(available(hd));
    // SAFETY: available() checked that the CPU has AVX-512F.
    unsafe { x86::scores(s, n, col0, q, hd, k, stride, c) }
}

/// [`x86::weighted_values`] for the tests (which check that AVX-512 is there).
#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(super) fn test_weighted_values(
    o: &mut [f32],
    hd: usize,
    s: &[f32],
    n: usize,
    col0: usize,
    v: &[f32],
    stride: usize,
    c: usize,
) {
    assert!(available(hd));
    // SAFETY: available() checked that the CPU has AVX-512F.
    unsafe { x86::weighted_values(o, hd, s, n, col0, v, stride, c) }
}

/// [`x86::sum16`]'s tree for one vector, in scalar code: each quarter (e0..e3) as
/// (e0 + e2) + (e1 + e3), then (Q0 + Q1) + (Q2 + Q3).
#[cfg(test)]
pub(super) fn sum16_scalar(x: &[f32; 16]) -> f32 {
    let q = |k: usize| (x[4 * k] + x[4 * k + 2]) + (x[4 * k + 1] + x[4 * k + 3]);
    (q(0) + q(1)) + (q(2) + q(3))
}
