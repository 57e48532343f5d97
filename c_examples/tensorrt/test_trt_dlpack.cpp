// Tests of the TensorRT -> DLPack mapping (trt_dlpack.cpp) without TensorRT: shapes, data types,
// refusals and their messages, and end-to-end lookups through strata on host memory; the pooled
// mode (combiner sum | mean | sqrtn on [B, L] keys) against a plain loop; and 26 plugin
// instances over one ps.json, opened as createPlugin opens them (open_server_table), holding
// one server. Built and run under AddressSanitizer/UBSan by the CMake project (ctest trt_dlpack).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "trt_dlpack.h"

using strata_trt::DataType;
using strata_trt::Location;
using strata_trt::TensorDesc;

static int passed = 0, failed = 0;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            passed++;                                            \
        } else {                                                 \
            failed++;                                            \
            std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            std::fprintf(stderr, __VA_ARGS__);                   \
            std::fprintf(stderr, "\n");                          \
        }                                                        \
    } while (0)

static TensorDesc desc(std::initializer_list<int64_t> dims, DataType t, const void *data,
                       Location loc = Location::kHost) {
    TensorDesc d;
    d.dims.nbDims = static_cast<int32_t>(dims.size());
    int i = 0;
    for (int64_t x : dims) d.dims.d[i++] = x;
    d.type = t;
    d.data = data;
    d.location = loc;
    return d;
}

static bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

static uint32_t f32_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

