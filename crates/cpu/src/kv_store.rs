//! Rows of keys (or values) stored in a [`KvDtype`]: quantized when a row is written, decoded a
//! tile at a time when attention reads them, never a full-precision copy of the cache. The
//! contiguous cache and the paged pool both keep their keys and values in a [`KvStore`].
//!
//! A row is one token's (kv_dim,) = (n_kv_heads, head_dim) keys or values. Per format (bytes in
//! `kvlab_model::kv_dtype`):
//! * f32: stored as computed, and read in place (no tile);
//! * f16 / bf16: each element rounded to nearest-even (the `half` crate);
//! * fp8-e4m3: per (row, KV head) a scale s = amax / 448 and each element x as the E4M3 value
//!   nearest x / s (the `float8` crate, saturating); read back through a 256-entry table × s;
//! * int8: per (row, KV head) s = amax / 127 and round(x / s) in −127..=127 (symmetric, as
//!   llama.cpp's q8_0 and KIVI's int8 baseline); read back as q · s.
//!
//! A NaN stays NaN: an element of f16/bf16 keeps it, and in the 8-bit formats it makes its
//! head's scale NaN, so the whole head reads back NaN; a broken activation is never quantized
//! into something finite.

use std::ops::Range;

use float8::F8E4M3;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kvlab_model::KvDtype;

/// Rows of (n_kv_heads, head_dim) elements in one dtype.
pub struct KvStore {
    data: Data,
    n_kv_heads: usize,
    head_dim: usize,
}

/// The elements, and the scales of the 8-bit formats. (rows, kv_dim), scales (rows, n_kv_heads)
enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Fp8 { q: Vec<u8>, scale: Vec<f32> },
    Int8 { q: Vec<i8>, scale: Vec<f32> },
}

/// E4M3's largest finite value.
const FP8_MAX: f32 = 448.0;

/// Every E4M3 bit pattern as f32 (NaN for 0x7F and 0xFF).
static FP8_TO_F32: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = F8E4M3::from_bits(i as u8).to_f32();
        i += 1;
    }
    t
};

impl KvStore {
    /// `rows` rows of zeros.
    pub fn new(dtype: KvDtype, rows: usize, n_kv_heads: usize, head_dim: usize) -> KvStore {
        let n = rows * n_kv_heads * head_dim;
        let data = match dtype {
            KvDtype::F32 => Data::F32(vec![0.0; n]),
            KvDtype::F16 => Data::F16(vec![f16::ZERO; n]),
            KvDtype::Bf16 => Data::Bf16(vec![bf16::ZERO; n]),
            KvDtype::Fp8E4m3 => Data::Fp8 {
                q: vec![0; n],
                scale: vec![0.0; rows * n_kv_heads],
            },
            KvDtype::Int8 => Data::Int8 {
                q: vec![0; n],
                scale: vec![0.0; rows * n_kv_heads],
            },
        };
        KvStore {
            data,
            n_kv_heads,
            head_dim,
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            Data::F32(_) => KvDtype::F32,
            Data::F16(_) => KvDtype::F16,
            Data::Bf16(_) => KvDtype::Bf16,
            Data::Fp8 { .. } => KvDtype::Fp8E4m3,
            Data::Int8 { .. } => KvDtype::Int8,
        }
    }

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Bytes of one row: n_kv_heads × `KvDtype::head_bytes(head_dim)`.
    pub fn row_bytes(&self) -> usize {
        self.n_kv_heads * self.dtype().head_bytes(self.head_dim)
    }

    /// Bytes the store takes: rows × [`KvStore::row_bytes`].
    pub fn bytes(&self) -> usize {
        self.rows() * self.row_bytes()
    }

    /// Rows it holds.
    pub fn rows(&self) -> usize {
        let n = match &self.data {
            Data::F32(x) => x.len(),
            Data::F16(x) => x.len(),
            Data::Bf16(x) => x.len(),
            Data::Fp8 { q, .. } => q.len(),
            Data::Int8 { q, .. } => q.len(),
        };
        n / self.kv_dim().max(1)
    }

