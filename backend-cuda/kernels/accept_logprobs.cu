// accept_logprobs (`docs/semantics.md` §5.11): log-probabilities, ranks and top-K of the accepted tokens.
//
// `accept_logprobs_pack` (one block): the exclusive prefix sum of the accepted counts and, per
// packed entry, its slot and position (scratch). `accept_logprobs`: one block per packed entry
// (max_bsz · S blocks): the row's softmax statistics (the rules of softmax.cu), the token's rank
// (a block count of strictly larger logits), and, when K > 0, the top-K by the radix count
// selection of select.cuh over order-preserving logit keys, gathered and ordered in shared memory.

// Entry p of the scratch holds (slot, position) as two u32 words at 2p, 2p + 1; the total count of
// entries is stored after them, at 2 · max_bsz · S.
extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(accept_logprobs_pack)(const LogprobsArgs a) {
    __shared__ u64 sa[SPECULA_BATCH_BLOCK / 32], sb[SPECULA_BATCH_BLOCK / 32];
    const u64 s = a.max_step_tokens;
    if (threadIdx.x == 0) a.cu_accept[0] = 0;
    u64 carry = 0;
    for (u32 base = 0; base < a.max_bsz; base += SPECULA_BATCH_BLOCK) {
        const u32 b = base + threadIdx.x;
        u64 n = 0;
        if (b < a.real_bsz) {
            n = len_or_zero(a.accept_num[b]);
            n = n < s ? n : s;
        }
        u64 ex, ex2, tot, tot2;
        block_scan_pair<SPECULA_BATCH_BLOCK, u64, u64>(n, 0ull, ex, ex2, tot, tot2, sa, sb);
        if (b < a.max_bsz) {
            const u64 first = carry + ex;
            const u64 end = first + n;
            a.cu_accept[b + 1] = end > (u64)SPECULA_I32_MAX ? SPECULA_I32_MAX : (i32)end;
            for (u64 k = 0; k < n; ++k) {
                a.entries[2 * (first + k)] = b;
                a.entries[2 * (first + k) + 1] = (u32)k;
            }
        }
        carry += tot;
    }
    if (threadIdx.x == 0) a.entries[2 * (u64)a.max_bsz * s] = (u32)carry;
}

// Logit order for the top-K: descending, NaN last, -0 equal to +0; as an unsigned key where a
// larger key is a better logit and NaN is 0 (below -inf).
struct LogitKeys {
    static const bool has_mass = false;
    static __device__ __forceinline__ u32 key(const Weigh&, float x, u32) {
        if (isnan(x)) return 0u;
        const u32 bits = x == 0.0f ? 0u : __float_as_uint(x);
        return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    }
    static __device__ __forceinline__ u64 weight(const Weigh&, u32) { return 0; }
};

__device__ __forceinline__ float rank_value(float x) { return isnan(x) ? -SPECULA_INF : x; }

// The log-probability of logit x (entry i of the row, temperature t) under the row's stats: the
// scaled logit (x - max) / t minus log(sum), as softmax.cu computes the probability.
__device__ __forceinline__ float entry_logprob(const RowStats& st, u32 i, float x, float t, u32 vocab) {
    switch (st.kind) {
        case ROW_STATS_ONE_HOT: return i == st.arg ? 0.0f : -SPECULA_INF;
        case ROW_STATS_POS_INF: return x == SPECULA_INF ? -logf((float)st.inf_count) : -SPECULA_INF;
        case ROW_STATS_ALL_NEG_INF: return -logf((float)vocab);
        default: return scaled_logit(x, st.max, t) - logf(st.sum);
    }
}

