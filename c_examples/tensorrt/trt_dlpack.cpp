// TensorRT tensor descriptions -> DLPack (see trt_dlpack.h). Plain C++17, no TensorRT.
#include "trt_dlpack.h"

#include <string>

namespace strata_trt {

const char *type_name(DataType t) {
    switch (t) {
        case DataType::kFLOAT: return "kFLOAT";
        case DataType::kHALF: return "kHALF";
        case DataType::kINT8: return "kINT8";
        case DataType::kINT32: return "kINT32";
        case DataType::kBOOL: return "kBOOL";
        case DataType::kUINT8: return "kUINT8";
        case DataType::kFP8: return "kFP8";
        case DataType::kBF16: return "kBF16";
        case DataType::kINT64: return "kINT64";
        case DataType::kINT4: return "kINT4";
    }
    return "unknown DataType";
}

static bool key_dtype(DataType t, DLDataType *out) {
    switch (t) {
        case DataType::kINT32: *out = DLDataType{kDLInt, 32, 1}; return true;
        case DataType::kINT64: *out = DLDataType{kDLInt, 64, 1}; return true;
        default: return false;
    }
}

static bool row_dtype(DataType t, DLDataType *out) {
    switch (t) {
        case DataType::kFLOAT: *out = DLDataType{kDLFloat, 32, 1}; return true;
        case DataType::kHALF: *out = DLDataType{kDLFloat, 16, 1}; return true;
        case DataType::kBF16: *out = DLDataType{kDLBfloat, 16, 1}; return true;
        default: return false;
    }
}

static std::string dims_text(const Dims &d) {
    std::string s = "[";
    for (int32_t i = 0; i < d.nbDims && i < kMaxDims; i++) {
        s += (i ? ", " : "") + std::to_string(d.d[i]);
    }
    return s + "]";
}

std::string to_dltensor(const TensorDesc &desc, const char *role, bool is_output, DLTensorView &view) {
    const std::string who = role;
    if (desc.dims.nbDims < 0 || desc.dims.nbDims > kMaxDims) {
        return who + ": nbDims " + std::to_string(desc.dims.nbDims) + "; expected 0.." + std::to_string(kMaxDims);
    }
    DLDataType dtype{};
    if (is_output ? !row_dtype(desc.type, &dtype) : !key_dtype(desc.type, &dtype)) {
        return who + ": data type " + type_name(desc.type) + "; expected " +
               (is_output ? "kFLOAT, kHALF or kBF16" : "kINT32 or kINT64");
    }
    int64_t numel = 1;
    for (int32_t i = 0; i < desc.dims.nbDims; i++) {
        if (desc.dims.d[i] < 0) {
            return who + ": dims " + dims_text(desc.dims) + " has an unresolved (-1) or negative extent";
        }
        numel *= desc.dims.d[i];
    }
    if (desc.data == nullptr && numel > 0) {
        return who + ": NULL data for " + std::to_string(numel) + " elements";
    }
    // kLINEAR: dense, row-major.
    int64_t step = 1;
    for (int32_t i = desc.dims.nbDims - 1; i >= 0; i--) {
        view.shape[i] = desc.dims.d[i];
        view.strides[i] = step;
        step *= desc.dims.d[i] > 0 ? desc.dims.d[i] : 1;
    }
    DLTensor &t = view.tensor;
    t.data = const_cast<void *>(desc.data);
    t.device = desc.location == Location::kDevice ? DLDevice{kDLCUDA, desc.device_id} : DLDevice{kDLCPU, 0};
    t.ndim = desc.dims.nbDims;
    t.dtype = dtype;
    t.shape = view.shape.data();
    t.strides = view.strides.data();
    t.byte_offset = 0;
    return "";
}

std::string check_shapes(const TensorDesc &keys, const TensorDesc &out, int64_t dim) {
    const Dims &k = keys.dims, &o = out.dims;
    bool ok = k.nbDims >= 0 && o.nbDims == k.nbDims + 1 && o.nbDims <= kMaxDims && o.d[o.nbDims - 1] == dim;
    for (int32_t i = 0; ok && i < k.nbDims; i++) {
        ok = o.d[i] == k.d[i];
    }
    if (ok) return "";
    return "out: dims " + dims_text(o) + "; expected keys' dims " + dims_text(k) + " plus [" + std::to_string(dim) +
           "] (the table's emb_vec_size)";
}

strata_status lookup(strata_table *table, const TensorDesc &keys, const TensorDesc &out, void *stream,
                     int32_t num_threads, std::string *error) {
    std::string why;
    if (table == nullptr) {
        why = "table: NULL (the plugin has no table)";
        if (error) *error = why;
        return STRATA_NULL_ARGUMENT;
    }
    DLTensorView k, o;
    why = to_dltensor(keys, "keys", false, k);
    if (why.empty()) why = to_dltensor(out, "out", true, o);
    if (why.empty()) why = check_shapes(keys, out, strata_table_dim(table));
    if (why.empty() && keys.location != out.location) why = "keys and out: one on the host, one on the device";
    if (!why.empty()) {
        if (error) *error = why;
        return STRATA_INVALID_ARGUMENT;
    }
    strata_lookup_options opts = strata_lookup_options_default();
    opts.stream = stream;
    opts.num_threads = num_threads;
    strata_status s = strata_lookup(table, &k.tensor, &o.tensor, &opts, nullptr);
    if (s != STRATA_OK && error) *error = std::string(strata_status_name(s)) + ": " + strata_last_error();
    return s;
}

const char *combiner_name(Combiner c) {
    switch (c) {
        case Combiner::kNONE: return "none";
        case Combiner::kSUM: return "sum";
        case Combiner::kMEAN: return "mean";
        case Combiner::kSQRTN: return "sqrtn";
    }
    return "unknown combiner";
}

std::string parse_combiner(const char *text, int64_t length, Combiner *out) {
    std::string t;
    if (text != nullptr && length > 0) {
        t.assign(text, static_cast<size_t>(length));
        t = t.substr(0, t.find('\0'));
    }
    for (Combiner c : {Combiner::kNONE, Combiner::kSUM, Combiner::kMEAN, Combiner::kSQRTN}) {
        if (t == combiner_name(c)) {
            *out = c;
            return "";
        }
    }
    return "combiner: '" + t + "'; expected none, sum, mean or sqrtn";
}

static std::string pooled_keys_error(const Dims &keys, const std::string &mode) {
    return "keys: dims " + dims_text(keys) + "; expected [B, L] (L keys per sample) for " + mode;
}

std::string output_dims(const Dims &keys, int64_t dim, Combiner combiner, Dims *out) {
    if (combiner == Combiner::kNONE) {
        if (keys.nbDims < 0 || keys.nbDims >= kMaxDims) {
            return "keys: nbDims " + std::to_string(keys.nbDims) + "; expected 0.." + std::to_string(kMaxDims - 1) +
                   " (the output has one more)";
        }
        *out = keys;
        out->d[keys.nbDims] = dim;
        out->nbDims = keys.nbDims + 1;
        return "";
    }
    if (keys.nbDims != 2) return pooled_keys_error(keys, std::string("combiner ") + combiner_name(combiner));
    *out = Dims{};
    out->nbDims = 2;
    out->d[0] = keys.d[0];
    out->d[1] = dim;
    return "";
}

std::string check_pooled_shapes(const TensorDesc &keys, const TensorDesc &out, int64_t dim) {
    if (keys.dims.nbDims != 2) return pooled_keys_error(keys.dims, "the pooled mode");
    const Dims &o = out.dims;
    if (o.nbDims == 2 && o.d[0] == keys.dims.d[0] && o.d[1] == dim) return "";
    return "out: dims " + dims_text(o) + "; expected [B, emb_vec_size] = [" + std::to_string(keys.dims.d[0]) + ", " +
           std::to_string(dim) + "] (one pooled row per sample)";
}

std::string map_pooled(const TensorDesc &keys, const TensorDesc &out, int64_t dim, DLTensorView &k, DLTensorView &o) {
    std::string why = to_dltensor(keys, "keys", false, k);
    if (why.empty()) why = to_dltensor(out, "out", true, o);
    if (why.empty()) why = check_pooled_shapes(keys, out, dim);
    if (why.empty() && keys.location != out.location) why = "keys and out: one on the host, one on the device";
    return why;
}

strata_status lookup_pooled(strata_table *table, const TensorDesc &keys, const TensorDesc &out, Combiner combiner,
                            void *stream, int32_t num_threads, std::string *error) {
    std::string why;
    strata_status status = STRATA_INVALID_ARGUMENT;
    DLTensorView k, o;
    if (table == nullptr) {
        why = "table: NULL (the plugin has no table)";
        status = STRATA_NULL_ARGUMENT;
    } else if (combiner == Combiner::kNONE) {
        why = "combiner: none; expected sum, mean or sqrtn for a pooled lookup";
    } else {
        why = map_pooled(keys, out, strata_table_dim(table), k, o);
    }
    if (!why.empty()) {
        if (error) *error = why;
        return status;
    }
    strata_lookup_options opts = strata_lookup_options_default();
    opts.stream = stream;
    opts.num_threads = num_threads;
    // strata checks the combiner's value itself (and names `pooling` when it refuses one).
    strata_status s = strata_lookup_pooled(table, &k.tensor, nullptr, nullptr, static_cast<int32_t>(combiner),
                                           &o.tensor, &opts, nullptr);
    if (s != STRATA_OK && error) *error = std::string(strata_status_name(s)) + ": " + strata_last_error();
    return s;
}

strata_status run(strata_table *table, Combiner combiner, const TensorDesc &keys, const TensorDesc &out, void *stream,
                  int32_t num_threads, std::string *error) {
    if (combiner == Combiner::kNONE) return lookup(table, keys, out, stream, num_threads, error);
    return lookup_pooled(table, keys, out, combiner, stream, num_threads, error);
}

std::shared_ptr<ServerTable> open_server_table(const std::string &ps_config_file, const std::string &model_name,
                                               int32_t table_id, int64_t emb_vec_size, std::string *error) {
    auto shared = std::make_shared<ServerTable>();
    strata_status s = strata_server_open(ps_config_file.c_str(), &shared->server);
    if (s == STRATA_OK) s = strata_server_table(shared->server, model_name.c_str(), table_id, &shared->table);
    if (s != STRATA_OK) {
        if (error) *error = std::string(strata_status_name(s)) + ": " + strata_last_error();
        return nullptr;
    }
    if (strata_table_dim(shared->table) != emb_vec_size) {
        if (error) {
            *error = "emb_vec_size " + std::to_string(emb_vec_size) + " but model " + model_name + " table " +
                     std::to_string(table_id) + " has dim " + std::to_string(strata_table_dim(shared->table));
        }
        return nullptr;
    }
    return shared;
}

}  // namespace strata_trt
