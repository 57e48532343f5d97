/*
 * The version macros in strata.h agree with each other, with strata_version() at run time,
 * and (when given as argv[1], e.g. from Cargo.toml) with the package version.
 *
 *   version [MAJOR.MINOR.PATCH]
 */
#include "strata.h"

#include <stdio.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

/* Usable in #if, as documented. */
#if STRATA_VERSION_NUMBER != (STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH)
#error "STRATA_VERSION_NUMBER disagrees with MAJOR/MINOR/PATCH"
#endif

int main(int argc, char **argv) {
    int failed = 0;
    const char *runtime = strata_version();
    const char *macros = STR(STRATA_VERSION_MAJOR) "." STR(STRATA_VERSION_MINOR) "." STR(STRATA_VERSION_PATCH);
    printf("strata_version() = \"%s\", macros %s, STRATA_VERSION_NUMBER = %ld\n", runtime ? runtime : "(null)",
           macros, (long)STRATA_VERSION_NUMBER);
    if (runtime == NULL || strcmp(runtime, macros) != 0) {
        fprintf(stderr, "version: strata_version() \"%s\" != header macros %s\n", runtime ? runtime : "(null)", macros);
        failed = 1;
    }
    unsigned maj = 0, min = 0, pat = 0;
    char rest = 0;
    if (runtime == NULL || sscanf(runtime, "%u.%u.%u%c", &maj, &min, &pat, &rest) != 3) {
        fprintf(stderr, "version: strata_version() \"%s\" is not MAJOR.MINOR.PATCH\n", runtime ? runtime : "(null)");
        failed = 1;
    } else if ((long)STRATA_VERSION_NUMBER != (long)maj * 10000 + (long)min * 100 + (long)pat) {
        fprintf(stderr, "version: STRATA_VERSION_NUMBER %ld != %u*10000 + %u*100 + %u\n", (long)STRATA_VERSION_NUMBER,
                maj, min, pat);
        failed = 1;
    }
    if (STRATA_VERSION_MINOR > 99 || STRATA_VERSION_PATCH > 99) {
        fprintf(stderr, "version: MINOR and PATCH must be < 100 for STRATA_VERSION_NUMBER to be unambiguous\n");
        failed = 1;
    }
    if (argc > 1 && strcmp(argv[1], macros) != 0) {
        fprintf(stderr, "version: package version %s != header macros %s\n", argv[1], macros);
        failed = 1;
    }
    if (!failed) {
        printf("version: ok\n");
    }
    return failed;
}
