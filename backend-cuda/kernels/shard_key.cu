// shard_key (`docs/semantics.md` §5.13): one block per row; each thread the largest key of its
// elements (read four at a time when aligned), then a block maximum. With `ids`, thread 0 keys the
// one token ids[r] when the slice holds it (0 otherwise) and nothing else is read.

extern "C" __global__ void __launch_bounds__(SHARD_BLOCK) SPECULA_ENTRY(shard_key)(const ShardKeyArgs a) {
    __shared__ u64 scratch[SHARD_BLOCK / 32];
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.scores + (u64)r * a.len;
    const bool logits = a.logits != 0;
    if (a.ids != 0) {
        if (threadIdx.x == 0) {
            const i32 id = a.ids[r];
            u64 key = SHARD_NO_KEY;
            // The slice holds ids first .. first + len (a negative id is none of them).
            if (id >= 0 && (u32)id >= a.first && (u32)id - a.first < a.len) {
                key = shard_token_key(a.order, logits, SPECULA_T::widen(row[(u32)id - a.first]), (u32)id);
            }
            a.keys[r] = key;
        }
        return;
    }
    u64 best = SHARD_NO_KEY;
    for_row_elements<SPECULA_T, SHARD_BLOCK>(row, a.len, a.vec != 0, [&](u32 i, float x) {
        const u64 k = shard_token_key(a.order, logits, x, a.first + i);
        best = k > best ? k : best;
    });
    best = block_max_u64<SHARD_BLOCK>(best, scratch);
    if (threadIdx.x == 0) a.keys[r] = best;
}
