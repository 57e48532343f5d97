/*
 * strata partitioned_mpi: one embedding table spread over MPI ranks, looked up collectively.
 *
 *   mpirun -n 2 partitioned_mpi [rows [dim [batch]]]      defaults: 1000 16 4096
 *
 * 1. Every rank computes the same global [rows, dim] float32 array (value = row + col / 1000)
 *    and keeps only its own block of rows, as a distributed-array library would (Heat's split
 *    0: rows spread as evenly as possible, the first ranks one row more).
 * 2. Every rank describes the whole array as a strata_partitioned (tiling (P, 1), partition r
 *    owned by rank r), with data only for its own partition, and calls
 *    strata_table_from_partitioned with its communicator as an MPI_Fint. Its block is borrowed,
 *    not copied: it must stay alive until strata_table_free.
 * 3. Every rank looks up its own random keys (int64, 5% out of range) with strata_lookup, which
 *    is collective: keys travel to the ranks that own their rows and rows come back. Each rank
 *    checks every row against the formula, and the hit/miss counts.
 * 4. Every rank frees the table (collective: strata frees its duplicate of the communicator)
 *    and MPI_Finalize runs; strata never initialises nor finalises MPI itself.
 *
 * A failing strata call prints the status name and strata_last_error() and aborts the job: a
 * collective call fails on every rank together, so no rank is left waiting.
 */
#include "strata.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_VALUE (-1.0f)

static int g_rank;

/* Checks a strata status; on failure reports it and ends the whole job. */
static void check(strata_status s, const char *call) {
    if (s != STRATA_OK) {
        fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, call, strata_status_name(s), strata_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static float value(int64_t row, int64_t col) {
    return (float)row + (float)col / 1000.0f;
}

/* A small deterministic generator (splitmix64), seeded per rank. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t rows = argc > 1 ? atoll(argv[1]) : 1000;
    int64_t dim = argc > 2 ? atoll(argv[2]) : 16;
    int64_t batch = argc > 3 ? atoll(argv[3]) : 4096;
    if (rows < 1 || dim < 1 || batch < 1) {
        if (g_rank == 0) {
            fprintf(stderr, "usage: partitioned_mpi [rows [dim [batch]]] (all >= 1)\n");
        }
        MPI_Finalize();
        return 2;
    }
    if (strata_mpi_available() != 1) {
        if (g_rank == 0) {
            fprintf(stderr, "this libstrata was built without MPI (cargo build --features mpi)\n");
        }
        MPI_Finalize();
        return 1;
    }

    /* 1. Split 0: partition p holds rows [starts[p], starts[p] + counts[p]). */
    int64_t *starts = xmalloc(sizeof(int64_t) * 2 * (size_t)size);
    int64_t *shapes = xmalloc(sizeof(int64_t) * 2 * (size_t)size);
    int64_t start = 0;
    for (int p = 0; p < size; p++) {
        int64_t count = rows / size + (p < rows % size ? 1 : 0);
        starts[2 * p] = start;
        starts[2 * p + 1] = 0;
        shapes[2 * p] = count;
        shapes[2 * p + 1] = dim;
        start += count;
    }
    int64_t my_start = starts[2 * g_rank], my_rows = shapes[2 * g_rank];
    float *block = xmalloc(sizeof(float) * (size_t)(my_rows * dim));
    for (int64_t r = 0; r < my_rows; r++) {
        for (int64_t c = 0; c < dim; c++) {
            block[r * dim + c] = value(my_start + r, c);
        }
    }

    /* 2. The description every rank passes: the same partitions, data only for its own. */
    int64_t block_strides[2] = {dim, 1};
    DLTensor local = {
        .data = block,
        .device = {kDLCPU, 0},
        .ndim = 2,
        .dtype = {kDLFloat, 32, 1},
        .shape = &shapes[2 * g_rank],
        .strides = block_strides,
        .byte_offset = 0,
    };
    /* Every struct starts with struct_size: start from the _default() initialisers, which set it
     * (and the other fields to "not given"), then fill in what this description says. */
    strata_partition_location *owners = xmalloc(sizeof(strata_partition_location) * (size_t)size);
    strata_partition *parts = xmalloc(sizeof(strata_partition) * (size_t)size);
    for (int p = 0; p < size; p++) {
        owners[p] = strata_partition_location_default();
        owners[p].rank = p;
        parts[p] = strata_partition_default();
        parts[p].start = &starts[2 * p];
        parts[p].shape = &shapes[2 * p];
        parts[p].data = p == g_rank ? &local : NULL;
        parts[p].locations = &owners[p];
        parts[p].num_locations = 1;
    }
    int64_t global_shape[2] = {rows, dim};
    int64_t tiling[2] = {size, 1};
    strata_partitioned desc = strata_partitioned_default();
    desc.ndim = 2;
    desc.shape = global_shape;
    desc.partition_tiling = tiling;
    desc.partitions = parts;
    check(strata_partitioned_validate(&desc), "strata_partitioned_validate");
    strata_table_options opts = strata_table_options_default();
    opts.default_value = DEFAULT_VALUE;
    MPI_Fint comm = MPI_Comm_c2f(MPI_COMM_WORLD);
    strata_table *table = NULL;
    check(strata_table_from_partitioned(&desc, &comm, &opts, &table), "strata_table_from_partitioned");
    if (g_rank == 0) {
        printf("table: %lld rows x %lld over %d ranks\n", (long long)strata_table_len(table),
               (long long)strata_table_dim(table), size);
    }

    /* 3. Collective lookups: each rank its own keys, some out of range. */
    int64_t *keys = xmalloc(sizeof(int64_t) * (size_t)batch);
    float *out = xmalloc(sizeof(float) * (size_t)(batch * dim));
    uint64_t state = 12345u + (uint64_t)g_rank;
    uint64_t expect_misses = 0;
    for (int64_t i = 0; i < batch; i++) {
        keys[i] = (int64_t)(next_random(&state) % (uint64_t)(rows + rows / 20 + 1));
        expect_misses += keys[i] >= rows;
    }
    int64_t key_shape[1] = {batch}, out_shape[2] = {batch, dim};
    DLTensor key_t = {keys, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, key_shape, NULL, 0};
    DLTensor out_t = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, out_shape, NULL, 0};
    strata_lookup_stats stats = strata_lookup_stats_default();
    check(strata_lookup(table, &key_t, &out_t, NULL, &stats), "strata_lookup");
    long bad = 0;
    for (int64_t i = 0; i < batch; i++) {
        for (int64_t c = 0; c < dim; c++) {
            float want = keys[i] < rows ? value(keys[i], c) : DEFAULT_VALUE;
            bad += out[i * dim + c] != want;
        }
    }
    if (stats.misses != expect_misses || stats.hits != (uint64_t)batch - expect_misses) {
        bad++;
    }
    long bad_total = 0;
    MPI_Allreduce(&bad, &bad_total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d: %lld keys, %llu hits, %llu misses, %s\n", g_rank, (long long)batch,
           (unsigned long long)stats.hits, (unsigned long long)stats.misses, bad ? "WRONG ROWS" : "rows checked");

    /* 4. Clean up: the table (collective), then the caller's memory, then MPI. */
    strata_table_free(table);
    free(out);
    free(keys);
    free(parts);
    free(owners);
    free(block);
    free(shapes);
    free(starts);
    MPI_Finalize();
    return bad_total == 0 ? 0 : 1;
}
