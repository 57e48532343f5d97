// libstrata_torch.so: strata's PyTorch ops in C++ (TORCH_LIBRARY), for TorchScript and
// AOTInductor models that run without Python. Load it with
// `torch.ops.load_library("libstrata_torch.so")` (Python) or link it (C++).
//
//   t    = torch.ops.strata.table_from_tensors(vectors, keys=None, default_value=0.0, missing_error=False)
//   t    = torch.ops.strata.table_open("/models/wdl/sparse0", dim, default_value=0.0, missing_error=False)
//   rows = torch.ops.strata.lookup(t, keys, dtype=None)                      # [*keys.shape, dim]
//   emb  = torch.ops.strata.lookup_pooled(t, keys, offsets, weights, "mean") # [B, dim]
//   outs = torch.ops.strata.lookup_batch([t, u], [k1, k2], [None, off2], [None, None], ["none", "sum"])
//   torch.ops.strata.table_free(t)
//
// The same lookup schemas as the Python ops of strata.torch (one or the other defines
// torch.ops.strata in a process). Tables are int handles into this library's registry: ids are
// never reused, and a lookup holds a reference to its table for the call, so a handle used after
// table_free raises (ValueError) instead of touching freed memory.
//
// Kernels: CPU, Meta (shapes only, for torch.compile and export) and, when built with
// STRATA_TORCH_CUDA, CUDA on PyTorch's current stream of the keys' device. Tensors are passed to
// strata as DLTensors over their own memory (any strides); outputs are new tensors.
// strata's errors keep its message: STRATA_UNSUPPORTED_DTYPE raises TypeError, a missing key
// (STRATA_KEY_NOT_FOUND) IndexError, other argument errors ValueError, the rest RuntimeError.
#include <torch/library.h>
#include <ATen/ATen.h>

#ifdef STRATA_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata.h"  // after ATen: its DLPack declarations share dlpack.h's include guard

