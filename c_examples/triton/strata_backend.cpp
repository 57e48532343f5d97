// libtriton_strata.so: a Triton Inference Server backend named `strata` that serves embedding
// lookups from strata tables (include/strata.h, used only through its public C API).
//
// Two interfaces, chosen by the model configuration (docs/guide.md, "Triton Inference Server backend"):
//   - HPS: the model configuration of HugeCTR's hps_backend, unchanged but for `backend: "strata"`:
//     inputs KEYS (the keys of every table of the model, concatenated) and NUMKEYS (int32, how
//     many of them belong to each table), output OUTPUT0 (the rows, concatenated, flattened).
//   - native: one keys input per table, each named by a `lookup.<input>` parameter, plain or
//     pooled (offsets or fixed hotness, sum/mean/sqrtn, optional weights), FP32/FP16/BF16 outputs.
// Tables come from an HPS ps.json opened with strata_server_open, so every model (and every
// instance) over one configuration shares one strata server; the model holds one handle, freed
// when the model is unloaded. All the lookups of one execution go to strata as one
// strata_lookup_batch.
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "json.h"
#include "strata.h"
#include "triton_api.h"

namespace strata_triton {

// ---- small helpers -------------------------------------------------------------------------

#define STRATA_LOG(level, msg) log_message((level), __FILE__, __LINE__, (msg))

void log_message(TRITONSERVER_LogLevel level, const char *file, int line, const std::string &msg) {
    if (!TRITONSERVER_LogIsEnabled(level)) return;
    TRITONSERVER_Error *err = TRITONSERVER_LogMessage(level, file, line, msg.c_str());
    if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}

TRITONSERVER_Error *error(TRITONSERVER_Error_Code code, const std::string &msg) {
    return TRITONSERVER_ErrorNew(code, msg.c_str());
}

// Logs and drops an error the backend cannot report to anyone else.
void log_if_error(TRITONSERVER_Error *err, const char *what) {
    if (err == nullptr) return;
    STRATA_LOG(TRITONSERVER_LOG_ERROR, std::string(what) + ": " + TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
}

#define RETURN_IF_TRITON_ERROR(...)                \
    do {                                           \
        TRITONSERVER_Error *err__ = (__VA_ARGS__); \
        if (err__ != nullptr) return err__;        \
    } while (false)

// "STRATA_CONFIG_ERROR: ps.json: models[0]...": strata's status name and message.
std::string strata_message(strata_status s) {
    return std::string(strata_status_name(s)) + ": " + strata_last_error();
}

TRITONSERVER_Error_Code triton_code(strata_status s) {
    switch (s) {
    case STRATA_NULL_ARGUMENT:
    case STRATA_INVALID_ARGUMENT:
    case STRATA_UNSUPPORTED_DTYPE:
    case STRATA_INVALID_LAYOUT:
    case STRATA_CONFIG_ERROR:
        return TRITONSERVER_ERROR_INVALID_ARG;
    case STRATA_KEY_NOT_FOUND:
        return TRITONSERVER_ERROR_NOT_FOUND;
    case STRATA_UNSUPPORTED_DEVICE:
        return TRITONSERVER_ERROR_UNSUPPORTED;
    default:
        return TRITONSERVER_ERROR_INTERNAL;
    }
}

uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

std::string shape_string(const int64_t *shape, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

int64_t elements(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

bool file_exists(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Triton's configuration names of the data types this backend takes.
bool config_dtype(const std::string &name, TRITONSERVER_DataType *out) {
    static const std::pair<const char *, TRITONSERVER_DataType> kTypes[] = {
        {"TYPE_INT32", TRITONSERVER_TYPE_INT32}, {"TYPE_INT64", TRITONSERVER_TYPE_INT64},
        {"TYPE_UINT32", TRITONSERVER_TYPE_UINT32}, {"TYPE_UINT64", TRITONSERVER_TYPE_UINT64},
        {"TYPE_FP32", TRITONSERVER_TYPE_FP32}, {"TYPE_FP16", TRITONSERVER_TYPE_FP16},
        {"TYPE_BF16", TRITONSERVER_TYPE_BF16}};
    for (const auto &t : kTypes) {
        if (name == t.first) {
            *out = t.second;
            return true;
        }
    }
    return false;
}

bool is_key_dtype(TRITONSERVER_DataType t) {
    return t == TRITONSERVER_TYPE_INT32 || t == TRITONSERVER_TYPE_INT64 || t == TRITONSERVER_TYPE_UINT32 ||
           t == TRITONSERVER_TYPE_UINT64;
}
bool is_row_dtype(TRITONSERVER_DataType t) {
    return t == TRITONSERVER_TYPE_FP32 || t == TRITONSERVER_TYPE_FP16 || t == TRITONSERVER_TYPE_BF16;
}

DLDataType dl_dtype(TRITONSERVER_DataType t) {
    switch (t) {
    case TRITONSERVER_TYPE_INT32: return DLDataType{kDLInt, 32, 1};
    case TRITONSERVER_TYPE_INT64: return DLDataType{kDLInt, 64, 1};
    case TRITONSERVER_TYPE_UINT32: return DLDataType{kDLUInt, 32, 1};
    case TRITONSERVER_TYPE_UINT64: return DLDataType{kDLUInt, 64, 1};
    case TRITONSERVER_TYPE_FP16: return DLDataType{kDLFloat, 16, 1};
    case TRITONSERVER_TYPE_BF16: return DLDataType{kDLBfloat, 16, 1};
    default: return DLDataType{kDLFloat, 32, 1};
    }
}

size_t dtype_size(TRITONSERVER_DataType t) {
    switch (t) {
    case TRITONSERVER_TYPE_INT64:
    case TRITONSERVER_TYPE_UINT64: return 8;
    case TRITONSERVER_TYPE_FP16:
    case TRITONSERVER_TYPE_BF16: return 2;
    default: return 4;
    }
}

DLDevice dl_device(TRITONSERVER_MemoryType type, int64_t id) {
    switch (type) {
    case TRITONSERVER_MEMORY_GPU: return DLDevice{kDLCUDA, int32_t(id)};
    case TRITONSERVER_MEMORY_CPU_PINNED: return DLDevice{kDLCUDAHost, 0};
    default: return DLDevice{kDLCPU, 0};
    }
}

// ---- metrics -------------------------------------------------------------------------------

// A counter or gauge of one family with fixed labels; a no-op when metrics are off.
class Metric {
  public:
    Metric() = default;
    Metric(const Metric &) = delete;
    Metric &operator=(const Metric &) = delete;
    ~Metric() {
        if (metric_ != nullptr) log_if_error(TRITONSERVER_MetricDelete(metric_), "deleting a strata metric");
    }
    void create(TRITONSERVER_MetricFamily *family, const std::vector<std::pair<std::string, std::string>> &labels) {
        if (family == nullptr) return;
        std::vector<TRITONSERVER_Parameter *> params;
        for (const auto &l : labels) {
            params.push_back(TRITONSERVER_ParameterNew(l.first.c_str(), TRITONSERVER_PARAMETER_STRING, l.second.c_str()));
        }
        std::vector<const TRITONSERVER_Parameter *> cparams(params.begin(), params.end());
        log_if_error(TRITONSERVER_MetricNew(&metric_, family, cparams.data(), cparams.size()), "creating a strata metric");
        for (auto *p : params) TRITONSERVER_ParameterDelete(p);
    }
    void add(double v) {
        if (metric_ != nullptr && v != 0) log_if_error(TRITONSERVER_MetricIncrement(metric_, v), "strata metric");
    }
    void set(double v) {
        if (metric_ != nullptr) log_if_error(TRITONSERVER_MetricSet(metric_, v), "strata metric");
    }

  private:
    TRITONSERVER_Metric *metric_ = nullptr;
};

// ---- backend state -------------------------------------------------------------------------

struct BackendState {
    std::string ps_path;  // --backend-config=strata,ps=<path>
    TRITONSERVER_MetricFamily *hits_family = nullptr;
    TRITONSERVER_MetricFamily *misses_family = nullptr;
    TRITONSERVER_MetricFamily *handles_family = nullptr;
    std::unique_ptr<Metric> handles;  // strata server handles held by loaded models
    std::atomic<int64_t> open_handles{0};

    void handle_opened() { handles->set(double(++open_handles)); }
    void handle_closed() { handles->set(double(--open_handles)); }

    ~BackendState() {
        handles.reset();
        for (auto *f : {hits_family, misses_family, handles_family}) {
            if (f != nullptr) log_if_error(TRITONSERVER_MetricFamilyDelete(f), "deleting a strata metric family");
        }
    }
};

TRITONSERVER_MetricFamily *new_family(TRITONSERVER_MetricKind kind, const char *name, const char *help) {
    TRITONSERVER_MetricFamily *family = nullptr;
    TRITONSERVER_Error *err = TRITONSERVER_MetricFamilyNew(&family, kind, name, help);
    if (err != nullptr) {
        STRATA_LOG(TRITONSERVER_LOG_WARN, std::string("strata: no metric ") + name + " (" +
                                              TRITONSERVER_ErrorMessage(err) + "); statistics go to the log at unload");
        TRITONSERVER_ErrorDelete(err);
        return nullptr;
    }
    return family;
}

// ---- model state ---------------------------------------------------------------------------

// The hits and misses of one table of one model: Triton metrics, and totals for the log.
struct TableCounters {
    std::string table;
    Metric volatile_hits, persistent_hits, static_hits, misses;
    std::atomic<uint64_t> total_hits{0}, total_misses{0}, total_volatile{0}, total_persistent{0};

    void add(const strata_lookup_stats &s) {
        uint64_t other = s.hits - std::min(s.hits, s.volatile_hits + s.persistent_hits);
        volatile_hits.add(double(s.volatile_hits));
        persistent_hits.add(double(s.persistent_hits));
        static_hits.add(double(other));
        misses.add(double(s.misses));
        total_hits += s.hits;
        total_misses += s.misses;
        total_volatile += s.volatile_hits;
        total_persistent += s.persistent_hits;
    }
};

// One native lookup: a keys input, its table and its output.
struct NativeLookup {
    std::string keys, offsets, weights, output;
    int32_t pooling = STRATA_POOL_NONE;
    TRITONSERVER_DataType keys_dtype = TRITONSERVER_TYPE_INT64;
    TRITONSERVER_DataType out_dtype = TRITONSERVER_TYPE_FP32;
    size_t table = 0;  // index into ModelState::tables
};

struct ModelState {
    BackendState *backend = nullptr;
    std::string name;
    uint64_t version = 0;
    std::string ps_path;   // the configuration this model was loaded from
    std::string ps_model;  // the model's name in it
    strata_server *server = nullptr;
    bool hps = true;
    bool batched = false;  // max_batch_size > 0
    int32_t num_threads = 0;  // the `num_threads` parameter; 0 = the instance thread's CPUs
    std::vector<strata_table *> tables;
    std::vector<int64_t> dims;
    std::vector<std::unique_ptr<TableCounters>> counters;
    // HPS interface
    TRITONSERVER_DataType keys_dtype = TRITONSERVER_TYPE_INT64;
    TRITONSERVER_DataType out_dtype = TRITONSERVER_TYPE_FP32;
    // native interface
    std::vector<NativeLookup> lookups;

    ~ModelState() {
        log_stats();
        counters.clear();
        if (server != nullptr) {
            strata_server_free(server);
            backend->handle_closed();
        }
    }

    void log_stats() const {
        for (const auto &c : counters) {
            STRATA_LOG(TRITONSERVER_LOG_INFO,
                       "strata: model '" + name + "' version " + std::to_string(version) + " table '" + c->table +
                           "': hits " + std::to_string(c->total_hits.load()) + " (volatile " +
                           std::to_string(c->total_volatile.load()) + ", persistent " +
                           std::to_string(c->total_persistent.load()) + "), misses " +
                           std::to_string(c->total_misses.load()));
        }
    }
};

struct ConfigInput {
    TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
    std::vector<int64_t> dims;
};

// Reads the model configuration's inputs or outputs: name -> dtype and dims.
TRITONSERVER_Error *read_tensors(const Json &config, const char *member, const std::string &model,
                                 std::vector<std::pair<std::string, ConfigInput>> *out) {
    const Json *list = config.find(member);
    if (list == nullptr) return nullptr;
    for (const Json &t : list->items()) {
        const Json *name = t.find("name");
        const Json *dtype = t.find("data_type");
        if (name == nullptr || dtype == nullptr) continue;
        ConfigInput in;
        if (!config_dtype(dtype->str(), &in.dtype)) in.dtype = TRITONSERVER_TYPE_INVALID;
        if (const Json *dims = t.find("dims")) {
            for (const Json &d : dims->items()) {
                int64_t v = 0;
                if (!d.as_int(&v))
                    return error(TRITONSERVER_ERROR_INVALID_ARG, "model '" + model + "': " + member + " '" +
                                                                     name->str() + "': dims is not a list of integers");
                in.dims.push_back(v);
            }
        }
        out->emplace_back(name->str(), in);
    }
    return nullptr;
}

const ConfigInput *find_tensor(const std::vector<std::pair<std::string, ConfigInput>> &list, const std::string &name) {
    for (const auto &t : list) {
        if (t.first == name) return &t.second;
    }
    return nullptr;
}

// "table=0 output=EMB pooling=mean offsets=OFFS weights=W" -> key/value pairs.
bool parse_spec(const std::string &text, std::vector<std::pair<std::string, std::string>> *out) {
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
        size_t eq = word.find('=');
        if (eq == std::string::npos || eq == 0) return false;
        out->emplace_back(word.substr(0, eq), word.substr(eq + 1));
    }
    return true;
}

// Finds table `spec` (an index into the model's sparse_files or an embedding_table_names entry).
bool resolve_table(const ModelState &m, const std::vector<std::string> &names, const std::string &spec, size_t *index) {
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == spec) {
            *index = i;
            return true;
        }
    }
    char *end = nullptr;
    long v = std::strtol(spec.c_str(), &end, 10);
    if (!spec.empty() && end != nullptr && *end == '\0' && v >= 0 && size_t(v) < m.tables.size()) {
        *index = size_t(v);
        return true;
    }
    return false;
}

TRITONSERVER_Error *parse_model(TRITONBACKEND_Model *model, BackendState *backend, ModelState *m) {
    const char *name = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelName(model, &name));
    m->name = name;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelVersion(model, &m->version));
    TRITONBACKEND_ArtifactType artifact;
    const char *location = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelRepository(model, &artifact, &location));
    const std::string version_dir = std::string(location) + "/" + std::to_string(m->version);

    TRITONSERVER_Message *message = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelConfig(model, 1, &message));
    const char *buffer = nullptr;
    size_t size = 0;
    TRITONSERVER_Error *err = TRITONSERVER_MessageSerializeToJson(message, &buffer, &size);
    Json config;
    std::string parse_error;
    bool parsed = err == nullptr && Json::parse(buffer, size, &config, &parse_error);
    log_if_error(TRITONSERVER_MessageDelete(message), "deleting the model configuration");
    if (err != nullptr) return err;
    if (!parsed) return error(TRITONSERVER_ERROR_INTERNAL, "model '" + m->name + "': configuration: " + parse_error);

    int64_t max_batch = 0;
    if (const Json *mb = config.find("max_batch_size")) mb->as_int(&max_batch);
    m->batched = max_batch > 0;

    // Parameters: string values by key.
    std::vector<std::pair<std::string, std::string>> params;
    if (const Json *ps = config.find("parameters")) {
        for (const auto &p : ps->members()) {
            const Json *v = p.second.find("string_value");
            params.emplace_back(p.first, v != nullptr ? v->str() : std::string());
        }
    }
    auto param = [&](const std::string &key, std::string *value) {
        for (const auto &p : params) {
            if (p.first == key) {
                *value = p.second;
                return true;
            }
        }
        return false;
    };

    // The configuration: the `ps` parameter (relative to the version folder), else ps.json in the
    // version folder, else the backend's --backend-config=strata,ps=<path>.
    std::string ps;
    if (param("ps", &ps)) {
        if (!ps.empty() && ps[0] != '/') ps = version_dir + "/" + ps;
    } else if (file_exists(version_dir + "/ps.json")) {
        ps = version_dir + "/ps.json";
    } else {
        ps = backend->ps_path;
    }
    if (ps.empty()) {
        return error(TRITONSERVER_ERROR_INVALID_ARG,
                     "model '" + m->name + "': no ps.json: start tritonserver with --backend-config=strata,ps=<path>, "
                     "put ps.json in the version folder " + version_dir + ", or set the model parameter 'ps'");
    }
    m->ps_path = ps;
    if (!param("ps_model", &m->ps_model)) m->ps_model = m->name;

    std::string threads;
    if (param("num_threads", &threads)) {
        char *end = nullptr;
        long v = std::strtol(threads.c_str(), &end, 10);
        if (threads.empty() || *end != '\0' || v < 0 || v > 4096)
            return error(TRITONSERVER_ERROR_INVALID_ARG,
                         "model '" + m->name + "': parameter num_threads: '" + threads + "'; expected an integer >= 0");
        m->num_threads = int32_t(v);
    }
    for (const char *ignored : {"refresh_interval", "refresh_delay", "freeze_sparse"}) {
        std::string v;
        if (param(ignored, &v))
            STRATA_LOG(TRITONSERVER_LOG_WARN, "strata: model '" + m->name + "': parameter '" + ignored +
                                                  "' (an hps_backend embedding-cache setting) is ignored");
    }

    // Open the configuration: strata shares one server per configuration in the process.
    strata_status s = strata_server_open(ps.c_str(), &m->server);
    if (s != STRATA_OK) {
        m->server = nullptr;
        return error(TRITONSERVER_ERROR_INVALID_ARG, "model '" + m->name + "': strata_server_open: " + strata_message(s));
    }
    backend->handle_opened();
    int32_t warnings = 0;
    if (strata_server_num_warnings(m->server, &warnings) == STRATA_OK) {
        for (int32_t i = 0; i < warnings; ++i) {
            const char *text = nullptr;
            if (strata_server_warning(m->server, i, &text) == STRATA_OK)
                STRATA_LOG(TRITONSERVER_LOG_WARN, "strata: " + ps + ": " + text);
        }
    }

    // The model's tables.
    int32_t models = 0, num_tables = -1;
    std::string known;
    if (strata_server_num_models(m->server, &models) != STRATA_OK) return error(TRITONSERVER_ERROR_INTERNAL, strata_last_error());
    for (int32_t i = 0; i < models; ++i) {
        const char *mname = nullptr;
        int32_t n = 0;
        if (strata_server_model(m->server, i, &mname, &n) != STRATA_OK) continue;
        known += std::string(known.empty() ? "" : ", ") + "'" + mname + "'";
        if (m->ps_model == mname) num_tables = n;
    }
    if (num_tables < 0) {
        return error(TRITONSERVER_ERROR_INVALID_ARG, "model '" + m->name + "': " + ps + " has no model '" + m->ps_model +
                                                         "' (its models: " + known +
                                                         "); name the Triton model after it or set the parameter 'ps_model'");
    }
    std::vector<std::string> table_names;
    for (int32_t t = 0; t < num_tables; ++t) {
        strata_table *table = nullptr;
        s = strata_server_table(m->server, m->ps_model.c_str(), t, &table);
        if (s != STRATA_OK) return error(TRITONSERVER_ERROR_INTERNAL, "model '" + m->name + "': " + strata_message(s));
        const char *tname = nullptr;
        std::string tn = strata_server_table_name(m->server, m->ps_model.c_str(), t, &tname) == STRATA_OK
                             ? std::string(tname)
                             : "table" + std::to_string(t);
        m->tables.push_back(table);
        m->dims.push_back(strata_table_dim(table));
        table_names.push_back(tn);
    }

    std::vector<std::pair<std::string, ConfigInput>> inputs, outputs;
    RETURN_IF_TRITON_ERROR(read_tensors(config, "input", m->name, &inputs));
    RETURN_IF_TRITON_ERROR(read_tensors(config, "output", m->name, &outputs));
    const std::string where = "model '" + m->name + "': ";

    // Native lookups: `lookup.<keys input>` parameters.
    for (const auto &p : params) {
        if (p.first.rfind("lookup.", 0) != 0) continue;
        NativeLookup l;
        l.keys = p.first.substr(7);
        std::vector<std::pair<std::string, std::string>> spec;
        if (l.keys.empty() || !parse_spec(p.second, &spec))
            return error(TRITONSERVER_ERROR_INVALID_ARG, where + "parameter '" + p.first + "': '" + p.second +
                                                             "'; expected 'table=<index or name> output=<name> "
                                                             "[pooling=none|sum|mean|sqrtn] [offsets=<input>] [weights=<input>]'");
        std::string table = "0";
        for (const auto &kv : spec) {
            if (kv.first == "table") table = kv.second;
            else if (kv.first == "output") l.output = kv.second;
            else if (kv.first == "offsets") l.offsets = kv.second;
            else if (kv.first == "weights") l.weights = kv.second;
            else if (kv.first == "pooling") {
                if (kv.second == "none") l.pooling = STRATA_POOL_NONE;
                else if (kv.second == "sum") l.pooling = STRATA_POOL_SUM;
                else if (kv.second == "mean") l.pooling = STRATA_POOL_MEAN;
                else if (kv.second == "sqrtn") l.pooling = STRATA_POOL_SQRTN;
                else return error(TRITONSERVER_ERROR_INVALID_ARG, where + "parameter '" + p.first + "': pooling '" +
                                                                      kv.second + "'; expected none, sum, mean or sqrtn");
            } else {
                return error(TRITONSERVER_ERROR_INVALID_ARG, where + "parameter '" + p.first + "': unknown field '" + kv.first +
                                                                 "' (expected table, output, pooling, offsets, weights)");
            }
        }
        const std::string lwhere = where + "parameter '" + p.first + "': ";
        if (!resolve_table(*m, table_names, table, &l.table))
            return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "table '" + table + "': model '" + m->ps_model + "' of " +
                                                             ps + " has " + std::to_string(m->tables.size()) + " tables");
        const ConfigInput *keys = find_tensor(inputs, l.keys);
        if (keys == nullptr || !is_key_dtype(keys->dtype))
            return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "input '" + l.keys +
                                                             "' must be a model input of TYPE_INT32, TYPE_INT64, TYPE_UINT32 or TYPE_UINT64");
        l.keys_dtype = keys->dtype;
        const ConfigInput *out = l.output.empty() ? nullptr : find_tensor(outputs, l.output);
        if (out == nullptr || !is_row_dtype(out->dtype))
            return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "output '" + l.output +
                                                             "' must be a model output of TYPE_FP32, TYPE_FP16 or TYPE_BF16");
        l.out_dtype = out->dtype;
        const int64_t dim = m->dims[l.table];
        if (out->dims.empty() || (out->dims.back() != -1 && out->dims.back() != dim))
            return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "output '" + l.output + "' dims " +
                                                             shape_string(out->dims.data(), out->dims.size()) +
                                                             ": the last must be the table's dim " + std::to_string(dim) + " (or -1)");
        if (l.pooling == STRATA_POOL_NONE && (!l.offsets.empty() || !l.weights.empty()))
            return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "offsets and weights need pooling=sum, mean or sqrtn");
        if (!l.offsets.empty()) {
            const ConfigInput *o = find_tensor(inputs, l.offsets);
            if (o == nullptr || (o->dtype != TRITONSERVER_TYPE_INT32 && o->dtype != TRITONSERVER_TYPE_INT64))
                return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "offsets '" + l.offsets +
                                                                 "' must be a model input of TYPE_INT32 or TYPE_INT64");
        }
        if (!l.weights.empty()) {
            const ConfigInput *w = find_tensor(inputs, l.weights);
            if (w == nullptr || w->dtype != TRITONSERVER_TYPE_FP32)
                return error(TRITONSERVER_ERROR_INVALID_ARG, lwhere + "weights '" + l.weights + "' must be a model input of TYPE_FP32");
        }
        m->lookups.push_back(l);
    }

    if (!m->lookups.empty()) {
        m->hps = false;
    } else {
        // The HPS interface: KEYS, NUMKEYS, OUTPUT0 as hps_backend validates them.
        const ConfigInput *keys = find_tensor(inputs, "KEYS");
        const ConfigInput *numkeys = find_tensor(inputs, "NUMKEYS");
        const ConfigInput *out = find_tensor(outputs, "OUTPUT0");
        if (keys == nullptr || numkeys == nullptr || out == nullptr)
            return error(TRITONSERVER_ERROR_INVALID_ARG,
                         where + "expected the HPS interface (inputs KEYS and NUMKEYS, output OUTPUT0) or "
                                 "'lookup.<input>' parameters for the native interface");
        if (!is_key_dtype(keys->dtype))
            return error(TRITONSERVER_ERROR_INVALID_ARG, where + "input KEYS: expected TYPE_INT64 (or another integer type)");
        if (numkeys->dtype != TRITONSERVER_TYPE_INT32)
            return error(TRITONSERVER_ERROR_INVALID_ARG, where + "input NUMKEYS: expected TYPE_INT32");
        if (!is_row_dtype(out->dtype))
            return error(TRITONSERVER_ERROR_INVALID_ARG, where + "output OUTPUT0: expected TYPE_FP32 (or TYPE_FP16, TYPE_BF16)");
        m->keys_dtype = keys->dtype;
        m->out_dtype = out->dtype;
    }

    // Counters per table the model looks up.
    for (size_t t = 0; t < m->tables.size(); ++t) {
        auto c = std::make_unique<TableCounters>();
        c->table = table_names[t];
        const std::vector<std::pair<std::string, std::string>> base = {
            {"model", m->name}, {"version", std::to_string(m->version)}, {"table", c->table}};
        auto with_tier = [&](const char *tier) {
            auto l = base;
            l.emplace_back("tier", tier);
            return l;
        };
        c->volatile_hits.create(backend->hits_family, with_tier("volatile"));
        c->persistent_hits.create(backend->hits_family, with_tier("persistent"));
        c->static_hits.create(backend->hits_family, with_tier("static"));
        c->misses.create(backend->misses_family, base);
        m->counters.push_back(std::move(c));
    }
    STRATA_LOG(TRITONSERVER_LOG_INFO, "strata: model '" + m->name + "' version " + std::to_string(m->version) + ": " +
                                          (m->hps ? "HPS" : "native") + " interface, " + std::to_string(m->tables.size()) +
                                          " tables of '" + m->ps_model + "' in " + ps);
    return nullptr;
}

