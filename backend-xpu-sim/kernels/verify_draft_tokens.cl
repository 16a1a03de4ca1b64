// verify_draft_tokens (contract 4.5): one cluster per slot (cluster-stride over max_bsz).
//
// STRATEGY (injected): 0 GREEDY, 1 TARGET_MATCH, 2 TOPP, 3 REJECTION. The slot's control flow is
// scalar; for GREEDY / TARGET_MATCH / TOPP it runs on core 0 alone. For REJECTION every core runs
// the same control flow (so every decision is uniform across the cluster) and joins the row
// primitives (row totals, radix selections, the residual draw) on the target and draft rows; only
// core 0 writes the slot's outputs. T_DTYPE / D_DTYPE are the target and draft storage formats.

#define STRATEGY_GREEDY 0
#define STRATEGY_TARGET_MATCH 1
#define STRATEGY_TOPP 2
#define STRATEGY_REJECTION 3

inline int emit_token(int token, long* count, long max_dec, __global const int* end_tokens,
                      uint num_end, bool* stopped) {
    *count += 1;
    bool is_end = false;
    for (uint e = 0; e < num_end; e++) is_end = is_end || end_tokens[e] == token;
    if (is_end) { *stopped = true; return token; }
    if (*count >= max_dec) { *stopped = true; return end_tokens[0]; }
    return token;
}

