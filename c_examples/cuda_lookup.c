/*
 * strata on a GPU: keys on the device in, rows on the device out, on the caller's CUDA stream.
 *
 *   cuda_lookup [placement [rows [dim [batch]]]]   defaults: static 1000000 128 200000
 *   placement: static | uvm | cache
 *
 * 1. Builds a dense float32 table (row r, column c holds r + c / 1024) from host memory with
 *    strata_table_from_dlpack; `placement` says where its rows live for CUDA lookups (copied to
 *    the device, page-locked in host memory and read over the bus, or a GPU cache of half the
 *    rows in front of the host table).
 * 2. Puts a batch of int64 keys on the device (about 10% past the last row: misses, which get
 *    the default value -1) and allocates a device output [batch, dim].
 * 3. Queues a lookup on a stream of its own with stats (the call then waits for the stream)
 *    and checks every row, then queues ten lookups without stats (the calls only enqueue),
 *    times them with CUDA events, and prints GB/s of rows written.
 *
 * Build: cc -I<strata>/include -I<cuda>/include cuda_lookup.c -L... -lstrata -lcudart
 * Without a CUDA device (or a strata built without CUDA) it prints "skipped: no CUDA device"
 * and exits with 0. Every failure prints the strata or CUDA error and exits with 1.
 */
#include "strata.h"

#include <cuda_runtime_api.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_VALUE (-1.0f)
#define REPEATS 10

static int strata_failed(strata_status s, const char *what) {
    if (s == STRATA_OK) {
        return 0;
    }
    fprintf(stderr, "%s: %s: %s\n", what, strata_status_name(s), strata_last_error());
    return 1;
}

