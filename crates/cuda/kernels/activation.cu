// Elementwise kernels of the transformer block: the gated FFN's activation, the residual add,
// a projection's bias, and the row gather that picks each sequence's last token before the classifier.
//
// v1 of each: one thread per element (grid-stride loop), f32 arithmetic. These are bound by
// memory bandwidth; fusing them into the neighbouring GEMM epilogues would be the next version.
#include "common.cuh"

// silu(x) = x·σ(x) = x / (1 + e^−x)   (SwiGLU, Llama)
__device__ __forceinline__ float act_silu(float x) { return x / (1.0f + expf(-x)); }

// gelu_tanh(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))   (GeGLU, Gemma). The product
// 0.044715·x·x·x is evaluated left to right as in kvlab_model::ops::gelu_tanh.
__device__ __forceinline__ float act_gelu_tanh(float x) {
    const float k = 0.7978846f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// gate ← act(gate) ⊙ up. gate, up: (n_tokens, hidden_dim) flattened to n elements.
template <typename T, int GELU>
__device__ void glu_v1(T* gate, const T* __restrict__ up, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = to_float(gate[i]);
        const float a = GELU ? act_gelu_tanh(g) : act_silu(g);
        gate[i] = from_float<T>(a * to_float(up[i]));
    }
}

#define KVLAB_GLU(T, GELU, NAME)                                                                 \
    extern "C" __global__ void NAME(T* gate, const T* up, long long n) {                         \
        glu_v1<T, GELU>(gate, up, n);                                                            \
    }
KVLAB_GLU(float, 0, glu_silu_v1_f32)
KVLAB_GLU(__half, 0, glu_silu_v1_f16)
KVLAB_GLU(float, 1, glu_gelu_tanh_v1_f32)
KVLAB_GLU(__half, 1, glu_gelu_tanh_v1_f16)

// x ← x + o. x: (n_tokens, dim) f32 residual stream; o: (n_tokens, dim) act type.
template <typename T>
__device__ void residual_add_v1(float* x, const T* __restrict__ o, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] += to_float(o[i]);
    }
}

extern "C" __global__ void residual_add_v1_f32(float* x, const float* o, long long n) {
    residual_add_v1<float>(x, o, n);
}
extern "C" __global__ void residual_add_v1_f16(float* x, const __half* o, long long n) {
    residual_add_v1<__half>(x, o, n);
}

// x[r, c] ← x[r, c] + bias[c]: a projection's bias (Qwen2's q, k, v). x: (rows, cols) act type,
// flattened to n = rows·cols elements; bias: (cols,) f32.
template <typename T>
__device__ void add_bias_v1(T* x, const float* __restrict__ bias, long long n, int cols) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = from_float<T>(to_float(x[i]) + bias[i % cols]);
    }
}

extern "C" __global__ void add_bias_v1_f32(float* x, const float* bias, long long n, int cols) {
    add_bias_v1<float>(x, bias, n, cols);
}
extern "C" __global__ void add_bias_v1_f16(__half* x, const float* bias, long long n, int cols) {
    add_bias_v1<__half>(x, bias, n, cols);
}

// out[r, :] = x[rows[r], :]. out (n_rows, dim) f32, x (n_tokens, dim) f32, rows (n_rows,) i32.
// One thread block per output row.
extern "C" __global__ void gather_rows_v1_f32(float* __restrict__ out, const float* __restrict__ x,
                                              const int* __restrict__ rows, int dim) {
    const long long r = blockIdx.x;
    const float* src = x + (long long)rows[r] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = src[i];
}
