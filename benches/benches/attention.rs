//! One decode query of one head attending over `ctx` cached keys: the inner loop of every
//! decode step, whose cost grows with the context. (n_heads = n_kv_heads = 1, head_dim = 64, the
//! Llama-3.2-1B head.) Throughput: bytes of K and V read, 2 × ctx × head_dim × 4.
//!
//! * `scalar/attention_decode`: the reference maths with kvlab-model's scalar ops;
//! * `cpu/attention_decode`: kvlab-cpu's SIMD kernel over a contiguous (ctx, head_dim) cache;
//! * `cpu-paged/attention_decode/bs16`: the paged kernel reading the same keys through a block
//!   table whose 16-token blocks are scattered over a pool: the paged gather's cost.
//! * `cpu/attention_decode/stories15M_6_layers`: one decode token's attention over all 6 layers
//!   of the stories15M shape (6 heads of 48, 14 MB of keys and values at 1,024 positions): the
//!   cache outgrows L2, as it does in a real decode step;
//! * `cpu/attention_decode/kv_dtype`: one decode token's attention over all 6 layers of the
//!   stories15M shape at 1,024 positions, the contiguous cache stored in each `--kv-dtype`
//!   (decoded a run at a time inside attention): what fewer bytes per key buy or cost;
//! * `cpu/attention_decode/stories260K`: one decode query of all heads of stories260K's shape
//!   (8 query heads sharing 4 KV heads, head_dim 8): tiny heads, where the per-key overheads
//!   (reductions, exp, loads) rather than the multiply-adds set the cost;
//! * `cpu/attention_prefill/gemma-3-270m`: a prompt's attention in one layer of Gemma 3 270M's
//!   shape (4 query heads sharing 1 KV head of 256), every row of the step at once (the query
//!   tiles of `attention/tiled.rs` where the CPU has AVX-512) beside the same rows one at a time
//!   (each its own call, as a decode step attends): what reading each key once per tile buys.
//!   Throughput: query-key pairs attended.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::{assert_close, data};
use kvlab_cpu::attention::{Contiguous, Heads, attention};
use kvlab_cpu::kv_cache::{ContiguousKvCache, KvCache};
use kvlab_cpu::paged::attention::{PagedLayer, SeqSpan, paged_attention};
use kvlab_cpu::paged::pool::KvPool;
use kvlab_model::{Config, KvDtype, ops};

const HEAD_DIM: usize = 64;
const CTXS: [usize; 6] = [128, 256, 512, 1024, 2048, 4096];
const BLOCK: usize = 16;

/// Reference: s_j = q·k_j·scale for j ≤ p, a = softmax(s), o = Σ_j a_j v_j.
fn scalar(out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], scale: f32) {
    let mut s: Vec<f32> = k
        .chunks_exact(HEAD_DIM)
        .map(|kj| ops::dot(q, kj) * scale)
        .collect();
    ops::softmax(&mut s);
    out.fill(0.0);
    for (w, vj) in s.iter().zip(v.chunks_exact(HEAD_DIM)) {
        ops::axpy(out, *w, vj);
    }
}

