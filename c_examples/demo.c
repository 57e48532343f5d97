/*
 * strata demo: open a HugeCTR sparse-format embedding table and look up a batch of keys.
 *
 *   demo [rows [dim [batch [threads]]]]      defaults: 1000000 128 200000 0
 *
 * 1. Writes a table into a fresh temporary folder: `key` (little-endian int64, one per row,
 *    random distinct 63-bit keys) and `emb_vector` (float32, rows x dim, row-major), the
 *    layout HugeCTR/HPS sparse models are saved in.
 * 2. Opens it with strata_table_open (vectors memory-mapped, keys indexed) and prints its size.
 * 3. Looks up a batch of int64 keys, 90% present and 10% absent, into a float32 [batch, dim]
 *    tensor; absent keys get the table's default value (-1 here).
 * 4. Checks every output row, then times ten lookups and prints the median.
 *
 * Every strata call returns a strata_status; on failure the demo prints the status name and
 * strata_last_error() and exits with 1. `threads` is strata_lookup_options.num_threads
 * (0 = the library default: the process's CPU affinity mask or STRATA_NUM_THREADS).
 */
#define _POSIX_C_SOURCE 200809L

#include "strata.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REPEATS 10
#define DEFAULT_VALUE (-1.0f)

/* ---- small helpers ------------------------------------------------------------------- */

/* The temporary folder and its files, removed at exit (also after a failure). */
static char g_dir[4096];
static char g_key_path[4200];
static char g_vec_path[4200];

static void remove_table_files(void) {
    if (g_dir[0] == '\0') {
        return;
    }
    unlink(g_key_path);
    unlink(g_vec_path);
    if (rmdir(g_dir) != 0) {
        fprintf(stderr, "demo: warning: cannot remove %s: %s\n", g_dir, strerror(errno));
    }
    g_dir[0] = '\0';
}

/* Checks a strata status: on failure prints the call, status name and message, and exits. */
static void check(strata_status s, const char *call) {
    if (s != STRATA_OK) {
        fprintf(stderr, "demo: %s failed: %s: %s\n", call, strata_status_name(s), strata_last_error());
        exit(1);
    }
}

static void die(const char *what) {
    fprintf(stderr, "demo: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "demo: out of memory allocating %zu bytes\n", n);
        exit(1);
    }
    return p;
}

/* splitmix64: a tiny, good-enough seeded PRNG. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform integer in [0, n). The modulo bias is irrelevant for a demo. */
static uint64_t below(uint64_t *state, uint64_t n) {
    return splitmix64(state) % n;
}

/* A random non-negative 63-bit key. */
static int64_t random_key(uint64_t *state) {
    return (int64_t)(splitmix64(state) >> 1);
}

/* The value stored at row r, column c: deterministic, so every output can be checked. */
static float value_at(int64_t r, int64_t c) {
    return (float)((r * 31 + c) % 1000) * 0.25f;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int contains(const int64_t *sorted, size_t n, int64_t k) {
    return bsearch(&k, sorted, n, sizeof k, cmp_i64) != NULL;
}

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static void write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "demo: writing %s failed: %s\n", path, strerror(errno));
        exit(1);
    }
}

static double now_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        die("clock_gettime");
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int64_t parse_arg(const char *s, const char *name, int64_t min) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min) {
        fprintf(stderr, "demo: %s = '%s'; expected an integer >= %" PRId64 "\n", name, s, min);
        fprintf(stderr, "usage: demo [rows [dim [batch [threads]]]]\n");
        exit(2);
    }
    return (int64_t)v;
}

/* ---- the table files ----------------------------------------------------------------- */

/* Writes `key` and `emb_vector` for `rows` keys of `dim` floats into g_dir. */
static void write_table(const int64_t *keys, int64_t rows, int64_t dim) {
    FILE *f = fopen(g_key_path, "wb");
    if (f == NULL) {
        die(g_key_path);
    }
    unsigned char buf[8 * 1024];
    size_t used = 0;
    for (int64_t r = 0; r < rows; r++) {
        put_le64(buf + used, (uint64_t)keys[r]);
        used += 8;
        if (used == sizeof buf) {
            write_all(f, buf, used, g_key_path);
            used = 0;
        }
    }
    write_all(f, buf, used, g_key_path);
    if (fclose(f) != 0) {
        die(g_key_path);
    }

    f = fopen(g_vec_path, "wb");
    if (f == NULL) {
        die(g_vec_path);
    }
    unsigned char *row = xmalloc((size_t)dim * 4);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < dim; c++) {
            float v = value_at(r, c);
            uint32_t bits;
            memcpy(&bits, &v, sizeof bits);
            put_le32(row + c * 4, bits);
        }
        write_all(f, row, (size_t)dim * 4, g_vec_path);
    }
    free(row);
    if (fclose(f) != 0) {
        die(g_vec_path);
    }
}

