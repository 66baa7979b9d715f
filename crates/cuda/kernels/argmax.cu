// Greedy decoding on the device: out[s] = argmax_v logits[s, v], ties to the lowest token id, and
// NaN never wins over a number (kvlab_model::sampler::argmax's rule). Only n_seqs ints then cross
// PCIe instead of n_seqs · vocab_size floats.
//
// logits (n_seqs, vocab_size) f32; out (n_seqs,) i32.
//
// v1: one thread block per sequence; each thread scans a strided subset keeping its best
//     (value, index); a shared-memory tree merges them. The order "better(a, b)" is total
//     (numbers above NaN, then larger value, then smaller index), so the result does not depend
//     on how the scan is split.
#include "common.cuh"

#define KVLAB_ARGMAX_THREADS 256

__device__ __forceinline__ bool argmax_better(float va, int ia, float vb, int ib) {
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;  // a number beats NaN
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

extern "C" __global__ void argmax_v1_f32(const float* __restrict__ logits, int* __restrict__ out,
                                         int vocab_size) {
    __shared__ float s_val[KVLAB_ARGMAX_THREADS];
    __shared__ int s_idx[KVLAB_ARGMAX_THREADS];
    const float* row = logits + (long long)blockIdx.x * vocab_size;
    float best_v = KVLAB_NEG_INF;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab_size; i += blockDim.x) {
        const float v = row[i];
        if (best_i == 0x7fffffff || argmax_better(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
    s_val[threadIdx.x] = best_v;
    s_idx[threadIdx.x] = best_i;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float v = s_val[threadIdx.x + stride];
            const int i = s_idx[threadIdx.x + stride];
            if (i != 0x7fffffff &&
                (s_idx[threadIdx.x] == 0x7fffffff ||
                 argmax_better(v, i, s_val[threadIdx.x], s_idx[threadIdx.x]))) {
                s_val[threadIdx.x] = v;
                s_idx[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s_idx[0];
}
