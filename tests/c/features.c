/*
 * The feature macros (strata_features.h, written by CMake and included by strata.h) agree with
 * strata_build_features() at run time, and with the STRATA_FEATURE_* bits.
 *
 *   features [EXPECTED_BITS]   (optional: the bits the build was configured for)
 */
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef STRATA_BUILD_FEATURES
#error "strata_features.h was not found next to strata.h or on the include path"
#endif
#if STRATA_HAS_CUDA != 0 && STRATA_HAS_CUDA != 1
#error "STRATA_HAS_CUDA must be 0 or 1"
#endif
#if STRATA_HAS_MPI != 0 && STRATA_HAS_MPI != 1
#error "STRATA_HAS_MPI must be 0 or 1"
#endif
/* Usable in #if, as a host would. */
#if STRATA_HAS_CUDA
#define CUDA_WORD "with"
#else
#define CUDA_WORD "without"
#endif

int main(int argc, char **argv) {
    unsigned macros = STRATA_BUILD_FEATURES;
    unsigned runtime = strata_build_features();
    unsigned from_has = (STRATA_HAS_CUDA ? (unsigned)STRATA_FEATURE_CUDA : 0u) | (STRATA_HAS_MPI ? (unsigned)STRATA_FEATURE_MPI : 0u);
    int failed = 0;
    printf("features: header %s CUDA, STRATA_BUILD_FEATURES = %u, STRATA_HAS_MPI = %d, strata_build_features() = %u\n",
           CUDA_WORD, macros, STRATA_HAS_MPI, runtime);
    if (macros != runtime) {
        fprintf(stderr, "features: header says %u, library says %u\n", macros, runtime);
        failed = 1;
    }
    if (macros != from_has) {
        fprintf(stderr, "features: STRATA_BUILD_FEATURES %u disagrees with STRATA_HAS_* (%u)\n", macros, from_has);
        failed = 1;
    }
    if (argc > 1 && strtoul(argv[1], NULL, 10) != runtime) {
        fprintf(stderr, "features: configured for %s, library says %u\n", argv[1], runtime);
        failed = 1;
    }
    if (strata_cuda_available() && !STRATA_HAS_CUDA) {
        fprintf(stderr, "features: strata_cuda_available() is 1 in a build without CUDA\n");
        failed = 1;
    }
    if (!failed) {
        printf("features: ok\n");
    }
    return failed;
}
