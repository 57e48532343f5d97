// strata's CUDA kernels, compiled at run time by NVRTC (once per device architecture).
//
// Gather: one warp gathers one output row at a time. It resolves the row's key (dense: the key
// is the row number; keyed: a probe of the same 64-byte-bucket index the CPU path builds, copied
// to the device as is), then its 32 lanes copy the row, 16 bytes per lane per step when the row
// and output allow it, converting to the output dtype (quantized rows: int8, int4 and fp8 are
// dequantized as they are read, see Row<T>). Misses get the default row (float32) and
// are counted when `counts` is not NULL. A sharded table runs one gather per shard, each writing
// only the rows of the keys its shard owns.
//
// Cache: a set-associative GPU cache of rows in front of host tiers. `probe` serves hits and
// lists misses (into mapped, pinned host memory); the host resolves them in a stream-ordered
// host function; `fill` writes the resolved rows (or defaults) and inserts them; `insert` adds
// rows resolved in the background. Each set has a seqlock: a writer makes its version odd while
// it changes the set; a reader that saw the version change treats the key as a miss.
//
// Pooled: one warp pools one bag at a time. Its 32 lanes resolve 32 keys of the bag at once (one
// each, through the same probe as the gather), then take them in key order, handed round by
// shuffles, each lane adding w * row (quantized rows dequantized inside this loop, never copied
// first) into the float32 accumulators of its columns. Adds,
// multiplies, divisions and square roots are IEEE round-to-nearest (never fused), so a bag's row
// equals the CPU path's bit for bit. Offsets left in device memory are checked as they are read:
// a bad one sets `status` and its bag is clamped into the keys. `strata_pool_rows` pools rows a
// gather already wrote (cache and shard placements). `strata_batch` runs many requests (plain or
// pooled, any dtypes, static or mapped tables) in one launch: its warps take work items (bags, or
// keys of plain requests) over all of them.
//
// Every kernel is `extern "C"` and takes one parameter struct by value, laid out exactly as the
// `#[repr(C)]` structs of src/exec/cuda/params.rs. Names: strata_gather_<keys>_<table>_<out>,
// strata_cache_probe_<keys>_<table>_<out>, strata_cache_fill_<table>_<out>,
// strata_cache_insert_<table>, strata_pooled_<table>, strata_pool_rows, strata_batch (the pooled
// and batch kernels take key and out dtypes as runtime codes: they are read and written off the
// inner loop, and one instantiation per table dtype keeps the module small). <table> is f32, f16,
// bf16, int8, int4 or fp8; quantized tables have no cache kernels (a cache of them holds float32).
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
// Lane `src`'s value, in every lane of the warp (all 32 lanes must call it).
__device__ __forceinline__ unsigned long long strata_warp_shfl(unsigned long long v, unsigned int src) {
    return __shfl_sync(0xffffffffu, v, (int)src);
}
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

// src/exec/cuda/params.rs: PooledParams.
struct PooledParams {
    GatherParams src;  // the table (one source, no shards): only its table fields are read
    const void *keys;
    i64 key_stride;
    u64 nnz;
    const void *offsets;  // bags + 1 offsets, or NULL: bag b is keys [b * hotness, (b + 1) * hotness)
    i64 offsets_stride;
    u64 hotness;
    const float *weights;  // NULL: every weight is 1
    i64 weight_stride;
    const float *rows;  // strata_pool_rows: key j's row (float32) at rows + j * dim
    u64 bags;
    void *out;
    i64 out_row_stride;
    i64 out_col_stride;
    u64 *counts;           // [hits, misses] or NULL
    unsigned int *status;  // set to 1 on invalid offsets, or NULL
    u64 first;             // strata_batch: this request's first work item
    unsigned int pooling;  // 0 plain (batch only), 1 sum, 2 mean, 3 sqrtn
    unsigned int offsets_wide;
    unsigned int key_dtype;  // 0 i32, 1 i64, 2 u32, 3 u64
    unsigned int table_dtype;  // strata_batch: 0 f32, 1 f16, 2 bf16, 3 int8, 4 int4, 5 fp8
    unsigned int out_dtype;  // 0 f32, 1 f16, 2 bf16
    unsigned int dim;
};