fn bench(c: &mut Criterion) {
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    for ctx in CTXS {
        // The new token is position ctx − 1; positions 0..ctx−1 are cached.
        let past = ctx - 1;
        let q = data(HEAD_DIM, 1); // (head_dim,)
        let k = data(ctx * HEAD_DIM, 2); // (ctx, head_dim): cache rows then the new row
        let v = data(ctx * HEAD_DIM, 3); // (ctx, head_dim)
        // The contiguous cache: rows 0..ctx of (ctx, head_dim), the new row written last.
        let contiguous = Contiguous {
            k: &k,
            v: &v,
            kv_dim: HEAD_DIM,
        };
        let heads = Heads {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: HEAD_DIM,
            scale,
            window: usize::MAX,
        };
        let (_, k_new) = k.split_at(past * HEAD_DIM);
        let (_, v_new) = v.split_at(past * HEAD_DIM);
        // The paged pool: twice the blocks needed, the sequence's blocks at scattered ids
        // (block b → physical (b · 7 + 3) mod num_blocks, a permutation as 7 is odd).
        let nb = past.div_ceil(BLOCK).max(1);
        let num_blocks = 2 * nb;
        let table: Vec<i32> = (0..nb).map(|b| ((b * 7 + 3) % num_blocks) as i32).collect(); // (nb,)
        // (num_blocks·block, head_dim) each
        let mut pool = KvPool::new(1, num_blocks, BLOCK, (1, HEAD_DIM), KvDtype::F32);
        for j in 0..past {
            let slot = table[j / BLOCK] as usize * BLOCK + j % BLOCK;
            pool.write(
                0,
                slot,
                &k[j * HEAD_DIM..][..HEAD_DIM],
                &v[j * HEAD_DIM..][..HEAD_DIM],
            );
        }
        let (pool_k, pool_v) = pool.layer(0);
        let seqs = [SeqSpan {
            row0: 0,
            n: 1,
            pos0: past,
            block_table: &table,
        }];
        let paged = PagedLayer {
            pool_k,
            pool_v,
            block_size: BLOCK,
            k_new,
            v_new,
            kv_dim: HEAD_DIM,
        };
        let run_contiguous =
            |out: &mut [f32]| attention(out, &q, &heads, |_| past, |_| 0, |_| contiguous);
        let run_paged = |out: &mut [f32]| paged_attention(out, &q, &heads, paged, &seqs, &[0]);

        // Validate both fast kernels against the reference before timing them.
        let mut want = vec![0.0; HEAD_DIM];
        scalar(&mut want, &q, &k, &v, scale);
        let mut got = vec![0.0; HEAD_DIM];
        run_contiguous(&mut got);
        assert_close("cpu/attention_decode", &got, &want, 1e-4);
        run_paged(&mut got);
        assert_close("cpu-paged/attention_decode", &got, &want, 1e-4);

        let bytes = (2 * ctx * HEAD_DIM * 4) as u64;
        let mut out = vec![0.0; HEAD_DIM];
        let id = BenchmarkId::new("ctx", ctx);
        let mut g = c.benchmark_group("scalar/attention_decode");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(id.clone(), |b| {
            b.iter(|| scalar(&mut out, &q, &k, &v, scale))
        });
        g.finish();
        let mut g = c.benchmark_group("cpu/attention_decode");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(id.clone(), |b| b.iter(|| run_contiguous(&mut out)));
        g.finish();
        let mut g = c.benchmark_group("cpu-paged/attention_decode/bs16");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(id, |b| b.iter(|| run_paged(&mut out)));
        g.finish();
    }
}

fn bench_small_heads(c: &mut Criterion) {
    let heads = Heads {
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        scale: 1.0 / 8f32.sqrt(),
        window: usize::MAX,
    };
    let (hd, kv_dim) = (heads.head_dim, heads.n_kv_heads * heads.head_dim);
    let mut g = c.benchmark_group("cpu/attention_decode/stories260K");
    for ctx in [64, 256, 512] {
        let q = data(heads.n_heads * hd, 4); // (n_heads, head_dim)
        let k = data(ctx * kv_dim, 5); // (ctx, kv_dim)
        let v = data(ctx * kv_dim, 6); // (ctx, kv_dim)
        let rows = Contiguous {
            k: &k,
            v: &v,
            kv_dim,
        };
        let mut out = vec![0.0; heads.n_heads * hd];
        // Validate against the reference, head by head, before timing.
        for h in 0..heads.n_heads {
            let g = h / heads.kv_mul();
            let kh: Vec<f32> = k
                .chunks_exact(kv_dim)
                .flat_map(|r| r[g * hd..][..hd].to_vec())
                .collect();
            let vh: Vec<f32> = v
                .chunks_exact(kv_dim)
                .flat_map(|r| r[g * hd..][..hd].to_vec())
                .collect();
            let mut want = vec![0.0; hd];
            scalar_hd(&mut want, &q[h * hd..][..hd], &kh, &vh, heads.scale);
            attention(&mut out, &q, &heads, |_| ctx - 1, |_| 0, |_| rows);
            assert_close(
                "cpu/attention_decode/stories260K",
                &out[h * hd..][..hd],
                &want,
                1e-4,
            );
        }
        g.throughput(Throughput::Elements(ctx as u64));
        g.bench_function(BenchmarkId::new("ctx", ctx), |b| {
            b.iter(|| attention(&mut out, &q, &heads, |_| ctx - 1, |_| 0, |_| rows))
        });
    }
    g.finish();
}

