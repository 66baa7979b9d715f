//! Each kernel against its CPU reference on random inputs: outputs poisoned with NaN before the
//! run so every element must be written, f32 within 1e-5 and f16 within 1e-2 relative error
//! (normwise), NaN never passing. Skips without a GPU unless KVLAB_REQUIRE_CUDA=1.

mod common;

use common::{check, down, gpu, poisoned, rounded, up, up_i32};
use kvlab_cuda::dtype::DType;
use kvlab_cuda::launch::{self, DecodeKernel};
use kvlab_cuda::ops::{AttentionArgs, Ops};
use kvlab_cuda::reference::{self, AttentionInput, Rng};
use kvlab_model::{Activation, ops as refops};

type F16 = half::f16;

#[test]
fn gpu_embedding() {
    let Some((_dev, ops)) = gpu("gpu_embedding") else {
        return;
    };
    fn run<W: DType>(ops: &Ops) {
        let (vocab, dim, t) = (50, 96, 7);
        let mut r = Rng::new(1);
        let table = rounded::<W>(&r.vec(vocab * dim, 1.0));
        let ids: Vec<i32> = (0..t).map(|_| r.below(vocab) as i32).collect();
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
    run::<f32>(&ops);
    run::<F16>(&ops);
}

#[test]
fn gpu_rmsnorm_plain_qk_and_in_place() {
    let Some((_dev, ops)) = gpu("gpu_rmsnorm") else {
        return;
    };
    let mut r = Rng::new(2);
    // Residual f32 → activation type, rows of dim 288 (stories15M) and 4096 (Llama-3-8B).
    for n in [288, 4096] {
        let rows = 5;
        let x = r.vec(rows * n, 3.0);
        let w = r.vec(n, 1.0);
        let want = reference::rmsnorm_rows(&x, &w, n, 1e-5);
        let (xd, wd) = (up::<f32>(&ops, &x), up::<f32>(&ops, &w));
        let y = poisoned::<f32>(&ops, rows * n);
        ops.rmsnorm::<f32, f32>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), rows, n, 1e-5)
            .unwrap();
        check::<f32>("rmsnorm f32->f32", &down(&ops, &y), &want);
        let y = poisoned::<F16>(&ops, rows * n);
        ops.rmsnorm::<f32, F16>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), rows, n, 1e-5)
            .unwrap();
        check::<F16>("rmsnorm f32->f16", &down(&ops, &y), &want);
    }
    // Gemma's QK-norm: every head of 4 tokens × 3 heads × head_dim 256, in place.
    fn qk<T: DType>(ops: &Ops, r: &mut Rng) {
        let (rows, hd) = (12, 256);
        let x = rounded::<T>(&r.vec(rows * hd, 2.0));
        let w = r.vec(hd, 1.0);
        let want = reference::rmsnorm_rows(&x, &w, hd, 1e-6);
        let (xd, wd) = (up::<T>(ops, &x), up::<f32>(ops, &w));
        ops.rmsnorm::<T, T>(ops.dev(&xd), ops.dev(&xd), ops.dev(&wd), rows, hd, 1e-6)
            .unwrap();
        check::<T>("qk-norm in place", &down(ops, &xd), &want);
    }
    qk::<f32>(&ops, &mut r);
    qk::<F16>(&ops, &mut r);
}

#[test]
fn gpu_rope_both_layouts() {
    let Some((_dev, ops)) = gpu("gpu_rope") else {
        return;
    };
    fn run<T: DType>(ops: &Ops, neox: bool) {
        let (t, heads, hd, max_pos) = (6, 4, 64, 300);
        let mut r = Rng::new(3);
        let x = rounded::<T>(&r.vec(t * heads * hd, 1.0));
        let positions: Vec<i32> = (0..t).map(|_| r.below(max_pos) as i32).collect();
        let (cos, sin) = kvlab_cuda::rope::rope_table(10_000.0, hd, max_pos);
        let mut want = x.clone();
        for (i, row) in want.chunks_exact_mut(heads * hd).enumerate() {
            kvlab_cuda::rope::apply_table(row, &cos, &sin, positions[i] as usize, hd, neox);
        }
        let xd = up::<T>(ops, &x);
        let (pd, cd, sd) = (
            up_i32(ops, &positions),
            up::<f32>(ops, &cos),
            up::<f32>(ops, &sin),
        );
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
        check::<T>(
            if neox {
                "rope neox"
            } else {
                "rope interleaved"
            },
            &down(ops, &xd),
            &want,
        );
    }
    for neox in [false, true] {
        run::<f32>(&ops, neox);
        run::<F16>(&ops, neox);
    }
}

