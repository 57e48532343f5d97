// libtriton_strata.so driven by a stand-in for tritonserver: this program implements the Triton
// functions the backend calls (in memory, no server), loads the backend, and runs executions that
// a real server rarely produces: inputs handed over in several pieces at odd addresses, several
// requests of which one is bad, and metrics switched off. It also stands in front of libstrata's
// strata_lookup_batch (the program exports its own, which counts the calls and forwards to the
// library's), to check that one execution makes one strata_lookup_batch call.
//
//   test_backend_host <path/to/libtriton_strata.so> <scratch folder>
#include <dlfcn.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata.h"
#include "triton_api.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

// ---- the stand-in's objects ------------------------------------------------------------------

struct TRITONSERVER_Error {
    TRITONSERVER_Error_Code code;
    std::string message;
};
struct TRITONSERVER_Message {
    std::string json;
};
struct TRITONBACKEND_Backend {
    TRITONSERVER_Message config;
    void *state = nullptr;
};
struct TRITONBACKEND_Model {
    TRITONBACKEND_Backend *backend;
    TRITONSERVER_Message config;
    std::string name, repository;
    void *state = nullptr;
};
struct TRITONBACKEND_ModelInstance {
    TRITONBACKEND_Model *model;
    void *state = nullptr;
};
struct TRITONBACKEND_Input {
    std::string name;
    TRITONSERVER_DataType dtype;
    std::vector<int64_t> shape;
    std::vector<std::pair<const void *, uint64_t>> buffers;
};
struct TRITONBACKEND_Output {
    std::vector<int64_t> shape;
    std::vector<char> data;
};
struct TRITONBACKEND_Request {
    std::vector<TRITONBACKEND_Input> inputs;
    std::vector<std::string> outputs;
    bool released = false;
};
struct TRITONBACKEND_Response {
    TRITONBACKEND_Request *request;
    std::map<std::string, TRITONBACKEND_Output> outputs;
};

namespace {
int g_failures = 0;
int g_batch_calls = 0;
bool g_metrics = false;
// What each request got: its outputs, or the error message.
std::map<TRITONBACKEND_Request *, std::map<std::string, TRITONBACKEND_Output>> g_sent;
std::map<TRITONBACKEND_Request *, std::string> g_errors;

void check(bool ok, const std::string &what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
    if (!ok) ++g_failures;
}
TRITONSERVER_Error *fail(const std::string &msg) { return new TRITONSERVER_Error{TRITONSERVER_ERROR_INVALID_ARG, msg}; }
}  // namespace

// ---- the Triton functions the backend calls -------------------------------------------------

EXPORT TRITONSERVER_Error *TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char *msg) {
    return new TRITONSERVER_Error{code, msg};
}
EXPORT void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *e) { delete e; }
EXPORT const char *TRITONSERVER_ErrorMessage(TRITONSERVER_Error *e) { return e->message.c_str(); }
EXPORT bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level) { return level != TRITONSERVER_LOG_VERBOSE; }
EXPORT TRITONSERVER_Error *TRITONSERVER_LogMessage(TRITONSERVER_LogLevel, const char *, int, const char *msg) {
    std::printf("  log: %s\n", msg);
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message *m, const char **base, size_t *size) {
    *base = m->json.c_str();
    *size = m->json.size();
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONSERVER_MessageDelete(TRITONSERVER_Message *) { return nullptr; }
EXPORT TRITONSERVER_Parameter *TRITONSERVER_ParameterNew(const char *, TRITONSERVER_ParameterType, const void *) {
    return nullptr;
}
EXPORT void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter *) {}
// Metrics are switched off in this server (as with --allow-metrics=false): the backend must
// still serve, and report its statistics in the log.
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily **, TRITONSERVER_MetricKind,
                                                        const char *, const char *) {
    return g_metrics ? nullptr : new TRITONSERVER_Error{TRITONSERVER_ERROR_UNAVAILABLE, "metrics are disabled"};
}
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily *) { return nullptr; }
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricNew(TRITONSERVER_Metric **, TRITONSERVER_MetricFamily *,
                                                  const TRITONSERVER_Parameter **, uint64_t) {
    return fail("no metric families here");
}
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricDelete(TRITONSERVER_Metric *) { return nullptr; }
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricIncrement(TRITONSERVER_Metric *, double) { return nullptr; }
EXPORT TRITONSERVER_Error *TRITONSERVER_MetricSet(TRITONSERVER_Metric *, double) { return nullptr; }

