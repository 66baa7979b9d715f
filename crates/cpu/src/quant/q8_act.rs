//! `y (t, n) = x (t, k) @ Wᵀ` for quantized W (Q8_0, Q5_0, Q4_K, Q6_K) with the activations
//! rounded to 8 bits and integer dot products (AVX-512 VNNI `vpdpbusd`): llama.cpp's way with
//! quantized weights, and kvlab's with `--activations q8`.
//!
//! **The activations** ([`Q8Rows`]): each token row of x is cut into blocks of 32 and rounded
//! as ggml's `quantize_row_q8_0` does, with an f32 scale: d = max|x| / 127, q = round(x / d)
//! (ties to even), so x ≈ d·q with |x − d·q| ≤ d/2 per element; a block holding a NaN or an
//! infinity gets d = NaN, so the rows it feeds come out NaN.
//!
//! **The weights** are read in place as unsigned 8-bit codes u with the format's own scales,
//! w = a·(u − o) − c:
//!
//! | format | u | o | a (per) | c (per 32) |
//! | --- | --- | --- | --- | --- |
//! | Q8_0 | q + 128 | 128 | d (32) | 0 |
//! | Q5_0 | the 5-bit code | 16 | d (32) | 0 |
//! | Q6_K | the 6-bit code | 32 | d·scale (16) | 0 |
//! | Q4_K | the nibble | 0 | d·sc (32) | dmin·m |
//!
//! **The product**, for 64 weights (one zmm) of a row and one token: `vpdpbusd` sums u·q over
//! each 4 bytes into 16 i32 lanes, starting from −o times the lane's Σq, so the lane holds
//! Σ (u − o)·q exactly; it is converted once and multiplied by a·d:
//! acc += f32(P) · (a·d). Q4_K's minimum adds −Σ_j c_j·(d_j·Σq_j) once per super-block. Per
//! (row, token) and 64 weights that is four instructions (the dot product, a conversion, a
//! multiply, an FMA) where the f32 path ([`super::few_rows`]) needs four FMAs, reading a
//! quarter of the bytes of x; a pass is [`ROWS`] rows × [`TOKENS`] tokens, each unit of W
//! unpacked once per pass.
//!
//! The result differs from the f32 path by the rounding of x: at most Σ_j |w_j|·d_j/2 for a
//! row (tested). A token's output depends only on that token (its own blocks and scales, summed
//! in the same order whatever t is), so a row is the same in every batch. [`reference()`] is the
//! plain loop the kernel is tested against.
//!
//! **On AMX.** Where the CPU has AMX-INT8 (Sapphire Rapids and later), Q8_0 goes to [`amx`]
//! instead, for every t (so that a row stays the same in every batch): 16 W rows × 16 tokens
//! of a block per `tdpbssd`, each block's i32 sum scaled once. Its sums are rounded per block
//! rather than per 4 weights, so its bits differ from this kernel's within the same bound.
//! Q5_0 goes to the tiles too (each 16 rows rewritten as Q8_0) for more than 4 tokens, and to
//! [`block_sums`] for at most 4 (a decode step, where rewriting rows for one token's products
//! costs more than it saves): the tiles' formula with `vpdpbusd`, the same bits, so that the
//! choice by t never shows in a row's output.

use kvlab_model::GgmlType;
use kvlab_model::weights::QUANTIZED;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod block_sums;

/// Activations per scale.
pub const QK: usize = 32;
/// W rows per pass.
pub const ROWS: usize = 4;
/// Tokens per pass.
pub const TOKENS: usize = 4;

/// Token rows of x rounded to 8 bits in blocks of [`QK`], with what the kernel reads beside
/// them. Each row is padded with zeros to a multiple of 64 columns (`kp`).
#[derive(Default)]
pub struct Q8Rows {
    /// Token rows.
    t: usize,
    /// Columns of x.
    k: usize,
    /// Columns per row here: k rounded up to 64.
    kp: usize,
    /// (kp / 64, t, 64): q, chunk-major, so the tokens of a pass lie at fixed offsets.
    qs: Vec<i8>,
    /// (kp / 64, t, 16): −Σ of each 4 consecutive q (one `vpdpbusd` lane's).
    nls: Vec<i32>,
    /// (kp / 64, t, 16): the scale d of each 4 consecutive q's block.
    dl: Vec<f32>,
    /// (t, kp / 32): d·Σq of each block.
    hs: Vec<f32>,
    /// (kp,), (kp / 4,), (kp / 4,): one token's q, −Σ and d before they are spread out.
    row: (Vec<i8>, Vec<i32>, Vec<f32>),
}