// ---- instance state ------------------------------------------------------------------------

struct InstanceState {
    ModelState *model = nullptr;
    TRITONBACKEND_ModelInstance *instance = nullptr;
    std::string name;
    bool gpu = false;
    int32_t device_id = 0;
    int32_t num_threads = -1;  // resolved on the instance's thread at its first execution
    std::unique_ptr<CudaStream> stream;
};

// ---- execution -----------------------------------------------------------------------------

// A request's input as strata reads it: one contiguous buffer (copied together when Triton hands
// it over in pieces).
struct InputView {
    TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
    std::vector<int64_t> shape;
    const void *data = nullptr;
    uint64_t bytes = 0;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    std::vector<char> gathered;
    int64_t numel() const { return elements(shape); }
};

// The work for one Triton request: its response, the strata requests it makes (with the tensors
// they point to) and, on failure, the error to send.
struct Pending {
    TRITONBACKEND_Request *request = nullptr;
    TRITONBACKEND_Response *response = nullptr;
    std::string error;
    TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INVALID_ARG;
    size_t first = 0, count = 0;     // its strata requests: [first, first + count)
    std::vector<std::string> names;  // per strata request: "keys input/output" for messages
    std::vector<std::string> outputs;  // the outputs the request asks for (Triton lists all when it names none)
    bool wants(const std::string &output) const {
        return std::find(outputs.begin(), outputs.end(), output) != outputs.end();
    }
    uint64_t batch = 1;
};

