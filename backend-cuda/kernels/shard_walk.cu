// shard_walk (`docs/semantics.md` §5.16): one block per row. The kept tokens are those whose rank
// key reaches the row's threshold; each walks with its weight as a token of the whole row
// (shard.cuh), or (with a residual) with REJECTION's residual against its draft row. Each thread
// sums its contiguous part of the slice (saturating) and counts its kept tokens; thread 0 scans the
// partial sums in thread order; the one thread whose range first exceeds the offset walks its part
// again in ascending id order to the token. Integer throughout.

// What a row's tokens walk with: the kept weight, or the residual against a draft row.
struct Walked {
    const SPECULA_T::raw* q;  // the draft row (residual on)
    SliceWeigh qw;            // its weighing: its own row key, the target row's temperature
    u64 target_mass;
    u64 draft_mass;
    u32 shift;
    u32 mode;  // 0: the kept weights; 1: the residual; 2: the residual of no draft row (all 0)
};

// The weight slice element j (global id first + j, value x) walks with; *kept whether it is kept.
__device__ __forceinline__ u64 walked_weight(const SliceWeigh& sw, const Walked& wk, bool logits, u64 cut,
                                             float x, u32 j, u32 id, bool* kept) {
    *kept = shard_token_key(SHARD_ORDER_RANK, logits, x, id) >= cut;
    const u64 wp = *kept ? slice_weight(sw, logits, x, id) : 0ull;
    if (wk.mode == 0) return wp;
    if (wk.mode == 2) return 0;
    const u64 wq = slice_weight(wk.qw, logits, SPECULA_T::widen(wk.q[j]), id);
    return residual_weight(wp, wq, wk.target_mass, wk.draft_mass, wk.shift);
}

extern "C" __global__ void __launch_bounds__(SHARD_BLOCK) SPECULA_ENTRY(shard_walk)(const ShardWalkArgs a) {
    __shared__ u64 part_mass[SHARD_BLOCK];
    __shared__ u64 scratch[SHARD_BLOCK / 32];
    __shared__ u64 total_mass;
    __shared__ u32 found;
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.scores + (u64)r * a.len;
    const bool logits = a.logits != 0;
    const float t = logits ? a.temperature[r] : 1.0f;
    const SliceWeigh sw = slice_weigh(logits, a.row_key[r], t, a.min_p != 0 ? a.min_p[r] : 0.0f);
    const u64 cut = a.threshold[r], start_at = a.offset[r];
    Walked wk;
    wk.q = a.draft;
    wk.qw = sw;
    wk.target_mass = 0;
    wk.draft_mass = 0;
    wk.shift = 0;
    wk.mode = 0;
    if (a.draft != 0) {
        const i32 d = a.draft_row[r];
        const bool valid = d >= 0 && (u32)d < a.draft_rows;
        wk.mode = valid ? 1u : 2u;
        if (valid) {
            wk.q = a.draft + (u64)d * a.len;
            wk.qw = slice_weigh(logits, a.draft_key[d], t, 0.0f);
            wk.target_mass = a.target_mass[r];
            wk.draft_mass = a.draft_mass[r];
            wk.shift = residual_shift(logits, wk.target_mass, wk.draft_mass);
        }
    }
    u32 lo, hi;
    shard_thread_part(a.len, &lo, &hi);
    u64 sum = 0, kept_here = 0;
    for (u32 j = lo; j < hi; ++j) {
        bool kept;
        sum = add_sat_u64(sum, walked_weight(sw, wk, logits, cut, SPECULA_T::widen(row[j]), j, a.first + j, &kept));
        kept_here += kept ? 1u : 0u;
    }
    const u64 kept_total = block_sum_u64<SHARD_BLOCK>(kept_here, scratch);
    part_mass[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        // The saturated sums before each thread (saturating sums of non-negative values are
        // associative: the total is the saturated sum in any grouping).
        u64 before = 0;
        for (u32 i = 0; i < SHARD_BLOCK; ++i) {
            const u64 x = part_mass[i];
            part_mass[i] = before;
            before = add_sat_u64(before, x);
        }
        total_mass = before;
        found = SPECULA_U32_MAX;
    }
    __syncthreads();
    const u64 before = part_mass[threadIdx.x];
    if (before <= start_at && add_sat_u64(before, sum) > start_at) {
        u64 running = before;
        for (u32 j = lo; j < hi; ++j) {
            bool kept;
            running = add_sat_u64(running, walked_weight(sw, wk, logits, cut, SPECULA_T::widen(row[j]), j, a.first + j, &kept));
            if (running > start_at) {
                found = a.first + j;
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a.tokens[r] = found == SPECULA_U32_MAX ? -1 : (i32)found;
        a.mass[r] = total_mass;
        a.count[r] = kept_total;
    }
}
