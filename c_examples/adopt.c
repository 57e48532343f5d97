/*
 * strata tables from in-memory vectors: copied or adopted.
 *
 * 1. strata_table_from_dlpack COPIES: the caller's buffers may be freed as soon as it returns.
 * 2. strata_table_adopt_dlpack_versioned ADOPTS a DLManagedTensorVersioned (what a DLPack 1.x
 *    producer hands out): no copy; the table calls the tensor's deleter exactly once, from
 *    strata_table_free. If adopting fails, the caller still owns the tensor and the deleter
 *    has not been called. strata_table_adopt_dlpack does the same for a legacy DLManagedTensor.
 * 3. Keys of any integer dtype, matched by value: a table keyed by int32 looked up with uint32
 *    keys of shape [4, 5] (column-major) into a float16 tensor of shape [4, 5, dim].
 *
 * Exits with 1 (after printing what differed) if any result is not as documented.
 */
#include "strata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 16
#define DIM 5

static int g_failed = 0;

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "adopt: FAIL line %d: ", __LINE__); \
            fprintf(stderr, __VA_ARGS__);                  \
            fprintf(stderr, "\n");                         \
            g_failed++;                                    \
        }                                                  \
    } while (0)

/* Checks a strata status; a failure here is fatal. */
static void ok(strata_status s, const char *call) {
    if (s != STRATA_OK) {
        fprintf(stderr, "adopt: %s failed: %s: %s\n", call, strata_status_name(s), strata_last_error());
        exit(1);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "adopt: out of memory\n");
        exit(1);
    }
    return p;
}

/* Row r, column c of every table here. Not exactly representable in float16 on purpose, so
 * the float16 lookup below also checks rounding. */
static float value_at(int64_t r, int64_t c) {
    return (float)(r * DIM + c) / 7.0f + 0.1f;
}

/* float32 -> IEEE binary16 bits, rounding to nearest, ties to even (as a lookup into a
 * float16 out must). */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t man = x & 0x7FFFFFu;
    if (exp == 0xFFu) { /* inf or NaN (kept quiet) */
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0u));
    }
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7C00u); /* overflow: inf */
    }
    if (e <= 0) { /* a float16 subnormal, or zero */
        if (e < -10) {
            return sign;
        }
        uint32_t m24 = man | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t m = m24 >> shift;
        uint32_t rem = m24 & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (m & 1u))) {
            m++; /* may carry into the smallest normal: still the right encoding */
        }
        return (uint16_t)(sign | m);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++; /* a carry into the exponent (even up to inf) is correct */
    }
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400u), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}

/* A fresh rows x dim float32 buffer with row stride `row_stride` holding value_at(). */
static float *make_vectors(int64_t rows, int64_t row_stride) {
    float *v = xmalloc((size_t)(rows * row_stride) * sizeof *v);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < row_stride; c++) {
            v[r * row_stride + c] = c < DIM ? value_at(r, c) : -999.0f; /* padding is never read */
        }
    }
    return v;
}

/* Looks up int64 `keys` in `t` (float32 out) and checks row i equals value_at(rows[i], .) or
 * the default `dflt` where rows[i] < 0. */
static void lookup_and_compare(strata_table *t, const int64_t *keys, const int64_t *rows, int64_t n, float dflt,
                               const char *what) {
    int64_t kshape[1] = {n}, kstrides[1] = {1};
    int64_t oshape[2] = {n, DIM}, ostrides[2] = {DIM, 1};
    float *out = xmalloc((size_t)(n * DIM) * sizeof *out);
    DLTensor kt = {(void *)keys, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, kshape, kstrides, 0};
    DLTensor ot = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, ostrides, 0};
    strata_lookup_stats st = strata_lookup_stats_default();
    ok(strata_lookup(t, &kt, &ot, NULL, &st), "strata_lookup");
    uint64_t misses = 0;
    for (int64_t i = 0; i < n; i++) {
        misses += rows[i] < 0;
        for (int64_t c = 0; c < DIM; c++) {
            float want = rows[i] < 0 ? dflt : value_at(rows[i], c);
            CHECK(out[i * DIM + c] == want, "%s: out[%lld][%lld] = %g, expected %g", what, (long long)i,
                  (long long)c, (double)out[i * DIM + c], (double)want);
        }
    }
    CHECK(st.hits == (uint64_t)n - misses && st.misses == misses, "%s: stats %llu hits %llu misses", what,
          (unsigned long long)st.hits, (unsigned long long)st.misses);
    free(out);
    printf("%s: %lld keys, %llu hits, %llu misses: rows match\n", what, (long long)n,
           (unsigned long long)st.hits, (unsigned long long)st.misses);
}

