// Two TensorFlow custom ops over strata tables.
//
// StrataLookup looks keys up: one row per key.
//
//   rows = strata_ops.strata_lookup(keys, dim=128, ps_config="ps.json", model="wdl", table_id=0)
//   rows = strata_ops.strata_lookup(keys, dim=128, table_dir="/models/wdl/sparse0")
//
// keys: int32 or int64, any shape. rows: [*keys.shape, dim] of out_type (float32, float16 or
// bfloat16), written by strata_lookup straight into TensorFlow's output buffer: the op's tensors
// are wrapped as DLTensors, nothing is copied in between.
//
// StrataSparseLookup pools the rows of each row of a SparseTensor of ids, as
// tf.nn.embedding_lookup_sparse (and HPS's SparseLookupLayer) do:
//
//   emb = strata_ops.strata_sparse_lookup(sp_ids.indices, sp_ids.values, sp_ids.dense_shape,
//                                         weights=[sp_weights.values],  # or [] for weights 1
//                                         combiner="mean", dim=128, table_dir=...)
//
// indices [N, R] int64 (row-major order: indices[:, 0], the bag of each id, non-decreasing, as
// embedding_lookup_sparse requires), ids [N] int32 or int64, dense_shape [R] int64; weights: an
// empty list, or one [N] float32 tensor (sp_weights.values, in the same order as the ids).
// Output [dense_shape[0], dim] of out_type: one pooled row per row of the SparseTensor, zeros for
// a row without ids (including trailing ones, which embedding_lookup_sparse leaves out). The
// offsets strata_lookup_pooled takes are counted from indices[:, 0]; ids and weights are read
// in place. combiner: "sum" = Σ w·row, "mean" = sum / Σ w, "sqrtn" = sum / √Σ w² (zeros when the
// total is 0, like TF's div_no_nan); a missing id contributes the table's default row.
//
// Both take the table from an HPS ps.json (ps_config + model + table_id, like HPS's TF plugin)
// or a HugeCTR sparse folder (table_dir). Each kernel instance opens it once, at construction,
// and frees it with the kernel (a ps.json's server is shared by every kernel that opens it:
// strata keeps one server per configuration per process). `dim` is checked against the table.
//
// On a CUDA build of TensorFlow (GOOGLE_CUDA), a GPU StrataLookup kernel passes TF's compute
// stream to strata_lookup, which enqueues the gather there without synchronising. That path
// cannot be built against tensorflow-cpu and is untested here. StrataSparseLookup has a CPU
// kernel only (its offsets are counted on the host).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include <cstdint>
#include <memory>
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

// The attrs that name the table, its dim and the output dtype, common to both ops.
#define STRATA_TABLE_ATTRS                                  \
    Attr("Tkeys: {int32, int64}")                           \
        .Attr("out_type: {float, half, bfloat16} = DT_FLOAT") \
        .Attr("dim: int >= 1")                                \
        .Attr("ps_config: string = ''")                       \
        .Attr("model: string = ''")                           \
        .Attr("table_id: int = 0")                            \
        .Attr("table_dir: string = ''")                       \
        .Attr("default_value: float = 0.0")                   \
        .Attr("missing: {'fill', 'error'} = 'fill'")          \
        .Attr("num_threads: int = 0")

REGISTER_OP("StrataLookup")
    .Input("keys: Tkeys")
    .Output("rows: out_type")
    .STRATA_TABLE_ATTRS
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

