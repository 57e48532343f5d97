/*
 * strata quantized tables: a HugeCTR sparse model quantized to int8 (or int4) rows at load,
 * a quarter (an eighth) of float32's memory, looked up and pooled like any table.
 *
 *   quantized [rows [dim [int8|int4]]]      defaults: 20000 64 int8
 *
 * 1. Writes a HugeCTR sparse folder (`key`, `emb_vector`) into a temporary directory.
 * 2. Opens it twice: as float32 (memory-mapped) and with `storage = STRATA_STORAGE_INT8`
 *    (quantized row by row as FBGEMM's FloatToFused8BitRowwiseQuantized does, into the
 *    table's own memory), and prints the bytes of each.
 * 3. Looks up random keys in both: every int8 value lies within half a quantization step
 *    ((max - min) / 255 / 2 of its row) of the float32 one.
 * 4. Pools bags of those keys (sum, with weights) from the int8 table: each pooled row equals
 *    the float32 sum, in key order, of the int8 table's own plain lookups.
 * 5. Serves the same folder from a parameter server: a ps.json whose model stores its table as
 *    int8 or int4 (`"strata_storage_per_table": ["int8"]`, a strata extension to HPS's format),
 *    with an LMDB persistent tier and a volatile tier that both hold quantized rows. The
 *    server's table says so in its info and stats; its first plain lookup reads the rows from
 *    LMDB, the next from the volatile tier, and both, with the pooled lookups, equal the static
 *    quantized table's bit for bit.
 * Exits with 1 on any failure, printing strata_status_name() and strata_last_error().
 */
#define _POSIX_C_SOURCE 200809L
#include "strata.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(strata_status s, const char *what) {
    if (s != STRATA_OK) {
        fprintf(stderr, "quantized: %s failed: %s: %s\n", what, strata_status_name(s), strata_last_error());
        exit(1);
    }
}

static DLTensor host(void *data, DLDataType dtype, int32_t ndim, int64_t *shape) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dtype, shape, NULL, 0};
    return t;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Row r's value c: smooth, different scales per row. */
static float value(int64_t r, int64_t c) {
    return (float)sin((double)(r * 131 + c * 7)) * (float)(1 + r % 17);
}

