//! Q8_0 (and Q5_0) weights times 8-bit activations on AMX-INT8 tiles (Intel Sapphire Rapids
//! and later): the same product as the `vpdpbusd` kernel, a 16 × 16 tile of (W row, token) sums
//! per instruction. Q5_0 is the same product once its 5-bit codes u are written as the int8
//! u − 16 beside the same scale ([`q5_0_as_q8_0`]), 16 rows at a time.
//!
//! **The product.** A Q8_0 block is an f16 scale and 32 int8 codes; an activation block of
//! [`Q8Rows`] is an f32 scale and 32 int8 codes. For W row j and token i,
//!
//! ```text
//! S_b = Σ_{κ in block b} q_w[j][κ] · q_x[i][κ]              (exact, in i32)
//! y   = Σ_b f32(S_b) · (d_w[j][b] · d_x[i][b])               (one FMA per block, b in order)
//! ```
//!
//! `tdpbssd` computes S_b for 16 rows and up to 16 tokens at once: tile A is 16 W rows × the
//! block's 32 codes, read in place from the Q8_0 rows (a row stride of the row's bytes, so no
//! repacking), tile B the block's codes of the tokens in the "VNNI" layout (8 rows of 4 codes ×
//! token), tile C the 16 × 16 sums. Each block's sums are then scaled and added in f32.
//! [`reference()`] is that formula as a plain loop: the kernel gives its bits exactly (tested),
//! and, like the `vpdpbusd` kernel, a token's output does not depend on its batch-mates.
//!
//! **Where it runs.** [`available`]: the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7), and the
//! AVX-512F/BW and F16C the scaling uses, and Linux granted this process the tile data state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`, asked once). `KVLAB_AMX=off` turns it off
//! (the `vpdpbusd` kernel then runs, for comparing the two). The instructions are written with
//! `asm!` (Rust's AMX intrinsics are unstable); the tile registers are never used by compiled
//! code, so they keep their contents between the `asm!` blocks of one call.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use kvlab_model::GgmlType;

use super::{Q8Rows, QK, vnni};

/// Bytes per Q8_0 block: the f16 scale d, then 32 int8 codes.
pub(super) const BLOCK_BYTES: usize = 34;
/// W rows per tile (tile A's and C's rows).
const TILE_ROWS: usize = 16;
/// Tokens per tile (tile C's columns, tile B's 4-byte groups).
const TILE_TOKENS: usize = 16;
/// How many stripes of 16 rows ahead W is prefetched (about 22 KiB at Gemma's 640 columns).
const PREFETCH_STRIPES: usize = 2;
/// Up to this many tokens a call's sums are scaled a token at a time (decode steps).
const COLUMN_TOKENS: usize = 4;

/// Whether [`rows_q8_0`] can run here (checked once per process; see the module's docs).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if std::env::var("KVLAB_AMX").is_ok_and(|v| v == "off") {
            return false;
        }
        // CPUID leaf 7, EDX bits 24 and 25: AMX-TILE and AMX-INT8.
        let leaf7 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("f16c")
            && __cpuid_count(7, 0).edx & (3 << 24) == 3 << 24;
        leaf7 && request_tile_data()
    })
}

