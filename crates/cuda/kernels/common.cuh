// common.cuh: helpers every kvlab kernel file includes. nvrtc.rs pastes this file in place of
// the line `#include "common.cuh"` before compiling, so kernels need no file system at run time.
//
// Element types: `float` (f32, parity mode) and `__half` (f16, fast mode). Every kernel loads
// elements through to_float() and stores through from_float<T>(), so all arithmetic and every
// accumulator is f32 whatever the storage type (round-to-nearest-even on the way back).
#ifndef KVLAB_COMMON_CUH
#define KVLAB_COMMON_CUH
#include <cuda_fp16.h>

#define KVLAB_WARP 32
#define KVLAB_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
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
