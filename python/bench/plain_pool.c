/* Two references for peers.py's float32 pooled workloads, on the same tensor as the contenders:
 * - plain_pool: the plainest fast loop a C programmer would write for
 *   `out[b] = sum of w[i] * table[keys[i]]` over bags given by CSR offsets;
 * - plain_touch: the memory's limit for any pooling of these rows: the same loop, reading one
 *   word of every cache line of every row and adding nothing (one word a bag is written).
 * In both every row is
 * prefetched (each of its cache lines) 16 keys ahead; the accumulator is a local array the
 * compiler vectorises (-O3 -march=native); bags are split into one contiguous share per thread
 * (pthreads, created per call, so nothing spins between calls beside the other contenders).
 * Built by scripts/bench-peers.sh into build/; not part of the library. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AHEAD 16
#define MAXDIM 1024

struct job {
    const float *table;
    const int64_t *keys, *offsets;
    const float *weights;
    float *out;
    size_t dim, b0, b1;
    int touch;
};

static void *pool_bags(void *arg) {
    const struct job *j = arg;
    const size_t dim = j->dim, row_bytes = dim * sizeof(float);
    const int64_t n = j->offsets[j->b1];
    float acc[MAXDIM];
    if (j->touch) {
        for (size_t b = j->b0; b < j->b1; b++) {
            uint32_t x = 0;
            for (int64_t i = j->offsets[b]; i < j->offsets[b + 1]; i++) {
                if (i + AHEAD < n) {
                    const char *q = (const char *)(j->table + (size_t)j->keys[i + AHEAD] * dim);
                    for (size_t l = 0; l < row_bytes; l += 64) __builtin_prefetch(q + l, 0, 3);
                }
                const char *r = (const char *)(j->table + (size_t)j->keys[i] * dim);
                for (size_t l = 0; l < row_bytes; l += 64) x ^= *(const volatile uint32_t *)(r + l);
            }
            memcpy(j->out + b * dim, &x, sizeof x);
        }
        return NULL;
    }
    for (size_t b = j->b0; b < j->b1; b++) {
        memset(acc, 0, row_bytes);
        for (int64_t i = j->offsets[b]; i < j->offsets[b + 1]; i++) {
            if (i + AHEAD < n) {
                const char *q = (const char *)(j->table + (size_t)j->keys[i + AHEAD] * dim);
                for (size_t l = 0; l < row_bytes; l += 64) __builtin_prefetch(q + l, 0, 3);
            }
            const float *r = j->table + (size_t)j->keys[i] * dim;
            const float w = j->weights ? j->weights[i] : 1.0f;
            if (j->weights)
                for (size_t c = 0; c < dim; c++) acc[c] += w * r[c];
            else
                for (size_t c = 0; c < dim; c++) acc[c] += r[c];
        }
        memcpy(j->out + b * dim, acc, row_bytes);
    }
    return NULL;
}

static int run(const float *table, size_t dim, const int64_t *keys, const int64_t *offsets, size_t bags,
               const float *weights, float *out, int threads, int touch) {
    if (dim > MAXDIM) return -1;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    struct job jobs[64];
    pthread_t tids[64];
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct job){table, keys, offsets, weights, out, dim, bags * t / threads, bags * (t + 1) / threads, touch};
    }
    int started = 1;
    while (started < threads && pthread_create(&tids[started], NULL, pool_bags, &jobs[started]) == 0) started++;
    for (int t = started; t < threads; t++) pool_bags(&jobs[t]); /* threads that could not start */
    pool_bags(&jobs[0]);
    for (int t = 1; t < started; t++) pthread_join(tids[t], NULL);
    return 0;
}

/* Pools `bags` bags on `threads` threads (at most 64); 0 when done, -1 for a dim over MAXDIM. */
int plain_pool(const float *table, size_t dim, const int64_t *keys, const int64_t *offsets, size_t bags,
               const float *weights, float *out, int threads) {
    return run(table, dim, keys, offsets, bags, weights, out, threads, 0);
}

/* Reads every line of every row of `bags` bags, as plain_pool, adding nothing; `out` gets one
 * word a bag (not a pooled row). */
int plain_touch(const float *table, size_t dim, const int64_t *keys, const int64_t *offsets, size_t bags, float *out,
                int threads) {
    return run(table, dim, keys, offsets, bags, NULL, out, threads, 1);
}
