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
#include <memory>
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

// The plugin's `combiner` field: how a sample's keys become rows. kNONE (the default) looks every
// key up: keys of any shape, output keys' dims + [dim]. The others are the fixed-hotness pooled
// mode: keys [B, L] (L keys per sample, HPS's maxnum_catfeature_query_per_table_per_sample),
// output [B, dim], each sample's L rows pooled by strata_lookup_pooled as TensorFlow's
// embedding_lookup_sparse combiners: sum, mean (sum / L), sqrtn (sum / sqrt(L)); L = 0 gives
// zeros. The values are strata's STRATA_POOL_* values.
enum class Combiner : int32_t {
    kNONE = STRATA_POOL_NONE,
    kSUM = STRATA_POOL_SUM,
    kMEAN = STRATA_POOL_MEAN,
    kSQRTN = STRATA_POOL_SQRTN,
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

// The field's text for a combiner ("none", "sum", "mean", "sqrtn"; "unknown combiner" otherwise).
const char *combiner_name(Combiner c);

// Parses the `combiner` field: `length` bytes of `text` (a PluginField of kCHAR, with or without
// its NUL), one of "none", "sum", "mean", "sqrtn". Returns "" and sets *out, or says why not.
std::string parse_combiner(const char *text, int64_t length, Combiner *out);

// The output dims for input dims `keys` (what getOutputShapes computes, on known dims): keys +
// [dim] for kNONE, [B, dim] from [B, L] when pooled. Returns "" and sets *out, or says why not.
std::string output_dims(const Dims &keys, int64_t dim, Combiner combiner, Dims *out);

// Checks the pooled mode's shapes: keys [B, L] and out [B, dim]. "" when they are.
std::string check_pooled_shapes(const TensorDesc &keys, const TensorDesc &out, int64_t dim);

// The DLTensors of a pooled lookup: keys [B, L] and out [B, dim], row-major, on one location,
// checked against `dim`. "" on success, else why not (naming keys or out).
std::string map_pooled(const TensorDesc &keys, const TensorDesc &out, int64_t dim, DLTensorView &k, DLTensorView &o);

// The pooled mode: maps both tensors, checks them, and calls strata_lookup_pooled (offsets and
// weights NULL: fixed hotness, weights 1) with `combiner` on `stream`. Errors as lookup().
strata_status lookup_pooled(strata_table *table, const TensorDesc &keys, const TensorDesc &out, Combiner combiner,
                            void *stream, int32_t num_threads, std::string *error);

// What enqueue() runs: lookup() for kNONE, else lookup_pooled().
strata_status run(strata_table *table, Combiner combiner, const TensorDesc &keys, const TensorDesc &out, void *stream,
                  int32_t num_threads, std::string *error);

// The table a plugin looks up: model `model_name`'s table `table_id` of the parameter server
// of `ps_config_file`, with the server handle it is borrowed from. A plugin and its clones
// share one; the last of them frees the handle.
//
// createPlugin opens one per layer, but strata keeps one server per configuration per process:
// every layer over one ps.json holds a handle of the same server (the same tables, one volatile
// tier, equal strata_table pointers), as HPS's plugin shared its process-wide parameter server.
struct ServerTable {
    strata_server *server = nullptr;
    strata_table *table = nullptr;  // borrowed from the server
    ServerTable() = default;
    ServerTable(const ServerTable &) = delete;
    ServerTable &operator=(const ServerTable &) = delete;
    ~ServerTable() { strata_server_free(server); }
};

// What createPlugin does with its fields: opens the server of `ps_config_file` and takes the
// table, whose dim must be `emb_vec_size`. Returns nullptr and says why in *error otherwise.
std::shared_ptr<ServerTable> open_server_table(const std::string &ps_config_file, const std::string &model_name,
                                               int32_t table_id, int64_t emb_vec_size, std::string *error);

}  // namespace strata_trt

#endif  // STRATA_TRT_DLPACK_H
