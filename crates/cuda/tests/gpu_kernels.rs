//! Each kernel against its CPU reference (`common/reference.rs`) on random inputs: outputs
//! poisoned with NaN before the run so every element must be written, f32 within 1e-5 and f16
//! within 1e-2 relative error (normwise), NaN never passing. Skips without a GPU unless
//! KVLAB_REQUIRE_CUDA=1. The `reference_*` tests check the references themselves, GPU or not.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use common::reference::{self, AttnCase};
use common::{Backend, Buf};
use common::{
    check, check_within, down, gpu, poisoned, rng, rounded, tolerance, uniform, up, up_i32,
};
use kvlab_cpu::kv_store::{KvStore, Part, round_trip};
use kvlab_cuda::dtype::{CacheElem, DType, Int4x2, row_elems};
use kvlab_cuda::launch::{self, DecodeKernel};
use kvlab_cuda::ops::{AttentionArgs, Dev, Int4Keys, Int4Op, Launcher, RowsAndPool};
use kvlab_cuda::residual::Residuals;
use kvlab_model::rope::RopeTable;
use kvlab_model::{Activation, KvDtype, RopeLayout, ops as refops};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

type F16 = half::f16;

on_gpu_and_emu!(embedding, gpu_embedding, emu_embedding);
fn embedding(ops: &Backend) {
    fn run<W: DType>(ops: &Backend) {
        let (vocab, dim, t) = (50, 96, 7);
        let mut r = rng(1);
        let table = rounded::<W>(&uniform(&mut r, vocab * dim, 1.0));
        let ids: Vec<i32> = (0..t).map(|_| r.random_range(0..vocab) as i32).collect();
        let x = poisoned::<f32>(ops, t * dim);
        let (tb, id) = (up::<W>(ops, &table), up_i32(ops, &ids));
        ops.embedding(ops.dev(&x), ops.dev(&tb), ops.dev(&id), t, vocab, dim, 1.5)
            .unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| table[i as usize * dim..][..dim].iter().map(|v| v * 1.5))
            .collect();
        check::<W>("embedding", &down(ops, &x), &want);
    }
    run::<f32>(ops);
    run::<F16>(ops);
}

on_gpu_and_emu!(
    rmsnorm_plain_qk_and_in_place,
    gpu_rmsnorm_plain_qk_and_in_place,
    emu_rmsnorm_plain_qk_and_in_place
);
fn rmsnorm_plain_qk_and_in_place(ops: &Backend) {
    let mut r = rng(2);
    // Residual f32 → activation type, rows of dim 288 (stories15M) and 4096 (Llama-3-8B).
    for n in [288, 4096] {
        let rows = 5;
        let x = uniform(&mut r, rows * n, 3.0);
        let w = uniform(&mut r, n, 1.0);
        let want = reference::rmsnorm_rows(&x, &w, n, 1e-5);
        let (xd, wd) = (up::<f32>(ops, &x), up::<f32>(ops, &w));
        let y = poisoned::<f32>(ops, rows * n);
        ops.rmsnorm::<f32, f32>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), rows, n, 1e-5)
            .unwrap();
        check::<f32>("rmsnorm f32->f32", &down(ops, &y), &want);
        let y = poisoned::<F16>(ops, rows * n);
        ops.rmsnorm::<f32, F16>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), rows, n, 1e-5)
            .unwrap();
        check::<F16>("rmsnorm f32->f16", &down(ops, &y), &want);
    }
    // Gemma's QK-norm: every head of 4 tokens × 3 heads × head_dim 256, in place.
    fn qk<T: DType>(ops: &Backend, r: &mut ChaCha8Rng) {
        let (rows, hd) = (12, 256);
        let x = rounded::<T>(&uniform(r, rows * hd, 2.0));
        let w = uniform(r, hd, 1.0);
        let want = reference::rmsnorm_rows(&x, &w, hd, 1e-6);
        let (xd, wd) = (up::<T>(ops, &x), up::<f32>(ops, &w));
        ops.rmsnorm::<T, T>(ops.dev(&xd), ops.dev(&xd), ops.dev(&wd), rows, hd, 1e-6)
            .unwrap();
        check::<T>("qk-norm in place", &down(ops, &xd), &want);
    }
    qk::<f32>(ops, &mut r);
    qk::<F16>(ops, &mut r);
}

on_gpu_and_emu!(
    rope_both_layouts,
    gpu_rope_both_layouts,
    emu_rope_both_layouts
);
fn rope_both_layouts(ops: &Backend) {
    fn run<T: DType>(ops: &Backend, layout: RopeLayout) {
        let (t, heads, hd, max_pos) = (6, 4, 64, 300);
        let mut r = rng(3);
        let x = rounded::<T>(&uniform(&mut r, t * heads * hd, 1.0));
        let positions: Vec<i32> = (0..t).map(|_| r.random_range(0..max_pos) as i32).collect();
        let table = RopeTable::new(10_000.0, hd, max_pos);
        let mut want = x.clone();
        for (row, &pos) in want.chunks_exact_mut(heads * hd).zip(&positions) {
            table.apply(row, pos as usize, layout);
        }
        let xd = up::<T>(ops, &x);
        let (pd, cd, sd) = (
            up_i32(ops, &positions),
            up::<f32>(ops, &table.cos),
            up::<f32>(ops, &table.sin),
        );
        let neox = layout == RopeLayout::Neox;
        ops.rope(
            ops.dev(&xd),
            ops.dev(&pd),
            ops.dev(&cd),
            ops.dev(&sd),
            t,
            heads,
            hd,
            neox,
        )
        .unwrap();
        check::<T>(&format!("rope {layout:?}"), &down(ops, &xd), &want);
    }
    for layout in [RopeLayout::Interleaved, RopeLayout::Neox] {
        run::<f32>(ops, layout);
        run::<F16>(ops, layout);
    }
}