class Execution {
  public:
    Execution(InstanceState *inst) : inst_(inst), model_(inst->model) {}

    void run(TRITONBACKEND_Request **requests, uint32_t n);

  private:
    InstanceState *inst_;
    ModelState *model_;
    std::vector<Pending> pending_;
    std::vector<strata_lookup_request> strata_;
    std::vector<strata_lookup_stats> stats_;
    std::vector<size_t> table_of_;  // table index of each strata request
    std::deque<DLTensor> tensors_;   // stable addresses
    std::deque<std::vector<int64_t>> shapes_;
    std::deque<InputView> views_;

    bool read_input(Pending &p, const std::string &name, bool need_host, InputView **out);
    bool make_output(Pending &p, const std::string &name, TRITONSERVER_DataType dtype, const std::vector<int64_t> &shape,
                     void **data, TRITONSERVER_MemoryType *memory, int64_t *memory_id);
    DLTensor *tensor(void *data, DLDevice dev, TRITONSERVER_DataType dtype, std::vector<int64_t> shape, uint64_t byte_offset);
    void add_request(Pending &p, size_t table, const DLTensor *keys, const DLTensor *offsets, const DLTensor *weights,
                     int32_t pooling, DLTensor *out, const std::string &what);
    void prepare_hps(Pending &p);
    void prepare_native(Pending &p);
    bool fail(Pending &p, const std::string &msg, TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INVALID_ARG) {
        if (p.error.empty()) {
            p.error = msg;
            p.code = code;
        }
        return false;
    }
    strata_status lookup(size_t first, size_t count, const strata_lookup_options &opts);
    std::string explain(const Pending &p, strata_status s) const;
};

