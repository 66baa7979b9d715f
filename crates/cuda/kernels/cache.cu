// Writing the paged KV cache.
//
// The pool of one layer is, for K and for V,
//   cache (num_blocks, block_size, n_kv_heads, head_dim) = (num_slots, kv_dim) row-major,
// so storing token t is one row copy to row slot_mapping[t] (vLLM's reshape_and_cache). A slot
// of -1 (kvlab_paged::PAD_SLOT) means "do not store": a sliding-window key that no later query
// reads; attention takes it from the step's own k/v rows instead.
//
// reshape_and_cache_v1: one thread block per token; threads stride over kv_dim (coalesced).
// copy_blocks_v1: copy-on-write. One thread block per (src, dst) pair copies a whole block
//   (block_size · kv_dim elements) of K and of V; launched once per layer of the group, before
//   any reshape_and_cache of the step (a src may be written later in the same step).
#include "common.cuh"

// key, value (n_tokens, kv_dim) act type → key_cache, value_cache (num_slots, kv_dim) cache type.
template <typename A, typename C>
__device__ void reshape_and_cache_v1(const A* __restrict__ key, const A* __restrict__ value,
                                     C* __restrict__ key_cache, C* __restrict__ value_cache,
                                     const int* __restrict__ slot_mapping, int kv_dim) {
    const long long t = blockIdx.x;
    const long long slot = slot_mapping[t];
    if (slot < 0) return;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        key_cache[slot * kv_dim + i] = from_float<C>(to_float(key[t * kv_dim + i]));
        value_cache[slot * kv_dim + i] = from_float<C>(to_float(value[t * kv_dim + i]));
    }
}

#define KVLAB_RESHAPE_AND_CACHE(A, C, NAME)                                                      \
    extern "C" __global__ void NAME(const A* key, const A* value, C* key_cache, C* value_cache,  \
                                    const int* slot_mapping, int kv_dim) {                       \
        reshape_and_cache_v1<A, C>(key, value, key_cache, value_cache, slot_mapping, kv_dim);    \
    }
KVLAB_RESHAPE_AND_CACHE(float, float, reshape_and_cache_v1_f32_f32)
KVLAB_RESHAPE_AND_CACHE(float, __half, reshape_and_cache_v1_f32_f16)
KVLAB_RESHAPE_AND_CACHE(__half, float, reshape_and_cache_v1_f16_f32)
KVLAB_RESHAPE_AND_CACHE(__half, __half, reshape_and_cache_v1_f16_f16)

// pairs (n_pairs, 2) i32: (src block, dst block). block_elems = block_size · kv_dim.
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

extern "C" __global__ void copy_blocks_v1_f32(float* key_cache, float* value_cache,
                                              const int* pairs, long long block_elems) {
    copy_blocks_v1<float>(key_cache, value_cache, pairs, block_elems);
}
extern "C" __global__ void copy_blocks_v1_f16(__half* key_cache, __half* value_cache,
                                              const int* pairs, long long block_elems) {
    copy_blocks_v1<__half>(key_cache, value_cache, pairs, block_elems);
}
