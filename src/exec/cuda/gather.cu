// strata's CUDA gather kernels, compiled at run time by NVRTC (once per device).
//
// One warp gathers one output row at a time: it resolves the row's key (dense: the key is the
// row number; keyed: a probe of the same 64-byte-bucket index the CPU path builds, copied to the
// device as is), then its 32 lanes copy the row, 16 bytes per lane per step when the row and
// output allow it, converting to the output dtype. Misses get the default row (float32) and are
// counted when `counts` is not NULL. Every kernel is `extern "C"` and named
// strata_gather_<keys>_<table>_<out>, e.g. strata_gather_i64_f32_bf16.

// No CUDA headers are needed (NVRTC compiles this alone): half and bfloat16 are 16-bit storage
// types converted with PTX instructions (half) or bit arithmetic (bfloat16, round to nearest even).
struct half16 {
    unsigned short bits;
};
struct bfloat16 {
    unsigned short bits;
};

typedef long long i64;
typedef unsigned long long u64;

// The keyed index's bucket (src/index.rs): five keys, five `row + 1` slots (0 = empty), and
// whether an insert ever moved past this bucket.
struct Bucket {
    u64 keys[5];
    unsigned int rows[5];
    unsigned int overflowed;
};

struct Index {
    const Bucket *buckets;  // NULL: a dense table
    u64 num_buckets;
};

__device__ __forceinline__ u64 mix(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
}

// The row of canonical key `key`, or -1.
__device__ __forceinline__ i64 find_row(const Index ix, u64 rows, u64 key) {
    if (ix.buckets == nullptr) {
        return key < rows ? (i64)key : -1;
    }
    u64 b = __umul64hi(mix(key), ix.num_buckets);
    for (u64 probes = 0; probes < ix.num_buckets; probes++) {
        const Bucket &bk = ix.buckets[b];
        bool any_free = false;
#pragma unroll
        for (int s = 0; s < 5; s++) {
            unsigned int r = bk.rows[s];
            if (r == 0) {
                any_free = true;
            } else if (bk.keys[s] == key) {
                return (i64)r - 1;
            }
        }
        if (any_free || bk.overflowed == 0) {
            return -1;
        }
        b = b + 1 == ix.num_buckets ? 0 : b + 1;
    }
    return -1;
}

__device__ __forceinline__ float load(const float *p) { return *p; }
__device__ __forceinline__ float load(const half16 *p) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));
    return f;
}
__device__ __forceinline__ float load(const bfloat16 *p) { return __uint_as_float((unsigned int)p->bits << 16); }
__device__ __forceinline__ void store(float *p, float v) { *p = v; }
__device__ __forceinline__ void store(half16 *p, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p->bits = h;
}
__device__ __forceinline__ void store(bfloat16 *p, float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p->bits = (unsigned short)((u >> 16) | 0x40u);  // quiet NaN, sign kept
    } else {
        p->bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

template <typename K>
__device__ __forceinline__ u64 canonical(K k);
template <> __device__ __forceinline__ u64 canonical<int>(int k) { return (u64)(i64)k; }
template <> __device__ __forceinline__ u64 canonical<i64>(i64 k) { return (u64)k; }
template <> __device__ __forceinline__ u64 canonical<unsigned int>(unsigned int k) { return (u64)k; }
template <> __device__ __forceinline__ u64 canonical<u64>(u64 k) { return k; }

// keys: n keys at keys[i * key_stride]; table: rows x dim at table[r * row_stride + c];
// out: row i at out[i * out_row_stride + c * out_col_stride] (strides in elements).
// counts (may be NULL): [0] += hits, [1] += misses.
template <typename K, typename T, typename O>
__device__ void gather(const K *__restrict__ keys, i64 key_stride, u64 n, const T *__restrict__ table,
                       u64 rows, u64 row_stride, unsigned int dim, const Index ix,
                       const float *__restrict__ default_row, O *__restrict__ out, i64 out_row_stride,
                       i64 out_col_stride, u64 *counts) {
    const unsigned int lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    unsigned int hits = 0, misses = 0;
    for (u64 i = warp; i < n; i += warps) {
        const u64 key = canonical<K>(keys[(i64)i * key_stride]);
        const i64 row = find_row(ix, rows, key);
        O *dst = out + (i64)i * out_row_stride;
        if (row >= 0) {
            const T *src = table + (u64)row * row_stride;
            const bool wide = sizeof(T) == 4 && sizeof(O) == 4 && out_col_stride == 1 && (dim & 3u) == 0 &&
                              (((size_t)src | (size_t)dst) & 15u) == 0;
            if (wide) {
                const float4 *s4 = reinterpret_cast<const float4 *>(src);
                float4 *d4 = reinterpret_cast<float4 *>(dst);
                for (unsigned int c = lane; c < dim / 4; c += 32) {
                    d4[c] = __ldg(&s4[c]);
                }
            } else {
                for (unsigned int c = lane; c < dim; c += 32) {
                    store(&dst[(i64)c * out_col_stride], load(&src[c]));
                }
            }
            hits += lane == 0;
        } else {
            for (unsigned int c = lane; c < dim; c += 32) {
                store(&dst[(i64)c * out_col_stride], default_row[c]);
            }
            misses += lane == 0;
        }
    }
    if (counts != nullptr && lane == 0 && (hits | misses) != 0) {
        atomicAdd(&counts[0], (u64)hits);
        atomicAdd(&counts[1], (u64)misses);
    }
}

#define STRATA_GATHER(KN, K, TN, T, ON, O)                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                  \
        strata_gather_##KN##_##TN##_##ON(const K *keys, i64 key_stride, u64 n, const T *table, u64 rows, \
                                        u64 row_stride, unsigned int dim, const Bucket *buckets,         \
                                        u64 num_buckets, const float *default_row, O *out,               \
                                        i64 out_row_stride, i64 out_col_stride, u64 *counts) {           \
        Index ix = {buckets, num_buckets};                                                              \
        gather<K, T, O>(keys, key_stride, n, table, rows, row_stride, dim, ix, default_row, out,         \
                        out_row_stride, out_col_stride, counts);                                        \
    }

#define STRATA_GATHER_OUT(KN, K, TN, T)                 \
    STRATA_GATHER(KN, K, TN, T, f32, float)             \
    STRATA_GATHER(KN, K, TN, T, f16, half16)            \
    STRATA_GATHER(KN, K, TN, T, bf16, bfloat16)

#define STRATA_GATHER_TABLE(KN, K)                      \
    STRATA_GATHER_OUT(KN, K, f32, float)                \
    STRATA_GATHER_OUT(KN, K, f16, half16)               \
    STRATA_GATHER_OUT(KN, K, bf16, bfloat16)

STRATA_GATHER_TABLE(i32, int)
STRATA_GATHER_TABLE(i64, i64)
STRATA_GATHER_TABLE(u32, unsigned int)
STRATA_GATHER_TABLE(u64, u64)
