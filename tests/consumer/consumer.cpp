// A small C++ host of an installed strata: builds a dense table from a vector, looks up three
// keys (one missing) and checks the rows. Exits 0 when everything agrees.
#include <strata.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
    const int64_t rows = 4, dim = 3;
    std::vector<float> vectors(rows * dim);
    for (size_t i = 0; i < vectors.size(); i++) vectors[i] = float(i);
    int64_t vshape[2] = {rows, dim}, vstrides[2] = {dim, 1};
    DLTensor v{vectors.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, vstrides, 0};
    strata_table_options opts = strata_table_options_default();
    opts.default_value = -1.0f;
    strata_table *t = nullptr;
    if (strata_table_from_dlpack(&v, nullptr, &opts, &t) != STRATA_OK) {
        std::fprintf(stderr, "%s\n", strata_last_error());
        return 1;
    }
    int64_t keys[3] = {2, 9, 0};
    float out[9];
    int64_t kshape[1] = {3}, kstrides[1] = {1}, oshape[2] = {3, dim}, ostrides[2] = {dim, 1};
    DLTensor k{keys, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, kshape, kstrides, 0};
    DLTensor o{out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, ostrides, 0};
    strata_lookup_stats stats = strata_lookup_stats_default();
    strata_status s = strata_lookup(t, &k, &o, nullptr, &stats);
    const float want[9] = {6, 7, 8, -1, -1, -1, 0, 1, 2};
    bool good = s == STRATA_OK && std::memcmp(out, want, sizeof want) == 0 && stats.hits == 2 && stats.misses == 1;
    std::printf("consumer: strata %s, lookup %s\n", strata_version(), good ? "ok" : "WRONG");
    strata_table_free(t);
    return good ? 0 : 1;
}
