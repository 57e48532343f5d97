// strata's CUDA kernels, compiled at run time by NVRTC (once per device architecture).
//
// Gather: one warp gathers one output row at a time. It resolves the row's key (dense: the key
// is the row number; keyed: a probe of the same 64-byte-bucket index the CPU path builds, copied
// to the device as is), then its 32 lanes copy the row, 16 bytes per lane per step when the row
// and output allow it, converting to the output dtype. Misses get the default row (float32) and
// are counted when `counts` is not NULL. A sharded table runs one gather per shard, each writing
// only the rows of the keys its shard owns.
//
// Cache: a set-associative GPU cache of rows in front of host tiers. `probe` serves hits and
// lists misses (into mapped, pinned host memory); the host resolves them in a stream-ordered
// host function; `fill` writes the resolved rows (or defaults) and inserts them; `insert` adds
// rows resolved in the background. Each set has a seqlock: a writer makes its version odd while
// it changes the set; a reader that saw the version change treats the key as a miss.
//
// Every kernel is `extern "C"` and takes one parameter struct by value, laid out exactly as the
// `#[repr(C)]` structs of src/exec/cuda/params.rs. Names: strata_gather_<keys>_<table>_<out>,
// strata_cache_probe_<keys>_<table>_<out>, strata_cache_fill_<table>_<out>,
// strata_cache_insert_<table>.
//
// No CUDA headers are needed (NVRTC compiles this alone). With STRATA_EMULATE defined, the same
// source compiles as C++ for the CPU-side emulator the tests run (tests/cuda_emulated.rs).

