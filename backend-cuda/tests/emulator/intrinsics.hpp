// The CUDA qualifiers, types and intrinsics the Specula kernels use, for a host C++ compiler (C++17
// or newer): enough for `common.cuh`, `select.cuh` and the kernel files to compile on the host.
// What a launch needs on top (threads, `__syncthreads`, warp shuffles, device memory) is in
// shim.hpp; a one-thread host build supplies its own `__syncthreads` and shuffles instead.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <sched.h>
#include <unistd.h>

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
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
// One f32 subtraction rounded to nearest even (SSE on the host: no excess precision, no FMA).
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
// What a spin wait does between two looks at the word it waits on: yield the OS thread (the
// launch machinery of shim.hpp, whose threads are fibers, lets the block's other fibers run too).
static void (*emulator_spin_wait)() = [] { sched_yield(); };

// A spin wait (a grid barrier's): yields. A wait that goes on for ten minutes (calls less than a
// second apart) fails its block: a barrier that is never released, instead of a hung test.
inline void __nanosleep(unsigned) {
    typedef std::chrono::steady_clock clock;
    static thread_local clock::time_point start{}, last{};
    const clock::time_point now = clock::now();
    if (now - last > std::chrono::seconds(1)) start = now;
    last = now;
    if (now - start > std::chrono::minutes(10)) {
        fprintf(stderr, "a spin wait lasted ten minutes: a grid barrier is never released\n");
        _exit(6);
    }
    emulator_spin_wait();
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T> T __ldcg(const T* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <class T> T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T> T atomicCAS(T* p, T compare, T v) {
    // On failure `compare` becomes the current value; on success it is the old one already.
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}
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