    // ANCHOR: write
    /// Stores x (kv_dim,) at `row`, quantized.
    pub fn write(&mut self, row: usize, x: &[f32]) {
        let (kvd, hd) = (self.kv_dim(), self.head_dim);
        let at = row * kvd..(row + 1) * kvd;
        match &mut self.data {
            Data::F32(d) => d[at].copy_from_slice(x),
            Data::F16(d) => d[at].convert_from_f32_slice(x),
            Data::Bf16(d) => d[at].convert_from_f32_slice(x),
            Data::Fp8 { q, scale } => {
                let heads = q[at].chunks_exact_mut(hd).zip(x.chunks_exact(hd));
                for ((q, x), s) in heads.zip(&mut scale[row * self.n_kv_heads..]) {
                    *s = scale_for(x, FP8_MAX);
                    let inv = 1.0 / *s;
                    q.iter_mut()
                        .zip(x)
                        .for_each(|(q, x)| *q = F8E4M3::from_f32(x * inv).to_bits());
                }
            }
            Data::Int8 { q, scale } => {
                let heads = q[at].chunks_exact_mut(hd).zip(x.chunks_exact(hd));
                for ((q, x), s) in heads.zip(&mut scale[row * self.n_kv_heads..]) {
                    *s = scale_for(x, 127.0);
                    let inv = 1.0 / *s;
                    q.iter_mut()
                        .zip(x)
                        .for_each(|(q, x)| *q = (x * inv).round().clamp(-127.0, 127.0) as i8);
                }
            }
        }
    }
    // ANCHOR_END: write

    /// Rows `rows` as f32, (|rows|, kv_dim): in place for f32; otherwise the columns of KV heads
    /// `kv_heads` decoded into `tile` (the other columns are left as they were).
    #[inline]
    pub fn read<'a>(
        &'a self,
        rows: Range<usize>,
        kv_heads: Range<usize>,
        tile: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let (kvd, hd, nkv) = (self.kv_dim(), self.head_dim, self.n_kv_heads);
        let span = rows.start * kvd..rows.end * kvd;
        if let Data::F32(d) = &self.data {
            return &d[span];
        }
        if tile.len() < span.len() {
            tile.resize(span.len(), 0.0);
        }
        let tile = &mut tile[..span.len()];
        if kv_heads == (0..nkv) {
            // Every column: the rows are one stretch of the store, decoded in one pass.
            self.decode(span, rows.start * nkv..rows.end * nkv, tile);
        } else {
            let cols = kv_heads.start * hd..kv_heads.end * hd;
            for (r, out) in rows.zip(tile.chunks_exact_mut(kvd)) {
                let at = r * kvd + cols.start..r * kvd + cols.end;
                let scales = r * nkv + kv_heads.start..r * nkv + kv_heads.end;
                self.decode(at, scales, &mut out[cols.clone()]);
            }
        }
        tile
    }

    /// out ← the elements `at` as f32, whole heads whose scales are `scales`.
    #[inline(always)]
    fn decode(&self, at: Range<usize>, scales: Range<usize>, out: &mut [f32]) {
        let hd = self.head_dim;
        match &self.data {
            Data::F32(d) => out.copy_from_slice(&d[at]),
            Data::F16(d) => d[at].convert_to_f32_slice(out),
            Data::Bf16(d) => d[at].convert_to_f32_slice(out),
            Data::Fp8 { q, scale } => {
                decode_heads(out, &q[at], &scale[scales], hd, |q| FP8_TO_F32[q as usize])
            }
            Data::Int8 { q, scale } => decode_heads(out, &q[at], &scale[scales], hd, |q| q as f32),
        }
    }

    /// Rows `src..src + n` copied over `dst..dst + n` (copy-on-write of a block), scales with them.
    pub fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let (kvd, nkv) = (self.kv_dim(), self.n_kv_heads);
        let (from, to) = (src * kvd..(src + n) * kvd, dst * kvd);
        let (sfrom, sto) = (src * nkv..(src + n) * nkv, dst * nkv);
        match &mut self.data {
            Data::F32(d) => d.copy_within(from, to),
            Data::F16(d) => d.copy_within(from, to),
            Data::Bf16(d) => d.copy_within(from, to),
            Data::Fp8 { q, scale } => {
                q.copy_within(from, to);
                scale.copy_within(sfrom, sto);
            }
            Data::Int8 { q, scale } => {
                q.copy_within(from, to);
                scale.copy_within(sfrom, sto);
            }
        }
    }
}

/// out ← value(q) · s head by head: `q` and `out` are heads of `hd` elements, one scale each.
#[inline(always)]
fn decode_heads<Q: Copy>(
    out: &mut [f32],
    q: &[Q],
    scales: &[f32],
    hd: usize,
    value: impl Fn(Q) -> f32,
) {
    for ((o, q), &s) in out.chunks_exact_mut(hd).zip(q.chunks_exact(hd)).zip(scales) {
        o.iter_mut().zip(q).for_each(|(o, &q)| *o = value(q) * s);
    }
}

