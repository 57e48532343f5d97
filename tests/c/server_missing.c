/*
 * Keys that no tier holds, seen from C: what a parameter-server table does with them, and what
 * STRATA_MISSING_ERROR does on the same rows.
 *
 * The contract (include/strata.h, README "A parameter server from an HPS ps.json"): a server
 * table looks a key up in its volatile tier, then its persistent tier, "then the table's
 * default_value_for_each_table" — as HPS did, a key no tier holds gets the default row and
 * counts as a miss. A lookup fails with STRATA_KEY_NOT_FOUND only on a table *built* with
 * strata_table_options.missing_key = STRATA_MISSING_ERROR; server tables are built from ps.json,
 * which has no such setting, and strata_lookup_options has no missing-key field. So this
 * program checks:
 *
 *   1. a server table (volatile + persistent tiers): plain, pooled (ragged and fixed hotness,
 *      weighted, with an empty bag) and batched lookups of keys no tier holds (never in the
 *      model, and one erased from every tier) succeed, give the default row (or its pooled
 *      contribution), count misses in the call's stats and in strata_table_get_stats, and
 *      write nothing outside `out` (a guard region of NaN bytes around a strided out);
 *   2. the same sparse folder opened with strata_table_open and missing_key =
 *      STRATA_MISSING_ERROR: the plain and the pooled lookup of an absent key fail with
 *      STRATA_KEY_NOT_FOUND, a message naming the key and its element, the stats untouched and
 *      nothing written outside `out` (`out` itself is unspecified then, as the header says);
 *      with the default policy the same lookups succeed with the default row.
 *
 * Run under ASan+UBSan by ctest (scripts/c-tests.sh) and under valgrind by scripts/c-tests.sh.
 *
 *   server_missing            # exits 0 when every check passes
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata.h"
#include "check.h"

enum { ROWS = 500, DIM = 8 };
static const float DEFAULT_VALUE = -1.5f;

/* Column c of key's row in the model: keys 0, 2, 4, ..., 2 * (ROWS - 1). */
static float value(int64_t key, int64_t c) { return (float)key * 0.5f + (float)c; }
static int in_model(int64_t key) { return key >= 0 && key < 2 * ROWS && key % 2 == 0; }

static void write_model(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/emb", dir);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/emb/key", dir);
    FILE *k = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/emb/emb_vector", dir);
    FILE *v = fopen(path, "wb");
    if (k == NULL || v == NULL) {
        perror(path);
        exit(1);
    }
    for (int64_t r = 0; r < ROWS; r++) {
        int64_t key = 2 * r;
        fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < DIM; c++) {
            float x = value(key, c);
            fwrite(&x, sizeof x, 1, v);
        }
    }
    if (fclose(k) != 0 || fclose(v) != 0) {
        perror("closing the model files");
        exit(1);
    }
}

static const DLDataType I64 = {kDLInt, 64, 1};
static const DLDataType F32 = {kDLFloat, 32, 1};

/* An out of `rows` x DIM float32 inside a buffer of NaN bytes: LEAD floats of guard (reached
 * through byte_offset), rows RS floats apart with a column stride of 2, TRAIL floats after. */
enum { LEAD = 5, RS = 2 * DIM + 3, TRAIL = 7, MAX_ROWS = 16 };
typedef struct {
    float buf[LEAD + MAX_ROWS * RS + TRAIL];
    int64_t shape[2];
    int64_t strides[2];
    DLTensor t;
} guarded_out;

static void guarded_init(guarded_out *o, int64_t rows) {
    memset(o->buf, 0xFF, sizeof o->buf);
    o->shape[0] = rows;
    o->shape[1] = DIM;
    o->strides[0] = RS;
    o->strides[1] = 2;
    DLTensor t = {o->buf, {kDLCPU, 0}, 2, F32, o->shape, o->strides, LEAD * sizeof(float)};
    o->t = t;
}

static float *guarded_at(guarded_out *o, int64_t r, int64_t c) { return &o->buf[LEAD + r * RS + c * 2]; }