bool Execution::read_input(Pending &p, const std::string &name, bool need_host, InputView **out) {
    TRITONBACKEND_Input *input = nullptr;
    TRITONSERVER_Error *err = TRITONBACKEND_RequestInput(p.request, name.c_str(), &input);
    if (err != nullptr) {
        std::string msg = "input '" + name + "': " + TRITONSERVER_ErrorMessage(err);
        TRITONSERVER_ErrorDelete(err);
        return fail(p, msg);
    }
    views_.emplace_back();
    InputView &v = views_.back();
    const int64_t *shape = nullptr;
    uint32_t dims = 0, buffers = 0;
    err = TRITONBACKEND_InputProperties(input, nullptr, &v.dtype, &shape, &dims, &v.bytes, &buffers);
    if (err != nullptr) {
        std::string msg = "input '" + name + "': " + TRITONSERVER_ErrorMessage(err);
        TRITONSERVER_ErrorDelete(err);
        return fail(p, msg);
    }
    v.shape.assign(shape, shape + dims);
    const TRITONSERVER_MemoryType preferred = inst_->gpu && !need_host ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
    for (uint32_t b = 0; b < buffers; ++b) {
        const void *data = nullptr;
        uint64_t size = 0;
        TRITONSERVER_MemoryType mt = preferred;
        int64_t mid = inst_->gpu ? inst_->device_id : 0;
        err = TRITONBACKEND_InputBuffer(input, b, &data, &size, &mt, &mid);
        if (err != nullptr) {
            std::string msg = "input '" + name + "': " + TRITONSERVER_ErrorMessage(err);
            TRITONSERVER_ErrorDelete(err);
            return fail(p, msg);
        }
        const bool device = mt == TRITONSERVER_MEMORY_GPU;
        // HTTP bodies put a tensor's bytes wherever the JSON header ends: strata needs aligned
        // elements, so a misaligned host tensor is copied (device buffers are aligned).
        const bool aligned = device || reinterpret_cast<uintptr_t>(data) % dtype_size(v.dtype) == 0;
        if (buffers == 1 && aligned && !(device && need_host)) {
            v.data = data;
            v.memory = mt;
            v.memory_id = mid;
            break;
        }
        // Several pieces, or device memory the backend must read: one host copy.
        size_t at = v.gathered.size();
        v.gathered.resize(at + size);
        if (device) {
            std::string cuda_error;
            if (inst_->stream == nullptr || !inst_->stream->copy_to_host(v.gathered.data() + at, data, size, &cuda_error))
                return fail(p, "input '" + name + "': " + cuda_error, TRITONSERVER_ERROR_INTERNAL);
        } else if (size > 0) {
            std::memcpy(v.gathered.data() + at, data, size);
        }
        v.data = v.gathered.data();
        v.memory = TRITONSERVER_MEMORY_CPU;
        v.memory_id = 0;
    }
    *out = &v;
    return true;
}