/// Asks Linux for this process's permission to use the tile data state: ARCH_REQ_XCOMP_PERM
/// (asm/prctl.h) for XFEATURE_XTILEDATA (state component 18). Until then AMX instructions
/// fault (SIGILL).
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Elsewhere the kernel is not used (no way to ask here).
#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// A tile configuration (palette 1), as `ldtilecfg` reads it: 64 bytes, 64-byte aligned.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// For m W rows and token groups of nt0 and nt1 tokens (nt1 = 0: one group):
    ///
    /// | tile | holds | rows × bytes |
    /// | --- | --- | --- |
    /// | tmm1, tmm5 | A: W codes of a block (two blocks: tmm5 the second's) | m × 32 |
    /// | tmm2, tmm6 | B: the first group's codes of those blocks | 8 × 4·nt0 |
    /// | tmm0, tmm7 | C: their sums | m × 4·nt0 |
    /// | tmm4 | B: the second group's codes of tmm1's block | 8 × 4·nt1 |
    /// | tmm3 | C: their sums | m × 4·nt1 |
    fn new(m: usize, nt0: usize, nt1: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        let (a, b0, c0, b1, c1) = (
            (m, QK),
            (QK / 4, 4 * nt0),
            (m, 4 * nt0),
            (QK / 4, 4 * nt1),
            (m, 4 * nt1),
        );
        for (t, (rows, colsb)) in [c0, a, b0, c1, b1, a, b0, c0].into_iter().enumerate() {
            let rows = if colsb == 0 { 0 } else { rows };
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + t] = rows as u8;
        }
        TileConfig(c)
    }

    /// Loads this configuration into the tile registers (zeroing them).
    ///
    /// # Safety
    /// [`available`] is true.
    unsafe fn load(&self) {
        // SAFETY: a valid palette-1 configuration (rows ≤ 16, colsb ≤ 64), 64 aligned bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Tile C as stored: 16 rows of 16 i32 (64 bytes each), or m rows of nt i32 back to back.
#[repr(C, align(64))]
struct Sums([i32; TILE_ROWS * TILE_TOKENS]);

/// Two blocks of one token group: C(tmm0) = A(a0) · B(b0), C(tmm7) = A(a1) · B(b1), stored at
/// c0 and c1 with row stride `cs` bytes; two independent `tdpbssd`.
///
/// # Safety
/// A tile configuration of [`TileConfig::new`] is loaded; a0 and a1 are m rows of 32 readable
/// codes at row stride rb, b0 and b1 8 rows of 64 readable bytes, c0 and c1 m rows of cs
/// writable bytes.
#[inline]
unsafe fn two_blocks(
    a: [*const u8; 2],
    rb: usize,
    b: [*const i8; 2],
    c: [*mut Sums; 2],
    cs: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm1, [{a0} + {rb}*1]",
            "tileloadd tmm5, [{a1} + {rb}*1]",
            "tileloadd tmm2, [{b0} + {s64}*1]",
            "tileloadd tmm6, [{b1} + {s64}*1]",
            "tilezero tmm0",
            "tilezero tmm7",
            "tdpbssd tmm0, tmm1, tmm2",
            "tdpbssd tmm7, tmm5, tmm6",
            "tilestored [{c0} + {cs}*1], tmm0",
            "tilestored [{c1} + {cs}*1], tmm7",
            a0 = in(reg) a[0], a1 = in(reg) a[1], rb = in(reg) rb,
            b0 = in(reg) b[0], b1 = in(reg) b[1], s64 = in(reg) 64usize,
            c0 = in(reg) c[0], c1 = in(reg) c[1], cs = in(reg) cs,
            options(nostack),
        );
    }
}

/// One block of one token group: C(tmm0) = A(a) · B(b), stored at c with row stride cs.
///
/// # Safety
/// As [`two_blocks`], for one block.
#[inline]
unsafe fn one_block(a: *const u8, rb: usize, b: *const i8, c: *mut Sums, cs: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm1, [{a} + {rb}*1]",
            "tileloadd tmm2, [{b} + {s64}*1]",
            "tilezero tmm0",
            "tdpbssd tmm0, tmm1, tmm2",
            "tilestored [{c} + {cs}*1], tmm0",
            a = in(reg) a, rb = in(reg) rb, b = in(reg) b, s64 = in(reg) 64usize,
            c = in(reg) c, cs = in(reg) cs,
            options(nostack),
        );
    }
}

/// One block of two token groups: C(tmm0) = A(a) · B(b0), C(tmm3) = A(a) · B(b1), the A tile
/// loaded once; stored at c0 and c1 with row stride 64.
///
/// # Safety
/// As [`two_blocks`], with b1 the second group's and nt1 > 0 in the configuration.
#[inline]
unsafe fn two_groups(a: *const u8, rb: usize, b: [*const i8; 2], c: [*mut Sums; 2]) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm1, [{a} + {rb}*1]",
            "tileloadd tmm2, [{b0} + {s64}*1]",
            "tileloadd tmm4, [{b1} + {s64}*1]",
            "tilezero tmm0",
            "tilezero tmm3",
            "tdpbssd tmm0, tmm1, tmm2",
            "tdpbssd tmm3, tmm1, tmm4",
            "tilestored [{c0} + {s64}*1], tmm0",
            "tilestored [{c1} + {s64}*1], tmm3",
            a = in(reg) a, rb = in(reg) rb,
            b0 = in(reg) b[0], b1 = in(reg) b[1], s64 = in(reg) 64usize,
            c0 = in(reg) c[0], c1 = in(reg) c[1],
            options(nostack),
        );
    }
}