// src/exec/cuda/params.rs: BatchParams.
struct BatchParams {
    const PooledParams *items;  // sorted by `first`, each with at least one work item
    u64 count;
    u64 total;
};

// Every kernel runs in blocks of STRATA_BLOCK threads (src/exec/cuda/backend.rs: BLOCK) and asks
// ptxas for registers that let at least STRATA_MIN_BLOCKS blocks share a multiprocessor (at most
// 64 registers a thread: 50% occupancy or more). Without the minimum, ptxas spilled a few
// registers of the gathers to local memory; tests/cuda.rs runs ptxas for sm_90 and fails on spills.
#define STRATA_BLOCK 256
#define STRATA_MIN_BLOCKS 4
#define STRATA_BOUNDS __launch_bounds__(STRATA_BLOCK, STRATA_MIN_BLOCKS)

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

// Quantized rows (src/kernels/format.rs: RowFormat), read as bytes: a table of them is an array
// of these one-byte tags, so `table + row * row_stride` counts bytes. Row<T> below gives their
// values exactly as the scalar reference `format::value` does.
// int8: `dim` uint8, then float32 scale and bias; value fmaf(q, scale, bias), one rounding.
struct int8_row {
    unsigned char b;
};
// int4: `dim / 2` bytes (element 2i in the low nibble of byte i), then float16 scale and bias;
// value fmaf(q, scale, bias).
struct int4_row {
    unsigned char b;
};
// fp8: `dim` float8 e4m3fn codes, then a float32 scale; value float(e) * scale.
struct fp8_row {
    unsigned char b;
};

// Little-endian values at any byte address: a quantized row's parameters follow its values, so
// they are aligned only for some dims.
__device__ __forceinline__ unsigned int le32(const unsigned char *p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24);
}
__device__ __forceinline__ unsigned short le16(const unsigned char *p) {
    return (unsigned short)((unsigned int)p[0] | ((unsigned int)p[1] << 8));
}

// An e4m3fn code widened to float32, exactly (no subnormal float32 on the way): subnormal codes
// are m * 2^-9, normal ones get their exponent rebiased (7 -> 127). 0x7F, e4m3fn's NaN, which
// the quantizer never writes, reads as 480, as on the CPU.
__device__ __forceinline__ float e4m3_to_f32(unsigned int e) {
    const unsigned int exp = (e >> 3) & 15u, man = e & 7u;
    const float mag = exp == 0 ? __fmul_rn((float)man, 0.001953125f) : __uint_as_float(((exp + 120u) << 23) | (man << 20));
    return (e & 0x80u) != 0 ? -mag : mag;
}

// Values of one row of a table of T (`dim` values at `row`), in float32.
template <typename T>
struct Row {
    const T *p;
    __device__ __forceinline__ Row(const T *row, unsigned int) : p(row) {}
    __device__ __forceinline__ float at(unsigned int c) const { return load(&p[c]); }
};
template <>
struct Row<int8_row> {
    const unsigned char *p;
    float scale, bias;
    __device__ __forceinline__ Row(const int8_row *row, unsigned int dim)
        : p(reinterpret_cast<const unsigned char *>(row)),
          scale(__uint_as_float(le32(p + dim))),
          bias(__uint_as_float(le32(p + dim + 4))) {}
    __device__ __forceinline__ float at(unsigned int c) const { return __fmaf_rn((float)p[c], scale, bias); }
};
template <>
struct Row<int4_row> {
    const unsigned char *p;
    float scale, bias;
    __device__ __forceinline__ Row(const int4_row *row, unsigned int dim)
        : p(reinterpret_cast<const unsigned char *>(row)),
          scale(strata_f16_to_f32(le16(p + (dim + 1) / 2))),
          bias(strata_f16_to_f32(le16(p + (dim + 1) / 2 + 2))) {}
    __device__ __forceinline__ float at(unsigned int c) const {
        return __fmaf_rn((float)(((unsigned int)p[c >> 1] >> ((c & 1u) * 4u)) & 15u), scale, bias);
    }
};
template <>
struct Row<fp8_row> {
    const unsigned char *p;
    float scale;
    __device__ __forceinline__ Row(const fp8_row *row, unsigned int dim)
        : p(reinterpret_cast<const unsigned char *>(row)), scale(__uint_as_float(le32(p + dim))) {}
    __device__ __forceinline__ float at(unsigned int c) const { return __fmul_rn(e4m3_to_f32(p[c]), scale); }
};

