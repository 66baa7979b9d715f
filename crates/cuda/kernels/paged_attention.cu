// Paged attention for decode: one query per sequence (its newest token), attending to every key
// of its context through its block table (vLLM's paged_attention_v1/v2).
//
// Shapes (A = activation type, C = cache type):
//   out, q            (n_tokens, n_heads, head_dim) A; sequence s's query is row query_start_loc[s+1]−1
//   k_new, v_new      (n_tokens, n_kv_heads, head_dim) A, this step's keys/values (after RoPE)
//   k_cache, v_cache  (num_blocks, block_size, n_kv_heads, head_dim) C, the layer's pool
//   k_scale, v_scale  (num_blocks, block_size, n_kv_heads) f32, for the scaled C (common.cuh);
//                     int4's (s, min) pairs otherwise (cache.cu)
//   k_residual, read_map  int4 only: keys of blocks still filling, and which residual (cache.cu)
//   block_tables      (n_seqs, max_blocks) i32, -1 padded
//   query_start_loc   (n_seqs + 1,) i32;  context_lens (n_seqs,) i32 (keys after this step)
//   window            0 for global layers, else the sliding window (keys p+1−window ..= p)
// The decode kernels take the leading n_decode sequences of the batch (the scheduler puts
// decodes first; launch.rs counts them), gridDim.x = n_decode.
//
// v1: one thread block per (sequence, query head), 4 warps; warp w takes keys lo+w, lo+w+4, ...
//     with its own online-softmax state; the 4 states merge in shared memory. f32 accumulation.
//     Parallelism is n_seqs · n_heads blocks: plenty at batch 64, far too little at batch 1 with
//     a 32k context (32 blocks on 132 SMs, each walking 32k keys).
// v2: splits each context into partitions of partition_size keys, gridDim.z = max partitions;
//     each block writes its partition's (max, sum, unnormalised acc) to a workspace and
//     paged_attention_v2_reduce merges the partitions (flash-decoding / vLLM v2). A batch-1
//     32k-context step now runs n_heads · 64 blocks. Costs one more launch and
//     n_seqs · n_heads · partitions · (head_dim + 2) floats of workspace; launch.rs picks v2 only
//     when v1 would leave the GPU underfilled.
// Not done yet (a v3): sharing one K/V load among the query heads of a GQA group, and 16-byte
// vector loads per lane.
#include "attention.cuh"

template <typename A, typename C>
__device__ void paged_attention_v1(A* __restrict__ out, const A* __restrict__ q,
                                   const A* __restrict__ k_new, const A* __restrict__ v_new,
                                   const C* __restrict__ k_cache, const C* __restrict__ v_cache,
                                   const float* __restrict__ k_scale,
                                   const float* __restrict__ v_scale,
                                   const float* __restrict__ k_residual,
                                   const int* __restrict__ read_map,
                                   const int* __restrict__ block_tables,
                                   const int* __restrict__ query_start_loc,
                                   const int* __restrict__ context_lens, int max_blocks,
                                   int n_heads, int n_kv_heads, int head_dim, int block_size,
                                   int window, float scale) {
    __shared__ MergeScratch sh;
    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const long long row = query_start_loc[s + 1] - 1;
    const int p = context_lens[s] - 1;
    const KvView<A, C> kv = kv_view(k_new, v_new, k_cache, v_cache, k_scale, v_scale,
                                    k_residual, read_map, block_tables, query_start_loc,
                                    context_lens, s, h, max_blocks,
                                    n_heads, n_kv_heads, head_dim, block_size);
    const int lo = first_key(p, window);
    float M, L;
    block_attend(sh, q + (row * n_heads + h) * head_dim, kv, lo, p + 1, scale, M, L);
    A* o = out + (row * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        o[d] = from_float<A>(merged_acc(sh, d, M) / L);
    }
}

// Partition `blockIdx.z` of the keys lo..=p; writes (n_seqs, n_heads, max_partitions) maxima and
// sums to tmp_max / tmp_sum and (n_seqs, n_heads, max_partitions, head_dim) accumulators to
// tmp_acc (f32). Partitions past the sequence's last key write nothing; the reduce skips them.
template <typename A, typename C>
__device__ void paged_attention_v2(float* __restrict__ tmp_max, float* __restrict__ tmp_sum,
                                   float* __restrict__ tmp_acc, const A* __restrict__ q,
                                   const A* __restrict__ k_new, const A* __restrict__ v_new,
                                   const C* __restrict__ k_cache, const C* __restrict__ v_cache,
                                   const float* __restrict__ k_scale,
                                   const float* __restrict__ v_scale,
                                   const float* __restrict__ k_residual,
                                   const int* __restrict__ read_map,
                                   const int* __restrict__ block_tables,
                                   const int* __restrict__ query_start_loc,
                                   const int* __restrict__ context_lens, int max_blocks,
                                   int n_heads, int n_kv_heads, int head_dim, int block_size,
                                   int window, float scale, int partition_size,
                                   int max_partitions) {
    __shared__ MergeScratch sh;
    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const int part = blockIdx.z;
    const long long row = query_start_loc[s + 1] - 1;
    const int p = context_lens[s] - 1;
    const int lo = first_key(p, window);
    const int begin = lo + part * partition_size;
    if (begin > p) return;  // the whole block leaves together: no __syncthreads is skipped
    const int end = min(begin + partition_size, p + 1);
    const KvView<A, C> kv = kv_view(k_new, v_new, k_cache, v_cache, k_scale, v_scale,
                                    k_residual, read_map, block_tables, query_start_loc,
                                    context_lens, s, h, max_blocks,
                                    n_heads, n_kv_heads, head_dim, block_size);
    float M, L;
    block_attend(sh, q + (row * n_heads + h) * head_dim, kv, begin, end, scale, M, L);
    const long long cell = ((long long)s * n_heads + h) * max_partitions + part;
    if (threadIdx.x == 0) {
        tmp_max[cell] = M;
        tmp_sum[cell] = L;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        tmp_acc[cell * head_dim + d] = merged_acc(sh, d, M);
    }
}

