/*
 * A host compiled against the frozen 0.3 header (tests/abi/strata_0_3.h), the way a TensorRT
 * plugin or a TensorFlow op is compiled once and then loads whatever libstrata.so the machine
 * has. The test suite builds it against that copy only and runs it against the current library
 * (under ASan/UBSan and valgrind): every extensible struct it passes or receives has the 0.3
 * layout, so a later library must read and write exactly the fields of that layout.
 *
 * It uses every struct of the 0.3 ABI: table and lookup options, lookup stats, table info,
 * table stats (through a parameter server opened from JSON), and a partition description
 * (a dense table described, then rebuilt from the description).
 */
#define _POSIX_C_SOURCE 200809L

#include "strata_0_3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROWS 64
#define DIM 8

static int g_failed = 0, g_checks = 0;

static void check(int cond, const char *what) {
    g_checks++;
    if (!cond) {
        g_failed++;
        printf("FAIL %s (%s)\n", what, strata_last_error());
    }
}

static int ok(strata_status s, const char *what) {
    check(s == STRATA_OK, what);
    return s == STRATA_OK;
}

static DLTensor host(void *data, DLDataType dt, int32_t ndim, int64_t *shape) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dt, shape, NULL, 0};
    return t;
}

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType I64 = {kDLInt, 64, 1};

/* A HugeCTR sparse folder of `rows` keys 0, 2, 4, ... and rows whose values are key + column. */
static int write_folder(const char *dir, int64_t rows) {
    char path[1100];
    snprintf(path, sizeof path, "%s/key", dir);
    FILE *k = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/emb_vector", dir);
    FILE *v = fopen(path, "wb");
    if (k == NULL || v == NULL) {
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t key = 2 * r;
        fwrite(&key, sizeof key, 1, k);
        for (int c = 0; c < DIM; c++) {
            float x = (float)key + (float)c;
            fwrite(&x, sizeof x, 1, v);
        }
    }
    fclose(k);
    fclose(v);
    return 0;
}

static void static_tables(void) {
    static float vectors[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++) {
        vectors[i] = (float)i * 0.5f;
    }
    int64_t vshape[2] = {ROWS, DIM};
    DLTensor v = host(vectors, F32, 2, vshape);
    strata_table_options topts = strata_table_options_default();
    topts.default_value = -2.0f;
    strata_table *t = NULL;
    if (!ok(strata_table_from_dlpack(&v, NULL, &topts, &t), "strata_table_from_dlpack")) {
        return;
    }
    int64_t keys[4] = {3, 63, 64, 0};
    int64_t kshape[1] = {4};
    float out[4 * DIM];
    int64_t oshape[2] = {4, DIM};
    DLTensor k = host(keys, I64, 1, kshape);
    DLTensor o = host(out, F32, 2, oshape);
    strata_lookup_options lopts = strata_lookup_options_default();
    lopts.num_threads = 1;
    strata_lookup_stats stats = strata_lookup_stats_default();
    ok(strata_lookup(t, &k, &o, &lopts, &stats), "strata_lookup");
    check(stats.hits == 3 && stats.misses == 1 && stats.volatile_hits == 0, "lookup stats");
    check(out[0] == vectors[3 * DIM] && out[DIM + 7] == vectors[63 * DIM + 7], "rows found");
    check(out[2 * DIM] == -2.0f && out[3 * DIM - 1] == -2.0f, "the missing key gets default_value");
    check(out[3 * DIM] == 0.0f, "row 0");

    struct strata_table_info info = strata_table_info_default();
    ok(strata_table_get_info(t, &info), "strata_table_get_info");
    check(info.rows == ROWS && info.dim == DIM && !info.keyed && !info.mapped && info.vector_bytes == ROWS * DIM * 4,
          "table info");

    /* The table as a partition description, and a table rebuilt from it. */
    strata_partitioned *desc = NULL;
    if (ok(strata_table_partitioned(t, &desc), "strata_table_partitioned")) {
        check(desc->ndim == 2 && desc->shape[0] == ROWS && desc->shape[1] == DIM, "description shape");
        check(desc->partitions[0].num_locations == 1 && desc->partitions[0].locations[0].rank == 0,
              "description location");
        ok(strata_partitioned_validate(desc), "strata_partitioned_validate");
        strata_table *again = NULL;
        if (ok(strata_table_from_partitioned(desc, NULL, NULL, &again), "strata_table_from_partitioned")) {
            float out2[4 * DIM];
            DLTensor o2 = host(out2, F32, 2, oshape);
            ok(strata_lookup(again, &k, &o2, NULL, NULL), "lookup on the rebuilt table");
            check(memcmp(out2, out, DIM * sizeof(float)) == 0, "the rebuilt table has the same rows");
            strata_table_free(again);
        }
        strata_partitioned_free(desc);
    }

    /* A description built by hand, with the 0.3 initialisers. */
    strata_partition_location loc = strata_partition_location_default();
    loc.rank = 0;
    int64_t start[2] = {0, 0};
    strata_partition part = strata_partition_default();
    part.start = start;
    part.shape = vshape;
    part.data = &v;
    part.locations = &loc;
    part.num_locations = 1;
    int64_t tiling[2] = {1, 1};
    strata_partitioned hand = strata_partitioned_default();
    hand.ndim = 2;
    hand.shape = vshape;
    hand.partition_tiling = tiling;
    hand.partitions = &part;
    strata_table *from_hand = NULL;
    if (ok(strata_table_from_partitioned(&hand, NULL, &topts, &from_hand), "a hand-built description")) {
        check(strata_table_len(from_hand) == ROWS && strata_table_dim(from_hand) == DIM, "its table's size");
        strata_table_free(from_hand);
    }
    strata_table_free(t);
}