/* ---- main ---------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? parse_arg(argv[1], "rows", 1) : 1000000;
    int64_t dim = argc > 2 ? parse_arg(argv[2], "dim", 1) : 128;
    int64_t batch = argc > 3 ? parse_arg(argv[3], "batch", 1) : 200000;
    int64_t threads = argc > 4 ? parse_arg(argv[4], "threads", 0) : 0;
    if (argc > 5) {
        fprintf(stderr, "usage: demo [rows [dim [batch [threads]]]]\n");
        return 2;
    }
    if (threads > INT32_MAX) {
        threads = INT32_MAX;
    }

    printf("strata %s demo: rows %" PRId64 ", dim %" PRId64 ", batch %" PRId64 ", threads %s",
           strata_version(), rows, dim, batch, threads == 0 ? "default" : "");
    if (threads == 0) {
        printf(" (%d)\n", (int)strata_default_num_threads());
    } else {
        printf("%" PRId64 "\n", threads);
    }

    /* 1. Random distinct 63-bit keys, written with their vectors into a temporary folder. */
    uint64_t rng = 0x5EEDull;
    int64_t *keys = xmalloc((size_t)rows * sizeof *keys);
    int64_t *sorted = xmalloc((size_t)rows * sizeof *sorted);
    for (;;) {
        for (int64_t r = 0; r < rows; r++) {
            keys[r] = random_key(&rng);
        }
        memcpy(sorted, keys, (size_t)rows * sizeof *keys);
        qsort(sorted, (size_t)rows, sizeof *sorted, cmp_i64);
        int64_t dup = 0;
        for (int64_t r = 1; r < rows; r++) {
            dup |= sorted[r] == sorted[r - 1];
        }
        if (!dup) {
            break; /* a repeat among 63-bit random keys is astronomically rare; redraw if so */
        }
    }

    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0') {
        tmp = "/tmp";
    }
    snprintf(g_dir, sizeof g_dir, "%s/strata-demo-XXXXXX", tmp);
    if (mkdtemp(g_dir) == NULL) {
        die("mkdtemp");
    }
    snprintf(g_key_path, sizeof g_key_path, "%s/key", g_dir);
    snprintf(g_vec_path, sizeof g_vec_path, "%s/emb_vector", g_dir);
    atexit(remove_table_files);

    double t0 = now_seconds();
    write_table(keys, rows, dim);
    double t1 = now_seconds();
    printf("wrote %s: %.1f MiB in %.2f s\n", g_dir,
           (double)rows * (double)(dim * 4 + 8) / (1024.0 * 1024.0), t1 - t0);

    /* 2. Open it: vectors are memory-mapped, keys go into strata's index. */
    strata_table_options opts = strata_table_options_default();
    opts.default_value = DEFAULT_VALUE;
    strata_table *table = NULL;
    check(strata_table_open(g_dir, dim, &opts, &table), "strata_table_open");
    double t2 = now_seconds();

    struct strata_table_info info = strata_table_info_default();
    check(strata_table_get_info(table, &info), "strata_table_get_info");
    printf("opened in %.2f s: rows %" PRId64 ", dim %" PRId64 ", index %.2f MiB (%.2f bytes/key), "
           "vectors %.1f MiB (%s)\n",
           t2 - t1, info.rows, info.dim, (double)info.index_bytes / (1024.0 * 1024.0),
           (double)info.index_bytes / (double)info.rows, (double)info.vector_bytes / (1024.0 * 1024.0),
           info.mapped ? "memory-mapped" : "in memory");
    if (info.rows != rows || info.dim != dim || !info.keyed) {
        fprintf(stderr, "demo: strata_table_info disagrees with the files: rows %" PRId64 ", dim %" PRId64
                ", keyed %d\n", info.rows, info.dim, (int)info.keyed);
        return 1;
    }

    /* 3. A batch: 90% keys of the table (random rows), 10% random keys it does not hold,
     *    shuffled. expect[i] is the row key i must return, or -1 for a miss. */
    int64_t misses = batch / 10;
    int64_t hits = batch - misses;
    int64_t *batch_keys = xmalloc((size_t)batch * sizeof *batch_keys);
    int64_t *expect = xmalloc((size_t)batch * sizeof *expect);
    for (int64_t i = 0; i < batch; i++) {
        if (i < hits) {
            int64_t r = (int64_t)below(&rng, (uint64_t)rows);
            batch_keys[i] = keys[r];
            expect[i] = r;
        } else {
            int64_t k;
            do {
                k = random_key(&rng);
            } while (contains(sorted, (size_t)rows, k));
            batch_keys[i] = k;
            expect[i] = -1;
        }
    }
    for (int64_t i = batch - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)below(&rng, (uint64_t)i + 1);
        int64_t tk = batch_keys[i], te = expect[i];
        batch_keys[i] = batch_keys[j];
        expect[i] = expect[j];
        batch_keys[j] = tk;
        expect[j] = te;
    }
    free(sorted);

    float *out = xmalloc((size_t)batch * (size_t)dim * sizeof *out);

    /* DLPack descriptions of the caller's buffers: keys int64 [batch], out float32 [batch, dim]. */
    int64_t keys_shape[1] = {batch};
    int64_t keys_strides[1] = {1};
    DLTensor keys_t = {
        .data = batch_keys,
        .device = {kDLCPU, 0},
        .ndim = 1,
        .dtype = {kDLInt, 64, 1},
        .shape = keys_shape,
        .strides = keys_strides,
        .byte_offset = 0,
    };
    int64_t out_shape[2] = {batch, dim};
    int64_t out_strides[2] = {dim, 1};
    DLTensor out_t = {
        .data = out,
        .device = {kDLCPU, 0},
        .ndim = 2,
        .dtype = {kDLFloat, 32, 1},
        .shape = out_shape,
        .strides = out_strides,
        .byte_offset = 0,
    };
    strata_lookup_options lopts = strata_lookup_options_default();
    lopts.num_threads = (int32_t)threads;

    /* 4. Warm-up lookup, then check every row of it. */
    strata_lookup_stats stats = strata_lookup_stats_default();
    check(strata_lookup(table, &keys_t, &out_t, &lopts, &stats), "strata_lookup");
    if (stats.hits != (uint64_t)hits || stats.misses != (uint64_t)misses) {
        fprintf(stderr, "demo: stats say %" PRIu64 " hits and %" PRIu64 " misses; expected %" PRId64
                " and %" PRId64 "\n", stats.hits, stats.misses, hits, misses);
        return 1;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < batch; i++) {
        const float *row = out + i * dim;
        for (int64_t c = 0; c < dim; c++) {
            float want = expect[i] < 0 ? DEFAULT_VALUE : value_at(expect[i], c);
            if (row[c] != want) {
                if (bad < 5) {
                    fprintf(stderr, "demo: out[%" PRId64 "][%" PRId64 "] = %g for key %" PRId64
                            " (%s); expected %g\n", i, c, (double)row[c], batch_keys[i],
                            expect[i] < 0 ? "missing" : "present", (double)want);
                }
                bad++;
                break;
            }
        }
    }
    if (bad != 0) {
        fprintf(stderr, "demo: %" PRId64 " of %" PRId64 " output rows are wrong\n", bad, batch);
        return 1;
    }
    printf("checked all %" PRId64 " output rows: %" PRIu64 " hits, %" PRIu64 " misses (filled with %g)\n",
           batch, stats.hits, stats.misses, (double)DEFAULT_VALUE);

    /* 5. Time it. */
    double times[REPEATS];
    for (int i = 0; i < REPEATS; i++) {
        double a = now_seconds();
        check(strata_lookup(table, &keys_t, &out_t, &lopts, NULL), "strata_lookup");
        times[i] = now_seconds() - a;
    }
    qsort(times, REPEATS, sizeof times[0], cmp_double);
    double med = (times[REPEATS / 2 - 1] + times[REPEATS / 2]) / 2.0;
    double out_bytes = (double)batch * (double)dim * sizeof(float);
    printf("lookup: %.3f ms per batch (median of %d; min %.3f, max %.3f), %.2f Mkeys/s, "
           "%.2f GB/s of output written\n",
           med * 1e3, REPEATS, times[0] * 1e3, times[REPEATS - 1] * 1e3, (double)batch / med / 1e6,
           out_bytes / med / 1e9);

    /* 6. Clean up: the table unmaps the file; then the files and folder go. */
    strata_table_free(table);
    free(out);
    free(expect);
    free(batch_keys);
    free(keys);
    remove_table_files();
    return 0;
}
