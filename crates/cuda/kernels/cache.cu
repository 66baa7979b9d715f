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
// int4 (kvlab_int4x2) has its own layout, kvlab-cpu's KvStore in device memory:
//   cache      (num_slots, n_kv_heads, ⌈head_dim / 2⌉) two codes a byte, for K and for V;
//   k_scale    (num_blocks, kv_dim, 2) f32: each key channel's (s, min) over its block;
//   v_scale    (num_slots, n_kv_heads, ⌈head_dim / 32⌉, 2) f32: each value group's (s, min);
//   k_residual (n_residuals, block_size, kv_dim) f32: the keys of blocks still filling;
//   write_map, read_map (num_blocks,) i32: the residual holding a block's keys, -1 once they
//     are quantized. The host (residual.rs) assigns residuals, and says which blocks to open
//     (decode back into a residual: a block written again after it was complete) and which to
//     close (quantize: its last row arrived); write_map is the map while the step writes,
//     read_map after its blocks are closed, which is what attention reads.
// A step's order: close early (a residual taken back), copies, open, reshape_and_cache, close,
// kv_read_back, attention — kvlab-cpu's order (KvStore::write quantizes a group as its last row
// arrives, and the step's own rows are read back from the pool before attention).
//
// reshape_and_cache_v1: one thread block per token; threads stride over kv_dim (coalesced).
//   Scaled formats: warp w quantizes KV heads w, w + warps, ...: the lanes reduce the head's
//   amax (warp_max), lane 0 stores s = amax / max_code, and every lane stores its elements'
//   codes of x · (1/s) — the order of operations of kvlab-cpu's KvStore::write, so the same f32
//   row gives the same bits on both.
//   int4: the key row goes to its block's residual as f32; warp w quantizes value groups w,
//   w + warps, ... (one lane per channel; neighbouring lanes pack their two codes in a byte).
// int4_open_keys_v1 / int4_close_keys_v1: one thread block per (block, residual) pair.
// kv_read_back_v1: the step's rows become what the pool gives back for them (below).
// copy_blocks_v1: copy-on-write. One thread block per (src, dst) pair copies a whole block
//   (block_elems elements) of K and of V (of K alone when value_cache is null); launched once
//   per layer of the group, before any reshape_and_cache of the step (a src may be written
//   later in the same step). The scales of a scaled format are copied by the f32 instantiation
//   with block_elems = block_size · n_kv_heads; int4's (s, min) pairs and residuals likewise.
#include "common.cuh"

// The scale of one KV head (head_dim,) of activations in a scaled format: amax / max_code, 1
// for a zero head, NaN if any element is. Called by a whole warp; every lane gets it.
template <typename A, typename C>
__device__ __forceinline__ float head_scale(const A* __restrict__ x, int head_dim) {
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
    return nan ? __int_as_float(0x7fc00000) : (amax == 0.0f ? 1.0f : amax / KvCodec<C>::max_code);
}

// One KV head (head_dim,) of activations → codes, and its scale (scaled formats only). Called
// by a whole warp.
template <typename A, typename C>
__device__ __forceinline__ void quantize_head(const A* __restrict__ x, C* __restrict__ codes,
                                              float* __restrict__ scale, int head_dim) {
    const int lane = threadIdx.x % KVLAB_WARP;
    const float s = head_scale<A, C>(x, head_dim);
    if (lane == 0) *scale = s;
    const float inv = 1.0f / s;
    for (int d = lane; d < head_dim; d += KVLAB_WARP) {
        codes[d] = KvCodec<C>::encode(to_float(x[d]) * inv);
    }
}

// (s, min) of an int4 value group whose element this lane holds as v (`live`: the lane has one;
// a group of 32 channels is a warp). Called by a whole warp; every lane gets them.
__device__ __forceinline__ float2 warp_int4_range(float v, bool live) {
    const bool nan = __any_sync(0xffffffffu, live && isnan(v));
    const float lo = warp_min(live ? v : __int_as_float(0x7f800000));
    const float hi = warp_max(live ? v : KVLAB_NEG_INF);
    return int4_range(lo, hi, nan);
}

