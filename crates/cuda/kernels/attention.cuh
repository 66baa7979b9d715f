// attention.cuh: the inner loop shared by the decode (paged_attention.cu) and prefill
// (prefill_attention.cu) kernels: one query and one head against a range of key positions, with
// online softmax in f32.
//
// Keys and values of a sequence live in two places:
//   * positions j < pos0 (computed in earlier steps, or served by the prefix cache) are in the
//     paged pool: slot = block_table[j / block_size] · block_size + j % block_size, and the pool
//     is (num_slots, n_kv_heads, head_dim);
//   * positions j >= pos0 (this step's tokens) are read from the step's own k/v rows,
//     (n_tokens, n_kv_heads, head_dim), row new_row0 + (j − pos0) — as the CPU engine does, so a
//     sliding-window key whose slot is -1 (never stored) is still seen by the queries that need it.
//     With a quantized pool the engine first replaces those rows by what the pool gives back
//     for them (kv_read_back_v1 in cache.cu), so they read as a later step will read them.
// GQA/MQA: query head h reads KV head h / (n_heads / n_kv_heads).
// Dequantization is fused into the loop, in registers: a pool key is KvCodec<C>::decode(code)
// (common.cuh), and for the scaled formats (fp8-e4m3, int8) its KV head's scale multiplies the
// dot product (q · k = s · Σ q[d] · code[d]) and a value's scale its softmax weight, so no
// full-precision copy of a key or value is ever made. int4 (cache.cu's layout): a key of a
// block still filling is read from its f32 residual (read_map says which), any other as
// q · s + min of its channel; a value as q · s + min of its group of 32 channels.
//
// Online softmax (Milakov & Gimelshein 2018): for scores s_j = (q · k_j) · scale keep
//   m = max_j s_j,   l = Σ_j e^(s_j − m),   acc[d] = Σ_j e^(s_j − m) · v_j[d];
// adding key j: m' = max(m, s_j); c = e^(m − m'); l ← l·c + e^(s_j − m'); acc ← acc·c + e^(s_j − m')·v_j.
// The output is acc / l. One pass over the keys, no score buffer, f32 throughout.
#ifndef KVLAB_ATTENTION_CUH
#define KVLAB_ATTENTION_CUH
#include "common.cuh"

// Largest head_dim the kernels take (Gemma 3: 256); launch.rs rejects larger ones.
#define KVLAB_MAX_HEAD_DIM 256
// Each lane owns dims lane, lane + 32, lane + 64, ... of the head.
#define KVLAB_DIMS_PER_LANE (KVLAB_MAX_HEAD_DIM / KVLAB_WARP)
// Warps per thread block of the attention kernels (128 threads).
#define KVLAB_ATTN_WARPS 4

// Where one sequence's keys are, for one (query head → KV head).
template <typename A, typename C>
struct KvView {
    const A* k_new;           // (n_tokens, n_kv_heads, head_dim) this step's keys
    const A* v_new;           // (n_tokens, n_kv_heads, head_dim) this step's values
    const C* k_cache;         // (num_slots, n_kv_heads, head_dim) the layer's pool
    const C* v_cache;         // (num_slots, n_kv_heads, head_dim)
    const float* k_scale;     // (num_slots, n_kv_heads) scaled formats only
    const float* v_scale;     // (num_slots, n_kv_heads)
    const float* k_residual;  // int4: (n_residuals, block_size, kv_dim) keys of open blocks
    const int* read_map;      // int4: (num_blocks,) a block's residual, -1 if quantized
    const int* block_table;   // (max_blocks,) this sequence's row, -1 padded
    long long new_row0;       // row of position pos0 in k_new / v_new
    int pos0;                 // first position computed in this step
    int block_size;
    int n_kv_heads;
    int kv_head;
    int head_dim;
};

// Sequence s's keys for query head h: its step rows start at query_start_loc[s], and the last
// query_start_loc[s + 1] − query_start_loc[s] of its context_lens[s] keys are this step's.
template <typename A, typename C>
__device__ __forceinline__ KvView<A, C> kv_view(const A* k_new, const A* v_new, const C* k_cache,
                                                const C* v_cache, const float* k_scale,
                                                const float* v_scale, const float* k_residual,
                                                const int* read_map,
                                                const int* __restrict__ block_tables,
                                                const int* __restrict__ query_start_loc,
                                                const int* __restrict__ context_lens, int s, int h,
                                                int max_blocks, int n_heads, int n_kv_heads,
                                                int head_dim, int block_size) {
    KvView<A, C> kv;
    kv.k_new = k_new;
    kv.v_new = v_new;
    kv.k_cache = k_cache;
    kv.v_cache = v_cache;
    kv.k_scale = k_scale;
    kv.v_scale = v_scale;
    kv.k_residual = k_residual;
    kv.read_map = read_map;
    kv.block_table = block_tables + (long long)s * max_blocks;
    kv.new_row0 = query_start_loc[s];
    kv.pos0 = context_lens[s] - (query_start_loc[s + 1] - query_start_loc[s]);
    kv.block_size = block_size;
    kv.n_kv_heads = n_kv_heads;
    kv.kv_head = h / (n_heads / n_kv_heads);
    kv.head_dim = head_dim;
    return kv;
}

