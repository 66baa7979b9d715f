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
//! * int4 (KIVI, asymmetric, two codes per byte, low nibble first): keys per channel over a
//!   group of `group` rows, values per row over groups of 32 channels of a head; each group has
//!   s = (max − min) / 15 and min, and x is stored as round((x − min) / s) in 0..=15, read back
//!   as q · s + min. A key group is quantized when its last row is written; until then its rows
//!   are kept in f32 (the residual) and read from there. Writing a row of a quantized key group
//!   (a ring wrapping, a truncated sequence going on) first decodes the group back into a
//!   residual, so its other rows read the same as before.
//!
//! A NaN stays NaN: an element of f16/bf16 keeps it, and in the 8-bit formats it makes its
//! head's scale NaN, so the whole head reads back NaN; a broken activation is never quantized
//! into something finite.

use std::ops::Range;

use float8::F8E4M3;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kvlab_model::huge_pages::zeroed;
use kvlab_model::{GgmlType, KvDtype};

use crate::quant::decode_rows;

/// One of a KV cache's two tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// K: int4 quantizes it per channel over groups of rows.
    Keys,
    /// V: int4 quantizes it per row over groups of 32 channels.
    Values,
}

impl Part {
    /// `keys` or `values`, whichever this part names.
    #[inline(always)]
    pub fn pick<T>(self, keys: T, values: T) -> T {
        match self {
            Part::Keys => keys,
            Part::Values => values,
        }
    }
}

/// Rows of (n_kv_heads, head_dim) elements in one dtype.
pub struct KvStore {
    data: Data,
    n_kv_heads: usize,
    head_dim: usize,
    rows: usize,
}

/// The elements, and the scales of the 8-bit formats. (rows, kv_dim), scales (rows, n_kv_heads)
enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Fp8 {
        q: Vec<u8>,
        scale: Vec<f32>,
    },
    Int8 {
        q: Vec<i8>,
        scale: Vec<f32>,
    },
    /// q (rows, n_kv_heads, ⌈head_dim / 2⌉) codes; scale and min (groups, kv_dim); `open`
    /// (groups,): the (group, kv_dim) f32 rows of a group not quantized yet.
    Int4Keys {
        q: Vec<u8>,
        scale: Vec<f32>,
        min: Vec<f32>,
        group: usize,
        open: Vec<Option<Box<[f32]>>>,
    },
    /// q as keys; scale and min (rows, n_kv_heads, ⌈head_dim / 32⌉).
    Int4Values {
        q: Vec<u8>,
        scale: Vec<f32>,
        min: Vec<f32>,
    },
}