// One token's int4 values: warp w quantizes value groups w, w + warps, ... of the row `x`
// (kv_dim,) into codes (n_kv_heads, ⌈head_dim / 2⌉) and (s, min) pairs (n_kv_heads, groups, 2).
template <typename A>
__device__ __forceinline__ void quantize_values_int4(const A* __restrict__ x,
                                                     kvlab_int4x2* __restrict__ codes,
                                                     float* __restrict__ range, int n_kv_heads,
                                                     int head_dim) {
    const int lane = threadIdx.x % KVLAB_WARP;
    const int groups = int4_value_groups(head_dim);
    const int head_bytes = int4_head_bytes(head_dim);
    for (int g = threadIdx.x / KVLAB_WARP; g < n_kv_heads * groups; g += blockDim.x / KVLAB_WARP) {
        const int h = g / groups;
        const int d = (g % groups) * KVLAB_INT4_VALUE_GROUP + lane;  // this lane's channel
        const bool live = d < head_dim;
        const float v = live ? to_float(x[h * head_dim + d]) : 0.0f;
        const float2 sm = warp_int4_range(v, live);
        if (lane == 0) {
            range[2 * g] = sm.x;
            range[2 * g + 1] = sm.y;
        }
        const unsigned int code = live ? int4_encode(v, sm.y, int4_inv(sm.x)) : 0u;
        const unsigned int high = __shfl_down_sync(0xffffffffu, code, 1);  // lane + 1's code
        if (live && d % 2 == 0) {
            const unsigned int hi_code = d + 1 < head_dim ? high : 0u;
            codes[h * head_bytes + d / 2].bits = (unsigned char)(code | (hi_code << 4));
        }
    }
}