static int is_poison(const float *x) {
    static const unsigned char poison[sizeof(float)] = {0xFF, 0xFF, 0xFF, 0xFF};
    return memcmp(x, poison, sizeof *x) == 0;
}

/* Checks out's elements against want (rows x DIM) and that every other float is still poison;
 * with want NULL, only the guard (out's elements may hold anything). */
static void guarded_check(guarded_out *o, const float *want, const char *what) {
    int64_t rows = o->shape[0];
    int inside[sizeof o->buf / sizeof(float)] = {0};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < DIM; c++) {
            float *x = guarded_at(o, r, c);
            inside[x - o->buf] = 1;
            if (want != NULL) {
                EXPECT(*x == want[r * DIM + c], "%s: row %" PRId64 " col %" PRId64 ": got %g, want %g", what, r, c,
                       (double)*x, (double)want[r * DIM + c]);
            }
        }
    }
    for (size_t i = 0; i < sizeof o->buf / sizeof(float); i++) {
        EXPECT(inside[i] || is_poison(&o->buf[i]), "%s: float %zu, outside out, was written", what, i);
    }
}

/* The reference: plain rows (default row for a key the table lacks, `erased` included). */
static void plain_rows(const int64_t *keys, int n, int64_t erased, float *want, int64_t *misses) {
    *misses = 0;
    for (int i = 0; i < n; i++) {
        int hit = in_model(keys[i]) && keys[i] != erased;
        *misses += !hit;
        for (int c = 0; c < DIM; c++) {
            want[i * DIM + c] = hit ? value(keys[i], c) : DEFAULT_VALUE;
        }
    }
}

/* The reference pooled rows: float32 accumulation in key order, then / sum w (mean) or
 * / sqrt(sum w^2) (sqrtn); zeros for an empty bag or a zero total. */
static void pooled_rows(const int64_t *keys, const int64_t *offsets, int bags, const float *weights,
                        int pooling, int64_t erased, float *want) {
    for (int b = 0; b < bags; b++) {
        float acc[DIM] = {0};
        float ws = 0.0f, w2 = 0.0f;
        for (int64_t j = offsets[b]; j < offsets[b + 1]; j++) {
            float w = weights != NULL ? weights[j] : 1.0f;
            int hit = in_model(keys[j]) && keys[j] != erased;
            for (int c = 0; c < DIM; c++) {
                float x = hit ? value(keys[j], c) : DEFAULT_VALUE;
                float wx = w * x;
                acc[c] += wx;
            }
            ws += w;
            w2 += w * w;
        }
        float by = pooling == STRATA_POOL_MEAN ? ws : pooling == STRATA_POOL_SQRTN ? sqrtf(w2) : 1.0f;
        for (int c = 0; c < DIM; c++) {
            want[b * DIM + c] = by == 0.0f ? 0.0f : pooling == STRATA_POOL_SUM ? acc[c] : acc[c] / by;
        }
    }
}

enum { N = 9, BAGS = 4 };
/* Present, never in the model (odd, negative, huge), and one erased from every tier. */
static int64_t keys[N] = {0, 3, 998, 10, -7, (int64_t)1 << 40, 4, 1001, 36};
static int64_t offsets[BAGS + 1] = {0, 3, 3, 7, 9};
static float weights[N] = {0.5f, 2.0f, 1.0f, 0.25f, 1.5f, 1.0f, 3.0f, 0.75f, 1.25f};
static int64_t kshape[1] = {N}, kstrides[1] = {1};
static int64_t offshape[1] = {BAGS + 1};

