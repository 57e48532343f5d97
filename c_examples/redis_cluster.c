/*
 * A parameter server whose volatile tier is a Redis Cluster shared by every process that opens
 * the same ps.json (HPS `volatile_db.type = "redis_cluster"`), with LMDB behind it.
 *
 *   redis_cluster HOST:PORT[,HOST:PORT...] [PASSWORD]
 *   STRATA_REDIS_ADDRESS=127.0.0.1:7000 STRATA_REDIS_PASSWORD=pw redis_cluster
 *
 * The program makes a small model in a temporary folder (HugeCTR sparse format), writes a
 * ps.json naming the cluster, and then uses only strata's C API: it looks rows up (the first
 * lookup promotes what the warm-up left out), updates two rows (durable in LMDB, and in Redis
 * for every other process at once), erases one, prints the per-tier statistics, shows the
 * error a wrong password gives, and puts the original rows back so that it can run again on
 * the same cluster. Exits 0 when every check passes, 77 (skipped) without a cluster address.
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

enum { ROWS = 5000, DIM = 16 };

static float value(int64_t key, int64_t c) { return (float)(key % 1000) * 0.5f + (float)c; }

/* A compact 1-D int64 or 2-D float32 tensor over caller memory. */
static DLTensor tensor(void *data, int ndim, int64_t *shape, int64_t *strides, DLDataType dtype) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dtype, shape, strides, 0};
    return t;
}

/* Writes ps.json into dir for the cluster at address with password; returns 0 on success. */
static int write_config(const char *path, const char *dir, const char *address, const char *password) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    fprintf(f,
            "{\n"
            "  \"supportlonglong\": true,\n"
            "  \"volatile_db\": {\n"
            "    \"type\": \"redis_cluster\",\n"
            "    \"address\": \"%s\",\n"
            "    \"user_name\": \"default\", \"password\": \"%s\",\n"
            "    \"num_partitions\": 8, \"num_node_connections\": 2,\n"
            "    \"max_get_batch_size\": 4096, \"max_set_batch_size\": 1024,\n"
            "    \"initial_cache_rate\": 0.5, \"cache_missed_embeddings\": true,\n"
            "    \"strata_redis_timeout_ms\": 500\n"
            "  },\n"
            "  \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"%s/db\"},\n"
            "  \"models\": [{\"model\": \"redis_example\", \"sparse_files\": [\"%s/sparse\"],\n"
            "              \"embedding_table_names\": [\"t\"], \"embedding_vecsize_per_table\": [%d],\n"
            "              \"default_value_for_each_table\": [-1.0],\n"
            "              \"maxnum_catfeature_query_per_table_per_sample\": [1],\n"
            "              \"deployed_device_list\": [0]}]\n"
            "}\n",
            address, password, dir, dir, DIM);
    return fclose(f) == 0 ? 0 : -1;
}

static void print_stats(const strata_table *t) {
    strata_table_stats s = strata_table_stats_default();
    CHECK(strata_table_get_stats(t, &s));
    printf("statistics: lookups %" PRIu64 ", keys %" PRIu64 ": Redis hits %" PRIu64
           ", LMDB hits %" PRIu64 ", misses %" PRIu64 "; rows in Redis %" PRIu64
           ", in LMDB %" PRIu64 "; upserts %" PRIu64 ", erases %" PRIu64 "\n",
           s.lookups, s.keys, s.volatile_hits, s.persistent_hits, s.misses, s.volatile_rows,
           s.persistent_rows, s.upserts, s.erases);
}

