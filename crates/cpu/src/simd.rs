//! The decode hot loops, dot and axpy, hand-written for AVX-512 and AVX2+FMA with a scalar
//! fallback, chosen once at run time from the CPU's features (no `-C target-cpu=native` needed).
//! `KVLAB_SIMD=scalar|avx2|avx512` forces a lower level (for tests and benchmarks).
//!
//! Each kernel is tested against the scalar reference in `kvlab_model::ops` on random inputs.

use std::ops::Range;
use std::sync::OnceLock;

use kvlab_model::GgmlType;

/// An instruction-set level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain loops: every CPU, or forced with `KVLAB_SIMD=scalar`.
    Scalar,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2Fma,
    /// AVX-512F: 16 f32 lanes.
    Avx512,
}

impl Isa {
    /// Every level this CPU can run, lowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2Fma);
            }
            if is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    /// The level's name, as test messages, benchmark ids and the bench machine record print it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Avx512 => "avx512f",
        }
    }
}

/// The level used by [`dot`] and [`axpy`]: the best available, or lower if `KVLAB_SIMD` says so.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let avail = Isa::available();
        let best = *avail.last().expect("scalar is always available");
        let wanted = match std::env::var("KVLAB_SIMD").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2Fma,
            _ => best,
        };
        if avail.contains(&wanted) {
            wanted
        } else {
            best
        }
    })
}

/// Σ a_i b_i over the common length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(isa(), a, b)
}

/// Lanes of [`dot_head`] and [`axpy_head`]: independent accumulators the compiler keeps in one
/// vector register (8 × f32 = 256 bits).
const HEAD_LANES: usize = 8;

/// Σ a_i b_i for one attention head (head_dim of 8 to 256): a plain loop over 8 lanes, inlined
/// into the attention kernel and vectorized there for the instruction set that kernel is compiled
/// for; a call into [`dot`] per key would cost more than the arithmetic of a small head.
#[inline(always)]
pub fn dot_head(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; HEAD_LANES];
    let full = n - n % HEAD_LANES;
    for c in (0..full).step_by(HEAD_LANES) {
        // Arrays, not slices: a known length is what lets the compiler use one 8-wide register.
        let x: &[f32; HEAD_LANES] = a[c..c + HEAD_LANES].try_into().expect("8 lanes");
        let y: &[f32; HEAD_LANES] = b[c..c + HEAD_LANES].try_into().expect("8 lanes");
        for i in 0..HEAD_LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a[full..].iter().zip(&b[full..]).map(|(x, y)| x * y).sum();
    let h4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    let h2 = [h4[0] + h4[2], h4[1] + h4[3]];
    (h2[0] + h2[1]) + tail
}

/// The two per-head kernels of attention over a run of rows stored at a fixed stride (row b of
/// the run at `x[b·stride..][..head_dim]`, one KV head of consecutive positions in the cache):
/// the scores q · x_b, and y += Σ_b a_b x_b.
pub trait HeadKernels {
    /// How softmax's exp multiplies and adds in the kernel these run in.
    type MulAdd: crate::softmax::MulAdd;
    /// s\[b\] = q · x_b for b in 0..s.len(), x_b = x\[b·stride..\]\[..q.len()\].
    fn dot_rows(s: &mut [f32], q: &[f32], x: &[f32], stride: usize);
    /// y ← y + Σ_b a\[b\] x_b for b in 0..a.len(), x_b = x\[b·stride..\]\[..y.len()\].
    fn axpy_rows(y: &mut [f32], a: &[f32], x: &[f32], stride: usize);
    /// [`HeadKernels::dot_rows`] for two query heads that share the rows (GQA/MQA).
    #[inline(always)]
    fn dot_rows2(s: [&mut [f32]; 2], q: [&[f32]; 2], x: &[f32], stride: usize) {
        let [s0, s1] = s;
        Self::dot_rows(s0, q[0], x, stride);
        Self::dot_rows(s1, q[1], x, stride);
    }
    /// [`HeadKernels::axpy_rows`] for two query heads that share the rows.
    #[inline(always)]
    fn axpy_rows2(y: [&mut [f32]; 2], a: [&[f32]; 2], x: &[f32], stride: usize) {
        let [y0, y1] = y;
        Self::axpy_rows(y0, a[0], x, stride);
        Self::axpy_rows(y1, a[1], x, stride);
    }

    /// Scores of all the query heads q (kv_mul, hd) that share the rows of x: s[m·n + at + b] =
    /// q_m · x_b for at + b in `cols`, s being (kv_mul, n). Heads go in pairs
    /// ([`HeadKernels::dot_rows2`]), the last one alone when kv_mul is odd.
    #[inline(always)]
    fn dot_heads(
        s: &mut [f32],
        n: usize,
        cols: Range<usize>,
        q: &[f32],
        hd: usize,
        x: &[f32],
        stride: usize,
    ) {
        let mut s_pairs = s.chunks_exact_mut(2 * n);
        let mut q_pairs = q.chunks_exact(2 * hd);
        for (s, q) in (&mut s_pairs).zip(&mut q_pairs) {
            let (s0, s1) = s.split_at_mut(n);
            let (q0, q1) = q.split_at(hd);
            Self::dot_rows2(
                [&mut s0[cols.clone()], &mut s1[cols.clone()]],
                [q0, q1],
                x,
                stride,
            );
        }
        let (s, q) = (s_pairs.into_remainder(), q_pairs.remainder());
        if !q.is_empty() {
            Self::dot_rows(&mut s[cols], q, x, stride);
        }
    }

