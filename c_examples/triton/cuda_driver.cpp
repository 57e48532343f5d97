#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace strata_triton {

namespace {

// CUresult is an int; CUdevice an int; CUcontext and CUstream pointers.
using CuInit = int (*)(unsigned);
using CuDeviceGet = int (*)(int *, int);
using CuPrimaryCtxRetain = int (*)(void **, int);
using CuPrimaryCtxRelease = int (*)(int);
using CuCtxPush = int (*)(void *);
using CuCtxPop = int (*)(void **);
using CuStreamCreate = int (*)(void **, unsigned);
using CuStreamDestroy = int (*)(void *);
using CuStreamSynchronize = int (*)(void *);
using CuMemcpyDtoHAsync = int (*)(void *, uint64_t, size_t, void *);
using CuGetErrorString = int (*)(int, const char **);

constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING

struct Driver {
    bool loaded = false;
    std::string error;
    CuInit init = nullptr;
    CuDeviceGet device_get = nullptr;
    CuPrimaryCtxRetain retain = nullptr;
    CuPrimaryCtxRelease release = nullptr;
    CuCtxPush push = nullptr;
    CuCtxPop pop = nullptr;
    CuStreamCreate stream_create = nullptr;
    CuStreamDestroy stream_destroy = nullptr;
    CuStreamSynchronize stream_sync = nullptr;
    CuMemcpyDtoHAsync copy_dtoh = nullptr;
    CuGetErrorString error_string = nullptr;
};

template <typename F>
bool load_symbol(void *lib, const char *name, F *out, std::string *error) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr) {
        *error = std::string("libcuda.so.1 has no ") + name;
        return false;
    }
    return true;
}

const Driver &driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            d.error = "the CUDA driver (libcuda.so.1) cannot be loaded";
            return;
        }
        bool ok = load_symbol(lib, "cuInit", &d.init, &d.error) &&
                  load_symbol(lib, "cuDeviceGet", &d.device_get, &d.error) &&
                  load_symbol(lib, "cuDevicePrimaryCtxRetain", &d.retain, &d.error) &&
                  load_symbol(lib, "cuDevicePrimaryCtxRelease_v2", &d.release, &d.error) &&
                  load_symbol(lib, "cuCtxPushCurrent_v2", &d.push, &d.error) &&
                  load_symbol(lib, "cuCtxPopCurrent_v2", &d.pop, &d.error) &&
                  load_symbol(lib, "cuStreamCreate", &d.stream_create, &d.error) &&
                  load_symbol(lib, "cuStreamDestroy_v2", &d.stream_destroy, &d.error) &&
                  load_symbol(lib, "cuStreamSynchronize", &d.stream_sync, &d.error) &&
                  load_symbol(lib, "cuMemcpyDtoHAsync_v2", &d.copy_dtoh, &d.error) &&
                  load_symbol(lib, "cuGetErrorString", &d.error_string, &d.error);
        if (!ok) return;
        if (d.init(0) != 0) {
            d.error = "cuInit failed (no CUDA device?)";
            return;
        }
        d.loaded = true;
    });
    return d;
}

bool check(int result, const char *call, std::string *error) {
    if (result == 0) return true;
    const char *text = nullptr;
    if (driver().error_string != nullptr) driver().error_string(result, &text);
    *error = std::string(call) + " failed: CUDA error " + std::to_string(result) + (text ? std::string(" (") + text + ")" : "");
    return false;
}

// Makes `ctx` current for the scope (the instance thread may have another one current).
class ContextScope {
  public:
    explicit ContextScope(void *ctx) : ok_(driver().push(ctx) == 0) {}
    ~ContextScope() {
        if (ok_) {
            void *popped = nullptr;
            driver().pop(&popped);
        }
    }
    bool ok() const { return ok_; }

  private:
    bool ok_;
};

}  // namespace

CudaStream::~CudaStream() {
    const Driver &d = driver();
    if (!d.loaded) return;
    if (stream_ != nullptr) {
        ContextScope scope(context_);
        d.stream_sync(stream_);
        d.stream_destroy(stream_);
    }
    if (retained_) d.release(device_);
}

bool CudaStream::create(int32_t device_id, std::string *error) {
    const Driver &d = driver();
    if (!d.loaded) {
        *error = d.error;
        return false;
    }
    int dev = 0;
    if (!check(d.device_get(&dev, device_id), "cuDeviceGet", error)) return false;
    if (!check(d.retain(&context_, dev), "cuDevicePrimaryCtxRetain", error)) return false;
    device_ = dev;
    retained_ = true;
    ContextScope scope(context_);
    if (!scope.ok()) {
        *error = "cuCtxPushCurrent failed";
        return false;
    }
    return check(d.stream_create(&stream_, kStreamNonBlocking), "cuStreamCreate", error);
}

bool CudaStream::synchronize(std::string *error) {
    ContextScope scope(context_);
    return check(driver().stream_sync(stream_), "cuStreamSynchronize", error);
}

bool CudaStream::copy_to_host(void *dst, const void *src, size_t bytes, std::string *error) {
    ContextScope scope(context_);
    if (!check(driver().copy_dtoh(dst, reinterpret_cast<uint64_t>(src), bytes, stream_), "cuMemcpyDtoHAsync", error))
        return false;
    return check(driver().stream_sync(stream_), "cuStreamSynchronize", error);
}

}  // namespace strata_triton
