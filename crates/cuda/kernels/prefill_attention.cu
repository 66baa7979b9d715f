// Attention for prefill: every new token of a sequence is a query; the query at position p
// attends causally to keys lo..=p (lo = p + 1 − window for sliding-window layers, else 0). Keys
// of the step's own tokens come from this step's k/v rows, keys before them (a prefix-cache hit,
// or the earlier part of a recomputed sequence) from the paged pool through the block table —
// see attention.cuh.
//
//   out, q        (n_tokens, n_heads, head_dim) A
//   k_new, v_new  (n_tokens, n_kv_heads, head_dim) A
//   k_cache, v_cache, k_scale, v_scale, ...  as paged_attention.cu
//   token_seq     (n_tokens,) i32: the batch index of each token's sequence
// gridDim.x = number of query tokens handled, starting at token row first_row (the tokens of the
// prefills, which follow the decodes in the batch); gridDim.y = n_heads.
//
// v1: one thread block per (query token, head), the decode kernel's loop over its keys. Every
//     query re-reads its keys, so a prompt of n tokens reads O(n²) key rows; fine for the prompts
//     kvlab runs. A v2 would tile queries (FlashAttention): load a tile of K/V once into shared
//     memory for a tile of queries.
#include "attention.cuh"

template <typename A, typename C>
__device__ void prefill_attention_v1(A* __restrict__ out, const A* __restrict__ q,
                                     const A* __restrict__ k_new, const A* __restrict__ v_new,
                                     const C* __restrict__ k_cache, const C* __restrict__ v_cache,
                                     const float* __restrict__ k_scale,
                                     const float* __restrict__ v_scale,
                                     const float* __restrict__ k_residual,
                                     const int* __restrict__ read_map,
                                     const int* __restrict__ block_tables,
                                     const int* __restrict__ query_start_loc,
                                     const int* __restrict__ context_lens,
                                     const int* __restrict__ token_seq, int first_row,
                                     int max_blocks, int n_heads, int n_kv_heads, int head_dim,
                                     int block_size, int window, float scale) {
    __shared__ MergeScratch sh;
    const long long r = (long long)first_row + blockIdx.x;
    const int h = blockIdx.y;
    const int s = token_seq[r];
    const KvView<A, C> kv = kv_view(k_new, v_new, k_cache, v_cache, k_scale, v_scale,
                                    k_residual, read_map, block_tables, query_start_loc,
                                    context_lens, s, h, max_blocks,
                                    n_heads, n_kv_heads, head_dim, block_size);
    const int p = kv.pos0 + (int)(r - kv.new_row0);
    const int lo = first_key(p, window);
    float M, L;
    block_attend(sh, q + (r * n_heads + h) * head_dim, kv, lo, p + 1, scale, M, L);
    A* o = out + (r * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        o[d] = from_float<A>(merged_acc(sh, d, M) / L);
    }
}

#define KVLAB_PREFILL_ATTENTION(A, C, SUFFIX)                                                    \
    extern "C" __global__ void prefill_attention_v1_##SUFFIX(                                    \
        A* out, const A* q, const A* k_new, const A* v_new, const C* k_cache,                    \
        const C* v_cache, const float* k_scale, const float* v_scale, const float* k_residual,   \
        const int* read_map, const int* block_tables, const int* query_start_loc,                \
        const int* context_lens, const int* token_seq, int first_row, int max_blocks,            \
        int n_heads, int n_kv_heads, int head_dim, int block_size, int window, float scale) {    \
        prefill_attention_v1<A, C>(out, q, k_new, v_new, k_cache, v_cache, k_scale, v_scale,     \
                                   k_residual, read_map, block_tables, query_start_loc,          \
                                   context_lens, token_seq, first_row, max_blocks, n_heads,      \
                                   n_kv_heads, head_dim, block_size, window, scale);             \
    }
KVLAB_PREFILL_ATTENTION(float, float, f32_f32)
KVLAB_PREFILL_ATTENTION(float, __half, f32_f16)
KVLAB_PREFILL_ATTENTION(float, __nv_bfloat16, f32_bf16)
KVLAB_PREFILL_ATTENTION(float, __nv_fp8_e4m3, f32_fp8)
KVLAB_PREFILL_ATTENTION(float, signed char, f32_i8)
KVLAB_PREFILL_ATTENTION(__half, float, f16_f32)
KVLAB_PREFILL_ATTENTION(__half, __half, f16_f16)
KVLAB_PREFILL_ATTENTION(__half, __nv_bfloat16, f16_bf16)
KVLAB_PREFILL_ATTENTION(__half, __nv_fp8_e4m3, f16_fp8)
KVLAB_PREFILL_ATTENTION(__half, signed char, f16_i8)
KVLAB_PREFILL_ATTENTION(float, kvlab_int4x2, f32_i4)
KVLAB_PREFILL_ATTENTION(__half, kvlab_int4x2, f16_i4)