extern "C" __global__ void __launch_bounds__(SEL_BLOCK) SPECULA_ENTRY(accept_logprobs)(const LogprobsArgs a) {
    __shared__ SelShared s;
    __shared__ u32 keys[SPECULA_MAX_LOGPROBS_TOP_K], ids[SPECULA_MAX_LOGPROBS_TOP_K];
    __shared__ u32 sorted_keys[SPECULA_MAX_LOGPROBS_TOP_K], sorted_ids[SPECULA_MAX_LOGPROBS_TOP_K];
    __shared__ u32 n_gathered;
    const u64 s_tokens = a.max_step_tokens;
    const u64 p = blockIdx.x;
    if (p >= (u64)a.max_bsz * s_tokens) return;
    const u32 k_top = a.top_k;
    i32* out_ids = a.top_ids + p * k_top;
    float* out_lps = a.top_logprobs + p * k_top;
    const u64 total = a.entries[2 * (u64)a.max_bsz * s_tokens];
    bool have_row = false;
    u64 r = 0;
    i32 token = -1;
    if (p < total) {
        const u32 b = a.entries[2 * p];
        const u32 k = a.entries[2 * p + 1];
        token = a.accept_tokens[(u64)b * s_tokens + k];
        const i64 base = a.cu_out[b];
        const i64 row = a.encoder[b] > 0 ? base : base + (i64)k;
        if (row >= 0 && (u64)row < a.rows) {
            have_row = true;
            r = (u64)row;
        }
    }
    if (!have_row) {
        // Padding entries and entries whose source row does not exist.
        if (threadIdx.x == 0) {
            a.token_ids[p] = token;
            a.logprobs[p] = -SPECULA_INF;
            a.ranks[p] = 0;
        }
        for (u32 i = threadIdx.x; i < k_top; i += SEL_BLOCK) {
            out_ids[i] = -1;
            out_lps[i] = -SPECULA_INF;
        }
        return;
    }
    const SPECULA_T::raw* row = a.logits + r * a.vocab;
    const bool vec = a.vec != 0;
    const float t = effective_temperature(a.temperature[r]);
    const RowStats st = block_row_stats<SPECULA_T, SEL_BLOCK>(row, a.vocab, vec, t);
    const bool token_valid = token >= 0 && (u32)token < a.vocab;
    if (token_valid) {
        const float x_token = SPECULA_T::widen(row[token]);
        const float tv = rank_value(x_token);
        u64 larger = 0;
        for_row_elements<SPECULA_T, SEL_BLOCK>(row, a.vocab, vec, [&](u32, float x) {
            if (rank_value(x) > tv) larger += 1;
        });
        larger = block_sum_u64<SEL_BLOCK>(larger, s.sa);
        if (threadIdx.x == 0) {
            a.token_ids[p] = token;
            a.logprobs[p] = entry_logprob(st, (u32)token, x_token, t, a.vocab);
            const u64 rank = larger + 1;
            a.ranks[p] = rank > (u64)SPECULA_I32_MAX ? SPECULA_I32_MAX : (i32)rank;
        }
    } else if (threadIdx.x == 0) {
        a.token_ids[p] = token;
        a.logprobs[p] = -SPECULA_INF;
        a.ranks[p] = 0;
    }
    if (k_top == 0) return;
    RowPart part = row_part_single(a.vocab, vec);
    const Weigh by_key = weigh_by_key();
    const Sel top = select_prefix<SPECULA_T, LogitKeys>(row, part, s, by_key, 0u, SPECULA_U32_MAX, false, k_top, 0);
    const u32 n = top.count < k_top ? top.count : k_top;
    if (threadIdx.x == 0) n_gathered = 0;
    __syncthreads();
    gather_prefix<SPECULA_T, LogitKeys>(row, part, s, by_key, top.key, top.take, keys, ids, &n_gathered,
                                        SPECULA_MAX_LOGPROBS_TOP_K);
    const u32 m = n_gathered < n ? n_gathered : n;
    rank_order_small(keys, ids, m, sorted_keys, sorted_ids);
    for (u32 i = threadIdx.x; i < k_top; i += SEL_BLOCK) {
        if (i < m) {
            const u32 id = sorted_ids[i];
            out_ids[i] = (i32)id;
            out_lps[i] = entry_logprob(st, id, SPECULA_T::widen(row[id]), t, a.vocab);
        } else {
            out_ids[i] = -1;
            out_lps[i] = -SPECULA_INF;
        }
    }
}