static void write_folder(const char *dir, int64_t rows, int64_t dim) {
    char path[512];
    snprintf(path, sizeof path, "%s/key", dir);
    FILE *k = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/emb_vector", dir);
    FILE *v = fopen(path, "wb");
    if (!k || !v) {
        perror("fopen");
        exit(1);
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t key = r * 3 + 1000; /* arbitrary 64-bit keys */
        fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < dim; c++) {
            float x = value(r, c);
            fwrite(&x, sizeof x, 1, v);
        }
    }
    fclose(k);
    fclose(v);
}

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? atoll(argv[1]) : 20000;
    int64_t dim = argc > 2 ? atoll(argv[2]) : 64;
    int int4 = argc > 3 && strcmp(argv[3], "int4") == 0;
    if (rows < 1 || dim < 2 || dim % 2 != 0) {
        fprintf(stderr, "usage: quantized [rows >= 1 [dim, even >= 2 [int8|int4]]]\n");
        return 2;
    }
    char dir[] = "/tmp/strata-quantized-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    write_folder(dir, rows, dim);

    strata_table *f32 = NULL, *q = NULL;
    strata_table_options opts = strata_table_options_default();
    check(strata_table_open(dir, dim, &opts, &f32), "strata_table_open(float32)");
    opts.storage = int4 ? STRATA_STORAGE_INT4 : STRATA_STORAGE_INT8;
    check(strata_table_open(dir, dim, &opts, &q), "strata_table_open(quantized)");
    const char *name = int4 ? "int4" : "int8";

    strata_table_info fi = strata_table_info_default(), qi = strata_table_info_default();
    check(strata_table_get_info(f32, &fi), "strata_table_get_info(float32)");
    check(strata_table_get_info(q, &qi), "strata_table_get_info(quantized)");
    uint64_t row_bytes = int4 ? (uint64_t)dim / 2 + 4 : (uint64_t)dim + 8;
    printf("%" PRId64 " rows x %" PRId64 ": float32 %" PRIu64 " bytes (mapped), %s %" PRIu64
           " bytes (%.3f of float32), index %" PRIu64 " bytes\n",
           rows, dim, fi.vector_bytes, name, qi.vector_bytes, (double)qi.vector_bytes / (double)fi.vector_bytes,
           qi.index_bytes);
    int failures = 0;
    if (qi.vector_bytes != (uint64_t)rows * row_bytes || qi.dtype.code != kDLUInt || qi.dtype.bits != 8) {
        fprintf(stderr, "quantized: info says %" PRIu64 " bytes of dtype (%d, %d); expected %" PRIu64 " of uint8\n",
                qi.vector_bytes, qi.dtype.code, qi.dtype.bits, (uint64_t)rows * row_bytes);
        failures++;
    }
    int32_t want_storage = int4 ? STRATA_STORAGE_INT4 : STRATA_STORAGE_INT8;
    if (qi.storage != want_storage || qi.row_bytes != row_bytes || fi.storage != STRATA_STORAGE_FLOAT32 ||
        fi.row_bytes != (uint64_t)dim * 4) {
        fprintf(stderr, "quantized: info says storage %d of %" PRIu64 " bytes a row (float32 table: %d, %" PRIu64
                "); expected %d of %" PRIu64 " (%d, %" PRIu64 ")\n", qi.storage, qi.row_bytes, fi.storage, fi.row_bytes,
                want_storage, row_bytes, STRATA_STORAGE_FLOAT32, (uint64_t)dim * 4);
        failures++;
    }
    strata_table_stats qs = strata_table_stats_default();
    check(strata_table_get_stats(q, &qs), "strata_table_get_stats(quantized)");
    if (qs.storage != want_storage || qs.row_bytes != row_bytes) {
        fprintf(stderr, "quantized: stats say storage %d of %" PRIu64 " bytes a row; expected %d of %" PRIu64 "\n",
                qs.storage, qs.row_bytes, want_storage, row_bytes);
        failures++;
    }

    /* Plain lookups in both tables. */
    enum { N = 4096, BAGS = 256 };
    int64_t *keys = malloc(N * sizeof *keys), *rows_of = malloc(N * sizeof *rows_of);
    float *a = malloc((size_t)N * (size_t)dim * sizeof *a), *b = malloc((size_t)N * (size_t)dim * sizeof *b);
    float *pooled = malloc((size_t)BAGS * (size_t)dim * sizeof *pooled), *w = malloc(N * sizeof *w);
    int64_t *offsets = malloc((BAGS + 1) * sizeof *offsets);
    if (!keys || !rows_of || !a || !b || !pooled || !w || !offsets) {
        return 1;
    }
    for (int i = 0; i < N; i++) {
        rows_of[i] = (int64_t)(next() % (uint64_t)rows);
        keys[i] = rows_of[i] * 3 + 1000;
        w[i] = (float)(next() % 1000) / 250.0f - 2.0f;
    }
    memset(b, 0xFF, (size_t)N * (size_t)dim * sizeof *b); /* NaN poison */
    int64_t kshape[1] = {N}, oshape[2] = {N, dim};
    DLDataType I64 = {kDLInt, 64, 1}, F32 = {kDLFloat, 32, 1};
    DLTensor k = host(keys, I64, 1, kshape), oa = host(a, F32, 2, oshape), ob = host(b, F32, 2, oshape);
    check(strata_lookup(f32, &k, &oa, NULL, NULL), "strata_lookup(float32)");
    check(strata_lookup(q, &k, &ob, NULL, NULL), "strata_lookup(quantized)");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t c = 0; c < dim; c++) {
            float x = value(rows_of[i], c);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        /* int8: a step of (max - min) / 255; int4: (max - min) / 15 with a float16 scale and a
           bias that is min rounded to float16. */
        double step = int4 ? (hi - lo) / 15.0 * 1.002 + fabs(lo) / 1024.0 : (hi - lo) / 255.0;
        for (int64_t c = 0; c < dim; c++) {
            double err = fabs((double)b[i * dim + c] - (double)a[i * dim + c]);
            if (!(err <= step * 0.5 * 1.0001 + 1e-6)) {
                if (failures++ < 5) {
                    fprintf(stderr, "quantized: key %" PRId64 " col %" PRId64 ": %s %g, float32 %g (step %g)\n", keys[i],
                            c, name, b[i * dim + c], a[i * dim + c], step);
                }
            }
            worst = err / (step > 0 ? step : 1) > worst ? err / (step > 0 ? step : 1) : worst;
        }
    }
    printf("plain lookup of %d keys: every %s value within %.3f of a quantization step of float32's\n", N, name,
           worst);

    /* Pooled: bags of the same keys, weighted sum, against the plain rows summed in key order. */
    for (int j = 0; j <= BAGS; j++) {
        offsets[j] = (int64_t)j * (N / BAGS) - (j > 0 && j < BAGS ? (int64_t)(next() % 8) : 0);
    }
    memset(pooled, 0xFF, (size_t)BAGS * (size_t)dim * sizeof *pooled);
    int64_t offshape[1] = {BAGS + 1}, pshape[2] = {BAGS, dim};
    DLTensor offs = host(offsets, I64, 1, offshape), wt = host(w, F32, 1, kshape), po = host(pooled, F32, 2, pshape);
    check(strata_lookup_pooled(q, &k, &offs, &wt, STRATA_POOL_SUM, &po, NULL, NULL), "strata_lookup_pooled");
    for (int j = 0; j < BAGS; j++) {
        for (int64_t c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int64_t i = offsets[j]; i < offsets[j + 1]; i++) {
                float term = w[i] * b[i * dim + c];
                acc += term;
            }
            if (memcmp(&acc, &pooled[j * dim + c], sizeof acc) != 0 && failures++ < 10) {
                fprintf(stderr, "quantized: bag %d col %" PRId64 ": pooled %g, plain loop %g\n", j, c,
                        pooled[j * dim + c], acc);
            }
        }
    }
    printf("pooled %d bags (weighted sum) from %s rows: bit for bit the float32 sum of the plain rows in key order\n",
           BAGS, name);

    /* 5. The same folder served from a ps.json whose table is stored quantized. */
    char json[2048];
    snprintf(json, sizeof json,
             "{\"supportlonglong\": true,\n"
             " \"volatile_db\": {\"type\": \"parallel_hash_map\", \"num_partitions\": 4,\n"
             "                 \"initial_cache_rate\": 0.0, \"cache_missed_embeddings\": true},\n"
             " \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"%s/db\"},\n"
             " \"models\": [{\"model\": \"ranker\", \"sparse_files\": [\"%s\"],\n"
             "             \"embedding_vecsize_per_table\": [%" PRId64 "],\n"
             "             \"strata_storage_per_table\": [\"%s\"],\n"
             "             \"maxnum_catfeature_query_per_table_per_sample\": [16], \"max_batch_size\": %d}]}\n",
             dir, dir, dim, name, N);
    strata_server *server = NULL;
    strata_table *served = NULL;
    check(strata_server_open_json(json, NULL, &server), "strata_server_open_json");
    check(strata_server_table(server, "ranker", 0, &served), "strata_server_table");
    strata_table_info si = strata_table_info_default();
    strata_table_stats ss = strata_table_stats_default();
    check(strata_table_get_info(served, &si), "strata_table_get_info(server)");
    check(strata_table_get_stats(served, &ss), "strata_table_get_stats(server)");
    if (si.storage != want_storage || si.row_bytes != row_bytes || ss.storage != want_storage ||
        ss.row_bytes != row_bytes) {
        fprintf(stderr, "quantized: the server's table says storage %d / %d of %" PRIu64 " / %" PRIu64
                " bytes a row; expected %d of %" PRIu64 "\n", si.storage, ss.storage, si.row_bytes, ss.row_bytes,
                want_storage, row_bytes);
        failures++;
    }
    float *c = malloc((size_t)N * (size_t)dim * sizeof *c), *pc = malloc((size_t)BAGS * (size_t)dim * sizeof *pc);
    if (!c || !pc) {
        return 1;
    }
    DLTensor oc = host(c, F32, 2, oshape), poc = host(pc, F32, 2, pshape);
    const char *tier[2] = {"the persistent tier (pooled: the rows it cached)", "the volatile tier"};
    for (int round = 0; round < 2; round++) {
        memset(c, 0xFF, (size_t)N * (size_t)dim * sizeof *c);
        memset(pc, 0xFF, (size_t)BAGS * (size_t)dim * sizeof *pc);
        strata_lookup_stats st = strata_lookup_stats_default();
        check(strata_lookup(served, &k, &oc, NULL, &st), "strata_lookup(server)");
        check(strata_lookup_pooled(served, &k, &offs, &wt, STRATA_POOL_SUM, &poc, NULL, NULL),
              "strata_lookup_pooled(server)");
        int same = memcmp(c, b, (size_t)N * (size_t)dim * sizeof *c) == 0 &&
                   memcmp(pc, pooled, (size_t)BAGS * (size_t)dim * sizeof *pc) == 0;
        /* The first round finds every distinct key in LMDB (and caches it); the second, none. */
        int tier_ok = round == 0 ? st.persistent_hits > 0 : st.persistent_hits == 0 && st.volatile_hits == (uint64_t)N;
        if (!same || !tier_ok || st.misses != 0) {
            fprintf(stderr, "quantized: server round %d: %s rows (volatile %" PRIu64 ", persistent %" PRIu64
                    ", misses %" PRIu64 ")\n", round, same ? "equal" : "different", st.volatile_hits,
                    st.persistent_hits, st.misses);
            failures++;
        } else {
            printf("ps.json table stored as %s, rows from %s: plain and pooled lookups equal the static %s"
                   " table's bit for bit\n", name, tier[round], name);
        }
    }
    strata_server_free(server);
    free(c);
    free(pc);

    strata_table_free(q);
    strata_table_free(f32);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "quantized: could not remove %s\n", dir);
    }
    free(keys);
    free(rows_of);
    free(a);
    free(b);
    free(pooled);
    free(w);
    free(offsets);
    if (failures) {
        fprintf(stderr, "quantized: %d failures\n", failures);
        return 1;
    }
    printf("quantized: ok\n");
    return 0;
}