bool Execution::make_output(Pending &p, const std::string &name, TRITONSERVER_DataType dtype,
                            const std::vector<int64_t> &shape, void **data, TRITONSERVER_MemoryType *memory,
                            int64_t *memory_id) {
    TRITONBACKEND_Output *output = nullptr;
    TRITONSERVER_Error *err =
        TRITONBACKEND_ResponseOutput(p.response, &output, name.c_str(), dtype, shape.data(), uint32_t(shape.size()));
    if (err == nullptr) {
        const uint64_t bytes = dtype_size(dtype) * uint64_t(elements(shape));
        *memory = inst_->gpu ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
        *memory_id = inst_->gpu ? inst_->device_id : 0;
        err = TRITONBACKEND_OutputBuffer(output, data, bytes, memory, memory_id);
    }
    if (err != nullptr) {
        std::string msg = "output '" + name + "': " + TRITONSERVER_ErrorMessage(err);
        TRITONSERVER_ErrorDelete(err);
        return fail(p, msg, TRITONSERVER_ERROR_INTERNAL);
    }
    return true;
}

DLTensor *Execution::tensor(void *data, DLDevice dev, TRITONSERVER_DataType dtype, std::vector<int64_t> shape,
                            uint64_t byte_offset) {
    shapes_.push_back(std::move(shape));
    std::vector<int64_t> &s = shapes_.back();
    DLTensor t;
    t.data = data;
    t.device = dev;
    t.ndim = int32_t(s.size());
    t.dtype = dl_dtype(dtype);
    t.shape = s.data();
    t.strides = nullptr;  // compact, row-major
    t.byte_offset = byte_offset;
    tensors_.push_back(t);
    return &tensors_.back();
}

void Execution::add_request(Pending &p, size_t table, const DLTensor *keys, const DLTensor *offsets,
                            const DLTensor *weights, int32_t pooling, DLTensor *out, const std::string &what) {
    strata_lookup_request r = strata_lookup_request_default();
    r.table = model_->tables[table];
    r.keys = keys;
    r.offsets = offsets;
    r.weights = weights;
    r.pooling = pooling;
    r.out = out;
    strata_.push_back(r);
    stats_.push_back(strata_lookup_stats_default());
    table_of_.push_back(table);
    p.names.push_back(what);
    ++p.count;
}

