/*
 * strata error handling: what each kind of bad call returns, and how to report it.
 *
 * Every fallible strata function returns a strata_status (STRATA_OK == 0). On failure,
 * strata_status_name(s) names the status and strata_last_error() explains it, naming the
 * argument at fault ("keys: dtype float32; expected int32, int64, uint32 or uint64"). The
 * message is per thread and stays valid until the next failing call on that thread.
 *
 * This program makes one bad call per case, prints the status name and message, and checks
 * both: it exits with 1 if any case does not fail the way the API documents.
 */
#define _POSIX_C_SOURCE 200809L

#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIM 3
#define ROWS 4

static int g_failed = 0;
static int g_cases = 0;

/* Checks one case: the status must be `want` and (unless NULL) the message must contain
 * `needle`. Prints the case either way. */
static void expect(const char *name, strata_status got, strata_status want, const char *needle) {
    const char *msg = got == STRATA_OK ? "" : strata_last_error();
    int ok = got == want && (needle == NULL || strstr(msg, needle) != NULL);
    g_cases++;
    printf("%-4s %-34s %-26s %s\n", ok ? "ok" : "FAIL", name, strata_status_name(got), msg);
    if (!ok) {
        printf("     expected %s%s%s%s\n", strata_status_name(want), needle ? " with a message containing \"" : "",
               needle ? needle : "", needle ? "\"" : "");
        g_failed++;
    }
}

/* Fails the case `name` when `cond` is false. */
static void expect_true(const char *name, int cond, const char *what) {
    g_cases++;
    printf("%-4s %-34s %s\n", cond ? "ok" : "FAIL", name, what);
    if (!cond) {
        g_failed++;
    }
}

/* A tensor over caller memory. `strides` may be NULL (compact row-major). */
static DLTensor tensor(void *data, DLDeviceType dev, DLDataType dtype, int32_t ndim, int64_t *shape,
                       int64_t *strides) {
    DLTensor t = {data, {dev, 0}, ndim, dtype, shape, strides, 0};
    return t;
}

static const DLDataType I64 = {kDLInt, 64, 1};
static const DLDataType F32 = {kDLFloat, 32, 1};

/* Writes `n` bytes of `p` to dir/name. */
static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return -1;
    }
    int rc = fwrite(p, 1, n, f) == n ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

