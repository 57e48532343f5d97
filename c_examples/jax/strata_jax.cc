// libstrata_jax.so: XLA FFI handlers for strata lookups, called from JAX through
// `jax.ffi.ffi_call` (python/src/strata/jax.py registers and calls them).
//
//   strata_lookup         keys (any integer dtype, any shape) -> rows [*keys.shape, dim]
//   strata_lookup_pooled  keys, offsets, weights -> rows [B, dim] (empty offsets / weights mean none)
//
// CPU handlers (`*_cpu`) and CUDA handlers (`*_cuda`, on XLA's stream of the device) for each.
// Attributes: `table` (int64, a strata.Table's serial number), and for the pooled call `pooling`
// (int32, a strata_pooling), `has_offsets` and `has_weights` (bool).
//
// The library does not link libstrata: Python hands it the entry points of the libstrata it
// loaded (strata_jax_init), so tables built by the Python package are looked up by the same
// library copy. Tables are found through a registry of serial numbers (strata_jax_register /
// strata_jax_forget, called when a table is first used and when it closes): a compiled
// function that outlives its table gets an error naming the handle, never freed memory; a table
// closing waits for the lookups running on it. XLA's buffers are row-major and dense.
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

decltype(&strata_lookup) lookup_fn = nullptr;
decltype(&strata_lookup_pooled) lookup_pooled_fn = nullptr;
decltype(&strata_last_error) last_error_fn = nullptr;

std::shared_mutex registry_lock;
std::unordered_map<int64_t, strata_table *> registry;

DLDataType dtype_of(ffi::DataType t) {
    switch (t) {
        case ffi::DataType::S8: return {kDLInt, 8, 1};
        case ffi::DataType::S16: return {kDLInt, 16, 1};
        case ffi::DataType::S32: return {kDLInt, 32, 1};
        case ffi::DataType::S64: return {kDLInt, 64, 1};
        case ffi::DataType::U8: return {kDLUInt, 8, 1};
        case ffi::DataType::U16: return {kDLUInt, 16, 1};
        case ffi::DataType::U32: return {kDLUInt, 32, 1};
        case ffi::DataType::U64: return {kDLUInt, 64, 1};
        case ffi::DataType::F16: return {kDLFloat, 16, 1};
        case ffi::DataType::F32: return {kDLFloat, 32, 1};
        case ffi::DataType::F64: return {kDLFloat, 64, 1};
        case ffi::DataType::BF16: return {kDLBfloat, 16, 1};
        case ffi::DataType::PRED: return {kDLBool, 8, 1};
        default: return {kDLOpaqueHandle, 0, 1};  // strata refuses it, naming the argument
    }
}

// A DLTensor over an XLA buffer (row-major and dense: explicit compact strides).
struct View {
    DLTensor dl{};
    std::vector<int64_t> strides;
    View(void *data, ffi::DataType t, ffi::Span<const int64_t> dims, DLDeviceType dev, int32_t ordinal)
        : strides(dims.size()) {
        int64_t step = 1;
        for (size_t i = dims.size(); i-- > 0;) {
            strides[i] = step;
            step *= dims[i];
        }
        dl.data = data;
        dl.device = {dev, ordinal};
        dl.ndim = static_cast<int32_t>(dims.size());
        dl.dtype = dtype_of(t);
        dl.shape = const_cast<int64_t *>(dims.begin());
        dl.strides = strides.data();
    }
};

ffi::Error status_error(strata_status s) {
    std::string msg = last_error_fn ? last_error_fn() : "strata error";
    switch (s) {
        case STRATA_KEY_NOT_FOUND: return ffi::Error(ffi::ErrorCode::kNotFound, msg);
        case STRATA_UNSUPPORTED_DEVICE: return ffi::Error(ffi::ErrorCode::kUnimplemented, msg);
        case STRATA_INTERNAL:
        case STRATA_CUDA_ERROR:
        case STRATA_OUT_OF_MEMORY: return ffi::Error::Internal(msg);
        default: return ffi::Error::InvalidArgument(msg);
    }
}

// Runs `call(table)` with the table of `handle`, holding the registry shared meanwhile.
template <typename F>
ffi::Error with_table(int64_t handle, F call) {
    if (!lookup_fn) return ffi::Error::Internal("strata.jax: strata_jax_init was not called");
    std::shared_lock<std::shared_mutex> g(registry_lock);
    auto it = registry.find(handle);
    if (it == registry.end())
        return ffi::Error::InvalidArgument("table: handle " + std::to_string(handle) +
                                           " names no table (it was closed or freed)");
    strata_status s = call(it->second);
    return s == STRATA_OK ? ffi::Error::Success() : status_error(s);
}