#ifdef STRATA_EMULATE
#include "emulate.h"
#else
// Device-side helpers the emulator replaces: half conversion with PTX, warp collectives.
__device__ __forceinline__ float strata_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short strata_f32_to_f16(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
// Lane 0's value, in every lane of the warp (all 32 lanes must call it).
__device__ __forceinline__ unsigned long long strata_warp_broadcast(unsigned long long v) {
    return __shfl_sync(0xffffffffu, v, 0);
}
// Whether `pred` holds in every lane of the warp (all 32 lanes must call it).
__device__ __forceinline__ bool strata_warp_all(bool pred) { return __all_sync(0xffffffffu, pred) != 0; }
__device__ __forceinline__ void strata_warp_sync() { __syncwarp(); }
#endif

struct half16 {
    unsigned short bits;
};
struct bfloat16 {
    unsigned short bits;
};

typedef long long i64;
typedef unsigned long long u64;

// The keyed index's bucket (src/storage/index.rs): five keys, five `row + 1` slots (0 = empty), and
// whether an insert ever moved past this bucket.
struct Bucket {
    u64 keys[5];
    unsigned int rows[5];
    unsigned int overflowed;
};

// src/exec/cuda/params.rs: GatherParams.
struct GatherParams {
    const void *keys;
    i64 key_stride;
    u64 n;
    const void *table;
    u64 rows;
    u64 row_stride;
    const Bucket *buckets;  // NULL: a dense table
    u64 num_buckets;
    const float *default_row;
    void *out;
    i64 out_row_stride;
    i64 out_col_stride;
    u64 *counts;  // [hits, misses] or NULL
    u64 owned_lo;  // dense shards: the rows [owned_lo, owned_hi) this shard holds (table starts at owned_lo)
    u64 owned_hi;
    unsigned int shard;  // keyed shards: this shard, of num_shards (owner = (mix(key) & 0xffffffff) % num_shards)
    unsigned int num_shards;
    unsigned int dim;
    unsigned int pad;
};

// src/exec/cuda/params.rs: CacheParams.
struct CacheParams {
    const void *keys;
    i64 key_stride;
    u64 n;
    void *out;
    i64 out_row_stride;
    i64 out_col_stride;
    u64 *slot_keys;             // [sets * WAYS]
    unsigned int *slot_used;    // [sets * WAYS]: 0 = empty, else the tick of its last use
    unsigned int *set_version;  // [sets]: odd while a writer changes the set
    void *vectors;              // [sets * WAYS, dim] in the table's dtype
    u64 sets;
    const float *default_row;
    u64 *counters;              // device memory: [hits, misses]
    u64 *miss_keys;             // mapped host memory: canonical keys of the misses
    u64 *miss_index;            // mapped host memory: their positions in keys/out
    const float *rows;          // mapped host memory: resolved rows of the misses (float32)
    const unsigned int *found;  // mapped host memory: whether each miss was resolved
    const unsigned int *control;  // mapped host memory: [0] = FILL_ROWS or FILL_DEFAULTS
    unsigned int dim;
    unsigned int tick;
};

#define STRATA_WAYS 8u
#define STRATA_FILL_ROWS 0u
#define STRATA_FILL_DEFAULTS 1u

__device__ __forceinline__ u64 mix(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
}

// The row of canonical key `key` in a keyed index, or -1.
__device__ __forceinline__ i64 probe_index(const Bucket *buckets, u64 num_buckets, u64 key) {
    u64 b = __umul64hi(mix(key), num_buckets);
    for (u64 probes = 0; probes < num_buckets; probes++) {
        const Bucket &bk = buckets[b];
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
        b = b + 1 == num_buckets ? 0 : b + 1;
    }
    return -1;
}

__device__ __forceinline__ float load(const float *p) { return *p; }
__device__ __forceinline__ float load(const half16 *p) { return strata_f16_to_f32(p->bits); }
__device__ __forceinline__ float load(const bfloat16 *p) { return __uint_as_float((unsigned int)p->bits << 16); }
__device__ __forceinline__ void store(float *p, float v) { *p = v; }
__device__ __forceinline__ void store(half16 *p, float v) { p->bits = strata_f32_to_f16(v); }
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

// Copies one row of `dim` values from `src` to `dst` (output column stride `cs`) with the lanes
// of a warp, 16 bytes per lane per step when both are float32, contiguous and aligned.
template <typename T, typename O>
__device__ __forceinline__ void copy_row(const T *src, O *dst, unsigned int dim, i64 cs, unsigned int lane) {
    const bool wide = sizeof(T) == 4 && sizeof(O) == 4 && cs == 1 && (dim & 3u) == 0 &&
                      (((size_t)src | (size_t)dst) & 15u) == 0;
    if (wide) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        for (unsigned int c = lane; c < dim / 4; c += 32) {
            d4[c] = __ldg(&s4[c]);
        }
    } else {
        for (unsigned int c = lane; c < dim; c += 32) {
            store(&dst[(i64)c * cs], load(&src[c]));
        }
    }
}

