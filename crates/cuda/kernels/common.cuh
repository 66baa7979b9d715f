// common.cuh: helpers every kvlab kernel file includes. nvrtc.rs pastes this file in place of
// the line `#include "common.cuh"` before compiling, so kernels need no file system at run time.
//
// Element types: `float` (f32, parity mode) and `__half` (f16, fast mode) for activations;
// the KV pool also stores `__nv_bfloat16`, `__nv_fp8_e4m3`, `signed char` (int8) and
// `kvlab_int4x2` (two int4 codes in a byte) through KvCodec below. Every kernel loads elements through to_float() (or KvCodec::decode) and stores
// through from_float<T>() (or KvCodec::encode), so all arithmetic and every accumulator is f32
// whatever the storage type (round-to-nearest-even on the way back).
#ifndef KVLAB_COMMON_CUH
#define KVLAB_COMMON_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define KVLAB_WARP 32
#define KVLAB_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// How the KV pool stores an element of type C (the formats of kvlab_model::kv_dtype, the same
// bits as kvlab-cpu's KvStore):
//   float, __half, __nv_bfloat16: the value itself, rounded to nearest-even; no scale.
//   __nv_fp8_e4m3 (fp8-e4m3): per (token, KV head) a scale s = amax / 448 and each element x as
//     the E4M3 value nearest x · (1/s), saturating (vLLM's fp8 KV, with a scale per head and
//     token instead of per tensor, so no calibration is needed);
//   signed char (int8): per (token, KV head) s = amax / 127 and round(x · (1/s)) in −127..=127
//     (symmetric; llama.cpp's q8_0 and KIVI's int8 baseline).
//   kvlab_int4x2 (int4, KIVI): two codes per byte, low nibble first, asymmetric: a group has
//     s = (max − min) / 15 and min, and x is stored as round((x − min) · (1/s)) in 0..=15, read
//     back as q · s + min. Keys are grouped per channel over a whole block (KIVI's finding:
//     keys have outlier channels), so a block's keys are quantized only when its last row
//     arrives; until then they live in an f32 residual (cache.cu). Values are grouped per token
//     over 32 channels of a head. Not a scaled format in the sense above: its (s, min) pairs
//     have their own layout (cache.cu), and attention reads it through the int4 helpers below.
// A head whose amax is 0 gets s = 1; a NaN makes its scale NaN, so the head reads back NaN.
// decode(c) is the element before the scale: the stored value is decode(c) · s.
template <typename C> struct KvCodec {
    static constexpr bool int4 = false;
    static constexpr bool scaled = false;
    static constexpr float max_code = 0.0f;
    static __device__ __forceinline__ float decode(C c) { return to_float(c); }
    static __device__ __forceinline__ C encode(float x) { return from_float<C>(x); }
};
template <> struct KvCodec<__nv_fp8_e4m3> {
    static constexpr bool int4 = false;
    static constexpr bool scaled = true;
    static constexpr float max_code = 448.0f;  // E4M3's largest finite value
    static __device__ __forceinline__ float decode(__nv_fp8_e4m3 c) { return float(c); }
    // The constructor converts with __NV_SATFINITE and round-to-nearest-even; NaN stays NaN.
    static __device__ __forceinline__ __nv_fp8_e4m3 encode(float x) { return __nv_fp8_e4m3(x); }
};
template <> struct KvCodec<signed char> {
    static constexpr bool int4 = false;
    static constexpr bool scaled = true;
    static constexpr float max_code = 127.0f;
    static __device__ __forceinline__ float decode(signed char c) { return (float)c; }
    // roundf rounds half away from zero, as Rust's f32::round; NaN stores 0 (as Rust's `as i8`)
    // and reads back NaN through its scale.
    static __device__ __forceinline__ signed char encode(float x) {
        return isnan(x) ? (signed char)0 : (signed char)fminf(fmaxf(roundf(x), -127.0f), 127.0f);
    }
};

// Two int4 codes, element 2i in the low nibble and 2i + 1 in the high one (a head of head_dim
// elements is ⌈head_dim / 2⌉ of these).
struct kvlab_int4x2 {
    unsigned char bits;
};
template <> struct KvCodec<kvlab_int4x2> {
    static constexpr bool int4 = true;
    static constexpr bool scaled = false;
    static constexpr float max_code = 15.0f;
};

// Channels of a head that share one int4 value scale (kvlab_model::KvDtype::INT4_VALUE_GROUP).
#define KVLAB_INT4_VALUE_GROUP 32

// Code d of a head's packed int4 codes.
__device__ __forceinline__ unsigned int int4_code_at(const kvlab_int4x2* head, int d) {
    const unsigned int b = head[d >> 1].bits;
    return (d & 1) ? (b >> 4) : (b & 0x0Fu);
}