on_gpu_and_emu!(
    reshape_and_cache_and_copy_blocks,
    gpu_reshape_and_cache_and_copy_blocks,
    emu_reshape_and_cache_and_copy_blocks
);
fn reshape_and_cache_and_copy_blocks(ops: &Backend) {
    fn run<A: DType, C: DType + CacheElem>(ops: &Backend) {
        let (t, kv_dim, bs, nb) = (5, 32, 4, 6);
        let num_slots = nb * bs;
        let mut r = rng(4);
        let k = rounded::<A>(&uniform(&mut r, t * kv_dim, 1.0));
        let v = rounded::<A>(&uniform(&mut r, t * kv_dim, 1.0));
        let slots = [9, -1, 2, 23, 10];
        let (kc, vc) = (
            poisoned::<C>(ops, num_slots * kv_dim),
            poisoned::<C>(ops, num_slots * kv_dim),
        );
        let (kd, vd, sd) = (up::<A>(ops, &k), up::<A>(ops, &v), up_i32(ops, &slots));
        let unused = up::<f32>(ops, &[f32::NAN]);
        let no_map = up_i32(ops, &[-1]);
        ops.reshape_and_cache(&rows_and_pool(
            (ops.dev(&kd), ops.dev(&vd)),
            (ops.dev(&kc), ops.dev(&vc)),
            (ops.dev(&unused), ops.dev(&unused)),
            (ops.dev(&unused), ops.dev(&no_map), 0),
            ops.dev(&sd),
            t,
            (2, kv_dim / 2),
            (num_slots, bs),
        ))
        .unwrap();
        let mut want_k = vec![f32::NAN; num_slots * kv_dim];
        let mut want_v = vec![f32::NAN; num_slots * kv_dim];
        reference::reshape_and_cache(&k, &v, &mut want_k, &mut want_v, &slots, kv_dim);
        let (gk, gv) = (down(ops, &kc), down(ops, &vc));
        // Written rows match; every other row still holds its poison (nothing stray written).
        for (g, w) in [(&gk, &want_k), (&gv, &want_v)] {
            for (i, (a, b)) in g.iter().zip(w.iter()).enumerate() {
                assert!(
                    (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-2 * b.abs().max(1e-3),
                    "element {i}: {a} vs {b}"
                );
            }
        }
        // Copy-on-write: block 2 (slots 8..12, holds slots 9 and 10) → block 5.
        let pairs = up_i32(ops, &[2, 5]);
        ops.copy_blocks(
            ops.dev(&kc),
            Some(ops.dev(&vc)),
            ops.dev(&pairs),
            1,
            nb,
            bs * kv_dim,
        )
        .unwrap();
        let gk2 = down(ops, &kc);
        let blk = bs * kv_dim;
        for i in 0..blk {
            let (a, b) = (gk2[5 * blk + i], gk[2 * blk + i]);
            assert!(
                (a.is_nan() && b.is_nan()) || a == b,
                "copied element {i}: {a} vs {b}"
            );
        }
        eprintln!(
            "reshape_and_cache + copy_blocks ({} -> {}): ok",
            A::NAME,
            <C as DType>::NAME
        );
    }
    run::<f32, f32>(ops);
    run::<f32, F16>(ops);
    run::<F16, f32>(ops);
    run::<F16, F16>(ops);
}

on_gpu_and_emu!(
    reshape_and_cache_stores_the_cpu_pools_bits,
    gpu_reshape_and_cache_stores_the_cpu_pools_bits,
    emu_reshape_and_cache_stores_the_cpu_pools_bits
);
/// reshape_and_cache of every cache type stores the bits kvlab-cpu's `KvStore` stores for the
/// same f32 row: elements or codes, and the per-(token, KV head) scales of fp8-e4m3 and int8.
/// head_dim 40 leaves 8 lanes of a warp's second pass idle; one head is all zeros (scale 1) and
/// one holds a NaN (its scale must be NaN, so it reads back NaN).
fn reshape_and_cache_stores_the_cpu_pools_bits(ops: &Backend) {
    fn run<C: CacheElem>(ops: &Backend) {
        let (t, nkv, hd, num_slots) = (5, 3, 40, 24);
        let kvd = nkv * hd;
        let mut r = rng(14);
        let mut k = uniform(&mut r, t * kvd, 3.0);
        let v = uniform(&mut r, t * kvd, 0.2);
        k[2 * kvd + hd..2 * kvd + 2 * hd].fill(0.0);
        k[3 * kvd + 7] = f32::NAN;
        let slots = [9, -1, 2, 23, 10];
        let (kd, vd, sd) = (up::<f32>(ops, &k), up::<f32>(ops, &v), up_i32(ops, &slots));
        let (kc, vc) = (
            ops.zeros::<C>(num_slots * kvd),
            ops.zeros::<C>(num_slots * kvd),
        );
        let n_scales = if C::SCALED { num_slots * nkv } else { 1 };
        let (ks, vs) = (
            up::<f32>(ops, &vec![f32::NAN; n_scales]),
            up::<f32>(ops, &vec![f32::NAN; n_scales]),
        );
        let (unused, no_map) = (up::<f32>(ops, &[f32::NAN]), up_i32(ops, &[-1]));
        ops.reshape_and_cache(&rows_and_pool(
            (ops.dev(&kd), ops.dev(&vd)),
            (ops.dev(&kc), ops.dev(&vc)),
            (ops.dev(&ks), ops.dev(&vs)),
            (ops.dev(&unused), ops.dev(&no_map), 0),
            ops.dev(&sd),
            t,
            (nkv, hd),
            (num_slots, 4),
        ))
        .unwrap();
        let device = |codes: &Buf<C>, scales: &Buf<f32>| {
            let codes = ops.to_vec(codes);
            let scales = down::<f32>(ops, scales);
            (codes, scales)
        };
        for (part, x, (codes, scales)) in [
            (Part::Keys, &k, device(&kc, &ks)),
            (Part::Values, &v, device(&vc, &vs)),
        ] {
            let mut written = vec![false; num_slots];
            for (i, &slot) in slots.iter().enumerate() {
                let Ok(slot) = usize::try_from(slot) else {
                    continue;
                };
                written[slot] = true;
                let row = &x[i * kvd..(i + 1) * kvd];
                let mut store = KvStore::new(C::KV_DTYPE, part, 1, (nkv, hd), 1);
                store.write(0, row);
                let mut want = Vec::new();
                store.save_rows(0, 1, &mut want).unwrap();
                let mut got = Vec::new();
                codes[slot * kvd..(slot + 1) * kvd]
                    .iter()
                    .for_each(|c| c.to_le(&mut got));
                for h in 0..nkv {
                    let head = &row[h * hd..(h + 1) * hd];
                    if C::SCALED {
                        let s = scales[slot * nkv + h];
                        let at = kvd * C::BYTES + 4 * h;
                        let want_s = f32::from_le_bytes(want[at..at + 4].try_into().unwrap());
                        if head.iter().any(|v| v.is_nan()) {
                            // A NaN makes the head's scale NaN (it reads back NaN); its codes
                            // then carry nothing.
                            assert!(
                                s.is_nan() && want_s.is_nan(),
                                "{part:?} slot {slot} head {h}"
                            );
                            continue;
                        }
                        assert_eq!(
                            s.to_bits(),
                            want_s.to_bits(),
                            "{} {part:?} scale of slot {slot} head {h}",
                            C::NAME
                        );
                    }
                    // Element by element; a NaN element's payload may differ (CUDA's
                    // conversions give the canonical NaN), so it is skipped.
                    for (d, x) in head.iter().enumerate() {
                        let e = (h * hd + d) * C::BYTES;
                        if !x.is_nan() {
                            assert_eq!(
                                got[e..e + C::BYTES],
                                want[e..e + C::BYTES],
                                "{} {part:?} element {d} of slot {slot} head {h}",
                                C::NAME
                            );
                        }
                    }
                }
            }
            // Nothing stray: unwritten slots keep zero codes and (scaled) their NaN poison.
            for slot in (0..num_slots).filter(|&s| !written[s]) {
                let mut bytes = Vec::new();
                codes[slot * kvd..(slot + 1) * kvd]
                    .iter()
                    .for_each(|c| c.to_le(&mut bytes));
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "{} slot {slot} was written",
                    C::NAME
                );
                if C::SCALED {
                    assert!(
                        scales[slot * nkv..(slot + 1) * nkv]
                            .iter()
                            .all(|s| s.is_nan())
                    );
                }
            }
        }
        eprintln!("reshape_and_cache f32 -> {}: the CPU pool's bits", C::NAME);
    }
    run::<f32>(ops);
    run::<F16>(ops);
    run::<half::bf16>(ops);
    run::<u8>(ops);
    run::<i8>(ops);
}