// Offset (in elements) of position j's key/value vector for this KV head, in the step rows
// (j >= pos0) or the pool (j < pos0).
template <typename A, typename C>
__device__ __forceinline__ long long kv_offset(const KvView<A, C>& kv, int j) {
    if (j >= kv.pos0) {
        return ((kv.new_row0 + (j - kv.pos0)) * kv.n_kv_heads + kv.kv_head) * kv.head_dim;
    }
    const long long slot =
        (long long)kv.block_table[j / kv.block_size] * kv.block_size + j % kv.block_size;
    return (slot * kv.n_kv_heads + kv.kv_head) * kv.head_dim;
}

// This lane's dims of pool position j's int4 key (from its block's residual while the block
// is still filling) and value (common.cuh's int4 helpers, cache.cu's layout).
template <typename A, typename C>
__device__ __forceinline__ void load_int4(float k[KVLAB_DIMS_PER_LANE],
                                          float v[KVLAB_DIMS_PER_LANE], const KvView<A, C>& kv,
                                          int j) {
    const int lane = threadIdx.x % KVLAB_WARP;
    const int block = kv.block_table[j / kv.block_size];
    const long long slot = (long long)block * kv.block_size + j % kv.block_size;
    const int residual = kv.read_map[block];
    const float* k_row = residual >= 0 ? int4_residual_key(kv.k_residual, residual, slot,
                                                           kv.kv_head, kv.block_size,
                                                           kv.n_kv_heads, kv.head_dim)
                                       : nullptr;
#pragma unroll
    for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
        const int d = lane + i * KVLAB_WARP;
        if (d < kv.head_dim) {
            k[i] = k_row != nullptr ? k_row[d]
                                    : int4_pool_key(kv.k_cache, kv.k_scale, slot, kv.kv_head, d,
                                                    kv.block_size, kv.n_kv_heads, kv.head_dim);
            v[i] = int4_pool_value(kv.v_cache, kv.v_scale, slot, kv.kv_head, d, kv.n_kv_heads,
                                   kv.head_dim);
        }
    }
}

// One warp folds keys j = begin, begin + step, ... < end into its online-softmax state.
// q: this lane's dims of the query (dims lane + 32·i, zero past head_dim).
template <typename A, typename C>
__device__ void warp_attend(float& m, float& l, float acc[KVLAB_DIMS_PER_LANE],
                            const float q[KVLAB_DIMS_PER_LANE], const KvView<A, C>& kv,
                            int begin, int end, int step, float scale) {
    const int lane = threadIdx.x % KVLAB_WARP;
    for (int j = begin; j < end; j += step) {
        using Codec = KvCodec<C>;
        const bool fresh = j >= kv.pos0;
        // This lane's dims of key j and value j, and for the scaled formats the KV head's
        // scales of a pool position (the dot product and the softmax weight take them).
        float k[KVLAB_DIMS_PER_LANE], v[KVLAB_DIMS_PER_LANE];
        float ks = 1.0f, vs = 1.0f;
        if (fresh || !Codec::int4) {
            const long long off = kv_offset(kv, j);
            if constexpr (Codec::scaled) {
                if (!fresh) {
                    ks = kv.k_scale[off / kv.head_dim];  // off / head_dim: its (slot, kv_head)
                    vs = kv.v_scale[off / kv.head_dim];
                }
            }
#pragma unroll
            for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
                const int d = lane + i * KVLAB_WARP;
                if (d < kv.head_dim) {
                    if (fresh) {
                        k[i] = to_float(kv.k_new[off + d]);
                        v[i] = to_float(kv.v_new[off + d]);
                    } else if constexpr (!Codec::int4) {
                        k[i] = Codec::decode(kv.k_cache[off + d]);
                        v[i] = Codec::decode(kv.v_cache[off + d]);
                    }
                }
            }
        } else if constexpr (Codec::int4) {
            load_int4(k, v, kv, j);
        }
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
            if (lane + i * KVLAB_WARP < kv.head_dim) dot += q[i] * k[i];
        }
        const float s = warp_sum(dot) * ks * scale;
        const float m_new = fmaxf(m, s);
        const float c = expf(m - m_new);  // 0 for the first key (m = -inf)
        const float p = expf(s - m_new);
        l = l * c + p;
        const float pv = p * vs;
