// StrataLookup: a TensorRT IPluginV3 plugin whose enqueue() looks keys up in a strata table on
// TensorRT's stream, in the manner of HPS's HPS_TRT plugin.
//
// Fields (PluginField, as HPS_TRT's): ps_config_file (kCHAR, an HPS ps.json), model_name
// (kCHAR), table_id (kINT32), emb_vec_size (kINT32, the table's dim), and optionally out_type
// (kINT32: a nvinfer1::DataType value, kFLOAT by default; kHALF and kBF16 also work) and
// combiner (kCHAR: "none", the default, or "sum", "mean", "sqrtn"; or kINT32, the STRATA_POOL_*
// value).
// Input 0: keys, kINT32 or kINT64. combiner none: any shape; output 0: keys' shape +
// [emb_vec_size]. combiner sum | mean | sqrtn (fixed hotness): keys [B, L]; output 0
// [B, emb_vec_size], each sample's L rows pooled by strata_lookup_pooled (mean = sum / L,
// sqrtn = sum / sqrt(L), as TensorFlow's embedding_lookup_sparse combiners).
//
// Built only when TensorRT's headers are found (CMake option STRATA_TENSORRT). The mapping of
// TensorRT's tensors to DLPack lives in trt_dlpack.cpp, which the tests build and run without
// TensorRT; this file has not been compiled on a machine without TensorRT.
#include <NvInferRuntime.h>
#include <NvInferRuntimePlugin.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata.h"
#include "trt_dlpack.h"

namespace strata_trt {

using namespace nvinfer1;

static constexpr char const *kName = "StrataLookup";
static constexpr char const *kVersion = "1";

// The server table a plugin and its clones share; freed with the last of them (trt_dlpack.h).
using Shared = ServerTable;

struct Config {
    std::string ps_config_file, model_name;
    int32_t table_id = 0, emb_vec_size = 0;
    int32_t out_type = static_cast<int32_t>(nvinfer1::DataType::kFLOAT);
    Combiner combiner = Combiner::kNONE;
    std::string combiner_text = "none";  // the serialized field
};

// One per layer (createPlugin); every layer over one ps.json holds a handle of the same server.
static std::shared_ptr<Shared> open_table(Config const &c) {
    std::string error;
    std::shared_ptr<Shared> shared = open_server_table(c.ps_config_file, c.model_name, c.table_id, c.emb_vec_size, &error);
    if (shared == nullptr) std::fprintf(stderr, "StrataLookup: %s\n", error.c_str());
    return shared;
}

class StrataLookupPlugin : public IPluginV3, public IPluginV3OneCore, public IPluginV3OneBuild, public IPluginV3OneRuntime {
   public:
    StrataLookupPlugin(Config config, std::shared_ptr<Shared> shared) : config_(std::move(config)), shared_(std::move(shared)) {
        fields_.emplace_back(PluginField{"ps_config_file", config_.ps_config_file.c_str(), PluginFieldType::kCHAR,
                                         static_cast<int32_t>(config_.ps_config_file.size() + 1)});
        fields_.emplace_back(PluginField{"model_name", config_.model_name.c_str(), PluginFieldType::kCHAR,
                                         static_cast<int32_t>(config_.model_name.size() + 1)});
        fields_.emplace_back(PluginField{"table_id", &config_.table_id, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"emb_vec_size", &config_.emb_vec_size, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"out_type", &config_.out_type, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"combiner", config_.combiner_text.c_str(), PluginFieldType::kCHAR,
                                         static_cast<int32_t>(config_.combiner_text.size() + 1)});
        collection_.nbFields = static_cast<int32_t>(fields_.size());
        collection_.fields = fields_.data();
    }

    // IPluginV3
    IPluginCapability *getCapabilityInterface(PluginCapabilityType type) noexcept override {
        switch (type) {
            case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore *>(this);
            case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild *>(this);
            case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime *>(this);
        }
        return nullptr;
    }
    IPluginV3 *clone() noexcept override { return new (std::nothrow) StrataLookupPlugin(config_, shared_); }