/// A step's rows and a pool as the row kernels take them ([`RowsAndPool`]).
#[allow(clippy::too_many_arguments)]
fn rows_and_pool<A, C>(
    (k, v): (Dev<A>, Dev<A>),
    (k_cache, v_cache): (Dev<C>, Dev<C>),
    (k_scale, v_scale): (Dev<f32>, Dev<f32>),
    (k_residual, map, residuals): (Dev<f32>, Dev<i32>, usize),
    slots: Dev<i32>,
    n_tokens: usize,
    (n_kv_heads, head_dim): (usize, usize),
    (num_slots, block_size): (usize, usize),
) -> RowsAndPool<A, C> {
    RowsAndPool {
        k,
        v,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        k_residual,
        map,
        residuals,
        slots,
        n_tokens,
        n_kv_heads,
        head_dim,
        num_slots,
        block_size,
    }
}

/// Equal f32 bits, element by element (any NaN equals any NaN).
fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

on_gpu_and_emu!(
    kv_read_back_gives_what_the_cpu_pool_gives,
    gpu_kv_read_back_gives_what_the_cpu_pool_gives,
    emu_kv_read_back_gives_what_the_cpu_pool_gives
);
/// kv_read_back replaces the step's rows by what the pool gives back, stored or not (slot -1):
/// for the per-row formats both are kvlab-cpu's `round_trip` of the row, bit for bit (a zero
/// head, a NaN head).
fn kv_read_back_gives_what_the_cpu_pool_gives(ops: &Backend) {
    fn run<C: CacheElem>(ops: &Backend) {
        let (t, nkv, hd, num_slots, bs) = (5, 3, 40, 24, 4);
        let kvd = nkv * hd;
        let mut r = rng(17);
        let mut k = uniform(&mut r, t * kvd, 3.0);
        let v = uniform(&mut r, t * kvd, 0.2);
        k[2 * kvd + hd..2 * kvd + 2 * hd].fill(0.0);
        k[3 * kvd + 7] = f32::NAN;
        let slots = [9, -1, 2, 23, 10];
        let (kd, vd, sd) = (up::<f32>(ops, &k), up::<f32>(ops, &v), up_i32(ops, &slots));
        let s = ops;
        let (kc, vc) = (s.zeros::<C>(num_slots * kvd), s.zeros::<C>(num_slots * kvd));
        let n_scales = if C::SCALED { num_slots * nkv } else { 1 };
        let (ks, vs) = (s.zeros::<f32>(n_scales), s.zeros::<f32>(n_scales));
        let (unused, no_map) = (up::<f32>(ops, &[f32::NAN]), up_i32(ops, &[-1]));
        let (rows, pool) = ((ops.dev(&kd), ops.dev(&vd)), (ops.dev(&kc), ops.dev(&vc)));
        let scales = (ops.dev(&ks), ops.dev(&vs));
        let residual = (ops.dev(&unused), ops.dev(&no_map), 0);
        let (slot_dev, heads, shape) = (ops.dev(&sd), (nkv, hd), (num_slots, bs));
        ops.reshape_and_cache(&rows_and_pool::<f32, C>(
            rows, pool, scales, residual, slot_dev, t, heads, shape,
        ))
        .unwrap();
        ops.kv_read_back(&rows_and_pool::<f32, C>(
            rows, pool, scales, residual, slot_dev, t, heads, shape,
        ))
        .unwrap();
        for (part, x, got) in [
            (Part::Keys, k.clone(), down::<f32>(ops, &kd)),
            (Part::Values, v.clone(), down::<f32>(ops, &vd)),
        ] {
            let mut want = x;
            round_trip(C::KV_DTYPE, part, (nkv, hd), 1, &mut want);
            assert!(bits_eq(&got, &want), "{} {part:?}", C::NAME);
        }
        eprintln!("kv_read_back f32 <- {}: kvlab-cpu's values", C::NAME);
    }
    run::<F16>(ops);
    run::<half::bf16>(ops);
    run::<u8>(ops);
    run::<i8>(ops);
}