__device__ __forceinline__ unsigned int lane_id() { return threadIdx.x & 31u; }
__device__ __forceinline__ u64 warp_id() { return ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ u64 warp_count() { return ((u64)gridDim.x * blockDim.x) >> 5; }

template <typename K, typename T, typename O>
__device__ void gather(const GatherParams p) {
    const K *keys = static_cast<const K *>(p.keys);
    const T *table = static_cast<const T *>(p.table);
    O *out = static_cast<O *>(p.out);
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    unsigned int hits = 0, misses = 0;
    for (u64 i = warp_id(); i < p.n; i += warps) {
        const u64 key = canonical<K>(keys[(i64)i * p.key_stride]);
        i64 row;
        if (p.buckets == nullptr) {
            if (key >= p.owned_lo && key < p.owned_hi) {
                row = (i64)(key - p.owned_lo);
            } else if (key >= p.rows && p.shard == 0) {
                row = -1;  // outside the table: shard 0 writes the default
            } else {
                continue;  // another shard's row
            }
        } else {
            if (p.num_shards > 1 && (unsigned int)((mix(key) & 0xffffffffULL) % p.num_shards) != p.shard) {
                continue;
            }
            row = probe_index(p.buckets, p.num_buckets, key);
        }
        O *dst = out + (i64)i * p.out_row_stride;
        if (row >= 0) {
            copy_row<T, O>(table + (u64)row * p.row_stride, dst, p.dim, p.out_col_stride, lane);
            hits += lane == 0;
        } else {
            copy_row<float, O>(p.default_row, dst, p.dim, p.out_col_stride, lane);
            misses += lane == 0;
        }
    }
    if (p.counts != nullptr && lane == 0 && (hits | misses) != 0) {
        atomicAdd(&p.counts[0], (u64)hits);
        atomicAdd(&p.counts[1], (u64)misses);
    }
}

__device__ __forceinline__ u64 cache_set(u64 key, u64 sets) { return __umul64hi(mix(key), sets); }

// Serves the hits of `keys` from the cache and lists the misses for the host.
template <typename K, typename T, typename O>
__device__ void cache_probe(const CacheParams p) {
    const K *keys = static_cast<const K *>(p.keys);
    const T *vectors = static_cast<const T *>(p.vectors);
    O *out = static_cast<O *>(p.out);
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    unsigned int hits = 0;
    for (u64 i = warp_id(); i < p.n; i += warps) {
        const u64 key = canonical<K>(keys[(i64)i * p.key_stride]);
        const u64 set = cache_set(key, p.sets);
        const volatile unsigned int *version = &p.set_version[set];
        // Lane 0 reads the set's version and finds the key; the warp follows its decision.
        u64 v1 = 1, found = ~0ULL;
        if (lane == 0 && p.sets != 0) {
            v1 = *version;
            __threadfence();
            if ((v1 & 1u) == 0) {
                for (unsigned int w = 0; w < STRATA_WAYS; w++) {
                    const u64 slot = set * STRATA_WAYS + w;
                    if (p.slot_used[slot] != 0 && p.slot_keys[slot] == key) {
                        found = slot;
                        break;
                    }
                }
            }
        }
        v1 = strata_warp_broadcast(v1);
        found = strata_warp_broadcast(found);
        bool hit = false;
        if (found != ~0ULL) {
            copy_row<T, O>(vectors + found * p.dim, out + (i64)i * p.out_row_stride, p.dim, p.out_col_stride, lane);
            __threadfence();
            hit = strata_warp_all(*version == (unsigned int)v1);
            if (hit && lane == 0) {
                p.slot_used[found] = p.tick;
            }
        }
        if (hit) {
            hits += lane == 0;
        } else if (lane == 0) {
            const u64 at = atomicAdd(&p.counters[1], 1ULL);
            p.miss_keys[at] = key;
            p.miss_index[at] = i;
        }
    }
    if (lane == 0 && hits != 0) {
        atomicAdd(&p.counters[0], (u64)hits);
    }
}

// Inserts `row` (float32) for `key` into its set, replacing the least recently used way. Gives
// up when another writer holds the set: caching is best effort.
template <typename T>
__device__ void cache_insert_row(const CacheParams &p, u64 key, const float *row, unsigned int lane) {
    const u64 set = cache_set(key, p.sets);
    unsigned int *version = &p.set_version[set];
    // Lane 0 takes the set's lock (odd version) and picks the way; the warp follows.
    u64 victim = ~0ULL;
    if (lane == 0) {
        const unsigned int v = *(volatile unsigned int *)version;
        if ((v & 1u) == 0 && atomicCAS(version, v, v + 1u) == v) {
            __threadfence();
            unsigned int oldest = 0xffffffffu;
            for (unsigned int w = 0; w < STRATA_WAYS; w++) {
                const u64 slot = set * STRATA_WAYS + w;
                const unsigned int used = p.slot_used[slot];
                if (used != 0 && p.slot_keys[slot] == key) {
                    victim = slot;
                    break;
                }
                if (used < oldest) {
                    oldest = used;
                    victim = slot;
                }
            }
        }
    }
    victim = strata_warp_broadcast(victim);
    if (victim == ~0ULL) {
        return;  // another writer holds the set
    }
    T *dst = static_cast<T *>(p.vectors) + victim * p.dim;
    for (unsigned int c = lane; c < p.dim; c += 32) {
        store(&dst[c], row[c]);
    }
    strata_warp_sync();
    if (lane == 0) {
        p.slot_keys[victim] = key;
        p.slot_used[victim] = p.tick;
        __threadfence();
        atomicAdd(version, 1u);
    }
}

// Writes the rows the host resolved for the misses (or the default row) into out, and inserts
// the resolved ones into the cache unless the host chose to insert them in the background.
template <typename T, typename O>
__device__ void cache_fill(const CacheParams p) {
    O *out = static_cast<O *>(p.out);
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    const u64 m = *(volatile u64 *)&p.counters[1];
    const bool rows_ready = p.control[0] == STRATA_FILL_ROWS;
    for (u64 j = warp_id(); j < m; j += warps) {
        const u64 i = p.miss_index[j];
        O *dst = out + (i64)i * p.out_row_stride;
        if (rows_ready && p.found[j] != 0) {
            const float *row = p.rows + j * p.dim;
            copy_row<float, O>(row, dst, p.dim, p.out_col_stride, lane);
            if (p.sets != 0) {
                cache_insert_row<T>(p, p.miss_keys[j], row, lane);
            }
        } else {
            copy_row<float, O>(p.default_row, dst, p.dim, p.out_col_stride, lane);
        }
    }
}

// Inserts `n` resolved rows (keys in miss_keys, rows, found) into the cache.
template <typename T>
__device__ void cache_insert(const CacheParams p) {
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    for (u64 j = warp_id(); j < p.n; j += warps) {
        if (p.found[j] != 0) {
            cache_insert_row<T>(p, p.miss_keys[j], p.rows + j * p.dim, lane);
        }
    }
}

#define STRATA_KERNELS(KN, K, TN, T, ON, O)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) strata_gather_##KN##_##TN##_##ON(const GatherParams p) { \
        gather<K, T, O>(p);                                                                                    \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        strata_cache_probe_##KN##_##TN##_##ON(const CacheParams p) {                                          \
        cache_probe<K, T, O>(p);                                                                               \
    }

