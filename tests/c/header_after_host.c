/*
 * A host that already included its own <dlpack/dlpack.h> (here host_dlpack.h) and then
 * strata.h: strata.h must skip its DLPack block (same include guard) and its functions must
 * take the host's DLTensor. Built with -std=c11 -Wall -Wextra -Werror -pedantic, linked and run.
 */
#include "host_dlpack.h"
#include "strata.h"

#include <stdio.h>

#ifndef HOST_DLPACK_IN_EFFECT
#error "host_dlpack.h was not the DLPack definition in effect"
#endif

int main(void) {
    float vectors[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    int64_t vshape[2] = {3, 2};
    DLTensor v = {vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, NULL, 0};
    strata_table *t = NULL;
    strata_status s = strata_table_from_dlpack(&v, NULL, NULL, &t);
    if (s != STRATA_OK) {
        fprintf(stderr, "%s: %s\n", strata_status_name(s), strata_last_error());
        return 1;
    }
    int32_t keys[2] = {2, 0};
    int64_t kshape[1] = {2};
    float out[2][2] = {{0, 0}, {0, 0}};
    int64_t oshape[2] = {2, 2};
    DLTensor k = {keys, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, kshape, NULL, 0};
    DLTensor o = {out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, NULL, 0};
    s = strata_lookup(t, &k, &o, NULL, NULL);
    strata_table_free(t);
    if (s != STRATA_OK || out[0][0] != 5 || out[0][1] != 6 || out[1][0] != 1 || out[1][1] != 2) {
        fprintf(stderr, "lookup with the host's DLTensor: %s %s\n", strata_status_name(s), strata_last_error());
        return 1;
    }
    printf("header_after_host (C): ok\n");
    return 0;
}