static int cuda_failed(cudaError_t e, const char *what) {
    if (e == cudaSuccess) {
        return 0;
    }
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

/* The row value the table holds at (row, col). */
static float value(int64_t row, int64_t col) { return (float)row + (float)col / 1024.0f; }

int main(int argc, char **argv) {
    const char *placement = argc > 1 ? argv[1] : "static";
    int64_t rows = argc > 2 ? strtoll(argv[2], NULL, 10) : 1000000;
    int64_t dim = argc > 3 ? strtoll(argv[3], NULL, 10) : 128;
    int64_t batch = argc > 4 ? strtoll(argv[4], NULL, 10) : 200000;
    if (rows < 1 || dim < 1 || batch < 1) {
        fprintf(stderr, "usage: %s [static|uvm|cache [rows [dim [batch]]]]\n", argv[0]);
        return 2;
    }
    int devices = 0;
    if (!strata_cuda_available() || cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }

    strata_table_options opts = strata_table_options_default();
    opts.default_value = DEFAULT_VALUE;
    if (strcmp(placement, "uvm") == 0) {
        opts.gpu_placement = STRATA_GPU_UVM;
    } else if (strcmp(placement, "cache") == 0) {
        opts.gpu_placement = STRATA_GPU_CACHE;
        opts.gpu_cache_fraction = 0.5f;
        opts.hit_rate_threshold = 2.0f; /* above 1: misses are always resolved before rows are final */
    } else if (strcmp(placement, "static") != 0) {
        fprintf(stderr, "placement %s: expected static, uvm or cache\n", placement);
        return 2;
    }

    /* 1. The table, from host memory (copied: the host buffer may be freed afterwards). */
    float *vectors = malloc((size_t)(rows * dim) * sizeof(float));
    int64_t *keys = malloc((size_t)batch * sizeof(int64_t));
    float *rows_back = malloc((size_t)(batch * dim) * sizeof(float));
    if (!vectors || !keys || !rows_back) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < dim; c++) {
            vectors[r * dim + c] = value(r, c);
        }
    }
    int64_t vshape[2] = {rows, dim};
    DLTensor v = {vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, NULL, 0};
    strata_table *table = NULL;
    if (strata_failed(strata_table_from_dlpack(&v, NULL, &opts, &table), "strata_table_from_dlpack")) {
        return 1;
    }
    free(vectors);

    /* 2. Keys and rows on the device. */
    uint64_t seed = 88172645463325252ull;
    for (int64_t i = 0; i < batch; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        keys[i] = (int64_t)(seed % (uint64_t)(rows + rows / 10 + 1));
    }
    int64_t *d_keys = NULL;
    float *d_out = NULL;
    cudaStream_t stream = NULL;
    if (cuda_failed(cudaMalloc((void **)&d_keys, (size_t)batch * sizeof(int64_t)), "cudaMalloc keys") ||
        cuda_failed(cudaMalloc((void **)&d_out, (size_t)(batch * dim) * sizeof(float)), "cudaMalloc out") ||
        cuda_failed(cudaMemcpy(d_keys, keys, (size_t)batch * sizeof(int64_t), cudaMemcpyHostToDevice), "cudaMemcpy keys") ||
        cuda_failed(cudaMemset(d_out, 0xff, (size_t)(batch * dim) * sizeof(float)), "cudaMemset out") ||
        cuda_failed(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
        return 1;
    }
    int device = 0;
    cudaGetDevice(&device);
    int64_t kshape[1] = {batch};
    int64_t oshape[2] = {batch, dim};
    DLTensor k = {d_keys, {kDLCUDA, device}, 1, {kDLInt, 64, 1}, kshape, NULL, 0};
    DLTensor o = {d_out, {kDLCUDA, device}, 2, {kDLFloat, 32, 1}, oshape, NULL, 0};
    strata_lookup_options lo = strata_lookup_options_default();
    lo.stream = stream;

    /* 3. One lookup with stats (waits for the stream), checked row by row. */
    strata_lookup_stats stats = strata_lookup_stats_default();
    if (strata_failed(strata_lookup(table, &k, &o, &lo, &stats), "strata_lookup")) {
        return 1;
    }
    if (cuda_failed(cudaMemcpy(rows_back, d_out, (size_t)(batch * dim) * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy rows")) {
        return 1;
    }
    uint64_t misses = 0;
    for (int64_t i = 0; i < batch; i++) {
        int hit = keys[i] < rows;
        misses += !hit;
        for (int64_t c = 0; c < dim; c++) {
            float want = hit ? value(keys[i], c) : DEFAULT_VALUE;
            if (rows_back[i * dim + c] != want) {
                fprintf(stderr, "row %" PRId64 " (key %" PRId64 ") column %" PRId64 ": %g, expected %g\n", i, keys[i], c,
                        (double)rows_back[i * dim + c], (double)want);
                return 1;
            }
        }
    }
    if (stats.hits + stats.misses != (uint64_t)batch || stats.misses != misses) {
        fprintf(stderr, "stats: %" PRIu64 " hits, %" PRIu64 " misses; expected %" PRIu64 " misses\n", stats.hits,
                stats.misses, misses);
        return 1;
    }

    /* Ten lookups without stats: each call only enqueues. */
    cudaEvent_t start, end;
    cudaEventCreate(&start);
    cudaEventCreate(&end);
    cudaEventRecord(start, stream);
    for (int r = 0; r < REPEATS; r++) {
        if (strata_failed(strata_lookup(table, &k, &o, &lo, NULL), "strata_lookup")) {
            return 1;
        }
    }
    cudaEventRecord(end, stream);
    if (cuda_failed(cudaEventSynchronize(end), "the queued lookups")) {
        return 1;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, start, end);
    ms /= REPEATS;
    double gb = (double)(batch * dim) * sizeof(float) / 1e9;
    printf("%s: %" PRId64 " x %" PRId64 " table, %" PRId64 " keys (%" PRIu64 " misses): %.3f ms per lookup, %.1f GB/s of rows\n",
           placement, rows, dim, batch, misses, (double)ms, gb / (ms / 1e3));

    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaStreamDestroy(stream);
    cudaFree(d_keys);
    cudaFree(d_out);
    strata_table_free(table);
    free(keys);
    free(rows_back);
    return 0;
}
