// The few CUDA driver calls a KIND_GPU instance needs (its own stream, a wait for it, a copy of a
// small device tensor to the host), loaded from libcuda.so.1 at run time so the backend builds and
// loads without a CUDA toolkit. The context is the device's primary context, the one strata and
// Triton's other backends use.
#ifndef STRATA_TRITON_CUDA_DRIVER_H
#define STRATA_TRITON_CUDA_DRIVER_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata_triton {

class CudaStream {
  public:
    CudaStream() = default;
    CudaStream(const CudaStream &) = delete;
    CudaStream &operator=(const CudaStream &) = delete;
    ~CudaStream();

    // Retains device `device_id`'s primary context and creates a non-blocking stream on it.
    bool create(int32_t device_id, std::string *error);
    // The stream as strata takes it (`strata_lookup_options.stream`).
    void *handle() const { return stream_; }
    bool synchronize(std::string *error);
    // Copies `bytes` from device memory to the host (synchronously, on this stream).
    bool copy_to_host(void *dst, const void *src, size_t bytes, std::string *error);

  private:
    void *context_ = nullptr;
    void *stream_ = nullptr;
    int device_ = 0;
    bool retained_ = false;
};

}  // namespace strata_triton

#endif  // STRATA_TRITON_CUDA_DRIVER_H