ffi::Error lookup(DLDeviceType dev, void *stream, int32_t ordinal, ffi::AnyBuffer keys,
                  ffi::Result<ffi::AnyBuffer> out, int64_t table) {
    View k(keys.untyped_data(), keys.element_type(), keys.dimensions(), dev, ordinal);
    View o(out->untyped_data(), out->element_type(), out->dimensions(), dev, ordinal);
    strata_lookup_options opts = strata_lookup_options{sizeof(strata_lookup_options), stream, 1};
    // num_threads 1: XLA's CPU client runs many custom calls on its own threads at once.
    if (dev != kDLCPU) opts.num_threads = 0;
    return with_table(table, [&](strata_table *t) { return lookup_fn(t, &k.dl, &o.dl, &opts, nullptr); });
}

ffi::Error lookup_pooled(DLDeviceType dev, void *stream, int32_t ordinal, ffi::AnyBuffer keys, ffi::AnyBuffer offsets,
                         ffi::AnyBuffer weights, ffi::Result<ffi::AnyBuffer> out, int64_t table, int32_t pooling,
                         bool has_offsets, bool has_weights) {
    View k(keys.untyped_data(), keys.element_type(), keys.dimensions(), dev, ordinal);
    View off(offsets.untyped_data(), offsets.element_type(), offsets.dimensions(), dev, ordinal);
    View w(weights.untyped_data(), weights.element_type(), weights.dimensions(), dev, ordinal);
    View o(out->untyped_data(), out->element_type(), out->dimensions(), dev, ordinal);
    strata_lookup_options opts = strata_lookup_options{sizeof(strata_lookup_options), stream, 1};
    if (dev != kDLCPU) opts.num_threads = 0;
    return with_table(table, [&](strata_table *t) {
        return lookup_pooled_fn(t, &k.dl, has_offsets ? &off.dl : nullptr, has_weights ? &w.dl : nullptr, pooling,
                                &o.dl, &opts, nullptr);
    });
}

ffi::Error lookup_cpu(ffi::AnyBuffer keys, ffi::Result<ffi::AnyBuffer> out, int64_t table) {
    return lookup(kDLCPU, nullptr, 0, keys, out, table);
}

ffi::Error lookup_cuda(void *stream, int32_t ordinal, ffi::AnyBuffer keys, ffi::Result<ffi::AnyBuffer> out,
                       int64_t table) {
    return lookup(kDLCUDA, stream, ordinal, keys, out, table);
}

ffi::Error lookup_pooled_cpu(ffi::AnyBuffer keys, ffi::AnyBuffer offsets, ffi::AnyBuffer weights,
                             ffi::Result<ffi::AnyBuffer> out, int64_t table, int32_t pooling, bool has_offsets,
                             bool has_weights) {
    return lookup_pooled(kDLCPU, nullptr, 0, keys, offsets, weights, out, table, pooling, has_offsets, has_weights);
}

ffi::Error lookup_pooled_cuda(void *stream, int32_t ordinal, ffi::AnyBuffer keys, ffi::AnyBuffer offsets,
                              ffi::AnyBuffer weights, ffi::Result<ffi::AnyBuffer> out, int64_t table, int32_t pooling,
                              bool has_offsets, bool has_weights) {
    return lookup_pooled(kDLCUDA, stream, ordinal, keys, offsets, weights, out, table, pooling, has_offsets,
                         has_weights);
}

}  // namespace

extern "C" {

// Hands the library the entry points of the libstrata Python loaded.
void strata_jax_init(void *lookup, void *lookup_pooled, void *last_error) {
    lookup_fn = reinterpret_cast<decltype(lookup_fn)>(lookup);
    lookup_pooled_fn = reinterpret_cast<decltype(lookup_pooled_fn)>(lookup_pooled);
    last_error_fn = reinterpret_cast<decltype(last_error_fn)>(last_error);
}

// Registers table `handle` (borrowed: it stays Python's).
void strata_jax_register(int64_t handle, strata_table *table) {
    std::unique_lock<std::shared_mutex> g(registry_lock);
    registry[handle] = table;
}

// Forgets `handle`; waits for the lookups running on it.
void strata_jax_forget(int64_t handle) {
    std::unique_lock<std::shared_mutex> g(registry_lock);
    registry.erase(handle);
}

}  // extern "C"

XLA_FFI_DEFINE_HANDLER_SYMBOL(strata_jax_lookup_cpu, lookup_cpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<int64_t>("table"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(strata_jax_lookup_cuda, lookup_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("table"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(strata_jax_lookup_pooled_cpu, lookup_pooled_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("table")
                                  .Attr<int32_t>("pooling")
                                  .Attr<bool>("has_offsets")
                                  .Attr<bool>("has_weights"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(strata_jax_lookup_pooled_cuda, lookup_pooled_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("table")
                                  .Attr<int32_t>("pooling")
                                  .Attr<bool>("has_offsets")
                                  .Attr<bool>("has_weights"));
