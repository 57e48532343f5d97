/*
 * One parameter server per configuration per process, seen from C.
 *
 * strata keeps one server per configuration: opening a ps.json that is already open (however
 * its path is spelled) gives another counted handle on the same server — the same tables, the
 * same volatile tier, the same strata_table pointers — and the last strata_server_free closes
 * it. This program shows that, as a host with many layers over one ps.json would see it:
 *
 *   1. three opens spelled dir/ps.json, dir/./ps.json and dir/sub/../ps.json lend equal
 *      strata_server_table pointers (and so do two opens of the same JSON text);
 *   2. an upsert through one handle's table and an erase through another's are seen at once
 *      through every handle;
 *   3. strata_table_get_stats shows one volatile tier: a row promoted by a lookup through one
 *      handle is a volatile hit through another, and the lookups through every handle add up
 *      in one set of counters;
 *   4. handles freed in every order (first first, last first, middle first, ...) leave the
 *      tables usable until the last one goes, and the next open is a fresh server;
 *   5. a second configuration naming the same persistent store is refused with
 *      STRATA_CONFIG_ERROR naming both configurations;
 *   6. 8 threads open, look up and free at once against the same ps.json (run under ASan by
 *      ctest and under valgrind by scripts/c-tests.sh).
 *
 * The program writes its model (a HugeCTR sparse folder: `key`, int64 little-endian, and
 * `emb_vector`, float32 rows) and ps.json into a temporary folder.
 *
 *   shared_server [iterations per thread]     # default 20; exits 0 when every check passes
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata.h"
#include "check.h"

enum { ROWS = 1000, DIM = 8 };
static const float DEFAULT_VALUE = -1.0f;

/* Column c of key's row in the model files. */
static float value(int64_t key, int64_t c) { return (float)key * 0.5f + (float)c; }

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* dir/name: a HugeCTR sparse folder with keys 0..ROWS-1. */
static void write_model(const char *dir, const char *name) {
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
    for (int64_t key = 0; key < ROWS; key++) {
        fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < DIM; c++) {
            float x = value(key, c);
            fwrite(&x, sizeof x, 1, v);
        }
    }
    fclose(k);
    fclose(v);
}

/* A ps.json over model folder "t0" and the store folder "db", both relative to its folder.
 * `cache_rows` (the volatile tier's overflow margin) tells two configurations apart. */
static void ps_json(char *out, size_t size, int cache_rows) {
    snprintf(out, size,
             "{\n"
             "  \"supportlonglong\": true,\n"
             "  \"volatile_db\": {\"type\": \"parallel_hash_map\", \"num_partitions\": 2,\n"
             "                  \"overflow_margin\": %d, \"initial_cache_rate\": 0.0,\n"
             "                  \"cache_missed_embeddings\": true},\n"
             "  \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"db\"},\n"
             "  \"models\": [\n"
             "    {\"model\": \"m\", \"sparse_files\": [\"t0\"], \"embedding_vecsize_per_table\": [%d],\n"
             "     \"default_value_for_each_table\": [%.1f],\n"
             "     \"maxnum_catfeature_query_per_table_per_sample\": [1],\n"
             "     \"deployed_device_list\": [0], \"max_batch_size\": 64}\n"
             "  ]\n"
             "}\n",
             cache_rows, DIM, (double)DEFAULT_VALUE);
}

static const DLDataType I64 = {kDLInt, 64, 1}, F32 = {kDLFloat, 32, 1};

/* Looks n keys up in `t` on the calling thread only; rows into out[n * DIM]. */
static strata_status lookup(strata_table *t, const int64_t *keys, int64_t n, float *out, strata_lookup_stats *st) {
    int64_t kshape[1] = {n}, kstrides[1] = {1}, oshape[2] = {n, DIM}, ostrides[2] = {DIM, 1};
    DLTensor kt = {(void *)keys, {kDLCPU, 0}, 1, I64, kshape, kstrides, 0};
    DLTensor ot = {out, {kDLCPU, 0}, 2, F32, oshape, ostrides, 0};
    strata_lookup_options opts = strata_lookup_options_default();
    opts.num_threads = 1;
    return strata_lookup(t, &kt, &ot, &opts, st);
}

/* Whether row r of `out` is `key`'s row of the model files. */
static int is_model_row(const float *row, int64_t key) {
    for (int c = 0; c < DIM; c++) {
        if (row[c] != value(key, c)) {
            return 0;
        }
    }
    return 1;
}

static int is_const_row(const float *row, float x) {
    for (int c = 0; c < DIM; c++) {
        if (row[c] != x) {
            return 0;
        }
    }
    return 1;
}

static strata_table *table_of(strata_server *s) {
    strata_table *t = NULL;
    CHECK(strata_server_table(s, "m", 0, &t));
    return t;
}

