// cuda_emu.h: just enough of CUDA for kvlab's kernels (../../kernels/*.cu, unmodified) to compile
// as host C++ and run on the CPU, one fiber per CUDA thread (runtime.cpp).
//
// * Each CUDA thread is a fiber on the launching host thread (runtime.cpp); threadIdx and
//   blockIdx are the running fiber's.
// * One thread block runs at a time, its threads concurrently, so `__shared__` is a
//   function-local `static`: shared by the threads of the running block, reused by the next.
// * __syncthreads is a barrier of the block's threads still running the kernel (a thread that
//   returned no longer counts, as on the device); the warp functions (__shfl_*_sync,
//   __any_sync) exchange through a per-warp slot array between two barriers of the warp.
// * __half, __nv_bfloat16 and __nv_fp8_e4m3 are their bit patterns, converted in software with
//   round-to-nearest-even as the device does (fp8: saturating to ±448, NaN kept).
// * Floating point is the host's IEEE f32, built with -ffp-contract=off, so a*b+c is never
//   fused (the device may fuse it: NVRTC's default --fmad=true; where bits matter the kernels
//   use the __f*_rn intrinsics, which neither fuses); expf and friends are the host's, a few ulp
//   from the device's, within the tests' tolerances.
#ifndef KVLAB_CUDA_EMU_H
#define KVLAB_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct dim3 {
    unsigned int x, y, z;
};

namespace kvlab_emu {
extern dim3 thread_idx;
extern dim3 block_idx;
extern dim3 block_dim;
extern dim3 grid_dim;
void sync_block();
// Every live lane of the caller's warp publishes `bits`; returns lane `src`'s (the caller's own
// when `src` is out of range or not live).
uint32_t warp_exchange(uint32_t bits, int src);
// Whether any live lane of the caller's warp passed a nonzero `pred`.
bool warp_any(bool pred);
inline int lane() {
    const unsigned int linear =
        thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z);
    return (int)(linear % 32u);
}
template <typename T>
inline uint32_t to_bits(T v) {
    static_assert(sizeof(T) == 4, "the emulated shuffles move 4-byte values");
    uint32_t b;
    memcpy(&b, &v, 4);
    return b;
}
template <typename T>
inline T from_bits(uint32_t b) {
    T v;
    memcpy(&v, &b, 4);
    return v;
}
}  // namespace kvlab_emu

#define threadIdx (::kvlab_emu::thread_idx)
#define blockIdx (::kvlab_emu::block_idx)
#define blockDim (::kvlab_emu::block_dim)
#define gridDim (::kvlab_emu::grid_dim)

inline void __syncthreads() { kvlab_emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned int, T v, int lane_mask) {
    const int src = kvlab_emu::lane() ^ lane_mask;
    return kvlab_emu::from_bits<T>(kvlab_emu::warp_exchange(kvlab_emu::to_bits(v), src));
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T v, unsigned int delta) {
    const int src = kvlab_emu::lane() + (int)delta;
    return kvlab_emu::from_bits<T>(
        kvlab_emu::warp_exchange(kvlab_emu::to_bits(v), src < 32 ? src : -1));
}
template <typename T>
inline T __shfl_sync(unsigned int, T v, int src_lane) {
    return kvlab_emu::from_bits<T>(kvlab_emu::warp_exchange(kvlab_emu::to_bits(v), src_lane));
}
inline int __any_sync(unsigned int, int pred) { return kvlab_emu::warp_any(pred != 0) ? 1 : 0; }

// ---- integer and float helpers the device has as built-ins ----
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
using std::isinf;
using std::isnan;

inline float __int_as_float(int i) { return kvlab_emu::from_bits<float>((uint32_t)i); }
inline int __float_as_int(float f) { return (int)kvlab_emu::to_bits(f); }
// The _rn intrinsics: one IEEE operation, rounded to nearest-even, never fused.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// ---- 16-bit floats ----
struct __half {
    uint16_t __x;
};
struct __nv_bfloat16 {
    uint16_t __x;
};

