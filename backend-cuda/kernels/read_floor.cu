// The device read floor of `specula bench` (not an op of the contract): reads the `bytes` bytes
// at `src` once, as an op reads its input, with 16-byte loads on a grid-stride loop (four in
// flight per thread). The loaded words are folded into one value that is stored only when it
// equals a constant, so no load can be dropped and almost nothing is written.
//
// struct FloorArgs (src, bytes, sink): generated from its Rust declaration in src/kernels.rs
// (`read_floor_source`), with `static_assert`s of its layout.

typedef unsigned long long floor_u64;

extern "C" __global__ void __launch_bounds__(256) read_floor(const FloorArgs a) {
    const unsigned char* src = a.src;
    const floor_u64 bytes = a.bytes;
    // Bytes before the first 16-byte boundary, then whole 16-byte words, then the tail.
    const floor_u64 misalign = (16 - ((floor_u64)src & 15)) & 15;
    const floor_u64 head = misalign < bytes ? misalign : bytes;
    const floor_u64 words = (bytes - head) / 16;
    const floor_u64 tail = head + words * 16;
    const uint4* body = reinterpret_cast<const uint4*>(src + head);
    const floor_u64 tid = (floor_u64)blockIdx.x * blockDim.x + threadIdx.x;
    const floor_u64 stride = (floor_u64)gridDim.x * blockDim.x;
    unsigned acc = 0;
    floor_u64 i = tid;
    for (; i + 3 * stride < words; i += 4 * stride) {
        const uint4 a = body[i];
        const uint4 b = body[i + stride];
        const uint4 c = body[i + 2 * stride];
        const uint4 d = body[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < words; i += stride) {
        const uint4 a = body[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (tid < head) acc ^= src[tid];
    if (tid < bytes - tail) acc ^= src[tail + tid];
    if (acc == 0x9e3779b9u) *a.sink = acc;
}