/// How a group's block sums are scaled and added: row by row (a vector over 16 tokens per W
/// row), or, for a few tokens, token by token (a vector over the 16 W rows). The products and
/// sums are the same either way (d_w · d_x is commutative), so are the bits.
// A stack value whose vectors stay in registers: the larger variant is the point.
#[allow(clippy::large_enum_variant)]
enum Accumulators {
    /// (16 W rows) of 16 tokens; tile C stored with a 64-byte row stride.
    Rows([__m512; TILE_ROWS]),
    /// (COLUMN_TOKENS tokens) of 16 W rows; tile C stored rows back to back (stride 4·nt).
    Columns([__m512; COLUMN_TOKENS]),
}

impl Accumulators {
    /// Zeroed accumulators for nt tokens.
    #[target_feature(enable = "avx512f")]
    fn new(nt: usize, columns: bool) -> Accumulators {
        debug_assert!(!columns || nt <= COLUMN_TOKENS);
        if columns {
            Accumulators::Columns([_mm512_setzero_ps(); COLUMN_TOKENS])
        } else {
            Accumulators::Rows([_mm512_setzero_ps(); TILE_ROWS])
        }
    }

    /// Tile C's row stride as stored for these accumulators, in bytes.
    fn stride(&self, nt: usize) -> usize {
        match self {
            Accumulators::Rows(_) => 64,
            Accumulators::Columns(_) => 4 * nt,
        }
    }

    /// acc += f32(C) · (d_w · d_x) for one block: `dw` its 16 W rows' scales, `dx` its nt
    /// tokens' (16 lanes, zero past nt).
    #[target_feature(enable = "avx512f")]
    fn add(&mut self, c: &Sums, nt: usize, dw: &[f32], dx: &[f32]) {
        // SAFETY: 16 f32 each of dw and dx (the callers' slices hold them).
        let (dwv, dxv) = unsafe { (_mm512_loadu_ps(dw.as_ptr()), _mm512_loadu_ps(dx.as_ptr())) };
        match self {
            Accumulators::Rows(acc) => {
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: row r of c, 16 i32 (rows ≥ m and lanes ≥ nt hold stale sums,
                    // never stored).
                    let s = unsafe { _mm512_loadu_si512(c.0[16 * r..].as_ptr().cast()) };
                    let scale = _mm512_mul_ps(_mm512_set1_ps(dw[r]), dxv);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *acc);
                }
            }
            Accumulators::Columns(acc) => {
                let rows = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let rows = _mm512_mullo_epi32(rows, _mm512_set1_epi32(nt as i32));
                for (lane, acc) in acc.iter_mut().enumerate().take(nt) {
                    let idx = _mm512_add_epi32(rows, _mm512_set1_epi32(lane as i32));
                    // SAFETY: element (r, lane) at r·nt + lane < 16·nt ≤ 256 of c (one token:
                    // the 16 rows back to back).
                    let s = unsafe {
                        if nt == 1 {
                            _mm512_loadu_si512(c.0.as_ptr().cast())
                        } else {
                            _mm512_i32gather_epi32::<4>(idx, c.0.as_ptr())
                        }
                    };
                    let scale = _mm512_mul_ps(dwv, _mm512_set1_ps(dx[lane]));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *acc);
                }
            }
        }
    }

    /// Writes the sums of W rows j0..j0 + m, tokens i0..i0 + nt: y[i·ldy + j0 + r].
    ///
    /// # Safety
    /// Those elements of y are the caller's to write.
    #[target_feature(enable = "avx512f")]
    unsafe fn store(
        &self,
        y: *mut f32,
        ldy: usize,
        (i0, nt): (usize, usize),
        (j0, m): (usize, usize),
    ) {
        let mask = ((1u32 << m) - 1) as __mmask16;
        let column = |lane: usize, v: __m512| {
            // SAFETY: y[(i0 + lane)·ldy + j0 + r] for r < m, the caller's elements.
            unsafe { _mm512_mask_storeu_ps(y.add((i0 + lane) * ldy + j0), mask, v) };
        };
        match self {
            Accumulators::Columns(acc) => {
                for (lane, v) in acc.iter().enumerate().take(nt) {
                    column(lane, *v);
                }
            }
            Accumulators::Rows(acc) => {
                let mut out = [0.0f32; TILE_ROWS * TILE_TOKENS];
                for (o, acc) in out.chunks_exact_mut(TILE_TOKENS).zip(acc) {
                    // SAFETY: 16 f32 into a row of out.
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *acc) };
                }
                let rows = _mm512_setr_epi32(
                    0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
                );
                for lane in 0..nt {
                    let idx = _mm512_add_epi32(rows, _mm512_set1_epi32(lane as i32));
                    // SAFETY: out[16r + lane] for r < 16, inside out.
                    column(lane, unsafe { _mm512_i32gather_ps::<4>(idx, out.as_ptr()) });
                }
            }
        }
    }
}

