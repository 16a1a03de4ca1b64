// accept_logprobs (§5.11), two stages.
// Stage 1 (accept_logprobs_pack): cluster 0 packs the accepted counts: per-core partial sums over
// contiguous slot slices, core 0 scans them, every core writes its slots' entries (token, source
// row) and a share of the padding entries.
// Stage 2 (ENTRY): one cluster per packed entry: the softmax statistics of its source row, the
// token's rank (integer keys), and the top-K by a radix count selection on the logit order keys.

// struct AcceptLogprobsPackArgs: generated from src/ops/accept_logprobs.rs.
// struct AcceptLogprobsArgs: generated from src/ops/accept_logprobs.rs.
__kernel void accept_logprobs_pack(BUF(const int, accept_tokens), BUF(const int, accept_num),
                                   BUF(const int, encoder), BUF(const int, cu_out),
                                   BUF(int, cu_accept), BUF(int, token_ids), BUF(int, entry_row),
                                   const struct AcceptLogprobsPackArgs args) {
    BIND(const int, accept_tokens, accept_num, encoder, cu_out);
    BIND(int, cu_accept, token_ids, entry_row);
    const uint max_bsz = args.max_bsz, real_bsz = args.real_bsz;
    const uint s = args.max_step_tokens, rows = args.rows;
    __local Scratch S[1];
    if (GRP != 0u) return;
    uint lo, hi;
    core_slice(max_bsz, &lo, &hi);
    ulong count = 0ul;
    for (uint b = lo; b < hi; b++) {
        count += b < real_bsz ? (ulong)min((uint)max(accept_num[b], 0), s) : 0ul;
    }
    ulong total;
    ulong at = cluster_scan(count, S, &total);
    if (LID == 0u) cu_accept[0] = 0;
    for (uint b = lo; b < hi; b++) {
        uint n = b < real_bsz ? min((uint)max(accept_num[b], 0), s) : 0u;
        bool prefill = encoder[b] > 0;
        for (uint k = 0; k < n; k++) {
            long r = (long)cu_out[b] + (prefill ? 0l : (long)k);
            token_ids[at + k] = accept_tokens[(ulong)b * s + k];
            entry_row[at + k] = (r >= 0 && r < (long)rows) ? (int)r : -1;
        }
        at += n;
        cu_accept[b + 1] = at > 2147483647ul ? 2147483647 : (int)at;
    }
    uint entries = max_bsz * s;
    for (uint p = (uint)total + LID; p < entries; p += CORES) {
        token_ids[p] = -1;
        entry_row[p] = -2;
    }
}

// The log-probability of entry i (logit bits `bits`) of a row under `st` at temperature t: the
// softmax rules, with the same scaled logit (l - m) / t.
inline float logprob_of(SoftmaxStats st, uint i, uint bits, float t, uint V) {
    if (st.kind == STATS_ONE_HOT) return i == st.arg ? 0.0f : -INFINITY;
    if (st.kind == STATS_POS_INF) return logit_value(bits) == INFINITY ? -log((float)st.count) : -INFINITY;
    if (st.kind == STATS_ALL_NEG_INF) return -log((float)V);
    return scaled(bits, st.max, t) - log(st.sum);
}

__kernel void ENTRY(BUF(const T_STORE, logits), BUF(const float, temperature),
                    BUF(const int, token_ids), BUF(const int, entry_row), BUF(float, logprobs),
                    BUF(int, ranks), BUF(int, top_ids), BUF(float, top_logprobs),
                    const struct AcceptLogprobsArgs args) {
    BIND(const T_STORE, logits);
    BIND(const float, temperature);
    BIND(const int, token_ids, entry_row);
    BIND(float, logprobs, top_logprobs);
    BIND(int, ranks, top_ids);
    const uint entries = args.entries, V = args.vocab, K = args.top_k;
    __local Scratch S[1];
    // Every phase runs for every entry (no barrier under a branch); an entry without a source row
    // is handled as a row of zero length and its outputs are the fallbacks.
    FOR_CLUSTER_ROWS(p, entries) {
        int r = entry_row[p];
        bool row_ok = r >= 0;
        uint V_row = row_ok ? V : 0u;
        __global const T_STORE* row = logits + (row_ok ? (ulong)r * V : 0ul);
        __global int* ids = top_ids + (ulong)p * K;
        __global float* lps = top_logprobs + (ulong)p * K;
        float t = row_ok ? effective_temperature(temperature[r]) : 1.0f;
        SoftmaxStats st = softmax_stats(row, V_row, S, t);
        int token = token_ids[p];
        bool valid = row_ok && token >= 0 && (uint)token < V;
        uint tk = valid ? rank_value_key(LOAD_T(row, (uint)token)) : 0xffffffffu;
        uint lo, hi;
        core_slice(V_row, &lo, &hi);
        uint larger = 0u;
        for (uint i = lo; i < hi && valid; i++) larger += rank_value_key(LOAD_T(row, i)) > tk ? 1u : 0u;
        ulong total = cluster_sum((ulong)larger, S);
        if (LID == 0u) {
            if (valid) {
                ranks[p] = total + 1ul > 2147483647ul ? 2147483647 : (int)(total + 1ul);
                logprobs[p] = logprob_of(st, (uint)token, LOAD_T(row, (uint)token), t, V);
            } else {
                ranks[p] = 0;
                logprobs[p] = -INFINITY;
            }
        }
        uint n = min(K, V_row);
        Prefix sel =
            select_prefix(row, V_row, S, KEY_ORDER, by_key(), METRIC_COUNT, (ulong)n, false);
        sel.count = n;
        gather_sorted(row, n == 0u ? 0u : V_row, S, KEY_ORDER, by_key(), sel);
        FOR_CORE_ITEMS(j, K) {
            if (j < n) {
                uint id = S->sorted_id[j];
                ids[j] = (int)id;
                lps[j] = logprob_of(st, id, LOAD_T(row, id), t, V);
            } else {
                ids[j] = -1;
                lps[j] = -INFINITY;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