namespace strata_torch {

namespace {

// One table of the registry; the last reference frees it.
struct Table {
    strata_table *ptr;
    int64_t dim;
    explicit Table(strata_table *p) : ptr(p), dim(strata_table_dim(p)) {}
    ~Table() { strata_table_free(ptr); }
    Table(const Table &) = delete;
    Table &operator=(const Table &) = delete;
};

std::mutex registry_lock;
std::unordered_map<int64_t, std::shared_ptr<Table>> registry;
std::atomic<int64_t> next_id{1};

[[noreturn]] void fail(strata_status s, const std::string &what) {
    std::string msg = what + ": " + strata_last_error();
    switch (s) {
        case STRATA_UNSUPPORTED_DTYPE:
            TORCH_CHECK_TYPE(false, msg);
        case STRATA_KEY_NOT_FOUND:
            TORCH_CHECK_INDEX(false, msg);
        case STRATA_NULL_ARGUMENT:
        case STRATA_INVALID_ARGUMENT:
        case STRATA_UNSUPPORTED_DEVICE:
        case STRATA_INVALID_LAYOUT:
        case STRATA_READ_ONLY:
        case STRATA_DUPLICATE_KEY:
        case STRATA_INVALID_FILE:
            TORCH_CHECK_VALUE(false, msg);
        default:
            TORCH_CHECK(false, msg);
    }
}

void check(strata_status s, const char *what) {
    if (s != STRATA_OK) fail(s, what);
}

int64_t add(strata_table *t) {
    auto entry = std::make_shared<Table>(t);
    int64_t id = next_id++;
    std::lock_guard<std::mutex> g(registry_lock);
    registry.emplace(id, std::move(entry));
    return id;
}

std::shared_ptr<Table> get(int64_t id) {
    std::lock_guard<std::mutex> g(registry_lock);
    auto it = registry.find(id);
    TORCH_CHECK_VALUE(it != registry.end(), "table: handle ", id,
                      " names no table (it was freed, or never made by torch.ops.strata.table_*)");
    return it->second;
}

// A DLTensor over `t`'s memory (borrowed: `t` must outlive it).
struct View {
    DLTensor dl{};
    explicit View(const at::Tensor &t) {
        dl.data = t.data_ptr();
        dl.device.device_type = t.is_cuda() ? kDLCUDA : kDLCPU;
        dl.device.device_id = t.is_cuda() ? t.get_device() : 0;
        dl.ndim = static_cast<int32_t>(t.dim());
        dl.dtype = dtype_of(t.scalar_type());
        dl.shape = const_cast<int64_t *>(t.sizes().data());
        dl.strides = const_cast<int64_t *>(t.strides().data());
        dl.byte_offset = 0;
    }
    static DLDataType dtype_of(at::ScalarType s) {
        switch (s) {
            case at::kByte: return {kDLUInt, 8, 1};
            case at::kChar: return {kDLInt, 8, 1};
            case at::kShort: return {kDLInt, 16, 1};
            case at::kInt: return {kDLInt, 32, 1};
            case at::kLong: return {kDLInt, 64, 1};
            case at::kUInt16: return {kDLUInt, 16, 1};
            case at::kUInt32: return {kDLUInt, 32, 1};
            case at::kUInt64: return {kDLUInt, 64, 1};
            case at::kHalf: return {kDLFloat, 16, 1};
            case at::kFloat: return {kDLFloat, 32, 1};
            case at::kDouble: return {kDLFloat, 64, 1};
            case at::kBFloat16: return {kDLBfloat, 16, 1};
            case at::kBool: return {kDLBool, 8, 1};
            default: return {kDLOpaqueHandle, 0, 1};  // strata refuses it, naming the argument
        }
    }
};

at::ScalarType out_dtype(std::optional<at::ScalarType> d) {
    at::ScalarType s = d.value_or(at::kFloat);
    TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, "dtype: ", s,
                     "; expected torch.float32, torch.float16 or torch.bfloat16");
    return s;
}

int32_t pooling_of(const std::string &p, const char *what, bool allow_none) {
    if (allow_none && p == "none") return STRATA_POOL_NONE;
    if (p == "sum") return STRATA_POOL_SUM;
    if (p == "mean") return STRATA_POOL_MEAN;
    if (p == "sqrtn") return STRATA_POOL_SQRTN;
    TORCH_CHECK_VALUE(false, what, ": '", p, "'; expected ", allow_none ? "'none', " : "", "'sum', 'mean' or 'sqrtn'");
}

int64_t pooled_rows(const at::Tensor &keys, const std::optional<at::Tensor> &offsets) {
    if (offsets.has_value()) return offsets->dim() == 1 ? std::max<int64_t>(offsets->size(0) - 1, 0) : 0;
    return keys.dim() == 2 ? keys.size(0) : 0;
}

// The Meta kernels' shapes, symbolic where the keys' are (torch.export, dynamic torch.compile).
c10::SymInt pooled_rows_sym(const at::Tensor &keys, const std::optional<at::Tensor> &offsets) {
    if (offsets.has_value()) {
        if (offsets->dim() != 1) return 0;
        c10::SymInt n = offsets->sym_size(0);
        if (auto c = n.maybe_as_int(); c.has_value()) return std::max<int64_t>(*c - 1, 0);
        return n - 1;
    }
    return keys.dim() == 2 ? keys.sym_size(0) : c10::SymInt(0);
}

std::vector<c10::SymInt> plain_shape_sym(const at::Tensor &keys, int64_t dim) {
    std::vector<c10::SymInt> s(keys.sym_sizes().begin(), keys.sym_sizes().end());
    s.emplace_back(dim);
    return s;
}

std::vector<int64_t> plain_shape(const at::Tensor &keys, int64_t dim) {
    std::vector<int64_t> s(keys.sizes().begin(), keys.sizes().end());
    s.push_back(dim);
    return s;
}

strata_lookup_options options_for(const at::Tensor &keys) {
    strata_lookup_options o = strata_lookup_options_default();
#ifdef STRATA_TORCH_CUDA
    if (keys.is_cuda()) o.stream = c10::cuda::getCurrentCUDAStream(keys.get_device()).stream();
#else
    TORCH_CHECK_VALUE(!keys.is_cuda(), "keys: a CUDA tensor; this libstrata_torch was built without CUDA");
#endif
    return o;
}

// ---- tables --------------------------------------------------------------------------------------

strata_table_options table_options(double default_value, bool missing_error) {
    strata_table_options o = strata_table_options_default();
    o.default_value = static_cast<float>(default_value);
    o.missing_key = missing_error ? STRATA_MISSING_ERROR : STRATA_MISSING_FILL;
    return o;
}

int64_t table_from_tensors(const at::Tensor &vectors, const std::optional<at::Tensor> &keys, double default_value,
                           bool missing_error) {
    View v(vectors);
    std::optional<View> k;
    if (keys.has_value()) k.emplace(*keys);
    strata_table_options o = table_options(default_value, missing_error);
    strata_table *t = nullptr;
    check(strata_table_from_dlpack(&v.dl, k ? &k->dl : nullptr, &o, &t), "table_from_tensors");
    return add(t);
}

int64_t table_open(const std::string &dir, int64_t dim, double default_value, bool missing_error) {
    strata_table_options o = table_options(default_value, missing_error);
    strata_table *t = nullptr;
    check(strata_table_open(dir.c_str(), dim, &o, &t), "table_open");
    return add(t);
}

void table_free(int64_t id) {
    std::shared_ptr<Table> gone;
    {
        std::lock_guard<std::mutex> g(registry_lock);
        auto it = registry.find(id);
        TORCH_CHECK_VALUE(it != registry.end(), "table: handle ", id, " names no table");
        gone = std::move(it->second);
        registry.erase(it);
    }
    // `gone` frees the table here unless a lookup on another thread still holds it.
}

int64_t table_dim(int64_t id) { return get(id)->dim; }

// ---- lookups -------------------------------------------------------------------------------------

at::Tensor lookup(int64_t table, const at::Tensor &keys, std::optional<at::ScalarType> dtype) {
    auto t = get(table);
    at::Tensor out = at::empty(plain_shape(keys, t->dim), keys.options().dtype(out_dtype(dtype)));
    View k(keys), o(out);
    strata_lookup_options opts = options_for(keys);
    check(strata_lookup(t->ptr, &k.dl, &o.dl, &opts, nullptr), "lookup");
    return out;
}

at::Tensor lookup_meta(int64_t table, const at::Tensor &keys, std::optional<at::ScalarType> dtype) {
    return at::empty_symint(plain_shape_sym(keys, get(table)->dim), keys.options().dtype(out_dtype(dtype)));
}

at::Tensor lookup_pooled(int64_t table, const at::Tensor &keys, const std::optional<at::Tensor> &offsets,
                         const std::optional<at::Tensor> &weights, const std::string &pooling,
                         std::optional<at::ScalarType> dtype) {
    auto t = get(table);
    int32_t p = pooling_of(pooling, "pooling", false);
    at::Tensor out = at::empty({pooled_rows(keys, offsets), t->dim}, keys.options().dtype(out_dtype(dtype)));
    View k(keys), o(out);
    std::optional<View> off, w;
    if (offsets.has_value()) off.emplace(*offsets);
    if (weights.has_value()) w.emplace(*weights);
    strata_lookup_options opts = options_for(keys);
    check(strata_lookup_pooled(t->ptr, &k.dl, off ? &off->dl : nullptr, w ? &w->dl : nullptr, p, &o.dl, &opts,
                               nullptr),
          "lookup_pooled");
    return out;
}

at::Tensor lookup_pooled_meta(int64_t table, const at::Tensor &keys, const std::optional<at::Tensor> &offsets,
                              const std::optional<at::Tensor> &, const std::string &pooling,
                              std::optional<at::ScalarType> dtype) {
    pooling_of(pooling, "pooling", false);
    return at::empty_symint({pooled_rows_sym(keys, offsets), c10::SymInt(get(table)->dim)},
                            keys.options().dtype(out_dtype(dtype)));
}

void check_batch(const std::vector<int64_t> &tables, size_t keys, size_t offsets, size_t weights, size_t poolings) {
    size_t n = tables.size();
    TORCH_CHECK_VALUE(keys == n && offsets == n && weights == n && poolings == n, "lookup_batch: ", keys, " keys, ",
                      offsets, " offsets, ", weights, " weights and ", poolings, " poolings; expected one per table (",
                      n, ")");
}

std::vector<at::Tensor> lookup_batch(const std::vector<int64_t> &tables, const std::vector<at::Tensor> &keys,
                                     const std::vector<std::optional<at::Tensor>> &offsets,
                                     const std::vector<std::optional<at::Tensor>> &weights,
                                     const std::vector<std::string> &poolings, std::optional<at::ScalarType> dtype) {
    check_batch(tables, keys.size(), offsets.size(), weights.size(), poolings.size());
    size_t n = tables.size();
    at::ScalarType d = out_dtype(dtype);
    std::vector<std::shared_ptr<Table>> held;
    std::vector<at::Tensor> outs;
    std::vector<View> views;  // keys, offsets, weights, out per request (reserved: stable addresses)
    views.reserve(4 * n);
    std::vector<strata_lookup_request> reqs(n, strata_lookup_request_default());
    for (size_t i = 0; i < n; i++) {
        held.push_back(get(tables[i]));
        std::string what = "requests[" + std::to_string(i) + "].pooling";
        int32_t p = pooling_of(poolings[i], what.c_str(), true);
        std::vector<int64_t> shape =
            p == STRATA_POOL_NONE ? plain_shape(keys[i], held[i]->dim)
                                  : std::vector<int64_t>{pooled_rows(keys[i], offsets[i]), held[i]->dim};
        outs.push_back(at::empty(shape, keys[i].options().dtype(d)));
        reqs[i].table = held[i]->ptr;
        reqs[i].pooling = p;
        views.emplace_back(keys[i]);
        reqs[i].keys = &views.back().dl;
        if (offsets[i].has_value()) {
            views.emplace_back(*offsets[i]);
            reqs[i].offsets = &views.back().dl;
        }
        if (weights[i].has_value()) {
            views.emplace_back(*weights[i]);
            reqs[i].weights = &views.back().dl;
        }
        views.emplace_back(outs.back());
        reqs[i].out = &views.back().dl;
    }
    if (n == 0) return outs;
    strata_lookup_options opts = options_for(keys[0]);
    check(strata_lookup_batch(reqs.data(), n, &opts), "lookup_batch");
    return outs;
}

std::vector<at::Tensor> lookup_batch_meta(const std::vector<int64_t> &tables, const std::vector<at::Tensor> &keys,
                                          const std::vector<std::optional<at::Tensor>> &offsets,
                                          const std::vector<std::optional<at::Tensor>> &weights,
                                          const std::vector<std::string> &poolings,
                                          std::optional<at::ScalarType> dtype) {
    check_batch(tables, keys.size(), offsets.size(), weights.size(), poolings.size());
    at::ScalarType d = out_dtype(dtype);
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < tables.size(); i++) {
        int64_t dim = get(tables[i])->dim;
        int32_t p = pooling_of(poolings[i], "poolings", true);
        std::vector<c10::SymInt> shape =
            p == STRATA_POOL_NONE ? plain_shape_sym(keys[i], dim)
                                  : std::vector<c10::SymInt>{pooled_rows_sym(keys[i], offsets[i]), c10::SymInt(dim)};
        outs.push_back(at::empty_symint(shape, keys[i].options().dtype(d)));
    }
    return outs;
}

}  // namespace