on_gpu_and_emu!(
    int4_keys_close_and_open_as_the_cpu_pool,
    gpu_int4_keys_close_and_open_as_the_cpu_pool,
    emu_int4_keys_close_and_open_as_the_cpu_pool
);
/// int4 through the steps forward.rs runs (residual.rs's plan, then open, reshape_and_cache,
/// close): a block's keys wait in f32 and are quantized per channel when its last row arrives, a
/// complete block written again is decoded back first, and the pool ends holding the bytes
/// kvlab-cpu's `KvStore` holds after the same writes (codes, (s, min), the residual of the block
/// still filling), bit for bit.
fn int4_keys_close_and_open_as_the_cpu_pool(ops: &Backend) {
    let ops = &ops;
    let (nkv, hd, bs, nb, capacity): (usize, usize, usize, usize, usize) = (2, 40, 4, 4, 2);
    let (kvd, slots_n) = (nkv * hd, nb * bs);
    let hb = hd.div_ceil(2);
    let mut residuals = Residuals::new(nb, bs, capacity);
    let mut cpu_k = KvStore::new(KvDtype::Int4, Part::Keys, slots_n, (nkv, hd), bs);
    let mut cpu_v = KvStore::new(KvDtype::Int4, Part::Values, slots_n, (nkv, hd), bs);
    let s = ops;
    let kc = s.zeros::<Int4x2>(slots_n * nkv * hb);
    let vc = s.zeros::<Int4x2>(slots_n * nkv * hb);
    let ks = s.zeros::<f32>(2 * nb * kvd);
    let vs = s.zeros::<f32>(2 * slots_n * nkv * hd.div_ceil(32));
    let kr = s.zeros::<f32>(capacity * bs * kvd);
    let mut r = rng(16);
    // Block 0 whole and block 1's first rows; block 1 completes; row 5 again (block 1 reopens);
    // rows 6 and 7 again (it closes again); block 2's first two rows (left filling).
    let steps: [&[i32]; 5] = [&[0, 1, 2, 3, 4, 5], &[6, 7], &[5], &[6, 7], &[8, 9]];
    for slots in steps {
        let t = slots.len();
        let k = uniform(&mut r, t * kvd, 2.0);
        let v = uniform(&mut r, t * kvd, 0.5);
        for (i, &slot) in slots.iter().enumerate() {
            cpu_k.write(slot as usize, &k[i * kvd..(i + 1) * kvd]);
            cpu_v.write(slot as usize, &v[i * kvd..(i + 1) * kvd]);
        }
        let wide: Vec<i64> = slots.iter().map(|&x| i64::from(x)).collect();
        let plan = residuals.plan_step(&[], &wide).unwrap();
        assert!(plan.close_early.is_empty() && plan.copies.is_empty());
        let maps = up_i32(ops, &[plan.write_map.as_slice(), &plan.read_map].concat());
        let keys = Int4Keys {
            k_cache: ops.dev(&kc),
            k_scale: ops.dev(&ks),
            k_residual: ops.dev(&kr),
            num_blocks: nb,
            block_size: bs,
            residuals: capacity,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        let pairs = |p: &[[i32; 2]]| {
            up_i32(
                ops,
                &[p.iter().flatten().copied().collect(), vec![0]].concat(),
            )
        };
        let open = pairs(&plan.open);
        ops.int4_keys(Int4Op::Open, keys, ops.dev(&open), plan.open.len())
            .unwrap();
        let (kd, vd, sd) = (up::<f32>(ops, &k), up::<f32>(ops, &v), up_i32(ops, slots));
        ops.reshape_and_cache(&rows_and_pool(
            (ops.dev(&kd), ops.dev(&vd)),
            (ops.dev(&kc), ops.dev(&vc)),
            (ops.dev(&ks), ops.dev(&vs)),
            (ops.dev(&kr), ops.dev(&maps).range(0..nb).unwrap(), capacity),
            ops.dev(&sd),
            t,
            (nkv, hd),
            (slots_n, bs),
        ))
        .unwrap();
        let close = pairs(&plan.close);
        ops.int4_keys(Int4Op::Close, keys, ops.dev(&close), plan.close.len())
            .unwrap();
        // The step's rows read back from the pool: what kvlab-cpu's store reads for them.
        ops.kv_read_back(&rows_and_pool(
            (ops.dev(&kd), ops.dev(&vd)),
            (ops.dev(&kc), ops.dev(&vc)),
            (ops.dev(&ks), ops.dev(&vs)),
            (
                ops.dev(&kr),
                ops.dev(&maps).range(nb..2 * nb).unwrap(),
                capacity,
            ),
            ops.dev(&sd),
            t,
            (nkv, hd),
            (slots_n, bs),
        ))
        .unwrap();
        let (got_k, got_v) = (down::<f32>(ops, &kd), down::<f32>(ops, &vd));
        let mut tile = Vec::new();
        for (i, &slot) in slots.iter().enumerate() {
            let at = slot as usize..slot as usize + 1;
            let want = cpu_k.read(at.clone(), 0..nkv, &mut tile).to_vec();
            let got = &got_k[i * kvd..(i + 1) * kvd];
            assert!(bits_eq(got, &want), "read-back key of slot {slot}");
            let want = cpu_v.read(at, 0..nkv, &mut tile).to_vec();
            let got = &got_v[i * kvd..(i + 1) * kvd];
            assert!(bits_eq(got, &want), "read-back value of slot {slot}");
        }
    }
    // kvlab-cpu's bytes: keys (codes, scales, minima, a flag per block and the open block's
    // residual), values (codes, scales, minima).
    let (mut want_k, mut want_v) = (Vec::new(), Vec::new());
    cpu_k.save_rows(0, slots_n, &mut want_k).unwrap();
    cpu_v.save_rows(0, slots_n, &mut want_v).unwrap();
    let bytes = |c: &Buf<Int4x2>| -> Vec<u8> { s.to_vec(c).into_iter().map(|b| b.0).collect() };
    let split = |pairs: Vec<f32>| -> Vec<u8> {
        let (s, m): (Vec<f32>, Vec<f32>) = pairs.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
        s.iter().chain(&m).flat_map(|x| x.to_le_bytes()).collect()
    };
    let mut got_k = bytes(&kc);
    got_k.extend(split(s.to_vec(&ks)));
    let open_block = 2;
    let res = residuals
        .residual_of(open_block)
        .expect("block 2 is still filling");
    for b in 0..nb {
        got_k.push(u8::from(b == open_block));
        if b == open_block {
            let rows = s.to_vec(&kr)[res * bs * kvd..(res + 1) * bs * kvd].to_vec();
            // Rows 2 and 3 were never written: kvlab-cpu's residual holds zeros there.
            let written = 2 * kvd;
            got_k.extend(rows[..written].iter().flat_map(|x| x.to_le_bytes()));
            got_k.extend(std::iter::repeat_n(0u8, 4 * (bs * kvd - written)));
        }
    }
    let mut got_v = bytes(&vc);
    got_v.extend(split(s.to_vec(&vs)));
    assert_eq!(got_k.len(), want_k.len());
    assert!(got_k == want_k, "int4 keys differ from kvlab-cpu's");
    assert!(got_v == want_v, "int4 values differ from kvlab-cpu's");
    eprintln!("int4: keys closed, reopened and closed again, values: kvlab-cpu's bits");
}

on_gpu_and_emu!(
    paged_attention_over_quantized_pools,
    gpu_paged_attention_over_quantized_pools,
    emu_paged_attention_over_quantized_pools
);
/// Paged attention reads the quantized pools (bf16, fp8-e4m3, int8, int4, the CPU pool's
/// bits), dequantizing in registers, as the reference reads the values those bits stand for.
fn paged_attention_over_quantized_pools(ops: &Backend) {
    fn all<A: DType, C: CacheElem>(ops: &Backend) {
        let mut r = rng(15);
        for heads in [(8, 2, 128), (8, 4, 8), (4, 1, 256)] {
            let prefill = [(0, 9), (40, 23)];
            let mut case = attn_case::<A, f32>(&mut r, &[1, 17, 700], &prefill, heads, 16);
            let pool = stored_pool::<C>(ops, &mut case);
            let max_partitions = launch::num_partitions(700, launch::PARTITION_SIZE);
            for window in [None, Some(300)] {
                case.window = window;
                run_attention::<A, C>(ops, &case, &pool, DecodeKernel::V1);
                run_attention::<A, C>(ops, &case, &pool, DecodeKernel::V2 { max_partitions });
            }
        }
    }
    all::<f32, half::bf16>(ops);
    all::<f32, u8>(ops);
    all::<f32, i8>(ops);
    all::<F16, u8>(ops);
    all::<F16, i8>(ops);
    all::<f32, Int4x2>(ops);
    all::<F16, Int4x2>(ops);
}

/// A batch of sequences over a shuffled pool: some decode (1 new token), some prefill with a
/// cached prefix (keys before the step in the pool) — the layout the engine runs. Global
/// attention; the caller sets `window`.
fn attn_case<A: DType, C: DType>(
    r: &mut ChaCha8Rng,
    decode_ctx: &[usize],
    prefill: &[(usize, usize)], // (cached, new)
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    block_size: usize,
) -> AttnCase {
    let (kv_dim, bs) = (n_kv_heads * head_dim, block_size);
    let mut lens: Vec<(usize, usize)> = decode_ctx.iter().map(|&c| (c - 1, 1)).collect();
    lens.extend_from_slice(prefill);
    let blocks_of = |&(c, n): &(usize, usize)| (c + n).div_ceil(bs);
    let max_blocks = lens.iter().map(blocks_of).max().unwrap_or(1);
    let nb = lens.iter().map(blocks_of).sum::<usize>() + 3;
    let mut free: Vec<i32> = (0..nb as i32).collect();
    free.shuffle(r);
    let mut k_cache = rounded::<C>(&uniform(r, nb * bs * kv_dim, 1.0));
    let mut v_cache = rounded::<C>(&uniform(r, nb * bs * kv_dim, 1.0));
    let (mut block_tables, mut query_start_loc) = (Vec::new(), vec![0]);
    let (mut context_lens, mut token_seq) = (Vec::new(), Vec::new());
    for (s, &(cached, new)) in lens.iter().enumerate() {
        let blocks = (cached + new).div_ceil(bs);
        let row: Vec<i32> = (0..max_blocks)
            .map(|j| if j < blocks { free.pop().unwrap() } else { -1 })
            .collect();
        block_tables.extend_from_slice(&row);
        token_seq.extend(std::iter::repeat_n(s as i32, new));
        query_start_loc.push(token_seq.len() as i32);
        context_lens.push((cached + new) as i32);
        // Poison the slots of this step's own positions: the kernels must read those keys from
        // the step's rows, never from the pool.
        for p in cached..cached + new {
            let slot = row[p / bs] as usize * bs + p % bs;
            k_cache[slot * kv_dim..][..kv_dim].fill(f32::NAN);
            v_cache[slot * kv_dim..][..kv_dim].fill(f32::NAN);
        }
    }
    let n_tokens = token_seq.len();
    AttnCase {
        q: rounded::<A>(&uniform(r, n_tokens * n_heads * head_dim, 1.0)),
        k_new: rounded::<A>(&uniform(r, n_tokens * kv_dim, 1.0)),
        v_new: rounded::<A>(&uniform(r, n_tokens * kv_dim, 1.0)),
        k_cache,
        v_cache,
        block_tables,
        max_blocks,
        query_start_loc,
        context_lens,
        token_seq,
        n_decode: decode_ctx.len(),
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        window: None,
        scale: 1.0 / (head_dim as f32).sqrt(),
    }
}

/// A layer's pool on the device: K and V in the cache type, with their scales (one unused
/// element for the unscaled types).
struct DevicePool<C> {
    k: Buf<C>,
    v: Buf<C>,
    k_scale: Buf<f32>,
    v_scale: Buf<f32>,
    /// int4: no block still filling, so one unused residual and a read map of -1.
    k_residual: Buf<f32>,
    read_map: Buf<i32>,
}

/// The case's caches uploaded as they are, rounded to `C` (f32, f16).
fn plain_pool<C: DType + CacheElem>(ops: &Backend, case: &AttnCase) -> DevicePool<C> {
    DevicePool {
        k: up::<C>(ops, &case.k_cache),
        v: up::<C>(ops, &case.v_cache),
        k_scale: up::<f32>(ops, &[f32::NAN]),
        v_scale: up::<f32>(ops, &[f32::NAN]),
        k_residual: up::<f32>(ops, &[f32::NAN]),
        read_map: up_i32(ops, &[-1]),
    }
}

/// The case's caches written row by row into kvlab-cpu's `KvStore` of `C`'s dtype and uploaded
/// as the store saves them (codes, then scales; int4's scales and minima interleaved into the
/// device's (s, min) pairs, its key groups the case's blocks, every one complete): the device
/// reads the CPU engine's bits. The case's caches become what the store reads back, the
/// reference's input.
fn stored_pool<C: CacheElem>(ops: &Backend, case: &mut AttnCase) -> DevicePool<C> {
    let (nkv, hd, slots, bs) = (
        case.n_kv_heads,
        case.head_dim,
        case.num_slots(),
        case.block_size,
    );
    let mut halves = Vec::new();
    for (part, x) in [
        (Part::Keys, &mut case.k_cache),
        (Part::Values, &mut case.v_cache),
    ] {
        // The step's own slots hold NaN poison (attention must take those keys from the step's
        // rows). int4 keys share one (s, min) per channel over a block, so a NaN there would
        // make the block's cached keys NaN too: those keys get a finite poison instead, still
        // far from any real key.
        if C::INT4 && part == Part::Keys {
            x.iter_mut().filter(|v| v.is_nan()).for_each(|v| *v = 8.0);
        }
        let mut store = KvStore::new(C::KV_DTYPE, part, slots, (nkv, hd), bs);
        for (r, row) in x.chunks_exact(nkv * hd).enumerate() {
            store.write(r, row);
        }
        let mut bytes = Vec::new();
        store.save_rows(0, slots, &mut bytes).expect("whole rows");
        let (codes, scales) = bytes.split_at(slots * row_elems::<C>(nkv, hd) * C::BYTES);
        let codes: Vec<C> = codes.chunks_exact(C::BYTES).map(C::from_le).collect();
        let mut scales: Vec<f32> = if C::INT4 {
            // Keys: (s, min) per channel per block, then a 0 flag per block (all complete);
            // values: (s, min) per group of 32 channels per slot.
            let n = match part {
                Part::Keys => slots / bs * nkv * hd,
                Part::Values => slots * nkv * hd.div_ceil(32),
            };
            let (floats, flags) = scales.split_at(8 * n);
            assert!(flags.iter().all(|&f| f == 0), "every block complete");
            let f: Vec<f32> = floats
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (0..n).flat_map(|i| [f[i], f[n + i]]).collect()
        } else {
            scales
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        assert_eq!(scales.is_empty(), !C::SCALED && !C::INT4);
        if scales.is_empty() {
            scales.push(f32::NAN);
        }
        let mut tile = Vec::new();
        x.copy_from_slice(store.read(0..slots, 0..nkv, &mut tile));
        halves.push((ops.upload(&codes), ops.upload(&scales)));
    }
    let (v, v_scale) = halves.pop().expect("values");
    let (k, k_scale) = halves.pop().expect("keys");
    DevicePool {
        k,
        v,
        k_scale,
        v_scale,
        k_residual: up::<f32>(ops, &[f32::NAN]),
        read_map: up_i32(ops, &vec![-1; (slots / bs).max(1)]),
    }
}

/// The case's attention on the GPU over `pool` (decodes with `decode`, prefills with
/// prefill_attention_v1) against [`reference::attention`].
fn run_attention<A: DType, C: CacheElem>(
    ops: &Backend,
    case: &AttnCase,
    pool: &DevicePool<C>,
    decode: DecodeKernel,
) {
    let want = reference::attention(case);
    let (n_tokens, heads, hd) = (case.n_tokens(), case.n_heads, case.head_dim);
    let out = poisoned::<A>(ops, n_tokens * heads * hd);
    let bufs = (
        up::<A>(ops, &case.q),
        up::<A>(ops, &case.k_new),
        up::<A>(ops, &case.v_new),
    );
    let ints = (
        up_i32(ops, &case.block_tables),
        up_i32(ops, &case.query_start_loc),
        up_i32(ops, &case.context_lens),
        up_i32(ops, &case.token_seq),
    );
    let args = AttentionArgs {
        out: ops.dev(&out),
        q: ops.dev(&bufs.0),
        k_new: ops.dev(&bufs.1),
        v_new: ops.dev(&bufs.2),
        k_cache: ops.dev(&pool.k),
        v_cache: ops.dev(&pool.v),
        k_scale: ops.dev(&pool.k_scale),
        v_scale: ops.dev(&pool.v_scale),
        k_residual: ops.dev(&pool.k_residual),
        read_map: ops.dev(&pool.read_map),
        block_tables: ops.dev(&ints.0),
        query_start_loc: ops.dev(&ints.1),
        context_lens: ops.dev(&ints.2),
        token_seq: ops.dev(&ints.3),
        n_tokens,
        n_seqs: case.context_lens.len(),
        max_blocks: case.max_blocks,
        n_heads: heads,
        n_kv_heads: case.n_kv_heads,
        head_dim: hd,
        block_size: case.block_size,
        num_slots: case.num_slots(),
        residuals: 0,
        window: case.window.unwrap_or(0),
        scale: case.scale,
    };
    let n_decode = case.n_decode;
    if n_decode > 0 {
        match decode {
            DecodeKernel::V1 => ops.paged_attention_v1(&args, n_decode).unwrap(),
            DecodeKernel::V2 { max_partitions } => {
                let floats = launch::v2_workspace_floats(n_decode, heads, max_partitions, hd);
                let ws = poisoned::<f32>(ops, floats);
                ops.paged_attention_v2(&args, n_decode, max_partitions, ops.dev(&ws))
                    .unwrap();
            }
        }
    }
    if n_decode < n_tokens {
        ops.prefill_attention_v1(&args, n_decode, n_tokens - n_decode)
            .unwrap();
    }
    let what = format!(
        "attention {decode:?} heads {heads}/{} hd {hd} window {:?} ({} cache)",
        case.n_kv_heads,
        case.window,
        <C as CacheElem>::NAME
    );
    check::<A>(&what, &down(ops, &out), &want);
}

on_gpu_and_emu!(
    paged_attention_decode_and_prefill,
    gpu_paged_attention_decode_and_prefill,
    emu_paged_attention_decode_and_prefill
);
fn paged_attention_decode_and_prefill(ops: &Backend) {
    fn all<A: DType, C: DType + CacheElem>(ops: &Backend) {
        let mut r = rng(5);
        // ((heads, kv_heads, head_dim), block_size): MHA, GQA, MQA, stories260K's tiny head,
        // Gemma's 256; blocks of 8, 16 and 32 tokens.
        let shapes = [
            ((4, 4, 64), 16),
            ((8, 2, 128), 16),
            ((8, 2, 128), 8),
            ((6, 1, 96), 32),
            ((8, 4, 8), 16),
            ((4, 1, 256), 32),
        ];
        for (heads, bs) in shapes {
            // Decodes of 1, 17, 700 and 1500 keys (v2: 1, 1, 2, 3 partitions), then prefills
            // without and with a cached prefix.
            let prefill = [(0, 9), (40, 23)];
            let mut case = attn_case::<A, C>(&mut r, &[1, 17, 700, 1500], &prefill, heads, bs);
            let max_partitions = launch::num_partitions(1500, launch::PARTITION_SIZE);
            let pool = plain_pool::<C>(ops, &case);
            for window in [None, Some(300)] {
                case.window = window;
                run_attention::<A, C>(ops, &case, &pool, DecodeKernel::V1);
                run_attention::<A, C>(ops, &case, &pool, DecodeKernel::V2 { max_partitions });
            }
        }
    }
    all::<f32, f32>(ops);
    all::<f32, F16>(ops);
    all::<F16, F16>(ops);
}

on_gpu_and_emu!(
    glu_residual_gather_argmax,
    gpu_glu_residual_gather_argmax,
    emu_glu_residual_gather_argmax
);
fn glu_residual_gather_argmax(ops: &Backend) {
    fn run<T: DType>(ops: &Backend) {
        let mut r = rng(6);
        let n = 3000;
        for act in [Activation::Silu, Activation::GeluTanh] {
            let gate = rounded::<T>(&uniform(&mut r, n, 4.0));
            let upv = rounded::<T>(&uniform(&mut r, n, 2.0));
            let mut want = gate.clone();
            refops::glu(&mut want, &upv, act);
            let (g, u) = (up::<T>(ops, &gate), up::<T>(ops, &upv));
            ops.glu(ops.dev(&g), ops.dev(&u), n, act).unwrap();
            check::<T>(&format!("glu {act:?}"), &down(ops, &g), &want);
        }
        let x = uniform(&mut r, n, 1.0);
        let o = rounded::<T>(&uniform(&mut r, n, 1.0));
        let want: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let (xd, od) = (up::<f32>(ops, &x), up::<T>(ops, &o));
        ops.residual_add(ops.dev(&xd), ops.dev(&od), n).unwrap();
        check::<T>("residual add", &down(ops, &xd), &want);
        // A projection's bias (Qwen2), broadcast over 30 rows of 100.
        let (rows, cols) = (30, 100);
        let xb = rounded::<T>(&uniform(&mut r, rows * cols, 1.0));
        let bias = uniform(&mut r, cols, 1.0);
        let want: Vec<f32> = xb
            .iter()
            .enumerate()
            .map(|(i, v)| v + bias[i % cols])
            .collect();
        let (xd, bd) = (up::<T>(ops, &xb), up::<f32>(ops, &bias));
        ops.add_bias(ops.dev(&xd), ops.dev(&bd), rows, cols)
            .unwrap();
        check::<T>("add bias", &down(ops, &xd), &want);
    }
    run::<f32>(ops);
    run::<F16>(ops);

    let (t, dim) = (9, 70);
    let mut r = rng(7);
    let x = uniform(&mut r, t * dim, 1.0);
    let rows = [8, 0, 3];
    let out = poisoned::<f32>(ops, rows.len() * dim);
    let (xd, rd) = (up::<f32>(ops, &x), up_i32(ops, &rows));
    ops.gather_rows(
        ops.dev(&out),
        ops.dev(&xd),
        ops.dev(&rd),
        rows.len(),
        t,
        dim,
    )
    .unwrap();
    let want: Vec<f32> = rows
        .iter()
        .flat_map(|&i| x[i as usize * dim..][..dim].to_vec())
        .collect();
    assert_eq!(down(ops, &out), want);

    // argmax: random rows, a tie (lowest id wins), NaNs (never win), all-NaN row (id 0).
    let vocab = 32_000;
    let mut logits = uniform(&mut r, 4 * vocab, 5.0);
    logits[vocab + 100] = 50.0;
    logits[vocab + 31_000] = 50.0;
    logits[2 * vocab + 7] = f32::NAN;
    logits[2 * vocab + 8] = 60.0;
    logits[3 * vocab..].fill(f32::NAN);
    let want: Vec<i32> = logits
        .chunks_exact(vocab)
        .map(|row| kvlab_model::sampler::argmax(row) as i32)
        .collect();
    assert_eq!(want[1], 100);
    assert_eq!(want[3], 0);
    let (ld, od) = (up::<f32>(ops, &logits), up_i32(ops, &[-5; 4]));
    ops.argmax(ops.dev(&ld), ops.dev(&od), 4, vocab).unwrap();
    let got = ops.to_vec(&od);
    assert_eq!(got, want);
}

#[test]
fn gpu_linear_cublas() {
    let Some(ops) = gpu("gpu_linear") else {
        return;
    };
    fn run<W: DType, Y: DType>(ops: &Backend, t: usize, i: usize, o: usize) {
        let mut r = rng(8);
        let x = rounded::<W>(&uniform(&mut r, t * i, 1.0));
        let w = rounded::<W>(&uniform(&mut r, o * i, 1.0 / (i as f32).sqrt()));
        let want = reference::linear(&x, &w, i, o);
        let (xd, wd) = (up::<W>(ops, &x), up::<W>(ops, &w));
        let y = poisoned::<Y>(ops, t * o);
        // cuBLAS: the GPU only (the emulator runs kvlab's own kernels).
        let cublas = ops.ops().expect("gpu_linear runs on the GPU");
        cublas
            .linear::<W, Y>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), t, i, o)
            .unwrap();
        // The tolerance of the coarser type: f16 inputs accumulated on tensor cores can miss
        // the f32 tolerance even when the output is f32.
        check_within(
            &format!("linear {t}x{i} -> {o} ({} in, {} out)", W::NAME, Y::NAME),
            &down(ops, &y),
            &want,
            tolerance::<W>().max(tolerance::<Y>()),
        );
    }
    run::<f32, f32>(&ops, 1, 288, 768);
    run::<f32, f32>(&ops, 37, 1024, 512);
    run::<F16, F16>(&ops, 37, 1024, 512);
    run::<F16, f32>(&ops, 5, 4096, 1000);
}

