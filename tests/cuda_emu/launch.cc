// The CPU emulator of strata's CUDA kernels: gather.cu compiled as C++ (emulate.h) plus a
// launcher that runs a grid warp by warp, the 32 lanes of a warp as fibers (ucontext) that
// meet at every warp collective, so kernels behave as on a GPU for everything strata's kernels
// use. Built into a shared library by tests/cuda_emulated.rs and driven with the same
// parameter structs the CUDA executor launches with.
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../src/exec/cuda/gather.cu"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
enum Op { NONE, BROADCAST, ALL, SYNC, SHFL };
struct Lane {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
    Op op = NONE;
    unsigned long long value = 0, result = 0;
    unsigned int src = 0;  // SHFL: the lane whose value this lane reads
};
// One launch at a time per thread; test threads may launch at once.
thread_local Lane *g_lanes = nullptr;
thread_local int g_cur = 0;
thread_local ucontext_t g_sched;
thread_local void (*g_invoke)(void *, const void *) = nullptr;
thread_local void *g_kernel = nullptr;
thread_local const void *g_params = nullptr;

unsigned long long meet(Op op, unsigned long long v, unsigned int src = 0) {
    Lane &l = g_lanes[g_cur];
    l.op = op;
    l.value = v;
    l.src = src & 31u;
    swapcontext(&l.ctx, &g_sched);
    return l.result;
}

void lane_main() {
    g_invoke(g_kernel, g_params);
    g_lanes[g_cur].done = true;
}

void run_warp(unsigned int block, unsigned int warp) {
    thread_local Lane lanes[32];
    g_lanes = lanes;
    for (int l = 0; l < 32; l++) {
        lanes[l].done = false;
        lanes[l].op = NONE;
        lanes[l].stack.resize(256 * 1024);
        getcontext(&lanes[l].ctx);
        lanes[l].ctx.uc_stack.ss_sp = lanes[l].stack.data();
        lanes[l].ctx.uc_stack.ss_size = lanes[l].stack.size();
        lanes[l].ctx.uc_link = &g_sched;
        makecontext(&lanes[l].ctx, lane_main, 0);
    }
    for (;;) {
        int live = 0, waiting = 0;
        for (int l = 0; l < 32; l++) {
            if (lanes[l].done) continue;
            g_cur = l;
            threadIdx = {warp * 32 + (unsigned int)l, 0, 0};
            blockIdx = {block, 0, 0};
            lanes[l].op = NONE;
            swapcontext(&g_sched, &lanes[l].ctx);
            if (!lanes[l].done) waiting++;
            live++;
        }
        if (waiting == 0) return;
        if (waiting != live) {
            std::fprintf(stderr, "emulator: divergent warp collective (block %u warp %u)\n", block, warp);
            std::abort();
        }
        Op op = lanes[0].op;
        bool all = true;
        for (int l = 0; l < 32; l++) {
            if (lanes[l].op != op) {
                std::fprintf(stderr, "emulator: lanes of one warp reached different collectives\n");
                std::abort();
            }
            all = all && lanes[l].value != 0;
        }
        for (int l = 0; l < 32; l++) {
            lanes[l].result = op == BROADCAST ? lanes[0].value
                              : op == ALL     ? (unsigned long long)all
                              : op == SHFL    ? lanes[lanes[l].src].value
                                              : 0;
        }
    }
}

template <typename P>
void invoke(void *kernel, const void *params) {
    reinterpret_cast<void (*)(P)>(kernel)(*static_cast<const P *>(params));
}
}  // namespace

unsigned long long strata_warp_broadcast(unsigned long long v) { return meet(BROADCAST, v); }
bool strata_warp_all(bool pred) { return meet(ALL, pred) != 0; }
void strata_warp_sync() { meet(SYNC, 0); }
unsigned long long strata_warp_shfl(unsigned long long v, unsigned int src) { return meet(SHFL, v, src); }

// Runs `kernel` over a grid of `grid` blocks of `block` threads (a multiple of 32), with `params`
// as its argument. `kind` says which parameter struct the kernel takes: 0 CacheParams
// (strata_cache_*), 1 GatherParams (strata_gather_*), 2 PooledParams (strata_pooled_*,
// strata_pool_rows_*), 3 BatchParams (strata_batch).
extern "C" void strata_emu_launch(void *kernel, int kind, unsigned int grid, unsigned int block,
                                  const void *params) {
    g_kernel = kernel;
    g_params = params;
    g_invoke = kind == 1   ? invoke<GatherParams>
               : kind == 2 ? invoke<PooledParams>
               : kind == 3 ? invoke<BatchParams>
                           : invoke<CacheParams>;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned int b = 0; b < grid; b++) {
        for (unsigned int w = 0; w < block / 32; w++) {
            run_warp(b, w);
        }
    }
}

// sizeof(GatherParams), sizeof(CacheParams), sizeof(Bucket), sizeof(PooledParams),
// sizeof(BatchParams): checked against the Rust mirrors.
extern "C" void strata_emu_sizes(unsigned long long *sizes) {
    sizes[0] = sizeof(GatherParams);
    sizes[1] = sizeof(CacheParams);
    sizes[2] = sizeof(Bucket);
    sizes[3] = sizeof(PooledParams);
    sizes[4] = sizeof(BatchParams);
}
