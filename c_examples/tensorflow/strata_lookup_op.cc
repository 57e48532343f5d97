// StrataLookup: a TensorFlow custom op that looks keys up in a strata table.
//
//   rows = strata_ops.strata_lookup(keys, dim=128, ps_config="ps.json", model="wdl", table_id=0)
//   rows = strata_ops.strata_lookup(keys, dim=128, table_dir="/models/wdl/sparse0")
//
// keys: int32 or int64, any shape. rows: [*keys.shape, dim] of out_type (float32, float16 or
// bfloat16), written by strata_lookup straight into TensorFlow's output buffer: the op's tensors
// are wrapped as DLTensors, nothing is copied in between.
//
// The table comes from an HPS ps.json (ps_config + model + table_id, like HPS's TF plugin) or a
// HugeCTR sparse folder (table_dir). Each kernel instance opens it once, at construction, and
// frees it with the kernel. `dim` is checked against the table.
//
// On a CUDA build of TensorFlow (GOOGLE_CUDA), a GPU kernel passes TF's compute stream to
// strata_lookup, which enqueues the gather there without synchronising. That path cannot be
// built against tensorflow-cpu and is untested here.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

#include "strata.h"

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "tensorflow/core/util/gpu_kernel_helper.h"
#endif

namespace strata_tf {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

REGISTER_OP("StrataLookup")
    .Input("keys: Tkeys")
    .Output("rows: out_type")
    .Attr("Tkeys: {int32, int64}")
    .Attr("out_type: {float, half, bfloat16} = DT_FLOAT")
    .Attr("dim: int >= 1")
    .Attr("ps_config: string = ''")
    .Attr("model: string = ''")
    .Attr("table_id: int = 0")
    .Attr("table_dir: string = ''")
    .Attr("default_value: float = 0.0")
    .Attr("missing: {'fill', 'error'} = 'fill'")
    .Attr("num_threads: int = 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
        int64_t dim = 0;
        TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
        tensorflow::shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->Concatenate(c->input(0), c->Vector(dim), &out));
        c->set_output(0, out);
        return absl::OkStatus();
    })
    .Doc(R"doc(
Looks keys up in a strata embedding table: one row of `dim` values per key.

The table is model `model`'s table `table_id` of the HPS configuration `ps_config`, or the
HugeCTR sparse folder `table_dir` (opened with `default_value` and `missing`). Missing keys get
the table's default value, or fail the op with NOT_FOUND when `missing` is 'error' (table_dir).
)doc");

// strata_status -> TensorFlow status, with strata's message.
static absl::Status to_status(strata_status s, const std::string &what) {
    if (s == STRATA_OK) return absl::OkStatus();
    std::string msg = what + ": " + strata_status_name(s) + ": " + strata_last_error();
    switch (s) {
        case STRATA_KEY_NOT_FOUND:
            return absl::NotFoundError(msg);
        case STRATA_IO_ERROR:
            return absl::NotFoundError(msg);
        case STRATA_UNSUPPORTED_DEVICE:
            return absl::UnimplementedError(msg);
        case STRATA_OUT_OF_MEMORY:
            return absl::ResourceExhaustedError(msg);
        case STRATA_INTERNAL:
        case STRATA_STORE_ERROR:
            return absl::InternalError(msg);
        default:
            return absl::InvalidArgumentError(msg);
    }
}

static DLDataType dl_dtype(DataType t) {
    switch (t) {
        case tensorflow::DT_INT32: return DLDataType{kDLInt, 32, 1};
        case tensorflow::DT_INT64: return DLDataType{kDLInt, 64, 1};
        case tensorflow::DT_FLOAT: return DLDataType{kDLFloat, 32, 1};
        case tensorflow::DT_HALF: return DLDataType{kDLFloat, 16, 1};
        case tensorflow::DT_BFLOAT16: return DLDataType{kDLBfloat, 16, 1};
        default: return DLDataType{kDLOpaqueHandle, 0, 0};  // refused by strata, with a message
    }
}