// float -> IEEE half for values exactly representable as normal halves (all the table holds).
static uint16_t half_bits(float f) {
    if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
    uint32_t b = f32_bits(f);
    uint32_t sign = (b >> 16) & 0x8000, exp = ((b >> 23) & 0xFF) - 127 + 15, mant = (b >> 13) & 0x3FF;
    return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

static strata_table_stats stats_of(strata_table *t) {
    strata_table_stats st = strata_table_stats_default();
    if (strata_table_get_stats(t, &st) != STRATA_OK) std::fprintf(stderr, "stats: %s\n", strata_last_error());
    return st;
}

// 26 StrataLookup layers over one ps.json (a DLRM engine: one per categorical feature), each
// opened as createPlugin opens its table, hold one server: equal table pointers, one volatile
// tier, one set of counters. The model is a HugeCTR sparse folder (key: int64, emb_vector:
// float32 rows) written with the ps.json into a temporary folder.
static void layers_share_one_server() {
    constexpr int kLayers = 26;
    constexpr int64_t kRows = 200, kDim = 4;
    char dir[] = "/tmp/strata-trt-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
        CHECK(false, "mkdtemp");
        return;
    }
    const std::string root = dir;
    CHECK(mkdir((root + "/t0").c_str(), 0700) == 0 && mkdir((root + "/sub").c_str(), 0700) == 0, "mkdir");
    auto value = [](int64_t key, int64_t c) { return static_cast<float>(key) * 0.5f + static_cast<float>(c); };
    std::FILE *k = std::fopen((root + "/t0/key").c_str(), "wb");
    std::FILE *v = std::fopen((root + "/t0/emb_vector").c_str(), "wb");
    for (int64_t key = 0; k && v && key < kRows; key++) {
        std::fwrite(&key, sizeof key, 1, k);
        for (int64_t c = 0; c < kDim; c++) {
            const float x = value(key, c);
            std::fwrite(&x, sizeof x, 1, v);
        }
    }
    if (k) std::fclose(k);
    if (v) std::fclose(v);
    const std::string ps = root + "/ps.json";
    std::FILE *f = std::fopen(ps.c_str(), "w");
    if (f) {
        std::fputs("{\"supportlonglong\": true,\n"
                   " \"volatile_db\": {\"type\": \"parallel_hash_map\", \"num_partitions\": 2,\n"
                   "                 \"initial_cache_rate\": 0.0, \"cache_missed_embeddings\": true},\n"
                   " \"persistent_db\": {\"type\": \"rocks_db\", \"path\": \"db\"},\n"
                   " \"models\": [{\"model\": \"dlrm\", \"sparse_files\": [\"t0\"], \"embedding_vecsize_per_table\": [4],\n"
                   "   \"default_value_for_each_table\": [-1.0], \"maxnum_catfeature_query_per_table_per_sample\": [26],\n"
                   "   \"deployed_device_list\": [0], \"max_batch_size\": 64}]}\n",
                   f);
        std::fclose(f);
    }
    // The ps_config_file field as different layers might spell it.
    const std::string spelled[3] = {ps, root + "/./ps.json", root + "/sub/../ps.json"};

    std::string err;
    std::vector<std::shared_ptr<strata_trt::ServerTable>> layers;
    for (int i = 0; i < kLayers; i++) {
        layers.push_back(strata_trt::open_server_table(spelled[i % 3], "dlrm", 0, kDim, &err));
        CHECK(layers.back() != nullptr, "layer %d: %s", i, err.c_str());
        if (layers.back() == nullptr) return;
    }
    strata_table *table = layers[0]->table;
    bool same = true;
    for (auto &l : layers) same = same && l->table == table && (l == layers[0] || l->server != layers[0]->server);
    CHECK(same, "26 layers: one strata_table pointer, 26 server handles");

    // Every layer looks up the same 4 keys (enqueue's path, strata_trt::run, on host memory).
    const strata_table_stats before = stats_of(table);
    int64_t keys[4] = {3, 50, 120, 199};
    bool rows_ok = true;
    for (int i = 0; i < kLayers; i++) {
        float out[4][kDim];
        strata_status s = strata_trt::run(layers[i]->table, strata_trt::Combiner::kNONE,
                                          desc({4}, DataType::kINT64, keys), desc({4, kDim}, DataType::kFLOAT, out),
                                          nullptr, 1, &err);
        rows_ok = rows_ok && s == STRATA_OK;
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < kDim; c++) rows_ok = rows_ok && out[r][c] == value(keys[r], c);
    }
    CHECK(rows_ok, "26 layers' lookups return the model's rows (%s)", err.c_str());
    const strata_table_stats after = stats_of(table);
    // One set of counters that every layer's lookups add to, and one volatile tier: the first
    // layer read the 4 rows from the persistent tier and promoted them, the 25 others found
    // them there (26 servers would have read them from the persistent tier 26 times).
    CHECK(after.lookups - before.lookups == kLayers && after.keys - before.keys == 4 * kLayers,
          "lookups %llu, keys %llu", static_cast<unsigned long long>(after.lookups - before.lookups),
          static_cast<unsigned long long>(after.keys - before.keys));
    CHECK(after.persistent_hits - before.persistent_hits == 4 && after.volatile_hits - before.volatile_hits == 100 &&
              after.volatile_rows == 4,
          "one volatile tier: persistent hits %llu, volatile hits %llu, volatile rows %llu",
          static_cast<unsigned long long>(after.persistent_hits - before.persistent_hits),
          static_cast<unsigned long long>(after.volatile_hits - before.volatile_hits),
          static_cast<unsigned long long>(after.volatile_rows));

    // A layer whose emb_vec_size is not the table's dim is refused, as createPlugin refuses it.
    CHECK(strata_trt::open_server_table(ps, "dlrm", 0, 8, &err) == nullptr &&
              contains(err, "emb_vec_size 8 but model dlrm table 0 has dim 4"),
          "%s", err.c_str());
    CHECK(strata_trt::open_server_table(ps, "nope", 0, kDim, &err) == nullptr && contains(err, "STRATA_"), "%s",
          err.c_str());

    // Layers go in any order (engines are destroyed layer by layer); the table serves until the
    // last one goes.
    for (int i = 0; i < kLayers - 1; i += 2) layers[i].reset();
    for (int i = kLayers - 3; i > 0; i -= 2) layers[i].reset();
    CHECK(layers[kLayers - 1]->table == table, "the last layer still lends the table");
    float out[4][kDim];
    CHECK(strata_trt::run(table, strata_trt::Combiner::kNONE, desc({4}, DataType::kINT64, keys),
                          desc({4, kDim}, DataType::kFLOAT, out), nullptr, 1, &err) == STRATA_OK &&
              out[3][1] == value(199, 1) && stats_of(table).lookups == after.lookups + 1,
          "the table after 25 of 26 layers went: %s", err.c_str());
    layers.clear();

    CHECK(std::system(("rm -rf '" + root + "'").c_str()) == 0, "rm -rf %s", dir);
}

