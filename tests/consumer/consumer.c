/* A C host of an installed strata, built with `pkg-config --cflags --libs strata`. */
#include <stdio.h>
#include <string.h>

#include <strata.h>

/* The installed strata.h brings the installed strata_features.h with it. */
#ifndef STRATA_BUILD_FEATURES
#error "the installed strata.h did not include strata_features.h"
#endif

int main(void) {
    if (strata_build_features() != STRATA_BUILD_FEATURES) {
        fprintf(stderr, "consumer: strata_build_features() %u != STRATA_BUILD_FEATURES %u\n", strata_build_features(),
                (unsigned)STRATA_BUILD_FEATURES);
        return 1;
    }
    float vectors[6] = {0, 1, 2, 3, 4, 5};
    int64_t vshape[2] = {3, 2}, vstrides[2] = {2, 1};
    DLTensor v = {vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, vstrides, 0};
    strata_table *t = NULL;
    if (strata_table_from_dlpack(&v, NULL, NULL, &t) != STRATA_OK) {
        fprintf(stderr, "%s\n", strata_last_error());
        return 1;
    }
    int64_t keys[2] = {1, 2};
    float out[4];
    int64_t kshape[1] = {2}, kstrides[1] = {1}, oshape[2] = {2, 2};
    DLTensor k = {keys, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, kshape, kstrides, 0};
    DLTensor o = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, vstrides, 0};
    const float want[4] = {2, 3, 4, 5};
    int good = strata_lookup(t, &k, &o, NULL, NULL) == STRATA_OK && memcmp(out, want, sizeof want) == 0;
    printf("consumer (pkg-config): lookup %s\n", good ? "ok" : "WRONG");
    strata_table_free(t);
    return good ? 0 : 1;
}