static strata_table_stats stats_of(const strata_table *t) {
    strata_table_stats st = strata_table_stats_default();
    CHECK(strata_table_get_stats(t, &st));
    return st;
}

static char dir[] = "/tmp/strata-shared-XXXXXX";
/* Three spellings of one ps.json. */
static char spell[3][4200];

/* 1. Two and three opens of one ps.json, spelled differently: one server. */
static void same_file_spelled_differently(void) {
    strata_server *a = NULL, *b = NULL, *c = NULL;
    CHECK(strata_server_open(spell[0], &a));
    CHECK(strata_server_open(spell[1], &b));
    EXPECT(a != b, "each open returns its own handle to free");
    EXPECT(table_of(a) == table_of(b), "two opens (%s, %s): equal table pointers", spell[0], spell[1]);
    CHECK(strata_server_open(spell[2], &c));
    EXPECT(table_of(a) == table_of(c) && table_of(b) == table_of(c), "three opens (+ %s): equal table pointers",
           spell[2]);
    int32_t models = 0;
    CHECK(strata_server_num_models(c, &models));
    EXPECT(models == 1, "one model through the third handle, got %d", models);
    printf("1. %s, %s and %s: one server (table %p through each handle)\n", spell[0], spell[1], spell[2],
           (void *)table_of(a));

    strata_server_free(a);
    strata_server_free(b);
    strata_server_free(c);

    /* The same JSON text with the same base folder, spelled dir and dir/sub/..: one server too
     * (a configuration is its file, or its text and base folder; the text is another
     * configuration on the file's store, so it is opened once the file's server has closed). */
    char json[4096], sub_dir[4200];
    ps_json(json, sizeof json, 100000);
    snprintf(sub_dir, sizeof sub_dir, "%s/sub/..", dir);
    strata_server *j1 = NULL, *j2 = NULL;
    CHECK(strata_server_open_json(json, dir, &j1));
    CHECK(strata_server_open_json(json, sub_dir, &j2));
    EXPECT(table_of(j1) == table_of(j2), "the same JSON text and base folder: equal table pointers");
    strata_server_free(j1);
    strata_server_free(j2);
    printf("   the same JSON text opened twice (base %s and %s): one server\n", dir, sub_dir);
}

/* 2. An upsert through one handle and an erase through another: seen through every handle. */
static void updates_seen_through_every_handle(void) {
    strata_server *h[3] = {NULL, NULL, NULL};
    strata_table *t[3];
    for (int i = 0; i < 3; i++) {
        CHECK(strata_server_open(spell[i], &h[i]));
        t[i] = table_of(h[i]);
    }
    /* Warm every handle's view of key 7 first: a stale copy anywhere would show below. */
    int64_t key = 7;
    float out[DIM];
    for (int i = 0; i < 3; i++) {
        CHECK(lookup(t[i], &key, 1, out, NULL));
        EXPECT(is_model_row(out, key), "key 7 before the upsert, handle %d", i);
    }
    float row[DIM];
    for (int c = 0; c < DIM; c++) {
        row[c] = 1000.0f + (float)c;
    }
    int64_t kshape[1] = {1}, vshape[2] = {1, DIM}, kstrides[1] = {1}, vstrides[2] = {DIM, 1};
    DLTensor kt = {&key, {kDLCPU, 0}, 1, I64, kshape, kstrides, 0};
    DLTensor vt = {row, {kDLCPU, 0}, 2, F32, vshape, vstrides, 0};
    CHECK(strata_table_upsert(t[1], &kt, &vt));
    for (int i = 0; i < 3; i++) {
        strata_lookup_stats st = strata_lookup_stats_default();
        CHECK(lookup(t[i], &key, 1, out, &st));
        EXPECT(memcmp(out, row, sizeof row) == 0 && st.hits == 1, "the upsert through handle 1, seen through %d", i);
    }
    uint64_t erased = 0;
    CHECK(strata_table_erase(t[2], &kt, &erased));
    EXPECT(erased == 1, "the erase through handle 2 removed 1 row, said %" PRIu64, erased);
    for (int i = 0; i < 3; i++) {
        strata_lookup_stats st = strata_lookup_stats_default();
        CHECK(lookup(t[i], &key, 1, out, &st));
        EXPECT(is_const_row(out, DEFAULT_VALUE) && st.misses == 1, "the erase through handle 2, seen through %d", i);
    }
    /* Put the model's row back for the rest of the program. */
    for (int c = 0; c < DIM; c++) {
        row[c] = value(key, c);
    }
    CHECK(strata_table_upsert(t[0], &kt, &vt));
    for (int i = 0; i < 3; i++) {
        strata_server_free(h[i]);
    }
    printf("2. an upsert through handle 1 and an erase through handle 2: seen at once through all three\n");
}