static void server_tables(const char *dir) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"supportlonglong\": true,"
             " \"volatile_db\": {\"type\": \"parallel_hash_map\", \"initial_cache_rate\": 0.5},"
             " \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"%s/db\"},"
             " \"models\": [{\"model\": \"m\", \"sparse_files\": [\"%s/sparse\"],"
             " \"embedding_vecsize_per_table\": [%d], \"maxnum_catfeature_query_per_table_per_sample\": [1],"
             " \"deployed_device_list\": [0], \"max_batch_size\": 64}]}",
             dir, dir, DIM);
    strata_server *server = NULL;
    if (!ok(strata_server_open_json(json, dir, &server), "strata_server_open_json")) {
        return;
    }
    strata_table *t = NULL;
    if (ok(strata_server_table(server, "m", 0, &t), "strata_server_table")) {
        int64_t keys[3] = {0, 10, 11};
        int64_t kshape[1] = {3};
        float out[3 * DIM];
        int64_t oshape[2] = {3, DIM};
        DLTensor k = host(keys, I64, 1, kshape);
        DLTensor o = host(out, F32, 2, oshape);
        strata_lookup_stats stats = strata_lookup_stats_default();
        ok(strata_lookup(t, &k, &o, NULL, &stats), "server lookup");
        check(stats.hits == 2 && stats.misses == 1 && stats.volatile_hits + stats.persistent_hits == 2,
              "server lookup stats");
        check(out[DIM] == 10.0f && out[DIM + 3] == 13.0f, "server rows");
        strata_table_stats ts = strata_table_stats_default();
        ok(strata_table_get_stats(t, &ts), "strata_table_get_stats");
        check(ts.lookups == 1 && ts.keys == 3 && ts.misses == 1 && ts.persistent_rows == 32, "table stats");
    }
    strata_server_free(server);
}

int main(void) {
    printf("old_host: built against strata %s's header, running against libstrata %s\n", "0.3.0", strata_version());
    static_tables();
    char dir[] = "/tmp/strata-old-host-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char sparse[512];
    snprintf(sparse, sizeof sparse, "%s/sparse", dir);
    if (mkdir(sparse, 0700) != 0 || write_folder(sparse, 32) != 0) {
        fprintf(stderr, "old_host: cannot write %s\n", sparse);
        return 1;
    }
    server_tables(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "old_host: could not remove %s\n", dir);
    }
    printf("old_host: %d passed, %d failed\n", g_checks - g_failed, g_failed);
    return g_failed != 0;
}
