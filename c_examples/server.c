/*
 * A parameter server from an HPS-style ps.json with two models: look up rows from both,
 * update one table live, and print per-tier statistics.
 *
 * The program makes its own small models in a temporary folder (HugeCTR sparse format: a
 * `key` file of int64 keys and an `emb_vector` file of float32 rows), writes a ps.json with a
 * volatile tier in front of a persistent tier, and then uses only strata's C API.
 *
 *   server            # exits 0 when every check passes
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        strata_status s_ = (call);                                                             \
        if (s_ != STRATA_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, strata_status_name(s_),    \
                    strata_last_error());                                                      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static int failures = 0;
#define EXPECT(cond, what)                                                                     \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "check failed: %s\n", what);                                      \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

/* The value of column c of the row of `key` in the generated models. */
static float value(int64_t key, int64_t c) { return (float)(key % 1000) * 0.25f + (float)c; }

/* Writes a HugeCTR sparse folder dir/name with keys first, first+step, ... */
static void write_model(const char *dir, const char *name, int64_t rows, int64_t dim, int64_t first,
                        int64_t step) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/key", dir, name);
    FILE *k = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/%s/emb_vector", dir, name);
    FILE *v = fopen(path, "wb");
    if (k == NULL || v == NULL) {
        perror(path);
        exit(1);
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t key = first + r * step;
        fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < dim; c++) {
            float x = value(key, c);
            fwrite(&x, sizeof x, 1, v);
        }
    }
    fclose(k);
    fclose(v);
}

/* A compact 1-D int64 or 2-D float32 tensor over caller memory. */
static DLTensor tensor(void *data, int ndim, int64_t *shape, int64_t *strides, DLDataType dtype) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dtype, shape, strides, 0};
    return t;
}

static void print_stats(const char *label, const strata_table *t) {
    strata_table_stats s = strata_table_stats_default();
    CHECK(strata_table_get_stats(t, &s));
    printf("  %-10s lookups %" PRIu64 ", keys %" PRIu64 ": volatile hits %" PRIu64
           ", persistent hits %" PRIu64 ", misses %" PRIu64 "; volatile rows %" PRIu64
           " (%.1f KiB), evictions %" PRIu64 "; persistent rows %" PRIu64 "; upserts %" PRIu64 "\n",
           label, s.lookups, s.keys, s.volatile_hits, s.persistent_hits, s.misses, s.volatile_rows,
           (double)s.volatile_bytes / 1024.0, s.evictions, s.persistent_rows, s.upserts);
}

