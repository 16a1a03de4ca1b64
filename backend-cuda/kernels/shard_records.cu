// shard_records (`docs/semantics.md` §5.14): one block per row, no sort of the slice. The
// n = min(K, len)-th largest key is found by a radix selection, 8 bits a round from bit 48 down
// (shared-memory count histograms of the keys within the prefix chosen so far); keys are distinct,
// so the round whose bucket holds exactly the tokens still needed ends it, at the latest the last.
// The n tokens at or above that threshold are gathered into shared memory (in any order), each
// record's place is the number of gathered keys above it, and its weight is that of a token of the
// whole row (shard.cuh). Records n .. K are (0, 0).

extern "C" __global__ void __launch_bounds__(SHARD_BLOCK)
    SPECULA_ENTRY(shard_records)(const ShardRecordsArgs a) {
    __shared__ u32 hist[256];
    __shared__ u64 members[SPECULA_MAX_SHARD_RECORDS];
    __shared__ u64 chosen;
    __shared__ u32 still_needed, all_in, gathered;
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.scores + (u64)r * a.len;
    const bool logits = a.logits != 0;
    const u32 first = a.first, order = a.order, k_records = a.records_per_row;
    const u32 n = k_records < a.len ? k_records : a.len;
    const SliceWeigh sw = slice_weigh(logits, a.row_key[r], logits ? a.temperature[r] : 1.0f,
                                      a.min_p != 0 ? a.min_p[r] : 0.0f);
    // The n-th largest key: the radix selection.
    u64 prefix = 0, threshold = 0;
    u32 need = n;
    bool done = false;
    for (int shift = 48; shift >= 0 && !done; shift -= 8) {
        for (u32 b = threadIdx.x; b < 256; b += SHARD_BLOCK) hist[b] = 0;
        __syncthreads();
        for_row_elements<SPECULA_T, SHARD_BLOCK>(row, a.len, a.vec != 0, [&](u32 i, float x) {
            const u64 k = shard_token_key(order, logits, x, first + i);
            if ((k >> (shift + 8)) == prefix) atomicAdd(&hist[(u32)(k >> shift) & 255u], 1u);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            // From the top bucket down, the one where the count above reaches `need`.
            u32 above = 0, digit = 0;
            for (int b = 255; b >= 0; --b) {
                if (above + hist[b] >= need) {
                    digit = (u32)b;
                    break;
                }
                above += hist[b];
            }
            chosen = (prefix << 8) | digit;
            still_needed = need - above;
            all_in = hist[digit] == need - above ? 1u : 0u;
        }
        __syncthreads();
        prefix = chosen;
        need = still_needed;
        done = all_in != 0;
        threshold = prefix << shift;
        __syncthreads();
    }
    // Gather the n members (keys at or above the threshold), in any order.
    if (threadIdx.x == 0) gathered = 0;
    __syncthreads();
    for_row_elements<SPECULA_T, SHARD_BLOCK>(row, a.len, a.vec != 0, [&](u32 i, float x) {
        const u64 k = shard_token_key(order, logits, x, first + i);
        if (k >= threshold) {
            const u32 at = atomicAdd(&gathered, 1u);
            if (at < n) members[at] = k;
        }
    });
    __syncthreads();
    u64* out = a.records + (u64)r * 2 * k_records;
    for (u32 i = threadIdx.x; i < n; i += SHARD_BLOCK) {
        const u64 k = members[i];
        u32 place = 0;
        for (u32 m = 0; m < n; ++m) place += members[m] > k ? 1u : 0u;
        const u32 id = shard_key_id(k);
        out[2 * place] = k;
        out[2 * place + 1] = slice_weight(sw, logits, SPECULA_T::widen(row[id - first]), id);
    }
    for (u32 i = 2 * n + threadIdx.x; i < 2 * k_records; i += SHARD_BLOCK) out[i] = 0;
}
