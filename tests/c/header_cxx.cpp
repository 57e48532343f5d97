// Compiles strata.h alone as C++: `g++ -std=c++17 -Wall -Wextra -Werror -pedantic -c`.
// Checks the prototypes have C linkage and the documented types, and that the enums and
// structs are usable from C++ without casts.
#include "strata.h"

#include <type_traits>

static_assert(STRATA_OK == 0, "STRATA_OK is zero");
static_assert(sizeof(strata_status) == 4, "strata_status is 32 bits");
static_assert(STRATA_VERSION_NUMBER == STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH,
              "STRATA_VERSION_NUMBER");
static_assert(std::is_standard_layout<DLTensor>::value && std::is_trivially_copyable<DLTensor>::value, "DLTensor is POD");
static_assert(sizeof(void *) != 8 || sizeof(DLTensor) == 48, "DLTensor (LP64)");
static_assert(sizeof(void *) != 8 || offsetof(DLManagedTensorVersioned, dl_tensor) == 32, "versioned (LP64)");
static_assert(DLPACK_MINOR_VERSION == 3 && kDLTrn == 18, "DLPack 1.3");
static_assert(sizeof(void *) != 8 || offsetof(DLPackExchangeAPI, current_work_stream) == 48, "DLPackExchangeAPI (LP64)");
static_assert(std::is_same<decltype(&strata_lookup),
                           strata_status (*)(strata_table *, const DLTensor *, DLTensor *,
                                             const strata_lookup_options *, strata_lookup_stats *)>::value,
              "strata_lookup");
static_assert(std::is_same<decltype(&strata_table_open),
                           strata_status (*)(const char *, int64_t, const strata_table_options *, strata_table **)>::value,
              "strata_table_open");
static_assert(std::is_same<decltype(&strata_table_adopt_dlpack_versioned),
                           strata_status (*)(DLManagedTensorVersioned *, const DLTensor *, const strata_table_options *,
                                             strata_table **)>::value,
              "strata_table_adopt_dlpack_versioned");
static_assert(std::is_same<decltype(&strata_table_free), void (*)(strata_table *)>::value, "strata_table_free");
static_assert(std::is_same<decltype(&strata_version), const char *(*)()>::value, "strata_version");

// A C++ caller's typical use: a RAII handle and status checks.
struct TableDeleter {
    void operator()(strata_table *t) const { strata_table_free(t); }
};

int header_cxx_uses(const DLTensor *keys, DLTensor *out);
int header_cxx_uses(const DLTensor *keys, DLTensor *out) {
    strata_table_options opts = strata_table_options_default();
    opts.missing_key = STRATA_MISSING_ERROR;
    strata_table *raw = nullptr;
    strata_status s = strata_table_open("/nonexistent", 4, &opts, &raw);
    TableDeleter del;
    if (s != STRATA_OK) {
        return static_cast<int>(s);
    }
    strata_lookup_options lo = strata_lookup_options_default();
    strata_lookup_stats st = strata_lookup_stats_default();
    s = strata_lookup(raw, keys, out, &lo, &st);
    struct strata_table_info info = strata_table_info_default();
    if (s == STRATA_OK) {
        s = strata_table_get_info(raw, &info);
    }
    del(raw);
    return s == STRATA_OK ? static_cast<int>(st.hits + static_cast<uint64_t>(info.rows)) : -1;
}