/// x (n_kv_heads·head_dim,) replaced by what a [`KvStore`] of `dtype` gives back for it: the
/// values attention reads for a row that went through the cache.
pub fn round_trip(dtype: KvDtype, n_kv_heads: usize, head_dim: usize, x: &mut [f32]) {
    if dtype == KvDtype::F32 {
        return;
    }
    let mut one = KvStore::new(dtype, 1, n_kv_heads, head_dim);
    let mut tile = Vec::new();
    for row in x.chunks_exact_mut(n_kv_heads * head_dim) {
        one.write(0, row);
        row.copy_from_slice(one.read(0..1, 0..n_kv_heads, &mut tile));
    }
}

/// The scale that maps the head's largest |x| to `max` (1 for an all-zero head); NaN if any x is.
fn scale_for(x: &[f32], max: f32) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| {
        if v.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    if amax == 0.0 { 1.0 } else { amax / max }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Each format reads back within its own rounding of what was written: half an ulp of the
    /// element for f16/bf16 (2^-11, 2^-8 relative), half a step of the head's grid for int8
    /// (amax / 254), and E4M3's half ulp (2^-4 relative) of x / s for fp8, plus its subnormal
    /// step; every row independently of its neighbours, columns of unread heads untouched.
    #[test]
    fn every_format_reads_back_within_its_rounding() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (nkv, hd, rows) = (3, 16, 7);
        let x: Vec<f32> = (0..rows * nkv * hd)
            .map(|i| rng.random_range(-4.0..4.0) * if i % 17 == 0 { 30.0 } else { 1.0 })
            .collect();
        for dtype in KvDtype::ALL {
            let mut s = KvStore::new(dtype, rows, nkv, hd);
            for (r, row) in x.chunks_exact(nkv * hd).enumerate() {
                s.write(r, row);
            }
            assert_eq!(s.bytes(), rows * nkv * dtype.head_bytes(hd));
            let mut tile = vec![f32::NAN; 2 * nkv * hd];
            let got = s.read(2..4, 1..3, &mut tile).to_vec();
            for r in 0..2 {
                for h in 0..nkv {
                    let x = &x[((2 + r) * nkv + h) * hd..][..hd];
                    let y = &got[(r * nkv + h) * hd..][..hd];
                    if h == 0 && dtype != KvDtype::F32 {
                        assert!(y.iter().all(|v| v.is_nan()), "{dtype}: head 0 was not read");
                        continue;
                    }
                    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    for (a, b) in x.iter().zip(y) {
                        let bound = match dtype {
                            KvDtype::F32 => 0.0,
                            KvDtype::F16 => a.abs() * 2f32.powi(-11),
                            KvDtype::Bf16 => a.abs() * 2f32.powi(-8),
                            KvDtype::Int8 => amax / 254.0 * 1.0001,
                            KvDtype::Fp8E4m3 => {
                                a.abs() * 2f32.powi(-4) + amax / FP8_MAX * 2f32.powi(-10)
                            }
                        };
                        assert!((a - b).abs() <= bound, "{dtype}: {a} read back as {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_makes_its_head_nan_and_zeros_stay_zero() {
        for dtype in KvDtype::ALL {
            let mut s = KvStore::new(dtype, 2, 2, 4);
            s.write(0, &[1.0, f32::NAN, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0]);
            s.write(1, &[0.0; 8]);
            let mut tile = Vec::new();
            let y = s.read(0..2, 0..2, &mut tile);
            assert!(y[1].is_nan(), "{dtype}");
            if matches!(dtype, KvDtype::Fp8E4m3 | KvDtype::Int8) {
                assert!(y[..4].iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
            }
            assert!(y[4..8].iter().all(|v| v.is_finite()), "{dtype}: {y:?}");
            assert_eq!(&y[8..], &[0.0; 8], "{dtype}");
        }
    }

    #[test]
    fn copied_rows_read_back_identical_and_round_trip_matches_the_store() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for dtype in KvDtype::ALL {
            let mut s = KvStore::new(dtype, 6, 2, 8);
            let x: Vec<f32> = (0..3 * 16).map(|_| rng.random_range(-1.0..1.0)).collect();
            for (r, row) in x.chunks_exact(16).enumerate() {
                s.write(r, row);
            }
            s.copy_rows(0, 3, 3);
            let (mut t1, mut t2) = (Vec::new(), Vec::new());
            assert_eq!(s.read(0..3, 0..2, &mut t1), s.read(3..6, 0..2, &mut t2));
            let mut y = x.clone();
            round_trip(dtype, 2, 8, &mut y);
            assert_eq!(&y[..], s.read(0..3, 0..2, &mut t1), "{dtype}");
        }
    }
}
