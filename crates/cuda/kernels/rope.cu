// RoPE (Su et al. 2021) in place on q or k: pair j of every head at position p is rotated by the
// angle p · theta^(-2j/head_dim): (a, b) ← (a·cos − b·sin, a·sin + b·cos).
//
// x (n_tokens, n_heads, head_dim) act type; positions (n_tokens,) i32; cos_table, sin_table
// (max_pos, head_dim/2) f32, computed on the host exactly as kvlab_model::ops::rope computes the
// angle (so the GPU and CPU rotate by bit-identical cos/sin). Which dimensions form pair j:
//   neox = 0: interleaved pairs (2j, 2j+1)   (llama2.c, Meta's Llama code)
//   neox = 1: split halves     (j, j + head_dim/2)   (GPT-NeoX, HF rotate_half, Gemma)
//
// v1: one thread per (token, head, pair): two loads, two stores, no reuse to exploit.
#include "common.cuh"

template <typename T>
__device__ void rope_v1(T* x, const int* __restrict__ positions, const float* __restrict__ cos_table,
                        const float* __restrict__ sin_table, int n_tokens, int n_heads,
                        int head_dim, int neox) {
    const int half = head_dim / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)n_tokens * n_heads * half;
    if (idx >= total) return;
    const int j = (int)(idx % half);
    const long long token_head = idx / half;
    const long long t = token_head / n_heads;
    const long long p = positions[t];
    const float c = cos_table[p * half + j];
    const float s = sin_table[p * half + j];
    T* head = x + token_head * head_dim;
    const int ia = neox ? j : 2 * j;
    const int ib = neox ? j + half : 2 * j + 1;
    const float a = to_float(head[ia]);
    const float b = to_float(head[ib]);
    head[ia] = from_float<T>(a * c - b * s);
    head[ib] = from_float<T>(a * s + b * c);
}

#define KVLAB_ROPE(T, NAME)                                                                      \
    extern "C" __global__ void NAME(T* x, const int* positions, const float* cos_table,          \
                                    const float* sin_table, int n_tokens, int n_heads,           \
                                    int head_dim, int neox) {                                    \
        rope_v1<T>(x, positions, cos_table, sin_table, n_tokens, n_heads, head_dim, neox);       \
    }
KVLAB_ROPE(float, rope_v1_f32)
KVLAB_ROPE(__half, rope_v1_f16)