int main(void) {
    char dir[] = "/tmp/strata-server-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    /* Two models: "wdl" with tables of dim 16 and 4, "dcn" with one table of dim 32. */
    write_model(dir, "wdl0", 10000, 16, 0, 3);
    write_model(dir, "wdl1", 500, 4, 1, 1);
    write_model(dir, "dcn0", 2000, 32, 1000000, 1);

    char json[4096];
    snprintf(json, sizeof json,
             "{\n"
             "  \"supportlonglong\": true,\n"
             "  \"volatile_db\": {\"type\": \"parallel_hash_map\", \"num_partitions\": 4,\n"
             "                  \"overflow_margin\": 2000, \"overflow_policy\": \"evict_least_used\",\n"
             "                  \"overflow_resolution_target\": 0.8, \"initial_cache_rate\": 0.2,\n"
             "                  \"cache_missed_embeddings\": true},\n"
             "  \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"%s/db\"},\n"
             "  \"models\": [\n"
             "    {\"model\": \"wdl\", \"sparse_files\": [\"wdl0\", \"wdl1\"],\n"
             "     \"embedding_table_names\": [\"wide\", \"deep\"],\n"
             "     \"embedding_vecsize_per_table\": [16, 4],\n"
             "     \"default_value_for_each_table\": [0.0, -1.0],\n"
             "     \"maxnum_catfeature_query_per_table_per_sample\": [2, 26],\n"
             "     \"deployed_device_list\": [0], \"max_batch_size\": 1024},\n"
             "    {\"model\": \"dcn\", \"sparse_files\": [\"dcn0\"],\n"
             "     \"embedding_vecsize_per_table\": [32], \"default_value_for_each_table\": [0.5],\n"
             "     \"maxnum_catfeature_query_per_table_per_sample\": [1],\n"
             "     \"deployed_device_list\": [0], \"max_batch_size\": 1024}\n"
             "  ]\n"
             "}\n",
             dir);
    char ps_path[4200];
    snprintf(ps_path, sizeof ps_path, "%s/ps.json", dir);
    FILE *f = fopen(ps_path, "w");
    if (f == NULL || fputs(json, f) < 0 || fclose(f) != 0) {
        perror(ps_path);
        return 1;
    }

    strata_server *server = NULL;
    CHECK(strata_server_open(ps_path, &server));
    int32_t models = 0;
    CHECK(strata_server_num_models(server, &models));
    for (int32_t m = 0; m < models; m++) {
        const char *name;
        int32_t tables;
        CHECK(strata_server_model(server, m, &name, &tables));
        for (int32_t i = 0; i < tables; i++) {
            strata_table *t;
            const char *tname;
            CHECK(strata_server_table(server, name, i, &t));
            CHECK(strata_server_table_name(server, name, i, &tname));
            printf("model %s table %d (%s): %" PRId64 " rows of dim %" PRId64 "\n", name, i, tname,
                   strata_table_len(t), strata_table_dim(t));
        }
    }
    int32_t warnings = 0;
    CHECK(strata_server_num_warnings(server, &warnings));
    for (int32_t i = 0; i < warnings; i++) {
        const char *w;
        CHECK(strata_server_warning(server, i, &w));
        printf("config warning: %s\n", w);
    }

    /* Look up 1000 keys from wdl/wide, a tenth of them missing. */
    strata_table *wide, *dcn;
    CHECK(strata_server_table(server, "wdl", 0, &wide));
    CHECK(strata_server_table(server, "dcn", 0, &dcn));
    enum { N = 1000 };
    static int64_t keys[N];
    static float out[N * 32];
    for (int i = 0; i < N; i++) {
        keys[i] = i % 10 == 9 ? -1 - i : (int64_t)((i * 7919) % 10000) * 3;
    }
    int64_t kshape[1] = {N}, kstrides[1] = {1};
    int64_t oshape[2] = {N, 16}, ostrides[2] = {16, 1};
    DLDataType i64 = {kDLInt, 64, 1}, f32 = {kDLFloat, 32, 1};
    DLTensor kt = tensor(keys, 1, kshape, kstrides, i64);
    DLTensor ot = tensor(out, 2, oshape, ostrides, f32);
    strata_lookup_stats st = strata_lookup_stats_default();
    for (int round = 0; round < 2; round++) {
        CHECK(strata_lookup(wide, &kt, &ot, NULL, &st));
        printf("wdl/wide lookup %d: %" PRIu64 " hits (%" PRIu64 " volatile, %" PRIu64
               " persistent), %" PRIu64 " misses\n",
               round + 1, st.hits, st.volatile_hits, st.persistent_hits, st.misses);
        EXPECT(st.hits == 900 && st.misses == 100, "900 hits and 100 misses");
        for (int i = 0; i < N; i++) {
            float want = keys[i] < 0 ? 0.0f : value(keys[i], 3);
            EXPECT(out[i * 16 + 3] == want, "wdl/wide rows match the model files");
        }
    }
    EXPECT(st.persistent_hits == 0, "the second lookup is served from the volatile tier");

    /* The other model, same call. */
    int64_t dkeys[3] = {1000000, 1001999, 5};
    int64_t dkshape[1] = {3}, doshape[2] = {3, 32}, dostrides[2] = {32, 1};
    DLTensor dkt = tensor(dkeys, 1, dkshape, kstrides, i64);
    DLTensor dot = tensor(out, 2, doshape, dostrides, f32);
    CHECK(strata_lookup(dcn, &dkt, &dot, NULL, &st));
    EXPECT(out[0] == value(1000000, 0) && out[32 + 31] == value(1001999, 31) && out[64] == 0.5f,
           "dcn rows and default");
    printf("dcn lookup: %" PRIu64 " hits, %" PRIu64 " misses\n", st.hits, st.misses);

    /* Live update: new rows for two keys (one new), visible at once and durable. */
    int64_t ukeys[2] = {3, 77777};
    float urows[2 * 16];
    for (int i = 0; i < 32; i++) {
        urows[i] = 100.0f + (float)i;
    }
    int64_t ushape[1] = {2}, vshape[2] = {2, 16};
    DLTensor ukt = tensor(ukeys, 1, ushape, kstrides, i64);
    DLTensor uvt = tensor(urows, 2, vshape, ostrides, f32);
    CHECK(strata_table_upsert(wide, &ukt, &uvt));
    int64_t uoshape[2] = {2, 16};
    DLTensor uot = tensor(out, 2, uoshape, ostrides, f32);
    CHECK(strata_lookup(wide, &ukt, &uot, NULL, &st));
    EXPECT(memcmp(out, urows, sizeof urows) == 0 && st.hits == 2, "upserted rows are served");
    printf("upserted 2 rows into wdl/wide; lookup sees them: %" PRIu64 " hits\n", st.hits);

    printf("statistics:\n");
    print_stats("wdl/wide", wide);
    print_stats("dcn", dcn);
    strata_server_free(server);

    /* Reopen: the persistent tier kept the update. */
    CHECK(strata_server_open(ps_path, &server));
    CHECK(strata_server_table(server, "wdl", 0, &wide));
    CHECK(strata_lookup(wide, &ukt, &uot, NULL, &st));
    EXPECT(memcmp(out, urows, sizeof urows) == 0, "the update survived reopening");
    printf("after reopening, the update is still there: %" PRIu64 " hits\n", st.hits);
    strata_server_free(server);

    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    if (failures != 0) {
        fprintf(stderr, "server: %d checks failed\n", failures);
        return 1;
    }
    printf("server: all checks passed\n");
    return 0;
}
