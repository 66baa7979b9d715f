//! `--kv-dtype`: a cache that stores keys and values in f16, bf16, fp8-e4m3, int8 or int4.
//!
//! The reference of a quantized cache is attention over the rows it was given, rounded through
//! the dtype (`kv_store::round_trip`: row by row, int4 keys by groups of positions, the
//! unfinished group as written) and kept in f32: the contiguous cache (ring buffers included)
//! and the paged pool (blocks in any order) must give its output within f32 rounding, on random
//! inputs. Whole engines: every dtype runs on both CPU engines; f32 is the identity
//! suite's cache, bit for bit; the others move the logits, less for the finer formats. (The two
//! engines' f32 logits differ by rounding, and a key that lands on the other side of an f16
//! rounding boundary moves by a whole f16 step, so engine against engine is compared by top-1,
//! not by f32 tolerance.) What a dtype costs in quality is measured by `cargo xtask verify`
//! (tolerance mode) and `cargo xtask kv-quality`, not asserted here.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
use kvlab_cpu::attention::{Contiguous, Heads, attention};
use kvlab_cpu::kv_cache::{ContiguousKvCache, KvCache};
use kvlab_cpu::kv_store::{Part, round_trip};
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_cpu::paged::attention::{PagedLayer, SeqSpan, paged_attention};
use kvlab_cpu::paged::pool::KvPool;
use kvlab_model::sampler::argmax;
use kvlab_model::{Config, Engine, KvDtype, LayerKind, Model, teacher_force};
use rand::{Rng, SeedableRng};

/// |got − want| ≤ 1e-5·(1 + |want|) everywhere; NaN never passes.
fn assert_attention_close(got: &[f32], want: &[f32], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{what} [{i}]: {a} vs {b}"
        );
    }
}

/// For each dtype and shape (GQA, MQA, a sliding window whose ring wraps, contexts that cross
/// the kernels' runs and the threads' split), the contiguous cache, written one position at a
/// time, and the paged pool, its blocks in reverse order, against attention over the
/// round-tripped rows.
#[test]
fn both_caches_attend_over_exactly_the_rounded_rows() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for dtype in KvDtype::ALL {
        for (n_heads, n_kv_heads, head_dim, ctx, window) in [
            (8, 4, 8, 150, None),
            (4, 1, 32, 700, None),
            (6, 2, 16, 300, Some(40)),
            // Gemma 3's global-layer shape: query heads in fours on AVX-512, an f16 cache's
            // rows converted in registers.
            (4, 1, 256, 140, None),
        ] {
            let mut c = Config::llama(
                n_heads * head_dim,
                64,
                1,
                n_heads,
                n_kv_heads,
                32,
                ctx,
                true,
            );
            if let Some(w) = window {
                c.layer_kinds = vec![LayerKind::Local { window: w }];
            }
            let heads = Heads {
                n_heads,
                n_kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: window.unwrap_or(usize::MAX),
            };
            let (kvd, qd) = (c.kv_dim(), n_heads * head_dim);
            let mut draw =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-3.0..3.0)).collect() };
            let (k, v, q) = (draw(ctx * kvd), draw(ctx * kvd), draw(ctx * qd));
            // Positions 0..n as a cache with int4 key groups of `group` gives them back.
            let rounded_rows = |n: usize, group: usize| {
                let (mut k_rt, mut v_rt) = (k[..n * kvd].to_vec(), v[..n * kvd].to_vec());
                let shape = (n_kv_heads, head_dim);
                round_trip(dtype, Part::Keys, shape, group, &mut k_rt);
                round_trip(dtype, Part::Values, shape, group, &mut v_rt);
                (k_rt, v_rt)
            };
            let what =
                format!("{dtype} ({n_heads}, {n_kv_heads}, {head_dim}) ctx {ctx} {window:?}");
            // The contiguous cache, a position at a time: the last few queries checked.
            let mut cache = ContiguousKvCache::new(&c, ctx, dtype);
            for p in 0..ctx {
                cache.append(0, &k[p * kvd..][..kvd], &v[p * kvd..][..kvd]);
                if p + 3 >= ctx || p == 64 {
                    let (k_rt, v_rt) = rounded_rows(p + 1, KvDtype::INT4_GROUP);
                    let rounded = Contiguous {
                        k: &k_rt,
                        v: &v_rt,
                        kv_dim: kvd,
                    };
                    let (mut got, mut want) = (vec![f32::NAN; qd], vec![f32::NAN; qd]);
                    cache.attend(0, &q[p * qd..][..qd], &heads, &mut got);
                    attention(
                        &mut want,
                        &q[p * qd..][..qd],
                        &heads,
                        |_| p,
                        |_| 0,
                        |_| rounded,
                    );
                    assert_attention_close(&got, &want, &format!("contiguous {what} pos {p}"));
                }
                cache.len += 1;
            }
            // The paged pool: every position but the last 5 in blocks of 16, in reverse order;
            // the last 5 are the step's own rows, every query of them checked. (The last block
            // is not full, so its int4 keys are as written in the pool as in the step.)
            let (bs, pos0) = (16, ctx - 5);
            assert!(ctx % bs > 5);
            let (k_rt, v_rt) = rounded_rows(ctx, bs);
            let rounded = Contiguous {
                k: &k_rt,
                v: &v_rt,
                kv_dim: kvd,
            };
            let num_blocks = ctx.div_ceil(bs);
            let mut pool = KvPool::new(1, num_blocks, bs, (n_kv_heads, head_dim), dtype);
            let table: Vec<i32> = (0..num_blocks as i32).rev().collect();
            for p in 0..pos0 {
                let slot = table[p / bs] as usize * bs + p % bs;
                pool.write(0, slot, &k[p * kvd..][..kvd], &v[p * kvd..][..kvd]);
            }
            let (pool_k, pool_v) = pool.layer(0);
            let layer = PagedLayer {
                pool_k,
                pool_v,
                block_size: bs,
                k_new: &k_rt[pos0 * kvd..],
                v_new: &v_rt[pos0 * kvd..],
                kv_dim: kvd,
            };
            let seq = SeqSpan {
                row0: 0,
                n: 5,
                pos0,
                block_table: &table,
            };
            let (mut got, mut want) = (vec![f32::NAN; 5 * qd], vec![f32::NAN; 5 * qd]);
            paged_attention(&mut got, &q[pos0 * qd..], &heads, layer, &[seq], &[0; 5]);
            attention(
                &mut want,
                &q[pos0 * qd..],
                &heads,
                |r| pos0 + r,
                |_| 0,
                |_| rounded,
            );
            assert_attention_close(&got, &want, &format!("paged {what}"));
        }
    }
}

