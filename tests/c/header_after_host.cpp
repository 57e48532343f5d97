// header_after_host.c for C++ (-std=c++17): the host's DLPack types, whose DLDeviceType has
// the fixed underlying type int32_t, stay in effect after strata.h, and strata's functions
// take them.
#include "host_dlpack.h"
#include "strata.h"

#include <cstdio>
#include <type_traits>

static_assert(std::is_same<std::underlying_type<DLDeviceType>::type, int32_t>::value,
              "host_dlpack.h's DLDeviceType is the one in effect");

int main() {
    float vectors[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    int64_t vshape[2] = {3, 2};
    DLTensor v{vectors, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, nullptr, 0};
    strata_table *t = nullptr;
    strata_status s = strata_table_from_dlpack(&v, nullptr, nullptr, &t);
    if (s != STRATA_OK) {
        std::fprintf(stderr, "%s: %s\n", strata_status_name(s), strata_last_error());
        return 1;
    }
    uint64_t keys[2] = {1, 2};
    int64_t kshape[1] = {2};
    float out[2][2] = {};
    int64_t oshape[2] = {2, 2};
    DLTensor k{keys, {kDLCPU, 0}, 1, {kDLUInt, 64, 1}, kshape, nullptr, 0};
    DLTensor o{out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, nullptr, 0};
    strata_lookup_stats st = strata_lookup_stats_default();
    s = strata_lookup(t, &k, &o, nullptr, &st);
    strata_table_free(t);
    if (s != STRATA_OK || st.hits != 2 || out[0][0] != 3 || out[0][1] != 4 || out[1][0] != 5 || out[1][1] != 6) {
        std::fprintf(stderr, "lookup with the host's DLTensor: %s %s\n", strata_status_name(s), strata_last_error());
        return 1;
    }
    std::printf("header_after_host (C++): ok\n");
    return 0;
}