REGISTER_OP("StrataSparseLookup")
    .Input("indices: int64")
    .Input("ids: Tkeys")
    .Input("dense_shape: int64")
    .Input("weights: num_weights * float")
    .Output("embeddings: out_type")
    .Attr("num_weights: int >= 0")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .STRATA_TABLE_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
        int64_t dim = 0;
        TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
        tensorflow::shape_inference::ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &unused));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
        if (c->num_inputs() > 4) {
            return absl::InvalidArgumentError("StrataSparseLookup: weights: " + std::to_string(c->num_inputs() - 3) +
                                              " tensors; expected none or one (sp_weights.values)");
        }
        // Rows: dense_shape[0] when it is known while building the graph.
        tensorflow::shape_inference::DimensionHandle rows = c->UnknownDim();
        const Tensor *shape = c->input_tensor(2);
        if (shape != nullptr && shape->NumElements() >= 1 && shape->flat<int64_t>()(0) >= 0) {
            rows = c->MakeDim(shape->flat<int64_t>()(0));
        }
        c->set_output(0, c->Matrix(rows, dim));
        return absl::OkStatus();
    })
    .Doc(R"doc(
Pools the rows of a SparseTensor's ids, as tf.nn.embedding_lookup_sparse: one row of `dim`
values per row of the SparseTensor (dense_shape[0] rows).

`indices`, `ids` and `dense_shape` are sp_ids.indices, sp_ids.values and sp_ids.dense_shape,
in row-major order (indices[:, 0] non-decreasing); `weights` is [] or [sp_weights.values].
`combiner`: 'sum', 'mean' (sum / sum of weights) or 'sqrtn' (sum / sqrt of the sum of squared
weights). Rows without ids, and zero weight totals, give zeros. Missing ids contribute the
table's default value, or fail the op with NOT_FOUND when `missing` is 'error' (table_dir).
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

// A kernel that holds one strata table, opened from its attrs at construction: model
// `model`'s table `table_id` of the ps.json `ps_config` (the server, which strata shares between
// every kernel opening that configuration, is freed with the kernel), or the HugeCTR folder
// `table_dir` (memory-mapped). `name` starts every message.
class StrataTableKernel : public OpKernel {
   public:
    StrataTableKernel(OpKernelConstruction *ctx, const char *name) : OpKernel(ctx), name_(name) {
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
                    absl::InvalidArgumentError(name_ + ": set exactly one of ps_config (with model and table_id) "
                                                       "or table_dir"));
        if (!ps_config.empty()) {
            OP_REQUIRES(ctx, !model.empty(), absl::InvalidArgumentError(name_ + ": ps_config needs model"));
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
                    absl::InvalidArgumentError(name_ + ": attr dim = " + std::to_string(dim_) +
                                               " but the table has dim " + std::to_string(table_dim)));
    }

    ~StrataTableKernel() override {
        if (server_ != nullptr) {
            strata_server_free(server_);  // frees its tables too
        } else {
            strata_table_free(table_);
        }
    }

   protected:
    strata_lookup_options lookup_options() const {
        strata_lookup_options opts = strata_lookup_options_default();
        opts.num_threads = static_cast<int32_t>(num_threads_);
        return opts;
    }

    const std::string name_;
    strata_server *server_ = nullptr;
    strata_table *table_ = nullptr;
    int64_t dim_ = 0;
    int64_t num_threads_ = 0;
};

class StrataLookupOp : public StrataTableKernel {
   public:
    explicit StrataLookupOp(OpKernelConstruction *ctx) : StrataTableKernel(ctx, "StrataLookup") {}

    void Compute(OpKernelContext *ctx) override {
        const Tensor &keys = ctx->input(0);
        TensorShape out_shape = keys.shape();
        OP_REQUIRES_OK(ctx, out_shape.AddDimWithStatus(dim_));
        Tensor *out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
        DLDevice device{kDLCPU, 0};
        strata_lookup_options opts = lookup_options();
#if GOOGLE_CUDA
        if (ctx->op_device_context() != nullptr && ctx->device()->device_type() == tensorflow::DEVICE_GPU) {
            // TF's compute stream: strata enqueues on it and returns without waiting.
            device = DLDevice{kDLCUDA, ctx->device()->tensorflow_accelerator_device_info()->gpu_id};
            opts.stream = reinterpret_cast<void *>(ctx->eigen_gpu_device().stream());
        }
#endif
        DLView k(keys, device), o(*out, device);
        OP_REQUIRES_OK(ctx, to_status(strata_lookup(table_, &k.t, &o.t, &opts, nullptr), name_));
    }
};