/* ---- 1. copy ------------------------------------------------------------------------- */

static void copy_example(void) {
    /* Vectors with a padded row stride (a pitched buffer) and int64 keys, some negative. */
    const int64_t pitch = DIM + 3;
    float *vectors = make_vectors(ROWS, pitch);
    int64_t *keys = xmalloc(ROWS * sizeof *keys);
    for (int64_t r = 0; r < ROWS; r++) {
        keys[r] = -1000 + 37 * r;
    }
    int64_t vshape[2] = {ROWS, DIM}, vstrides[2] = {pitch, 1};
    int64_t kshape[1] = {ROWS};
    DLTensor vt = {vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, vstrides, 0};
    DLTensor kt = {keys, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, kshape, NULL, 0};

    strata_table_options opts = strata_table_options_default();
    opts.default_value = 0.5f;
    strata_table *t = NULL;
    ok(strata_table_from_dlpack(&vt, &kt, &opts, &t), "strata_table_from_dlpack");
    /* The table holds its own copy: poison and free the caller's buffers right away. */
    memset(vectors, 0xAB, (size_t)(ROWS * pitch) * sizeof *vectors);
    memset(keys, 0xAB, ROWS * sizeof *keys);
    free(vectors);
    free(keys);

    struct strata_table_info info = strata_table_info_default();
    ok(strata_table_get_info(t, &info), "strata_table_get_info");
    CHECK(info.rows == ROWS && info.dim == DIM && info.keyed && !info.adopted && !info.mapped,
          "copied table info: rows %lld dim %lld keyed %d adopted %d mapped %d", (long long)info.rows,
          (long long)info.dim, info.keyed, info.adopted, info.mapped);

    int64_t look[6] = {-1000 + 37 * 15, -1000, 5, -1000 + 37 * 3, -1000 + 37 * 3, -963 + 1};
    int64_t rows[6] = {15, 0, -1, 3, 3, -1};
    lookup_and_compare(t, look, rows, 6, 0.5f, "copied table (buffers freed)");
    strata_table_free(t);
}

/* ---- 2. adopt ------------------------------------------------------------------------ */

/* What a producer allocates for one exported tensor: the managed struct, its shape and
 * strides, and the data. The deleter frees all of it and counts its calls. */
typedef struct {
    DLManagedTensorVersioned managed;
    int64_t shape[2];
    int64_t strides[2];
    float *data;
} versioned_export;

static int g_versioned_deletes = 0;

static void versioned_deleter(DLManagedTensorVersioned *self) {
    versioned_export *e = self->manager_ctx;
    g_versioned_deletes++;
    free(e->data);
    free(e);
}

static DLManagedTensorVersioned *export_versioned(int64_t rows) {
    versioned_export *e = xmalloc(sizeof *e);
    memset(e, 0, sizeof *e);
    e->data = make_vectors(rows, DIM);
    e->shape[0] = rows;
    e->shape[1] = DIM;
    e->strides[0] = DIM;
    e->strides[1] = 1;
    e->managed.version.major = DLPACK_MAJOR_VERSION;
    e->managed.version.minor = DLPACK_MINOR_VERSION;
    e->managed.manager_ctx = e;
    e->managed.deleter = versioned_deleter;
    e->managed.flags = 0;
    DLTensor t = {e->data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, e->shape, e->strides, 0};
    e->managed.dl_tensor = t;
    return &e->managed;
}

/* The same for a legacy (pre-1.0) DLManagedTensor. */
typedef struct {
    DLManagedTensor managed;
    int64_t shape[2];
    float *data;
} legacy_export;

static int g_legacy_deletes = 0;

static void legacy_deleter(DLManagedTensor *self) {
    legacy_export *e = self->manager_ctx;
    g_legacy_deletes++;
    free(e->data);
    free(e);
}