// q · s + min, rounded as kvlab-cpu rounds it (a product, then a sum: never an FMA, which NVRTC
// would otherwise contract it to), so a decoded group is the same f32 on both engines.
__device__ __forceinline__ float int4_value(unsigned int q, float s, float min) {
    return __fadd_rn(__fmul_rn((float)q, s), min);
}

// int4's layout in the pool (cache.cu): a head's codes are ⌈head_dim / 2⌉ bytes, its values
// ⌈head_dim / 32⌉ groups.
__device__ __forceinline__ int int4_head_bytes(int head_dim) { return (head_dim + 1) / 2; }
__device__ __forceinline__ int int4_value_groups(int head_dim) {
    return (head_dim + KVLAB_INT4_VALUE_GROUP - 1) / KVLAB_INT4_VALUE_GROUP;
}

// Element d of KV head h of pool slot `slot`'s quantized int4 key: its code, and its channel's
// (s, min) over the slot's block. key_cache (num_slots, n_kv_heads, head bytes), k_scale
// (num_blocks, kv_dim, 2).
__device__ __forceinline__ float int4_pool_key(const kvlab_int4x2* key_cache,
                                               const float* k_scale, long long slot, int h, int d,
                                               int block_size, int n_kv_heads, int head_dim) {
    const kvlab_int4x2* codes = key_cache + (slot * n_kv_heads + h) * int4_head_bytes(head_dim);
    const float* sm = k_scale + ((slot / block_size) * n_kv_heads * head_dim + h * head_dim + d) * 2;
    return int4_value(int4_code_at(codes, d), sm[0], sm[1]);
}

// Element d of KV head h of pool slot `slot`'s int4 value: its code, and its group's (s, min).
// value_cache as key_cache above, v_scale (num_slots, n_kv_heads, groups, 2).
__device__ __forceinline__ float int4_pool_value(const kvlab_int4x2* value_cache,
                                                 const float* v_scale, long long slot, int h,
                                                 int d, int n_kv_heads, int head_dim) {
    const kvlab_int4x2* codes =
        value_cache + (slot * n_kv_heads + h) * int4_head_bytes(head_dim);
    const long long group =
        (slot * n_kv_heads + h) * int4_value_groups(head_dim) + d / KVLAB_INT4_VALUE_GROUP;
    return int4_value(int4_code_at(codes, d), v_scale[2 * group], v_scale[2 * group + 1]);
}

// KV head h of pool slot `slot`'s key in residual `residual` (n_residuals, block_size, kv_dim)
// f32: the key of a block still filling.
__device__ __forceinline__ const float* int4_residual_key(const float* k_residual, int residual,
                                                          long long slot, int h, int block_size,
                                                          int n_kv_heads, int head_dim) {
    const long long row = (long long)residual * block_size + slot % block_size;
    return k_residual + row * n_kv_heads * head_dim + h * head_dim;
}

// The code of x on the grid min + q · s, `inv` = 1 / s (0 for a flat group): kvlab-cpu's
// ((x − min) · inv).round().clamp(0, 15); roundf rounds half away from zero as Rust's round,
// and a NaN (whose group's s and min are NaN) stores 0, as Rust's `as u8`.
__device__ __forceinline__ unsigned int int4_encode(float x, float min, float inv) {
    const float c = roundf(__fmul_rn(__fsub_rn(x, min), inv));
    return isnan(c) ? 0u : (unsigned int)fminf(fmaxf(c, 0.0f), 15.0f);
}

// (s, min) of a group from its lo = min and hi = max (nan: some element was NaN): s = (hi − lo)
// / 15, both NaN for a NaN group. And inv = 1 / s, 0 when s is not > 0.
__device__ __forceinline__ float2 int4_range(float lo, float hi, bool nan) {
    if (nan) return make_float2(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
    return make_float2(__fdiv_rn(__fsub_rn(hi, lo), 15.0f), lo);
}
__device__ __forceinline__ float int4_inv(float s) { return s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f; }

// min and max over the 32 lanes of a warp; every lane gets them.
__device__ __forceinline__ float warp_min(float v) {
    for (int o = KVLAB_WARP / 2; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Σ over the 32 lanes of a warp; every lane gets the sum (butterfly reduction).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = KVLAB_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// max over the 32 lanes of a warp; every lane gets it.
__device__ __forceinline__ float warp_max(float v) {
    for (int o = KVLAB_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Σ over the whole thread block; every thread gets the sum. `scratch` is __shared__ float[32].
// Needs blockDim.x to be a multiple of 32 (launch.rs rounds it up) and every thread to call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % KVLAB_WARP;
    const int warp = threadIdx.x / KVLAB_WARP;
    const int n_warps = blockDim.x / KVLAB_WARP;
    v = warp_sum(v);
    __syncthreads();  // an earlier call may still be reading scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

#endif  // KVLAB_COMMON_CUH