/// y[i·ldy + j] for i < t = x's rows, j < n: the n Q8_0 rows of `w` (`rb` bytes each, x.k
/// weights) against x, as the module's formula says. W goes by stripes of 16 rows; each
/// stripe meets the tokens a group of 16 at a time, two groups per A tile where there are two,
/// else two blocks per step (two independent `tdpbssd` either way).
///
/// # Safety
/// [`available`] is true; `w` holds n rows of rb = x.k / 32 · 34 bytes; `y` is valid to write
/// at i·ldy + j, and no other thread accesses those elements during the call.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn rows_q8_0(y: *mut f32, ldy: usize, x: &Q8Rows, w: *const u8, rb: usize, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { rows(y, ldy, x, (GgmlType::Q8_0, w, rb), n) }
}

/// [`rows_q8_0`] for Q5_0 rows (`rb` = x.k / 32 · 22 bytes each): each stripe of 16 rows is
/// first rewritten as Q8_0 rows ([`q5_0_as_q8_0`]: the same scale, the code minus 16 as an
/// int8, so the same weights exactly), in a buffer that stays in L1, then multiplied as Q8_0.
///
/// # Safety
/// As [`rows_q8_0`], `w` holding n rows of Q5_0.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn rows_q5_0(y: *mut f32, ldy: usize, x: &Q8Rows, w: *const u8, rb: usize, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { rows(y, ldy, x, (GgmlType::Q5_0, w, rb), n) }
}

