// A host emulation of the CUDA features the Specula kernels use, for testing the kernel sources
// on machines without a GPU: every block of a launch runs in its own forked process (so
// `__shared__` statics are per block), each CUDA thread is an OS thread, `__syncthreads` is a
// barrier, warp shuffles go through a per-warp exchange, and "device" memory is one shared
// anonymous mapping visible to every block. Slow, but it runs the real kernel code. Follows
// intrinsics.hpp (the qualifiers, types and intrinsics) in the translation unit; needs C++20.
#include <barrier>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

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