impl Q8Rows {
    /// Rounds t rows of k columns of `x` (row-major; k a multiple of [`QK`]) into `self`,
    /// reusing its buffers.
    ///
    /// # Panics
    /// If k is not a multiple of [`QK`] or x is shorter than t·k.
    pub fn quantize(&mut self, x: &[f32], t: usize, k: usize) {
        assert!(
            k.is_multiple_of(QK) && x.len() >= t * k,
            "Q8Rows::quantize: shape"
        );
        let kp = k.next_multiple_of(64);
        self.t = t;
        self.k = k;
        self.kp = kp;
        self.qs.clear();
        self.qs.resize(t * kp, 0);
        self.nls.clear();
        self.nls.resize(t * kp / 4, 0);
        self.dl.clear();
        self.dl.resize(t * kp / 4, 0.0);
        self.hs.clear();
        self.hs.resize(t * kp / QK, 0.0);
        self.row.0.resize(kp, 0);
        self.row.1.resize(kp / 4, 0);
        self.row.2.resize(kp / 4, 0.0);
        for i in 0..t {
            let row = Row {
                qs: &mut self.row.0,
                nls: &mut self.row.1,
                dl: &mut self.row.2,
                hs: &mut self.hs[i * kp / QK..][..kp / QK],
            };
            row.fill(&x[i * k..][..k]);
            for c in 0..kp / 64 {
                let at = c * t + i;
                let last = (c + 1) * 64 > k; // the padding: zeros past k
                let (q, n, d) = (
                    &self.row.0[64 * c..][..64],
                    &self.row.1[16 * c..][..16],
                    &self.row.2[16 * c..][..16],
                );
                let cols = if last { k - 64 * c } else { 64 };
                self.qs[64 * at..][..cols].copy_from_slice(&q[..cols]);
                self.nls[16 * at..][..cols / 4].copy_from_slice(&n[..cols / 4]);
                self.dl[16 * at..][..cols / 4].copy_from_slice(&d[..cols / 4]);
            }
        }
    }

    /// The rounded value of token i, column j, and its scale: x ≈ d·q.
    pub fn q_and_d(&self, i: usize, j: usize) -> (i8, f32) {
        let at = (j / 64) * self.t + i;
        (self.qs[64 * at + j % 64], self.dl[16 * at + (j % 64) / 4])
    }

    /// Token row i as f32 (d·q): what the kernel multiplies W by.
    pub fn dequantized(&self, i: usize) -> Vec<f32> {
        (0..self.k)
            .map(|j| {
                let (q, d) = self.q_and_d(i, j);
                d * f32::from(q)
            })
            .collect()
    }
}

/// One token's part of each of [`Q8Rows`]' arrays (`kp` columns).
struct Row<'a> {
    qs: &'a mut [i8],
    nls: &'a mut [i32],
    dl: &'a mut [f32],
    hs: &'a mut [f32],
}

impl Row<'_> {
    /// Rounds the k floats of `x` into this row (whose padding stays zero): with AVX-512 where
    /// the CPU has it, else [`Row::fill_reference`]; the same bits either way (tested).
    fn fill(self, x: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            // SAFETY: the features are checked; `quantize` sized the arrays for kp ≥ k columns.
            unsafe { self.fill_avx512(x) };
            return;
        }
        self.fill_reference(x);
    }

    /// The plain loop: [`round_block`] per block, then the lane sums and block sums.
    fn fill_reference(self, x: &[f32]) {
        for (b, (xb, qb)) in x
            .chunks_exact(QK)
            .zip(self.qs.chunks_exact_mut(QK))
            .enumerate()
        {
            let d = round_block(xb, qb);
            let mut sum = 0;
            for (l, q4) in qb.chunks_exact(4).enumerate() {
                let s: i32 = q4.iter().map(|&q| i32::from(q)).sum();
                self.nls[b * 8 + l] = -s;
                self.dl[b * 8 + l] = d;
                sum += s;
            }
            self.hs[b] = d * sum as f32;
        }
    }

    /// [`Row::fill_reference`] 16 floats at a time: the same maximum, scale, products and
    /// rounding (the CPU's, to nearest even), so the same bits.
    ///
    /// # Safety
    /// AVX-512F and BW; the arrays hold x.len() (a multiple of 32) columns.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_avx512(self, x: &[f32]) {
        let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            // SAFETY: 32 floats of xb; 32 bytes of qs, 8 lanes of nls and dl at block b.
            unsafe {
                let x0 = _mm512_loadu_ps(xb.as_ptr());
                let x1 = _mm512_loadu_ps(xb.as_ptr().add(16));
                let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask));
                let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
                let inf = _mm512_set1_ps(f32::INFINITY);
                // NaN or infinite: not less than infinity, or unordered.
                let bad = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a0, inf)
                    | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a1, inf);
                let (d, q) = if bad != 0 {
                    (f32::NAN, _mm512_setzero_si512())
                } else {
                    let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
                    let d = amax / 127.0;
                    let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
                    let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
                    let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
                    let lo = _mm512_castsi128_si512(_mm512_cvtsepi32_epi8(q0));
                    let q = _mm512_inserti32x4::<1>(lo, _mm512_cvtsepi32_epi8(q1));
                    (d, q)
                };
                _mm256_storeu_si256(
                    self.qs.as_mut_ptr().add(QK * b).cast(),
                    _mm512_castsi512_si256(q),
                );
                // Σ of each 4 bytes: a dot product with ones, as the kernel's lanes group them.
                let s = _mm512_maddubs_epi16(_mm512_set1_epi8(1), q);
                let s = _mm512_madd_epi16(s, _mm512_set1_epi16(1));
                let s = _mm512_castsi512_si256(s);
                _mm256_storeu_si256(
                    self.nls.as_mut_ptr().add(8 * b).cast(),
                    _mm256_sub_epi32(_mm256_setzero_si256(), s),
                );
                _mm256_storeu_ps(self.dl.as_mut_ptr().add(8 * b), _mm256_set1_ps(d));
                let sum = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(s));
                self.hs[b] = d * sum as f32;
            }
        }
    }
}