/* 3. One volatile tier, one set of counters. */
static void one_volatile_tier(void) {
    strata_server *a = NULL, *b = NULL;
    CHECK(strata_server_open(spell[0], &a));
    CHECK(strata_server_open(spell[2], &b));
    strata_table *ta = table_of(a), *tb = table_of(b);
    strata_table_stats before = stats_of(ta);

    /* 10 keys never looked up: through a, read from the persistent tier and promoted... */
    int64_t keys[10];
    float out[10 * DIM];
    for (int i = 0; i < 10; i++) {
        keys[i] = 500 + i;
    }
    strata_lookup_stats st = strata_lookup_stats_default();
    CHECK(lookup(ta, keys, 10, out, &st));
    EXPECT(st.persistent_hits == 10 && st.volatile_hits == 0, "first lookup through a: %" PRIu64
           " persistent hits, %" PRIu64 " volatile", st.persistent_hits, st.volatile_hits);
    /* ...so through b they are volatile hits: b has no volatile tier of its own. */
    CHECK(lookup(tb, keys, 10, out, &st));
    EXPECT(st.volatile_hits == 10 && st.persistent_hits == 0, "then through b: %" PRIu64 " volatile hits, %" PRIu64
           " persistent", st.volatile_hits, st.persistent_hits);
    for (int i = 0; i < 10; i++) {
        EXPECT(is_model_row(out + i * DIM, keys[i]), "row of key %" PRId64, keys[i]);
    }
    CHECK(lookup(tb, keys, 4, out, NULL));

    strata_table_stats sa = stats_of(ta), sb = stats_of(tb);
    EXPECT(memcmp(&sa, &sb, sizeof sa) == 0, "the stats through a and through b are one set of counters");
    EXPECT(sa.lookups - before.lookups == 3 && sa.keys - before.keys == 24,
           "3 lookups of 24 keys through two handles add up: %" PRIu64 " lookups, %" PRIu64 " keys",
           sa.lookups - before.lookups, sa.keys - before.keys);
    EXPECT(sa.persistent_hits - before.persistent_hits == 10 && sa.volatile_hits - before.volatile_hits == 14,
           "10 persistent hits and 14 volatile hits, got %" PRIu64 " and %" PRIu64,
           sa.persistent_hits - before.persistent_hits, sa.volatile_hits - before.volatile_hits);
    EXPECT(sa.volatile_rows == sb.volatile_rows && sa.volatile_rows >= 10, "volatile_rows %" PRIu64 " and %" PRIu64,
           sa.volatile_rows, sb.volatile_rows);
    printf("3. one volatile tier: lookups %" PRIu64 ", keys %" PRIu64 ", volatile hits %" PRIu64
           ", persistent hits %" PRIu64 ", volatile rows %" PRIu64 " through either handle\n",
           sa.lookups, sa.keys, sa.volatile_hits, sa.persistent_hits, sa.volatile_rows);
    strata_server_free(b);
    strata_server_free(a);
}

/* 4. Handles freed in every order: tables usable until the last one goes. */
static void freed_in_every_order(void) {
    static const int orders[6][3] = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {1, 2, 0}, {0, 2, 1}, {2, 0, 1}};
    for (int o = 0; o < 6; o++) {
        strata_server *h[3];
        for (int i = 0; i < 3; i++) {
            CHECK(strata_server_open(spell[i], &h[i]));
        }
        strata_table *t = table_of(h[0]);
        /* A fresh server: its counters start at zero (the previous one closed). */
        strata_table_stats fresh = stats_of(t);
        EXPECT(fresh.lookups == 0, "order %d: a fresh server after the last handle went (%" PRIu64 " lookups)", o,
               fresh.lookups);
        for (int step = 0; step < 3; step++) {
            strata_server_free(h[orders[o][step]]);
            h[orders[o][step]] = NULL;
            if (step == 2) {
                break;
            }
            int64_t keys[3] = {1, 998, 12345};
            float out[3 * DIM];
            CHECK(lookup(t, keys, 3, out, NULL));
            EXPECT(is_model_row(out, 1) && is_model_row(out + DIM, 998) && is_const_row(out + 2 * DIM, DEFAULT_VALUE),
                   "order %d: the table after freeing %d handle(s)", o, step + 1);
            for (int i = 0; i < 3; i++) {
                if (h[i] != NULL) {
                    EXPECT(table_of(h[i]) == t, "order %d: a remaining handle lends the same table", o);
                }
            }
            EXPECT(stats_of(t).lookups == (uint64_t)step + 1, "order %d: counters kept while a handle remains", o);
        }
    }
    printf("4. handles freed in all 6 orders: the table served until the last handle, then a fresh server\n");
}

