/*
 * The struct_size rules of strata's extensible structs, one case each, through the C ABI:
 *   - a struct_size of 0, below the first published layout, or not the size of any layout is
 *     refused with STRATA_INVALID_ARGUMENT and a message that says how to initialise it;
 *   - an in-struct larger than this library knows is accepted when its unknown tail is zero,
 *     and refused, naming the argument and struct_size, when it is not;
 *   - an out-struct is written up to its struct_size and not one byte further (the bytes past
 *     it are poisoned first and checked after); unknown tail bytes of a larger one are zeroed;
 *   - a refused struct makes the call fail before it does anything (out stays poisoned).
 * The reading of an older, smaller layout (defaults for the fields it lacks) has no case here
 * yet: 0.3 is the first published layout of every struct, so no older size exists. The
 * mechanism is unit-tested in src/ffi/sized.rs, and tests/abi/old_host.c runs a host built
 * against the frozen 0.3 header.
 */
#include "strata.h"

#include <stdio.h>
#include <string.h>

#define DIM 4
#define ROWS 8
#define POISON 0xA5

static int g_failed = 0, g_cases = 0;

static void expect(const char *name, strata_status got, strata_status want, const char *needle) {
    const char *msg = got == STRATA_OK ? "" : strata_last_error();
    int ok = got == want && (needle == NULL || strstr(msg, needle) != NULL);
    g_cases++;
    printf("%-4s %-52s %-24s %s\n", ok ? "ok" : "FAIL", name, strata_status_name(got), msg);
    if (!ok) {
        printf("     expected %s with \"%s\"\n", strata_status_name(want), needle ? needle : "");
        g_failed++;
    }
}

static void expect_true(const char *name, int cond) {
    g_cases++;
    printf("%-4s %s\n", cond ? "ok" : "FAIL", name);
    g_failed += !cond;
}

static int all_bytes(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != v) {
            return 0;
        }
    }
    return 1;
}

static float g_vectors[ROWS * DIM];
static int64_t g_vshape[2] = {ROWS, DIM};
static int64_t g_keys[3] = {1, 7, 100}; /* 100 is missing */
static int64_t g_kshape[1] = {3};
static float g_out[3 * DIM];
static int64_t g_oshape[2] = {3, DIM};

static DLTensor host(void *data, DLDataType dt, int32_t ndim, int64_t *shape) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dt, shape, NULL, 0};
    return t;
}

static strata_status lookup(strata_table *t, const strata_lookup_options *o, strata_lookup_stats *st) {
    DLTensor k = host(g_keys, (DLDataType){kDLInt, 64, 1}, 1, g_kshape);
    DLTensor out = host(g_out, (DLDataType){kDLFloat, 32, 1}, 2, g_oshape);
    memset(g_out, POISON, sizeof g_out);
    return strata_lookup(t, &k, &out, o, st);
}

/* A struct of a newer strata: this library's layout followed by fields it does not know. */
struct newer_table_options {
    strata_table_options known;
    uint64_t unknown[2];
};
struct newer_lookup_options {
    strata_lookup_options known;
    uint64_t unknown[2];
};
struct newer_lookup_stats {
    strata_lookup_stats known;
    uint64_t unknown[2];
    unsigned char guard[32];
};

static void table_options_rules(const DLTensor *v) {
    strata_table *t = NULL;
    strata_table_options o = strata_table_options_default();
    expect_true("strata_table_options_default sets struct_size", o.struct_size == sizeof(strata_table_options));

    o.struct_size = 0;
    expect("table options: struct_size 0", strata_table_from_dlpack(v, NULL, &o, &t), STRATA_INVALID_ARGUMENT,
           "opts: struct_size is 0; initialise it with strata_table_options_default()");
    expect_true("table options: struct_size 0 leaves *out NULL", t == NULL);
    o.struct_size = 8;
    expect("table options: below the first layout", strata_table_from_dlpack(v, NULL, &o, &t),
           STRATA_INVALID_ARGUMENT, "is below the first published size of strata_table_options");
    o.struct_size = sizeof(strata_table_options) + 4;
    expect("table options: not a layout's size", strata_table_from_dlpack(v, NULL, &o, &t), STRATA_INVALID_ARGUMENT,
           "is not the size of any version of strata_table_options");

    struct newer_table_options n;
    memset(&n, 0, sizeof n);
    n.known = strata_table_options_default();
    n.known.struct_size = sizeof n;
    n.known.default_value = 7.0f;
    expect("table options: larger, zero tail", strata_table_from_dlpack(v, NULL, &n.known, &t), STRATA_OK, NULL);
    expect("  and its fields are honoured", lookup(t, NULL, NULL), STRATA_OK, NULL);
    expect_true("  missing key 100 gets default_value 7", g_out[2 * DIM] == 7.0f && g_out[3 * DIM - 1] == 7.0f);
    strata_table_free(t);
    t = NULL;
    n.unknown[1] = 1;
    expect("table options: larger, non-zero tail", strata_table_from_dlpack(v, NULL, &n.known, &t),
           STRATA_INVALID_ARGUMENT, "opts: struct_size = 56, and byte 48 is not zero");
    expect_true("  leaves *out NULL", t == NULL);
}