static void remove_dir(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/key", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/emb_vector", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    /* A small dense table (key = row number) to look up in. */
    float vectors[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++) {
        vectors[i] = (float)i;
    }
    int64_t vshape[2] = {ROWS, DIM};
    DLTensor vt = tensor(vectors, kDLCPU, F32, 2, vshape, NULL);
    strata_table *table = NULL;
    strata_status s = strata_table_from_dlpack(&vt, NULL, NULL, &table);
    if (s != STRATA_OK) {
        fprintf(stderr, "errors: strata_table_from_dlpack failed: %s: %s\n", strata_status_name(s),
                strata_last_error());
        return 1;
    }

    /* Good keys and out; each case below breaks one thing. */
    int64_t keys[2] = {1, 3};
    int64_t kshape[1] = {2};
    int64_t kstrides[1] = {1};
    DLTensor kt = tensor(keys, kDLCPU, I64, 1, kshape, kstrides);
    float out[2 * DIM + 1]; /* one spare float for the misaligned case */
    int64_t oshape[2] = {2, DIM};
    int64_t ostrides[2] = {DIM, 1};
    DLTensor ot = tensor(out, kDLCPU, F32, 2, oshape, ostrides);
    expect("good lookup", strata_lookup(table, &kt, &ot, NULL, NULL), STRATA_OK, NULL);

    /* NULL where a pointer is required: STRATA_NULL_ARGUMENT, naming the argument. */
    expect("NULL table", strata_lookup(NULL, &kt, &ot, NULL, NULL), STRATA_NULL_ARGUMENT, "table");
    expect("NULL keys", strata_lookup(table, NULL, &ot, NULL, NULL), STRATA_NULL_ARGUMENT, "keys");
    expect("NULL out", strata_lookup(table, &kt, NULL, NULL, NULL), STRATA_NULL_ARGUMENT, "out");
    expect("NULL out-parameter (table)", strata_table_from_dlpack(&vt, NULL, NULL, NULL), STRATA_NULL_ARGUMENT,
           "out");
    expect("NULL out-parameter (info)", strata_table_get_info(table, NULL), STRATA_NULL_ARGUMENT, "info");
    {
        /* A constructor that fails sets its out-parameter to NULL, so never pass it the
         * address of a handle you still need. */
        strata_table *t2 = (strata_table *)&vt; /* poison */
        expect("NULL vectors", strata_table_from_dlpack(NULL, NULL, NULL, &t2), STRATA_NULL_ARGUMENT, "vectors");
        expect_true("failed constructor sets *out", t2 == NULL, "*out is NULL after a failed call");
        t2 = (strata_table *)&vt;
        expect("NULL dir", strata_table_open(NULL, DIM, NULL, &t2), STRATA_NULL_ARGUMENT, "dir");
        expect_true("failed open sets *out", t2 == NULL, "*out is NULL after a failed call");
    }

    /* Wrong key dtype. */
    {
        float fkeys[2] = {1.0f, 3.0f};
        DLTensor bad = tensor(fkeys, kDLCPU, F32, 1, kshape, kstrides);
        expect("float32 keys", strata_lookup(table, &bad, &ot, NULL, NULL), STRATA_UNSUPPORTED_DTYPE, "keys");
    }

    /* out has the wrong shape: [2, DIM + 1] for a table of dim DIM. */
    {
        int64_t shape[2] = {2, DIM + 1};
        int64_t strides[2] = {DIM + 1, 1};
        float big[2 * (DIM + 1)];
        DLTensor bad = tensor(big, kDLCPU, F32, 2, shape, strides);
        expect("out shape mismatch", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_INVALID_ARGUMENT, "out");
    }

    /* Not an error: keys may have negative strides (here NumPy's keys[::-1]), read backwards
     * from the element data points at. */
    {
        int64_t strides[1] = {-1};
        DLTensor rev = tensor(&keys[1], kDLCPU, I64, 1, kshape, strides);
        expect("negative keys stride is served", strata_lookup(table, &rev, &ot, NULL, NULL), STRATA_OK, NULL);
        expect_true("reversed keys give reversed rows", out[0] == vectors[3 * DIM] && out[DIM] == vectors[1 * DIM],
                    "row 0 is key 3's, row 1 is key 1's");
    }
    /* Outputs may not: every output stride must be non-negative. */
    {
        int64_t strides[2] = {-DIM, 1};
        DLTensor bad = tensor(out + DIM, kDLCPU, F32, 2, oshape, strides);
        expect("negative out stride", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_INVALID_LAYOUT, "out");
    }

    /* out data that is not aligned for float32 (by pointer, then by byte_offset). */
    {
        DLTensor bad = tensor((char *)out + 1, kDLCPU, F32, 2, oshape, ostrides);
        expect("misaligned out data", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_INVALID_LAYOUT, "out");
        bad = ot;
        bad.byte_offset = 2;
        expect("misaligned out byte_offset", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_INVALID_LAYOUT,
               "out");
    }

    /* Overlapping out rows (row stride smaller than dim). */
    {
        int64_t strides[2] = {1, 1};
        DLTensor bad = tensor(out, kDLCPU, F32, 2, oshape, strides);
        expect("overlapping out rows", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_INVALID_LAYOUT, "out");
    }

    /* Host memory labelled as a CUDA tensor. Without a CUDA driver (or in a build without CUDA)
     * that is STRATA_UNSUPPORTED_DEVICE and the pointer is never read. With a device strata
     * would queue a kernel on it, so the case is only tried where there is none. */
    if (!strata_cuda_available()) {
        DLTensor bad = kt;
        bad.device.device_type = kDLCUDA;
        expect("kDLCUDA keys", strata_lookup(table, &bad, &ot, NULL, NULL), STRATA_UNSUPPORTED_DEVICE, "keys");
        bad = ot;
        bad.device.device_type = kDLCUDA;
        expect("kDLCUDA out", strata_lookup(table, &kt, &bad, NULL, NULL), STRATA_UNSUPPORTED_DEVICE, "out");
    }

    /* A missing key, on a table whose options make that an error. */
    {
        strata_table_options opts = strata_table_options_default();
        opts.missing_key = STRATA_MISSING_ERROR;
        strata_table *strict = NULL;
        s = strata_table_from_dlpack(&vt, NULL, &opts, &strict);
        expect("strict table", s, STRATA_OK, NULL);
        int64_t missing[2] = {1, 99};
        DLTensor mk = tensor(missing, kDLCPU, I64, 1, kshape, kstrides);
        expect("missing key (STRATA_MISSING_ERROR)", strata_lookup(strict, &mk, &ot, NULL, NULL),
               STRATA_KEY_NOT_FOUND, "99");
        /* The same key on a default table is filled and counted as a miss. */
        strata_lookup_stats st = strata_lookup_stats_default();
        expect("missing key (STRATA_MISSING_FILL)", strata_lookup(table, &mk, &ot, NULL, &st), STRATA_OK, NULL);
        expect_true("fill counts the miss", st.hits == 1 && st.misses == 1 && out[DIM] == 0.0f,
                    "1 hit, 1 miss, row filled with the default 0");
        strata_table_free(strict);

        opts.missing_key = 7;
        strict = (strata_table *)&vt;
        expect("bad opts->missing_key", strata_table_from_dlpack(&vt, NULL, &opts, &strict),
               STRATA_INVALID_ARGUMENT, "missing_key");
        expect_true("failed constructor sets *out", strict == NULL, "*out is NULL");
    }

    /* Opening HugeCTR sparse-format folders that are missing or broken. */
    {
        strata_table *t2 = NULL;
        expect("open a missing folder", strata_table_open("/nonexistent/strata-errors", DIM, NULL, &t2),
               STRATA_IO_ERROR, "/nonexistent/strata-errors");

        char dir[4096];
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/strata-errors-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("errors: mkdtemp");
            return 1;
        }
        int64_t two_keys[2] = {10, 20}; /* on a little-endian host these bytes are the file format */
        float two_rows[2 * DIM] = {0};
        /* A key file cut in the middle of a key. */
        if (write_file(dir, "key", two_keys, 12) != 0 || write_file(dir, "emb_vector", two_rows, sizeof two_rows) != 0) {
            perror("errors: writing table files");
            remove_dir(dir);
            return 1;
        }
        expect("open a truncated key file", strata_table_open(dir, DIM, NULL, &t2), STRATA_INVALID_FILE, "key");
        /* Whole files, but dim does not divide emb_vector (24 bytes is not rows of 4 floats). */
        if (write_file(dir, "key", two_keys, sizeof two_keys) != 0) {
            perror("errors: writing table files");
            remove_dir(dir);
            return 1;
        }
        expect("open with a wrong dim", strata_table_open(dir, DIM + 1, NULL, &t2), STRATA_INVALID_FILE, "dim");
        /* Row count disagrees with the key count. */
        expect("open with keys/rows disagreeing", strata_table_open(dir, 1, NULL, &t2), STRATA_INVALID_FILE,
               "key");
        expect("open with dim 0", strata_table_open(dir, 0, NULL, &t2), STRATA_INVALID_ARGUMENT, "dim");
        /* And the right dim works. */
        expect("open a good folder", strata_table_open(dir, DIM, NULL, &t2), STRATA_OK, NULL);
        expect_true("opened table", strata_table_len(t2) == 2 && strata_table_dim(t2) == DIM, "2 rows of dim 3");
        strata_table_free(t2);
        remove_dir(dir);
    }

    /* Zero keys is a valid no-op: nothing is written. */
    {
        int64_t zshape[1] = {0};
        int64_t zoshape[2] = {0, DIM};
        DLTensor zk = tensor(keys, kDLCPU, I64, 1, zshape, kstrides);
        for (int i = 0; i < 2 * DIM + 1; i++) {
            out[i] = 12345.0f;
        }
        DLTensor zo = tensor(out, kDLCPU, F32, 2, zoshape, ostrides);
        strata_lookup_stats st = strata_lookup_stats_default();
        st.hits = st.misses = 77;
        expect("zero keys", strata_lookup(table, &zk, &zo, NULL, &st), STRATA_OK, NULL);
        int untouched = 1;
        for (int i = 0; i < 2 * DIM + 1; i++) {
            untouched &= out[i] == 12345.0f;
        }
        expect_true("zero keys writes nothing", untouched && st.hits == 0 && st.misses == 0,
                    "out unchanged, stats 0 hits 0 misses");
    }

    /* Handles: free(NULL) is a no-op; accessors on NULL return -1 and set the message. */
    strata_table_free(NULL);
    expect_true("strata_table_free(NULL)", 1, "returns");
    {
        int64_t d = strata_table_dim(NULL);
        expect_true("strata_table_dim(NULL) == -1", d == -1 && strstr(strata_last_error(), "table") != NULL,
                    strata_last_error());
        int64_t n = strata_table_len(NULL);
        expect_true("strata_table_len(NULL) == -1", n == -1, strata_last_error());
    }
    expect_true("unknown status name", strcmp(strata_status_name(-1), "STRATA_UNKNOWN_STATUS") == 0,
                strata_status_name(-1));

    strata_table_free(table);
    printf("errors: %d cases, %d failed\n", g_cases, g_failed);
    return g_failed == 0 ? 0 : 1;
}