// HPS: KEYS holds the keys of every table of the model one after another, NUMKEYS how many belong
// to each; OUTPUT0 their rows, table after table, flattened. With max_batch_size > 0 every batch
// row is such a request of its own.
void Execution::prepare_hps(Pending &p) {
    InputView *keys = nullptr, *numkeys = nullptr;
    if (!read_input(p, "KEYS", false, &keys) || !read_input(p, "NUMKEYS", true, &numkeys)) return;
    const size_t tables = model_->tables.size();
    const int64_t rows = model_->batched ? (keys->shape.empty() ? 0 : keys->shape[0]) : 1;
    p.batch = uint64_t(std::max<int64_t>(rows, 1));
    const int64_t nkeys = keys->numel();
    const int64_t ncounts = numkeys->numel();
    if (ncounts != rows * int64_t(tables)) {
        fail(p, "input 'NUMKEYS': shape " + shape_string(numkeys->shape.data(), numkeys->shape.size()) + " holds " +
                    std::to_string(ncounts) + " counts; expected " + std::to_string(tables) +
                    (model_->batched ? " per batch row" : "") + " (one per table of model '" + model_->ps_model + "')");
        return;
    }
    const int32_t *counts = static_cast<const int32_t *>(numkeys->data);
    const int64_t per_row = rows > 0 ? nkeys / rows : 0;
    int64_t row_width = -1;  // output elements per row, the same for every row
    for (int64_t r = 0; r < rows; ++r) {
        int64_t sum = 0, width = 0;
        for (size_t t = 0; t < tables; ++t) {
            int32_t c = counts[r * int64_t(tables) + int64_t(t)];
            if (c < 0) {
                fail(p, "input 'NUMKEYS': entry " + std::to_string(r * int64_t(tables) + int64_t(t)) + " is " +
                            std::to_string(c) + "; counts must be >= 0");
                return;
            }
            sum += c;
            width += int64_t(c) * model_->dims[t];
        }
        if (sum != per_row) {
            fail(p, "input 'NUMKEYS': " + std::string(model_->batched ? "batch row " + std::to_string(r) + ": " : "") +
                        "the counts add up to " + std::to_string(sum) + " keys, but input 'KEYS' holds " +
                        std::to_string(per_row) + (model_->batched ? " per row" : ""));
            return;
        }
        if (row_width >= 0 && width != row_width) {
            fail(p, "input 'NUMKEYS': batch row " + std::to_string(r) + " gives " + std::to_string(width) +
                        " output values but row 0 gives " + std::to_string(row_width) +
                        "; rows batched together must have the same output size");
            return;
        }
        row_width = width;
    }
    if (row_width < 0) row_width = 0;
    if (!p.wants("OUTPUT0")) return;  // checked, but nothing to send
    std::vector<int64_t> out_shape = model_->batched ? std::vector<int64_t>{rows, row_width} : std::vector<int64_t>{row_width};
    void *out = nullptr;
    TRITONSERVER_MemoryType out_mem;
    int64_t out_id;
    if (!make_output(p, "OUTPUT0", model_->out_dtype, out_shape, &out, &out_mem, &out_id)) return;
    const size_t ksize = dtype_size(keys->dtype), osize = dtype_size(model_->out_dtype);
    uint64_t key_at = 0, out_at = 0;
    for (int64_t r = 0; r < rows; ++r) {
        for (size_t t = 0; t < tables; ++t) {
            const int64_t c = counts[r * int64_t(tables) + int64_t(t)];
            const int64_t dim = model_->dims[t];
            if (c > 0) {
                DLTensor *k = tensor(const_cast<void *>(keys->data), dl_device(keys->memory, keys->memory_id), keys->dtype,
                                     {c}, key_at);
                DLTensor *o = tensor(out, dl_device(out_mem, out_id), model_->out_dtype, {c, dim}, out_at);
                add_request(p, t, k, nullptr, nullptr, STRATA_POOL_NONE, o,
                            "input 'KEYS' (table " + std::to_string(t) + ", " + std::to_string(c) + " keys)");
            }
            key_at += uint64_t(c) * ksize;
            out_at += uint64_t(c * dim) * osize;
        }
    }
}

// Native: each lookup reads its keys (and offsets, weights) inputs and writes its output.
void Execution::prepare_native(Pending &p) {
    p.batch = 0;
    for (const NativeLookup &l : model_->lookups) {
        if (!p.wants(l.output)) continue;  // only the outputs the request asks for
        InputView *keys = nullptr, *offsets = nullptr, *weights = nullptr;
        if (!read_input(p, l.keys, false, &keys)) return;
        if (!l.offsets.empty() && !read_input(p, l.offsets, false, &offsets)) return;
        if (!l.weights.empty() && !read_input(p, l.weights, false, &weights)) return;
        const int64_t dim = model_->dims[l.table];
        const std::string kname = "input '" + l.keys + "'";
        if (model_->batched && !keys->shape.empty()) p.batch = std::max<uint64_t>(p.batch, uint64_t(keys->shape[0]));
        std::vector<int64_t> kshape = keys->shape, out_shape;
        if (l.pooling == STRATA_POOL_NONE) {
            out_shape = kshape;
            out_shape.push_back(dim);
        } else if (offsets != nullptr) {
            // Ragged bags: keys [nnz] with offsets [B + 1]; batched, one batch row of each.
            if (model_->batched) {
                if (kshape.size() != 2 || kshape[0] != 1 || offsets->shape.size() != 2 || offsets->shape[0] != 1) {
                    fail(p, kname + " and input '" + l.offsets + "': shapes " + shape_string(kshape.data(), kshape.size()) +
                                " and " + shape_string(offsets->shape.data(), offsets->shape.size()) +
                                "; with offsets each request is one batch row: [1, nnz] keys and [1, B + 1] offsets");
                    return;
                }
                kshape = {kshape[1]};
            }
            if (kshape.size() != 1) {
                fail(p, kname + ": shape " + shape_string(kshape.data(), kshape.size()) + "; with offsets keys are 1-D [nnz]");
                return;
            }
            const int64_t bags = offsets->numel() - 1;
            if (bags < 0) {
                fail(p, "input '" + l.offsets + "': no offsets; expected B + 1 of them");
                return;
            }
            out_shape = model_->batched ? std::vector<int64_t>{1, bags, dim} : std::vector<int64_t>{bags, dim};
        } else {
            // Fixed hotness: keys [B, L], one bag per row.
            if (kshape.size() != 2) {
                fail(p, kname + ": shape " + shape_string(kshape.data(), kshape.size()) +
                            "; pooled keys without offsets are [B, L] (one bag of L keys per row)");
                return;
            }
            out_shape = {kshape[0], dim};
        }
        if (weights != nullptr && weights->shape != keys->shape) {
            fail(p, "input '" + l.weights + "': shape " + shape_string(weights->shape.data(), weights->shape.size()) +
                        "; expected the shape of " + kname + ", " + shape_string(keys->shape.data(), keys->shape.size()));
            return;
        }
        void *out = nullptr;
        TRITONSERVER_MemoryType out_mem;
        int64_t out_id;
        if (!make_output(p, l.output, l.out_dtype, out_shape, &out, &out_mem, &out_id)) return;
        if (elements(out_shape) == 0) continue;  // nothing to write (an empty batch or no bags)
        DLTensor *k = tensor(const_cast<void *>(keys->data), dl_device(keys->memory, keys->memory_id), keys->dtype, kshape, 0);
        DLTensor *o = nullptr;
        if (l.pooling == STRATA_POOL_NONE) {
            o = tensor(out, dl_device(out_mem, out_id), l.out_dtype, out_shape, 0);
        } else {
            o = tensor(out, dl_device(out_mem, out_id), l.out_dtype, {out_shape[out_shape.size() - 2], dim}, 0);
        }
        DLTensor *off = nullptr, *w = nullptr;
        if (offsets != nullptr)
            off = tensor(const_cast<void *>(offsets->data), dl_device(offsets->memory, offsets->memory_id), offsets->dtype,
                         {offsets->numel()}, 0);
        if (weights != nullptr)
            w = tensor(const_cast<void *>(weights->data), dl_device(weights->memory, weights->memory_id), weights->dtype,
                       kshape, 0);
        std::string what = kname;
        if (!l.offsets.empty()) what += ", offsets '" + l.offsets + "'";
        if (!l.weights.empty()) what += ", weights '" + l.weights + "'";
        add_request(p, l.table, k, off, w, l.pooling, o, what + " -> output '" + l.output + "'");
    }
    if (p.batch == 0) p.batch = 1;
}

