// Embedding gather: x[t, :] = table[ids[t], :] · scale.
//
// x (n_tokens, dim) f32 residual stream; table (vocab_size, dim) in the weight type; ids
// (n_tokens,) i32 (checked < vocab_size on the host); scale = Config::embed_scale.
//
// v1: one thread block per token, threads stride over dim (coalesced row copy). A gather is pure
//     memory traffic; nothing to gain beyond coalescing, so there is no v2.
#include "common.cuh"

template <typename W>
__device__ void embedding_v1(float* __restrict__ x, const W* __restrict__ table,
                             const int* __restrict__ ids, int dim, float scale) {
    const long long t = blockIdx.x;
    const W* row = table + (long long)ids[t] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) x[t * dim + i] = to_float(row[i]) * scale;
}

extern "C" __global__ void embedding_v1_f32(float* x, const float* table, const int* ids, int dim,
                                            float scale) {
    embedding_v1<float>(x, table, ids, dim, scale);
}
extern "C" __global__ void embedding_v1_f16(float* x, const __half* table, const int* ids, int dim,
                                            float scale) {
    embedding_v1<__half>(x, table, ids, dim, scale);
}