static void adopt_example(void) {
    /* Success: the table owns the tensor until strata_table_free. */
    DLManagedTensorVersioned *m = export_versioned(ROWS);
    strata_table_options opts = strata_table_options_default();
    opts.default_value = -2.0f;
    strata_table *t = NULL;
    ok(strata_table_adopt_dlpack_versioned(m, NULL, &opts, &t), "strata_table_adopt_dlpack_versioned");
    CHECK(g_versioned_deletes == 0, "deleter called %d times while the table is alive", g_versioned_deletes);
    struct strata_table_info info = strata_table_info_default();
    ok(strata_table_get_info(t, &info), "strata_table_get_info");
    CHECK(info.adopted && !info.keyed && info.rows == ROWS, "adopted table info: adopted %d keyed %d rows %lld",
          info.adopted, info.keyed, (long long)info.rows);
    /* A dense table: key = row number; anything else is a miss. */
    int64_t look[5] = {5, 0, ROWS - 1, ROWS, -1};
    int64_t rows[5] = {5, 0, ROWS - 1, -1, -1};
    lookup_and_compare(t, look, rows, 5, -2.0f, "adopted versioned tensor");
    CHECK(g_versioned_deletes == 0, "deleter called %d times by a lookup", g_versioned_deletes);
    strata_table_free(t);
    CHECK(g_versioned_deletes == 1, "deleter called %d times after strata_table_free; expected 1",
          g_versioned_deletes);
    printf("adopted versioned tensor: deleter called once, by strata_table_free\n");

    /* Failure: a 1-D tensor is not [rows, dim]. The caller keeps ownership. */
    g_versioned_deletes = 0;
    m = export_versioned(ROWS);
    m->dl_tensor.ndim = 1;
    t = (strata_table *)m; /* poison: a failed call sets it to NULL */
    strata_status s = strata_table_adopt_dlpack_versioned(m, NULL, NULL, &t);
    printf("adopting a 1-D tensor: %s: %s\n", strata_status_name(s), strata_last_error());
    CHECK(s == STRATA_INVALID_ARGUMENT, "1-D vectors gave %s", strata_status_name(s));
    CHECK(t == NULL, "*out not NULL after a failed adopt");
    CHECK(g_versioned_deletes == 0, "deleter called %d times by a failed adopt", g_versioned_deletes);

    /* Failure: a DLPack major version this library does not speak. Not deleted either. */
    m->dl_tensor.ndim = 2;
    m->version.major = DLPACK_MAJOR_VERSION + 1;
    s = strata_table_adopt_dlpack_versioned(m, NULL, NULL, &t);
    printf("adopting a DLPack %u.%u tensor: %s: %s\n", (unsigned)m->version.major, (unsigned)m->version.minor,
           strata_status_name(s), strata_last_error());
    CHECK(s != STRATA_OK && t == NULL, "a major-version-2 tensor was adopted");
    CHECK(g_versioned_deletes == 0, "deleter called %d times by a refused adopt", g_versioned_deletes);
    m->deleter(m); /* still ours */
    CHECK(g_versioned_deletes == 1, "deleter count %d", g_versioned_deletes);

    /* The legacy struct works the same way. */
    legacy_export *e = xmalloc(sizeof *e);
    e->data = make_vectors(ROWS, DIM);
    e->shape[0] = ROWS;
    e->shape[1] = DIM;
    DLTensor lt = {e->data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, e->shape, NULL, 0}; /* NULL strides: compact */
    e->managed.dl_tensor = lt;
    e->managed.manager_ctx = e;
    e->managed.deleter = legacy_deleter;
    ok(strata_table_adopt_dlpack(&e->managed, NULL, NULL, &t), "strata_table_adopt_dlpack");
    int64_t look2[2] = {ROWS - 2, 3};
    int64_t rows2[2] = {ROWS - 2, 3};
    lookup_and_compare(t, look2, rows2, 2, 0.0f, "adopted legacy tensor");
    CHECK(g_legacy_deletes == 0, "legacy deleter called early");
    strata_table_free(t);
    CHECK(g_legacy_deletes == 1, "legacy deleter called %d times; expected 1", g_legacy_deletes);
}

/* ---- 3. int32 keys, uint32 2-D lookup, float16 out ----------------------------------- */