#if STRATEGY == STRATEGY_REJECTION
// Total weight of a draft row.
inline ulong draft_mass(__global const D_STORE* q, uint V, __local Scratch* S) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    ulong m = 0ul;
    for (uint i = lo; i < hi; i++) m += key_weight(rank_key(LOAD_D(q, i)));
    S->part_mass[LID] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
        ulong t = 0ul;
        for (uint c = 0; c < CORES; c++) t += S->part_mass[c];
        S->bc_u64[0] = t;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ulong r = S->bc_u64[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// One step of REJECTION for slot output row r (target row p, V_row = V when it exists, else 0) and
// draft row q (Vq = V while a draft is checked, else 0): every row quantity the step may need, all
// computed unconditionally (no barrier under a branch), the decision taken afterwards.
typedef struct {
    bool accepted;    // draft d accepted
    int token;        // when rejected: the correction, or the target row's sample
} RejectionStep;

inline RejectionStep rejection_step(__global const T_STORE* p, uint V_row,
                                    __global const D_STORE* q, uint Vq, __local Scratch* S, int d,
                                    int top_k, uint top_p_bits, ulong seed) {
    KeptSet k = kept_set(p, V_row, S, top_k, top_p_bits);
    ulong wq_total = draft_mass(q, Vq, S);
    uint d_index = (d >= 0 && (uint)d < V_row) ? (uint)d : 0u;
    ulong wp_d = weight_in_prefix(p, V_row, S, k.kept, d_index);
    ulong wp_total = k.kept.mass;
    int resid = prefix_draw(p, V_row, S, k.kept, draw64(seed, PURPOSE_RESIDUAL),
                            Vq != 0u ? WEIGHT_RESIDUAL : WEIGHT_KEY, q, wq_total, wp_total);
    int sampled = sample_kept(p, V_row, S, k, seed);

    RejectionStep step;
    step.accepted = false;
    step.token = V_row == 0u ? -1 : sampled;
    bool checkable = Vq != 0u && V_row != 0u && d >= 0 && (uint)d < V_row;
    if (!checkable) return step;
    // Not distributions, or a target that weighs nothing: reject and sample the target row.
    if (k.stats.mass >= (ulong)REJECTION_MAX_TOTAL_WEIGHT ||
        wq_total >= (ulong)REJECTION_MAX_TOTAL_WEIGHT || k.survivors_mass == 0ul)
        return step;
    ulong wq_d = key_weight(rank_key(LOAD_D(q, d_index)));
    ulong u = draw64(seed, PURPOSE_ACCEPT) >> 32;
    bool acc;
    if (wq_d == 0ul) {
        acc = wp_d > 0ul;
    } else {
        u128 lhs = mul_128x64(mul_64x64(u, wq_d), wp_total);
        u128 rhs = shl_128(mul_64x64(wp_d, wq_total), 32u);
        acc = lt_128(lhs, rhs);
    }
    if (acc) { step.accepted = true; step.token = d; return step; }
    if (resid == -2) return step;              // empty residual: the target row's sample
    step.token = resid == -1 ? (int)k.stats.first : resid;
    return step;
}
#endif

__kernel void ENTRY(BUF(const int, draft_tokens), BUF(const int, this_time), BUF(const int, encoder),
                    BUF(const int, cu_out), BUF(const uchar, stop_flags),
                    BUF(const uchar, is_block_step), BUF(const int, reasoning_status),
                    BUF(const int, step_idx), BUF(const int, max_dec_len),
                    BUF(const int, end_tokens), BUF(const ulong, seeds),
                    BUF(const int, target_tokens), BUF(const int, cand_ids),
                    BUF(const uint, cand_scores), BUF(const int, cand_lens),
                    BUF(const T_STORE, target_probs), BUF(const D_STORE, draft_probs),
                    BUF(const int, rj_top_k), BUF(const uint, rj_top_p), BUF(int, accept_tokens),
                    BUF(int, accept_num), const uint max_bsz, const uint real_bsz, const uint s,
                    const uint rows, const uint V, const uint num_end, const uint C,
                    const uint accept_all, const uint reject_all) {
    BIND(const int, draft_tokens);
    BIND(const int, this_time);
    BIND(const int, encoder);
    BIND(const int, cu_out);
    BIND(const uchar, stop_flags);
    BIND(const uchar, is_block_step);
    BIND(const int, reasoning_status);
    BIND(const int, step_idx);
    BIND(const int, max_dec_len);
    BIND(const int, end_tokens);
    BIND(const ulong, seeds);
    BIND(const int, target_tokens);
    BIND(const int, cand_ids);
    BIND(const uint, cand_scores);
    BIND(const int, cand_lens);
    BIND(const T_STORE, target_probs);
    BIND(const D_STORE, draft_probs);
    BIND(const int, rj_top_k);
    BIND(const uint, rj_top_p);
    BIND(int, accept_tokens);
    BIND(int, accept_num);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
#if STRATEGY != STRATEGY_REJECTION
    if (LID != 0u) return;
#endif
#if STRATEGY == STRATEGY_REJECTION
    // Every core runs the slot's control flow (uniform); one loop iteration per output row of the
    // slot, each with the same straight-line sequence of row primitives.
    for (uint b = GRP; b < max_bsz; b += NGRP) {
        __global int* out = accept_tokens + (ulong)b * s;
        if (LID == 0u) for (uint k = 0; k < s; k++) out[k] = -1;
        bool live = b < real_bsz && stop_flags[b] == 0 && is_block_step[b] == 0;
        uint tt = live ? min((uint)max(this_time[b], 0), s) : 0u;
        uint len = 0u;
        long base = tt > 0u ? (long)cu_out[b] : 0l;
        long count = (long)max(step_idx[b < real_bsz ? b : 0u], 0);
        long max_dec = (long)max_dec_len[b < real_bsz ? b : 0u];
        bool skip_phase1 = tt == 0u || encoder[b] > 0 || reasoning_status[b] == 1 || reject_all != 0u;
        bool accept_every = accept_all != 0u && reject_all == 0u;
        bool done = tt == 0u;
        uint i = 0u;
        while (!done) {
            long r = base + (long)i;
            bool row_ok = r >= 0 && r < (long)rows;
            bool checking = !skip_phase1 && i + 1u < tt;
            int d = checking ? draft_tokens[(ulong)b * s + i + 1u] : -1;
            bool d_ok = d >= 0 && (uint)d < V;
            ulong rr = row_ok ? (ulong)r : 0ul;
            ulong draft_row = checking ? (ulong)b * (s - 1u) + i : 0ul;
            RejectionStep step = rejection_step(
                target_probs + rr * V, row_ok ? V : 0u, draft_probs + draft_row * V,
                (checking && row_ok && d_ok && !accept_every) ? V : 0u, S, d,
                row_ok ? rj_top_k[rr] : 0, row_ok ? rj_top_p[rr] : ONE_KEY,
                row_ok ? seeds[rr] : 0ul);
            bool stopped = false;
            int token;
            bool accepted = checking && d_ok && (accept_every || (row_ok && step.accepted));
            if (accepted) {
                token = d;
            } else {
                token = step.token;  // the correction, the target's sample, or -1 (no row)
                if (token < 0 || (uint)token >= V) token = end_tokens[0];
            }
            int e = emit_token(token, &count, max_dec, end_tokens, num_end, &stopped);
            if (LID == 0u) out[len] = e;
            len++;
            if (!accepted || stopped) done = true;
            else i++;
        }
        if (LID == 0u) accept_num[b] = (int)len;
    }
#else
    for (uint b = GRP; b < max_bsz; b += NGRP) {
        __global int* out = accept_tokens + (ulong)b * s;
        if (LID == 0u) for (uint k = 0; k < s; k++) out[k] = -1;
        bool live = b < real_bsz && stop_flags[b] == 0 && is_block_step[b] == 0;
        uint tt = live ? min((uint)max(this_time[b], 0), s) : 0u;
        uint len = 0u;
        if (tt > 0u) {
            long base = (long)cu_out[b];
            long count = (long)max(step_idx[b], 0);
            long max_dec = (long)max_dec_len[b];
            bool stopped = false;
            bool skip_phase1 = encoder[b] > 0 || reasoning_status[b] == 1 || reject_all != 0u;
            bool accept_every = accept_all != 0u && reject_all == 0u;
            uint i = 0u;
            bool have_correction = false;
            int correction = -1;
            bool in_phase1 = !skip_phase1;
            while (in_phase1 && i + 1u < tt) {
                int d = draft_tokens[(ulong)b * s + i + 1u];
                long r = base + (long)i;
                bool row_ok = r >= 0 && r < (long)rows;
                bool accepted = false;
                if (d < 0 || (uint)d >= V) {
                    accepted = false;  // an out-of-vocabulary draft is never accepted
                } else if (accept_every) {
                    accepted = true;
                } else if (row_ok) {
#if STRATEGY == STRATEGY_GREEDY || STRATEGY == STRATEGY_TARGET_MATCH
                    accepted = d == target_tokens[r];
#elif STRATEGY == STRATEGY_TOPP
                    uint n = min((uint)max(cand_lens[r], 0), C);
                    for (uint k = 0; k < n; k++) accepted = accepted || cand_ids[(ulong)r * C + k] == d;
#endif
                }
                if (!accepted) {
                    in_phase1 = false;
                } else {
                    int e = emit_token(d, &count, max_dec, end_tokens, num_end, &stopped);
                    if (LID == 0u) out[len] = e;
                    len++;
                    if (stopped) in_phase1 = false;
                    else i++;
                }
            }
            if (!stopped) {
                int token = -1;
                if (have_correction) {
                    token = correction;
                } else {
                    long r = base + (long)i;
                    bool row_ok = r >= 0 && r < (long)rows;
                    if (row_ok) {
#if STRATEGY == STRATEGY_GREEDY || STRATEGY == STRATEGY_TARGET_MATCH
                        token = target_tokens[r];
#elif STRATEGY == STRATEGY_TOPP
                        uint n = min((uint)max(cand_lens[r], 0), C);
                        __global const int* ids = cand_ids + (ulong)r * C;
                        __global const uint* sc = cand_scores + (ulong)r * C;
                        ulong total = 0ul;
                        for (uint k = 0; k < n; k++) total += key_weight(rank_key(sc[k]));
                        if (total == 0ul) {
                            token = ids[0];
                        } else {
                            ulong t = scale_draw(draw64(seeds[r], PURPOSE_CANDIDATE), total);
                            ulong cum = 0ul;
                            token = ids[0];
                            bool found = false;
                            for (uint k = 0; k < n && !found; k++) {
                                cum += key_weight(rank_key(sc[k]));
                                if (cum > t) { token = ids[k]; found = true; }
                            }
                        }
#endif
                    }
                }
                if (token < 0 || (uint)token >= V) token = end_tokens[0];
                int e = emit_token(token, &count, max_dec, end_tokens, num_end, &stopped);
                if (LID == 0u) out[len] = e;
                len++;
            }
        }
        if (LID == 0u) accept_num[b] = (int)len;
    }
#endif
}
