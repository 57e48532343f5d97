// The part of Triton Inference Server's C API that the strata backend uses, declared here
// because no package ships Triton's headers. Written from the documented API of
// triton-inference-server/core (tritonserver.h: server C API 1.34, tritonbackend.h: backend API
// 1.19, the versions tritonserver 2.51.0 reports). Only what libtriton_strata.so calls or
// implements is declared; the enum values are the documented ones, in their documented order.
//
// The functions are resolved when tritonserver loads the backend (libtritonserver is already in
// the process), so the backend library does not link against it.
#ifndef STRATA_TRITON_API_H
#define STRATA_TRITON_API_H

#include <cstddef>
#include <cstdint>

extern "C" {

// The backend API version this backend was written for. The server's must have the same major
// version and at least this minor version.
constexpr uint32_t kTritonBackendApiMajor = 1;
constexpr uint32_t kTritonBackendApiMinor = 19;

// ---- opaque objects ------------------------------------------------------------------------
struct TRITONSERVER_Error;
struct TRITONSERVER_Message;
struct TRITONSERVER_Parameter;
struct TRITONSERVER_MetricFamily;
struct TRITONSERVER_Metric;
struct TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Output;

// ---- enums (values as documented; the order is the ABI) ------------------------------------
typedef enum TRITONSERVER_datatype_enum {
  TRITONSERVER_TYPE_INVALID,
  TRITONSERVER_TYPE_BOOL,
  TRITONSERVER_TYPE_UINT8,
  TRITONSERVER_TYPE_UINT16,
  TRITONSERVER_TYPE_UINT32,
  TRITONSERVER_TYPE_UINT64,
  TRITONSERVER_TYPE_INT8,
  TRITONSERVER_TYPE_INT16,
  TRITONSERVER_TYPE_INT32,
  TRITONSERVER_TYPE_INT64,
  TRITONSERVER_TYPE_FP16,
  TRITONSERVER_TYPE_FP32,
  TRITONSERVER_TYPE_FP64,
  TRITONSERVER_TYPE_BYTES,
  TRITONSERVER_TYPE_BF16
} TRITONSERVER_DataType;

typedef enum TRITONSERVER_memorytype_enum {
  TRITONSERVER_MEMORY_CPU,
  TRITONSERVER_MEMORY_CPU_PINNED,
  TRITONSERVER_MEMORY_GPU
} TRITONSERVER_MemoryType;

typedef enum TRITONSERVER_parametertype_enum {
  TRITONSERVER_PARAMETER_STRING,
  TRITONSERVER_PARAMETER_INT,
  TRITONSERVER_PARAMETER_BOOL,
  TRITONSERVER_PARAMETER_DOUBLE,
  TRITONSERVER_PARAMETER_BYTES
} TRITONSERVER_ParameterType;

typedef enum TRITONSERVER_instancegroupkind_enum {
  TRITONSERVER_INSTANCEGROUPKIND_AUTO,
  TRITONSERVER_INSTANCEGROUPKIND_CPU,
  TRITONSERVER_INSTANCEGROUPKIND_GPU,
  TRITONSERVER_INSTANCEGROUPKIND_MODEL
} TRITONSERVER_InstanceGroupKind;

typedef enum TRITONSERVER_loglevel_enum {
  TRITONSERVER_LOG_INFO,
  TRITONSERVER_LOG_WARN,
  TRITONSERVER_LOG_ERROR,
  TRITONSERVER_LOG_VERBOSE
} TRITONSERVER_LogLevel;

typedef enum TRITONSERVER_errorcode_enum {
  TRITONSERVER_ERROR_UNKNOWN,
  TRITONSERVER_ERROR_INTERNAL,
  TRITONSERVER_ERROR_NOT_FOUND,
  TRITONSERVER_ERROR_INVALID_ARG,
  TRITONSERVER_ERROR_UNAVAILABLE,
  TRITONSERVER_ERROR_UNSUPPORTED,
  TRITONSERVER_ERROR_ALREADY_EXISTS,
  TRITONSERVER_ERROR_CANCELLED
} TRITONSERVER_Error_Code;

typedef enum TRITONSERVER_metrickind_enum {
  TRITONSERVER_METRIC_KIND_COUNTER,
  TRITONSERVER_METRIC_KIND_GAUGE,
  TRITONSERVER_METRIC_KIND_HISTOGRAM
} TRITONSERVER_MetricKind;

typedef enum TRITONBACKEND_artifacttype_enum { TRITONBACKEND_ARTIFACT_FILESYSTEM } TRITONBACKEND_ArtifactType;

constexpr uint32_t kTritonRequestReleaseAll = 1;     // TRITONSERVER_REQUEST_RELEASE_ALL
constexpr uint32_t kTritonResponseCompleteFinal = 1;  // TRITONSERVER_RESPONSE_COMPLETE_FINAL

// ---- server API ----------------------------------------------------------------------------
TRITONSERVER_Error *TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char *msg);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *error);
const char *TRITONSERVER_ErrorMessage(TRITONSERVER_Error *error);

bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level);
TRITONSERVER_Error *TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char *filename, int line,
                                            const char *msg);

TRITONSERVER_Error *TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message *message, const char **base,
                                                        size_t *byte_size);
TRITONSERVER_Error *TRITONSERVER_MessageDelete(TRITONSERVER_Message *message);

TRITONSERVER_Parameter *TRITONSERVER_ParameterNew(const char *name, TRITONSERVER_ParameterType type,
                                                  const void *value);
void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter *parameter);

TRITONSERVER_Error *TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily **family, TRITONSERVER_MetricKind kind,
                                                 const char *name, const char *description);