    // IPluginV3OneCore
    char const *getPluginName() const noexcept override { return kName; }
    char const *getPluginVersion() const noexcept override { return kVersion; }
    char const *getPluginNamespace() const noexcept override { return ""; }

    // IPluginV3OneBuild
    int32_t configurePlugin(DynamicPluginTensorDesc const *, int32_t nbInputs, DynamicPluginTensorDesc const *,
                            int32_t nbOutputs) noexcept override {
        return nbInputs == 1 && nbOutputs == 1 ? 0 : 1;
    }
    int32_t getOutputDataTypes(nvinfer1::DataType *outputTypes, int32_t nbOutputs, nvinfer1::DataType const *,
                               int32_t) const noexcept override {
        if (nbOutputs != 1) return 1;
        outputTypes[0] = static_cast<nvinfer1::DataType>(config_.out_type);
        return 0;
    }
    int32_t getOutputShapes(DimsExprs const *inputs, int32_t nbInputs, DimsExprs const *, int32_t, DimsExprs *outputs,
                            int32_t nbOutputs, IExprBuilder &exprBuilder) noexcept override {
        if (nbInputs != 1 || nbOutputs != 1 || inputs[0].nbDims >= kMaxDims) return 1;
        if (config_.combiner != Combiner::kNONE) {
            // Fixed hotness: keys [B, L] -> [B, emb_vec_size].
            if (inputs[0].nbDims != 2) {
                std::fprintf(stderr, "StrataLookup: combiner %s needs keys [B, L]; got %d dims\n",
                             combiner_name(config_.combiner), inputs[0].nbDims);
                return 1;
            }
            outputs[0].nbDims = 2;
            outputs[0].d[0] = inputs[0].d[0];
            outputs[0].d[1] = exprBuilder.constant(config_.emb_vec_size);
            return 0;
        }
        outputs[0].nbDims = inputs[0].nbDims + 1;
        for (int32_t i = 0; i < inputs[0].nbDims; i++) outputs[0].d[i] = inputs[0].d[i];
        outputs[0].d[inputs[0].nbDims] = exprBuilder.constant(config_.emb_vec_size);
        return 0;
    }
    bool supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const *inOut, int32_t, int32_t) noexcept override {
        PluginTensorDesc const &d = inOut[pos].desc;
        if (d.format != TensorFormat::kLINEAR) return false;
        if (pos == 0) return d.type == nvinfer1::DataType::kINT32 || d.type == nvinfer1::DataType::kINT64;
        return d.type == static_cast<nvinfer1::DataType>(config_.out_type);
    }
    int32_t getNbOutputs() const noexcept override { return 1; }

    // IPluginV3OneRuntime
    int32_t onShapeChange(PluginTensorDesc const *, int32_t nbInputs, PluginTensorDesc const *,
                          int32_t nbOutputs) noexcept override {
        return nbInputs == 1 && nbOutputs == 1 ? 0 : 1;
    }
    int32_t enqueue(PluginTensorDesc const *inputDesc, PluginTensorDesc const *outputDesc, void const *const *inputs,
                    void *const *outputs, void *, cudaStream_t stream) noexcept override {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess) return 1;
        TensorDesc keys = describe(inputDesc[0], inputs[0], device), out = describe(outputDesc[0], outputs[0], device);
        std::string error;
        // strata enqueues the gather (pooled or not) on TensorRT's stream and returns without waiting.
        strata_status s = run(shared_->table, config_.combiner, keys, out, reinterpret_cast<void *>(stream), 0, &error);
        if (s != STRATA_OK) {
            std::fprintf(stderr, "StrataLookup::enqueue: %s\n", error.c_str());
            return 1;
        }
        return 0;
    }
    IPluginV3 *attachToContext(IPluginResourceContext *) noexcept override { return clone(); }
    PluginFieldCollection const *getFieldsToSerialize() noexcept override { return &collection_; }

   private:
    static TensorDesc describe(PluginTensorDesc const &d, void const *data, int device) {
        TensorDesc t;
        t.dims.nbDims = d.dims.nbDims;
        for (int32_t i = 0; i < d.dims.nbDims && i < kMaxDims; i++) t.dims.d[i] = d.dims.d[i];
        t.type = static_cast<strata_trt::DataType>(static_cast<int32_t>(d.type));
        t.data = data;
        t.location = Location::kDevice;
        t.device_id = device;
        return t;
    }

    Config config_;
    std::shared_ptr<Shared> shared_;
    std::vector<PluginField> fields_;
    PluginFieldCollection collection_{};
};