strata_status Execution::lookup(size_t first, size_t count, const strata_lookup_options &opts) {
    if (count == 0) return STRATA_OK;
    return strata_lookup_batch(strata_.data() + first, count, &opts);
}

// strata's message names the request ("requests[3].offsets: ..."): say which inputs that is.
std::string Execution::explain(const Pending &p, strata_status s) const {
    std::string msg = strata_last_error();
    std::string prefix;
    if (msg.rfind("requests[", 0) == 0) {
        size_t close = msg.find(']');
        size_t index = size_t(std::strtoul(msg.c_str() + 9, nullptr, 10));
        if (close != std::string::npos && index < p.names.size()) {
            prefix = p.names[index] + ": ";
            msg = msg.substr(close + 1);
            if (!msg.empty() && msg[0] == '.') msg = msg.substr(1);
        }
    } else if (p.names.size() == 1) {
        prefix = p.names[0] + ": ";
    }
    return prefix + strata_status_name(s) + ": " + msg;
}

void Execution::run(TRITONBACKEND_Request **requests, uint32_t n) {
    const uint64_t exec_start = now_ns();
    if (inst_->num_threads < 0) {
        // The CPUs this instance's thread may run on (Triton pins it under a host policy).
        cpu_set_t set;
        CPU_ZERO(&set);
        int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
        inst_->num_threads = model_->num_threads > 0 ? model_->num_threads : std::max(cpus, 1);
        STRATA_LOG(TRITONSERVER_LOG_VERBOSE, "strata: instance '" + inst_->name + "' looks up on " +
                                                 std::to_string(inst_->num_threads) + " threads");
    }
    pending_.resize(n);
    for (uint32_t r = 0; r < n; ++r) {
        Pending &p = pending_[r];
        p.request = requests[r];
        p.first = strata_.size();
        TRITONSERVER_Error *err = TRITONBACKEND_ResponseNew(&p.response, p.request);
        if (err != nullptr) {
            // No response can be sent for this request; it is released below.
            log_if_error(err, "strata: creating a response");
            p.response = nullptr;
            p.error = "no response";
            continue;
        }
        uint32_t outputs = 0;
        err = TRITONBACKEND_RequestOutputCount(p.request, &outputs);
        for (uint32_t o = 0; err == nullptr && o < outputs; ++o) {
            const char *oname = nullptr;
            err = TRITONBACKEND_RequestOutputName(p.request, o, &oname);
            if (err == nullptr) p.outputs.emplace_back(oname);
        }
        if (err != nullptr) {
            fail(p, std::string("requested outputs: ") + TRITONSERVER_ErrorMessage(err), TRITONSERVER_ERROR_INTERNAL);
            TRITONSERVER_ErrorDelete(err);
            continue;
        }
        if (model_->hps) prepare_hps(p);
        else prepare_native(p);
    }

    strata_lookup_options opts = strata_lookup_options_default();
    opts.num_threads = inst_->num_threads;
    if (inst_->stream != nullptr) opts.stream = inst_->stream->handle();
    const uint64_t compute_start = now_ns();

    // Every valid request in one strata_lookup_batch. strata checks every request before writing
    // any output, so if one is refused the batch is rerun per Triton request and only the
    // requests at fault get an error.
    std::vector<strata_lookup_request> good;
    std::vector<size_t> good_index;  // positions of `good` in strata_
    for (const Pending &p : pending_) {
        if (!p.error.empty()) continue;
        for (size_t i = 0; i < p.count; ++i) {
            good.push_back(strata_[p.first + i]);
            good_index.push_back(p.first + i);
        }
    }
    for (size_t i = 0; i < good.size(); ++i) good[i].stats = &stats_[good_index[i]];
    for (size_t i = 0; i < strata_.size(); ++i) strata_[i].stats = &stats_[i];
    strata_status s = good.empty() ? STRATA_OK : strata_lookup_batch(good.data(), good.size(), &opts);
    if (s != STRATA_OK) {
        for (Pending &p : pending_) {
            if (!p.error.empty()) continue;
            for (size_t i = 0; i < p.count; ++i) stats_[p.first + i] = strata_lookup_stats_default();
            strata_status one = lookup(p.first, p.count, opts);
            if (one != STRATA_OK) fail(p, explain(p, one), triton_code(one));
        }
    }
    if (inst_->stream != nullptr) {
        std::string cuda_error;
        if (!inst_->stream->synchronize(&cuda_error)) {
            for (Pending &p : pending_) fail(p, "strata: " + cuda_error, TRITONSERVER_ERROR_INTERNAL);
        }
    }
    const uint64_t compute_end = now_ns();

    uint64_t batch_size = 0;
    for (Pending &p : pending_) {
        const bool ok = p.error.empty();
        if (ok) {
            for (size_t i = 0; i < p.count; ++i) model_->counters[table_of_[p.first + i]]->add(stats_[p.first + i]);
            batch_size += p.batch;
        }
        if (p.response != nullptr) {
            if (ok) {
                log_if_error(TRITONBACKEND_ResponseSetIntParameter(p.response, "DeviceID", inst_->gpu ? inst_->device_id : -1),
                             "strata: response parameter");
            }
            TRITONSERVER_Error *err = ok ? nullptr : error(p.code, "strata: model '" + model_->name + "': " + p.error);
            log_if_error(TRITONBACKEND_ResponseSend(p.response, kTritonResponseCompleteFinal, err), "strata: sending a response");
            if (err != nullptr) TRITONSERVER_ErrorDelete(err);
        }
        const uint64_t end = now_ns();
        log_if_error(TRITONBACKEND_ModelInstanceReportStatistics(inst_->instance, p.request, ok, exec_start,
                                                                 compute_start, compute_end, end),
                     "strata: reporting statistics");
        log_if_error(TRITONBACKEND_RequestRelease(p.request, kTritonRequestReleaseAll), "strata: releasing a request");
    }
    if (batch_size > 0) {
        log_if_error(TRITONBACKEND_ModelInstanceReportBatchStatistics(inst_->instance, batch_size, exec_start, compute_start,
                                                                      compute_end, now_ns()),
                     "strata: reporting batch statistics");
    }
}

}  // namespace strata_triton

// ---- the entry points Triton calls -----------------------------------------------------------

using namespace strata_triton;