/* The server-table half: every lookup succeeds and fills the default row. */
static void server_table(strata_table *t) {
    const int64_t erased_key = 10;
    DLTensor ek = {(void *)&keys[3], {kDLCPU, 0}, 1, I64, (int64_t[]){1}, kstrides, 0};
    uint64_t erased = 0;
    CHECK(strata_table_erase(t, &ek, &erased));
    EXPECT(erased == 1, "key 10 was in the table (erased %" PRIu64 ")", erased);

    strata_table_stats before = strata_table_stats_default();
    CHECK(strata_table_get_stats(t, &before));
    DLTensor kt = {keys, {kDLCPU, 0}, 1, I64, kshape, kstrides, 0};
    DLTensor ot_offsets = {offsets, {kDLCPU, 0}, 1, I64, offshape, kstrides, 0};
    DLTensor wt = {weights, {kDLCPU, 0}, 1, F32, kshape, kstrides, 0};
    float want[MAX_ROWS * DIM];
    int64_t misses = 0;
    plain_rows(keys, N, erased_key, want, &misses);
    EXPECT(misses == 5, "the test's keys: 5 that no tier holds (got %" PRId64 ")", misses);

    /* plain, twice (the second round after the first promoted the hits) */
    for (int round = 0; round < 2; round++) {
        static guarded_out o;
        guarded_init(&o, N);
        strata_lookup_stats st = strata_lookup_stats_default();
        st.hits = st.misses = 77;
        CHECK(strata_lookup(t, &kt, &o.t, NULL, &st));
        guarded_check(&o, want, "server table, plain lookup");
        EXPECT(st.hits == N - 5 && st.misses == 5, "plain stats: %" PRIu64 " hits, %" PRIu64 " misses", st.hits,
               st.misses);
        EXPECT(st.volatile_hits + st.persistent_hits == st.hits, "hits per tier add up");
    }

    /* pooled: ragged (with an empty bag), every pooling, weighted and not */
    for (int pooling = STRATA_POOL_SUM; pooling <= STRATA_POOL_SQRTN; pooling++) {
        for (int weighted = 0; weighted < 2; weighted++) {
            static guarded_out o;
            guarded_init(&o, BAGS);
            float pw[BAGS * DIM];
            pooled_rows(keys, offsets, BAGS, weighted ? weights : NULL, pooling, erased_key, pw);
            strata_lookup_stats st = strata_lookup_stats_default();
            CHECK(strata_lookup_pooled(t, &kt, &ot_offsets, weighted ? &wt : NULL, pooling, &o.t, NULL, &st));
            char what[96];
            snprintf(what, sizeof what, "server table, pooling %d, weighted %d", pooling, weighted);
            guarded_check(&o, pw, what);
            EXPECT(st.hits == N - 5 && st.misses == 5, "%s: stats count keys (%" PRIu64 " hits, %" PRIu64 " misses)",
                   what, st.hits, st.misses);
        }
    }

    /* pooled, fixed hotness: keys [3, 3] (the first 9 keys), sum */
    {
        static guarded_out o;
        guarded_init(&o, 3);
        int64_t k2shape[2] = {3, 3}, k2strides[2] = {3, 1};
        DLTensor k2 = {keys, {kDLCPU, 0}, 2, I64, k2shape, k2strides, 0};
        int64_t fixed[4] = {0, 3, 6, 9};
        float pw[3 * DIM];
        pooled_rows(keys, fixed, 3, NULL, STRATA_POOL_SUM, erased_key, pw);
        strata_lookup_stats st = strata_lookup_stats_default();
        CHECK(strata_lookup_pooled(t, &k2, NULL, NULL, STRATA_POOL_SUM, &o.t, NULL, &st));
        guarded_check(&o, pw, "server table, fixed hotness");
        EXPECT(st.misses == 5, "fixed hotness: 5 misses (got %" PRIu64 ")", st.misses);
    }

    /* a batch: the plain and a pooled request together */
    {
        static guarded_out o1, o2;
        guarded_init(&o1, N);
        guarded_init(&o2, BAGS);
        strata_lookup_stats s1 = strata_lookup_stats_default(), s2 = strata_lookup_stats_default();
        strata_lookup_request r[2] = {strata_lookup_request_default(), strata_lookup_request_default()};
        r[0].table = t;
        r[0].keys = &kt;
        r[0].out = &o1.t;
        r[0].stats = &s1;
        r[1].table = t;
        r[1].keys = &kt;
        r[1].offsets = &ot_offsets;
        r[1].weights = &wt;
        r[1].pooling = STRATA_POOL_MEAN;
        r[1].out = &o2.t;
        r[1].stats = &s2;
        CHECK(strata_lookup_batch(r, 2, NULL));
        float pw[BAGS * DIM];
        pooled_rows(keys, offsets, BAGS, weights, STRATA_POOL_MEAN, erased_key, pw);
        guarded_check(&o1, want, "server table, batch requests[0]");
        guarded_check(&o2, pw, "server table, batch requests[1]");
        EXPECT(s1.misses == 5 && s2.misses == 5, "batch stats: %" PRIu64 " and %" PRIu64 " misses", s1.misses,
               s2.misses);
    }

    /* the table's own counters saw every miss: 2 plain + 6 ragged + 1 fixed + 2 batched lookups */
    strata_table_stats after = strata_table_stats_default();
    CHECK(strata_table_get_stats(t, &after));
    EXPECT(after.misses - before.misses == 11 * 5, "strata_table_get_stats: %" PRIu64 " more misses, want %d",
           after.misses - before.misses, 11 * 5);
    EXPECT(after.keys - before.keys == 11 * N, "strata_table_get_stats: %" PRIu64 " more keys, want %d",
           after.keys - before.keys, 11 * N);
}

