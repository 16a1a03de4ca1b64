// A host emulation of the CUDA features the Specula kernels use, for testing the kernel sources
// on machines without a GPU: every block of a launch runs in its own forked process (so
// `__shared__` statics are per block), each CUDA thread is a fiber (its own stack, on the
// process's one OS thread: a switch costs far less than waking an OS thread, and a block of 1,024
// threads needs no 1,024 threads of the system), `__syncthreads` is a barrier that
// switches to the next fiber until every live thread of the block has arrived, warp shuffles go
// through a per-warp exchange, and "device" memory is one shared anonymous mapping visible to
// every block. Fibers switch only at barriers, shuffles and spin waits, in thread order and in
// reverse order by turns: interleavings CUDA allows; a kernel that relies on anything else
// deadlocks, which the scheduler reports. A switch saves the callee-saved registers and the floating-point control
// words on the fiber's stack and moves the stack pointer (no system call, unlike ucontext's
// swapcontext): x86-64 only, as the machines that run the emulator are. Slow, but it runs the
// real kernel code. Follows intrinsics.hpp (the qualifiers, types and intrinsics) in the
// translation unit; needs C++20.
#include <functional>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA host emulator switches its fibers with x86-64 code: run it on an x86-64 host"
#endif

// emulator_switch(save, load): saves this context on the current stack and its stack pointer in
// `*save`, then resumes the context whose stack pointer is `load`.
extern "C" void emulator_switch(void** save, void* load);
asm(R"(
    .text
    .globl emulator_switch
    .type emulator_switch, @function
emulator_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emulator_switch, .-emulator_switch
)");

// ---- block machinery (per process: one block, its threads as fibers) ----

// A barrier of fibers: `expected` threads take part (a thread that returns drops out), a phase
// ends when every one of them has arrived.
struct FiberBarrier {
    unsigned expected;
    unsigned arrived;
    unsigned long long phase;
};

static FiberBarrier g_block_barrier;
static FiberBarrier g_warp_barriers[32];
static unsigned long long g_warp_slots[32][32];
static void* g_scheduler = nullptr;
static void** g_fiber_contexts = nullptr;
static unsigned g_current_fiber = 0;
// Set when a barrier's phase ends, a thread returns or a spin wait yields: a round of the
// scheduler without it is a deadlock.
static bool g_progress = false;
static std::function<void()> g_thread_body;
static unsigned char* g_fiber_done = nullptr;

// Hands the OS thread back to the block's scheduler until this fiber's next turn.
inline void fiber_yield() { emulator_switch(&g_fiber_contexts[g_current_fiber], g_scheduler); }

inline void barrier_end_phase(FiberBarrier& b) {
    b.arrived = 0;
    ++b.phase;
    g_progress = true;
}

inline void barrier_wait(FiberBarrier& b) {
    const unsigned long long phase = b.phase;
    if (++b.arrived == b.expected) {
        barrier_end_phase(b);
        return;
    }
    while (b.phase == phase) fiber_yield();
}

// A thread that returns early keeps taking part in barriers it skips: it leaves them.
inline void barrier_leave(FiberBarrier& b) {
    --b.expected;
    if (b.arrived > 0 && b.arrived == b.expected) barrier_end_phase(b);
}

inline void __syncthreads() { barrier_wait(g_block_barrier); }

// A spin wait (a grid barrier's) lets the block's other fibers, then the other blocks' processes,
// run.
inline void emulator_spin_yield() {
    g_progress = true;
    sched_yield();
    fiber_yield();
}

template <class T> inline T shfl_exchange(T v, int src_lane_fn_kind, int arg) {
    const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    g_warp_slots[warp][lane] = bits;
    barrier_wait(g_warp_barriers[warp]);
    unsigned src = lane;
    if (src_lane_fn_kind == 0) src = lane ^ (unsigned)arg;             // xor
    else if (lane >= (unsigned)arg) src = lane - (unsigned)arg;         // up
    const unsigned long long got = g_warp_slots[warp][src];
    barrier_wait(g_warp_barriers[warp]);
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

// The stack of each fiber: the kernels' locals are small; reserved, not committed.
constexpr size_t FIBER_STACK = 256 * 1024;

// A fiber's life: the kernel for its thread, then it leaves the barriers and hands the OS thread
// back to the scheduler for good.
inline void fiber_main() {
    const unsigned t = g_current_fiber;
    g_thread_body();
    barrier_leave(g_block_barrier);
    barrier_leave(g_warp_barriers[t / 32]);
    g_fiber_done[t] = 1;
    g_progress = true;
    void* finished = nullptr;
    emulator_switch(&finished, g_scheduler);
    __builtin_unreachable();
}

// The stack pointer a new fiber starts from: what `emulator_switch` pops (the control words and
// six registers), then `fiber_main` as the return address, at a 16-byte boundary so that
// `fiber_main` starts with the stack aligned as after a call.
inline void* fiber_start(unsigned char* stack_top) {
    auto* slot = (unsigned long long*)((uintptr_t)stack_top & ~(uintptr_t)15) - 2;
    slot[0] = (unsigned long long)(uintptr_t)&fiber_main;
    unsigned long long* frame = slot - 7;
    unsigned mxcsr = 0;
    unsigned short fpu = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu));
    frame[0] = (unsigned long long)mxcsr | ((unsigned long long)fpu << 32);
    for (int r = 1; r < 7; ++r) frame[r] = 0;
    return frame;
}

// Runs this process's block: `block` fibers, resumed round after round until every one has
// returned, in thread order and in reverse order by turns (so that a read of shared memory
// written by another thread without a barrier between them sees the wrong value one way or
// the other). A round in which nothing moves is a deadlock (a barrier some thread
// never reaches): the block fails.
inline void run_block(unsigned block) {
    emulator_spin_wait = emulator_spin_yield;
    g_block_barrier = FiberBarrier{block, 0, 0};
    for (unsigned w = 0; w < (block + 31) / 32; ++w) {
        const unsigned in_warp = block - w * 32 < 32 ? block - w * 32 : 32;
        g_warp_barriers[w] = FiberBarrier{in_warp, 0, 0};
    }
    const size_t bytes = (size_t)block * FIBER_STACK;
    auto* stacks = (unsigned char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (stacks == MAP_FAILED) { perror("mmap fiber stacks"); _exit(3); }
    std::vector<void*> contexts(block);
    std::vector<unsigned char> done(block, 0);
    g_fiber_contexts = contexts.data();
    g_fiber_done = done.data();
    for (unsigned t = 0; t < block; ++t) contexts[t] = fiber_start(stacks + (size_t)(t + 1) * FIBER_STACK);
    unsigned live = block;
    for (unsigned round = 0; live > 0; ++round) {
        g_progress = false;
        for (unsigned i = 0; i < block; ++i) {
            const unsigned t = round % 2 == 0 ? i : block - 1 - i;
            if (done[t]) continue;
            g_current_fiber = t;
            threadIdx = Dim3{t, 0, 0};
            emulator_switch(&g_scheduler, contexts[t]);
            if (done[t]) --live;
        }
        if (live > 0 && !g_progress) {
            fprintf(stderr, "block (%u, %u): a barrier that some thread never reaches (deadlock)\n", blockIdx.x, blockIdx.y);
            _exit(5);
        }
    }
    munmap(stacks, bytes);
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
                g_thread_body = [kernel, &args] { kernel(args); };
                run_block(block);
                _exit(0);
            }
            running.push_back(pid);
        }
    reap(true);
}
