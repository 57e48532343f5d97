/* The checks of strata's C test programs (tests/c/): CHECK stops the program on a failing strata
 * call with its status and message; EXPECT counts a failed condition (from any thread) and goes
 * on. The examples in c_examples/ keep their own copies of CHECK, so each stays one file a
 * user can copy. */
#ifndef STRATA_TEST_CHECK_H
#define STRATA_TEST_CHECK_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        strata_status s_ = (call);                                                             \
        if (s_ != STRATA_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, strata_status_name(s_),    \
                    strata_last_error());                                                      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static int failures = 0;
static pthread_mutex_t failures_lock = PTHREAD_MUTEX_INITIALIZER;
#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            pthread_mutex_lock(&failures_lock);                                                \
            fprintf(stderr, "%s:%d: check failed: ", __FILE__, __LINE__);                     \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            failures++;                                                                        \
            pthread_mutex_unlock(&failures_lock);                                              \
        }                                                                                      \
    } while (0)

#endif
