// TRITONBACKEND_Initialize refuses a server whose backend API it was not written for, with a
// message that says which versions: this program stands in for tritonserver. It defines the few
// Triton functions the backend calls before the check, reports the API version given on the
// command line, loads libtriton_strata.so (lazily, so the rest of the Triton API may stay
// undefined) and calls TRITONBACKEND_Initialize.
//
//   test_api_version <path/to/libtriton_strata.so>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "triton_api.h"

namespace {
uint32_t g_major = 1, g_minor = 19;
}

struct TRITONSERVER_Error {
    TRITONSERVER_Error_Code code;
    std::string message;
};

extern "C" {
__attribute__((visibility("default"))) TRITONSERVER_Error *TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code,
                                                                                  const char *msg) {
    return new TRITONSERVER_Error{code, msg};
}
__attribute__((visibility("default"))) void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *e) { delete e; }
__attribute__((visibility("default"))) const char *TRITONSERVER_ErrorMessage(TRITONSERVER_Error *e) {
    return e->message.c_str();
}
__attribute__((visibility("default"))) TRITONSERVER_Error *TRITONBACKEND_BackendName(TRITONBACKEND_Backend *,
                                                                                     const char **name) {
    *name = "strata";
    return nullptr;
}
__attribute__((visibility("default"))) TRITONSERVER_Error *TRITONBACKEND_ApiVersion(uint32_t *major, uint32_t *minor) {
    *major = g_major;
    *minor = g_minor;
    return nullptr;
}
}

static int expect_refusal(void *lib, uint32_t major, uint32_t minor) {
    g_major = major;
    g_minor = minor;
    auto init = reinterpret_cast<TRITONSERVER_Error *(*)(TRITONBACKEND_Backend *)>(dlsym(lib, "TRITONBACKEND_Initialize"));
    TRITONSERVER_Error *err = init(nullptr);
    if (err == nullptr) {
        std::fprintf(stderr, "FAIL: backend API %u.%u was accepted\n", major, minor);
        return 1;
    }
    const std::string want = "offers " + std::to_string(major) + "." + std::to_string(minor);
    const bool ok = err->code == TRITONSERVER_ERROR_UNSUPPORTED && err->message.find(want) != std::string::npos &&
                    err->message.find("1.19") != std::string::npos;
    std::printf("%s: API %u.%u refused: %s\n", ok ? "ok" : "FAIL", major, minor, err->message.c_str());
    delete err;
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s path/to/libtriton_strata.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) {
        std::fprintf(stderr, "FAIL: %s\n", dlerror());
        return 1;
    }
    int failures = expect_refusal(lib, 2, 0) + expect_refusal(lib, 0, 30) + expect_refusal(lib, 1, 18);
    return failures == 0 ? 0 : 1;
}
