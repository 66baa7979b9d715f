// RMSNorm (Zhang & Sennrich 2019): y_i = x_i / sqrt(mean(x²) + eps) · w_i, row by row.
//
// x, y (n_rows, n) row-major; w (n,) f32 gain. The same kernel serves every RMSNorm of the model:
//   * attn_norm / ffn_norm / final_norm: rows = tokens, n = dim, x f32 (residual) → y act type;
//   * Gemma's QK-norm: rows = tokens·heads, n = head_dim, in place on q or k (act type);
//   * Gemma's post-attention / post-FFN norms: rows = tokens, n = dim, in place (act type).
// In place (y == x) is safe: each thread rewrites only the elements it read, after the block-wide
// sum is complete. That is why the pointers are not __restrict__.
//
// v1: one thread block per row; each thread sums squares over a strided subset, block_sum
//     reduces, then each thread scales its elements. The row is read twice (it is in L1/L2 the
//     second time). inv = 1 / sqrtf(ms + eps) (IEEE sqrt and division, as the CPU reference),
//     not rsqrtf, to stay within the f32 parity tolerance.
#include "common.cuh"

template <typename I, typename O>
__device__ void rmsnorm_v1(O* y, const I* x, const float* __restrict__ w, int n, float eps) {
    __shared__ float scratch[KVLAB_WARP];
    const long long row = blockIdx.x;
    const I* xr = x + row * n;
    O* yr = y + row * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_float(xr[i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        yr[i] = from_float<O>(to_float(xr[i]) * inv * w[i]);
    }
}

#define KVLAB_RMSNORM(I, O, NAME)                                                                \
    extern "C" __global__ void NAME(O* y, const I* x, const float* w, int n, float eps) {        \
        rmsnorm_v1<I, O>(y, x, w, n, eps);                                                       \
    }
KVLAB_RMSNORM(float, float, rmsnorm_v1_f32_f32)
KVLAB_RMSNORM(float, __half, rmsnorm_v1_f32_f16)
KVLAB_RMSNORM(__half, __half, rmsnorm_v1_f16_f16)