/* 5. A second configuration on the same store is refused, naming both. */
static void second_configuration_on_the_store(void) {
    char json[4096], other[4200];
    ps_json(json, sizeof json, 5000); /* same store "db", other volatile tier */
    snprintf(other, sizeof other, "%s/other.json", dir);
    write_file(other, json);

    strata_server *first = NULL, *second = NULL;
    CHECK(strata_server_open(spell[1], &first));
    strata_status s = strata_server_open(other, &second);
    const char *msg = strata_last_error();
    EXPECT(s == STRATA_CONFIG_ERROR && second == NULL, "other.json on the open store: %s", strata_status_name(s));
    EXPECT(strstr(msg, other) != NULL && strstr(msg, spell[1]) != NULL && strstr(msg, "/db") != NULL,
           "the message names both configurations and the store: %s", msg);
    printf("5. a second configuration on the same store: %s\n   %s\n", strata_status_name(s), msg);

    /* The same text given as JSON is another configuration too. */
    s = strata_server_open_json(json, dir, &second);
    EXPECT(s == STRATA_CONFIG_ERROR && strstr(strata_last_error(), spell[1]) != NULL,
           "JSON text on the open store: %s: %s", strata_status_name(s), strata_last_error());
    if (s == STRATA_OK) {
        strata_server_free(second);
        second = NULL;
    }
    strata_server_free(first);

    /* With the first closed, the store is free for the other configuration. */
    CHECK(strata_server_open(other, &second));
    int64_t key = 3;
    float out[DIM];
    CHECK(lookup(table_of(second), &key, 1, out, NULL));
    EXPECT(is_model_row(out, 3), "other.json serves the store once it is the only configuration on it");
    strata_server_free(second);
}

/* 6. Opens, lookups and frees on 8 threads at once. */
enum { THREADS = 8 };
static int iterations = 20;

static void *opener(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int it = 0; it < iterations; it++) {
        strata_server *s = NULL;
        strata_status st = strata_server_open(spell[(id + it) % 3], &s);
        if (st != STRATA_OK) {
            EXPECT(0, "thread %d: open: %s: %s", id, strata_status_name(st), strata_last_error());
            return NULL;
        }
        strata_table *t = NULL;
        st = strata_server_table(s, "m", 0, &t);
        EXPECT(st == STRATA_OK, "thread %d: strata_server_table: %s", id, strata_status_name(st));
        int64_t keys[4] = {id, 100 + it, 999 - id * 10, -1 - id};
        float out[4 * DIM];
        st = t == NULL ? st : lookup(t, keys, 4, out, NULL);
        EXPECT(st == STRATA_OK && is_model_row(out, keys[0]) && is_model_row(out + DIM, keys[1]) &&
                   is_model_row(out + 2 * DIM, keys[2]) && is_const_row(out + 3 * DIM, DEFAULT_VALUE),
               "thread %d iteration %d: rows", id, it);
        strata_server_free(s);
    }
    return NULL;
}

static void run_threads(void) {
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        if (pthread_create(&th[i], NULL, opener, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
    }
}

static void threads_open_and_free(void) {
    /* With a handle held here, every thread's handle is on this server: their lookups add up. */
    strata_server *held = NULL;
    CHECK(strata_server_open(spell[0], &held));
    strata_table *t = table_of(held);
    uint64_t before = stats_of(t).lookups;
    run_threads();
    uint64_t after = stats_of(t).lookups;
    EXPECT(after - before == (uint64_t)THREADS * (uint64_t)iterations,
           "%d threads x %d lookups on one server, counted %" PRIu64, THREADS, iterations, after - before);
    strata_server_free(held);
    /* Without one, servers open and close under the threads' feet. */
    run_threads();
    printf("6. %d threads x %d opens, lookups and frees, with and without a handle held elsewhere\n", THREADS,
           iterations);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        iterations = atoi(argv[1]);
        if (iterations < 1) {
            fprintf(stderr, "usage: shared_server [iterations per thread >= 1]\n");
            return 2;
        }
    }
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    write_model(dir, "t0");
    char path[4200];
    snprintf(path, sizeof path, "%s/sub", dir);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        return 1;
    }
    char json[4096];
    ps_json(json, sizeof json, 100000);
    snprintf(spell[0], sizeof spell[0], "%s/ps.json", dir);
    snprintf(spell[1], sizeof spell[1], "%s/./ps.json", dir);
    snprintf(spell[2], sizeof spell[2], "%s/sub/../ps.json", dir);
    write_file(spell[0], json);

    same_file_spelled_differently();
    updates_seen_through_every_handle();
    one_volatile_tier();
    freed_in_every_order();
    second_configuration_on_the_store();
    threads_open_and_free();

    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    if (failures != 0) {
        fprintf(stderr, "shared_server: %d checks failed\n", failures);
        return 1;
    }
    printf("shared_server: all checks passed\n");
    return 0;
}
