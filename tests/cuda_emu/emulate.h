// Just enough of CUDA C for src/exec/cuda/gather.cu to compile as C++ and run on the CPU, one
// warp at a time, its 32 lanes as fibers that meet at every warp collective (launch.cc).
// Used only by tests/cuda_emulated.rs, so kernels are checked on machines with no GPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct dim3 {
    unsigned int x, y, z;
};
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct float4 {
    float x, y, z, w;
};

template <typename T>
inline T __ldg(const T *p) {
    return *p;
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
// Lanes run one at a time, so plain read-modify-writes are atomic.
template <typename T>
inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
inline unsigned int atomicCAS(unsigned int *p, unsigned int expected, unsigned int v) {
    unsigned int old = *p;
    if (old == expected) *p = v;
    return old;
}
inline void __threadfence() {}
// IEEE round-to-nearest float32 arithmetic, as the device's .rn instructions (the emulator is
// built with -ffp-contract=off, so nothing here is fused either).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
// One rounding, as the device's fma.rn.f32 (and Rust's f32::mul_add).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// IEEE binary16 <-> binary32, round to nearest even (what cvt.rn.f16.f32 does).
inline float strata_f16_to_f32(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    unsigned int u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        u = sign | ((unsigned int)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return __uint_as_float(u);
}
inline unsigned short strata_f32_to_f16(float f) {
    unsigned int u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to infinity
    if (a >= 0x38800000u) {                                          // normal half
        unsigned int r = a - 0x38000000u;
        r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
        return (unsigned short)(sign | r);
    }
    if (a < 0x33000000u) return (unsigned short)sign;  // below half the smallest subnormal
    unsigned int e = a >> 23, man = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;  // 14..24
    unsigned int r = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (unsigned short)(sign | r);
}

// Warp collectives, implemented by the fiber scheduler in launch.cc.
unsigned long long strata_warp_broadcast(unsigned long long v);
bool strata_warp_all(bool pred);
void strata_warp_sync();
unsigned long long strata_warp_shfl(unsigned long long v, unsigned int src);