/// Rounds one block of [`QK`] floats into `q`; returns its scale d (NaN if the block holds a
/// NaN or an infinity, q then all zero).
fn round_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, &v| {
        if v.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    if !amax.is_finite() {
        q.fill(0);
        return f32::NAN;
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        // |v·id| ≤ 127 up to rounding, and `as` saturates.
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// Whether this CPU runs the kernel for `ty` (AVX-512F, BW and VNNI, and a format it reads).
pub fn available(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        QUANTIZED.contains(&ty)
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// y\[i·ldy + j\] = Σ_κ x̂\[i\]\[κ\] · W\[j\]\[κ\] for i < t = x's rows, j < n: the n rows of
/// `w` = (type, bytes), each x.k weights, against the rounded activations x̂ = d·q.
///
/// # Safety
/// `y` is valid to write at i·ldy + j for i < t, j < n, and no other thread accesses those
/// elements during the call.
///
/// # Panics
/// If [`available`] is false for `ty`, `w` is not n rows of x.k weights of `ty`, or ldy < n.
pub unsafe fn rows_raw(y: *mut f32, ldy: usize, x: &Q8Rows, (ty, w): (GgmlType, &[u8]), n: usize) {
    assert!(available(ty), "q8_act: no kernel for {ty} on this CPU");
    let k = x.k;
    let whole = k.is_multiple_of(ty.block_size());
    let rb = k / ty.block_size() * ty.type_size();
    assert!(
        whole && w.len() == n * rb && ldy >= n,
        "q8_act: shape mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F/BW/VNNI and the format are checked (available), the shapes asserted,
    // and y is the caller's to write.
    unsafe {
        let p = (y, ldy, x, w.as_ptr(), rb, n);
        match ty {
            GgmlType::Q8_0 if amx::available() => amx::rows_q8_0(y, ldy, x, w.as_ptr(), rb, n),
            GgmlType::Q8_0 => rows::<vnni::Q8_0>(p),
            // Tiles for many tokens, their formula with vpdpbusd for a few: the same bits.
            GgmlType::Q5_0 if amx::available() && x.t <= block_sums::MAX_TOKENS => {
                block_sums::rows_q5_0(y, ldy, x, w.as_ptr(), rb, n)
            }
            GgmlType::Q5_0 if amx::available() => amx::rows_q5_0(y, ldy, x, w.as_ptr(), rb, n),
            GgmlType::Q5_0 => rows::<vnni::Q5_0>(p),
            GgmlType::Q4_K => rows::<vnni::Q4K>(p),
            _ => rows::<vnni::Q6K>(p),
        }
    }
}

/// The plain loop: W's rows decoded by the reference, x rounded as [`Q8Rows`] does, each
/// (token, row) dot product summed in f64.
pub fn reference(ty: GgmlType, y: &mut [f32], ldy: usize, x: &Q8Rows, w: &[u8], n: usize) {
    let k = x.k;
    let rb = w.len().checked_div(n).unwrap_or(0);
    let mut row = vec![0.0; k];
    let xs: Vec<Vec<f32>> = (0..x.t).map(|i| x.dequantized(i)).collect();
    for j in 0..n {
        super::decode_rows_reference(ty, &w[j * rb..][..rb], &mut row);
        for (i, xi) in xs.iter().enumerate() {
            let s: f64 = row
                .iter()
                .zip(xi)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            y[i * ldy + j] = s as f32;
        }
    }
}

/// (y, ldy, x, w, bytes per row, n) of [`rows_raw`].
#[cfg(target_arch = "x86_64")]
type Call<'a> = (*mut f32, usize, &'a Q8Rows, *const u8, usize, usize);

/// A panel of up to [`ROWS`] rows of W unpacked once ([`unpack`]) and read by every token pass:
/// unpacking a Q5_0 chunk takes about as many instructions as multiplying it into 8 tokens.
#[cfg(target_arch = "x86_64")]
struct Panel {
    /// Columns per row (x's kp).
    kp: usize,
    /// (ROWS, kp): the codes u (empty where the passes unpack in registers).
    u: Vec<u8>,
    /// (ROWS, kp / 4): a of each 4 codes (empty likewise).
    a: Vec<f32>,
    /// (ROWS, kp / 32): the minima c of each block (Q4_K; zero otherwise).
    c: Vec<f32>,
}

/// How far ahead of the unit being unpacked W is prefetched, in bytes.
const PREFETCH_BYTES: usize = 16 << 10;

/// Every pass: the rows in panels of ROWS (the last one's rows one at a time), each panel
/// against TOKENS tokens (or those left) at a time.
///
/// # Safety
/// As [`rows_raw`], its asserts holding.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows<F: vnni::Format>((y, ldy, x, w, rb, n): Call) {
    if x.k == 0 {
        for i in 0..x.t {
            for j in 0..n {
                // SAFETY: the caller's elements.
                unsafe { *y.add(i * ldy + j) = 0.0 };
            }
        }
        return;
    }
    let kp = x.kp;
    // A call of at most TOKENS tokens reads each row once: it unpacks in registers, and keeps
    // only the minima in the panel.
    let direct = x.t <= TOKENS;
    let unpacked = if direct { 0 } else { ROWS * kp };
    let mut panel = Panel {
        kp,
        u: vec![0; unpacked],
        a: vec![0.0; unpacked / 4],
        c: vec![0.0; ROWS * kp / QK],
    };
    /// One pass of R rows (from panel row $r0, or W's row j0 + r0 directly) and T tokens, R
    /// and T as constants.
    macro_rules! pass {
        ($r:expr, $t:expr, $r0:expr, $j0:expr, $i0:expr) => {{
            let out = y.wrapping_add($i0 * ldy + $j0 + $r0);
            // SAFETY: panel rows r0..r0 + R are unpacked (or, directly, rows j0 + r0.. of w
            // exist, r0 = 0 in the panel); tokens i0..i0 + T < t of x exist; y's elements of
            // rows j0 + r0.. and those tokens are the caller's.
            unsafe {
                if direct {
                    let rows = (0, w.add(($j0 + $r0) * rb), rb);
                    pass::<F, { $r }, { $t }, true>(&mut panel, rows, x, $i0, out, ldy)
                } else {
                    let rows = ($r0, w, rb);
                    pass::<F, { $r }, { $t }, false>(&mut panel, rows, x, $i0, out, ldy)
                }
            }
        }};
    }
    /// Dispatches the token count of the pass to its constant.
    macro_rules! tokens {
        ($r:expr, $tt:expr, $r0:expr, $j0:expr, $i0:expr) => {
            match $tt {
                1 => pass!($r, 1, $r0, $j0, $i0),
                2 => pass!($r, 2, $r0, $j0, $i0),
                3 => pass!($r, 3, $r0, $j0, $i0),
                4 => pass!($r, 4, $r0, $j0, $i0),
                5 => pass!($r, 5, $r0, $j0, $i0),
                6 => pass!($r, 6, $r0, $j0, $i0),
                7 => pass!($r, 7, $r0, $j0, $i0),
                _ => pass!($r, TOKENS, $r0, $j0, $i0),
            }
        };
    }
    const _: () = assert!(TOKENS <= 8, "the dispatch above goes up to 8 tokens");
    for j0 in (0..n).step_by(ROWS) {
        let here = ROWS.min(n - j0);
        for r in 0..here * usize::from(!direct) {
            // SAFETY: row j0 + r < n of w is rb bytes of whole blocks of F (asserted).
            unsafe { unpack::<F>(w.add((j0 + r) * rb), rb, x.k, &mut panel, r) };
        }
        for i0 in (0..x.t).step_by(TOKENS) {
            let tt = TOKENS.min(x.t - i0);
            if here == ROWS {
                tokens!(ROWS, tt, 0, j0, i0);
            } else {
                for r in 0..here {
                    tokens!(1, tt, r, j0, i0);
                }
            }
        }
    }
}

/// Row `w` (rb bytes, k weights) of F into row r of the panel: every unit's codes, scales and
/// minima through [`vnni::Format`]; a Q8_0 or Q5_0 row of an odd number of blocks ends with
/// its last block beside a zero block (scale 0), which fills the padding to kp.
///
/// # Safety
/// AVX-512F/BW; rb readable bytes at w, whole blocks of F; r < ROWS.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack<F: vnni::Format>(w: *const u8, rb: usize, k: usize, p: &mut Panel, r: usize) {
    let units = k / F::UNIT;
    let chunks = F::UNIT / 64;
    let (u, a) = (
        &mut p.u[r * p.kp..][..p.kp],
        &mut p.a[r * p.kp / 4..][..p.kp / 4],
    );
    let c = &mut p.c[r * p.kp / QK..][..p.kp / QK];
    let mut pad = [0u8; 256];
    let done = units * F::UNIT_BYTES;
    for unit in 0..units + usize::from(done < rb) {
        let b = if unit < units {
            let b = w.wrapping_add(unit * F::UNIT_BYTES);
            // W streams from memory once per call: ask for it well ahead (a decode step is
            // bound by these reads, as the GEMV kernels are).
            super::prefetch(b.wrapping_add(PREFETCH_BYTES), F::UNIT_BYTES);
            b
        } else {
            // SAFETY: bytes done..rb of the row lie inside it, and fit the pad (≤ 256).
            let tail = unsafe { std::slice::from_raw_parts(w.add(done), rb - done) };
            pad[..tail.len()].copy_from_slice(tail);
            pad.as_ptr()
        };
        // SAFETY: a whole unit at b (the row's, or the padded tail).
        let prep = unsafe { F::prep(b) };
        for ch in 0..chunks {
            // SAFETY: as above; ch < UNIT / 64.
            let (uu, aa) = unsafe { F::chunk(b, &prep, ch) };
            let at = unit * chunks + ch;
            // SAFETY: chunk `at` < kp / 64 of the panel row (64 codes, 16 scales).
            unsafe {
                _mm512_storeu_si512(u.as_mut_ptr().add(64 * at).cast(), uu);
                _mm512_storeu_ps(a.as_mut_ptr().add(16 * at), aa);
            }
        }
        if F::HAS_MINS {
            c[unit * F::UNIT / QK..][..F::UNIT / QK]
                .copy_from_slice(&F::mins(&prep)[..F::UNIT / QK]);
        }
    }
}

/// y[i·ldy + r] = row r0 + r · token i0 + i of x, for r < R, i < T: the rows read from the
/// panel, or with DIRECT (a call of at most [`TOKENS`] tokens, a decode step) unpacked in
/// registers from `w` (R rows of rb bytes), their minima kept in the panel. Both give the
/// same bits: the same products, summed in the same order.
///
/// # Safety
/// AVX-512F/BW/VNNI; panel rows r0..r0 + R unpacked (or, with DIRECT, R rows at w and
/// r0 = 0); tokens i0..i0 + T of x exist; y writable at i·ldy + r.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
// The register tile acc[r][i] is indexed from two loops.
#[allow(clippy::needless_range_loop)]
unsafe fn pass<F: vnni::Format, const R: usize, const T: usize, const DIRECT: bool>(
    p: &mut Panel,
    (r0, w, rb): (usize, *const u8, usize),
    x: &Q8Rows,
    i0: usize,
    y: *mut f32,
    ldy: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    // DIRECT: the current unit of each row, and its shared part.
    let chunks = F::UNIT / 64;
    let (units, blocks) = (x.k / F::UNIT, p.kp / QK);
    let mut pad = [[0u8; 256]; R];
    let mut blk = [w; R];
    let mut prep = if DIRECT {
        // SAFETY: the caller's contract: R rows at w; unit 0 exists (`rows` returns early
        // for k = 0).
        [unsafe { F::prep(w) }; R]
    } else {
        [F::ZERO; R]
    };
    let kp = p.kp;
    let (u, a) = (p.u[r0 * kp..].as_ptr(), p.a[r0 * kp / 4..].as_ptr());
    // Chunk ch of token i0 + i is piece ch·t + i0 + i of qs, nls and dl.
    let (qs, nls, dl) = (
        x.qs[i0 * 64..].as_ptr(),
        x.nls[i0 * 16..].as_ptr(),
        x.dl[i0 * 16..].as_ptr(),
    );
    let shift = _mm512_set1_epi32(F::OFFSET_SHIFT.unwrap_or(0) as i32);
    for ch in 0..kp / 64 {
        let mut ur = [_mm512_setzero_si512(); R];
        let mut ar = [_mm512_setzero_ps(); R];
        if DIRECT {
            let unit = ch / chunks;
            if ch % chunks == 0 {
                for r in 0..R {
                    let row = w.wrapping_add(r * rb);
                    blk[r] = if unit < units {
                        let b = row.wrapping_add(unit * F::UNIT_BYTES);
                        super::prefetch(b.wrapping_add(PREFETCH_BYTES), F::UNIT_BYTES);
                        b
                    } else {
                        // The padded tail, as `unpack` makes it.
                        let done = units * F::UNIT_BYTES;
                        // SAFETY: bytes done..rb of row r lie inside it, and fit the pad.
                        let tail = unsafe { std::slice::from_raw_parts(row.add(done), rb - done) };
                        pad[r][..tail.len()].copy_from_slice(tail);
                        pad[r].as_ptr()
                    };
                    // SAFETY: a whole unit at blk[r].
                    prep[r] = unsafe { F::prep(blk[r]) };
                    if F::HAS_MINS {
                        let c = &mut p.c[r * blocks + unit * F::UNIT / QK..][..F::UNIT / QK];
                        c.copy_from_slice(&F::mins(&prep[r])[..F::UNIT / QK]);
                    }
                }
            }
            for r in 0..R {
                // SAFETY: as above; ch % chunks < UNIT / 64.
                (ur[r], ar[r]) = unsafe { F::chunk(blk[r], &prep[r], ch % chunks) };
            }
        } else {
            for r in 0..R {
                // SAFETY: chunk ch of panel row r0 + r.
                unsafe {
                    ur[r] = _mm512_loadu_si512(u.add(r * kp + 64 * ch).cast());
                    ar[r] = _mm512_loadu_ps(a.add(r * kp / 4 + 16 * ch));
                }
            }
        }
        let piece = ch * x.t;
        for i in 0..T {
            // SAFETY: piece ch·t + i0 + i exists for i < T (the caller's tokens).
            let (q, bias, d) = unsafe {
                let q = _mm512_loadu_si512(qs.add(64 * (piece + i)).cast());
                let bias = match F::OFFSET_SHIFT {
                    Some(_) => _mm512_sllv_epi32(
                        _mm512_loadu_si512(nls.add(16 * (piece + i)).cast()),
                        shift,
                    ),
                    None => _mm512_setzero_si512(),
                };
                (q, bias, _mm512_loadu_ps(dl.add(16 * (piece + i))))
            };
            for r in 0..R {
                let p = _mm512_dpbusd_epi32(bias, ur[r], q);
                let s = _mm512_mul_ps(ar[r], d);
                acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][i]);
            }
        }
    }
    if F::HAS_MINS {
        // −Σ_b c_b·(d_b·Σq_b): 16 blocks at a time, the last group masked.
        for g in (0..blocks).step_by(16) {
            let m: __mmask16 = if blocks - g >= 16 {
                0xFFFF
            } else {
                (1 << (blocks - g)) - 1
            };
            for r in 0..R {
                // SAFETY: blocks g.. (masked to the row) of panel row r0 + r and of each token.
                let c = unsafe { _mm512_maskz_loadu_ps(m, p.c[(r0 + r) * blocks + g..].as_ptr()) };
                for i in 0..T {
                    // SAFETY: as above, token i0 + i's blocks.
                    let h =
                        unsafe { _mm512_maskz_loadu_ps(m, x.hs[(i0 + i) * blocks + g..].as_ptr()) };
                    acc[r][i] = _mm512_fnmadd_ps(c, h, acc[r][i]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (i, v) in acc.iter().enumerate() {
            // SAFETY: the caller's contract for i < T, r < R.
            unsafe { *y.add(i * ldy + r) = _mm512_reduce_add_ps(*v) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::*;
    use crate::quant::decode::avx512::{self as decode, Chunks};

    /// A weight format read as codes and scales, w = a·(u − o) − c (see the module's table).
    ///
    /// # Safety
    /// `prep` and `chunk` need AVX-512F/BW and nothing more, and read only the unit's bytes.
    pub unsafe trait Format {
        /// Weights per unit (a multiple of 64): two blocks of Q8_0 and Q5_0, a K-quant's
        /// super-block.
        const UNIT: usize;
        /// Bytes per unit (≤ 256).
        const UNIT_BYTES: usize;
        /// o = 1 << OFFSET_SHIFT, or no offset.
        const OFFSET_SHIFT: Option<u32>;
        /// Whether the format has minima c (then [`Format::mins`] gives them).
        const HAS_MINS: bool = false;
        /// What the unit's chunks share (its scales), computed once per unit.
        type Prep: Copy;
        /// A placeholder Prep (never read).
        const ZERO: Self::Prep;
        /// The unit's shared part.
        ///
        /// # Safety
        /// AVX-512F/BW; UNIT_BYTES bytes readable at b.
        unsafe fn prep(b: *const u8) -> Self::Prep;
        /// Weights 64c .. 64c + 64 of the unit: their codes u, and a for each 4 of them.
        ///
        /// # Safety
        /// As [`Format::prep`], `prep` being the unit's, c < UNIT / 64.
        unsafe fn chunk(b: *const u8, prep: &Self::Prep, c: usize) -> (__m512i, __m512);
        /// c_j of the unit's 32-weight sub-blocks (UNIT / 32 ≤ 8 of them), zero above.
        fn mins(_: &Self::Prep) -> [f32; 8] {
            [0.0; 8]
        }
    }

    /// a's lanes 0..8 from d0 and 8..16 from d1.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn halves(d0: f32, d1: f32) -> __m512 {
        let lo = _mm512_castps_pd(_mm512_set1_ps(d0));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            lo,
            _mm256_castps_pd(_mm256_set1_ps(d1)),
        ))
    }

    /// [`halves`] of two f16 scales given as their bits, converted in one instruction
    /// (`vcvtph2ps`, exact: every f16 is an f32).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn halves_f16(d0: u16, d1: u16) -> __m512 {
        let lo = _mm256_castsi128_si256(_mm_set1_epi16(d0 as i16));
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(lo, _mm_set1_epi16(d1 as i16)))
    }

    /// The little-endian u16 at b.
    ///
    /// # Safety
    /// Two bytes readable at b.
    #[inline(always)]
    unsafe fn bits(b: *const u8) -> u16 {
        // SAFETY: the caller's contract.
        unsafe { b.cast::<u16>().read_unaligned() }
    }

    /// Q8_0 (34 bytes: `d: f16`, `qs: [i8; 32]`), two blocks a unit: u = qs + 128.
    pub struct Q8_0;

    // SAFETY: AVX-512F/BW; the loads are the unit's two blocks.
    unsafe impl Format for Q8_0 {
        const UNIT: usize = 64;
        const UNIT_BYTES: usize = 68;
        const OFFSET_SHIFT: Option<u32> = Some(7);
        type Prep = ();
        const ZERO: () = ();

        #[inline]
        unsafe fn prep(_: *const u8) {}

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn chunk(b: *const u8, _: &(), _: usize) -> (__m512i, __m512) {
            // SAFETY: block 0 is bytes 0..34, block 1 34..68 (the caller's contract).
            unsafe {
                let q0 = _mm256_loadu_si256(b.add(2).cast());
                let q1 = _mm256_loadu_si256(b.add(36).cast());
                let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
                let u = _mm512_xor_si512(q, _mm512_set1_epi8(-128));
                (u, halves_f16(bits(b), bits(b.add(34))))
            }
        }
    }

    /// Q5_0 (22 bytes: `d: f16`, `qh: u32`, `qs[16]`), two blocks a unit: weight j < 16 of a
    /// block is the low nibble of qs[j] plus 16 if bit j of qh is set, weight j + 16 the high
    /// nibble and bit j + 16.
    pub struct Q5_0;

    // SAFETY: AVX-512F/BW; the loads are the unit's two blocks.
    unsafe impl Format for Q5_0 {
        const UNIT: usize = 64;
        const UNIT_BYTES: usize = 44;
        const OFFSET_SHIFT: Option<u32> = Some(4);
        type Prep = ();
        const ZERO: () = ();

        #[inline]
        unsafe fn prep(_: *const u8) {}

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn chunk(b: *const u8, _: &(), _: usize) -> (__m512i, __m512) {
            // SAFETY: block 0 is bytes 0..22 (qh 2..6, qs 6..22), block 1 22..44.
            unsafe {
                let qs = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_loadu_si128(b.add(6).cast())),
                    _mm_loadu_si128(b.add(28).cast()),
                );
                let nib = _mm256_set1_epi8(0x0F);
                let lo = _mm256_and_si256(qs, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), nib);
                // [lo of block 0, lo of block 1, hi 0, hi 1] → [lo 0, hi 0, lo 1, hi 1].
                let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let u = _mm512_shuffle_i64x2::<0b11_01_10_00>(u, u);
                let qh0 = u64::from(b.add(2).cast::<u32>().read_unaligned());
                let qh1 = u64::from(b.add(24).cast::<u32>().read_unaligned());
                let u = _mm512_mask_add_epi8(u, qh0 | (qh1 << 32), u, _mm512_set1_epi8(16));
                (u, halves_f16(bits(b), bits(b.add(22))))
            }
        }
    }

    /// Q4_K (144 bytes: `d`, `dmin`, `scales[12]`, `qs[128]`): in chunk c, weight l is the low
    /// nibble of qs[32c + l] and weight 32 + l its high nibble, of sub-blocks 2c and 2c + 1;
    /// w = (d·sc)·q − dmin·m.
    pub struct Q4K;

    // SAFETY: AVX-512F/BW; the loads are bytes 0..144 of the block.
    unsafe impl Format for Q4K {
        const UNIT: usize = 256;
        const UNIT_BYTES: usize = 144;
        const OFFSET_SHIFT: Option<u32> = None;
        const HAS_MINS: bool = true;
        /// (d·sc_j, dmin·m_j) of the 8 sub-blocks, as the f32 decoder computes them.
        type Prep = [(f32, f32); 8];
        const ZERO: Self::Prep = [(0.0, 0.0); 8];

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn prep(b: *const u8) -> Self::Prep {
            // SAFETY: the caller's contract: the block's 144 bytes at b.
            unsafe { <decode::Q4K as Chunks>::prep(b) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn chunk(b: *const u8, prep: &Self::Prep, c: usize) -> (__m512i, __m512) {
            // SAFETY: qs is bytes 16..144; these are qs[32c..][..32].
            let q = unsafe { _mm256_loadu_si256(b.add(16 + 32 * c).cast()) };
            let nib = _mm256_set1_epi8(0x0F);
            let lo = _mm256_and_si256(q, nib);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nib);
            let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            (u, halves(prep[2 * c].0, prep[2 * c + 1].0))
        }

        #[inline]
        fn mins(prep: &Self::Prep) -> [f32; 8] {
            prep.map(|(_, m)| m)
        }
    }

    /// Q6_K (210 bytes: `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16`): in half h, weight
    /// 32t + l takes its low 4 bits from ql[64h + l + 32(t & 1)] (low nibble for t < 2, high
    /// for t ≥ 2) and its top 2 from bits 2t..2t + 2 of qh[32h + l]; w = (d·scale)·(q − 32),
    /// one scale per 16 weights. Chunk c is half c / 2, t = 2(c % 2) and 2(c % 2) + 1.
    pub struct Q6K;

    // SAFETY: AVX-512F/BW; the loads are bytes 0..210 of the block.
    unsafe impl Format for Q6K {
        const UNIT: usize = 256;
        const UNIT_BYTES: usize = 210;
        const OFFSET_SHIFT: Option<u32> = Some(5);
        /// d·scale of each 16 weights, as the f32 decoder computes them.
        type Prep = [f32; 16];
        const ZERO: [f32; 16] = [0.0; 16];

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn prep(b: *const u8) -> [f32; 16] {
            // SAFETY: the caller's contract: the block's 210 bytes at b.
            unsafe { <decode::Q6K as Chunks>::prep(b) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn chunk(b: *const u8, prep: &[f32; 16], c: usize) -> (__m512i, __m512) {
            let (h, odd) = (c / 2, c % 2 == 1);
            // SAFETY: ql is bytes 0..128, qh 128..192: these are ql[64h..][..64], qh[32h..][..32].
            let (ql, qh) = unsafe {
                (
                    _mm512_loadu_si512(b.add(64 * h).cast()),
                    _mm256_loadu_si256(b.add(128 + 32 * h).cast()),
                )
            };
            let nib = _mm512_set1_epi8(0x0F);
            let low = if odd {
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nib)
            } else {
                _mm512_and_si512(ql, nib)
            };
            // Bits 2t..2t + 2 of qh for t = 2(c % 2) (weights 0..32 of the chunk) and t + 1.
            let qh = if odd { _mm256_srli_epi16::<4>(qh) } else { qh };
            let qh =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16::<2>(qh));
            let top = _mm512_slli_epi16::<4>(_mm512_and_si512(qh, _mm512_set1_epi8(3)));
            let u = _mm512_or_si512(low, top);
            // Lane L (weights 4L..4L + 4) takes scale 4c + L / 4.
            // SAFETY: 4 floats at 4c ≤ 12 of an array of 16.
            let s = unsafe { _mm_loadu_ps(prep.as_ptr().add(4 * c)) };
            let idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
            (u, _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::random_rows;
    use super::*;
    use rand::Rng;

    fn random_x(t: usize, k: usize, rng: &mut impl Rng) -> Vec<f32> {
        (0..t * k).map(|_| rng.random_range(-2.0..2.0)).collect()
    }

    #[test]
    fn rounding_keeps_every_activation_within_half_a_step() {
        let mut rng = super::super::testing::rng(3);
        let (t, k) = (3, 96);
        let mut x = random_x(t, k, &mut rng);
        x[40] = 0.0;
        x[64..96].fill(0.0); // an all-zero block: scale 0
        let mut q = Q8Rows::default();
        q.quantize(&x, t, k);
        for i in 0..t {
            let xd = q.dequantized(i);
            for (j, (&a, &b)) in x[i * k..][..k].iter().zip(&xd).enumerate() {
                let d = q.q_and_d(i, j).1;
                assert!(
                    (a - b).abs() <= d / 2.0 * 1.0001 + 1e-7,
                    "x[{i}][{j}] {a} → {b}, d {d}"
                );
            }
        }
        x[5] = f32::NAN;
        x[k + 33] = f32::INFINITY;
        q.quantize(&x, t, k);
        assert!(
            q.q_and_d(0, 0).1.is_nan()
                && q.q_and_d(1, 33).1.is_nan()
                && !q.q_and_d(0, 32).1.is_nan()
        );
    }

    #[test]
    fn the_vector_rounding_gives_the_plain_loops_bits() {
        let mut rng = super::super::testing::rng(4);
        let k = 320;
        let mut x = random_x(1, k, &mut rng);
        x[0] = f32::NAN;
        x[40] = f32::NEG_INFINITY;
        x[64..96].fill(0.0);
        x[100] = 1e-30;
        x[130] = 3.0e38;
        x[200] = -0.0;
        let kp = k.next_multiple_of(64);
        let mut got = (
            vec![0i8; kp],
            vec![0i32; kp / 4],
            vec![0f32; kp / 4],
            vec![0f32; kp / QK],
        );
        let mut want = got.clone();
        fn row(a: &mut (Vec<i8>, Vec<i32>, Vec<f32>, Vec<f32>)) -> Row<'_> {
            Row {
                qs: &mut a.0[..],
                nls: &mut a.1[..],
                dl: &mut a.2[..],
                hs: &mut a.3[..],
            }
        }
        row(&mut got).fill(&x);
        row(&mut want).fill_reference(&x);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(got.0, want.0);
        assert_eq!(got.1, want.1);
        assert_eq!(bits(&got.2), bits(&want.2));
        assert_eq!(bits(&got.3), bits(&want.3));
    }

    #[test]
    fn rows_match_the_plain_loop_and_stay_within_the_rounding_of_x() {
        let mut rng = super::super::testing::rng(11);
        for ty in QUANTIZED {
            if !available(ty) {
                eprintln!("q8_act: no AVX-512 VNNI here; the kernel is not tested on this CPU");
                return;
            }
            let ks: &[usize] = if ty.block_size() == 256 {
                &[256, 512, 768]
            } else {
                &[32, 64, 96, 288, 640]
            };
            for &k in ks {
                for (t, n) in [(1, 1), (1, 5), (3, 2), (8, 4), (9, 3), (17, 7)] {
                    let w = random_rows(ty, n, k, &mut rng);
                    let x = random_x(t, k, &mut rng);
                    let mut q = Q8Rows::default();
                    q.quantize(&x, t, k);
                    let ldy = n + 3;
                    let mut got = vec![f32::NAN; t * ldy];
                    let mut want = vec![f32::NAN; t * ldy];
                    // SAFETY: got holds t rows of ldy ≥ n.
                    unsafe { rows_raw(got.as_mut_ptr(), ldy, &q, (ty, &w), n) };
                    reference(ty, &mut want, ldy, &q, &w, n);
                    let mut row = vec![0.0; k];
                    let rb = w.len() / n;
                    for j in 0..n {
                        super::super::decode_rows_reference(ty, &w[j * rb..][..rb], &mut row);
                        for i in 0..t {
                            let xd = q.dequantized(i);
                            let mag: f32 = row.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                            let (g, e) = (got[i * ldy + j], want[i * ldy + j]);
                            assert!(
                                (g - e).abs() <= 1e-5 * mag + 1e-30,
                                "{ty} k {k} t {t} n {n}: ({i}, {j}) {g} vs {e} (|terms| {mag})"
                            );
                            // Against the f32 activations: off by the rounding of x at most.
                            let exact: f32 =
                                row.iter().zip(&x[i * k..][..k]).map(|(a, b)| a * b).sum();
                            let bound: f32 = row
                                .iter()
                                .enumerate()
                                .map(|(c, a)| a.abs() * q.q_and_d(i, c).1 / 2.0)
                                .sum();
                            assert!(
                                (g - exact).abs() <= bound * 1.001 + 1e-4 * mag + 1e-6,
                                "{ty}: ({i}, {j}) {g} vs f32 {exact}, bound {bound}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_gives_the_same_bits_in_every_call_and_nan_stays_in_its_row() {
        let mut rng = super::super::testing::rng(12);
        for ty in QUANTIZED {
            if !available(ty) {
                return;
            }
            let (k, n) = (512, 6);
            let w = random_rows(ty, n, k, &mut rng);
            let mut x = random_x(20, k, &mut rng);
            x[3 * k + 100] = f32::NAN;
            let mut q = Q8Rows::default();
            q.quantize(&x, 20, k);
            let mut all = vec![0.0; 20 * n];
            // SAFETY: all holds 20 rows of n.
            unsafe { rows_raw(all.as_mut_ptr(), n, &q, (ty, &w), n) };
            for i in 0..20 {
                let mut one = Q8Rows::default();
                one.quantize(&x[i * k..][..k], 1, k);
                let mut y = vec![0.0; n];
                // SAFETY: y holds 1 row of n.
                unsafe { rows_raw(y.as_mut_ptr(), n, &one, (ty, &w), n) };
                for j in 0..n {
                    let (a, b) = (all[i * n + j], y[j]);
                    if i == 3 {
                        assert!(a.is_nan() && b.is_nan(), "{ty}: the NaN row gave {a}, {b}");
                    } else {
                        assert_eq!(a.to_bits(), b.to_bits(), "{ty}: token {i} row {j}");
                    }
                }
            }
        }
    }
}
