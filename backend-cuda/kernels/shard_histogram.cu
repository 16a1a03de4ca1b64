// shard_histogram (`docs/semantics.md` §5.15): one block per row. Every thread keys its elements and
// adds each token within the row's prefix and at or above its floor to the block's 256 buckets in
// shared memory: a count, and its weight as a token of the whole row (shard.cuh) by a 64-bit atomic
// add, exact whatever the order. Then the buckets are written out.

extern "C" __global__ void __launch_bounds__(SHARD_BLOCK)
    SPECULA_ENTRY(shard_histogram)(const ShardHistogramArgs a) {
    __shared__ u32 count[256];
    __shared__ u64 mass[256];
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.scores + (u64)r * a.len;
    const bool logits = a.logits != 0;
    const SliceWeigh sw = slice_weigh(logits, a.row_key[r], logits ? a.temperature[r] : 1.0f,
                                      a.min_p != 0 ? a.min_p[r] : 0.0f);
    const u64 want = a.prefix[r], low = a.floors[r];
    const u32 shift = a.shift;
    for (u32 b = threadIdx.x; b < 256; b += SHARD_BLOCK) {
        count[b] = 0;
        mass[b] = 0;
    }
    __syncthreads();
    for_row_elements<SPECULA_T, SHARD_BLOCK>(row, a.len, a.vec != 0, [&](u32 i, float x) {
        const u32 id = a.first + i;
        const u64 k = shard_token_key(SHARD_ORDER_RANK, logits, x, id);
        // The key above the bucket's 8 bits (none of it when shift + 8 == 64).
        const u64 above = shift + 8 >= 64 ? 0ull : k >> (shift + 8);
        if (k >= low && above == want) {
            const u32 bin = (u32)(k >> shift) & 255u;
            atomicAdd(&count[bin], 1u);
            const u64 w = slice_weight(sw, logits, x, id);
            if (w != 0) atomicAdd(&mass[bin], w);
        }
    });
    __syncthreads();
    for (u32 b = threadIdx.x; b < 256; b += SHARD_BLOCK) {
        a.counts[(u64)r * 256 + b] = count[b];
        a.masses[(u64)r * 256 + b] = mass[b];
    }
}