#pragma unroll
        for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
            if (lane + i * KVLAB_WARP < kv.head_dim) acc[i] = acc[i] * c + pv * v[i];
        }
        m = m_new;
    }
}

// Loads this lane's dims of query row `q_row` (head_dim,) into registers, zero past head_dim.
template <typename A>
__device__ __forceinline__ void load_query(float q[KVLAB_DIMS_PER_LANE], const A* q_row,
                                           int head_dim) {
    const int lane = threadIdx.x % KVLAB_WARP;
#pragma unroll
    for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
        const int d = lane + i * KVLAB_WARP;
        q[i] = d < head_dim ? to_float(q_row[d]) : 0.0f;
    }
}

// Shared memory of the cross-warp merge.
struct MergeScratch {
    float m[KVLAB_ATTN_WARPS];
    float l[KVLAB_ATTN_WARPS];
    float acc[KVLAB_ATTN_WARPS][KVLAB_MAX_HEAD_DIM];
};

// Publishes every warp's state, then returns in every thread the block's merged max M and sum
// L = Σ_w l_w · e^(m_w − M). Dim d of the merged accumulator is then
// merged_acc(sh, d, M) = Σ_w acc_w[d] · e^(m_w − M). A warp that saw no key (l = 0; any key adds
// e^(s − m') > 0, and exactly 1 for the key that sets the max) is skipped rather than weighed by
// e^(-inf − M). NaN inputs still reach the output: fmaxf drops NaN from M, but l != 0 holds for a
// NaN l, so its NaN enters L.
__device__ __forceinline__ void block_merge(MergeScratch& sh, float m, float l,
                                            const float acc[KVLAB_DIMS_PER_LANE], int head_dim,
                                            float& M, float& L) {
    const int lane = threadIdx.x % KVLAB_WARP;
    const int warp = threadIdx.x / KVLAB_WARP;
    if (lane == 0) {
        sh.m[warp] = m;
        sh.l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) {
        const int d = lane + i * KVLAB_WARP;
        if (d < head_dim) sh.acc[warp][d] = acc[i];
    }
    __syncthreads();
    M = KVLAB_NEG_INF;
    for (int w = 0; w < KVLAB_ATTN_WARPS; ++w) M = fmaxf(M, sh.m[w]);
    L = 0.0f;
    for (int w = 0; w < KVLAB_ATTN_WARPS; ++w) {
        if (sh.l[w] != 0.0f) L += sh.l[w] * expf(sh.m[w] - M);
    }
}

__device__ __forceinline__ float merged_acc(const MergeScratch& sh, int d, float M) {
    float a = 0.0f;
    for (int w = 0; w < KVLAB_ATTN_WARPS; ++w) {
        if (sh.l[w] != 0.0f) a += sh.acc[w][d] * expf(sh.m[w] - M);
    }
    return a;
}

// The thread block's attention of query row q_row over keys begin..end − 1 (warp w takes keys
// begin + w, begin + w + 4, ...), merged across warps: M and L as block_merge returns them, and
// merged_acc(sh, d, M) for dim d.
template <typename A, typename C>
__device__ __forceinline__ void block_attend(MergeScratch& sh, const A* q_row,
                                             const KvView<A, C>& kv, int begin, int end,
                                             float scale, float& M, float& L) {
    const int warp = threadIdx.x / KVLAB_WARP;
    float qv[KVLAB_DIMS_PER_LANE];
    load_query(qv, q_row, kv.head_dim);
    float m = KVLAB_NEG_INF, l = 0.0f, acc[KVLAB_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < KVLAB_DIMS_PER_LANE; ++i) acc[i] = 0.0f;
    warp_attend(m, l, acc, qv, kv, begin + warp, end, KVLAB_ATTN_WARPS, scale);
    block_merge(sh, m, l, acc, kv.head_dim, M, L);
}

// First key a query at position p sees: 0, or p + 1 − window for a sliding window (window > 0).
__device__ __forceinline__ int first_key(int p, int window) {
    return window > 0 ? max(0, p + 1 - window) : 0;
}

#endif  // KVLAB_ATTENTION_CUH