    /// The weighted sums of all the query heads that share the rows of x: for each head m,
    /// y_m ← y_m + Σ_b a[m·n + at + b] x_b for at + b in `cols`, y being (kv_mul, hd) and a
    /// (kv_mul, n). Pairs as [`HeadKernels::dot_heads`].
    #[inline(always)]
    fn axpy_heads(
        y: &mut [f32],
        hd: usize,
        a: &[f32],
        n: usize,
        cols: Range<usize>,
        x: &[f32],
        stride: usize,
    ) {
        let mut y_pairs = y.chunks_exact_mut(2 * hd);
        let mut a_pairs = a.chunks_exact(2 * n);
        for (y, a) in (&mut y_pairs).zip(&mut a_pairs) {
            let (y0, y1) = y.split_at_mut(hd);
            let (a0, a1) = a.split_at(n);
            Self::axpy_rows2([y0, y1], [&a0[cols.clone()], &a1[cols.clone()]], x, stride);
        }
        let (y, a) = (y_pairs.into_remainder(), a_pairs.remainder());
        if !y.is_empty() {
            Self::axpy_rows(y, &a[cols], x, stride);
        }
    }

    /// Whether this kernel takes f16 rows as the cache stores them
    /// ([`HeadKernels::dot_heads_f16`], [`HeadKernels::axpy_heads_f16`]) for `kv_mul` query
    /// heads of `hd` dimensions sharing a KV head; where not, attention decodes the rows to f32
    /// first.
    #[inline(always)]
    fn f16_heads(_kv_mul: usize, _hd: usize) -> bool {
        false
    }

    /// [`HeadKernels::dot_heads`] over rows stored as f16 bits, converted as they are loaded.
    /// This default decodes them first (only reached where `f16_heads` is true).
    fn dot_heads_f16(
        s: &mut [f32],
        n: usize,
        cols: Range<usize>,
        q: &[f32],
        hd: usize,
        x: &[u16],
        stride: usize,
    ) {
        let mut rows = vec![0.0; x.len()];
        crate::quant::decode_rows(GgmlType::F16, bytemuck::cast_slice(x), &mut rows);
        Self::dot_heads(s, n, cols, q, hd, &rows, stride)
    }

    /// [`HeadKernels::axpy_heads`] over rows stored as f16 bits; the default decodes them
    /// first, as [`HeadKernels::dot_heads_f16`]'s.
    #[allow(clippy::too_many_arguments)] // axpy_heads' shapes and the rows
    fn axpy_heads_f16(
        y: &mut [f32],
        hd: usize,
        a: &[f32],
        n: usize,
        cols: Range<usize>,
        x: &[u16],
        stride: usize,
    ) {
        let mut rows = vec![0.0; x.len()];
        crate::quant::decode_rows(GgmlType::F16, bytemuck::cast_slice(x), &mut rows);
        Self::axpy_heads(y, hd, a, n, cols, &rows, stride)
    }
}

/// [`HeadKernels`] as one [`dot_head`] per row and [`axpy4_head`] per four rows: the reference,
/// and the kernel where AVX2 is missing.
pub struct PlainHeads;

impl HeadKernels for PlainHeads {
    type MulAdd = crate::softmax::Unfused;
    #[inline(always)]
    fn dot_rows(s: &mut [f32], q: &[f32], x: &[f32], stride: usize) {
        let hd = q.len();
        for (b, s) in s.iter_mut().enumerate() {
            *s = dot_head(q, &x[b * stride..][..hd]);
        }
    }
    #[inline(always)]
    fn axpy_rows(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) {
        let hd = y.len();
        let row = |b: usize| &x[b * stride..][..hd];
        let mut quads = a.chunks_exact(4);
        for (i, a4) in (&mut quads).enumerate() {
            let b = 4 * i;
            axpy4_head(
                y,
                [a4[0], a4[1], a4[2], a4[3]],
                [row(b), row(b + 1), row(b + 2), row(b + 3)],
            );
        }
        let b0 = a.len() - quads.remainder().len();
        for (i, &a) in quads.remainder().iter().enumerate() {
            axpy_head(y, a, row(b0 + i));
        }
    }
}

/// [`HeadKernels`] with AVX2 + FMA: eight rows per pass, their eight dot products reduced
/// together by one transposing `hadd` tree into one vector of eight scores; the weighted sum
/// keeps y in registers over the whole run. Only for code that runs after [`isa`] reported AVX2
/// or AVX-512.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2Heads;