// Merges the partitions of (sequence blockIdx.x, head blockIdx.y):
//   M = max_p m_p,  L = Σ_p l_p·e^(m_p − M),  out[d] = Σ_p acc_p[d]·e^(m_p − M) / L.
template <typename A>
__device__ void paged_attention_v2_reduce(A* __restrict__ out, const float* __restrict__ tmp_max,
                                          const float* __restrict__ tmp_sum,
                                          const float* __restrict__ tmp_acc,
                                          const int* __restrict__ query_start_loc,
                                          const int* __restrict__ context_lens, int n_heads,
                                          int head_dim, int window, int partition_size,
                                          int max_partitions) {
    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const long long row = query_start_loc[s + 1] - 1;
    const int p = context_lens[s] - 1;
    const int n_keys = p + 1 - first_key(p, window);
    const int n_parts = (n_keys + partition_size - 1) / partition_size;
    const long long cell0 = ((long long)s * n_heads + h) * max_partitions;
    float M = KVLAB_NEG_INF;
    for (int i = 0; i < n_parts; ++i) M = fmaxf(M, tmp_max[cell0 + i]);
    float L = 0.0f;
    for (int i = 0; i < n_parts; ++i) L += tmp_sum[cell0 + i] * expf(tmp_max[cell0 + i] - M);
    A* o = out + (row * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < n_parts; ++i) {
            a += tmp_acc[(cell0 + i) * head_dim + d] * expf(tmp_max[cell0 + i] - M);
        }
        o[d] = from_float<A>(a / L);
    }
}

#define KVLAB_PAGED_ATTENTION(A, C, SUFFIX)                                                      \
    extern "C" __global__ void paged_attention_v1_##SUFFIX(                                      \
        A* out, const A* q, const A* k_new, const A* v_new, const C* k_cache,                    \
        const C* v_cache, const float* k_scale, const float* v_scale, const float* k_residual,   \
        const int* read_map, const int* block_tables, const int* query_start_loc,                \
        const int* context_lens, int max_blocks, int n_heads, int n_kv_heads, int head_dim,      \
        int block_size, int window, float scale) {                                               \
        paged_attention_v1<A, C>(out, q, k_new, v_new, k_cache, v_cache, k_scale, v_scale,       \
                                 k_residual, read_map, block_tables, query_start_loc,            \
                                 context_lens, max_blocks, n_heads, n_kv_heads, head_dim,        \
                                 block_size, window, scale);                                     \
    }                                                                                            \
    extern "C" __global__ void paged_attention_v2_##SUFFIX(                                      \
        float* tmp_max, float* tmp_sum, float* tmp_acc, const A* q, const A* k_new,              \
        const A* v_new, const C* k_cache, const C* v_cache, const float* k_scale,                \
        const float* v_scale, const float* k_residual, const int* read_map,                      \
        const int* block_tables, const int* query_start_loc, const int* context_lens,            \
        int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size, int window,   \
        float scale, int partition_size, int max_partitions) {                                   \
        paged_attention_v2<A, C>(tmp_max, tmp_sum, tmp_acc, q, k_new, v_new, k_cache, v_cache,  \
                                 k_scale, v_scale, k_residual, read_map, block_tables,           \
                                 query_start_loc, context_lens, max_blocks, n_heads, n_kv_heads, \
                                 head_dim, block_size, window, scale, partition_size,            \
                                 max_partitions);                                                \
    }
KVLAB_PAGED_ATTENTION(float, float, f32_f32)
KVLAB_PAGED_ATTENTION(float, __half, f32_f16)
KVLAB_PAGED_ATTENTION(float, __nv_bfloat16, f32_bf16)
KVLAB_PAGED_ATTENTION(float, __nv_fp8_e4m3, f32_fp8)
KVLAB_PAGED_ATTENTION(float, signed char, f32_i8)
KVLAB_PAGED_ATTENTION(__half, float, f16_f32)
KVLAB_PAGED_ATTENTION(__half, __half, f16_f16)
KVLAB_PAGED_ATTENTION(__half, __nv_bfloat16, f16_bf16)
KVLAB_PAGED_ATTENTION(__half, __nv_fp8_e4m3, f16_fp8)
KVLAB_PAGED_ATTENTION(__half, signed char, f16_i8)
KVLAB_PAGED_ATTENTION(float, kvlab_int4x2, f32_i4)
KVLAB_PAGED_ATTENTION(__half, kvlab_int4x2, f16_i4)

#define KVLAB_PAGED_ATTENTION_REDUCE(A, SUFFIX)                                                  \
    extern "C" __global__ void paged_attention_v2_reduce_##SUFFIX(                               \
        A* out, const float* tmp_max, const float* tmp_sum, const float* tmp_acc,                \
        const int* query_start_loc, const int* context_lens, int n_heads, int head_dim,          \
        int window, int partition_size, int max_partitions) {                                    \
        paged_attention_v2_reduce<A>(out, tmp_max, tmp_sum, tmp_acc, query_start_loc,            \
                                     context_lens, n_heads, head_dim, window, partition_size,    \
                                     max_partitions);                                            \
    }
KVLAB_PAGED_ATTENTION_REDUCE(float, f32)
KVLAB_PAGED_ATTENTION_REDUCE(__half, f16)
