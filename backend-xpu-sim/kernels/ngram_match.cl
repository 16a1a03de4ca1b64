// ngram_match (§5.10), two stages.
// Stage 1 (ngram_match_i32): one cluster per decode slot; for each n-gram size the cores search
// their slices of the prompt, then of the history, for the pattern, and the leftmost match is the
// minimum of the per-core partials. The proposal (start, length) goes to a scratch buffer.
// Stage 2 (ngram_match_i32_budget): one cluster merges the proposals of all clusters in slot order
// under the global token budget and writes the drafts.

// struct NgramMatchArgs: generated from src/ops/ngram_match.rs.
// struct NgramMatchBudgetArgs: generated from src/ops/ngram_match.rs.

inline bool is_decode(int this_time, int encoder) { return this_time > 0 && encoder <= 0; }

// Leftmost start i in [0, positions) where hay[i .. i + n) == pat[0 .. n), or 0xffffffff.
inline uint leftmost_match(__global const int* hay, uint positions, __global const int* pat, uint n,
                           __local Scratch* S) {
    uint lo, hi;
    core_slice(positions, &lo, &hi);
    uint found = 0xffffffffu;
    for (uint i = lo; i < hi && found == 0xffffffffu; i++) {
        bool eq = true;
        for (uint j = 0; j < n && eq; j++) eq = hay[i + j] == pat[j];
        if (eq) found = i;
    }
    return cluster_min(found, S);
}

__kernel void ngram_match_i32(BUF(const int, token_ids_all), BUF(const int, prompt_lens),
                              BUF(const int, step_idx), BUF(const int, draft_token_num),
                              BUF(const int, encoder), BUF(const int, max_dec_len),
                              BUF(const int, this_time), BUF(int, proposal),
                              const struct NgramMatchArgs args) {
    BIND(const int, token_ids_all, prompt_lens, step_idx, draft_token_num);
    BIND(const int, encoder, max_dec_len, this_time);
    BIND(int, proposal);
    const uint real_bsz = args.real_bsz, s = args.max_step_tokens, min_n = args.min_ngram_size;
    const ulong max_model_len = args.max_model_len, max_n = args.max_ngram_size;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(b, real_bsz) {
        // proposal[3b .. 3b + 3): decode flag, start within the row, length.
        int start = 0, len = 0;
        bool decode = is_decode(this_time[b], encoder[b]);
        if (decode) {
            __global const int* row = token_ids_all + (ulong)b * max_model_len;
            ulong p = min((ulong)max(prompt_lens[b], 0), max_model_len);
            ulong st = min((ulong)max(step_idx[b], 0), max_model_len - p);
            long dec_left = max((long)max_dec_len[b] - (long)st - 1l, 0l);
            ulong budget = min((ulong)max(draft_token_num[b], 0), (ulong)(s - 1u));
            budget = min(budget, (ulong)dec_left);
            if (budget > 0ul) {
                __global const int* gen = row + p;
                ulong top = min(max_n, st);
                bool done = false;
                for (ulong n = top; n >= (ulong)min_n && n >= 1ul && !done; n--) {
                    __global const int* pat = gen + (st - n);
                    // Prompt: a match must leave a following token (i + n < P).
                    uint positions = p > n ? (uint)(p - n) : 0u;
                    uint i = leftmost_match(row, positions, pat, (uint)n, S);
                    if (i != 0xffffffffu) {
                        start = (int)(i + n);
                        len = (int)min(budget, p - (i + n));
                        done = true;
                    } else {
                        // History, excluding the trivial self-match: windows of gen[0 .. st - 1).
                        uint hpos = st >= n + 1ul ? (uint)(st - n) : 0u;
                        uint q = leftmost_match(gen, hpos, pat, (uint)n, S);
                        if (q != 0xffffffffu) {
                            ulong from = p + q + n;
                            start = (int)from;
                            len = (int)min(budget, p + st - from);
                            done = true;
                        }
                    }
                }
            }
        }
        if (LID == 0u) {
            proposal[3ul * b] = decode ? 1 : 0;
            proposal[3ul * b + 1ul] = start;
            proposal[3ul * b + 2ul] = len;
        }
    }
}

__kernel void ngram_match_i32_budget(BUF(const int, token_ids_all), BUF(const int, encoder),
                                     BUF(const int, proposal), BUF(int, draft_tokens),
                                     BUF(int, this_time),
                                     const struct NgramMatchBudgetArgs args) {
    BIND(const int, token_ids_all, encoder, proposal);
    BIND(int, draft_tokens, this_time);
    const uint real_bsz = args.real_bsz, s = args.max_step_tokens;
    const ulong max_model_len = args.max_model_len, threshold = args.threshold;
    __local Scratch S[1];
    if (GRP != 0u) return;
    // Per-core partials over contiguous slot slices: mandatory tokens and proposed drafts.
    uint lo, hi;
    core_slice(real_bsz, &lo, &hi);
    ulong mandatory = 0ul, drafts = 0ul;
    for (uint b = lo; b < hi; b++) {
        if (encoder[b] > 0) mandatory += (ulong)max(this_time[b], 0);
        else if (proposal[3ul * b] != 0) mandatory += 1ul;
        if (proposal[3ul * b] != 0) drafts += (ulong)proposal[3ul * b + 2ul];
    }
    ulong m = cluster_sum(mandatory, S);
    ulong all_drafts;
    ulong before = cluster_scan(drafts, S, &all_drafts);
    // Greedy in slot order: slot b gets clamp(remaining - drafts before it, 0, its drafts).
    ulong remaining = threshold > m ? threshold - m : 0ul;
    for (uint b = lo; b < hi; b++) {
        if (proposal[3ul * b] == 0) continue;
        ulong len = (ulong)proposal[3ul * b + 2ul];
        ulong left = remaining > before ? remaining - before : 0ul;
        ulong give = min(len, left);
        before += len;
        __global const int* src = token_ids_all + (ulong)b * max_model_len + (ulong)proposal[3ul * b + 1ul];
        for (ulong i = 0; i < give; i++) draft_tokens[(ulong)b * s + 1ul + i] = src[i];
        this_time[b] = 1 + (int)give;
    }
}
