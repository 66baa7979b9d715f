// Writing the paged KV cache.
//
// The pool of one layer is, for K and for V,
//   cache (num_blocks, block_size, n_kv_heads, head_dim) = (num_slots, kv_dim) row-major,
// and for the scaled formats (fp8-e4m3, int8; see KvCodec in common.cuh) also
//   scale (num_blocks, block_size, n_kv_heads) = (num_slots, n_kv_heads) f32,
// so storing token t is one row of codes (and one scale per KV head) at row slot_mapping[t]
// (vLLM's reshape_and_cache). A slot of -1 (kvlab_paged::PAD_SLOT) means "do not store": a
// sliding-window key that no later query reads; attention takes it from the step's own k/v rows
// instead. The unscaled formats ignore the scale pointers.
//
// reshape_and_cache_v1: one thread block per token; threads stride over kv_dim (coalesced).
//   Scaled formats: warp w quantizes KV heads w, w + warps, ...: the lanes reduce the head's
//   amax (warp_max), lane 0 stores s = amax / max_code, and every lane stores its elements'
//   codes of x · (1/s) — the order of operations of kvlab-cpu's KvStore::write, so the same f32
//   row gives the same bits on both.
// copy_blocks_v1: copy-on-write. One thread block per (src, dst) pair copies a whole block
//   (block_elems elements) of K and of V; launched once per layer of the group, before
//   any reshape_and_cache of the step (a src may be written later in the same step). The scales
//   of a scaled format are copied by the f32 instantiation with block_elems = block_size ·
//   n_kv_heads.
#include "common.cuh"

// One KV head (head_dim,) of activations → codes, and its scale (scaled formats only). Called
// by a whole warp.
template <typename A, typename C>
__device__ __forceinline__ void quantize_head(const A* __restrict__ x, C* __restrict__ codes,
                                              float* __restrict__ scale, int head_dim) {
    using Codec = KvCodec<C>;
    const int lane = threadIdx.x % KVLAB_WARP;
    float amax = 0.0f;
    bool nan = false;
    for (int d = lane; d < head_dim; d += KVLAB_WARP) {
        const float v = to_float(x[d]);
        nan |= isnan(v);
        amax = fmaxf(amax, fabsf(v));
    }
    amax = warp_max(amax);
    nan = __any_sync(0xffffffffu, nan);
    const float s = nan ? __int_as_float(0x7fc00000) : (amax == 0.0f ? 1.0f : amax / Codec::max_code);
    if (lane == 0) *scale = s;
    const float inv = 1.0f / s;
    for (int d = lane; d < head_dim; d += KVLAB_WARP) codes[d] = Codec::encode(to_float(x[d]) * inv);
}

// key, value (n_tokens, kv_dim) act type → key_cache, value_cache (num_slots, kv_dim) cache
// type; k_scale, v_scale (num_slots, n_kv_heads) for the scaled formats.
template <typename A, typename C>
__device__ void reshape_and_cache_v1(const A* __restrict__ key, const A* __restrict__ value,
                                     C* __restrict__ key_cache, C* __restrict__ value_cache,
                                     float* __restrict__ k_scale, float* __restrict__ v_scale,
                                     const int* __restrict__ slot_mapping, int kv_dim,
                                     int n_kv_heads) {
    const long long t = blockIdx.x;
    const long long slot = slot_mapping[t];
    if (slot < 0) return;  // the whole block leaves together
    if constexpr (KvCodec<C>::scaled) {
        const int head_dim = kv_dim / n_kv_heads;
        const int warp = threadIdx.x / KVLAB_WARP;
        const int n_warps = blockDim.x / KVLAB_WARP;
        for (int h = warp; h < n_kv_heads; h += n_warps) {
            const long long src = t * kv_dim + (long long)h * head_dim;
            const long long dst = slot * kv_dim + (long long)h * head_dim;
            const long long s = slot * n_kv_heads + h;
            quantize_head<A, C>(key + src, key_cache + dst, k_scale + s, head_dim);
            quantize_head<A, C>(value + src, value_cache + dst, v_scale + s, head_dim);
        }
    } else {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            key_cache[slot * kv_dim + i] = KvCodec<C>::encode(to_float(key[t * kv_dim + i]));
            value_cache[slot * kv_dim + i] = KvCodec<C>::encode(to_float(value[t * kv_dim + i]));
        }
    }
}

#define KVLAB_RESHAPE_AND_CACHE(A, C, SUFFIX)                                                    \
    extern "C" __global__ void reshape_and_cache_v1_##SUFFIX(                                    \
        const A* key, const A* value, C* key_cache, C* value_cache, float* k_scale,              \
        float* v_scale, const int* slot_mapping, int kv_dim, int n_kv_heads) {                   \
        reshape_and_cache_v1<A, C>(key, value, key_cache, value_cache, k_scale, v_scale,         \
                                   slot_mapping, kv_dim, n_kv_heads);                            \
    }
KVLAB_RESHAPE_AND_CACHE(float, float, f32_f32)
KVLAB_RESHAPE_AND_CACHE(float, __half, f32_f16)
KVLAB_RESHAPE_AND_CACHE(float, __nv_bfloat16, f32_bf16)
KVLAB_RESHAPE_AND_CACHE(float, __nv_fp8_e4m3, f32_fp8)
KVLAB_RESHAPE_AND_CACHE(float, signed char, f32_i8)
KVLAB_RESHAPE_AND_CACHE(__half, float, f16_f32)
KVLAB_RESHAPE_AND_CACHE(__half, __half, f16_f16)
KVLAB_RESHAPE_AND_CACHE(__half, __nv_bfloat16, f16_bf16)
KVLAB_RESHAPE_AND_CACHE(__half, __nv_fp8_e4m3, f16_fp8)
KVLAB_RESHAPE_AND_CACHE(__half, signed char, f16_i8)

// pairs (n_pairs, 2) i32: (src block, dst block). block_elems: elements of one block.
template <typename C>
__device__ void copy_blocks_v1(C* key_cache, C* value_cache, const int* __restrict__ pairs,
                               long long block_elems) {
    const long long src = (long long)pairs[2 * blockIdx.x] * block_elems;
    const long long dst = (long long)pairs[2 * blockIdx.x + 1] * block_elems;
    for (long long i = threadIdx.x; i < block_elems; i += blockDim.x) {
        key_cache[dst + i] = key_cache[src + i];
        value_cache[dst + i] = value_cache[src + i];
    }
}

#define KVLAB_COPY_BLOCKS(C, SUFFIX)                                                             \
    extern "C" __global__ void copy_blocks_v1_##SUFFIX(C* key_cache, C* value_cache,             \
                                                       const int* pairs, long long block_elems) { \
        copy_blocks_v1<C>(key_cache, value_cache, pairs, block_elems);                           \
    }
KVLAB_COPY_BLOCKS(float, f32)
KVLAB_COPY_BLOCKS(__half, f16)
KVLAB_COPY_BLOCKS(__nv_bfloat16, bf16)
KVLAB_COPY_BLOCKS(__nv_fp8_e4m3, fp8)
KVLAB_COPY_BLOCKS(signed char, i8)
