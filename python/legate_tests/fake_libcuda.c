/* A stand-in libcuda.so.1 for machines without the NVIDIA driver: every call says "no device". */
#include <stddef.h>
#include <string.h>
#define NO_DEVICE 100
static int no_device(void) { return NO_DEVICE; }
int cuInit(unsigned flags) { (void)flags; return NO_DEVICE; }
int cuDriverGetVersion(int *v) { if (v) *v = 0; return NO_DEVICE; }
int cuDeviceGetCount(int *n) { if (n) *n = 0; return NO_DEVICE; }
int cuGetErrorName(int e, const char **s);
int cuGetErrorString(int e, const char **s);
int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)ver; (void)flags;
    if (pfn) *pfn = (void *)no_device;
    if (pfn && sym && strcmp(sym, "cuGetErrorName") == 0) *pfn = (void *)cuGetErrorName;
    if (pfn && sym && strcmp(sym, "cuGetErrorString") == 0) *pfn = (void *)cuGetErrorString;
    if (status) *status = 0;
    return 0;
}
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    return cuGetProcAddress(sym, pfn, ver, flags, status);
}
int cuGetErrorName(int e, const char **s) { (void)e; if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; if (s) *s = "no CUDA-capable device is detected"; return 0; }
int cuMemFreeHost(void *p) { (void)p; return NO_DEVICE; }
int cuMemFree_v2(unsigned long long p) { (void)p; return NO_DEVICE; }