static void lookup_options_rules(strata_table *t) {
    strata_lookup_options o = strata_lookup_options_default();
    expect_true("strata_lookup_options_default sets struct_size", o.struct_size == sizeof(strata_lookup_options));
    o.struct_size = 0;
    expect("lookup options: struct_size 0", lookup(t, &o, NULL), STRATA_INVALID_ARGUMENT,
           "opts: struct_size is 0; initialise it with strata_lookup_options_default()");
    expect_true("  nothing written to out", all_bytes(g_out, sizeof g_out, POISON));
    o.struct_size = 16;
    expect("lookup options: below the first layout", lookup(t, &o, NULL), STRATA_INVALID_ARGUMENT,
           "below the first published size of strata_lookup_options (24 bytes)");

    struct newer_lookup_options n;
    memset(&n, 0, sizeof n);
    n.known = strata_lookup_options_default();
    n.known.struct_size = sizeof n;
    n.known.num_threads = 1;
    expect("lookup options: larger, zero tail", lookup(t, &n.known, NULL), STRATA_OK, NULL);
    expect_true("  rows are right", g_out[0] == 4.0f && g_out[DIM] == 28.0f);
    n.unknown[0] = 3;
    expect("lookup options: larger, non-zero tail", lookup(t, &n.known, NULL), STRATA_INVALID_ARGUMENT,
           "opts: struct_size = 40, and byte 24 is not zero");
    expect_true("  nothing written to out", all_bytes(g_out, sizeof g_out, POISON));
}

static void lookup_stats_rules(strata_table *t) {
    struct newer_lookup_stats n;
    /* Exactly this library's size: the guard past it stays poisoned. */
    memset(&n, POISON, sizeof n);
    n.known.struct_size = sizeof(strata_lookup_stats);
    expect("lookup stats: this size", lookup(t, NULL, &n.known), STRATA_OK, NULL);
    expect_true("  counts written", n.known.hits == 2 && n.known.misses == 1 && n.known.volatile_hits == 0);
    expect_true("  struct_size kept", n.known.struct_size == sizeof(strata_lookup_stats));
    expect_true("  not one byte past struct_size written",
                all_bytes(n.unknown, sizeof n.unknown + sizeof n.guard, POISON));

    /* A newer caller's larger struct: the unknown fields are zeroed, the guard stays. */
    memset(&n, POISON, sizeof n);
    n.known.struct_size = sizeof(strata_lookup_stats) + sizeof n.unknown;
    expect("lookup stats: larger", lookup(t, NULL, &n.known), STRATA_OK, NULL);
    expect_true("  counts written, unknown fields zeroed",
                n.known.hits == 2 && n.known.misses == 1 && n.unknown[0] == 0 && n.unknown[1] == 0);
    expect_true("  the guard past struct_size untouched", all_bytes(n.guard, sizeof n.guard, POISON));

    memset(&n, POISON, sizeof n);
    n.known.struct_size = 0;
    expect("lookup stats: struct_size 0", lookup(t, NULL, &n.known), STRATA_INVALID_ARGUMENT,
           "stats: struct_size is 0; initialise it with strata_lookup_stats_default()");
    expect_true("  the lookup did not run", all_bytes(g_out, sizeof g_out, POISON));
    expect_true("  stats untouched", all_bytes(&n.known.hits, sizeof n - sizeof(size_t), POISON));
    n.known.struct_size = 24;
    expect("lookup stats: below the first layout", lookup(t, NULL, &n.known), STRATA_INVALID_ARGUMENT,
           "below the first published size of strata_lookup_stats (40 bytes)");
}