/// The paged attention reference itself (no GPU): keys scattered over shuffled blocks, some read
/// from the step's rows, give plain contiguous attention of the same sequence.
#[test]
fn reference_paged_attention_equals_contiguous_attention() {
    let mut r = rng(3);
    let (h_n, kvh, hd, bs) = (4, 2, 8, 4);
    let kv_dim = kvh * hd;
    let (ctx, n_new) = (11, 3); // keys 0..8 cached, 8..11 new
    let pos0 = ctx - n_new;
    let k_all = uniform(&mut r, ctx * kv_dim, 1.0);
    let v_all = uniform(&mut r, ctx * kv_dim, 1.0);
    let table = vec![5i32, 1, 3]; // logical blocks 0..3 → physical
    let num_slots = 6 * bs;
    let mut case = AttnCase {
        q: uniform(&mut r, n_new * h_n * hd, 1.0),
        k_new: k_all[pos0 * kv_dim..].to_vec(),
        v_new: v_all[pos0 * kv_dim..].to_vec(),
        k_cache: vec![f32::NAN; num_slots * kv_dim],
        v_cache: vec![f32::NAN; num_slots * kv_dim],
        block_tables: table.clone(),
        max_blocks: 3,
        query_start_loc: vec![0, n_new as i32],
        context_lens: vec![ctx as i32],
        token_seq: vec![0; n_new],
        n_decode: 0,
        n_heads: h_n,
        n_kv_heads: kvh,
        head_dim: hd,
        block_size: bs,
        window: None,
        scale: 0.35,
    };
    let slots: Vec<i32> = (0..pos0)
        .map(|j| table[j / bs] * bs as i32 + (j % bs) as i32)
        .collect();
    let (kc, vc) = (&mut case.k_cache, &mut case.v_cache);
    reference::reshape_and_cache(&k_all, &v_all, kc, vc, &slots, kv_dim);
    for window in [None, Some(5)] {
        case.window = window;
        let got = reference::attention(&case);
        for i in 0..n_new {
            let p = pos0 + i;
            let lo = launch::first_key(p, window);
            for h in 0..h_n {
                let g = h / (h_n / kvh);
                let qh = &case.q[(i * h_n + h) * hd..][..hd];
                let mut s: Vec<f32> = (lo..=p)
                    .map(|j| refops::dot(qh, &k_all[j * kv_dim + g * hd..][..hd]) * 0.35)
                    .collect();
                refops::softmax(&mut s);
                let mut want = vec![0.0; hd];
                for (j, w) in (lo..=p).zip(s) {
                    refops::axpy(&mut want, w, &v_all[j * kv_dim + g * hd..][..hd]);
                }
                let o = &got[(i * h_n + h) * hd..][..hd];
                assert!(reference::rel_err(o, &want) < 1e-6, "{window:?} {i} {h}");
            }
        }
    }
}

#[test]
fn reference_errors_flag_nan_and_infinity() {
    use reference::rel_err;
    assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    assert!(rel_err(&[f32::NAN], &[1.0]).is_infinite());
    assert!(rel_err(&[f32::INFINITY], &[1.0]).is_infinite());
    assert!((rel_err(&[1.1, -2.0], &[1.0, -2.0]) - 0.05).abs() < 1e-6);
    assert_eq!(rel_err(&[0.5], &[0.0]), 0.5);
}

#[test]
fn reference_linear_is_x_times_w_transposed() {
    let y = reference::linear(&[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 2, 3);
    assert_eq!(y, vec![1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
}
