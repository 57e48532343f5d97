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

}  // namespace strata_trt