#[test]
fn gpu_reshape_and_cache_and_copy_blocks() {
    let Some((_dev, ops)) = gpu("gpu_reshape_and_cache") else {
        return;
    };
    fn run<A: DType, C: DType>(ops: &Ops) {
        let (t, kv_dim, bs, nb) = (5, 32, 4, 6);
        let num_slots = nb * bs;
        let mut r = Rng::new(4);
        let k = rounded::<A>(&r.vec(t * kv_dim, 1.0));
        let v = rounded::<A>(&r.vec(t * kv_dim, 1.0));
        let slots = [9, -1, 2, 23, 10];
        let (kc, vc) = (
            poisoned::<C>(ops, num_slots * kv_dim),
            poisoned::<C>(ops, num_slots * kv_dim),
        );
        let (kd, vd, sd) = (up::<A>(ops, &k), up::<A>(ops, &v), up_i32(ops, &slots));
        ops.reshape_and_cache(
            ops.dev(&kd),
            ops.dev(&vd),
            ops.dev(&kc),
            ops.dev(&vc),
            ops.dev(&sd),
            t,
            kv_dim,
            num_slots,
        )
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
            ops.dev(&vc),
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
            C::NAME
        );
    }
    run::<f32, f32>(&ops);
    run::<f32, F16>(&ops);
    run::<F16, f32>(&ops);
    run::<F16, F16>(&ops);
}

/// A batch of sequences over a shuffled pool: some decode (1 new token), some prefill with a
/// cached prefix (keys before the step in the pool) — the layout the engine runs.
struct AttnCase {
    q: Vec<f32>,
    k_new: Vec<f32>,
    v_new: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    tables: Vec<i32>,
    max_blocks: usize,
    qsl: Vec<i32>,
    ctx: Vec<i32>,
    token_seq: Vec<i32>,
    n_decode: usize,
    n_tokens: usize,
    num_slots: usize,
}

fn attn_case<A: DType, C: DType>(
    r: &mut Rng,
    decode_ctx: &[usize],
    prefill: &[(usize, usize)], // (cached, new)
    heads: usize,
    kv_heads: usize,
    hd: usize,
    bs: usize,
) -> AttnCase {
    let kv_dim = kv_heads * hd;
    let mut lens: Vec<(usize, usize)> = decode_ctx.iter().map(|&c| (c - 1, 1)).collect();
    lens.extend_from_slice(prefill);
    let max_blocks = lens
        .iter()
        .map(|&(c, n)| (c + n).div_ceil(bs))
        .max()
        .unwrap_or(1);
    let total_blocks: usize = lens.iter().map(|&(c, n)| (c + n).div_ceil(bs)).sum();
    let nb = total_blocks + 3;
    let mut free: Vec<i32> = (0..nb as i32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, r.below(i + 1));
    }
    let num_slots = nb * bs;
    let mut k_cache = rounded::<C>(&r.vec(num_slots * kv_dim, 1.0));
    let mut v_cache = rounded::<C>(&r.vec(num_slots * kv_dim, 1.0));
    let (mut tables, mut qsl, mut ctx, mut token_seq) =
        (Vec::new(), vec![0], Vec::new(), Vec::new());
    let mut n_tokens = 0;
    for (s, &(cached, new)) in lens.iter().enumerate() {
        let blocks = (cached + new).div_ceil(bs);
        let row: Vec<i32> = (0..max_blocks)
            .map(|j| if j < blocks { free.pop().unwrap() } else { -1 })
            .collect();
        tables.extend_from_slice(&row);
        n_tokens += new;
        qsl.push(n_tokens as i32);
        ctx.push((cached + new) as i32);
        token_seq.extend(std::iter::repeat_n(s as i32, new));
        // Poison the slots of this step's own positions: the kernels must read those keys from
        // the step's rows, never from the pool.
        for p in cached..cached + new {
            let slot = row[p / bs] as usize * bs + p % bs;
            for i in 0..kv_dim {
                k_cache[slot * kv_dim + i] = f32::NAN;
                v_cache[slot * kv_dim + i] = f32::NAN;
            }
        }
    }
    AttnCase {
        q: rounded::<A>(&r.vec(n_tokens * heads * hd, 1.0)),
        k_new: rounded::<A>(&r.vec(n_tokens * kv_dim, 1.0)),
        v_new: rounded::<A>(&r.vec(n_tokens * kv_dim, 1.0)),
        k_cache,
        v_cache,
        tables,
        max_blocks,
        qsl,
        ctx,
        token_seq,
        n_decode: decode_ctx.len(),
        n_tokens,
        num_slots,
    }
}