int main(int argc, char **argv) {
    const char *address = argc > 1 ? argv[1] : getenv("STRATA_REDIS_ADDRESS");
    const char *password = argc > 2 ? argv[2] : getenv("STRATA_REDIS_PASSWORD");
    if (address == NULL || address[0] == '\0') {
        printf("redis_cluster: skipped: no cluster given (argument or STRATA_REDIS_ADDRESS)\n");
        return 77;
    }
    if (password == NULL) {
        password = "";
    }

    char dir[] = "/tmp/strata-redis-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/sparse", dir);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/sparse/key", dir);
    FILE *k = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/sparse/emb_vector", dir);
    FILE *v = fopen(path, "wb");
    if (k == NULL || v == NULL) {
        perror(path);
        return 1;
    }
    for (int64_t key = 0; key < ROWS; key++) {
        fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < DIM; c++) {
            float x = value(key, c);
            fwrite(&x, sizeof x, 1, v);
        }
    }
    fclose(k);
    fclose(v);

    /* A wrong password is a configuration error naming the field. */
    char ps_path[4200];
    snprintf(ps_path, sizeof ps_path, "%s/wrong.json", dir);
    if (write_config(ps_path, dir, address, "not-the-password") != 0) {
        return 1;
    }
    strata_server *server = NULL;
    strata_status s = strata_server_open(ps_path, &server);
    printf("with a wrong password: %s: %s\n", strata_status_name(s), strata_last_error());
    EXPECT(s == STRATA_CONFIG_ERROR && strstr(strata_last_error(), "volatile_db.password") != NULL,
           "a wrong password is STRATA_CONFIG_ERROR naming volatile_db.password");

    snprintf(ps_path, sizeof ps_path, "%s/ps.json", dir);
    if (write_config(ps_path, dir, address, password) != 0) {
        return 1;
    }
    CHECK(strata_server_open(ps_path, &server));
    strata_table *t = NULL;
    CHECK(strata_server_table(server, "redis_example", 0, &t));

    /* Look up 2000 keys, a tenth of them missing, twice: the first lookup reads what the
     * warm-up (initial_cache_rate 0.5) left out from LMDB and promotes it into Redis. */
    enum { N = 2000 };
    static int64_t keys[N];
    static float out[N * DIM];
    for (int i = 0; i < N; i++) {
        keys[i] = i % 10 == 9 ? -1 - i : (int64_t)((i * 7919) % ROWS);
    }
    int64_t kshape[1] = {N}, kstrides[1] = {1};
    int64_t oshape[2] = {N, DIM}, ostrides[2] = {DIM, 1};
    DLDataType i64 = {kDLInt, 64, 1}, f32 = {kDLFloat, 32, 1};
    DLTensor kt = tensor(keys, 1, kshape, kstrides, i64);
    DLTensor ot = tensor(out, 2, oshape, ostrides, f32);
    strata_lookup_stats st = strata_lookup_stats_default();
    for (int round = 0; round < 2; round++) {
        CHECK(strata_lookup(t, &kt, &ot, NULL, &st));
        printf("lookup %d: %" PRIu64 " hits (%" PRIu64 " from Redis, %" PRIu64 " from LMDB), %" PRIu64
               " misses\n",
               round + 1, st.hits, st.volatile_hits, st.persistent_hits, st.misses);
        EXPECT(st.hits == 1800 && st.misses == 200, "1800 hits and 200 misses");
        for (int i = 0; i < N; i++) {
            float want = keys[i] < 0 ? -1.0f : value(keys[i], 5);
            EXPECT(out[i * DIM + 5] == want, "rows match the model file");
        }
    }
    EXPECT(st.volatile_hits == 1800, "the second lookup is served from Redis");

    /* Update two rows and erase one. An upsert that returns STRATA_OK is committed to LMDB and
     * every process sharing the cluster reads the new rows from its next lookup on. */
    int64_t ukeys[2] = {7, 11};
    float urows[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++) {
        urows[i] = 1000.0f + (float)i;
    }
    int64_t ushape[1] = {2}, vshape[2] = {2, DIM};
    DLTensor ukt = tensor(ukeys, 1, ushape, kstrides, i64);
    DLTensor uvt = tensor(urows, 2, vshape, ostrides, f32);
    CHECK(strata_table_upsert(t, &ukt, &uvt));
    int64_t ekeys[1] = {13};
    int64_t eshape[1] = {1};
    DLTensor ekt = tensor(ekeys, 1, eshape, kstrides, i64);
    uint64_t erased = 0;
    CHECK(strata_table_erase(t, &ekt, &erased));
    EXPECT(erased == 1, "key 13 was erased");

    int64_t lkeys[3] = {7, 11, 13};
    int64_t lshape[1] = {3}, loshape[2] = {3, DIM};
    DLTensor lkt = tensor(lkeys, 1, lshape, kstrides, i64);
    DLTensor lot = tensor(out, 2, loshape, ostrides, f32);
    CHECK(strata_lookup(t, &lkt, &lot, NULL, &st));
    EXPECT(memcmp(out, urows, sizeof urows) == 0, "the upserted rows are served");
    EXPECT(out[2 * DIM] == -1.0f && st.misses == 1, "the erased key gets the default row");
    printf("after the update: keys 7 and 11 hold %.0f.. and %.0f.., key 13 is gone (%" PRIu64
           " miss)\n",
           out[0], out[DIM], st.misses);
    print_stats(t);

    /* Put the original rows back, so the next run finds the cluster as this one did. */
    float orig[3 * DIM];
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < DIM; c++) {
            orig[r * DIM + c] = value(lkeys[r], c);
        }
    }
    DLTensor ovt = tensor(orig, 2, loshape, ostrides, f32);
    CHECK(strata_table_upsert(t, &lkt, &ovt));
    strata_server_free(server);

    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    if (failures != 0) {
        fprintf(stderr, "redis_cluster: %d checks failed\n", failures);
        return 1;
    }
    printf("redis_cluster: all checks passed\n");
    return 0;
}