/// Channels of a head that share one int4 value scale.
const VALUE_GROUP: usize = KvDtype::INT4_VALUE_GROUP;

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
    /// `rows` rows of zeros holding the `part` of a cache. `group`: rows whose int4 keys share
    /// their scales (rows a multiple of it, or the last group is never quantized); ignored by
    /// the other dtypes.
    pub fn new(
        dtype: KvDtype,
        part: Part,
        rows: usize,
        (n_kv_heads, head_dim): (usize, usize),
        group: usize,
    ) -> KvStore {
        let n = rows * n_kv_heads * head_dim;
        let heads = rows * n_kv_heads;
        let codes = heads * head_dim.div_ceil(2);
        let data = match (dtype, part) {
            (KvDtype::F32, _) => Data::F32(zeroed(n)),
            (KvDtype::F16, _) => Data::F16(zeroed(n)),
            (KvDtype::Bf16, _) => Data::Bf16(zeroed(n)),
            (KvDtype::Fp8E4m3, _) => Data::Fp8 {
                q: zeroed(n),
                scale: vec![0.0; heads],
            },
            (KvDtype::Int8, _) => Data::Int8 {
                q: zeroed(n),
                scale: vec![0.0; heads],
            },
            (KvDtype::Int4, Part::Keys) => {
                let group = group.max(1);
                let groups = rows.div_ceil(group);
                Data::Int4Keys {
                    q: zeroed(codes),
                    scale: vec![0.0; groups * n_kv_heads * head_dim],
                    min: vec![0.0; groups * n_kv_heads * head_dim],
                    group,
                    open: (0..groups).map(|_| None).collect(),
                }
            }
            (KvDtype::Int4, Part::Values) => Data::Int4Values {
                q: zeroed(codes),
                scale: vec![0.0; heads * head_dim.div_ceil(VALUE_GROUP)],
                min: vec![0.0; heads * head_dim.div_ceil(VALUE_GROUP)],
            },
        };
        KvStore {
            data,
            n_kv_heads,
            head_dim,
            rows,
        }
    }

    /// The dtype the rows are stored in.
    pub fn dtype(&self) -> KvDtype {
        match self.data {
            Data::F32(_) => KvDtype::F32,
            Data::F16(_) => KvDtype::F16,
            Data::Bf16(_) => KvDtype::Bf16,
            Data::Fp8 { .. } => KvDtype::Fp8E4m3,
            Data::Int8 { .. } => KvDtype::Int8,
            Data::Int4Keys { .. } | Data::Int4Values { .. } => KvDtype::Int4,
        }
    }

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Bytes `rows` rows take, scales included: n_kv_heads × `KvDtype::key_bytes` (int4 keys:
    /// whole groups) or `KvDtype::value_bytes`.
    pub fn bytes_for(&self, rows: usize) -> usize {
        let (nkv, hd, dtype) = (self.n_kv_heads, self.head_dim, self.dtype());
        match &self.data {
            Data::Int4Keys { group, .. } => nkv * dtype.key_bytes(hd, rows, *group),
            _ => nkv * dtype.value_bytes(hd, rows),
        }
    }

    /// Bytes the store reserves: [`KvStore::bytes_for`] all its rows.
    pub fn bytes(&self) -> usize {
        self.bytes_for(self.rows)
    }

    /// Bytes of int4 key groups held in f32 until they are complete (KIVI's residual), not
    /// part of [`KvStore::bytes`]; 0 for the other formats.
    pub fn residual_bytes(&self) -> usize {
        match &self.data {
            Data::Int4Keys { open, .. } => open.iter().flatten().map(|r| 4 * r.len()).sum(),
            _ => 0,
        }
    }

    /// Rows it holds.
    pub fn rows(&self) -> usize {
        self.rows
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
                let scale = &mut scale[row * self.n_kv_heads..];
                write_scaled_heads(&mut q[at], x, hd, scale, FP8_MAX, |v| {
                    F8E4M3::from_f32(v).to_bits()
                });
            }
            Data::Int8 { q, scale } => {
                let scale = &mut scale[row * self.n_kv_heads..];
                write_scaled_heads(&mut q[at], x, hd, scale, 127.0, |v| {
                    v.round().clamp(-127.0, 127.0) as i8
                });
            }
            Data::Int4Values { q, scale, min } => {
                let (hb, vg) = (hd.div_ceil(2), hd.div_ceil(VALUE_GROUP));
                let q = &mut q[row * self.n_kv_heads * hb..][..self.n_kv_heads * hb];
                let stats = row * self.n_kv_heads * vg..(row + 1) * self.n_kv_heads * vg;
                let (scale, min) = (&mut scale[stats.clone()], &mut min[stats]);
                for (h, (q, x)) in q.chunks_exact_mut(hb).zip(x.chunks_exact(hd)).enumerate() {
                    for (c, x) in x.chunks(VALUE_GROUP).enumerate() {
                        let (s, m) = int4_range(x.iter().copied());
                        (scale[h * vg + c], min[h * vg + c]) = (s, m);
                        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                        for (i, &x) in x.iter().enumerate() {
                            set_nibble(q, c * VALUE_GROUP + i, int4_code(x, m, inv));
                        }
                    }
                }
            }
            Data::Int4Keys { .. } => self.write_key_int4(row, x),
        }
    }
    // ANCHOR_END: write

    /// An int4 key row: into its group's residual (decoding the group first if it was
    /// quantized); the group is quantized when its last row arrives.
    fn write_key_int4(&mut self, row: usize, x: &[f32]) {
        let (kvd, nkv, hd) = (self.kv_dim(), self.n_kv_heads, self.head_dim);
        let Data::Int4Keys { group, open, .. } = &self.data else {
            unreachable!("int4 keys")
        };
        let (group, g) = (*group, row / *group);
        // A quantized group is decoded back first, so its other rows read as before.
        let reopened = open[g].is_none().then(|| {
            let rows = g * group..((g + 1) * group).min(self.rows);
            let mut residual = vec![0.0; group * kvd].into_boxed_slice();
            self.decode_int4(rows, 0..nkv, &mut residual);
            residual
        });
        let Data::Int4Keys {
            q,
            scale,
            min,
            open,
            ..
        } = &mut self.data
        else {
            unreachable!("int4 keys")
        };
        let residual = match reopened {
            Some(residual) => open[g].insert(residual),
            None => open[g].as_mut().expect("a group not quantized is open"),
        };
        residual[(row % group) * kvd..][..kvd].copy_from_slice(x);
        if row % group != group - 1 {
            return;
        }
        // The group is complete: per channel, its range over the group's rows.
        let hb = hd.div_ceil(2);
        for ch in 0..kvd {
            let column = residual.iter().skip(ch).step_by(kvd).copied();
            let (s, m) = int4_range(column);
            (scale[g * kvd + ch], min[g * kvd + ch]) = (s, m);
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            let (h, i) = (ch / hd, ch % hd);
            for (r, x) in residual.chunks_exact(kvd).enumerate() {
                let head = ((g * group + r) * nkv + h) * hb;
                set_nibble(&mut q[head..head + hb], i, int4_code(x[ch], m, inv));
            }
        }
        open[g] = None;
    }

    /// int4 rows `rows` into `out` (|rows|, kv_dim), only the columns of KV heads `kv_heads`.
    fn decode_int4(&self, rows: Range<usize>, kv_heads: Range<usize>, out: &mut [f32]) {
        let (kvd, hd, nkv) = (self.kv_dim(), self.head_dim, self.n_kv_heads);
        let hb = hd.div_ceil(2);
        let cols = kv_heads.start * hd..kv_heads.end * hd;
        for (r, out) in rows.zip(out.chunks_exact_mut(kvd)) {
            match &self.data {
                Data::Int4Keys {
                    q,
                    scale,
                    min,
                    group,
                    open,
                } => {
                    let g = r / group;
                    if let Some(residual) = &open[g] {
                        let row = &residual[(r % group) * kvd..][..kvd];
                        out[cols.clone()].copy_from_slice(&row[cols.clone()]);
                        continue;
                    }
                    for h in kv_heads.clone() {
                        let at = g * kvd + h * hd..g * kvd + (h + 1) * hd;
                        let (s, m) = (&scale[at.clone()], &min[at]);
                        let q = &q[(r * nkv + h) * hb..][..hb];
                        let o = &mut out[h * hd..(h + 1) * hd];
                        unpack_int4_channels(q, s, m, o);
                    }
                }
                Data::Int4Values { q, scale, min } => {
                    let vg = hd.div_ceil(VALUE_GROUP);
                    for h in kv_heads.clone() {
                        let st = (r * nkv + h) * vg;
                        let q = &q[(r * nkv + h) * hb..][..hb];
                        let o = &mut out[h * hd..(h + 1) * hd];
                        let (s, m) = (&scale[st..st + vg], &min[st..st + vg]);
                        let chunks = o.chunks_mut(VALUE_GROUP).zip(q.chunks(VALUE_GROUP / 2));
                        for ((o, q), (&s, &m)) in chunks.zip(s.iter().zip(m)) {
                            unpack_int4_uniform(q, s, m, o);
                        }
                    }
                }
                _ => unreachable!("int4 only"),
            }
        }
    }

    /// Rows `rows` as stored, (|rows|, kv_dim) IEEE half-precision bits, where the store is f16
    /// (for kernels that convert in registers); `None` for every other dtype.
    #[inline]
    pub fn raw_f16(&self, rows: Range<usize>) -> Option<&[u16]> {
        let kvd = self.kv_dim();
        match &self.data {
            Data::F16(d) => Some(d[rows.start * kvd..rows.end * kvd].reinterpret_cast()),
            _ => None,
        }
    }

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
        if matches!(self.data, Data::Int4Keys { .. } | Data::Int4Values { .. }) {
            self.decode_int4(rows, kv_heads, tile);
        } else if kv_heads == (0..nkv) {
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
            Data::F16(d) => decode_rows(GgmlType::F16, bytemuck::cast_slice(&d[at]), out),
            Data::Bf16(d) => decode_rows(GgmlType::BF16, bytemuck::cast_slice(&d[at]), out),
            Data::Fp8 { q, scale } => {
                decode_heads(out, &q[at], &scale[scales], hd, |q| FP8_TO_F32[q as usize])
            }
            Data::Int8 { q, scale } => decode_heads(out, &q[at], &scale[scales], hd, |q| q as f32),
            Data::Int4Keys { .. } | Data::Int4Values { .. } => unreachable!("decode_int4"),
        }
    }

    /// Rows `src..src + n` copied over `dst..dst + n` (copy-on-write of a block), scales with
    /// them; int4 keys copy whole groups as stored, a run not aligned to groups row by row.
    pub fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let (kvd, nkv) = (self.kv_dim(), self.n_kv_heads);
        let hb = self.head_dim.div_ceil(2);
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
            Data::Int4Values { q, scale, min } => {
                let vg = nkv * self.head_dim.div_ceil(VALUE_GROUP);
                q.copy_within(src * nkv * hb..(src + n) * nkv * hb, dst * nkv * hb);
                scale.copy_within(src * vg..(src + n) * vg, dst * vg);
                min.copy_within(src * vg..(src + n) * vg, dst * vg);
            }
            Data::Int4Keys {
                q,
                scale,
                min,
                group,
                open,
            } if (src % *group, dst % *group, n % *group) == (0, 0, 0) => {
                let (gs, gd, gn) = (src / *group, dst / *group, n / *group);
                q.copy_within(src * nkv * hb..(src + n) * nkv * hb, dst * nkv * hb);
                scale.copy_within(gs * kvd..(gs + gn) * kvd, gd * kvd);
                min.copy_within(gs * kvd..(gs + gn) * kvd, gd * kvd);
                for i in 0..gn {
                    open[gd + i] = open[gs + i].clone();
                }
            }
            Data::Int4Keys { .. } => {
                let mut row = vec![0.0; kvd];
                for i in 0..n {
                    self.decode_int4(src + i..src + i + 1, 0..nkv, &mut row);
                    self.write_key_int4(dst + i, &row);
                }
            }
        }
    }
}