/* The STRATA_MISSING_ERROR half, on the same rows opened as a table. */
static void missing_error(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/emb", dir);
    strata_table_options strict = strata_table_options_default();
    strict.default_value = DEFAULT_VALUE;
    strict.missing_key = STRATA_MISSING_ERROR;
    strata_table_options fill = strict;
    fill.missing_key = STRATA_MISSING_FILL;
    strata_table *s = NULL, *f = NULL;
    CHECK(strata_table_open(path, DIM, &strict, &s));
    CHECK(strata_table_open(path, DIM, &fill, &f));

    /* keys[1] = 3 is the first key the table lacks (element 1) */
    DLTensor kt = {keys, {kDLCPU, 0}, 1, I64, kshape, kstrides, 0};
    DLTensor ot_offsets = {offsets, {kDLCPU, 0}, 1, I64, offshape, kstrides, 0};
    DLTensor wt = {weights, {kDLCPU, 0}, 1, F32, kshape, kstrides, 0};
    const char *needle = "keys: key 3 (element 1) is not in the table";
    static guarded_out o;
    strata_lookup_stats st = strata_lookup_stats_default();

    guarded_init(&o, N);
    st.hits = st.misses = 77;
    strata_status rc = strata_lookup(s, &kt, &o.t, NULL, &st);
    EXPECT(rc == STRATA_KEY_NOT_FOUND, "plain, MISSING_ERROR: %s", strata_status_name(rc));
    EXPECT(strstr(strata_last_error(), needle) != NULL, "plain, MISSING_ERROR: message \"%s\" lacks \"%s\"",
           strata_last_error(), needle);
    EXPECT(st.hits == 77 && st.misses == 77, "plain, MISSING_ERROR: stats are not written on failure");
    guarded_check(&o, NULL, "plain, MISSING_ERROR");

    guarded_init(&o, BAGS);
    rc = strata_lookup_pooled(s, &kt, &ot_offsets, &wt, STRATA_POOL_SUM, &o.t, NULL, &st);
    EXPECT(rc == STRATA_KEY_NOT_FOUND, "pooled, MISSING_ERROR: %s", strata_status_name(rc));
    EXPECT(strstr(strata_last_error(), needle) != NULL, "pooled, MISSING_ERROR: message \"%s\" lacks \"%s\"",
           strata_last_error(), needle);
    EXPECT(st.hits == 77 && st.misses == 77, "pooled, MISSING_ERROR: stats are not written on failure");
    guarded_check(&o, NULL, "pooled, MISSING_ERROR");

    /* in a batch: the failing request is named; nothing is written outside the outputs */
    {
        static guarded_out o1;
        guarded_init(&o, N);
        guarded_init(&o1, N);
        strata_lookup_request r[2] = {strata_lookup_request_default(), strata_lookup_request_default()};
        r[0].table = f;
        r[0].keys = &kt;
        r[0].out = &o1.t;
        r[1].table = s;
        r[1].keys = &kt;
        r[1].out = &o.t;
        rc = strata_lookup_batch(r, 2, NULL);
        EXPECT(rc == STRATA_KEY_NOT_FOUND, "batch, MISSING_ERROR: %s", strata_status_name(rc));
        EXPECT(strstr(strata_last_error(), "requests[1].keys: key 3 (element 1)") != NULL,
               "batch, MISSING_ERROR: message \"%s\" names requests[1]", strata_last_error());
        guarded_check(&o, NULL, "batch, MISSING_ERROR requests[1]");
        guarded_check(&o1, NULL, "batch, MISSING_ERROR requests[0]");
    }

    /* without the absent key the strict table serves; with the default policy the absent key
     * gets the default row */
    int64_t present[3] = {0, 998, 10};
    DLTensor pk = {present, {kDLCPU, 0}, 1, I64, (int64_t[]){3}, kstrides, 0};
    float want[MAX_ROWS * DIM];
    int64_t misses = 0;
    plain_rows(present, 3, -1, want, &misses);
    guarded_init(&o, 3);
    CHECK(strata_lookup(s, &pk, &o.t, NULL, &st));
    guarded_check(&o, want, "MISSING_ERROR, present keys");
    EXPECT(st.hits == 3 && st.misses == 0, "MISSING_ERROR, present keys: stats");

    plain_rows(keys, N, -1, want, &misses);
    guarded_init(&o, N);
    CHECK(strata_lookup(f, &kt, &o.t, NULL, &st));
    guarded_check(&o, want, "MISSING_FILL, plain");
    EXPECT((int64_t)st.misses == misses && st.hits == (uint64_t)(N - misses), "MISSING_FILL, plain: stats");

    float pw[BAGS * DIM];
    pooled_rows(keys, offsets, BAGS, weights, STRATA_POOL_SUM, -1, pw);
    guarded_init(&o, BAGS);
    CHECK(strata_lookup_pooled(f, &kt, &ot_offsets, &wt, STRATA_POOL_SUM, &o.t, NULL, &st));
    guarded_check(&o, pw, "MISSING_FILL, pooled");
    EXPECT((int64_t)st.misses == misses, "MISSING_FILL, pooled: stats");

    strata_table_free(s);
    strata_table_free(f);
}