// key, value (n_tokens, kv_dim) act type → key_cache, value_cache (num_slots, kv_dim) cache
// type; k_scale, v_scale (num_slots, n_kv_heads) for the scaled formats. int4: keys into
// k_residual through write_map, values quantized into value_cache and v_scale (layouts above).
template <typename A, typename C>
__device__ void reshape_and_cache_v1(const A* __restrict__ key, const A* __restrict__ value,
                                     C* __restrict__ key_cache, C* __restrict__ value_cache,
                                     float* __restrict__ k_scale, float* __restrict__ v_scale,
                                     float* __restrict__ k_residual,
                                     const int* __restrict__ write_map,
                                     const int* __restrict__ slot_mapping, int kv_dim,
                                     int n_kv_heads, int block_size) {
    const long long t = blockIdx.x;
    const long long slot = slot_mapping[t];
    if (slot < 0) return;  // the whole block leaves together
    if constexpr (KvCodec<C>::int4) {
        const int head_dim = kv_dim / n_kv_heads;
        const long long residual = write_map[slot / block_size];  // assigned by the host
        float* row = k_residual + (residual * block_size + slot % block_size) * kv_dim;
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) row[i] = to_float(key[t * kv_dim + i]);
        quantize_values_int4<A>(value + t * kv_dim,
                                value_cache + slot * n_kv_heads * int4_head_bytes(head_dim),
                                v_scale + slot * n_kv_heads * int4_value_groups(head_dim) * 2,
                                n_kv_heads, head_dim);
    } else if constexpr (KvCodec<C>::scaled) {
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
        float* v_scale, float* k_residual, const int* write_map, const int* slot_mapping,        \
        int kv_dim, int n_kv_heads, int block_size) {                                            \
        reshape_and_cache_v1<A, C>(key, value, key_cache, value_cache, k_scale, v_scale,         \
                                   k_residual, write_map, slot_mapping, kv_dim, n_kv_heads,      \
                                   block_size);                                                  \
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
KVLAB_RESHAPE_AND_CACHE(float, kvlab_int4x2, f32_i4)
KVLAB_RESHAPE_AND_CACHE(__half, kvlab_int4x2, f16_i4)

// int4 keys of whole blocks, pairs (n_pairs, 2) i32 = (block, residual):
//   close: residual rows (block_size, kv_dim) → per channel (s, min) over the block's rows into
//     k_scale (num_blocks, kv_dim, 2) and the codes into key_cache (kvlab-cpu's
//     KvStore::write_key_int4 when a group's last row arrives). Thread i takes byte i of the
//     block's (n_kv_heads, ⌈head_dim / 2⌉) row, i.e. channels 2i and 2i + 1 of its head.
//   open: codes and (s, min) of the block decoded back into the residual (what kvlab-cpu does
//     before it writes a row of a complete group), so the rows not written again read as before.
extern "C" __global__ void int4_close_keys_v1(kvlab_int4x2* __restrict__ key_cache,
                                              float* __restrict__ k_scale,
                                              const float* __restrict__ k_residual,
                                              const int* __restrict__ pairs, int block_size,
                                              int n_kv_heads, int head_dim) {
    const long long block = pairs[2 * blockIdx.x];
    const long long residual = pairs[2 * blockIdx.x + 1];
    const int kv_dim = n_kv_heads * head_dim;
    const int head_bytes = int4_head_bytes(head_dim);
    const float* rows = k_residual + residual * block_size * kv_dim;
    for (int i = threadIdx.x; i < n_kv_heads * head_bytes; i += blockDim.x) {
        const int h = i / head_bytes, d0 = 2 * (i % head_bytes);
        const int n_ch = d0 + 1 < head_dim ? 2 : 1;
        float s[2] = {0.0f, 0.0f}, m[2] = {0.0f, 0.0f}, inv[2] = {0.0f, 0.0f};
        for (int c = 0; c < n_ch; ++c) {
            const int ch = h * head_dim + d0 + c;
            float lo = __int_as_float(0x7f800000), hi = KVLAB_NEG_INF;
            bool nan = false;
            for (int r = 0; r < block_size; ++r) {
                const float x = rows[(long long)r * kv_dim + ch];
                nan |= isnan(x);
                lo = fminf(lo, x);
                hi = fmaxf(hi, x);
            }
            const float2 sm = int4_range(lo, hi, nan);
            s[c] = sm.x;
            m[c] = sm.y;
            inv[c] = int4_inv(sm.x);
            k_scale[(block * kv_dim + ch) * 2] = sm.x;
            k_scale[(block * kv_dim + ch) * 2 + 1] = sm.y;
        }
        for (int r = 0; r < block_size; ++r) {
            const float* x = rows + (long long)r * kv_dim + h * head_dim + d0;
            unsigned int byte = int4_encode(x[0], m[0], inv[0]);
            if (n_ch == 2) byte |= int4_encode(x[1], m[1], inv[1]) << 4;
            key_cache[((block * block_size + r) * n_kv_heads + h) * head_bytes + i % head_bytes]
                .bits = (unsigned char)byte;
        }
    }
}

extern "C" __global__ void int4_open_keys_v1(const kvlab_int4x2* __restrict__ key_cache,
                                             const float* __restrict__ k_scale,
                                             float* __restrict__ k_residual,
                                             const int* __restrict__ pairs, int block_size,
                                             int n_kv_heads, int head_dim) {
    const long long block = pairs[2 * blockIdx.x];
    const long long residual = pairs[2 * blockIdx.x + 1];
    const int kv_dim = n_kv_heads * head_dim;
    for (int i = threadIdx.x; i < block_size * kv_dim; i += blockDim.x) {
        const int r = i / kv_dim, ch = i % kv_dim, h = ch / head_dim, d = ch % head_dim;
        k_residual[residual * block_size * kv_dim + i] = int4_pool_key(
            key_cache, k_scale, block * block_size + r, h, d, block_size, n_kv_heads, head_dim);
    }
}

// kv_read_back_v1: after a layer's writes (and int4's closes), the step's own k and v rows
// become what the pool gives back for them, as kvlab-cpu's paged engine reads them back before
// its attention: a stored row is read from its slot (an int4 key of a block still filling from
// its residual), a row not stored (slot -1) is quantized and decoded in registers as a row of
// its own (int4 keys then come back as written: a group of one row). So a query reads the same
// key and value whether they come from this step or a later one. One thread block per token,
// threads over kv_dim (a multiple of 32: the row not stored reduces per warp). Not launched for
// an f32 cache, which gives back what it was given.
template <typename A, typename C>
__device__ void kv_read_back_v1(A* __restrict__ key, A* __restrict__ value,
                                const C* __restrict__ key_cache, const C* __restrict__ value_cache,
                                const float* __restrict__ k_scale,
                                const float* __restrict__ v_scale,
                                const float* __restrict__ k_residual,
                                const int* __restrict__ read_map,
                                const int* __restrict__ slot_mapping, int kv_dim, int n_kv_heads,
                                int block_size) {
    using Codec = KvCodec<C>;
    const long long t = blockIdx.x;
    const long long slot = slot_mapping[t];
    const int head_dim = kv_dim / n_kv_heads;
    A* k = key + t * kv_dim;
    A* v = value + t * kv_dim;
    if (slot >= 0) {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            const int h = i / head_dim, d = i % head_dim;
            float kx, vx;
            if constexpr (Codec::int4) {
                const int r = read_map[slot / block_size];
                kx = r >= 0 ? int4_residual_key(k_residual, r, slot, h, block_size, n_kv_heads,
                                                head_dim)[d]
                            : int4_pool_key(key_cache, k_scale, slot, h, d, block_size,
                                            n_kv_heads, head_dim);
                vx = int4_pool_value(value_cache, v_scale, slot, h, d, n_kv_heads, head_dim);
            } else {
                kx = Codec::decode(key_cache[slot * kv_dim + i]);
                vx = Codec::decode(value_cache[slot * kv_dim + i]);
                if constexpr (Codec::scaled) {
                    kx *= k_scale[slot * n_kv_heads + h];
                    vx *= v_scale[slot * n_kv_heads + h];
                }
            }
            k[i] = from_float<A>(kx);
            v[i] = from_float<A>(vx);
        }
        return;
    }
    const int lane = threadIdx.x % KVLAB_WARP;
    const int warp = threadIdx.x / KVLAB_WARP, n_warps = blockDim.x / KVLAB_WARP;
    if constexpr (Codec::int4) {
        // Keys: a group of one row comes back as written. Values: per group of 32 channels.
        const int groups = int4_value_groups(head_dim);
        for (int g = warp; g < n_kv_heads * groups; g += n_warps) {
            const int h = g / groups;
            const int d = (g % groups) * KVLAB_INT4_VALUE_GROUP + lane;
            const bool live = d < head_dim;
            const float x = live ? to_float(v[h * head_dim + d]) : 0.0f;
            const float2 sm = warp_int4_range(x, live);
            if (live) {
                const unsigned int q = int4_encode(x, sm.y, int4_inv(sm.x));
                v[h * head_dim + d] = from_float<A>(int4_value(q, sm.x, sm.y));
            }
        }
    } else if constexpr (Codec::scaled) {
        // Each KV head of k and of v: its scale, its codes, decoded (KvStore::write, then read).
        for (int w = warp; w < 2 * n_kv_heads; w += n_warps) {
            A* x = (w < n_kv_heads ? k : v) + (w % n_kv_heads) * head_dim;
            const float s = head_scale<A, C>(x, head_dim);
            const float inv = 1.0f / s;
            for (int d = lane; d < head_dim; d += KVLAB_WARP) {
                x[d] = from_float<A>(Codec::decode(Codec::encode(to_float(x[d]) * inv)) * s);
            }
        }
    } else {
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            k[i] = from_float<A>(to_float(Codec::encode(to_float(k[i]))));
            v[i] = from_float<A>(to_float(Codec::encode(to_float(v[i]))));
        }
    }
}