/// Appends `x` to `out` as little-endian bytes.
fn put<T: Copy, const N: usize>(out: &mut Vec<u8>, x: &[T], to_bytes: impl Fn(T) -> [u8; N]) {
    out.reserve(x.len() * N);
    for &v in x {
        out.extend_from_slice(&to_bytes(v));
    }
}

/// Fills `x` from the front of `bytes` (little-endian), advancing it; `None` if too short.
fn get<T, const N: usize>(
    bytes: &mut &[u8],
    x: &mut [T],
    from: impl Fn([u8; N]) -> T,
) -> Option<()> {
    let (head, rest) = bytes.split_at_checked(x.len() * N)?;
    for (v, b) in x.iter_mut().zip(head.chunks_exact(N)) {
        *v = from(b.try_into().ok()?);
    }
    *bytes = rest;
    Some(())
}

impl KvStore {
    /// Appends rows `start..start + n` to `out` exactly as stored (codes, scales, and an int4
    /// key group's f32 residual), for a tier below the pool; [`KvStore::load_rows`] reads them
    /// back bit-identical. `None` for int4 keys when the rows are not whole groups.
    pub fn save_rows(&self, start: usize, n: usize, out: &mut Vec<u8>) -> Option<()> {
        let (kvd, nkv, hb) = (self.kv_dim(), self.n_kv_heads, self.head_dim.div_ceil(2));
        let rows = start * kvd..(start + n) * kvd;
        let heads = start * nkv..(start + n) * nkv;
        match &self.data {
            Data::F32(d) => put(out, &d[rows], f32::to_le_bytes),
            Data::F16(d) => put(out, &d[rows], |v| v.to_bits().to_le_bytes()),
            Data::Bf16(d) => put(out, &d[rows], |v| v.to_bits().to_le_bytes()),
            Data::Fp8 { q, scale } => {
                out.extend_from_slice(&q[rows]);
                put(out, &scale[heads], f32::to_le_bytes);
            }
            Data::Int8 { q, scale } => {
                put(out, &q[rows], i8::to_le_bytes);
                put(out, &scale[heads], f32::to_le_bytes);
            }
            Data::Int4Values { q, scale, min } => {
                let vg = nkv * self.head_dim.div_ceil(VALUE_GROUP);
                out.extend_from_slice(&q[start * nkv * hb..(start + n) * nkv * hb]);
                put(out, &scale[start * vg..(start + n) * vg], f32::to_le_bytes);
                put(out, &min[start * vg..(start + n) * vg], f32::to_le_bytes);
            }
            Data::Int4Keys {
                q,
                scale,
                min,
                group,
                open,
            } => {
                if !start.is_multiple_of(*group) || !n.is_multiple_of(*group) {
                    return None;
                }
                let groups = start / group..(start + n) / group;
                let per_group = groups.start * kvd..groups.end * kvd;
                out.extend_from_slice(&q[start * nkv * hb..(start + n) * nkv * hb]);
                put(out, &scale[per_group.clone()], f32::to_le_bytes);
                put(out, &min[per_group], f32::to_le_bytes);
                for residual in &open[groups] {
                    out.push(u8::from(residual.is_some()));
                    if let Some(r) = residual {
                        put(out, r, f32::to_le_bytes);
                    }
                }
            }
        }
        Some(())
    }