class StrataSparseLookupOp : public StrataTableKernel {
   public:
    explicit StrataSparseLookupOp(OpKernelConstruction *ctx) : StrataTableKernel(ctx, "StrataSparseLookup") {
        std::string combiner;
        OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
        pooling_ = combiner == "sum" ? STRATA_POOL_SUM : combiner == "sqrtn" ? STRATA_POOL_SQRTN : STRATA_POOL_MEAN;
        int64_t num_weights = 0;
        OP_REQUIRES_OK(ctx, ctx->GetAttr("num_weights", &num_weights));
        OP_REQUIRES(ctx, num_weights <= 1,
                    absl::InvalidArgumentError(name_ + ": weights: " + std::to_string(num_weights) +
                                               " tensors; expected none or one (sp_weights.values)"));
    }

    void Compute(OpKernelContext *ctx) override {
        const Tensor &indices = ctx->input(0), &ids = ctx->input(1), &dense_shape = ctx->input(2);
        OP_REQUIRES(ctx, indices.dims() == 2 && indices.dim_size(1) >= 1,
                    absl::InvalidArgumentError(name_ + ": indices: shape " + indices.shape().DebugString() +
                                               "; expected [N, rank] (sp_ids.indices)"));
        const int64_t n = indices.dim_size(0), rank = indices.dim_size(1);
        OP_REQUIRES(ctx, ids.dims() == 1 && ids.dim_size(0) == n,
                    absl::InvalidArgumentError(name_ + ": ids: shape " + ids.shape().DebugString() + "; expected [" +
                                               std::to_string(n) + "], one id per row of indices (sp_ids.values)"));
        OP_REQUIRES(ctx, dense_shape.dims() == 1 && dense_shape.dim_size(0) == rank,
                    absl::InvalidArgumentError(name_ + ": dense_shape: shape " + dense_shape.shape().DebugString() +
                                               "; expected [" + std::to_string(rank) + "], the rank of indices"));
        const int64_t rows = dense_shape.flat<int64_t>()(0);
        OP_REQUIRES(ctx, rows >= 0,
                    absl::InvalidArgumentError(name_ + ": dense_shape[0] = " + std::to_string(rows) +
                                               "; expected >= 0"));
        // offsets[b + 1] - offsets[b] = the number of ids in row b; the rows of indices must be
        // sorted (sp_ids in row-major order, as embedding_lookup_sparse requires).
        Tensor offsets_t;
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({rows + 1}), &offsets_t));
        auto offsets = offsets_t.flat<int64_t>();
        auto idx = indices.matrix<int64_t>();
        int64_t row = 0;
        offsets(0) = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = idx(i, 0);
            OP_REQUIRES(ctx, r >= row && r < rows,
                        absl::InvalidArgumentError(
                            name_ + ": indices[" + std::to_string(i) + ", 0] = " + std::to_string(r) +
                            (r >= rows ? "; expected < dense_shape[0] = " + std::to_string(rows)
                                       : " after " + std::to_string(row) +
                                             "; expected the rows of sp_ids in order (tf.sparse.reorder)")));
            while (row < r) offsets(++row) = i;
        }
        while (row < rows) offsets(++row) = n;

        Tensor *out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, dim_}), &out));
        const DLDevice host{kDLCPU, 0};
        DLView k(ids, host), off(offsets_t, host), o(*out, host);
        std::unique_ptr<DLView> w;
        if (ctx->num_inputs() > 3) w = std::make_unique<DLView>(ctx->input(3), host);
        strata_lookup_options opts = lookup_options();
        OP_REQUIRES_OK(ctx, to_status(strata_lookup_pooled(table_, &k.t, &off.t, w ? &w->t : nullptr, pooling_, &o.t,
                                                           &opts, nullptr),
                                      name_));
    }

   private:
    int32_t pooling_ = STRATA_POOL_MEAN;
};

REGISTER_KERNEL_BUILDER(Name("StrataLookup").Device(tensorflow::DEVICE_CPU), StrataLookupOp);
REGISTER_KERNEL_BUILDER(Name("StrataSparseLookup").Device(tensorflow::DEVICE_CPU), StrataSparseLookupOp);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("StrataLookup").Device(tensorflow::DEVICE_GPU), StrataLookupOp);
#endif

}  // namespace strata_tf