int main() {
    // A dense table of 10 rows x 4: row r is {r, r + 0.5, -r, 2r}, exact in half and bfloat16.
    const int64_t rows = 10, dim = 4;
    std::vector<float> vec(rows * dim);
    for (int64_t r = 0; r < rows; r++) {
        const float x = static_cast<float>(r);
        float row[4] = {x, x + 0.5f, -x, 2 * x};
        std::memcpy(&vec[r * dim], row, sizeof row);
    }
    int64_t vshape[2] = {rows, dim}, vstrides[2] = {dim, 1};
    DLTensor v{vec.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, vshape, vstrides, 0};
    strata_table_options topts = strata_table_options_default();
    topts.default_value = -7.0f;
    strata_table *table = nullptr;
    if (strata_table_from_dlpack(&v, nullptr, &topts, &table) != STRATA_OK) {
        std::fprintf(stderr, "table: %s\n", strata_last_error());
        return 1;
    }
    auto want = [&](int64_t key, int64_t j) { return key >= 0 && key < rows ? vec[key * dim + j] : -7.0f; };
    std::string err;

    // The mapping itself: shape, row-major strides, dtype, device.
    {
        int32_t keys[6] = {0};
        strata_trt::DLTensorView view;
        err = strata_trt::to_dltensor(desc({2, 3}, DataType::kINT32, keys), "keys", false, view);
        CHECK(err.empty(), "%s", err.c_str());
        CHECK(view.tensor.ndim == 2 && view.tensor.shape[0] == 2 && view.tensor.shape[1] == 3, "shape");
        CHECK(view.tensor.strides[0] == 3 && view.tensor.strides[1] == 1, "strides");
        CHECK(view.tensor.dtype.code == kDLInt && view.tensor.dtype.bits == 32 && view.tensor.dtype.lanes == 1, "dtype");
        CHECK(view.tensor.device.device_type == kDLCPU && view.tensor.data == keys, "host device and data");
        TensorDesc dev = desc({5}, DataType::kINT64, keys, Location::kDevice);
        dev.device_id = 3;
        err = strata_trt::to_dltensor(dev, "keys", false, view);
        CHECK(err.empty() && view.tensor.device.device_type == kDLCUDA && view.tensor.device.device_id == 3 &&
                  view.tensor.dtype.bits == 64,
              "device tensor: %s", err.c_str());
        const DataType outs[3] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16};
        const uint8_t codes[3] = {kDLFloat, kDLFloat, kDLBfloat}, bits[3] = {32, 16, 16};
        for (int i = 0; i < 3; i++) {
            err = strata_trt::to_dltensor(desc({5, 4}, outs[i], keys), "out", true, view);
            CHECK(err.empty() && view.tensor.dtype.code == codes[i] && view.tensor.dtype.bits == bits[i], "out %s",
                  strata_trt::type_name(outs[i]));
        }
        err = strata_trt::to_dltensor(desc({}, DataType::kINT64, keys), "keys", false, view);
        CHECK(err.empty() && view.tensor.ndim == 0, "0-d keys: %s", err.c_str());
    }

    // Refusals, each with a message naming the tensor and what was expected.
    {
        int64_t keys[4] = {1, 2, 3, 4};
        strata_trt::DLTensorView view;
        err = strata_trt::to_dltensor(desc({4}, DataType::kFLOAT, keys), "keys", false, view);
        CHECK(err == "keys: data type kFLOAT; expected kINT32 or kINT64", "%s", err.c_str());
        err = strata_trt::to_dltensor(desc({4, 4}, DataType::kINT8, keys), "out", true, view);
        CHECK(err == "out: data type kINT8; expected kFLOAT, kHALF or kBF16", "%s", err.c_str());
        err = strata_trt::to_dltensor(desc({4, 4}, DataType::kFP8, keys), "out", true, view);
        CHECK(contains(err, "kFP8"), "%s", err.c_str());
        err = strata_trt::to_dltensor(desc({2, -1}, DataType::kINT64, keys), "keys", false, view);
        CHECK(contains(err, "keys: dims [2, -1]") && contains(err, "unresolved"), "%s", err.c_str());
        TensorDesc many = desc({1}, DataType::kINT64, keys);
        many.dims.nbDims = 9;
        err = strata_trt::to_dltensor(many, "keys", false, view);
        CHECK(contains(err, "nbDims 9; expected 0..8"), "%s", err.c_str());
        err = strata_trt::to_dltensor(desc({4}, DataType::kINT64, nullptr), "keys", false, view);
        CHECK(err == "keys: NULL data for 4 elements", "%s", err.c_str());
        err = strata_trt::to_dltensor(desc({0}, DataType::kINT64, nullptr), "keys", false, view);
        CHECK(err.empty(), "no elements, no data: fine (%s)", err.c_str());

        float out[4 * 4];
        for (float &x : out) x = NAN;
        strata_status s = strata_trt::lookup(table, desc({4}, DataType::kINT64, keys), desc({4, 5}, DataType::kFLOAT, out),
                                             nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && err == "out: dims [4, 5]; expected keys' dims [4] plus [4] (the table's "
                                                      "emb_vec_size)",
              "%d %s", s, err.c_str());
        s = strata_trt::lookup(table, desc({4}, DataType::kINT64, keys), desc({2, 2, 4}, DataType::kFLOAT, out), nullptr,
                               0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "out: dims [2, 2, 4]"), "%s", err.c_str());
        s = strata_trt::lookup(table, desc({4}, DataType::kINT64, keys),
                               desc({4, 4}, DataType::kFLOAT, out, Location::kDevice), nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "one on the host, one on the device"), "%s", err.c_str());
        s = strata_trt::lookup(nullptr, desc({4}, DataType::kINT64, keys), desc({4, 4}, DataType::kFLOAT, out), nullptr,
                               0, &err);
        CHECK(s == STRATA_NULL_ARGUMENT && contains(err, "table"), "%s", err.c_str());
        bool untouched = true;
        for (float x : out) untouched = untouched && std::isnan(x);
        CHECK(untouched, "refused calls leave out as it was");
        CHECK(strata_trt::check_shapes(desc({3}, DataType::kINT64, keys), desc({3, 4}, DataType::kFLOAT, out), 4).empty(),
              "check_shapes accepts [3] -> [3, 4]");
        TensorDesc bad = desc({3}, DataType::kINT64, keys);
        bad.dims.nbDims = -1;
        CHECK(!strata_trt::check_shapes(bad, desc({}, DataType::kFLOAT, out), 4).empty(), "negative nbDims refused");

        if (!strata_cuda_available()) {
            // Device tensors on a machine without a device: strata refuses, with its own message.
            s = strata_trt::lookup(table, desc({4}, DataType::kINT64, keys, Location::kDevice),
                                   desc({4, 4}, DataType::kFLOAT, out, Location::kDevice), nullptr, 0, &err);
            CHECK(s == STRATA_UNSUPPORTED_DEVICE && contains(err, "STRATA_UNSUPPORTED_DEVICE: "), "%d %s", s,
                  err.c_str());
        } else {
            std::printf("trt_dlpack: a CUDA device is present; the no-device refusal is not checked\n");
        }
    }

    // End to end on host memory: int32 and int64 keys, float32, float16 and bfloat16 rows.
    {
        int32_t k32[2][3] = {{0, 9, 3}, {10, -1, 4}};  // 10 and -1 are missing
        float out[2][3][4];
        for (auto &a : out)
            for (auto &b : a)
                for (float &x : b) x = NAN;
        strata_status s = strata_trt::lookup(table, desc({2, 3}, DataType::kINT32, k32),
                                             desc({2, 3, 4}, DataType::kFLOAT, out), nullptr, 1, &err);
        CHECK(s == STRATA_OK, "%s", err.c_str());
        bool same = true;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                for (int c = 0; c < 4; c++) same = same && out[i][j][c] == want(k32[i][j], c);
        CHECK(same, "float32 rows from int32 keys");

        int64_t k64[5] = {7, 2, 99, 0, 5};
        uint16_t h[5][4], bf[5][4];
        std::memset(h, 0xFF, sizeof h);
        std::memset(bf, 0xFF, sizeof bf);
        s = strata_trt::lookup(table, desc({5}, DataType::kINT64, k64), desc({5, 4}, DataType::kHALF, h), nullptr, 0, &err);
        CHECK(s == STRATA_OK, "%s", err.c_str());
        s = strata_trt::lookup(table, desc({5}, DataType::kINT64, k64), desc({5, 4}, DataType::kBF16, bf), nullptr, 0, &err);
        CHECK(s == STRATA_OK, "%s", err.c_str());
        bool hs = true, bs = true;
        for (int i = 0; i < 5; i++)
            for (int c = 0; c < 4; c++) {
                const float w = want(k64[i], c);
                hs = hs && h[i][c] == half_bits(w);
                bs = bs && bf[i][c] == static_cast<uint16_t>(f32_bits(w) >> 16);
            }
        CHECK(hs, "float16 rows from int64 keys");
        CHECK(bs, "bfloat16 rows from int64 keys");

        // A missing key is an error when the table says so, with strata's message.
        strata_table_options strict = strata_table_options_default();
        strict.missing_key = STRATA_MISSING_ERROR;
        strata_table *t2 = nullptr;
        CHECK(strata_table_from_dlpack(&v, nullptr, &strict, &t2) == STRATA_OK, "%s", strata_last_error());
        float o2[5][4];
        s = strata_trt::lookup(t2, desc({5}, DataType::kINT64, k64), desc({5, 4}, DataType::kFLOAT, o2), nullptr, 0, &err);
        CHECK(s == STRATA_KEY_NOT_FOUND && contains(err, "STRATA_KEY_NOT_FOUND: ") && contains(err, "99"), "%d %s", s,
              err.c_str());
        strata_table_free(t2);
    }

    // ---- the pooled mode (combiner sum | mean | sqrtn, fixed hotness) ----------------------------
    using strata_trt::Combiner;
    const Combiner pooled[3] = {Combiner::kSUM, Combiner::kMEAN, Combiner::kSQRTN};
    // The contract as a plain loop: per sample, rows (or the default row) summed in float32 in key
    // order, then / L (mean) or / sqrt(L) (sqrtn); L = 0 gives zeros.
    auto pooled_want = [&](const int64_t *keys, int64_t l, Combiner c, float *row) {
        for (int64_t j = 0; j < dim; j++) row[j] = 0.0f;
        for (int64_t i = 0; i < l; i++)
            for (int64_t j = 0; j < dim; j++) row[j] += want(keys[i], j);
        const float d = c == Combiner::kMEAN ? static_cast<float>(l)
                        : c == Combiner::kSQRTN ? std::sqrt(static_cast<float>(l))
                                                : 1.0f;
        for (int64_t j = 0; j < dim; j++) row[j] = d == 0.0f ? 0.0f : row[j] / d;
    };

    // The field: names, parsing (with or without the NUL, as PluginField lengths come), output dims.
    {
        Combiner c = Combiner::kNONE;
        const char *names[4] = {"none", "sum", "mean", "sqrtn"};
        for (int i = 0; i < 4; i++) {
            err = strata_trt::parse_combiner(names[i], static_cast<int64_t>(std::strlen(names[i]) + 1), &c);
            CHECK(err.empty() && static_cast<int32_t>(c) == i && std::strcmp(strata_trt::combiner_name(c), names[i]) == 0,
                  "combiner %s: %s", names[i], err.c_str());
        }
        CHECK(static_cast<int32_t>(Combiner::kSUM) == STRATA_POOL_SUM && static_cast<int32_t>(Combiner::kMEAN) ==
                  STRATA_POOL_MEAN && static_cast<int32_t>(Combiner::kSQRTN) == STRATA_POOL_SQRTN,
              "combiner values are strata_pooling values");
        err = strata_trt::parse_combiner("mean", 4, &c);
        CHECK(err.empty() && c == Combiner::kMEAN, "no NUL: %s", err.c_str());
        err = strata_trt::parse_combiner("sqrtnXX", 5, &c);
        CHECK(err.empty() && c == Combiner::kSQRTN, "length bounds the text: %s", err.c_str());
        c = Combiner::kSUM;
        err = strata_trt::parse_combiner("max", 4, &c);
        CHECK(err == "combiner: 'max'; expected none, sum, mean or sqrtn" && c == Combiner::kSUM, "%s", err.c_str());
        err = strata_trt::parse_combiner(nullptr, 0, &c);
        CHECK(err == "combiner: ''; expected none, sum, mean or sqrtn", "%s", err.c_str());

        strata_trt::Dims in, out;
        in.nbDims = 2;
        in.d[0] = 5;
        in.d[1] = 3;
        err = strata_trt::output_dims(in, 4, Combiner::kNONE, &out);
        CHECK(err.empty() && out.nbDims == 3 && out.d[0] == 5 && out.d[1] == 3 && out.d[2] == 4, "none: [5, 3] -> [5, 3, 4]");
        for (Combiner pc : pooled) {
            err = strata_trt::output_dims(in, 4, pc, &out);
            CHECK(err.empty() && out.nbDims == 2 && out.d[0] == 5 && out.d[1] == 4, "%s: [5, 3] -> [5, 4]",
                  strata_trt::combiner_name(pc));
        }
        in.d[0] = -1;  // a dynamic batch stays dynamic
        err = strata_trt::output_dims(in, 4, Combiner::kMEAN, &out);
        CHECK(err.empty() && out.d[0] == -1 && out.d[1] == 4, "dynamic B");
        in.nbDims = 1;
        err = strata_trt::output_dims(in, 4, Combiner::kSUM, &out);
        CHECK(err == "keys: dims [-1]; expected [B, L] (L keys per sample) for combiner sum", "%s", err.c_str());
        in.nbDims = 3;
        err = strata_trt::output_dims(in, 4, Combiner::kSQRTN, &out);
        CHECK(contains(err, "keys: dims [-1, 3, 0]; expected [B, L]") && contains(err, "for combiner sqrtn"), "%s",
              err.c_str());
        CHECK(strata_trt::output_dims(in, 4, Combiner::kNONE, &out).empty() && out.nbDims == 4 && out.d[3] == 4,
              "none: 3-D keys -> 4-D");
        in.nbDims = 8;
        err = strata_trt::output_dims(in, 4, Combiner::kNONE, &out);
        CHECK(contains(err, "keys: nbDims 8; expected 0..7"), "%s", err.c_str());
    }

    // The DLTensors of the pooled mode: keys [B, L] and out [B, dim], row-major.
    {
        int64_t keys[3][2] = {{1, 2}, {3, 4}, {5, 6}};
        float out[3][4];
        strata_trt::DLTensorView k, o;
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys), desc({3, 4}, DataType::kFLOAT, out), 4, k, o);
        CHECK(err.empty(), "%s", err.c_str());
        CHECK(k.tensor.ndim == 2 && k.tensor.shape[0] == 3 && k.tensor.shape[1] == 2 && k.tensor.strides[0] == 2 &&
                  k.tensor.strides[1] == 1 && k.tensor.dtype.code == kDLInt && k.tensor.dtype.bits == 64 &&
                  k.tensor.data == keys && k.tensor.device.device_type == kDLCPU,
              "keys [3, 2]");
        CHECK(o.tensor.ndim == 2 && o.tensor.shape[0] == 3 && o.tensor.shape[1] == 4 && o.tensor.strides[0] == 4 &&
                  o.tensor.strides[1] == 1 && o.tensor.dtype.code == kDLFloat && o.tensor.dtype.bits == 32 &&
                  o.tensor.data == out,
              "out [3, 4]");
        TensorDesc dk = desc({3, 2}, DataType::kINT32, keys, Location::kDevice), dout = desc({3, 4}, DataType::kBF16, out,
                                                                                          Location::kDevice);
        dk.device_id = dout.device_id = 2;
        err = strata_trt::map_pooled(dk, dout, 4, k, o);
        CHECK(err.empty() && k.tensor.device.device_type == kDLCUDA && k.tensor.device.device_id == 2 &&
                  o.tensor.device.device_type == kDLCUDA && o.tensor.dtype.code == kDLBfloat && k.tensor.dtype.bits == 32,
              "device tensors: %s", err.c_str());
        err = strata_trt::map_pooled(desc({6}, DataType::kINT64, keys), desc({6, 4}, DataType::kFLOAT, out), 4, k, o);
        CHECK(err == "keys: dims [6]; expected [B, L] (L keys per sample) for the pooled mode", "%s", err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys), desc({3, 2, 4}, DataType::kFLOAT, out), 4, k, o);
        CHECK(err == "out: dims [3, 2, 4]; expected [B, emb_vec_size] = [3, 4] (one pooled row per sample)", "%s",
              err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys), desc({2, 4}, DataType::kFLOAT, out), 4, k, o);
        CHECK(contains(err, "out: dims [2, 4]; expected [B, emb_vec_size] = [3, 4]"), "%s", err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys), desc({3, 5}, DataType::kFLOAT, out), 4, k, o);
        CHECK(contains(err, "out: dims [3, 5]"), "%s", err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kFLOAT, keys), desc({3, 4}, DataType::kFLOAT, out), 4, k, o);
        CHECK(err == "keys: data type kFLOAT; expected kINT32 or kINT64", "%s", err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys), desc({3, 4}, DataType::kINT32, out), 4, k, o);
        CHECK(err == "out: data type kINT32; expected kFLOAT, kHALF or kBF16", "%s", err.c_str());
        err = strata_trt::map_pooled(desc({3, 2}, DataType::kINT64, keys),
                                     desc({3, 4}, DataType::kFLOAT, out, Location::kDevice), 4, k, o);
        CHECK(contains(err, "one on the host, one on the device"), "%s", err.c_str());
    }

    // End to end through strata_lookup_pooled: every combiner, int32 and int64 keys, misses, float32
    // compared bit for bit with the loop, float16 and bfloat16 rows.
    {
        // int64 keys [4, 3]: 10, 11 and -1 are missing (the default row, -7 everywhere)
        const int64_t k64[4][3] = {{0, 9, 3}, {10, 2, 2}, {-1, 11, 5}, {7, 7, 7}};
        int32_t k32[4][3];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) k32[i][j] = static_cast<int32_t>(k64[i][j]);
        for (Combiner c : pooled) {
            for (int width = 32; width <= 64; width += 32) {
                float out[4][4];
                for (auto &r : out)
                    for (float &x : r) x = NAN;
                strata_status s = width == 32
                                      ? strata_trt::run(table, c, desc({4, 3}, DataType::kINT32, k32),
                                                        desc({4, 4}, DataType::kFLOAT, out), nullptr, 0, &err)
                                      : strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64),
                                                                  desc({4, 4}, DataType::kFLOAT, out), c, nullptr, 1, &err);
                CHECK(s == STRATA_OK, "%s int%d: %s", strata_trt::combiner_name(c), width, err.c_str());
                bool same = true;
                for (int i = 0; i < 4; i++) {
                    float row[4];
                    pooled_want(k64[i], 3, c, row);
                    for (int j = 0; j < 4; j++) same = same && f32_bits(out[i][j]) == f32_bits(row[j]);
                }
                CHECK(same, "%s from int%d keys [4, 3] equals the loop", strata_trt::combiner_name(c), width);
            }
        }
        // sum into float16 and bfloat16 (the sums are exact in both)
        uint16_t h[4][4], bf[4][4];
        std::memset(h, 0xFF, sizeof h);
        std::memset(bf, 0xFF, sizeof bf);
        strata_status s = strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64),
                                                    desc({4, 4}, DataType::kHALF, h), Combiner::kSUM, nullptr, 0, &err);
        CHECK(s == STRATA_OK, "%s", err.c_str());
        s = strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64), desc({4, 4}, DataType::kBF16, bf),
                                      Combiner::kSUM, nullptr, 0, &err);
        CHECK(s == STRATA_OK, "%s", err.c_str());
        bool hs = true, bs = true;
        for (int i = 0; i < 4; i++) {
            float row[4];
            pooled_want(k64[i], 3, Combiner::kSUM, row);
            for (int j = 0; j < 4; j++) {
                hs = hs && h[i][j] == half_bits(row[j]);
                bs = bs && bf[i][j] == static_cast<uint16_t>(f32_bits(row[j]) >> 16);
            }
        }
        CHECK(hs, "sum into float16");
        CHECK(bs, "sum into bfloat16");
        // L = 0: every sample's bag is empty, zeros; B = 0: nothing
        float z[2][4];
        for (auto &r : z)
            for (float &x : r) x = NAN;
        s = strata_trt::lookup_pooled(table, desc({2, 0}, DataType::kINT64, k64), desc({2, 4}, DataType::kFLOAT, z),
                                      Combiner::kMEAN, nullptr, 0, &err);
        bool zeros = true;
        for (auto &r : z)
            for (float x : r) zeros = zeros && x == 0.0f;
        CHECK(s == STRATA_OK && zeros, "[2, 0] keys give zero rows: %s", err.c_str());
        s = strata_trt::lookup_pooled(table, desc({0, 3}, DataType::kINT64, nullptr), desc({0, 4}, DataType::kFLOAT, nullptr),
                                      Combiner::kSUM, nullptr, 0, &err);
        CHECK(s == STRATA_OK, "B = 0: %s", err.c_str());
        // run() with kNONE is the plain lookup: [4, 3] -> [4, 3, 4]
        float plain[4][3][4];
        s = strata_trt::run(table, Combiner::kNONE, desc({4, 3}, DataType::kINT64, k64),
                            desc({4, 3, 4}, DataType::kFLOAT, plain), nullptr, 0, &err);
        bool ps = s == STRATA_OK;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                for (int c = 0; c < 4; c++) ps = ps && plain[i][j][c] == want(k64[i][j], c);
        CHECK(ps, "run(kNONE) is the plain lookup: %s", err.c_str());

        // Refusals leave out as it was; strata's own refusals carry its message.
        float out[4][4];
        for (auto &r : out)
            for (float &x : r) x = NAN;
        s = strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64), desc({4, 4}, DataType::kFLOAT, out),
                                      Combiner::kNONE, nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && err == "combiner: none; expected sum, mean or sqrtn for a pooled lookup",
              "%s", err.c_str());
        s = strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64), desc({4, 4}, DataType::kFLOAT, out),
                                      static_cast<Combiner>(7), nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "STRATA_INVALID_ARGUMENT: pooling: 7; expected"), "%s",
              err.c_str());
        s = strata_trt::lookup_pooled(nullptr, desc({4, 3}, DataType::kINT64, k64), desc({4, 4}, DataType::kFLOAT, out),
                                      Combiner::kSUM, nullptr, 0, &err);
        CHECK(s == STRATA_NULL_ARGUMENT && contains(err, "table: NULL"), "%s", err.c_str());
        s = strata_trt::run(table, Combiner::kMEAN, desc({12}, DataType::kINT64, k64), desc({12, 4}, DataType::kFLOAT, out),
                            nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "keys: dims [12]; expected [B, L]"), "%s", err.c_str());
        s = strata_trt::run(table, Combiner::kSUM, desc({4, 3}, DataType::kINT64, k64), desc({4, 3, 4}, DataType::kFLOAT, out),
                            nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "out: dims [4, 3, 4]"), "%s", err.c_str());
        s = strata_trt::run(table, Combiner::kSUM, desc({4, 3}, DataType::kINT64, k64), desc({3, 4}, DataType::kFLOAT, out),
                            nullptr, 0, &err);
        CHECK(s == STRATA_INVALID_ARGUMENT && contains(err, "out: dims [3, 4]; expected [B, emb_vec_size] = [4, 4]"), "%s",
              err.c_str());
        bool untouched = true;
        for (auto &r : out)
            for (float x : r) untouched = untouched && std::isnan(x);
        CHECK(untouched, "refused pooled calls leave out as it was");
        if (!strata_cuda_available()) {
            s = strata_trt::lookup_pooled(table, desc({4, 3}, DataType::kINT64, k64, Location::kDevice),
                                          desc({4, 4}, DataType::kFLOAT, out, Location::kDevice), Combiner::kSUM, nullptr,
                                          0, &err);
            CHECK(s == STRATA_UNSUPPORTED_DEVICE && contains(err, "STRATA_UNSUPPORTED_DEVICE: "), "%d %s", s, err.c_str());
        }
        // A missing key fails the call in a table that says so, with strata's message.
        strata_table_options strict = strata_table_options_default();
        strict.missing_key = STRATA_MISSING_ERROR;
        strata_table *t2 = nullptr;
        CHECK(strata_table_from_dlpack(&v, nullptr, &strict, &t2) == STRATA_OK, "%s", strata_last_error());
        s = strata_trt::lookup_pooled(t2, desc({4, 3}, DataType::kINT64, k64), desc({4, 4}, DataType::kFLOAT, out),
                                      Combiner::kSQRTN, nullptr, 0, &err);
        CHECK(s == STRATA_KEY_NOT_FOUND && contains(err, "STRATA_KEY_NOT_FOUND: ") && contains(err, "10"), "%d %s", s,
              err.c_str());
        strata_table_free(t2);
    }

    strata_table_free(table);
    layers_share_one_server();
    std::printf("trt_dlpack: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