template <typename K>
__device__ __forceinline__ u64 canonical(K k);
template <> __device__ __forceinline__ u64 canonical<int>(int k) { return (u64)(i64)k; }
template <> __device__ __forceinline__ u64 canonical<i64>(i64 k) { return (u64)k; }
template <> __device__ __forceinline__ u64 canonical<unsigned int>(unsigned int k) { return (u64)k; }
template <> __device__ __forceinline__ u64 canonical<u64>(u64 k) { return k; }

// Copies one row of `dim` values from `src` to `dst` (output column stride `cs`) with the lanes
// of a warp, 16 bytes per lane per step when both are float32, contiguous and aligned; quantized
// rows are dequantized on the way.
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
        const Row<T> row(src, dim);
        for (unsigned int c = lane; c < dim; c += 32) {
            store(&dst[(i64)c * cs], row.at(c));
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

// Columns each lane accumulates per pass over a bag's keys (a pass covers 32 * this many).
#define STRATA_POOL_COLS 8u

// The row of canonical key `key` in a table of one source (no shards), or -1.
__device__ __forceinline__ i64 find_row(const GatherParams &t, u64 key) {
    if (t.buckets == nullptr) {
        return key < t.rows ? (i64)key : -1;
    }
    return probe_index(t.buckets, t.num_buckets, key);
}

// Key `j` of `p` in canonical form (the key dtype is a runtime code: reading it is off the hot loop).
__device__ __forceinline__ u64 key_at(const PooledParams &p, u64 j) {
    const i64 at = (i64)j * p.key_stride;
    switch (p.key_dtype) {
        case 0: return canonical<int>(static_cast<const int *>(p.keys)[at]);
        case 1: return canonical<i64>(static_cast<const i64 *>(p.keys)[at]);
        case 2: return canonical<unsigned int>(static_cast<const unsigned int *>(p.keys)[at]);
        default: return canonical<u64>(static_cast<const u64 *>(p.keys)[at]);
    }
}

// Writes `v` as element `at` of out (the out dtype is a runtime code).
__device__ __forceinline__ void store_out(const PooledParams &p, i64 at, float v) {
    switch (p.out_dtype) {
        case 0: store(&static_cast<float *>(p.out)[at], v); break;
        case 1: store(&static_cast<half16 *>(p.out)[at], v); break;
        default: store(&static_cast<bfloat16 *>(p.out)[at], v); break;
    }
}

__device__ __forceinline__ i64 offset_at(const PooledParams &p, u64 i) {
    const i64 at = (i64)i * p.offsets_stride;
    return p.offsets_wide ? static_cast<const i64 *>(p.offsets)[at] : (i64) static_cast<const int *>(p.offsets)[at];
}

// The keys [start, end) of bag `b`. Offsets that break the rules (first 0, non-decreasing, last
// nnz) set `status`; the bag is then clamped into [0, nnz].
__device__ __forceinline__ void bag_range(const PooledParams &p, u64 b, unsigned int lane, u64 &start, u64 &end) {
    if (p.offsets == nullptr) {
        start = b * p.hotness;
        end = start + p.hotness;
        return;
    }
    i64 s = offset_at(p, b), e = offset_at(p, b + 1);
    const i64 nnz = (i64)p.nnz;
    const bool bad = (b == 0 && s != 0) || e < s || (b + 1 == p.bags && e != nnz) || s < 0 || e > nnz;
    if (bad && lane == 0 && p.status != nullptr) {
        *p.status = 1u;
    }
    s = s < 0 ? 0 : (s > nnz ? nnz : s);
    e = e < s ? s : (e > nnz ? nnz : e);
    start = (u64)s;
    end = (u64)e;
}

// acc[v] += w * row[base + v * 32 + lane] for this lane's columns below `cols` (counted from base).
template <typename T>
__device__ __forceinline__ void accumulate(const Row<T> &row, unsigned int base, float w, float (&acc)[STRATA_POOL_COLS],
                                           unsigned int lane, unsigned int cols) {
#pragma unroll
    for (unsigned int v = 0; v < STRATA_POOL_COLS; v++) {
        const unsigned int c = v * 32u + lane;
        if (c < cols) {
            acc[v] = __fadd_rn(acc[v], __fmul_rn(w, row.at(base + c)));
        }
    }
}

// Pools bag `b` of `p` into its output row with the lanes of a warp (see the top of the file).
// T: the table's dtype. GATHERED: key j's row is `p.rows + j * dim` (float32, already resolved
// and counted). Each lane counts the keys it resolved into hits and misses.
template <typename T, bool GATHERED>
__device__ void pool_bag(const PooledParams &p, u64 b, unsigned int lane, unsigned int &hits, unsigned int &misses) {
    u64 start, end;
    bag_range(p, b, lane, start, end);
    const T *table = static_cast<const T *>(p.src.table);
    const i64 row_at = (i64)b * p.out_row_stride;
    const unsigned int dim = p.dim;
    for (unsigned int base = 0; base < dim; base += 32u * STRATA_POOL_COLS) {
        const unsigned int cols = dim - base;
        float acc[STRATA_POOL_COLS];
#pragma unroll
        for (unsigned int v = 0; v < STRATA_POOL_COLS; v++) {
            acc[v] = 0.0f;
        }
        float wsum = 0.0f, w2sum = 0.0f;
        for (u64 j0 = start; j0 < end; j0 += 32) {
            const unsigned int count = end - j0 < 32 ? (unsigned int)(end - j0) : 32u;
            i64 row = -1;
            float w = 1.0f;
            if (lane < count) {
                const u64 j = j0 + lane;
                if (GATHERED) {
                    row = (i64)j;
                } else {
                    row = find_row(p.src, key_at(p, j));
                    if (base == 0) {
                        hits += row >= 0;
                        misses += row < 0;
                    }
                }
                if (p.weights != nullptr) {
                    w = p.weights[(i64)j * p.weight_stride];
                }
            }
            for (unsigned int t = 0; t < count; t++) {
                const i64 r = (i64)strata_warp_shfl((u64)row, t);
                const float wt = __uint_as_float((unsigned int)strata_warp_shfl(__float_as_uint(w), t));
                if (GATHERED) {
                    accumulate(Row<float>(p.rows + (u64)r * dim, dim), base, wt, acc, lane, cols);
                } else if (r >= 0) {
                    accumulate(Row<T>(table + (u64)r * p.src.row_stride, dim), base, wt, acc, lane, cols);
                } else {
                    accumulate(Row<float>(p.src.default_row, dim), base, wt, acc, lane, cols);
                }
                wsum = __fadd_rn(wsum, wt);
                w2sum = __fadd_rn(w2sum, __fmul_rn(wt, wt));
            }
        }
        const bool scaled = p.pooling == 2 || p.pooling == 3;
        const float d = p.pooling == 2 ? wsum : __fsqrt_rn(w2sum);
#pragma unroll
        for (unsigned int v = 0; v < STRATA_POOL_COLS; v++) {
            const unsigned int c = v * 32u + lane;
            if (c < cols) {
                float x = acc[v];
                if (scaled) {
                    x = d == 0.0f ? 0.0f : __fdiv_rn(x, d);
                }
                store_out(p, row_at + (i64)(base + c) * p.out_col_stride, x);
            }
        }
    }
}

// Adds this lane's counts to `counts` (if any) and resets them.
__device__ __forceinline__ void flush_counts(u64 *counts, unsigned int &hits, unsigned int &misses) {
    if (counts != nullptr && (hits | misses) != 0) {
        atomicAdd(&counts[0], (u64)hits);
        atomicAdd(&counts[1], (u64)misses);
    }
    hits = 0;
    misses = 0;
}

// One bag per warp at a time.
template <typename T, bool GATHERED>
__device__ void pooled(const PooledParams p) {
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    unsigned int hits = 0, misses = 0;
    for (u64 b = warp_id(); b < p.bags; b += warps) {
        pool_bag<T, GATHERED>(p, b, lane, hits, misses);
    }
    flush_counts(p.counts, hits, misses);
}

// Key `i` of a plain request, copied as the gather kernel copies it.
template <typename T, typename O>
__device__ __forceinline__ void copy_key_to(const PooledParams &p, i64 row, u64 i, unsigned int lane) {
    O *dst = static_cast<O *>(p.out) + (i64)i * p.out_row_stride;
    if (row >= 0) {
        copy_row<T, O>(static_cast<const T *>(p.src.table) + (u64)row * p.src.row_stride, dst, p.dim, p.out_col_stride, lane);
    } else {
        copy_row<float, O>(p.src.default_row, dst, p.dim, p.out_col_stride, lane);
    }
}

template <typename T>
__device__ void copy_key(const PooledParams &p, u64 i, unsigned int lane, unsigned int &hits, unsigned int &misses) {
    const i64 row = find_row(p.src, key_at(p, i));
    hits += lane == 0 && row >= 0;
    misses += lane == 0 && row < 0;
    switch (p.out_dtype) {
        case 0: copy_key_to<T, float>(p, row, i, lane); break;
        case 1: copy_key_to<T, half16>(p, row, i, lane); break;
        default: copy_key_to<T, bfloat16>(p, row, i, lane); break;
    }
}

template <typename T>
__device__ __forceinline__ void batch_item(const PooledParams &p, u64 i, unsigned int lane, unsigned int &hits,
                                           unsigned int &misses) {
    if (p.pooling == 0) {
        copy_key<T>(p, i, lane, hits, misses);
    } else {
        pool_bag<T, false>(p, i, lane, hits, misses);
    }
}

// Every request's work items (bags, or keys of plain requests), one per warp at a time. A warp
// finds its item's request by binary search over the requests' first items.
__device__ void batch(const BatchParams bp) {
    const unsigned int lane = lane_id();
    const u64 warps = warp_count();
    unsigned int hits = 0, misses = 0;
    u64 current = ~0ULL;
    for (u64 g = warp_id(); g < bp.total; g += warps) {
        u64 lo = 0, hi = bp.count;
        while (hi - lo > 1) {
            const u64 mid = lo + (hi - lo) / 2;
            if (bp.items[mid].first <= g) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const PooledParams &p = bp.items[lo];
        if (lo != current) {
            if (current != ~0ULL) {
                flush_counts(bp.items[current].counts, hits, misses);
            }
            current = lo;
        }
        const u64 i = g - p.first;
        switch (p.table_dtype) {
            case 0: batch_item<float>(p, i, lane, hits, misses); break;
            case 1: batch_item<half16>(p, i, lane, hits, misses); break;
            case 2: batch_item<bfloat16>(p, i, lane, hits, misses); break;
            case 3: batch_item<int8_row>(p, i, lane, hits, misses); break;
            case 4: batch_item<int4_row>(p, i, lane, hits, misses); break;
            default: batch_item<fp8_row>(p, i, lane, hits, misses); break;
        }
    }
    if (current != ~0ULL) {
        flush_counts(bp.items[current].counts, hits, misses);
    }
}

#define STRATA_GATHER(KN, K, TN, T, ON, O)                                                                    \
    extern "C" __global__ void STRATA_BOUNDS strata_gather_##KN##_##TN##_##ON(const GatherParams p) { \
        gather<K, T, O>(p);                                                                                    \
    }

#define STRATA_KERNELS(KN, K, TN, T, ON, O)                                                                   \
    STRATA_GATHER(KN, K, TN, T, ON, O)                                                                         \
    extern "C" __global__ void STRATA_BOUNDS                                                          \
        strata_cache_probe_##KN##_##TN##_##ON(const CacheParams p) {                                          \
        cache_probe<K, T, O>(p);                                                                               \
    }