EXPORT TRITONSERVER_Error *TRITONBACKEND_ApiVersion(uint32_t *major, uint32_t *minor) {
    *major = 1;
    *minor = 19;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_BackendName(TRITONBACKEND_Backend *, const char **name) {
    *name = "strata";
    return nullptr;
}
// Accessors: `*out = obj->field`, and `obj->field = value`.
#define GETTER(fn, Obj, T, expr)                  \
    EXPORT TRITONSERVER_Error *fn(Obj *o, T *out) { \
        *out = (expr);                            \
        return nullptr;                           \
    }
#define SETTER(fn, Obj, field)                       \
    EXPORT TRITONSERVER_Error *fn(Obj *o, void *value) { \
        o->field = value;                            \
        return nullptr;                              \
    }
GETTER(TRITONBACKEND_BackendConfig, TRITONBACKEND_Backend, TRITONSERVER_Message *, &o->config)
GETTER(TRITONBACKEND_BackendState, TRITONBACKEND_Backend, void *, o->state)
SETTER(TRITONBACKEND_BackendSetState, TRITONBACKEND_Backend, state)
GETTER(TRITONBACKEND_ModelName, TRITONBACKEND_Model, const char *, o->name.c_str())
GETTER(TRITONBACKEND_ModelVersion, TRITONBACKEND_Model, uint64_t, o != nullptr ? 1 : 0)  // version 1
GETTER(TRITONBACKEND_ModelBackend, TRITONBACKEND_Model, TRITONBACKEND_Backend *, o->backend)
GETTER(TRITONBACKEND_ModelState, TRITONBACKEND_Model, void *, o->state)
SETTER(TRITONBACKEND_ModelSetState, TRITONBACKEND_Model, state)
GETTER(TRITONBACKEND_ModelInstanceName, TRITONBACKEND_ModelInstance, const char *, o != nullptr ? "model_0" : "")
GETTER(TRITONBACKEND_ModelInstanceKind, TRITONBACKEND_ModelInstance, TRITONSERVER_InstanceGroupKind,
       o != nullptr ? TRITONSERVER_INSTANCEGROUPKIND_CPU : TRITONSERVER_INSTANCEGROUPKIND_AUTO)
GETTER(TRITONBACKEND_ModelInstanceDeviceId, TRITONBACKEND_ModelInstance, int32_t, o != nullptr ? 0 : -1)
GETTER(TRITONBACKEND_ModelInstanceModel, TRITONBACKEND_ModelInstance, TRITONBACKEND_Model *, o->model)
GETTER(TRITONBACKEND_ModelInstanceState, TRITONBACKEND_ModelInstance, void *, o->state)
SETTER(TRITONBACKEND_ModelInstanceSetState, TRITONBACKEND_ModelInstance, state)

EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelRepository(TRITONBACKEND_Model *m, TRITONBACKEND_ArtifactType *t,
                                                         const char **location) {
    *t = TRITONBACKEND_ARTIFACT_FILESYSTEM;
    *location = m->repository.c_str();
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelConfig(TRITONBACKEND_Model *m, uint32_t, TRITONSERVER_Message **c) {
    *c = &m->config;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance *, TRITONBACKEND_Request *,
                                                                       bool, uint64_t, uint64_t, uint64_t, uint64_t) {
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance *, uint64_t, uint64_t,
                                                                            uint64_t, uint64_t, uint64_t) {
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_RequestInput(TRITONBACKEND_Request *r, const char *name, TRITONBACKEND_Input **in) {
    for (auto &i : r->inputs) {
        if (i.name == name) {
            *in = &i;
            return nullptr;
        }
    }
    return fail(std::string("no input ") + name);
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request *r, uint32_t *n) {
    *n = uint32_t(r->outputs.size());
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request *r, uint32_t i, const char **name) {
    *name = r->outputs.at(i).c_str();
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_RequestRelease(TRITONBACKEND_Request *r, uint32_t) {
    r->released = true;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_InputProperties(TRITONBACKEND_Input *in, const char **name,
                                                         TRITONSERVER_DataType *dtype, const int64_t **shape,
                                                         uint32_t *dims, uint64_t *bytes, uint32_t *buffers) {
    if (name) *name = in->name.c_str();
    *dtype = in->dtype;
    *shape = in->shape.data();
    *dims = uint32_t(in->shape.size());
    uint64_t total = 0;
    for (auto &b : in->buffers) total += b.second;
    *bytes = total;
    *buffers = uint32_t(in->buffers.size());
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_InputBuffer(TRITONBACKEND_Input *in, uint32_t index, const void **buffer,
                                                     uint64_t *size, TRITONSERVER_MemoryType *type, int64_t *id) {
    *buffer = in->buffers.at(index).first;
    *size = in->buffers.at(index).second;
    *type = TRITONSERVER_MEMORY_CPU;
    *id = 0;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ResponseNew(TRITONBACKEND_Response **resp, TRITONBACKEND_Request *r) {
    *resp = new TRITONBACKEND_Response{r, {}};
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response *resp) {
    delete resp;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response *resp, TRITONBACKEND_Output **out,
                                                        const char *name, TRITONSERVER_DataType, const int64_t *shape,
                                                        uint32_t dims) {
    TRITONBACKEND_Output &o = resp->outputs[name];
    o.shape.assign(shape, shape + dims);
    *out = &o;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ResponseSetIntParameter(TRITONBACKEND_Response *, const char *, int64_t) {
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_ResponseSend(TRITONBACKEND_Response *resp, uint32_t, TRITONSERVER_Error *err) {
    if (err != nullptr) g_errors[resp->request] = err->message;
    else g_sent[resp->request] = resp->outputs;
    delete resp;
    return nullptr;
}
EXPORT TRITONSERVER_Error *TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output *o, void **buffer, uint64_t bytes,
                                                      TRITONSERVER_MemoryType *type, int64_t *id) {
    o->data.assign(bytes + 1, char(0x7f));  // one guard byte past the end
    *buffer = o->data.data();
    *type = TRITONSERVER_MEMORY_CPU;
    *id = 0;
    return nullptr;
}

// The backend's strata_lookup_batch resolves here first (this program exports it): count, forward.
EXPORT strata_status strata_lookup_batch(const strata_lookup_request *requests, size_t n, const strata_lookup_options *opts) {
    ++g_batch_calls;
    using Fn = strata_status (*)(const strata_lookup_request *, size_t, const strata_lookup_options *);
    static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "strata_lookup_batch"));
    return next(requests, n, opts);
}

// ---- the test --------------------------------------------------------------------------------

static void write_file(const std::string &path, const void *data, size_t n) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char *>(data), std::streamsize(n));
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s path/to/libtriton_strata.so scratch-folder\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[2];
    // Two tables: 100 x 4 (keys 10i) and 50 x 8 (keys 1000 + i).
    const int64_t dims[2] = {4, 8}, rows[2] = {100, 50};
    for (int t = 0; t < 2; ++t) {
        std::string folder = dir + "/t" + std::to_string(t);
        mkdir(folder.c_str(), 0755);
        std::vector<int64_t> keys(size_t(rows[t]));
        std::vector<float> vecs(size_t(rows[t] * dims[t]));
        for (int64_t i = 0; i < rows[t]; ++i) keys[size_t(i)] = t == 0 ? 10 * i : 1000 + i;
        for (size_t i = 0; i < vecs.size(); ++i) vecs[i] = float(t * 1000) + float(i) * 0.5f;
        write_file(folder + "/key", keys.data(), keys.size() * 8);
        write_file(folder + "/emb_vector", vecs.data(), vecs.size() * 4);
    }
    const std::string ps = dir + "/ps.json";
    std::ofstream(ps) << R"({"supportlonglong": true, "volatile_db": {"type": "disabled"}, "persistent_db": {"type": "disabled"},
      "models": [{"model": "wdl", "sparse_files": ["t0", "t1"], "embedding_vecsize_per_table": [4, 8],
      "maxnum_catfeature_query_per_table_per_sample": [1, 1], "default_value_for_each_table": [0.0, -1.0],
      "deployed_device_list": [0], "max_batch_size": 64}]})";

    void *lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) {
        std::fprintf(stderr, "FAIL: %s\n", dlerror());
        return 1;
    }
    auto sym = [&](const char *name) { return dlsym(lib, name); };
    auto init = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_Backend *)>(sym("TRITONBACKEND_Initialize"));
    auto fini = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_Backend *)>(sym("TRITONBACKEND_Finalize"));
    auto model_init = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_Model *)>(sym("TRITONBACKEND_ModelInitialize"));
    auto model_fini = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_Model *)>(sym("TRITONBACKEND_ModelFinalize"));
    auto inst_init = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_ModelInstance *)>(
        sym("TRITONBACKEND_ModelInstanceInitialize"));
    auto inst_fini = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_ModelInstance *)>(
        sym("TRITONBACKEND_ModelInstanceFinalize"));
    auto execute = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_ModelInstance *, TRITONBACKEND_Request **, uint32_t)>(
        sym("TRITONBACKEND_ModelInstanceExecute"));

    TRITONBACKEND_Backend backend;
    backend.config.json = R"({"cmdline": {"ps": ")" + ps + R"("}})";
    TRITONSERVER_Error *err = init(&backend);
    check(err == nullptr, "TRITONBACKEND_Initialize with metrics off");
    TRITONBACKEND_Model model{&backend, {}, "wdl", dir, nullptr};
    model.config.json = R"({"name": "wdl", "max_batch_size": 0,
      "input": [{"name": "KEYS", "data_type": "TYPE_INT64", "dims": ["-1", "-1"]},
                {"name": "NUMKEYS", "data_type": "TYPE_INT32", "dims": ["-1", "-1"]}],
      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["-1"]}]})";
    err = model_init(&model);
    check(err == nullptr, std::string("TRITONBACKEND_ModelInitialize") + (err ? ": " + err->message : ""));
    TRITONBACKEND_ModelInstance instance{&model, nullptr};
    err = inst_init(&instance);
    check(err == nullptr, "TRITONBACKEND_ModelInstanceInitialize");
    if (g_failures) return 1;

    // The expected rows, straight from strata (the same server: one per configuration).
    strata_server *srv = nullptr;
    strata_table *tables[2] = {nullptr, nullptr};
    check(strata_server_open(ps.c_str(), &srv) == STRATA_OK && strata_server_table(srv, "wdl", 0, &tables[0]) == STRATA_OK &&
              strata_server_table(srv, "wdl", 1, &tables[1]) == STRATA_OK,
          "strata_server_open of the same ps.json");
    auto expected = [&](const std::vector<int64_t> &k0, const std::vector<int64_t> &k1) {
        std::vector<float> out;
        const std::vector<int64_t> *ks[2] = {&k0, &k1};
        for (int t = 0; t < 2; ++t) {
            std::vector<float> rows_out(ks[t]->size() * size_t(dims[t]));
            int64_t kshape[1] = {int64_t(ks[t]->size())}, oshape[2] = {kshape[0], dims[t]};
            DLTensor kt{const_cast<int64_t *>(ks[t]->data()), {kDLCPU, 0}, 1, {kDLInt, 64, 1}, kshape, nullptr, 0};
            DLTensor ot{rows_out.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, oshape, nullptr, 0};
            if (kshape[0] > 0 && strata_lookup(tables[t], &kt, &ot, nullptr, nullptr) != STRATA_OK) ++g_failures;
            out.insert(out.end(), rows_out.begin(), rows_out.end());
        }
        return out;
    };

    // Three requests in one execution. Request 0: KEYS in three pieces, the second and third at
    // odd addresses. Request 1: NUMKEYS that do not add up. Request 2: plain, with misses.
    std::vector<int64_t> a0 = {0, 10, 990, 7}, a1 = {1000, 1049, 5000};
    std::vector<int64_t> keys0(a0);
    keys0.insert(keys0.end(), a1.begin(), a1.end());
    std::vector<char> raw(keys0.size() * 8 + 16);
    char *odd = raw.data() + 3;  // misaligned for int64
    std::memcpy(odd, keys0.data(), keys0.size() * 8);
    int32_t nk0[2] = {4, 3}, nk_bad[2] = {4, 4}, nk2[2] = {1, 2};
    std::vector<int64_t> keys2 = {20, 1001, 99999};
    TRITONBACKEND_Request r0, r1, r2;
    r0.inputs = {{"KEYS", TRITONSERVER_TYPE_INT64, {1, 7}, {{odd, 16}, {odd + 16, 24}, {odd + 40, 16}}},
                 {"NUMKEYS", TRITONSERVER_TYPE_INT32, {1, 2}, {{nk0, 8}}}};
    r1.inputs = {{"KEYS", TRITONSERVER_TYPE_INT64, {1, 7}, {{keys0.data(), 56}}},
                 {"NUMKEYS", TRITONSERVER_TYPE_INT32, {1, 2}, {{nk_bad, 8}}}};
    r2.inputs = {{"KEYS", TRITONSERVER_TYPE_INT64, {1, 3}, {{keys2.data(), 24}}},
                 {"NUMKEYS", TRITONSERVER_TYPE_INT32, {1, 2}, {{nk2, 8}}}};
    for (auto *r : {&r0, &r1, &r2}) r->outputs = {"OUTPUT0"};
    TRITONBACKEND_Request *batch[3] = {&r0, &r1, &r2};
    g_batch_calls = 0;
    err = execute(&instance, batch, 3);
    check(err == nullptr, "TRITONBACKEND_ModelInstanceExecute");
    check(g_batch_calls == 1, "one strata_lookup_batch for the execution (" + std::to_string(g_batch_calls) + ")");
    check(r0.released && r1.released && r2.released, "every request released");
    auto got = [&](TRITONBACKEND_Request *r) {
        const TRITONBACKEND_Output &o = g_sent[r]["OUTPUT0"];
        std::vector<float> v(o.data.size() / 4);
        std::memcpy(v.data(), o.data.data(), v.size() * 4);
        return std::make_pair(v, o.data.empty() ? 'x' : o.data.back());
    };
    auto [v0, guard0] = got(&r0);
    check(g_sent.count(&r0) && v0 == expected(a0, a1) && guard0 == char(0x7f),
          "request 0 (KEYS in 3 misaligned pieces): the rows, nothing past the end");
    check(g_errors.count(&r1) && g_errors[&r1].find("NUMKEYS") != std::string::npos, "request 1: " + g_errors[&r1]);
    auto [v2, guard2] = got(&r2);
    check(g_sent.count(&r2) && v2 == expected({20}, {1001, 99999}) && guard2 == char(0x7f) && v2.back() == -1.0f,
          "request 2: the rows, the miss filled with the table's default (-1)");

    // Only failing requests: no strata call at all.
    g_batch_calls = 0;
    TRITONBACKEND_Request r3;
    r3.inputs = r1.inputs;
    r3.outputs = {"OUTPUT0"};
    TRITONBACKEND_Request *one[1] = {&r3};
    execute(&instance, one, 1);
    check(g_batch_calls == 0 && g_errors.count(&r3) && r3.released, "a lone bad request: an error, no lookup");

    strata_server_free(srv);
    check(inst_fini(&instance) == nullptr && model_fini(&model) == nullptr && fini(&backend) == nullptr, "finalize");
    std::printf("%s\n", g_failures ? "FAILED" : "all passed");
    return g_failures ? 1 : 0;
}