static void info_rules(strata_table *t) {
    struct {
        struct strata_table_info info;
        unsigned char guard[32];
    } b;
    memset(&b, POISON, sizeof b);
    b.info.struct_size = sizeof b.info;
    expect("table info: this size", strata_table_get_info(t, &b.info), STRATA_OK, NULL);
    expect_true("  fields written", b.info.rows == ROWS && b.info.dim == DIM && !b.info.keyed);
    expect_true("  the guard past struct_size untouched", all_bytes(b.guard, sizeof b.guard, POISON));
    memset(&b, POISON, sizeof b);
    b.info.struct_size = 0;
    expect("table info: struct_size 0", strata_table_get_info(t, &b.info), STRATA_INVALID_ARGUMENT,
           "info: struct_size is 0; initialise it with strata_table_info_default()");
    struct strata_table_info d = strata_table_info_default();
    expect_true("strata_table_info_default sets struct_size", d.struct_size == sizeof d);
}

static void stats_rules(strata_table *t) {
    struct {
        strata_table_stats s;
        unsigned char guard[32];
    } b;
    memset(&b, POISON, sizeof b);
    b.s.struct_size = sizeof b.s;
    expect("table stats: this size", strata_table_get_stats(t, &b.s), STRATA_OK, NULL);
    expect_true("  static tables count nothing", b.s.lookups == 0 && b.s.erases == 0);
    expect_true("  the guard past struct_size untouched", all_bytes(b.guard, sizeof b.guard, POISON));
    b.s.struct_size = 7;
    expect("table stats: garbage size", strata_table_get_stats(t, &b.s), STRATA_INVALID_ARGUMENT,
           "strata_table_stats_default()");
    strata_table_stats d = strata_table_stats_default();
    expect_true("strata_table_stats_default sets struct_size", d.struct_size == sizeof d);
}

/* The partition descriptions: an array's stride is its elements' struct_size. */
static void partition_rules(DLTensor *v) {
    int64_t start[2] = {0, 0}, tiling[2] = {1, 1};
    strata_partition_location loc = strata_partition_location_default();
    loc.rank = 0;
    struct newer_partition {
        strata_partition known;
        uint64_t unknown[2];
    } parts[1];
    memset(parts, 0, sizeof parts);
    parts[0].known = strata_partition_default();
    parts[0].known.start = start;
    parts[0].known.shape = g_vshape;
    parts[0].known.data = v;
    parts[0].known.locations = &loc;
    parts[0].known.num_locations = 1;
    strata_partitioned d = strata_partitioned_default();
    d.ndim = 2;
    d.shape = g_vshape;
    d.partition_tiling = tiling;
    d.partitions = &parts[0].known;
    expect("partitioned: defaults", strata_partitioned_validate(&d), STRATA_OK, NULL);
    d.struct_size = 0;
    expect("partitioned: struct_size 0", strata_partitioned_validate(&d), STRATA_INVALID_ARGUMENT,
           "struct_size is 0; initialise it with strata_partitioned_default()");
    d.struct_size = sizeof d;
    parts[0].known.struct_size = sizeof parts[0];
    expect("partition: larger element, zero tail", strata_partitioned_validate(&d), STRATA_OK, NULL);
    parts[0].unknown[1] = 9;
    expect("partition: larger element, non-zero tail", strata_partitioned_validate(&d), STRATA_INVALID_ARGUMENT,
           "is not zero");
    parts[0].unknown[1] = 0;
    loc.struct_size = 12;
    expect("location: garbage size", strata_partitioned_validate(&d), STRATA_INVALID_ARGUMENT,
           "strata_partition_location_default()");
}

int main(void) {
    for (int i = 0; i < ROWS * DIM; i++) {
        g_vectors[i] = (float)i;
    }
    DLTensor v = host(g_vectors, (DLDataType){kDLFloat, 32, 1}, 2, g_vshape);
    table_options_rules(&v);
    strata_table *t = NULL;
    strata_table_options o = strata_table_options_default();
    if (strata_table_from_dlpack(&v, NULL, &o, &t) != STRATA_OK) {
        fprintf(stderr, "struct_size: cannot build the table: %s\n", strata_last_error());
        return 1;
    }
    partition_rules(&v);
    lookup_options_rules(t);
    lookup_stats_rules(t);
    info_rules(t);
    stats_rules(t);
    strata_table_free(t);
    printf("struct_size: %d passed, %d failed\n", g_cases - g_failed, g_failed);
    return g_failed != 0;
}