TRITONSERVER_Error *TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily *family);
TRITONSERVER_Error *TRITONSERVER_MetricNew(TRITONSERVER_Metric **metric, TRITONSERVER_MetricFamily *family,
                                           const TRITONSERVER_Parameter **labels, uint64_t label_count);
TRITONSERVER_Error *TRITONSERVER_MetricDelete(TRITONSERVER_Metric *metric);
TRITONSERVER_Error *TRITONSERVER_MetricIncrement(TRITONSERVER_Metric *metric, double value);
TRITONSERVER_Error *TRITONSERVER_MetricSet(TRITONSERVER_Metric *metric, double value);

// ---- backend API: called by the backend ----------------------------------------------------
TRITONSERVER_Error *TRITONBACKEND_ApiVersion(uint32_t *major, uint32_t *minor);
TRITONSERVER_Error *TRITONBACKEND_BackendName(TRITONBACKEND_Backend *backend, const char **name);
TRITONSERVER_Error *TRITONBACKEND_BackendConfig(TRITONBACKEND_Backend *backend, TRITONSERVER_Message **config);
TRITONSERVER_Error *TRITONBACKEND_BackendState(TRITONBACKEND_Backend *backend, void **state);
TRITONSERVER_Error *TRITONBACKEND_BackendSetState(TRITONBACKEND_Backend *backend, void *state);

TRITONSERVER_Error *TRITONBACKEND_ModelName(TRITONBACKEND_Model *model, const char **name);
TRITONSERVER_Error *TRITONBACKEND_ModelVersion(TRITONBACKEND_Model *model, uint64_t *version);
TRITONSERVER_Error *TRITONBACKEND_ModelRepository(TRITONBACKEND_Model *model, TRITONBACKEND_ArtifactType *type,
                                                  const char **location);
TRITONSERVER_Error *TRITONBACKEND_ModelConfig(TRITONBACKEND_Model *model, uint32_t config_version,
                                              TRITONSERVER_Message **config);
TRITONSERVER_Error *TRITONBACKEND_ModelBackend(TRITONBACKEND_Model *model, TRITONBACKEND_Backend **backend);
TRITONSERVER_Error *TRITONBACKEND_ModelState(TRITONBACKEND_Model *model, void **state);
TRITONSERVER_Error *TRITONBACKEND_ModelSetState(TRITONBACKEND_Model *model, void *state);

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance *instance, const char **name);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance *instance,
                                                    TRITONSERVER_InstanceGroupKind *kind);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceDeviceId(TRITONBACKEND_ModelInstance *instance, int32_t *device_id);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance *instance,
                                                     TRITONBACKEND_Model **model);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance *instance, void **state);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance *instance, void *state);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance *instance,
                                                                TRITONBACKEND_Request *request, bool success,
                                                                uint64_t exec_start_ns, uint64_t compute_start_ns,
                                                                uint64_t compute_end_ns, uint64_t exec_end_ns);
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance *instance,
                                                                     uint64_t batch_size, uint64_t exec_start_ns,
                                                                     uint64_t compute_start_ns,
                                                                     uint64_t compute_end_ns, uint64_t exec_end_ns);

TRITONSERVER_Error *TRITONBACKEND_RequestInput(TRITONBACKEND_Request *request, const char *name,
                                               TRITONBACKEND_Input **input);
TRITONSERVER_Error *TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request *request, uint32_t *count);
TRITONSERVER_Error *TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request *request, uint32_t index,
                                                    const char **name);
TRITONSERVER_Error *TRITONBACKEND_RequestRelease(TRITONBACKEND_Request *request, uint32_t release_flags);

TRITONSERVER_Error *TRITONBACKEND_InputProperties(TRITONBACKEND_Input *input, const char **name,
                                                  TRITONSERVER_DataType *datatype, const int64_t **shape,
                                                  uint32_t *dims_count, uint64_t *byte_size,
                                                  uint32_t *buffer_count);
TRITONSERVER_Error *TRITONBACKEND_InputBuffer(TRITONBACKEND_Input *input, uint32_t index, const void **buffer,
                                              uint64_t *buffer_byte_size, TRITONSERVER_MemoryType *memory_type,
                                              int64_t *memory_type_id);

TRITONSERVER_Error *TRITONBACKEND_ResponseNew(TRITONBACKEND_Response **response, TRITONBACKEND_Request *request);
TRITONSERVER_Error *TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response *response);
TRITONSERVER_Error *TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response *response, TRITONBACKEND_Output **output,
                                                 const char *name, TRITONSERVER_DataType datatype,
                                                 const int64_t *shape, uint32_t dims_count);
TRITONSERVER_Error *TRITONBACKEND_ResponseSetIntParameter(TRITONBACKEND_Response *response, const char *name,
                                                          int64_t value);
TRITONSERVER_Error *TRITONBACKEND_ResponseSend(TRITONBACKEND_Response *response, uint32_t send_flags,
                                               TRITONSERVER_Error *error);
TRITONSERVER_Error *TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output *output, void **buffer, uint64_t byte_size,
                                               TRITONSERVER_MemoryType *memory_type, int64_t *memory_type_id);

// ---- backend API: implemented by the backend (exported from libtriton_strata.so) -----------
#define STRATA_TRITON_EXPORT __attribute__((visibility("default")))
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_Initialize(TRITONBACKEND_Backend *backend);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_Finalize(TRITONBACKEND_Backend *backend);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model *model);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model *model);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance *instance);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance *instance);
STRATA_TRITON_EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                                            TRITONBACKEND_Request **requests,
                                                                            uint32_t request_count);

}  // extern "C"

#endif  // STRATA_TRITON_API_H