/// [`rows_q8_0`]'s loop over rows of Q8_0 (read in place) or Q5_0 (rewritten a stripe at a
/// time).
///
/// # Safety
/// As [`rows_q8_0`], `w` holding n rows of rb bytes of `ty` (Q8_0 or Q5_0).
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn rows(
    y: *mut f32,
    ldy: usize,
    x: &Q8Rows,
    (ty, w, rb): (GgmlType, *const u8, usize),
    n: usize,
) {
    let (t, blocks) = (x.t, x.k / QK);
    let rb8 = blocks * BLOCK_BYTES; // a row's bytes as the tiles read it (Q8_0)
    assert!(
        TILE_ROWS * rb8 < i32::MAX as usize,
        "q8_act::amx: rows of {rb8} bytes"
    );
    let repack = ty == GgmlType::Q5_0;
    let mut q8_stripe = vec![0u8; if repack { TILE_ROWS * rb8 } else { 0 }];
    let groups = t.div_ceil(TILE_TOKENS);
    let (xb, dx) = tiles_b(x, groups);
    let bt = |b: usize, g: usize| xb[(b * groups + g) * 512..].as_ptr();
    let dxs = |b: usize, g: usize| &dx[(b * groups + g) * TILE_TOKENS..][..TILE_TOKENS];
    let mut c = [Sums([0; 256]), Sums([0; 256])];
    let mut dw = vec![0.0f32; blocks * TILE_ROWS];
    let mut config = (0, 0, 0);
    for j0 in (0..n).step_by(TILE_ROWS) {
        let m = TILE_ROWS.min(n - j0);
        let source = w.wrapping_add(j0 * rb); // the stripe as stored
        let stripe = if repack {
            for (r, row) in q8_stripe.chunks_exact_mut(rb8).take(m).enumerate() {
                // SAFETY: row j0 + r < n of w, rb bytes of Q5_0 blocks.
                let q5 = unsafe { std::slice::from_raw_parts(source.add(r * rb), rb) };
                q5_0_as_q8_0(q5, row);
            }
            q8_stripe.as_ptr()
        } else {
            source
        };
        // SAFETY: m rows of rb8 bytes of Q8_0 at stripe (w's rows, or their rewriting);
        // 16·rb8 < 2³¹ (asserted above).
        unsafe { stripe_scales(stripe, rb8, m, (BLOCK_BYTES, blocks), &mut dw) };
        let a = |b: usize| stripe.wrapping_add(b * BLOCK_BYTES + 2);
        for g0 in (0..groups).step_by(2) {
            let nt = |g: usize| TILE_TOKENS.min(t - g * TILE_TOKENS);
            let (nt0, nt1) = (nt(g0), if g0 + 1 < groups { nt(g0 + 1) } else { 0 });
            if config != (m, nt0, nt1) {
                config = (m, nt0, nt1);
                // SAFETY: the caller's contract (AMX available).
                unsafe { TileConfig::new(m, nt0, nt1).load() };
            }
            let mut acc = [
                Accumulators::new(nt0, nt1 == 0 && nt0 <= COLUMN_TOKENS),
                Accumulators::new(nt1, false),
            ];
            let cs = acc[0].stride(nt0);
            let cp = [&raw mut c[0], &raw mut c[1]];
            let mut b = 0;
            while b < blocks {
                if g0 == 0 {
                    prefetch_share(source, rb, blocks, b);
                }
                // (Each product) the A tiles are m rows of block b (b + 1) of the stripe's
                // rows (w's rows j0.. < n, or their rewriting); the B tiles 512 bytes of xb;
                // the C tiles fit c's 1 KiB each; the configuration loaded above has these
                // shapes.
                if nt1 > 0 {
                    // SAFETY: as above.
                    unsafe { two_groups(a(b), rb8, [bt(b, g0), bt(b, g0 + 1)], cp) };
                    acc[0].add(&c[0], nt0, &dw[b * TILE_ROWS..], dxs(b, g0));
                    acc[1].add(&c[1], nt1, &dw[b * TILE_ROWS..], dxs(b, g0 + 1));
                    b += 1;
                } else if b + 1 < blocks {
                    if g0 == 0 {
                        prefetch_share(source, rb, blocks, b + 1);
                    }
                    // SAFETY: as above.
                    unsafe {
                        two_blocks([a(b), a(b + 1)], rb8, [bt(b, g0), bt(b + 1, g0)], cp, cs)
                    };
                    acc[0].add(&c[0], nt0, &dw[b * TILE_ROWS..], dxs(b, g0));
                    acc[0].add(&c[1], nt0, &dw[(b + 1) * TILE_ROWS..], dxs(b + 1, g0));
                    b += 2;
                } else {
                    // SAFETY: as above.
                    unsafe { one_block(a(b), rb8, bt(b, g0), cp[0], cs) };
                    acc[0].add(&c[0], nt0, &dw[b * TILE_ROWS..], dxs(b, g0));
                    b += 1;
                }
            }
            for (k, acc) in acc.iter().enumerate().take(1 + usize::from(nt1 > 0)) {
                let tokens = ((g0 + k) * TILE_TOKENS, [nt0, nt1][k]);
                // SAFETY: tokens < t, rows j0..j0 + m ≤ n: the caller's elements.
                unsafe { acc.store(y, ldy, tokens, (j0, m)) };
            }
        }
    }
    if config != (0, 0, 0) {
        // SAFETY: AMX is available; the tiles are released for the thread's next user.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// dw (·, 16) = each block's f16 scale of the stripe's m rows, as f32 (rows ≥ m: 0), for
/// blocks of `block_bytes` that begin with their scale (Q8_0's 34, Q5_0's 22); entries of dw
/// past the row's `blocks` are 0.
///
/// # Safety
/// F16C and AVX-512F; m rows of rb bytes at `stripe`, `blocks` whole blocks each (at least 4
/// bytes each), 16·rb < 2³¹.
#[target_feature(enable = "avx512f,f16c")]
pub(super) unsafe fn stripe_scales(
    stripe: *const u8,
    rb: usize,
    m: usize,
    (block_bytes, blocks): (usize, usize),
    dw: &mut [f32],
) {
    let mask = ((1u32 << m) - 1) as __mmask16;
    let rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(rb as i32),
    );
    for (b, dw) in dw.chunks_exact_mut(TILE_ROWS).enumerate() {
        if b >= blocks {
            dw.fill(0.0);
            continue;
        }
        let idx = _mm512_add_epi32(rows, _mm512_set1_epi32((b * block_bytes) as i32));
        // SAFETY: for r < m, the 4 bytes at r·rb + b·block_bytes: block b's scale and the two
        // bytes after it, inside row r (rows ≥ m are masked off, never read); 16 f32 out
        // (vcvtph2ps: exact). The offsets fit an i32 (the caller's contract).
        unsafe {
            let v =
                _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, idx, stripe.cast());
            let h = _mm512_cvtepi32_epi16(v);
            _mm512_storeu_ps(dw.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
}

/// Prefetches block b's share of the stripe PREFETCH_STRIPES ahead: the stripes ahead stream
/// in while this one is multiplied, a share of their bytes per block, as the `vpdpbusd`
/// kernel spreads its prefetches.
fn prefetch_share(stripe: *const u8, rb: usize, blocks: usize, b: usize) {
    let (bytes, share) = (TILE_ROWS * rb, (TILE_ROWS * rb).div_ceil(blocks));
    let from = stripe.wrapping_add(PREFETCH_STRIPES * bytes + b * share);
    super::super::prefetch(from, share.min(bytes.saturating_sub(b * share)));
}

/// Bytes per Q5_0 block: the f16 scale d, 4 bytes of high bits, 16 bytes of low nibbles (half
/// the `vpdpbusd` kernel's unit of two blocks).
pub(super) const Q5_0_BLOCK_BYTES: usize = <vnni::Q5_0 as vnni::Format>::UNIT_BYTES / 2;

/// One row of Q5_0 blocks rewritten as Q8_0 blocks: the same scale d, and weight κ's 5-bit
/// code u (low nibble from qs, high bit from qh, as ggml's `dequantize_row_q5_0` reads them)
/// stored as the int8 u − 16, so that d·(u − 16) is the same weight exactly. Two blocks at a
/// time through the `vpdpbusd` kernel's own unpacking where the CPU has AVX-512BW, else (and
/// for an odd last block) a byte at a time; the same bytes either way (tested).
///
/// # Panics
/// If `q5` is not whole blocks or `q8` is not as many Q8_0 blocks.
pub fn q5_0_as_q8_0(q5: &[u8], q8: &mut [u8]) {
    let blocks = q5.len() / Q5_0_BLOCK_BYTES;
    assert!(
        q5.len() == blocks * Q5_0_BLOCK_BYTES && q8.len() == blocks * BLOCK_BYTES,
        "q5_0_as_q8_0: not whole blocks"
    );
    let pairs = if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the features are checked; the lengths asserted.
        unsafe { q5_0_pairs_as_q8_0(q5, q8) }
    } else {
        0
    };
    let done = 2 * pairs;
    q5_0_as_q8_0_reference(
        &q5[done * Q5_0_BLOCK_BYTES..],
        &mut q8[done * BLOCK_BYTES..],
    );
}

/// [`q5_0_as_q8_0`] a byte at a time.
fn q5_0_as_q8_0_reference(q5: &[u8], q8: &mut [u8]) {
    for (src, dst) in q5
        .chunks_exact(Q5_0_BLOCK_BYTES)
        .zip(q8.chunks_exact_mut(BLOCK_BYTES))
    {
        dst[..2].copy_from_slice(&src[..2]);
        let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
        for j in 0..QK {
            let nibble = if j < 16 {
                src[6 + j] & 0x0F
            } else {
                src[6 + j - 16] >> 4
            };
            let high = ((qh >> j) & 1) as u8;
            dst[2 + j] = ((nibble | high << 4) as i8 - 16) as u8;
        }
    }
}

/// The whole pairs of blocks of [`q5_0_as_q8_0`], each pair's 64 codes unpacked by
/// [`vnni::Q5_0`]'s `chunk` (the codes u the `vpdpbusd` kernel multiplies) less 16; returns
/// how many pairs it wrote.
///
/// # Safety
/// AVX-512F/BW; the lengths as [`q5_0_as_q8_0`] asserts.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_0_pairs_as_q8_0(q5: &[u8], q8: &mut [u8]) -> usize {
    use vnni::Format;
    let pairs = q5.len() / vnni::Q5_0::UNIT_BYTES;
    for (src, dst) in q5
        .chunks_exact(vnni::Q5_0::UNIT_BYTES)
        .zip(q8.chunks_exact_mut(2 * BLOCK_BYTES))
    {
        // SAFETY: two whole blocks at src (UNIT_BYTES); 2 × 32 code bytes at dst[2..34] and
        // dst[36..68].
        unsafe {
            let (u, _) = vnni::Q5_0::chunk(src.as_ptr(), &(), 0);
            let codes = _mm512_sub_epi8(u, _mm512_set1_epi8(16));
            let (lo, hi) = (
                _mm512_castsi512_si256(codes),
                _mm512_extracti64x4_epi64::<1>(codes),
            );
            _mm256_storeu_si256(dst[2..].as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(dst[BLOCK_BYTES + 2..].as_mut_ptr().cast(), hi);
        }
        dst[..2].copy_from_slice(&src[..2]);
        dst[BLOCK_BYTES..BLOCK_BYTES + 2]
            .copy_from_slice(&src[Q5_0_BLOCK_BYTES..Q5_0_BLOCK_BYTES + 2]);
    }
    pairs
}

/// x's tiles B and scales: for (block b, token group g), 8 rows of 64 bytes, row kk holding
/// codes 4kk..4kk + 4 of block b for each token of the group (zero past t); and the group's 16
/// scales of block b.
fn tiles_b(x: &Q8Rows, groups: usize) -> (Vec<i8>, Vec<f32>) {
    let (t, blocks) = (x.t, x.k / QK);
    let mut xb = vec![0i8; blocks * groups * 512];
    let mut dx = vec![0.0f32; blocks * groups * TILE_TOKENS];
    for b in 0..blocks {
        for i in 0..t {
            let (g, lane) = (i / TILE_TOKENS, i % TILE_TOKENS);
            let piece = (b / 2) * t + i;
            let codes = &x.qs[64 * piece + 32 * (b % 2)..][..QK];
            let tile = &mut xb[(b * groups + g) * 512..][..512];
            for (kk, four) in codes.chunks_exact(4).enumerate() {
                tile[64 * kk + 4 * lane..][..4].copy_from_slice(four);
            }
            dx[(b * groups + g) * TILE_TOKENS + lane] = x.dl[16 * piece + 8 * (b % 2)];
        }
    }
    (xb, dx)
}

/// An f16 (bits) as f32, exactly (every f16 is an f32).
fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// The module's formula as a plain loop: what [`rows_q8_0`] computes, to the bit.
pub fn reference(y: &mut [f32], ldy: usize, x: &Q8Rows, w: &[u8], n: usize) {
    let blocks = x.k / QK;
    let rb = blocks * BLOCK_BYTES;
    for j in 0..n {
        for i in 0..x.t {
            let mut acc = 0.0f32;
            for b in 0..blocks {
                let blk = &w[j * rb + b * BLOCK_BYTES..][..BLOCK_BYTES];
                let d_w = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                let mut s = 0i32;
                let mut d_x = 0.0;
                for (kk, &q) in blk[2..].iter().enumerate() {
                    let (qx, d) = x.q_and_d(i, b * QK + kk);
                    s += i32::from(q as i8) * i32::from(qx);
                    d_x = d;
                }
                acc = (s as f32).mul_add(d_w * d_x, acc);
            }
            y[i * ldy + j] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{random_rows, rng};
    use rand::Rng;

    /// Q5_0 rows rewritten as Q8_0 hold the same weights to the bit, and the vector rewriting
    /// gives the byte loop's bytes.
    #[test]
    fn q5_0_rewritten_as_q8_0_holds_the_same_weights() {
        let mut rng = rng(23);
        // k: one block (no pair), a pair, a pair and a lone block, Gemma's 640 and 2048.
        for k in [32, 64, 96, 640, 2048] {
            let q5 = random_rows(GgmlType::Q5_0, 3, k, &mut rng);
            let blocks = q5.len() / Q5_0_BLOCK_BYTES;
            let (mut fast, mut plain) = (
                vec![0u8; blocks * BLOCK_BYTES],
                vec![1u8; blocks * BLOCK_BYTES],
            );
            q5_0_as_q8_0(&q5, &mut fast);
            q5_0_as_q8_0_reference(&q5, &mut plain);
            assert_eq!(fast, plain, "k {k}: the vector and byte rewritings differ");
            let (mut w5, mut w8) = (vec![0.0f32; 3 * k], vec![0.0f32; 3 * k]);
            crate::quant::decode_rows_reference(GgmlType::Q5_0, &q5, &mut w5);
            crate::quant::decode_rows_reference(GgmlType::Q8_0, &fast, &mut w8);
            for (i, (a, b)) in w5.iter().zip(&w8).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "k {k} weight {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn the_tile_kernel_gives_the_plain_loops_bits() {
        if !available() {
            eprintln!(
                "q8_act::amx: no AMX-INT8 here (or KVLAB_AMX=off); the tile kernel is not tested on this CPU"
            );
            return;
        }
        let mut rng = rng(21);
        // k: one block, an odd count, Gemma's 640; t around the tile's 16 tokens; n around its
        // 16 rows.
        for k in [32, 96, 640] {
            for (t, n) in [
                (1, 1),
                (1, 17),
                (2, 16),
                (5, 33),
                (16, 16),
                (17, 5),
                (33, 40),
            ] {
                for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
                    let w = random_rows(ty, n, k, &mut rng);
                    let x: Vec<f32> = (0..t * k).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let mut q = Q8Rows::default();
                    q.quantize(&x, t, k);
                    let ldy = n + 3;
                    let (mut got, mut want) = (vec![f32::NAN; t * ldy], vec![f32::NAN; t * ldy]);
                    // SAFETY: AMX is available; w is n rows of k / 32 blocks of ty; got holds t
                    // rows of ldy ≥ n.
                    unsafe {
                        let (y, rb) = (got.as_mut_ptr(), w.len() / n);
                        match ty {
                            GgmlType::Q8_0 => rows_q8_0(y, ldy, &q, w.as_ptr(), rb, n),
                            _ => rows_q5_0(y, ldy, &q, w.as_ptr(), rb, n),
                        }
                    }
                    // The plain loop reads Q8_0: Q5_0 rewritten as Q8_0 is the same weights.
                    let w8 = if ty == GgmlType::Q8_0 {
                        w.clone()
                    } else {
                        let mut w8 = vec![0u8; n * k / QK * BLOCK_BYTES];
                        q5_0_as_q8_0(&w, &mut w8);
                        w8
                    };
                    reference(&mut want, ldy, &q, &w8, n);
                    for i in 0..t {
                        for j in 0..n {
                            let (g, e) = (got[i * ldy + j], want[i * ldy + j]);
                            assert!(
                                g.to_bits() == e.to_bits(),
                                "{ty} k {k} t {t} n {n}: ({i}, {j}) {g} vs {e}"
                            );
                        }
                        // The masked stores never write past row n.
                        for j in n..ldy {
                            assert!(
                                got[i * ldy + j].is_nan(),
                                "k {k} t {t} n {n}: wrote ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_in_a_token_makes_that_tokens_outputs_nan_only() {
        if !available() {
            eprintln!("q8_act::amx: no AMX-INT8 here; the tile kernel is not tested on this CPU");
            return;
        }
        let mut rng = rng(22);
        let (t, n, k) = (3, 20, 64);
        let w = random_rows(GgmlType::Q8_0, n, k, &mut rng);
        let mut x: Vec<f32> = (0..t * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        x[k + 40] = f32::NAN; // token 1, block 1
        let mut q = Q8Rows::default();
        q.quantize(&x, t, k);
        let mut y = vec![0.0; t * n];
        // SAFETY: as above.
        unsafe { rows_q8_0(y.as_mut_ptr(), n, &q, w.as_ptr(), w.len() / n, n) };
        for (i, row) in y.chunks_exact(n).enumerate() {
            assert!(
                row.iter().all(|v| v.is_nan() == (i == 1)),
                "token {i}: {row:?}"
            );
        }
    }
}
