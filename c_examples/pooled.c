/*
 * strata pooled lookups: the multi-hot features of a recommendation model, as HPS's
 * SparseLookupLayer and TensorFlow's embedding_lookup_sparse serve them.
 *
 *   pooled [bags [max_hotness]]      defaults: 1000 20
 *
 * 1. Builds two tables from DLPack tensors: "user_history" (50,000 x 32, keyed by item ids)
 *    and "genre" (64 x 8, dense: key = row number).
 * 2. user_history: ragged bags (1-D keys plus B + 1 offsets, PyTorch's include_last_offset
 *    form; some bags empty) with per-key weights, pooled by mean, into float32 [B, 32].
 * 3. genre: fixed hotness (2-D keys [B, 3], no offsets), pooled by sum, into float16 [B, 8].
 * 4. Both again as one strata_lookup_batch (one call for every table of a request, as a model
 *    with many features would make), checked equal to the separate calls.
 * Every pooled row is checked against a plain loop. Exits with 1 on any failure, printing
 * strata_status_name() and strata_last_error().
 */
#include "strata.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HISTORY_ROWS 50000
#define HISTORY_DIM 32
#define GENRES 64
#define GENRE_DIM 8
#define GENRE_HOT 3

static int check(strata_status s, const char *what) {
    if (s != STRATA_OK) {
        fprintf(stderr, "pooled: %s failed: %s: %s\n", what, strata_status_name(s), strata_last_error());
        exit(1);
    }
    return 0;
}

static DLTensor host(void *data, DLDataType dtype, int32_t ndim, int64_t *shape) {
    DLTensor t = {data, {kDLCPU, 0}, ndim, dtype, shape, NULL, 0};
    return t;
}

static const DLDataType I64 = {kDLInt, 64, 1};
static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType F16 = {kDLFloat, 16, 1};

/* float16 bits -> float (normal numbers, zeros and subnormals; enough for the check). */
static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