#[cfg(target_arch = "x86_64")]
impl HeadKernels for Avx2Heads {
    type MulAdd = crate::softmax::Fused;
    #[inline(always)]
    fn dot_rows(s: &mut [f32], q: &[f32], x: &[f32], stride: usize) {
        debug_assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        // SAFETY: Avx2Heads is used only by the attention kernels compiled for AVX2/AVX-512,
        // which run only where isa() found those features; the kernel checks lengths itself.
        unsafe { x86::dot_rows_avx2(s, q, x, stride) }
    }
    #[inline(always)]
    fn axpy_rows(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) {
        // SAFETY: as for dot_rows.
        unsafe { x86::axpy_rows_avx2(y, a, x, stride) }
    }
}

/// [`HeadKernels`] on AVX-512: the weighted sum of values 16 lanes wide for a head of 16 to 128
/// dimensions (a multiple of 16), [`Avx2Heads`] otherwise and for the scores; two heads of 8
/// dimensions in one register ([`crate::head8`]), the same bits as two AVX2 calls. Only for
/// code that runs after [`isa`] reported AVX-512.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx512Heads;

#[cfg(target_arch = "x86_64")]
impl HeadKernels for Avx512Heads {
    type MulAdd = crate::softmax::Fused;
    #[inline(always)]
    fn dot_rows(s: &mut [f32], q: &[f32], x: &[f32], stride: usize) {
        Avx2Heads::dot_rows(s, q, x, stride)
    }
    #[inline(always)]
    fn axpy_rows(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) {
        debug_assert!(is_x86_feature_detected!("avx512f"));
        // SAFETY: as for dot_rows2 below; the kernel checks lengths itself.
        if !unsafe { x86::axpy_rows_avx512(y, a, x, stride) } {
            Avx2Heads::axpy_rows(y, a, x, stride)
        }
    }
    #[inline(always)]
    fn dot_rows2(s: [&mut [f32]; 2], q: [&[f32]; 2], x: &[f32], stride: usize) {
        debug_assert!(is_x86_feature_detected!("avx512f"));
        if q[0].len() == crate::head8::HEAD_DIM {
            // SAFETY: Avx512Heads is used only by the attention kernel compiled for AVX-512,
            // which runs only where isa() found AVX-512F; the kernel checks lengths itself.
            unsafe { crate::head8::dot_rows2(s, q, x, stride) }
        } else {
            let [s0, s1] = s;
            Self::dot_rows(s0, q[0], x, stride);
            Self::dot_rows(s1, q[1], x, stride);
        }
    }
    #[inline(always)]
    fn axpy_rows2(y: [&mut [f32]; 2], a: [&[f32]; 2], x: &[f32], stride: usize) {
        if y[0].len() == crate::head8::HEAD_DIM {
            // SAFETY: as for dot_rows2.
            unsafe { crate::head8::axpy_rows2(y, a, x, stride) }
        } else {
            let [y0, y1] = y;
            Self::axpy_rows(y0, a[0], x, stride);
            Self::axpy_rows(y1, a[1], x, stride);
        }
    }
}

/// y ← y + (a₀x₀ + a₁x₁) + (a₂x₂ + a₃x₃) for one attention head: four rows of values per pass.
#[inline(always)]
pub fn axpy4_head(y: &mut [f32], a: [f32; 4], x: [&[f32]; 4]) {
    let n = y.len();
    let (x0, x1, x2, x3) = (&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
    // Fixed 8-lane chunks: a loop of unknown length would be vectorized 16 wide under AVX-512
    // and leave a head of 8 to the scalar remainder.
    let full = n - n % HEAD_LANES;
    for c in (0..full).step_by(HEAD_LANES) {
        let y: &mut [f32; HEAD_LANES] = (&mut y[c..c + HEAD_LANES]).try_into().expect("8 lanes");
        let lanes =
            |x: &[f32]| -> [f32; HEAD_LANES] { x[c..c + HEAD_LANES].try_into().expect("8") };
        let (x0, x1, x2, x3) = (lanes(x0), lanes(x1), lanes(x2), lanes(x3));
        for i in 0..HEAD_LANES {
            y[i] += (a[0] * x0[i] + a[1] * x1[i]) + (a[2] * x2[i] + a[3] * x3[i]);
        }
    }
    for i in full..n {
        y[i] += (a[0] * x0[i] + a[1] * x1[i]) + (a[2] * x2[i] + a[3] * x3[i]);
    }
}

/// y ← y + alpha·x for one attention head; see [`dot_head`].
#[inline(always)]
pub fn axpy_head(y: &mut [f32], alpha: f32, x: &[f32]) {
    let mut yc = y.chunks_exact_mut(HEAD_LANES);
    let mut xc = x.chunks_exact(HEAD_LANES);
    for (y, x) in (&mut yc).zip(&mut xc) {
        for i in 0..HEAD_LANES {
            y[i] += alpha * x[i];
        }
    }
    for (y, x) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *y += alpha * x;
    }
}