fn bench_layers(c: &mut Criterion) {
    const LAYERS: usize = 6;
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 6,
        head_dim: 48,
        scale: 1.0 / 48f32.sqrt(),
        window: usize::MAX,
    };
    let (hd, kv_dim) = (heads.head_dim, heads.n_kv_heads * heads.head_dim);
    let mut g = c.benchmark_group("cpu/attention_decode/stories15M_6_layers");
    for ctx in [256, 1024] {
        let q = data(heads.n_heads * hd, 7); // (n_heads, head_dim)
        // (n_layers, ctx, kv_dim) each
        let k: Vec<Vec<f32>> = (0..LAYERS)
            .map(|l| data(ctx * kv_dim, 8 + l as u64))
            .collect();
        let v: Vec<Vec<f32>> = (0..LAYERS)
            .map(|l| data(ctx * kv_dim, 20 + l as u64))
            .collect();
        let mut out = vec![0.0; heads.n_heads * hd];
        // Validate one head of one layer against the reference before timing.
        let rows = Contiguous {
            k: &k[0],
            v: &v[0],
            kv_dim,
        };
        attention(&mut out, &q, &heads, |_| ctx - 1, |_| 0, |_| rows);
        let kh: Vec<f32> = k[0]
            .chunks_exact(kv_dim)
            .flat_map(|r| r[..hd].to_vec())
            .collect();
        let vh: Vec<f32> = v[0]
            .chunks_exact(kv_dim)
            .flat_map(|r| r[..hd].to_vec())
            .collect();
        let mut want = vec![0.0; hd];
        scalar_hd(&mut want, &q[..hd], &kh, &vh, heads.scale);
        assert_close(
            "cpu/attention_decode/stories15M_6_layers",
            &out[..hd],
            &want,
            1e-4,
        );
        g.throughput(Throughput::Bytes((LAYERS * 2 * ctx * kv_dim * 4) as u64));
        g.bench_function(BenchmarkId::new("ctx", ctx), |b| {
            b.iter(|| {
                for l in 0..LAYERS {
                    let rows = Contiguous {
                        k: &k[l],
                        v: &v[l],
                        kv_dim,
                    };
                    attention(&mut out, &q, &heads, |_| ctx - 1, |_| 0, |_| rows);
                }
            })
        });
    }
    g.finish();
}

/// The stories15M shape's 6 layers at 1,024 positions in a contiguous cache of each dtype
/// (its correctness against round-tripped rows is kvlab-cpu's `tests/kv_dtype.rs`).
/// Throughput: the bytes the dtype stores for those keys and values.
fn bench_kv_dtypes(c: &mut Criterion) {
    const CTX: usize = 1024;
    let config = Config::llama(288, 768, 6, 6, 6, 32000, CTX, true);
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 6,
        head_dim: 48,
        scale: 1.0 / 48f32.sqrt(),
        window: usize::MAX,
    };
    let kv_dim = config.kv_dim();
    let (k, v) = (data(CTX * kv_dim, 31), data(CTX * kv_dim, 32));
    let q = data(heads.n_heads * heads.head_dim, 33);
    let mut out = vec![0.0; q.len()];
    let mut g = c.benchmark_group("cpu/attention_decode/kv_dtype");
    for dtype in KvDtype::ALL {
        let mut cache = ContiguousKvCache::new(&config, CTX, dtype);
        for l in 0..config.n_layers {
            cache.append(l, &k, &v);
        }
        cache.len = CTX - 1; // the query is the last position, already appended
        g.throughput(Throughput::Bytes(
            (dtype.bytes_per_token(&config) * CTX) as u64,
        ));
        g.bench_function(BenchmarkId::new(dtype.name(), CTX), |b| {
            b.iter(|| {
                for l in 0..config.n_layers {
                    cache.attend(l, &q, &heads, &mut out);
                }
            })
        });
    }
    g.finish();
}