static void half_example(void) {
    /* Table keys are int32: row r has key 100 + 3r, except row 0 which has key -5. */
    float *vectors = make_vectors(ROWS, DIM);
    int32_t keys[ROWS];
    for (int r = 0; r < ROWS; r++) {
        keys[r] = r == 0 ? -5 : 100 + 3 * r;
    }
    int64_t vshape[2] = {ROWS, DIM}, kshape[1] = {ROWS};
    DLTensor vt = {vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, NULL, 0};
    DLTensor kt = {keys, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, kshape, NULL, 0};
    strata_table_options opts = strata_table_options_default();
    opts.default_value = 0.5f;
    strata_table *t = NULL;
    ok(strata_table_from_dlpack(&vt, &kt, &opts, &t), "strata_table_from_dlpack (int32 keys)");
    free(vectors);

    /* uint32 lookup keys, logical shape [4, 5], stored column-major (strides {1, 4}). Keys
     * match by value: uint32 4294967291 is not int32 -5. */
    enum { R = 4, C = 5 };
    uint32_t lk[R * C];
    int64_t want_row[R][C];
    for (int i = 0; i < R; i++) {
        for (int j = 0; j < C; j++) {
            int n = i * C + j;
            uint32_t k = n == 19  ? 4294967291u               /* (uint32_t)-5, not the key -5 */
                         : n == 0 ? 7u                        /* not a key */
                         : n % 7 == 3 ? 1000u + (uint32_t)n   /* not keys */
                                      : (uint32_t)keys[1 + (n * 5) % (ROWS - 1)];
            lk[i + R * j] = k;
            want_row[i][j] = -1;
            for (int r = 0; r < ROWS; r++) {
                if ((int64_t)keys[r] == (int64_t)k) { /* compare values, not bit patterns */
                    want_row[i][j] = r;
                }
            }
        }
    }
    uint16_t *out = xmalloc(R * C * DIM * sizeof *out);
    int64_t lshape[2] = {R, C}, lstrides[2] = {1, R};
    int64_t oshape[3] = {R, C, DIM}, ostrides[3] = {C * DIM, DIM, 1};
    DLTensor lt = {lk, {kDLCPU, 0}, 2, {kDLUInt, 32, 1}, lshape, lstrides, 0};
    DLTensor ot = {out, {kDLCPU, 0}, 3, {kDLFloat, 16, 1}, oshape, ostrides, 0};
    strata_lookup_stats st = strata_lookup_stats_default();
    ok(strata_lookup(t, &lt, &ot, NULL, &st), "strata_lookup (uint32 [4,5] -> float16 [4,5,dim])");

    uint64_t misses = 0;
    for (int i = 0; i < R; i++) {
        for (int j = 0; j < C; j++) {
            misses += want_row[i][j] < 0;
            for (int c = 0; c < DIM; c++) {
                float f = want_row[i][j] < 0 ? 0.5f : value_at(want_row[i][j], c);
                uint16_t want = f32_to_f16(f);
                uint16_t got = out[(i * C + j) * DIM + c];
                CHECK(got == want, "float16 out[%d][%d][%d] = 0x%04x (%g), expected 0x%04x (%g, from %.8g)", i, j, c,
                      got, (double)f16_to_f32(got), want, (double)f16_to_f32(want), (double)f);
                CHECK(fabsf(f16_to_f32(got) - f) <= 1e-3f * fabsf(f), "float16 out[%d][%d][%d] too far from %g", i,
                      j, c, (double)f);
            }
        }
    }
    CHECK(st.misses == misses && st.hits == R * C - misses, "stats %llu hits %llu misses; expected %llu misses",
          (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)misses);
    printf("int32-keyed table, uint32 [4,5] keys -> float16 [4,5,%d]: %llu hits, %llu misses: rows match "
           "(round to nearest even)\n",
           DIM, (unsigned long long)st.hits, (unsigned long long)st.misses);
    free(out);
    strata_table_free(t);
}

int main(void) {
    /* The converter itself, on a few known values. */
    CHECK(f32_to_f16(1.0f) == 0x3C00 && f32_to_f16(-2.0f) == 0xC000 && f32_to_f16(65504.0f) == 0x7BFF &&
              f32_to_f16(65520.0f) == 0x7C00 && f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3C00 &&
              f32_to_f16(1.0f + 3.0f / 2048.0f) == 0x3C02 && f32_to_f16(5.9604645e-8f) == 0x0001 &&
              f32_to_f16(2.9802322e-8f) == 0x0000,
          "f32_to_f16 self-test");

    copy_example();
    adopt_example();
    half_example();
    if (g_failed != 0) {
        fprintf(stderr, "adopt: %d checks failed\n", g_failed);
        return 1;
    }
    printf("adopt: all checks passed\n");
    return 0;
}