// M for every output dtype.
#define STRATA_KERNELS_OUT(M, KN, K, TN, T)          \
    M(KN, K, TN, T, f32, float)                      \
    M(KN, K, TN, T, f16, half16)                     \
    M(KN, K, TN, T, bf16, bfloat16)

// Float tables: gathers and cache probes; quantized tables: gathers only (a cache holds their
// rows dequantized, as float32).
#define STRATA_KERNELS_TABLE(KN, K)                                \
    STRATA_KERNELS_OUT(STRATA_KERNELS, KN, K, f32, float)          \
    STRATA_KERNELS_OUT(STRATA_KERNELS, KN, K, f16, half16)         \
    STRATA_KERNELS_OUT(STRATA_KERNELS, KN, K, bf16, bfloat16)      \
    STRATA_KERNELS_OUT(STRATA_GATHER, KN, K, int8, int8_row)       \
    STRATA_KERNELS_OUT(STRATA_GATHER, KN, K, int4, int4_row)       \
    STRATA_KERNELS_OUT(STRATA_GATHER, KN, K, fp8, fp8_row)

STRATA_KERNELS_TABLE(i32, int)
STRATA_KERNELS_TABLE(i64, i64)
STRATA_KERNELS_TABLE(u32, unsigned int)
STRATA_KERNELS_TABLE(u64, u64)