// A TensorFlow tensor seen as a DLTensor (TF tensors are dense and row-major).
struct DLView {
    std::vector<int64_t> shape, strides;
    DLTensor t{};
    DLView(const Tensor &x, DLDevice device) {
        const int nd = x.dims();
        shape.resize(nd);
        strides.resize(nd);
        int64_t step = 1;
        for (int i = nd - 1; i >= 0; --i) {
            shape[i] = x.dim_size(i);
            strides[i] = step;
            step *= shape[i] > 0 ? shape[i] : 1;
        }
        t.data = const_cast<void *>(static_cast<const void *>(x.tensor_data().data()));
        t.device = device;
        t.ndim = nd;
        t.dtype = dl_dtype(x.dtype());
        t.shape = shape.data();
        t.strides = strides.data();
        t.byte_offset = 0;
    }
};

class StrataLookupOp : public OpKernel {
   public:
    explicit StrataLookupOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
        std::string ps_config, model, table_dir, missing;
        int64_t table_id = 0;
        float default_value = 0.0f;
        OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("ps_config", &ps_config));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("model", &model));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("table_id", &table_id));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("table_dir", &table_dir));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("default_value", &default_value));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("missing", &missing));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("num_threads", &num_threads_));
        OP_REQUIRES(ctx, ps_config.empty() != table_dir.empty(),
                    absl::InvalidArgumentError("StrataLookup: set exactly one of ps_config (with model and table_id) "
                                               "or table_dir"));
        if (!ps_config.empty()) {
            OP_REQUIRES(ctx, !model.empty(), absl::InvalidArgumentError("StrataLookup: ps_config needs model"));
            OP_REQUIRES_OK(ctx, to_status(strata_server_open(ps_config.c_str(), &server_), "ps_config " + ps_config));
            OP_REQUIRES_OK(ctx, to_status(strata_server_table(server_, model.c_str(), static_cast<int32_t>(table_id),
                                                              &table_),
                                          "model " + model + " table " + std::to_string(table_id)));
        } else {
            strata_table_options opts = strata_table_options_default();
            opts.default_value = default_value;
            opts.missing_key = missing == "error" ? STRATA_MISSING_ERROR : STRATA_MISSING_FILL;
            OP_REQUIRES_OK(ctx, to_status(strata_table_open(table_dir.c_str(), dim_, &opts, &table_),
                                          "table_dir " + table_dir));
        }
        const int64_t table_dim = strata_table_dim(table_);
        OP_REQUIRES(ctx, table_dim == dim_,
                    absl::InvalidArgumentError("StrataLookup: attr dim = " + std::to_string(dim_) +
                                               " but the table has dim " + std::to_string(table_dim)));
    }

    ~StrataLookupOp() override {
        if (server_ != nullptr) {
            strata_server_free(server_);  // frees its tables too
        } else {
            strata_table_free(table_);
        }
    }

    void Compute(OpKernelContext *ctx) override {
        const Tensor &keys = ctx->input(0);
        TensorShape out_shape = keys.shape();
        OP_REQUIRES_OK(ctx, out_shape.AddDimWithStatus(dim_));
        Tensor *out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
        DLDevice device{kDLCPU, 0};
        strata_lookup_options opts = strata_lookup_options_default();
        opts.num_threads = static_cast<int32_t>(num_threads_);
#if GOOGLE_CUDA
        if (ctx->op_device_context() != nullptr && ctx->device()->device_type() == tensorflow::DEVICE_GPU) {
            // TF's compute stream: strata enqueues on it and returns without waiting.
            device = DLDevice{kDLCUDA, ctx->device()->tensorflow_accelerator_device_info()->gpu_id};
            opts.stream = reinterpret_cast<void *>(ctx->eigen_gpu_device().stream());
        }
#endif
        DLView k(keys, device), o(*out, device);
        OP_REQUIRES_OK(ctx, to_status(strata_lookup(table_, &k.t, &o.t, &opts, nullptr), "StrataLookup"));
    }

   private:
    strata_server *server_ = nullptr;
    strata_table *table_ = nullptr;
    int64_t dim_ = 0;
    int64_t num_threads_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("StrataLookup").Device(tensorflow::DEVICE_CPU), StrataLookupOp);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("StrataLookup").Device(tensorflow::DEVICE_GPU), StrataLookupOp);
#endif

}  // namespace strata_tf