int main(void) {
    char dir[] = "/tmp/strata-server-missing-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    write_model(dir);
    char json[8192];
    snprintf(json, sizeof json,
             "{\n"
             "  \"supportlonglong\": true,\n"
             "  \"volatile_db\": {\"type\": \"parallel_hash_map\", \"num_partitions\": 2,\n"
             "                  \"initial_cache_rate\": 0.5, \"cache_missed_embeddings\": true},\n"
             "  \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"%s/db\"},\n"
             "  \"models\": [\n"
             "    {\"model\": \"m\", \"sparse_files\": [\"emb\"], \"embedding_vecsize_per_table\": [%d],\n"
             "     \"default_value_for_each_table\": [%g],\n"
             "     \"maxnum_catfeature_query_per_table_per_sample\": [3],\n"
             "     \"deployed_device_list\": [0], \"max_batch_size\": 64}\n"
             "  ]\n"
             "}\n",
             dir, DIM, (double)DEFAULT_VALUE);
    strata_server *server = NULL;
    CHECK(strata_server_open_json(json, dir, &server));
    strata_table *t = NULL;
    CHECK(strata_server_table(server, "m", 0, &t));
    server_table(t);
    strata_server_free(server);

    missing_error(dir);

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    if (failures > 0) {
        fprintf(stderr, "server_missing: %d checks failed\n", failures);
        return 1;
    }
    printf("server_missing: every check passed\n");
    return 0;
}