#define STRATA_FILL(TN, T, ON, O)                                                                              \
    extern "C" __global__ void STRATA_BOUNDS strata_cache_fill_##TN##_##ON(const CacheParams p) {   \
        cache_fill<T, O>(p);                                                                                   \
    }

#define STRATA_FILL_OUT(TN, T)                                                                                 \
    STRATA_FILL(TN, T, f32, float)                                                                             \
    STRATA_FILL(TN, T, f16, half16)                                                                            \
    STRATA_FILL(TN, T, bf16, bfloat16)                                                                         \
    extern "C" __global__ void STRATA_BOUNDS strata_cache_insert_##TN(const CacheParams p) {         \
        cache_insert<T>(p);                                                                                    \
    }

STRATA_FILL_OUT(f32, float)
STRATA_FILL_OUT(f16, half16)
STRATA_FILL_OUT(bf16, bfloat16)

#define STRATA_POOLED(TN, T)                                                                                   \
    extern "C" __global__ void STRATA_BOUNDS strata_pooled_##TN(const PooledParams p) {              \
        pooled<T, false>(p);                                                                                   \
    }

STRATA_POOLED(f32, float)
STRATA_POOLED(f16, half16)
STRATA_POOLED(bf16, bfloat16)
STRATA_POOLED(int8, int8_row)
STRATA_POOLED(int4, int4_row)
STRATA_POOLED(fp8, fp8_row)

extern "C" __global__ void STRATA_BOUNDS strata_pool_rows(const PooledParams p) { pooled<float, true>(p); }
extern "C" __global__ void STRATA_BOUNDS strata_batch(const BatchParams p) { batch(p); }