    /// Overwrites rows `start..start + n` from the front of `bytes`, written by
    /// [`KvStore::save_rows`] for the same rows of a store of this shape and dtype, and advances
    /// `bytes` past them. `None` (rows possibly half written) if `bytes` is too short or
    /// malformed, or int4 key rows are not whole groups.
    pub fn load_rows(&mut self, start: usize, n: usize, bytes: &mut &[u8]) -> Option<()> {
        let (kvd, nkv, hb) = (self.kv_dim(), self.n_kv_heads, self.head_dim.div_ceil(2));
        let rows = start * kvd..(start + n) * kvd;
        let heads = start * nkv..(start + n) * nkv;
        let le_f32 = f32::from_le_bytes;
        match &mut self.data {
            Data::F32(d) => get(bytes, &mut d[rows], le_f32),
            Data::F16(d) => get(bytes, &mut d[rows], |b| {
                f16::from_bits(u16::from_le_bytes(b))
            }),
            Data::Bf16(d) => get(bytes, &mut d[rows], |b| {
                bf16::from_bits(u16::from_le_bytes(b))
            }),
            Data::Fp8 { q, scale } => {
                get(bytes, &mut q[rows], |[b]: [u8; 1]| b)?;
                get(bytes, &mut scale[heads], le_f32)
            }
            Data::Int8 { q, scale } => {
                get(bytes, &mut q[rows], i8::from_le_bytes)?;
                get(bytes, &mut scale[heads], le_f32)
            }
            Data::Int4Values { q, scale, min } => {
                let vg = nkv * self.head_dim.div_ceil(VALUE_GROUP);
                let codes = start * nkv * hb..(start + n) * nkv * hb;
                get(bytes, &mut q[codes], |[b]: [u8; 1]| b)?;
                get(bytes, &mut scale[start * vg..(start + n) * vg], le_f32)?;
                get(bytes, &mut min[start * vg..(start + n) * vg], le_f32)
            }
            Data::Int4Keys {
                q,
                scale,
                min,
                group,
                open,
            } => {
                let group = *group;
                if !start.is_multiple_of(group) || !n.is_multiple_of(group) {
                    return None;
                }
                let groups = start / group..(start + n) / group;
                let per_group = groups.start * kvd..groups.end * kvd;
                let codes = start * nkv * hb..(start + n) * nkv * hb;
                get(bytes, &mut q[codes], |[b]: [u8; 1]| b)?;
                get(bytes, &mut scale[per_group.clone()], le_f32)?;
                get(bytes, &mut min[per_group], le_f32)?;
                for residual in &mut open[groups] {
                    let (&flag, rest) = bytes.split_first()?;
                    *bytes = rest;
                    *residual = match flag {
                        0 => None,
                        1 => {
                            let mut r = vec![0.0; group * kvd].into_boxed_slice();
                            get(bytes, &mut r, le_f32)?;
                            Some(r)
                        }
                        _ => return None,
                    };
                }
                Some(())
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

/// (s, min) of int4 over the values `x`: s = (max − min) / 15 (0 if they are all equal), both
/// NaN if any x is.
fn int4_range(x: impl Iterator<Item = f32>) -> (f32, f32) {
    let (mut lo, mut hi, mut nan) = (f32::INFINITY, f32::NEG_INFINITY, false);
    for x in x {
        nan |= x.is_nan();
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if nan {
        (f32::NAN, f32::NAN)
    } else {
        ((hi - lo) / 15.0, lo)
    }
}

/// The code of x in 0..=15 on the grid min + q · s (`inv` = 1 / s, 0 for a flat group).
#[inline(always)]
fn int4_code(x: f32, min: f32, inv: f32) -> u8 {
    ((x - min) * inv).round().clamp(0.0, 15.0) as u8
}

/// Element i of a head's codes ← code: byte i / 2, low nibble for even i.
#[inline(always)]
fn set_nibble(q: &mut [u8], i: usize, code: u8) {
    let b = &mut q[i / 2];
    *b = if i.is_multiple_of(2) {
        (*b & 0xF0) | code
    } else {
        (*b & 0x0F) | (code << 4)
    };
}

/// out[i] ← code i · s[i] + m[i]: a head's codes, two per byte, low nibble first, each channel
/// with its own scale and minimum (int4 keys).
#[inline(always)]
fn unpack_int4_channels(q: &[u8], s: &[f32], m: &[f32], out: &mut [f32]) {
    let n = out.len();
    let pairs = out.chunks_exact_mut(2).zip(q);
    for ((o, &b), (s, m)) in pairs.zip(s.chunks_exact(2).zip(m.chunks_exact(2))) {
        o[0] = (b & 0x0F) as f32 * s[0] + m[0];
        o[1] = (b >> 4) as f32 * s[1] + m[1];
    }
    if n % 2 == 1 {
        out[n - 1] = (q[n / 2] & 0x0F) as f32 * s[n - 1] + m[n - 1];
    }
}

/// out[i] ← code i · s + m: codes as above sharing one scale and minimum (an int4 value group).
#[inline(always)]
fn unpack_int4_uniform(q: &[u8], s: f32, m: f32, out: &mut [f32]) {
    let n = out.len();
    for (o, &b) in out.chunks_exact_mut(2).zip(q) {
        o[0] = (b & 0x0F) as f32 * s + m;
        o[1] = (b >> 4) as f32 * s + m;
    }
    if n % 2 == 1 {
        out[n - 1] = (q[n / 2] & 0x0F) as f32 * s + m;
    }
}

/// x (rows, n_kv_heads·head_dim) replaced by what a [`KvStore`] of `dtype` holding the `part`
/// with int4 key groups of `group` rows gives back once x is written into it from row 0: the
/// values attention reads for rows that went through the cache. (int4 keys of a complete group
/// come back quantized per channel, those of the unfinished last group as written; a group of
/// one is a key alone, and comes back as written.)
pub fn round_trip(
    dtype: KvDtype,
    part: Part,
    (n_kv_heads, head_dim): (usize, usize),
    group: usize,
    x: &mut [f32],
) {
    if dtype == KvDtype::F32 {
        return;
    }
    let kvd = n_kv_heads * head_dim;
    let rows = x.len() / kvd;
    let mut store = KvStore::new(dtype, part, rows, (n_kv_heads, head_dim), group);
    for (r, row) in x.chunks_exact(kvd).enumerate() {
        store.write(r, row);
    }
    let mut tile = Vec::new();
    x.copy_from_slice(store.read(0..rows, 0..n_kv_heads, &mut tile));
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

/// One row of 8-bit codes with a scale per KV head: each head's `head_dim` values `x` are
/// divided by the head's scale (its absolute maximum over `max`, [`scale_for`]) and coded by
/// `code`. `q` and `x` are (n_kv_heads, head_dim); `scale` starts at the row's first head.
fn write_scaled_heads<T>(
    q: &mut [T],
    x: &[f32],
    head_dim: usize,
    scale: &mut [f32],
    max: f32,
    code: impl Fn(f32) -> T,
) {
    let heads = q.chunks_exact_mut(head_dim).zip(x.chunks_exact(head_dim));
    for ((q, x), s) in heads.zip(scale) {
        *s = scale_for(x, max);
        let inv = 1.0 / *s;
        q.iter_mut().zip(x).for_each(|(q, x)| *q = code(x * inv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The half-step of int4's grid over `x`: (max − min) / 30.
    fn int4_half_step(x: impl Iterator<Item = f32> + Clone) -> f32 {
        let lo = x.clone().fold(f32::INFINITY, f32::min);
        let hi = x.fold(f32::NEG_INFINITY, f32::max);
        (hi - lo) / 30.0
    }

    /// Each format reads back within its own rounding of what was written: half an ulp of the
    /// element for f16/bf16 (2^-11, 2^-8 relative), half a step of the head's grid for int8
    /// (amax / 254), and E4M3's half ulp (2^-4 relative) of x / s for fp8, plus its subnormal
    /// step; int4 half a step of its group's grid (a key's channel over the group's rows, a
    /// value's 32 channels); columns of unread heads untouched.
    #[test]
    fn every_format_reads_back_within_its_rounding() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (nkv, hd, rows, group) = (3, 40, 8, 4);
        let kvd = nkv * hd;
        let all: Vec<f32> = (0..rows * kvd)
            .map(|i| rng.random_range(-4.0..4.0) * if i % 17 == 0 { 30.0 } else { 1.0 })
            .collect();
        for dtype in KvDtype::ALL {
            for part in [Part::Keys, Part::Values] {
                let mut s = KvStore::new(dtype, part, rows, (nkv, hd), group);
                for (r, row) in all.chunks_exact(kvd).enumerate() {
                    s.write(r, row);
                }
                let other = match part {
                    Part::Keys => Part::Values,
                    Part::Values => Part::Keys,
                };
                let both = s.bytes() + KvStore::new(dtype, other, rows, (nkv, hd), group).bytes();
                let formula = nkv * dtype.kv_head_bytes(hd, rows, dtype.group(group));
                assert_eq!(both, formula, "{dtype}");
                assert_eq!(s.residual_bytes(), 0, "{dtype}: every group is complete");
                let mut tile = vec![f32::NAN; 2 * kvd];
                let got = s.read(5..7, 1..3, &mut tile).to_vec();
                for r in 0..2 {
                    for h in 0..nkv {
                        let x = &all[((5 + r) * nkv + h) * hd..][..hd];
                        let y = &got[(r * nkv + h) * hd..][..hd];
                        if h == 0 && dtype != KvDtype::F32 {
                            assert!(y.iter().all(|v| v.is_nan()), "{dtype}: head 0 was not read");
                            continue;
                        }
                        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        for (i, (a, b)) in x.iter().zip(y).enumerate() {
                            let bound = match (dtype, part) {
                                (KvDtype::F32, _) => 0.0,
                                (KvDtype::F16, _) => a.abs() * 2f32.powi(-11),
                                (KvDtype::Bf16, _) => a.abs() * 2f32.powi(-8),
                                (KvDtype::Int8, _) => amax / 254.0 * 1.0001,
                                (KvDtype::Fp8E4m3, _) => {
                                    a.abs() * 2f32.powi(-4) + amax / FP8_MAX * 2f32.powi(-10)
                                }
                                (KvDtype::Int4, Part::Keys) => {
                                    let ch = h * hd + i;
                                    let column = (4..8).map(|r| all[r * kvd + ch]);
                                    int4_half_step(column) * 1.0001
                                }
                                (KvDtype::Int4, Part::Values) => {
                                    let c = i / VALUE_GROUP * VALUE_GROUP;
                                    let chunk = x[c..(c + VALUE_GROUP).min(hd)].iter().copied();
                                    int4_half_step(chunk) * 1.0001
                                }
                            };
                            assert!(
                                (a - b).abs() <= bound,
                                "{dtype} {part:?}: {a} read back as {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_makes_its_head_nan_and_zeros_stay_zero() {
        for dtype in KvDtype::ALL {
            for part in [Part::Keys, Part::Values] {
                let mut s = KvStore::new(dtype, part, 2, (2, 4), 1);
                s.write(0, &[1.0, f32::NAN, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0]);
                s.write(1, &[0.0; 8]);
                let mut tile = Vec::new();
                let y = s.read(0..2, 0..2, &mut tile);
                assert!(y[1].is_nan(), "{dtype}");
                if matches!(dtype, KvDtype::Fp8E4m3 | KvDtype::Int8)
                    || (dtype, part) == (KvDtype::Int4, Part::Values)
                {
                    assert!(y[..4].iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
                }
                assert!(y[4..8].iter().all(|v| v.is_finite()), "{dtype}: {y:?}");
                assert_eq!(&y[8..], &[0.0; 8], "{dtype}");
            }
        }
    }

    /// An int4 key group stays f32 until its last row, and is then quantized per channel; a
    /// NaN poisons its channel across the group.
    #[test]
    fn int4_keys_are_exact_until_their_group_is_complete() {
        let (nkv, hd, group) = (2, 5, 4);
        let mut s = KvStore::new(KvDtype::Int4, Part::Keys, 8, (nkv, hd), group);
        let row = |r: usize| -> Vec<f32> {
            (0..nkv * hd)
                .map(|c| (r * 13 + c * 7) as f32 / 10.0 + 0.0123)
                .collect()
        };
        let mut tile = Vec::new();
        for r in 0..3 {
            s.write(r, &row(r));
        }
        assert_eq!(s.residual_bytes(), 4 * group * nkv * hd);
        assert_eq!(
            s.read(0..3, 0..nkv, &mut tile),
            [row(0), row(1), row(2)].concat()
        );
        s.write(3, &row(3));
        assert_eq!(s.residual_bytes(), 0);
        assert_ne!(
            s.read(0..4, 0..nkv, &mut tile),
            [row(0), row(1), row(2), row(3)].concat()
        );
        let mut poisoned = row(5);
        poisoned[7] = f32::NAN;
        for r in 4..8 {
            let x = if r == 5 { poisoned.clone() } else { row(r) };
            s.write(r, &x);
        }
        let y = s.read(4..8, 0..nkv, &mut tile).to_vec();
        for (r, y) in y.chunks_exact(nkv * hd).enumerate() {
            assert!(y[7].is_nan(), "row {r}: channel 7 is NaN across the group");
            assert!(y.iter().enumerate().all(|(c, v)| c == 7 || v.is_finite()));
        }
    }

    /// Writing into a quantized group (a ring wrapping, a truncated sequence going on) keeps
    /// the group's other rows as they read before.
    #[test]
    fn reopening_an_int4_group_keeps_its_other_rows() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut s = KvStore::new(KvDtype::Int4, Part::Keys, 8, (1, 8), 8);
        for r in 0..8 {
            let x: Vec<f32> = (0..8).map(|_| rng.random_range(-1.0..1.0)).collect();
            s.write(r, &x);
        }
        let mut tile = Vec::new();
        let before = s.read(0..8, 0..1, &mut tile).to_vec();
        s.write(3, &[9.0; 8]);
        let after = s.read(0..8, 0..1, &mut tile).to_vec();
        assert_eq!(&after[..24], &before[..24]);
        assert_eq!(&after[24..32], &[9.0; 8]);
        assert_eq!(&after[32..], &before[32..]);
    }

    /// A store of `rows` rows with `x`'s rows written from row 0.
    fn store_with(
        dtype: KvDtype,
        part: Part,
        rows: usize,
        shape: (usize, usize),
        group: usize,
        x: &[f32],
    ) -> KvStore {
        let mut s = KvStore::new(dtype, part, rows, shape, group);
        for (r, row) in x.chunks_exact(shape.0 * shape.1).enumerate() {
            s.write(r, row);
        }
        s
    }

    #[test]
    fn copied_rows_read_back_identical_and_round_trip_matches_the_store() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for dtype in KvDtype::ALL {
            for part in [Part::Keys, Part::Values] {
                let x: Vec<f32> = (0..3 * 16).map(|_| rng.random_range(-1.0..1.0)).collect();
                let mut s = store_with(dtype, part, 6, (2, 8), 3, &x);
                s.copy_rows(0, 3, 3);
                let (mut t1, mut t2) = (Vec::new(), Vec::new());
                assert_eq!(s.read(0..3, 0..2, &mut t1), s.read(3..6, 0..2, &mut t2));
                let one = store_with(dtype, part, 6, (2, 8), 1, &x);
                let mut y = x.clone();
                round_trip(dtype, part, (2, 8), 1, &mut y);
                assert_eq!(&y[..], one.read(0..3, 0..2, &mut t1), "{dtype}");
            }
        }
    }

    /// What `save_rows` gives, `load_rows` puts back bit for bit, in another store of the same
    /// shape and at another place: codes, scales and an open int4 group's f32 residual. Bytes
    /// of the wrong length are refused.
    #[test]
    fn saved_rows_load_back_bit_identical() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        for dtype in KvDtype::ALL {
            for part in [Part::Keys, Part::Values] {
                // Rows 0..4 one complete group of 4, rows 4..6 an open one (int4 keys).
                let x: Vec<f32> = (0..6 * 80).map(|_| rng.random_range(-3.0..3.0)).collect();
                let s = store_with(dtype, part, 8, (2, 40), 4, &x);
                let mut bytes = Vec::new();
                s.save_rows(0, 8, &mut bytes).unwrap();
                let mut t = KvStore::new(dtype, part, 16, (2, 40), 4);
                let mut rest = &bytes[..];
                t.load_rows(8, 8, &mut rest).unwrap();
                assert!(rest.is_empty(), "{dtype} {part:?}: all bytes read");
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let (a, b) = (s.read(0..8, 0..2, &mut a), t.read(8..16, 0..2, &mut b));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(a), bits(b), "{dtype} {part:?}");
                let mut again = Vec::new();
                t.save_rows(8, 8, &mut again).unwrap();
                assert_eq!(
                    bytes, again,
                    "{dtype} {part:?}: saved again, the same bytes"
                );
                let mut short = &bytes[..bytes.len() - 1];
                assert!(t.load_rows(8, 8, &mut short).is_none(), "{dtype} {part:?}");
            }
        }
        let s = KvStore::new(KvDtype::Int4, Part::Keys, 8, (2, 40), 4);
        assert!(
            s.save_rows(2, 4, &mut Vec::new()).is_none(),
            "int4 keys: whole groups only"
        );
    }
}