/// A 120-token prompt's first 40 tokens as prompt, the rest teacher-forced.
fn tokens() -> (Vec<u32>, Vec<u32>) {
    let ids: Vec<u32> = (0..120).map(|i| 1 + (i * 37 % 500) as u32).collect();
    (ids[..40].to_vec(), ids[40..].to_vec())
}

fn force(engine: &mut dyn Engine) -> Vec<Vec<f32>> {
    let (prompt, forced) = tokens();
    teacher_force(engine, &prompt, &forced, 128).unwrap()
}

fn paged(model: &Arc<Model>, dtype: KvDtype) -> PagedCpuEngine {
    let kv = kvlab_paged::KvCacheConfig::new(model.config.kv_cache_groups(), 64, 8);
    PagedCpuEngine::with_kv_dtype(model.clone(), kv, dtype).unwrap()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) })
}

#[test]
fn every_dtype_runs_on_both_engines_and_finer_formats_move_the_logits_less() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        let f32_logits = force(&mut CpuEngine::new(m.clone()));
        let mut moved = Vec::new();
        for dtype in KvDtype::ALL {
            let cpu = force(&mut CpuEngine::with_kv_dtype(m.clone(), dtype));
            // int4 groups keys by 32 positions in the contiguous cache, by the block in the
            // pool: blocks of 32 make the groups the same.
            let pool = if dtype == KvDtype::Int4 {
                let kv = kvlab_paged::KvCacheConfig::new(m.config.kv_cache_groups(), 16, 32);
                force(&mut PagedCpuEngine::with_kv_dtype(m.clone(), kv, dtype).unwrap())
            } else {
                force(&mut paged(&m, dtype))
            };
            let same_top1 = cpu
                .iter()
                .zip(&pool)
                .filter(|(a, b)| argmax(a) == argmax(b))
                .count();
            assert!(
                same_top1 * 20 >= cpu.len() * 19,
                "{dtype} {window:?}: top-1 agrees at {same_top1} of {} positions",
                cpu.len()
            );
            moved.push((dtype, max_abs_diff(&cpu, &f32_logits)));
        }
        // f32 is the identity suite's cache; every other dtype changes the logits, and the
        // 8-bit formats more than the 16-bit ones.
        let d = |dtype| moved.iter().find(|(x, _)| *x == dtype).unwrap().1;
        assert_eq!(d(KvDtype::F32), 0.0, "{window:?}");
        assert!(
            d(KvDtype::F16) > 0.0 && d(KvDtype::F16) < d(KvDtype::Int8),
            "{moved:?}"
        );
        assert!(d(KvDtype::Bf16) > d(KvDtype::F16), "{moved:?}");
        assert!(d(KvDtype::Fp8E4m3) > d(KvDtype::Bf16), "{moved:?}");
        assert!(d(KvDtype::Int4) > d(KvDtype::Bf16), "{moved:?}");
        assert!(moved.iter().all(|(_, x)| x.is_finite()), "{moved:?}");
    }
}

/// Reserved bytes are the formula's: for the contiguous cache, `max_seq_len` positions (int4:
/// rounded up to whole key groups of 32) and for the pool `num_blocks` blocks per layer.
#[test]
fn reserved_bytes_follow_each_dtypes_formula() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let c = &model.config;
    for dtype in KvDtype::ALL {
        let g = dtype.group(KvDtype::INT4_GROUP);
        let bytes = |tokens| c.n_layers * c.n_kv_heads * dtype.kv_head_bytes(c.head_dim, tokens, g);
        let mut cpu = CpuEngine::with_kv_dtype(model.clone(), dtype);
        let seq = cpu.new_sequence(100).unwrap();
        cpu.prefill(seq, &[1, 2, 3]).unwrap();
        let u = cpu.kv_usage();
        assert_eq!(
            (u.reserved_bytes, u.used_bytes),
            (bytes(100usize.next_multiple_of(g)), bytes(3)),
            "{dtype}"
        );
        if g == 1 {
            assert_eq!(u.reserved_bytes, dtype.bytes_per_token(c) * 100);
        }
        let pool = paged(&model, dtype);
        assert_eq!(
            pool.kv_usage().reserved_bytes,
            dtype.bytes_per_block(c, 8) * 64,
            "{dtype}"
        );
    }
}