#[allow(clippy::too_many_arguments)]
fn run_attention<A: DType, C: DType>(
    ops: &Ops,
    case: &AttnCase,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    bs: usize,
    window: Option<usize>,
    decode: DecodeKernel,
) {
    let scale = 1.0 / (hd as f32).sqrt();
    let want = reference::attention(&AttentionInput {
        q: &case.q,
        k_new: &case.k_new,
        v_new: &case.v_new,
        k_cache: &case.k_cache,
        v_cache: &case.v_cache,
        block_tables: &case.tables,
        max_blocks: case.max_blocks,
        query_start_loc: &case.qsl,
        context_lens: &case.ctx,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        block_size: bs,
        window,
        scale,
    });
    let out = poisoned::<A>(ops, case.n_tokens * heads * hd);
    let bufs = (
        up::<A>(ops, &case.q),
        up::<A>(ops, &case.k_new),
        up::<A>(ops, &case.v_new),
        up::<C>(ops, &case.k_cache),
        up::<C>(ops, &case.v_cache),
    );
    let ints = (
        up_i32(ops, &case.tables),
        up_i32(ops, &case.qsl),
        up_i32(ops, &case.ctx),
        up_i32(ops, &case.token_seq),
    );
    let args = AttentionArgs {
        out: ops.dev(&out),
        q: ops.dev(&bufs.0),
        k_new: ops.dev(&bufs.1),
        v_new: ops.dev(&bufs.2),
        k_cache: ops.dev(&bufs.3),
        v_cache: ops.dev(&bufs.4),
        block_tables: ops.dev(&ints.0),
        query_start_loc: ops.dev(&ints.1),
        context_lens: ops.dev(&ints.2),
        token_seq: ops.dev(&ints.3),
        n_tokens: case.n_tokens,
        n_seqs: case.ctx.len(),
        max_blocks: case.max_blocks,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        block_size: bs,
        num_slots: case.num_slots,
        window: window.unwrap_or(0),
        scale,
    };
    if case.n_decode > 0 {
        match decode {
            DecodeKernel::V1 => ops.paged_attention_v1(&args, case.n_decode).unwrap(),
            DecodeKernel::V2 { max_partitions } => {
                let floats = launch::v2_workspace_floats(case.n_decode, heads, max_partitions, hd);
                let ws = poisoned::<f32>(ops, floats);
                ops.paged_attention_v2(&args, case.n_decode, max_partitions, ops.dev(&ws))
                    .unwrap();
            }
        }
    }
    if case.n_decode < case.n_tokens {
        ops.prefill_attention_v1(&args, case.n_decode, case.n_tokens - case.n_decode)
            .unwrap();
    }
    let what = format!(
        "attention {decode:?} heads {heads}/{kv_heads} hd {hd} window {window:?} ({} cache)",
        C::NAME
    );
    check::<A>(&what, &down(ops, &out), &want);
}

