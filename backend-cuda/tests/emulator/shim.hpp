// A host emulation of the CUDA features the Specula kernels use, for testing the kernel sources
// on machines without a GPU: every block of a launch runs in its own forked process (so
// `__shared__` statics are per block), each CUDA thread is an OS thread, `__syncthreads` is a
// barrier, warp shuffles go through a per-warp exchange, and "device" memory is one shared
// anonymous mapping visible to every block. Slow, but it runs the real kernel code.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__
#define __shared__ static
#define __launch_bounds__(x)

struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx;
static Dim3 blockDim;
static Dim3 gridDim;

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }

inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline void __nanosleep(unsigned) { sched_yield(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T> T __ldcg(const T* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <class T> T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T> T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <class T> T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}

// Exact binary16 -> binary32 (the emulation of `cvt.f32.f16`).
inline float shim_half_to_float(unsigned short h) {
    const unsigned sign = (unsigned)(h >> 15) << 31;
    unsigned exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    unsigned bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            int e = -1;
            do { ++e; man <<= 1; } while ((man & 0x400) == 0);
            bits = sign | ((unsigned)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return __uint_as_float(bits);
}

// ---- block machinery (per process: one block) ----
static std::barrier<>* g_block_barrier = nullptr;
static std::barrier<>* g_warp_barriers[32];
static unsigned long long g_warp_slots[32][32];

inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }

template <class T> inline T shfl_exchange(T v, int src_lane_fn_kind, int arg) {
    const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    g_warp_slots[warp][lane] = bits;
    g_warp_barriers[warp]->arrive_and_wait();
    unsigned src = lane;
    if (src_lane_fn_kind == 0) src = lane ^ (unsigned)arg;             // xor
    else if (lane >= (unsigned)arg) src = lane - (unsigned)arg;         // up
    const unsigned long long got = g_warp_slots[warp][src];
    g_warp_barriers[warp]->arrive_and_wait();
    T out;
    memcpy(&out, &got, sizeof(T));
    return out;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int o) { return shfl_exchange(v, 0, o); }
template <class T> T __shfl_up_sync(unsigned, T v, int o) { return shfl_exchange(v, 1, o); }

// ---- device memory: one shared arena ----
static unsigned char* g_arena = nullptr;
static size_t g_arena_used = 0, g_arena_size = 0;
inline void arena_init(size_t bytes) {
    g_arena_size = bytes;
    g_arena = (unsigned char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_arena == MAP_FAILED) { perror("mmap"); exit(3); }
}
template <class T> T* dalloc(size_t n) {
    size_t bytes = (n * sizeof(T) + 255) / 256 * 256 + 256;
    if (g_arena_used + bytes > g_arena_size) { fprintf(stderr, "arena full\n"); exit(3); }
    T* p = (T*)(g_arena + g_arena_used);
    memset(p, 0, bytes);
    g_arena_used += bytes;
    return p;
}

// Runs a grid: every block is a forked process with `block` threads. `concurrent` blocks at a
// time (all of them for a cooperative launch).
template <class Args>
void launch(void (*kernel)(Args), unsigned gx, unsigned gy, unsigned block, const Args& args, unsigned concurrent) {
    std::vector<pid_t> running;
    auto reap = [&](bool all) {
        while (!running.empty() && (all || running.size() >= concurrent)) {
            int status = 0;
            const pid_t pid = waitpid(running.front(), &status, 0);
            (void)pid;
            running.erase(running.begin());
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { fprintf(stderr, "block failed\n"); exit(4); }
        }
    };
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            reap(false);
            fflush(nullptr);
            const pid_t pid = fork();
            if (pid == 0) {
                blockIdx = Dim3{bx, by, 0};
                blockDim = Dim3{block, 1, 1};
                gridDim = Dim3{gx, gy, 1};
                g_block_barrier = new std::barrier<>(block);
                for (unsigned w = 0; w < (block + 31) / 32; ++w) g_warp_barriers[w] = new std::barrier<>(32);
                std::vector<std::thread> threads;
                threads.reserve(block);
                for (unsigned t = 0; t < block; ++t)
                    threads.emplace_back([t, kernel, &args] {
                        threadIdx = Dim3{t, 0, 0};
                        kernel(args);
                        // A thread that returns early keeps taking part in barriers it skips.
                        g_block_barrier->arrive_and_drop();
                        g_warp_barriers[t / 32]->arrive_and_drop();
                    });
                for (auto& th : threads) th.join();
                _exit(0);
            }
            running.push_back(pid);
        }
    reap(true);
}