#define KVLAB_KV_READ_BACK(A, C, SUFFIX)                                                         \
    extern "C" __global__ void kv_read_back_v1_##SUFFIX(                                         \
        A* key, A* value, const C* key_cache, const C* value_cache, const float* k_scale,        \
        const float* v_scale, const float* k_residual, const int* read_map,                      \
        const int* slot_mapping, int kv_dim, int n_kv_heads, int block_size) {                   \
        kv_read_back_v1<A, C>(key, value, key_cache, value_cache, k_scale, v_scale, k_residual,  \
                              read_map, slot_mapping, kv_dim, n_kv_heads, block_size);           \
    }
KVLAB_KV_READ_BACK(float, __half, f32_f16)
KVLAB_KV_READ_BACK(float, __nv_bfloat16, f32_bf16)
KVLAB_KV_READ_BACK(float, __nv_fp8_e4m3, f32_fp8)
KVLAB_KV_READ_BACK(float, signed char, f32_i8)
KVLAB_KV_READ_BACK(float, kvlab_int4x2, f32_i4)
KVLAB_KV_READ_BACK(__half, __half, f16_f16)
KVLAB_KV_READ_BACK(__half, __nv_bfloat16, f16_bf16)
KVLAB_KV_READ_BACK(__half, __nv_fp8_e4m3, f16_fp8)
KVLAB_KV_READ_BACK(__half, signed char, f16_i8)
KVLAB_KV_READ_BACK(__half, kvlab_int4x2, f16_i4)

// pairs (n_pairs, 2) i32: (src block, dst block). block_elems: elements of one block.
// value_cache may be null: then K alone is copied.
template <typename C>
__device__ void copy_blocks_v1(C* key_cache, C* value_cache, const int* __restrict__ pairs,
                               long long block_elems) {
    const long long src = (long long)pairs[2 * blockIdx.x] * block_elems;
    const long long dst = (long long)pairs[2 * blockIdx.x + 1] * block_elems;
    for (long long i = threadIdx.x; i < block_elems; i += blockDim.x) {
        key_cache[dst + i] = key_cache[src + i];
        if (value_cache != nullptr) value_cache[dst + i] = value_cache[src + i];
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
KVLAB_COPY_BLOCKS(kvlab_int4x2, i4)