#define STRATA_KERNELS_OUT(KN, K, TN, T)             \
    STRATA_KERNELS(KN, K, TN, T, f32, float)         \
    STRATA_KERNELS(KN, K, TN, T, f16, half16)        \
    STRATA_KERNELS(KN, K, TN, T, bf16, bfloat16)

#define STRATA_KERNELS_TABLE(KN, K)                  \
    STRATA_KERNELS_OUT(KN, K, f32, float)            \
    STRATA_KERNELS_OUT(KN, K, f16, half16)           \
    STRATA_KERNELS_OUT(KN, K, bf16, bfloat16)

STRATA_KERNELS_TABLE(i32, int)
STRATA_KERNELS_TABLE(i64, i64)
STRATA_KERNELS_TABLE(u32, unsigned int)
STRATA_KERNELS_TABLE(u64, u64)

#define STRATA_FILL(TN, T, ON, O)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) strata_cache_fill_##TN##_##ON(const CacheParams p) {   \
        cache_fill<T, O>(p);                                                                                   \
    }

#define STRATA_FILL_OUT(TN, T)                                                                                 \
    STRATA_FILL(TN, T, f32, float)                                                                             \
    STRATA_FILL(TN, T, f16, half16)                                                                            \
    STRATA_FILL(TN, T, bf16, bfloat16)                                                                         \
    extern "C" __global__ void __launch_bounds__(256) strata_cache_insert_##TN(const CacheParams p) {         \
        cache_insert<T>(p);                                                                                    \
    }

STRATA_FILL_OUT(f32, float)
STRATA_FILL_OUT(f16, half16)
STRATA_FILL_OUT(bf16, bfloat16)