// f32 -> IEEE binary16, round to nearest-even; overflow to infinity, NaN to 0x7fff (sign kept).
inline __half __float2half_rn(float f) {
    const uint32_t x = kvlab_emu::to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t abs = x & 0x7fffffffu;
    __half h;
    if (abs > 0x7f800000u) {  // NaN
        h.__x = (uint16_t)(sign | 0x7fffu);
        return h;
    }
    if (abs >= 0x477ff000u) {  // rounds to 65520 or more: infinity
        h.__x = (uint16_t)(sign | 0x7c00u);
        return h;
    }
    if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
        if (abs < 0x33000000u) {  // below 2^-25: rounds to zero (2^-25 itself ties to even 0)
            h.__x = sign;
            return h;
        }
        // value = mant · 2^(E − 150) with E the biased exponent; in units of 2^-24 that is
        // mant · 2^(E − 126), a right shift by 126 − E (14..24) with nearest-even rounding.
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(abs >> 23);
        const uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half_way = 1u << (shift - 1);
        const uint32_t r = q + ((rem > half_way || (rem == half_way && (q & 1u))) ? 1u : 0u);
        h.__x = (uint16_t)(sign | r);
        return h;
    }
    // normal: rebias the exponent from 127 to 15, keep 10 mantissa bits, round to nearest-even
    uint32_t r = abs - (112u << 23);  // exponent - 112
    const uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    h.__x = (uint16_t)(sign | (r >> 13));
    return h;
}
inline float __half2float(__half h) {
    const uint32_t sign = ((uint32_t)h.__x & 0x8000u) << 16;
    const uint32_t e = (h.__x >> 10) & 0x1fu;
    const uint32_t m = h.__x & 0x3ffu;
    if (e == 0) {  // zero or subnormal: m · 2^-24
        const float v = (float)m * 5.9604644775390625e-08f;
        return kvlab_emu::from_bits<float>(kvlab_emu::to_bits(v) | sign);
    }
    if (e == 31) return kvlab_emu::from_bits<float>(sign | 0x7f800000u | (m << 13));
    return kvlab_emu::from_bits<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// f32 -> bfloat16, round to nearest-even; NaN to 0x7fff (sign kept).
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t x = kvlab_emu::to_bits(f);
    __nv_bfloat16 b;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        b.__x = (uint16_t)(((x >> 16) & 0x8000u) | 0x7fffu);
        return b;
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    b.__x = (uint16_t)(x >> 16);
    return b;
}
inline float __bfloat162float(__nv_bfloat16 b) {
    return kvlab_emu::from_bits<float>((uint32_t)b.__x << 16);
}

// ---- fp8 e4m3 (OCP / NVIDIA E4M3: bias 7, no infinity, S.1111.111 is NaN, max ±448) ----
namespace kvlab_emu {
// The value of non-negative code c (0..=126).
inline float e4m3_value(int c) {
    const int e = c >> 3, m = c & 7;
    return e == 0 ? (float)m * 0.001953125f  // m · 2^-9
                  : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}
}  // namespace kvlab_emu
struct __nv_fp8_e4m3 {
    uint8_t __x;
    __nv_fp8_e4m3() = default;
    // Nearest code, ties to the even code, saturating to ±448 (__NV_SATFINITE); NaN -> 0x7f.
    explicit __nv_fp8_e4m3(float f) {
        if (std::isnan(f)) {
            __x = 0x7f;
            return;
        }
        const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
        const float a = fabsf(f);
        int lo = 0, hi = 126;  // the largest code whose value is <= a
        if (a >= 448.0f) {
            __x = (uint8_t)(sign | 126);
            return;
        }
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (kvlab_emu::e4m3_value(mid) <= a) lo = mid; else hi = mid - 1;
        }
        int c = lo;
        const float below = kvlab_emu::e4m3_value(lo), above = kvlab_emu::e4m3_value(lo + 1);
        if (a - below > above - a || (a - below == above - a && (lo & 1))) c = lo + 1;
        __x = (uint8_t)(sign | c);
    }
    explicit operator float() const {
        const int c = __x & 0x7f;
        if (c == 0x7f) return NAN;
        const float v = kvlab_emu::e4m3_value(c);
        return (__x & 0x80) ? -v : v;
    }
};

#endif  // KVLAB_CUDA_EMU_H