int main(int argc, char **argv) {
    int64_t bags = argc > 1 ? atoll(argv[1]) : 1000;
    int64_t max_hot = argc > 2 ? atoll(argv[2]) : 20;
    if (bags < 1 || max_hot < 1) {
        fprintf(stderr, "usage: pooled [bags >= 1 [max_hotness >= 1]]\n");
        return 2;
    }

    /* 1. The tables. */
    float *history = malloc(sizeof(float) * HISTORY_ROWS * HISTORY_DIM);
    int64_t *item_ids = malloc(sizeof(int64_t) * HISTORY_ROWS);
    float genre[GENRES * GENRE_DIM];
    if (history == NULL || item_ids == NULL) {
        return 1;
    }
    for (int64_t r = 0; r < HISTORY_ROWS; r++) {
        item_ids[r] = 1000003 * r + 17;
        for (int c = 0; c < HISTORY_DIM; c++) {
            history[r * HISTORY_DIM + c] = (float)((r * 31 + c) % 101) * 0.01f;
        }
    }
    for (int i = 0; i < GENRES * GENRE_DIM; i++) {
        genre[i] = (float)(i % 13) * 0.125f;
    }
    int64_t hshape[2] = {HISTORY_ROWS, HISTORY_DIM}, ishape[1] = {HISTORY_ROWS}, gshape[2] = {GENRES, GENRE_DIM};
    DLTensor hv = host(history, F32, 2, hshape), hk = host(item_ids, I64, 1, ishape), gv = host(genre, F32, 2, gshape);
    strata_table_options opts = strata_table_options_default();
    opts.default_value = 0.0f; /* unknown items contribute zeros */
    strata_table *history_table = NULL, *genre_table = NULL;
    check(strata_table_from_dlpack(&hv, &hk, &opts, &history_table), "strata_table_from_dlpack(history)");
    check(strata_table_from_dlpack(&gv, NULL, NULL, &genre_table), "strata_table_from_dlpack(genre)");

    /* 2. Ragged bags of item ids with weights (recency), some empty, some ids unknown. */
    int64_t *offsets = malloc(sizeof(int64_t) * (size_t)(bags + 1));
    int64_t nnz = 0;
    offsets[0] = 0;
    for (int64_t b = 0; b < bags; b++) {
        nnz += (int64_t)(next_random() % (uint64_t)(max_hot + 1)); /* 0 ..= max_hot: empty bags too */
        offsets[b + 1] = nnz;
    }
    int64_t *items = malloc(sizeof(int64_t) * (size_t)(nnz > 0 ? nnz : 1));
    float *weights = malloc(sizeof(float) * (size_t)(nnz > 0 ? nnz : 1));
    for (int64_t j = 0; j < nnz; j++) {
        uint64_t r = next_random() % HISTORY_ROWS;
        items[j] = next_random() % 50 == 0 ? -1 - (int64_t)r : item_ids[r]; /* 2% unknown */
        weights[j] = 1.0f / (float)(1 + next_random() % 4);
    }
    float *user = malloc(sizeof(float) * (size_t)bags * HISTORY_DIM);
    int64_t kshape[1] = {nnz}, oshape[1] = {bags + 1}, ushape[2] = {bags, HISTORY_DIM};
    DLTensor keys = host(items, I64, 1, kshape), offs = host(offsets, I64, 1, oshape), w = host(weights, F32, 1, kshape);
    DLTensor user_out = host(user, F32, 2, ushape);
    strata_lookup_stats stats = strata_lookup_stats_default();
    check(strata_lookup_pooled(history_table, &keys, &offs, &w, STRATA_POOL_MEAN, &user_out, NULL, &stats),
          "strata_lookup_pooled(history, mean)");
    printf("user_history: %" PRId64 " bags, %" PRId64 " ids: %" PRIu64 " found, %" PRIu64 " unknown\n", bags, nnz,
           stats.hits, stats.misses);

    /* 3. Fixed hotness: three genres per sample, summed into float16. */
    int64_t *g = malloc(sizeof(int64_t) * (size_t)bags * GENRE_HOT);
    for (int64_t i = 0; i < bags * GENRE_HOT; i++) {
        g[i] = (int64_t)(next_random() % GENRES);
    }
    uint16_t *genre_out = malloc(sizeof(uint16_t) * (size_t)bags * GENRE_DIM);
    int64_t g2shape[2] = {bags, GENRE_HOT}, goshape[2] = {bags, GENRE_DIM};
    DLTensor gk = host(g, I64, 2, g2shape), go = host(genre_out, F16, 2, goshape);
    check(strata_lookup_pooled(genre_table, &gk, NULL, NULL, STRATA_POOL_SUM, &go, NULL, NULL),
          "strata_lookup_pooled(genre, sum)");

    /* Check every pooled row against a plain loop. */
    int failures = 0;
    for (int64_t b = 0; b < bags; b++) {
        float acc[HISTORY_DIM] = {0}, wsum = 0.0f;
        for (int64_t j = offsets[b]; j < offsets[b + 1]; j++) {
            wsum += weights[j];
            if (items[j] < 0) {
                continue; /* unknown: the default row, zeros */
            }
            int64_t r = (items[j] - 17) / 1000003;
            for (int c = 0; c < HISTORY_DIM; c++) {
                acc[c] += weights[j] * history[r * HISTORY_DIM + c];
            }
        }
        for (int c = 0; c < HISTORY_DIM; c++) {
            float want = wsum == 0.0f ? 0.0f : acc[c] / wsum;
            failures += fabsf(user[b * HISTORY_DIM + c] - want) > 1e-5f * (1.0f + fabsf(want));
        }
        for (int c = 0; c < GENRE_DIM; c++) {
            float want = 0.0f;
            for (int k = 0; k < GENRE_HOT; k++) {
                want += genre[g[b * GENRE_HOT + k] * GENRE_DIM + c];
            }
            failures += fabsf(half_to_float(genre_out[b * GENRE_DIM + c]) - want) > 2e-3f * (1.0f + fabsf(want));
        }
    }

    /* 4. Both lookups as one batch, into fresh outputs, equal to the separate calls. */
    float *user2 = malloc(sizeof(float) * (size_t)bags * HISTORY_DIM);
    uint16_t *genre2 = malloc(sizeof(uint16_t) * (size_t)bags * GENRE_DIM);
    DLTensor user2_out = host(user2, F32, 2, ushape), genre2_out = host(genre2, F16, 2, goshape);
    strata_lookup_request requests[2];
    requests[0] = strata_lookup_request_default();
    requests[0].table = history_table;
    requests[0].keys = &keys;
    requests[0].offsets = &offs;
    requests[0].weights = &w;
    requests[0].pooling = STRATA_POOL_MEAN;
    requests[0].out = &user2_out;
    requests[1] = strata_lookup_request_default();
    requests[1].table = genre_table;
    requests[1].keys = &gk;
    requests[1].pooling = STRATA_POOL_SUM;
    requests[1].out = &genre2_out;
    check(strata_lookup_batch(requests, 2, NULL), "strata_lookup_batch");
    failures += memcmp(user, user2, sizeof(float) * (size_t)bags * HISTORY_DIM) != 0;
    failures += memcmp(genre_out, genre2, sizeof(uint16_t) * (size_t)bags * GENRE_DIM) != 0;

    /* A bad request is refused before anything is written, and the message names it. */
    requests[1].offsets = &offs; /* 2-D keys take no offsets */
    strata_status s = strata_lookup_batch(requests, 2, NULL);
    if (s != STRATA_INVALID_ARGUMENT || strstr(strata_last_error(), "requests[1].offsets") == NULL) {
        fprintf(stderr, "pooled: a bad request was not refused as documented: %s: %s\n", strata_status_name(s),
                strata_last_error());
        failures++;
    }

    printf("genre: %" PRId64 " samples x %d genres summed into float16\n", bags, GENRE_HOT);
    printf("pooled: %s (%d mismatches)\n", failures == 0 ? "every row checked" : "FAILED", failures);
    strata_table_free(history_table);
    strata_table_free(genre_table);
    free(history);
    free(item_ids);
    free(offsets);
    free(items);
    free(weights);
    free(user);
    free(g);
    free(genre_out);
    free(user2);
    free(genre2);
    return failures != 0;
}