TORCH_LIBRARY(strata, m) {
    m.def("table_from_tensors(Tensor vectors, Tensor? keys=None, float default_value=0.0, bool missing_error=False) -> int",
          &table_from_tensors);
    m.def("table_open(str dir, int dim, float default_value=0.0, bool missing_error=False) -> int", &table_open);
    m.def("table_free(int table) -> ()", &table_free);
    m.def("table_dim(int table) -> int", &table_dim);
    m.def("lookup(int table, Tensor keys, ScalarType? dtype=None) -> Tensor");
    m.def("lookup_pooled(int table, Tensor keys, Tensor? offsets=None, Tensor? weights=None, str pooling=\"sum\", "
          "ScalarType? dtype=None) -> Tensor");
    m.def("lookup_batch(int[] tables, Tensor[] keys, Tensor?[] offsets, Tensor?[] weights, str[] poolings, "
          "ScalarType? dtype=None) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(strata, CPU, m) {
    m.impl("lookup", &lookup);
    m.impl("lookup_pooled", &lookup_pooled);
    m.impl("lookup_batch", &lookup_batch);
}

TORCH_LIBRARY_IMPL(strata, Meta, m) {
    m.impl("lookup", &lookup_meta);
    m.impl("lookup_pooled", &lookup_pooled_meta);
    m.impl("lookup_batch", &lookup_batch_meta);
}

// An empty batch has no tensor to dispatch on: it lands here (and returns no outputs).
TORCH_LIBRARY_IMPL(strata, CompositeExplicitAutograd, m) { m.impl("lookup_batch", &lookup_batch); }

#ifdef STRATA_TORCH_CUDA
TORCH_LIBRARY_IMPL(strata, CUDA, m) {
    m.impl("lookup", &lookup);
    m.impl("lookup_pooled", &lookup_pooled);
    m.impl("lookup_batch", &lookup_batch);
}
#endif

}  // namespace strata_torch
