// common.cuh: helpers every kvlab kernel file includes. nvrtc.rs pastes this file in place of
// the line `#include "common.cuh"` before compiling, so kernels need no file system at run time.
//
// Element types: `float` (f32, parity mode) and `__half` (f16, fast mode) for activations;
// the KV pool also stores `__nv_bfloat16`, `__nv_fp8_e4m3` and `signed char` (int8) through
// KvCodec below. Every kernel loads elements through to_float() (or KvCodec::decode) and stores
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
// A head whose amax is 0 gets s = 1; a NaN makes its scale NaN, so the head reads back NaN.
// decode(c) is the element before the scale: the stored value is decode(c) · s.
template <typename C> struct KvCodec {
    static constexpr bool scaled = false;
    static constexpr float max_code = 0.0f;
    static __device__ __forceinline__ float decode(C c) { return to_float(c); }
    static __device__ __forceinline__ C encode(float x) { return from_float<C>(x); }
};
template <> struct KvCodec<__nv_fp8_e4m3> {
    static constexpr bool scaled = true;
    static constexpr float max_code = 448.0f;  // E4M3's largest finite value
    static __device__ __forceinline__ float decode(__nv_fp8_e4m3 c) { return float(c); }
    // The constructor converts with __NV_SATFINITE and round-to-nearest-even; NaN stays NaN.
    static __device__ __forceinline__ __nv_fp8_e4m3 encode(float x) { return __nv_fp8_e4m3(x); }
};
template <> struct KvCodec<signed char> {
    static constexpr bool scaled = true;
    static constexpr float max_code = 127.0f;
    static __device__ __forceinline__ float decode(signed char c) { return (float)c; }
    // roundf rounds half away from zero, as Rust's f32::round; NaN stores 0 (as Rust's `as i8`)
    // and reads back NaN through its scale.
    static __device__ __forceinline__ signed char encode(float x) {
        return isnan(x) ? (signed char)0 : (signed char)fminf(fmaxf(roundf(x), -127.0f), 127.0f);
    }
};

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