/// One decode row of Gemma 3 270M's global layers (4 query heads on 1 KV head, head_dim 256)
/// over 32,768 cached positions, f32 and f16: the step that dominates decode at long contexts
/// (`kvlab depth`). Throughput: the cache bytes read.
fn bench_long_decode(c: &mut Criterion) {
    const CTX: usize = 32768;
    let config = Config::llama(1024, 2048, 1, 4, 1, 256, CTX, true);
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        scale: 1.0 / 16.0,
        window: usize::MAX,
    };
    let kv_dim = config.kv_dim();
    let (k, v) = (data(CTX * kv_dim, 41), data(CTX * kv_dim, 42));
    let q = data(heads.n_heads * heads.head_dim, 43);
    let mut out = vec![0.0; q.len()];
    let mut g = c.benchmark_group("cpu/attention_decode/gemma-3-270m-global");
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let mut cache = ContiguousKvCache::new(&config, CTX, dtype);
        cache.append(0, &k, &v);
        cache.len = CTX - 1;
        g.throughput(Throughput::Bytes(
            (dtype.bytes_per_token(&config) * CTX) as u64,
        ));
        g.bench_function(BenchmarkId::new(dtype.name(), CTX), |b| {
            b.iter(|| cache.attend(0, &q, &heads, &mut out))
        });
    }
    g.finish();
}

/// [`scalar`] for any head_dim.
fn scalar_hd(out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], scale: f32) {
    let hd = q.len();
    let mut s: Vec<f32> = k
        .chunks_exact(hd)
        .map(|kj| ops::dot(q, kj) * scale)
        .collect();
    ops::softmax(&mut s);
    out.fill(0.0);
    for (w, vj) in s.iter().zip(v.chunks_exact(hd)) {
        ops::axpy(out, *w, vj);
    }
}

fn bench_prefill(c: &mut Criterion) {
    let heads = Heads {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        scale: 1.0 / 256f32.sqrt(),
        window: usize::MAX,
    };
    let (row_len, kv_dim) = (
        heads.n_heads * heads.head_dim,
        heads.n_kv_heads * heads.head_dim,
    );
    let mut g = c.benchmark_group("cpu/attention_prefill/gemma-3-270m");
    for n in [100, 500] {
        let q = data(n * row_len, 7); // (n, n_heads·head_dim): the prompt's queries
        let k = data(n * kv_dim, 8); // (n, kv_dim): its keys, position j at row j
        let v = data(n * kv_dim, 9);
        let rows = Contiguous {
            k: &k,
            v: &v,
            kv_dim,
        };
        let step = |out: &mut [f32]| attention(out, &q, &heads, |r| r, |_| 0, |_| rows);
        let one_by_one = |out: &mut [f32]| {
            for (r, o) in out.chunks_exact_mut(row_len).enumerate() {
                attention(
                    o,
                    &q[r * row_len..][..row_len],
                    &heads,
                    |_| r,
                    |_| 0,
                    |_| rows,
                );
            }
        };
        let (mut a, mut b) = (vec![0.0; n * row_len], vec![0.0; n * row_len]);
        step(&mut a);
        one_by_one(&mut b);
        assert_close("cpu/attention_prefill", &a, &b, 1e-4);
        g.throughput(Throughput::Elements((n * (n + 1) / 2) as u64));
        g.bench_function(BenchmarkId::new("step", n), |bch| bch.iter(|| step(&mut a)));
        g.bench_function(BenchmarkId::new("row_by_row", n), |bch| {
            bch.iter(|| one_by_one(&mut b))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench, bench_small_heads, bench_layers, bench_kv_dtypes, bench_prefill, bench_long_decode
}
criterion_main!(benches);