/// y ← y + alpha·x over the common length.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_with(isa(), y, alpha, x)
}

/// [`dot`] at a given level; a level the CPU lacks falls back to scalar.
#[inline]
pub fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU supports AVX-512F (checked just above); the kernel reads only
            // within `a[..n]` and `b[..n]`.
            unsafe { x86::dot_avx512(a, b) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") => {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above); reads stay in bounds.
            unsafe { x86::dot_avx2(a, b) }
        }
        _ => kvlab_model::ops::dot(a, b),
    }
}

/// [`axpy`] at a given level; a level the CPU lacks falls back to scalar.
#[inline]
pub fn axpy_with(isa: Isa, y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if is_x86_feature_detected!("avx512f") => {
            // SAFETY: AVX-512F is present (checked above); reads and writes stay in `[..n]`.
            unsafe { x86::axpy_avx512(y, alpha, x) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") => {
            // SAFETY: AVX2 and FMA are present (checked above); accesses stay in `[..n]`.
            unsafe { x86::axpy_avx2(y, alpha, x) }
        }
        _ => kvlab_model::ops::axpy(y, alpha, x),
    }
}

/// out (rows,) = W (rows, cols) @ x (cols,) at the current level, the level chosen once for all
/// rows and several rows computed per pass so each load of x serves them all. Every output equals
/// [`dot`] of its row bit for bit (same accumulators, same order).
pub fn gemv_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
    let cols = x.len();
    assert_eq!(
        w.len(),
        out.len() * cols,
        "gemv_rows: W must be (rows, cols)"
    );
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: isa() returns only levels the CPU supports; the assert above makes every row
        // of `w` exactly `cols` long, which is what the kernel reads.
        Isa::Avx512 => unsafe { x86::gemv_avx512(out, w, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        Isa::Avx2Fma => unsafe { x86::gemv_avx2(out, w, x) },
        _ => {
            for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
                *o = kvlab_model::ops::dot(row, x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Four dot products q · k_b, b = 0..4, over the common length.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4_avx2(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        let n = k.iter().fold(q.len(), |n, k| n.min(k.len()));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n ≤ the length of q and of every k_b.
            let qv = unsafe { _mm256_loadu_ps(q.as_ptr().add(i)) };
            for b in 0..4 {
                // SAFETY: i + 8 ≤ n ≤ k[b].len(), as for q above.
                let kv = unsafe { _mm256_loadu_ps(k[b].as_ptr().add(i)) };
                acc[b] = _mm256_fmadd_ps(kv, qv, acc[b]);
            }
            i += 8;
        }
        // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]; after two levels
        // each 128-bit half holds the four rows' partial sums, and the halves add up to them.
        let t0 = _mm256_hadd_ps(acc[0], acc[1]);
        let t1 = _mm256_hadd_ps(acc[2], acc[3]);
        let t2 = _mm256_hadd_ps(t0, t1);
        let r = _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps::<1>(t2));
        let mut out = [0.0f32; 4];
        // SAFETY: `out` holds 4 floats.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), r) };
        for (b, o) in out.iter_mut().enumerate() {
            *o += q[i..n]
                .iter()
                .zip(&k[b][i..n])
                .map(|(x, y)| x * y)
                .sum::<f32>();
        }
        out
    }

    /// s[b] = q · x[b·stride..][..q.len()] for b in 0..s.len().
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows_avx2(s: &mut [f32], q: &[f32], x: &[f32], stride: usize) {
        let (hd, nb) = (q.len(), s.len());
        if nb == 0 {
            return;
        }
        assert!(
            x.len() >= (nb - 1) * stride + hd,
            "dot_rows: x holds fewer rows than s"
        );
        let full = hd - hd % 8;
        let (pq, px) = (q.as_ptr(), x.as_ptr());
        let mut b = 0;
        while b + 8 <= nb {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < full {
                // SAFETY: c + 8 ≤ full ≤ hd = q.len(), and row b + r < nb starts at
                // (b + r)·stride with (nb − 1)·stride + hd ≤ x.len() (asserted above).
                unsafe {
                    let qv = _mm256_loadu_ps(pq.add(c));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let kv = _mm256_loadu_ps(px.add((b + r) * stride + c));
                        *acc = _mm256_fmadd_ps(kv, qv, *acc);
                    }
                }
                c += 8;
            }
            // Transpose and add: hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5,
            // b6+b7]; after two levels u0 = [Σlo r0..r3 | Σhi r0..r3] (lo: lanes 0-3, hi: 4-7)
            // and u1 the same for rows 4..8, so lo + hi of the two gives rows 0..8 in order.
            let t0 = _mm256_hadd_ps(acc[0], acc[1]);
            let t1 = _mm256_hadd_ps(acc[2], acc[3]);
            let t2 = _mm256_hadd_ps(acc[4], acc[5]);
            let t3 = _mm256_hadd_ps(acc[6], acc[7]);
            let u0 = _mm256_hadd_ps(t0, t1);
            let u1 = _mm256_hadd_ps(t2, t3);
            let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
            let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
            let out = &mut s[b..b + 8];
            // SAFETY: `out` holds 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi)) };
            if full < hd {
                for (r, o) in out.iter_mut().enumerate() {
                    let row = &x[(b + r) * stride..][..hd];
                    *o += q[full..]
                        .iter()
                        .zip(&row[full..])
                        .map(|(a, b)| a * b)
                        .sum::<f32>();
                }
            }
            b += 8;
        }
        while b + 4 <= nb {
            let row = |r: usize| &x[(b + r) * stride..][..hd];
            // SAFETY: the caller's AVX2 + FMA requirement is this function's.
            let d = unsafe { dot4_avx2(q, [row(0), row(1), row(2), row(3)]) };
            s[b..b + 4].copy_from_slice(&d);
            b += 4;
        }
        for (r, o) in s.iter_mut().enumerate().skip(b) {
            *o = super::dot_head(q, &x[r * stride..][..hd]);
        }
    }

    /// y ← y + Σ_b a[b] x[b·stride..][..y.len()] for b in 0..a.len(): each 8-lane chunk of y
    /// stays in registers (four accumulators) over all the rows.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_rows_avx2(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) {
        let (hd, nb) = (y.len(), a.len());
        if nb == 0 {
            return;
        }
        assert!(
            x.len() >= (nb - 1) * stride + hd,
            "axpy_rows: x holds fewer rows than a"
        );
        let full = hd - hd % 8;
        let px = x.as_ptr();
        let mut c = 0;
        while c < full {
            // SAFETY: (all loads and the store below) c + 8 ≤ full ≤ hd = y.len(), and row
            // b < nb starts at b·stride with (nb − 1)·stride + hd ≤ x.len() (asserted above).
            unsafe {
                let p = |b: usize| _mm256_loadu_ps(px.add(b * stride + c));
                let mut acc = [
                    _mm256_loadu_ps(y.as_ptr().add(c)),
                    _mm256_setzero_ps(),
                    _mm256_setzero_ps(),
                    _mm256_setzero_ps(),
                ];
                let mut b = 0;
                while b + 4 <= nb {
                    for (r, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b + r]), p(b + r), *acc);
                    }
                    b += 4;
                }
                while b < nb {
                    acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(a[b]), p(b), acc[0]);
                    b += 1;
                }
                let sum =
                    _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
                _mm256_storeu_ps(y.as_mut_ptr().add(c), sum);
            }
            c += 8;
        }
        for (t, y) in y.iter_mut().enumerate().skip(full) {
            *y += a
                .iter()
                .enumerate()
                .map(|(b, a)| a * x[b * stride + t])
                .sum::<f32>();
        }
    }

    /// [`axpy_rows_avx2`] for a head of 16·V dimensions (V = 1..=8), 16 lanes wide: the head's
    /// V vectors of y stay in registers for the whole run, twice (even and odd rows, so that
    /// two FMAs on each vector are in flight), and each row costs one broadcast of a_b and V
    /// FMAs, where the AVX2 kernel broadcasts a_b again for each of its 8-lane chunks (6 of
    /// them for head_dim 48). Returns false, touching nothing, for another head_dim.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_rows_avx512(y: &mut [f32], a: &[f32], x: &[f32], stride: usize) -> bool {
        // SAFETY: (each arm) the CPU has AVX-512F (the caller's promise).
        unsafe {
            match y.len() {
                16 => axpy_rows_avx512_v::<1>(y, a, x, stride),
                32 => axpy_rows_avx512_v::<2>(y, a, x, stride),
                48 => axpy_rows_avx512_v::<3>(y, a, x, stride),
                64 => axpy_rows_avx512_v::<4>(y, a, x, stride),
                80 => axpy_rows_avx512_v::<5>(y, a, x, stride),
                96 => axpy_rows_avx512_v::<6>(y, a, x, stride),
                112 => axpy_rows_avx512_v::<7>(y, a, x, stride),
                128 => axpy_rows_avx512_v::<8>(y, a, x, stride),
                _ => return false,
            }
        }
        true
    }

    /// # Safety
    /// The CPU must support AVX-512F; y.len() = 16·V.
    // v indexes y's vectors, both accumulators and the offset in a row: a range loop says that
    // best.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn axpy_rows_avx512_v<const V: usize>(
        y: &mut [f32],
        a: &[f32],
        x: &[f32],
        stride: usize,
    ) {
        let nb = a.len();
        assert!(y.len() == 16 * V);
        if nb == 0 {
            return;
        }
        assert!(
            x.len() >= (nb - 1) * stride + 16 * V,
            "axpy_rows: x holds fewer rows than a"
        );
        let px = x.as_ptr();
        // SAFETY: (every load and store below) vector v of y is y[16v..16v + 16], inside y; row
        // b < nb starts at b·stride with (nb − 1)·stride + 16·V ≤ x.len() (asserted above).
        unsafe {
            let mut even: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(y.as_ptr().add(16 * v)));
            let mut odd = [_mm512_setzero_ps(); V];
            let mut b = 0;
            while b + 2 <= nb {
                let (a0, a1) = (_mm512_set1_ps(a[b]), _mm512_set1_ps(a[b + 1]));
                let (r0, r1) = (px.add(b * stride), px.add((b + 1) * stride));
                for v in 0..V {
                    even[v] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(r0.add(16 * v)), even[v]);
                    odd[v] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(r1.add(16 * v)), odd[v]);
                }
                b += 2;
            }
            if b < nb {
                let a0 = _mm512_set1_ps(a[b]);
                let r0 = px.add(b * stride);
                for v in 0..V {
                    even[v] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(r0.add(16 * v)), even[v]);
                }
            }
            for v in 0..V {
                _mm512_storeu_ps(y.as_mut_ptr().add(16 * v), _mm512_add_ps(even[v], odd[v]));
            }
        }
    }

    /// The GEMV, dot product and axpy of one vector ISA, written once: `$lanes` f32 lanes of
    /// `$v`, its intrinsics, `$hsum` (the horizontal sum of one vector) and `$rows` rows per
    /// GEMV pass. The GEMV keeps the dot product's four accumulators and summation order, so
    /// each output is bit-identical to `$dot(row, x)`.
    macro_rules! isa_kernels {
        (
            features: $feat:literal, lanes: $lanes:literal, rows: $rows:literal,
            $v:ty, $zero:ident, $load:ident, $store:ident, $set1:ident, $fmadd:ident, $add:ident,
            $hsum:ident, gemv: $gemv:ident, dot: $dot:ident, axpy: $axpy:ident
        ) => {
            /// GEMV, several rows per pass sharing each load of x, each row bit-identical to
            /// the dot product of this ISA.
            ///
            /// # Safety
            /// The CPU must support the ISA's features; `w` must hold `out.len()` rows of
            /// `x.len()` floats.
            // k indexes both x's offset and each row's accumulator: a range loop says that best.
            #[allow(clippy::needless_range_loop)]
            #[target_feature(enable = $feat)]
            pub unsafe fn $gemv(out: &mut [f32], w: &[f32], x: &[f32]) {
                const R: usize = $rows;
                const L: usize = $lanes;
                let n = x.len();
                let px = x.as_ptr();
                let rows = out.len();
                let mut r = 0;
                while r + R <= rows {
                    // (Every raw load below) row r + q < rows starts at (r + q)·n inside w, and
                    // i + lanes ≤ n, so each load reads inside its row and inside x.
                    let pw: [*const f32; R] = std::array::from_fn(|k| {
                        // SAFETY: row r + k < rows starts inside w (out.len() rows of n).
                        unsafe { w.as_ptr().add((r + k) * n) }
                    });
                    let mut acc: [[$v; 4]; R] = [[$zero(); 4]; R];
                    let mut i = 0;
                    while i + 4 * L <= n {
                        for k in 0..4 {
                            // SAFETY: i + L·k + L ≤ i + 4L ≤ n = x.len().
                            let xv = unsafe { $load(px.add(i + L * k)) };
                            for q in 0..R {
                                let wv = pw[q].wrapping_add(i + L * k);
                                // SAFETY: i + L·k + L ≤ n, inside row r + q of w.
                                acc[q][k] = unsafe { $fmadd($load(wv), xv, acc[q][k]) };
                            }
                        }
                        i += 4 * L;
                    }
                    while i + L <= n {
                        // SAFETY: i + L ≤ n: inside x and inside row r + q of w.
                        let xv = unsafe { $load(px.add(i)) };
                        for q in 0..R {
                            // SAFETY: i + L ≤ n: inside x and inside row r + q of w.
                            acc[q][0] = unsafe { $fmadd($load(pw[q].add(i)), xv, acc[q][0]) };
                        }
                        i += L;
                    }
                    for q in 0..R {
                        let a = &acc[q];
                        let mut s = $hsum($add($add(a[0], a[1]), $add(a[2], a[3])));
                        let row = &w[(r + q) * n..(r + q + 1) * n];
                        for j in i..n {
                            s += row[j] * x[j];
                        }
                        out[r + q] = s;
                    }
                    r += R;
                }
                for q in r..rows {
                    // SAFETY: the CPU has the ISA (this function's own requirement).
                    out[q] = unsafe { $dot(&w[q * n..(q + 1) * n], x) };
                }
            }

            /// Four accumulators of `$lanes` lanes hide the FMA latency; the tail is scalar.
            ///
            /// # Safety
            /// The CPU must support the ISA's features; `a` and `b` must have the same length.
            #[target_feature(enable = $feat)]
            pub unsafe fn $dot(a: &[f32], b: &[f32]) -> f32 {
                const L: usize = $lanes;
                let n = a.len();
                let (pa, pb) = (a.as_ptr(), b.as_ptr());
                let mut acc: [$v; 4] = [$zero(); 4];
                let mut i = 0;
                while i + 4 * L <= n {
                    for (k, acc) in acc.iter_mut().enumerate() {
                        let off = i + L * k;
                        // SAFETY: off + L ≤ i + 4L ≤ n, inside a and b.
                        *acc = unsafe { $fmadd($load(pa.add(off)), $load(pb.add(off)), *acc) };
                    }
                    i += 4 * L;
                }
                while i + L <= n {
                    // SAFETY: i + L ≤ n, inside a and b.
                    acc[0] = unsafe { $fmadd($load(pa.add(i)), $load(pb.add(i)), acc[0]) };
                    i += L;
                }
                let mut s = $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
                while i < n {
                    s += a[i] * b[i];
                    i += 1;
                }
                s
            }

            /// y ← y + alpha·x, `$lanes` at a time; the tail is scalar.
            ///
            /// # Safety
            /// The CPU must support the ISA's features; `y` and `x` must have the same length.
            #[target_feature(enable = $feat)]
            pub unsafe fn $axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
                const L: usize = $lanes;
                let n = y.len();
                let (py, px) = (y.as_mut_ptr(), x.as_ptr());
                let a = $set1(alpha);
                let mut i = 0;
                while i + L <= n {
                    // SAFETY: i + L ≤ n for both slices.
                    unsafe { $store(py.add(i), $fmadd(a, $load(px.add(i)), $load(py.add(i)))) };
                    i += L;
                }
                while i < n {
                    y[i] += alpha * x[i];
                    i += 1;
                }
            }
        };
    }

    isa_kernels!(
        features: "avx512f", lanes: 16, rows: 4,
        __m512, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
        _mm512_fmadd_ps, _mm512_add_ps, hsum512,
        gemv: gemv_avx512, dot: dot_avx512, axpy: axpy_avx512
    );
    isa_kernels!(
        features: "avx2,fma", lanes: 8, rows: 2,
        __m256, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
        _mm256_fmadd_ps, _mm256_add_ps, hsum256,
        gemv: gemv_avx2, dot: dot_avx2, axpy: axpy_avx2
    );

    /// The sum of 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn hsum512(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// The sum of 8 lanes: fold 256 → 128 → 64 → 32 bits.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum256(v: __m256) -> f32 {
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
        _mm_cvtss_f32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    }

    const LENS: [usize; 12] = [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 288, 1031];

    #[test]
    fn dot_matches_the_scalar_reference_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for isa in Isa::available() {
            for n in LENS {
                let (a, b) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
                let fast = dot_with(isa, &a, &b);
                let reference: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
                let scale: f64 = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (*x as f64 * *y as f64).abs())
                    .sum::<f64>()
                    .max(1e-30);
                let rel = (fast as f64 - reference).abs() / scale;
                assert!(
                    rel < 1e-6,
                    "{} n={n}: {fast} vs {reference} (rel {rel})",
                    isa.name()
                );
            }
        }
    }

    #[test]
    fn axpy_matches_the_scalar_reference_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for isa in Isa::available() {
            for n in LENS {
                let (x, y0) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
                let mut fast = y0.clone();
                axpy_with(isa, &mut fast, 0.37, &x);
                let mut reference = y0.clone();
                kvlab_model::ops::axpy(&mut reference, 0.37, &x);
                for (f, r) in fast.iter().zip(&reference) {
                    assert!(
                        (f - r).abs() <= 1e-6 * r.abs().max(1.0),
                        "{} n={n}: {f} vs {r}",
                        isa.name()
                    );
                }
            }
        }
    }

    #[test]
    fn gemv_rows_equals_dot_per_row_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for (rows, cols) in [(1, 5), (3, 64), (4, 65), (7, 288), (9, 1031), (13, 8)] {
            let (w, x) = (rand_vec(&mut rng, rows * cols), rand_vec(&mut rng, cols));
            let mut out = vec![f32::NAN; rows];
            gemv_rows(&mut out, &w, &x);
            for (r, o) in out.iter().enumerate() {
                assert_eq!(
                    o.to_bits(),
                    dot(&w[r * cols..(r + 1) * cols], &x).to_bits(),
                    "row {r} of ({rows}, {cols})"
                );
            }
        }
    }

    #[test]
    fn nan_propagates_and_never_passes() {
        for isa in Isa::available() {
            let mut a = vec![1.0f32; 100];
            a[70] = f32::NAN;
            assert!(dot_with(isa, &a, &a).is_nan(), "{}", isa.name());
        }
    }

    #[test]
    fn head_kernels_match_the_scalar_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for n in [1, 7, 8, 9, 16, 48, 64, 128, 256, 257] {
            let (a, b) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
            let (got, want) = (dot_head(&a, &b), kvlab_model::ops::dot(&a, &b));
            let scale: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            assert!(
                (got - want).abs() <= 1e-6 * scale,
                "dot n={n}: {got} vs {want}"
            );
            let (mut y, mut y_ref) = (b.clone(), b.clone());
            axpy_head(&mut y, 0.37, &a);
            kvlab_model::ops::axpy(&mut y_ref, 0.37, &a);
            assert_eq!(y, y_ref, "axpy n={n}");
        }
        for n in [1, 8, 9, 48, 256] {
            let x: Vec<Vec<f32>> = (0..4).map(|_| rand_vec(&mut rng, n)).collect();
            let mut y = rand_vec(&mut rng, n);
            let mut y_ref = y.clone();
            let a = [0.1, -0.7, 0.33, 1.5];
            axpy4_head(&mut y, a, [&x[0], &x[1], &x[2], &x[3]]);
            for (ai, xi) in a.iter().zip(&x) {
                kvlab_model::ops::axpy(&mut y_ref, *ai, xi);
            }
            for (p, q) in y.iter().zip(&y_ref) {
                assert!(
                    (p - q).abs() <= 1e-5 * (1.0 + q.abs()),
                    "axpy4 n={n}: {p} vs {q}"
                );
            }
        }
        let mut a = vec![1.0f32; 48];
        a[40] = f32::NAN;
        assert!(dot_head(&a, &a).is_nan());
    }

    /// Every [`HeadKernels`] this CPU runs, by name.
    fn head_kernels() -> Vec<(&'static str, HeadFns)> {
        #[allow(unused_mut)]
        let mut v: Vec<(&'static str, HeadFns)> =
            vec![("plain", (PlainHeads::dot_rows, PlainHeads::axpy_rows))];
        #[cfg(target_arch = "x86_64")]
        if Isa::available().contains(&Isa::Avx2Fma) {
            v.push(("avx2", (Avx2Heads::dot_rows, Avx2Heads::axpy_rows)));
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::available().contains(&Isa::Avx512) {
            v.push(("avx512", (Avx512Heads::dot_rows, Avx512Heads::axpy_rows)));
        }
        v
    }
    type HeadFns = (
        fn(&mut [f32], &[f32], &[f32], usize),
        fn(&mut [f32], &[f32], &[f32], usize),
    );

    #[test]
    fn row_kernels_match_the_scalar_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        for (name, (dot_rows, axpy_rows)) in head_kernels() {
            for hd in [1, 7, 8, 9, 16, 32, 48, 64, 128, 259] {
                for nb in [0usize, 1, 2, 3, 4, 7, 8, 9, 16, 17, 37] {
                    for stride in [hd, 4 * hd + 3] {
                        let q = rand_vec(&mut rng, hd);
                        // Exactly as long as nb rows need: the last row ends at the slice's end.
                        let x = rand_vec(&mut rng, nb.saturating_sub(1) * stride + hd);
                        let row = |b: usize| &x[b * stride..][..hd];
                        let mut s = vec![f32::NAN; nb];
                        dot_rows(&mut s, &q, &x, stride);
                        for (b, s) in s.iter().enumerate() {
                            let want = kvlab_model::ops::dot(&q, row(b));
                            let scale: f32 = q.iter().zip(row(b)).map(|(x, y)| (x * y).abs()).sum();
                            assert!(
                                (s - want).abs() <= 1e-6 * scale,
                                "{name} dot_rows hd={hd} nb={nb} stride={stride} row {b}: {s} vs {want}"
                            );
                        }
                        let a = rand_vec(&mut rng, nb);
                        let y0 = rand_vec(&mut rng, hd);
                        let mut y = y0.clone();
                        axpy_rows(&mut y, &a, &x, stride);
                        for t in 0..hd {
                            let terms = (0..nb).map(|b| a[b] as f64 * row(b)[t] as f64);
                            let want = y0[t] as f64 + terms.clone().sum::<f64>();
                            let scale = y0[t].abs() as f64 + terms.map(f64::abs).sum::<f64>();
                            assert!(
                                (y[t] as f64 - want).abs() <= 1e-6 * scale,
                                "{name} axpy_rows hd={hd} nb={nb} stride={stride} lane {t}"
                            );
                        }
                    }
                }
            }
            // A NaN in one key makes its score NaN and no other; in one value, every output lane
            // it reaches.
            for hd in [8, 9, 48, 64] {
                let (nb, stride) = (11, 2 * hd);
                let q = vec![1.0f32; hd];
                let mut x = vec![1.0f32; (nb - 1) * stride + hd];
                x[5 * stride + hd - 1] = f32::NAN;
                let mut s = vec![0.0; nb];
                dot_rows(&mut s, &q, &x, stride);
                for (b, s) in s.iter().enumerate() {
                    assert_eq!(s.is_nan(), b == 5, "{name} hd={hd} row {b}: {s}");
                }
                let mut y = vec![0.0; hd];
                axpy_rows(&mut y, &[0.5; 11], &x, stride);
                for (t, y) in y.iter().enumerate() {
                    assert_eq!(y.is_nan(), t == hd - 1, "{name} hd={hd} lane {t}: {y}");
                }
            }
        }
    }
}