#[test]
fn gpu_paged_attention_decode_and_prefill() {
    let Some((_dev, ops)) = gpu("gpu_paged_attention") else {
        return;
    };
    fn all<A: DType, C: DType>(ops: &Ops) {
        let mut r = Rng::new(5);
        // (heads, kv_heads, head_dim): MHA, GQA, MQA, stories260K's tiny head, Gemma's 256.
        for (h, kvh, hd) in [(4, 4, 64), (8, 2, 128), (6, 1, 96), (8, 4, 8), (4, 1, 256)] {
            let bs = 16;
            // Decodes of 1, 17, 700 and 1500 keys (v2: 1, 1, 2, 3 partitions), then prefills
            // without and with a cached prefix.
            let case = attn_case::<A, C>(
                &mut r,
                &[1, 17, 700, 1500],
                &[(0, 9), (40, 23)],
                h,
                kvh,
                hd,
                bs,
            );
            for window in [None, Some(300)] {
                run_attention::<A, C>(ops, &case, h, kvh, hd, bs, window, DecodeKernel::V1);
                let parts = launch::num_partitions(1500, launch::PARTITION_SIZE);
                run_attention::<A, C>(
                    ops,
                    &case,
                    h,
                    kvh,
                    hd,
                    bs,
                    window,
                    DecodeKernel::V2 {
                        max_partitions: parts,
                    },
                );
            }
        }
    }
    all::<f32, f32>(&ops);
    all::<f32, F16>(&ops);
    all::<F16, F16>(&ops);
}

#[test]
fn gpu_glu_residual_gather_argmax() {
    let Some((_dev, ops)) = gpu("gpu_elementwise") else {
        return;
    };
    fn run<T: DType>(ops: &Ops) {
        let mut r = Rng::new(6);
        let n = 3000;
        for act in [Activation::Silu, Activation::GeluTanh] {
            let gate = rounded::<T>(&r.vec(n, 4.0));
            let upv = rounded::<T>(&r.vec(n, 2.0));
            let mut want = gate.clone();
            refops::glu(&mut want, &upv, act);
            let (g, u) = (up::<T>(ops, &gate), up::<T>(ops, &upv));
            ops.glu(ops.dev(&g), ops.dev(&u), n, act).unwrap();
            check::<T>(&format!("glu {act:?}"), &down(ops, &g), &want);
        }
        let x = r.vec(n, 1.0);
        let o = rounded::<T>(&r.vec(n, 1.0));
        let want: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let (xd, od) = (up::<f32>(ops, &x), up::<T>(ops, &o));
        ops.residual_add(ops.dev(&xd), ops.dev(&od), n).unwrap();
        check::<T>("residual add", &down(ops, &xd), &want);
    }
    run::<f32>(&ops);
    run::<F16>(&ops);

    let (t, dim) = (9, 70);
    let mut r = Rng::new(7);
    let x = r.vec(t * dim, 1.0);
    let rows = [8, 0, 3];
    let out = poisoned::<f32>(&ops, rows.len() * dim);
    let (xd, rd) = (up::<f32>(&ops, &x), up_i32(&ops, &rows));
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
    assert_eq!(down(&ops, &out), want);

    // argmax: random rows, a tie (lowest id wins), NaNs (never win), all-NaN row (id 0).
    let vocab = 32_000;
    let mut logits = r.vec(4 * vocab, 5.0);
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
    let (ld, od) = (up::<f32>(&ops, &logits), up_i32(&ops, &[-5; 4]));
    ops.argmax(ops.dev(&ld), ops.dev(&od), 4, vocab).unwrap();
    let got = ops.stream.clone_dtoh(&od).unwrap();
    assert_eq!(got, want);
}

#[test]
fn gpu_linear_cublas() {
    let Some((_dev, ops)) = gpu("gpu_linear") else {
        return;
    };
    fn run<W: DType, Y: DType>(ops: &Ops, t: usize, i: usize, o: usize) {
        let mut r = Rng::new(8);
        let x = rounded::<W>(&r.vec(t * i, 1.0));
        let w = rounded::<W>(&r.vec(o * i, 1.0 / (i as f32).sqrt()));
        let want = reference::linear(&x, &w, i, o);
        let (xd, wd) = (up::<W>(ops, &x), up::<W>(ops, &w));
        let y = poisoned::<Y>(ops, t * o);
        ops.linear::<W, Y>(ops.dev(&y), ops.dev(&xd), ops.dev(&wd), t, i, o)
            .unwrap();
        check::<Y>(
            &format!("linear {t}x{i} -> {o} ({} in)", W::NAME),
            &down(ops, &y),
            &want,
        );
    }
    run::<f32, f32>(&ops, 1, 288, 768);
    run::<f32, f32>(&ops, 37, 1024, 512);
    run::<F16, F16>(&ops, 37, 1024, 512);
    run::<F16, f32>(&ops, 5, 4096, 1000);
}