namespace {

// The backend's state objects hang off Triton's backend, model and instance objects: handed over
// with `set` once built, deleted through `get` at finalization. The Triton calls are passed as
// lambdas, not function pointers: taking a Triton function's address would bind it when the
// library is loaded instead of when it is first called.
template <typename T, typename Obj, typename Set>
TRITONSERVER_Error *hand_over(Obj *obj, Set set, std::unique_ptr<T> state) {
    RETURN_IF_TRITON_ERROR(set(obj, state.get()));
    state.release();
    return nullptr;
}

// The state of the object `obj` belongs to (a model's backend, an instance's model).
template <typename T, typename Parent, typename Obj, typename GetParent, typename Get>
TRITONSERVER_Error *parent_state(Obj *obj, GetParent parent, Get get, T **out) {
    Parent *p = nullptr;
    RETURN_IF_TRITON_ERROR(parent(obj, &p));
    void *state = nullptr;
    RETURN_IF_TRITON_ERROR(get(p, &state));
    *out = static_cast<T *>(state);
    return nullptr;
}

template <typename T, typename Obj, typename Get>
TRITONSERVER_Error *delete_state(Obj *obj, Get get) {
    void *state = nullptr;
    RETURN_IF_TRITON_ERROR(get(obj, &state));
    delete static_cast<T *>(state);
    return nullptr;
}

#define STRATA_TRITON_CALL(fn) [](auto *a, auto b) { return fn(a, b); }

}  // namespace

extern "C" {

TRITONSERVER_Error *TRITONBACKEND_Initialize(TRITONBACKEND_Backend *backend) {
    const char *name = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_BackendName(backend, &name));
    uint32_t major = 0, minor = 0;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
    if (major != kTritonBackendApiMajor || minor < kTritonBackendApiMinor) {
        return error(TRITONSERVER_ERROR_UNSUPPORTED,
                     "backend '" + std::string(name) + "' (strata " + strata_version() + ") was written for Triton backend API " +
                         std::to_string(kTritonBackendApiMajor) + "." + std::to_string(kTritonBackendApiMinor) +
                         " (major " + std::to_string(kTritonBackendApiMajor) + ", minor at least " +
                         std::to_string(kTritonBackendApiMinor) + "), but this server offers " + std::to_string(major) + "." +
                         std::to_string(minor));
    }
    auto state = std::make_unique<BackendState>();
    TRITONSERVER_Message *message = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_BackendConfig(backend, &message));
    const char *buffer = nullptr;
    size_t size = 0;
    RETURN_IF_TRITON_ERROR(TRITONSERVER_MessageSerializeToJson(message, &buffer, &size));
    Json config;
    std::string parse_error;
    if (!Json::parse(buffer, size, &config, &parse_error))
        return error(TRITONSERVER_ERROR_INTERNAL, "strata: backend configuration: " + parse_error);
    if (const Json *cmdline = config.find("cmdline")) {
        if (const Json *ps = cmdline->find("ps")) state->ps_path = ps->str();
    }
    state->hits_family = new_family(TRITONSERVER_METRIC_KIND_COUNTER, "strata_lookup_hits_total",
                                    "Keys strata found, per model, version, table and tier (volatile, persistent, static)");
    state->misses_family = new_family(TRITONSERVER_METRIC_KIND_COUNTER, "strata_lookup_misses_total",
                                      "Keys strata did not find (given the default value), per model, version and table");
    state->handles_family = new_family(TRITONSERVER_METRIC_KIND_GAUGE, "strata_server_handles",
                                       "strata server handles held by the loaded models of the strata backend");
    state->handles = std::make_unique<Metric>();
    state->handles->create(state->handles_family, {});
    state->handles->set(0);
    STRATA_LOG(TRITONSERVER_LOG_INFO, "strata backend: strata " + std::string(strata_version()) + ", Triton backend API " +
                                          std::to_string(major) + "." + std::to_string(minor) + ", ps " +
                                          (state->ps_path.empty() ? "(none; per model)" : state->ps_path));
    return hand_over(backend, STRATA_TRITON_CALL(TRITONBACKEND_BackendSetState), std::move(state));
}

TRITONSERVER_Error *TRITONBACKEND_Finalize(TRITONBACKEND_Backend *backend) {
    return delete_state<BackendState>(backend, STRATA_TRITON_CALL(TRITONBACKEND_BackendState));
}

TRITONSERVER_Error *TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model *model) {
    auto state = std::make_unique<ModelState>();
    RETURN_IF_TRITON_ERROR(parent_state<BackendState, TRITONBACKEND_Backend>(model, STRATA_TRITON_CALL(TRITONBACKEND_ModelBackend),
                                                                          STRATA_TRITON_CALL(TRITONBACKEND_BackendState), &state->backend));
    RETURN_IF_TRITON_ERROR(parse_model(model, state->backend, state.get()));
    return hand_over(model, STRATA_TRITON_CALL(TRITONBACKEND_ModelSetState), std::move(state));
}

TRITONSERVER_Error *TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model *model) {
    return delete_state<ModelState>(model, STRATA_TRITON_CALL(TRITONBACKEND_ModelState));
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance *instance) {
    auto state = std::make_unique<InstanceState>();
    RETURN_IF_TRITON_ERROR(parent_state<ModelState, TRITONBACKEND_Model>(instance, STRATA_TRITON_CALL(TRITONBACKEND_ModelInstanceModel),
                                                                        STRATA_TRITON_CALL(TRITONBACKEND_ModelState), &state->model));
    state->instance = instance;
    const char *name = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
    state->name = name;
    TRITONSERVER_InstanceGroupKind kind;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelInstanceKind(instance, &kind));
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelInstanceDeviceId(instance, &state->device_id));
    state->gpu = kind == TRITONSERVER_INSTANCEGROUPKIND_GPU;
    if (state->gpu) {
        // KIND_GPU: inputs and outputs in device memory, lookups on this instance's own stream.
        if (!strata_cuda_available())
            return error(TRITONSERVER_ERROR_UNSUPPORTED, "strata: instance '" + state->name +
                                                             "' is KIND_GPU, but this libstrata has no CUDA support or "
                                                             "finds no CUDA device");
        state->stream = std::make_unique<CudaStream>();
        std::string cuda_error;
        if (!state->stream->create(state->device_id, &cuda_error))
            return error(TRITONSERVER_ERROR_INTERNAL, "strata: instance '" + state->name + "': " + cuda_error);
    }
    STRATA_LOG(TRITONSERVER_LOG_INFO, "strata: instance '" + state->name + "' (" + (state->gpu ? "GPU " : "CPU") +
                                          (state->gpu ? std::to_string(state->device_id) : std::string()) + ")");
    return hand_over(instance, STRATA_TRITON_CALL(TRITONBACKEND_ModelInstanceSetState), std::move(state));
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance *instance) {
    return delete_state<InstanceState>(instance, STRATA_TRITON_CALL(TRITONBACKEND_ModelInstanceState));
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests, const uint32_t request_count) {
    void *state = nullptr;
    RETURN_IF_TRITON_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
    // From here on the requests are the backend's: every one gets a response and is released,
    // and no C++ exception may reach Triton.
    try {
        Execution(static_cast<InstanceState *>(state)).run(requests, request_count);
    } catch (const std::exception &e) {
        STRATA_LOG(TRITONSERVER_LOG_ERROR, std::string("strata: execution failed: ") + e.what());
    }
    return nullptr;
}

}  // extern "C"
