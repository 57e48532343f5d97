// TensorRT tensor descriptions -> DLPack, with no TensorRT dependency.
//
// A TensorRT plugin's enqueue() gets, for each tensor, a PluginTensorDesc (dims, data type,
// format) and a pointer into device memory. TensorDesc mirrors the part of that the mapping
// needs, with TensorRT's own DataType values, so the plugin converts with a static_cast and
// this file (and its tests) build and run on machines without TensorRT.
#ifndef STRATA_TRT_DLPACK_H
#define STRATA_TRT_DLPACK_H

#include <array>
#include <cstdint>
#include <string>

#include "strata.h"

namespace strata_trt {

// nvinfer1::DataType, value for value (TensorRT 10).
enum class DataType : int32_t {
    kFLOAT = 0,
    kHALF = 1,
    kINT8 = 2,
    kINT32 = 3,
    kBOOL = 4,
    kUINT8 = 5,
    kFP8 = 6,
    kBF16 = 7,
    kINT64 = 8,
    kINT4 = 9,
};

// Where a tensor's memory lives. TensorRT hands enqueue() device memory; host memory is for
// tests and CPU-only hosts.
enum class Location : int32_t { kHost = 0, kDevice = 1 };

// nvinfer1::Dims64: MAX_DIMS = 8, int64 extents.
constexpr int32_t kMaxDims = 8;
struct Dims {
    int32_t nbDims = 0;
    int64_t d[kMaxDims] = {};
};

// What the plugin knows of one tensor at enqueue().
struct TensorDesc {
    Dims dims;
    DataType type = DataType::kFLOAT;
    const void *data = nullptr;
    Location location = Location::kDevice;
    int32_t device_id = 0;
};

// A DLTensor over a TensorDesc, with the shape and (row-major) strides it points to.
struct DLTensorView {
    std::array<int64_t, kMaxDims> shape{};
    std::array<int64_t, kMaxDims> strides{};
    DLTensor tensor{};
};

// The TensorRT name of a data type ("kINT64").
const char *type_name(DataType t);

// Fills `view` with `desc` seen as a DLTensor: dense row-major (TensorRT's kLINEAR format), the
// matching DLDataType, kDLCUDA (device_id) or kDLCPU. `role` names the tensor in messages. Returns
// "" on success, else why it cannot be mapped (negative or too many dims, a data type strata
// does not take in that role, NULL data with elements).
std::string to_dltensor(const TensorDesc &desc, const char *role, bool is_output, DLTensorView &view);

// Checks that `out` is keys' shape plus a last dimension of `dim`. "" when it is.
std::string check_shapes(const TensorDesc &keys, const TensorDesc &out, int64_t dim);

// Maps both tensors, checks them against the table, and calls strata_lookup on `stream`
// (NULL for host tensors). On failure returns the status and puts the reason in *error
// (strata's own message for strata's refusals).
strata_status lookup(strata_table *table, const TensorDesc &keys, const TensorDesc &out, void *stream,
                     int32_t num_threads, std::string *error);

}  // namespace strata_trt

#endif  // STRATA_TRT_DLPACK_H