class StrataLookupPluginCreator : public IPluginCreatorV3One {
   public:
    StrataLookupPluginCreator() {
        fields_.emplace_back(PluginField{"ps_config_file", nullptr, PluginFieldType::kCHAR, 0});
        fields_.emplace_back(PluginField{"model_name", nullptr, PluginFieldType::kCHAR, 0});
        fields_.emplace_back(PluginField{"table_id", nullptr, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"emb_vec_size", nullptr, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"out_type", nullptr, PluginFieldType::kINT32, 1});
        fields_.emplace_back(PluginField{"combiner", nullptr, PluginFieldType::kCHAR, 0});
        collection_.nbFields = static_cast<int32_t>(fields_.size());
        collection_.fields = fields_.data();
    }
    IPluginV3 *createPlugin(char const *, PluginFieldCollection const *fc, TensorRTPhase) noexcept override {
        Config c;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; i++) {
            PluginField const &f = fc->fields[i];
            if (f.data == nullptr) continue;
            std::string name = f.name;
            if (name == "ps_config_file") {
                c.ps_config_file.assign(static_cast<char const *>(f.data), strnlen(static_cast<char const *>(f.data), f.length));
            } else if (name == "model_name") {
                c.model_name.assign(static_cast<char const *>(f.data), strnlen(static_cast<char const *>(f.data), f.length));
            } else if (name == "table_id") {
                c.table_id = *static_cast<int32_t const *>(f.data);
            } else if (name == "emb_vec_size") {
                c.emb_vec_size = *static_cast<int32_t const *>(f.data);
            } else if (name == "out_type") {
                c.out_type = *static_cast<int32_t const *>(f.data);
            } else if (name == "combiner") {
                std::string why;
                if (f.type == PluginFieldType::kINT32) {
                    const int32_t v = *static_cast<int32_t const *>(f.data);
                    why = v >= 0 && v <= static_cast<int32_t>(Combiner::kSQRTN)
                              ? ""
                              : "combiner: " + std::to_string(v) + "; expected 0..3 (none, sum, mean, sqrtn)";
                    if (why.empty()) c.combiner = static_cast<Combiner>(v);
                } else {
                    why = parse_combiner(static_cast<char const *>(f.data), f.length, &c.combiner);
                }
                if (!why.empty()) {
                    std::fprintf(stderr, "StrataLookup: %s\n", why.c_str());
                    return nullptr;
                }
                c.combiner_text = combiner_name(c.combiner);
            }
        }
        if (c.ps_config_file.empty() || c.model_name.empty() || c.emb_vec_size <= 0) {
            std::fprintf(stderr, "StrataLookup: needs ps_config_file, model_name and emb_vec_size > 0\n");
            return nullptr;
        }
        std::shared_ptr<Shared> shared = open_table(c);
        if (!shared) return nullptr;
        return new (std::nothrow) StrataLookupPlugin(c, shared);
    }
    PluginFieldCollection const *getFieldNames() noexcept override { return &collection_; }
    char const *getPluginName() const noexcept override { return kName; }
    char const *getPluginVersion() const noexcept override { return kVersion; }
    char const *getPluginNamespace() const noexcept override { return ""; }

   private:
    std::vector<PluginField> fields_;
    PluginFieldCollection collection_{};
};

}  // namespace strata_trt

// The entry points TensorRT looks for in a plugin library (IPluginRegistry::loadLibrary,
// trtexec --dynamicPlugins).
extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder *) {}

extern "C" nvinfer1::IPluginCreatorInterface *const *getCreators(int32_t &nbCreators) {
    static strata_trt::StrataLookupPluginCreator creator;
    static nvinfer1::IPluginCreatorInterface *const creators[] = {&creator};
    nbCreators = 1;
    return creators;
}
