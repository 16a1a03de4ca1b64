// verify_draft_tokens (§5.8): one cluster per slot (cluster-stride over max_bsz).
//
// STRATEGY (injected): 0 GREEDY, 1 TARGET_MATCH, 2 TOPP, 3 REJECTION. The slot's control flow is
// scalar; for GREEDY / TARGET_MATCH / TOPP it runs on core 0 alone. For REJECTION every core runs
// the same control flow (so every decision is uniform across the cluster) and joins the row
// primitives (row totals, radix selections, the residual draw) on the target and draft rows; only
// core 0 writes the slot's outputs. T_DTYPE / D_DTYPE are the target and draft storage formats;
// with LOGITS both rows are logits, weighed by §4b at the temperature of the output row.
// With a fallback input (has_fallback), a target row whose kept weight is 0 yields rj_fallback[r]
// (§4c) wherever REJECTION samples it, instead of its first token in rank order.

#define STRATEGY_GREEDY 0
#define STRATEGY_TARGET_MATCH 1
#define STRATEGY_TOPP 2
#define STRATEGY_REJECTION 3

// struct VerifyDraftTokensArgs: generated from src/ops/verify_draft_tokens.rs.

// The tokens a slot emits, with the stop rules of §5.8 (core 0 stores them).
typedef struct {
    __global int* out;               // the slot's accept_tokens row
    __global const int* end_tokens;
    uint num_end;
    uint len;                        // tokens emitted so far
    long count;                      // the slot's step count, one more per token
    long max_dec;
    bool stopped;
} Emitter;

// An end token is kept and stops the slot; the token that reaches max_dec_len is replaced by
// end_tokens[0] and stops the slot.
inline void emit(Emitter* e, int token) {
    e->count += 1;
    bool is_end = false;
    for (uint k = 0; k < e->num_end; k++) is_end = is_end || e->end_tokens[k] == token;
    int stored = token;
    if (is_end) {
        e->stopped = true;
    } else if (e->count >= e->max_dec) {
        e->stopped = true;
        stored = e->end_tokens[0];
    }
    if (LID == 0u) e->out[e->len] = stored;
    e->len++;
}

// Whether output row r exists.
inline bool row_exists(long r, uint rows) { return r >= 0 && r < (long)rows; }

inline bool in_vocab(int token, uint V) { return token >= 0 && (uint)token < V; }

#if STRATEGY == STRATEGY_TOPP
// The candidates of output row r that count: its length, clamped to [0, C].
inline uint candidate_count(__global const int* cand_lens, ulong r, uint C) {
    return min((uint)max(cand_lens[r], 0), C);
}
#endif

#if STRATEGY == STRATEGY_REJECTION
// How the tokens of draft row q weigh: by key for probability rows; a logits draft row from its own
// maximum, at the temperature t_bits of the output row it is checked against (§4b).
inline Weigh draft_weigh(__global const D_STORE* q, uint V, __local Scratch* S, uint t_bits) {
#if LOGITS
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint best_key = 0u, best_id = 0u;
    for (uint i = lo; i < hi; i++) {
        uint key = logit_rank_key(LOAD_D(q, i));
        if (key > best_key) { best_key = key; best_id = i; }
    }
    return weigh_logits_row(best_key, best_id, t_bits, S);
#else
    return by_key();
#endif
}

// The weight of token i of draft row q weighed by w.
inline ulong draft_weight(__global const D_STORE* q, Weigh w, uint i) {
    return weight_of(w, row_key(w, KEY_RANK, LOAD_D(q, i), i));
}

// Total weight of a draft row.
inline ulong draft_mass(__global const D_STORE* q, uint V, __local Scratch* S, Weigh w) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    ulong m = 0ul;
    for (uint i = lo; i < hi; i++) m += draft_weight(q, w, i);
    return cluster_sum(m, S);
}

inline uint bit_length(ulong x) { return 64u - (uint)clz(x); }

// The scale k of the residual (its weights are floor(max(0, wp * Wq - wq * Wp) / 2^k)): 41 for
// probability rows; for logits rows max(0, bitlength(Wp) + bitlength(Wq) - 60), so that the
// residual's total stays below 2^60.
inline uint residual_shift(ulong wp_total, ulong wq_total) {
#if LOGITS
    uint bits = bit_length(wp_total) + bit_length(wq_total);
    return bits > 60u ? bits - 60u : 0u;
#else
    return 41u;
#endif
}

// Whether the totals of target and draft rows make a REJECTION test: always for logits rows; a
// probability row weighing 2^41 or more is not a distribution (the draft is then rejected and the
// target row sampled).
inline bool distributions(ulong wp_row_total, ulong wq_total) {
#if LOGITS
    return true;
#else
    return wp_row_total < (ulong)REJECTION_MAX_TOTAL_WEIGHT &&
           wq_total < (ulong)REJECTION_MAX_TOTAL_WEIGHT;
#endif
}

// The acceptance test with U = the high 32 bits of the ACCEPT draw: U * wq[d] * Wp < 2^32 * wp[d] *
// Wq, exact (up to 2^133); if wq[d] == 0, accept iff wp[d] > 0.
inline bool accepts(ulong u, ulong wp_d, ulong wq_d, ulong wp_total, ulong wq_total) {
    if (wq_d == 0ul) return wp_d > 0ul;
    u192 lhs = mul_128x64(mul_64x64(u, wq_d), wp_total);
    u192 rhs = shl_128(mul_64x64(wp_d, wq_total), 32u);
    return lt_192(lhs, rhs);
}

// One step of REJECTION for slot output row r (target row p at temperature t_bits, V_row = V when
// it exists, else 0) and draft row q (Vq = V while a draft is tested, else 0): every row quantity
// the step may need, all computed unconditionally (no barrier under a branch), the decision taken
// afterwards. A draft id outside [0, V) weighs 0 in both rows (§5.8): it is rejected by the
// test like any other draft of target weight 0, and the correction comes from the residual.
typedef struct {
    bool accepted;    // draft d accepted
    int token;        // when rejected: the correction, or the target row's sample
} RejectionStep;

inline RejectionStep rejection_step(__global const T_STORE* p, uint V_row,
                                    __global const D_STORE* q, uint Vq, __local Scratch* S, int d,
                                    uint t_bits, int top_k, uint top_p_bits, ulong seed,
                                    bool has_fallback, int fallback) {
    KeptSet k = kept_set(p, V_row, S, row_weigh(p, V_row, S, t_bits), top_k, top_p_bits);
    Residual rs;
    rs.q = q;
    rs.w = draft_weigh(q, Vq, S, t_bits);
    rs.wq_total = draft_mass(q, Vq, S, rs.w);
    rs.wp_total = k.kept.mass;
    rs.shift = residual_shift(rs.wp_total, rs.wq_total);
    rs.on = Vq != 0u ? 1u : 0u;
    bool d_in = d >= 0 && (uint)d < V_row;
    // Out of the vocabulary: index V_row, which weight_in_prefix weighs 0.
    uint d_index = d_in ? (uint)d : V_row;
    ulong wp_d = weight_in_prefix(p, V_row, S, k.weigh, k.kept, d_index);
    int resid = prefix_draw(p, V_row, S, k.weigh, k.kept, draw64(seed, PURPOSE_RESIDUAL),
                            rs);
    int sampled = sample_kept(p, V_row, S, k, seed);

    RejectionStep step;
    step.accepted = false;
    // A target sample weighs nothing exactly when the kept weight is 0: the fallback, if given.
    if (has_fallback && k.survivors_mass == 0ul) sampled = fallback;
    step.token = V_row == 0u ? -1 : sampled;
    bool checkable = Vq != 0u && V_row != 0u;
    if (!checkable) return step;
    // Not distributions, or a target that weighs nothing: reject and sample the target row.
    if (!distributions(k.stats.mass, rs.wq_total) || k.survivors_mass == 0ul) return step;
    ulong wq_d = d_in ? draft_weight(q, rs.w, d_index) : 0ul;
    if (accepts(draw64(seed, PURPOSE_ACCEPT) >> 32, wp_d, wq_d, rs.wp_total, rs.wq_total)) {
        step.accepted = true;
        step.token = d;
        return step;
    }
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
                    BUF(const T_STORE, target_scores), BUF(const uint, temperature),
                    BUF(const D_STORE, draft_scores), BUF(const int, rj_top_k),
                    BUF(const uint, rj_top_p), BUF(const int, rj_fallback),
                    BUF(const int, draft_index), BUF(int, accept_tokens), BUF(int, accept_num),
                    const struct VerifyDraftTokensArgs args) {
    BIND(const int, draft_tokens, this_time, encoder, cu_out, reasoning_status);
    BIND(const int, step_idx, max_dec_len, end_tokens, target_tokens, cand_ids);
    BIND(const int, cand_lens, rj_top_k, rj_fallback, draft_index);
    BIND(const uchar, stop_flags, is_block_step);
    BIND(const ulong, seeds);
    BIND(const uint, cand_scores, temperature, rj_top_p);
    BIND(const T_STORE, target_scores);
    BIND(const D_STORE, draft_scores);
    BIND(int, accept_tokens, accept_num);
    const uint max_bsz = args.max_bsz, real_bsz = args.real_bsz, s = args.max_step_tokens;
    const uint rows = args.rows, V = args.vocab, num_end = args.num_end, C = args.candidates;
    const uint accept_all = args.accept_all, reject_all = args.reject_all;
    __local Scratch S[1];
#if STRATEGY != STRATEGY_REJECTION
    if (LID != 0u) return;  // the slot's control flow is scalar: core 0 alone
#endif
    const bool accept_every = accept_all != 0u && reject_all == 0u;
    FOR_CLUSTER_ROWS(b, max_bsz) {
        __global int* out = accept_tokens + (ulong)b * s;
        if (LID == 0u) for (uint k = 0; k < s; k++) out[k] = -1;
        bool live = b < real_bsz && stop_flags[b] == 0 && is_block_step[b] == 0;
        uint tt = live ? min((uint)max(this_time[b], 0), s) : 0u;
        uint slot = b < real_bsz ? b : 0u;  // a slot whose state can be read
        Emitter e = {out, end_tokens, num_end, 0u, (long)max(step_idx[slot], 0),
                     (long)max_dec_len[slot], false};
        long base = tt > 0u ? (long)cu_out[b] : 0l;
        bool skip_phase1 = encoder[b] > 0 || reasoning_status[b] == 1 || reject_all != 0u;
        uint i = 0u;
#if STRATEGY == STRATEGY_REJECTION
        // Every core runs the slot's control flow (uniform); one loop iteration per output row of
        // the slot, each with the same straight-line sequence of row primitives.
        bool done = tt == 0u;
        while (!done) {
            long r = base + (long)i;
            bool row_ok = row_exists(r, rows);
            bool checking = !skip_phase1 && i + 1u < tt;
            int d = checking ? draft_tokens[(ulong)b * s + i + 1u] : -1;
            bool d_ok = in_vocab(d, V);
            ulong rr = row_ok ? (ulong)r : 0ul;
            bool has_fallback = row_ok && args.has_fallback != 0u;
            // Every draft is tested (an out-of-vocabulary one weighs 0 and is rejected by the
            // test, under accept_all too), except that accept_all accepts the drafts in [0, V)
            // untested.
            bool tested = checking && row_ok && (!accept_every || !d_ok);
            // The draft's row: dense, or the index's entry, read only for a tested draft; an
            // entry outside [0, draft_rows) leaves the draft untestable (Vq = 0): rejected, the
            // target row sampled (§5.8.1).
            ulong dense = (ulong)b * (s - 1u) + i;
            long q_row = !tested ? 0l
                         : args.has_draft_index != 0u ? (long)draft_index[dense] : (long)dense;
            bool q_ok = tested && q_row >= 0l && q_row < (long)args.draft_rows;
            ulong draft_row = q_ok ? (ulong)q_row : 0ul;
            RejectionStep step = rejection_step(
                target_scores + rr * V, row_ok ? V : 0u, draft_scores + draft_row * V,
                q_ok ? V : 0u, S, d,
                row_ok ? ROW_TEMPERATURE(temperature, rr) : ONE_KEY, row_ok ? rj_top_k[rr] : 0,
                row_ok ? rj_top_p[rr] : ONE_KEY, row_ok ? seeds[rr] : 0ul,
                has_fallback, has_fallback ? rj_fallback[rr] : -1);
            bool accepted = checking && d_ok && (accept_every || (row_ok && step.accepted));
            // Otherwise the correction, the target's sample, or -1 (no row).
            int token = accepted ? d : step.token;
            emit(&e, in_vocab(token, V) ? token : end_tokens[0]);
            if (!accepted || e.stopped) done = true;
            else i++;
        }
#else
        // Phase 1: the drafts, while accepted (an out-of-vocabulary draft never is).
        while (!skip_phase1 && i + 1u < tt) {
            int d = draft_tokens[(ulong)b * s + i + 1u];
            long r = base + (long)i;
            bool accepted = in_vocab(d, V) && accept_every;
            if (in_vocab(d, V) && !accept_every && row_exists(r, rows)) {
#if STRATEGY == STRATEGY_GREEDY || STRATEGY == STRATEGY_TARGET_MATCH
                accepted = d == target_tokens[r];
#elif STRATEGY == STRATEGY_TOPP
                uint n = candidate_count(cand_lens, (ulong)r, C);
                for (uint k = 0; k < n; k++) accepted = accepted || cand_ids[(ulong)r * C + k] == d;
#endif
            }
            if (!accepted) break;
            emit(&e, d);
            if (e.stopped) break;
            i++;
        }
        // Phase 2: the token of the row after the accepted drafts.
        if (tt > 0u && !e.stopped) {
            long r = base + (long)i;
            int token = -1;
            if (row_exists(r, rows)) {
#if STRATEGY == STRATEGY_GREEDY || STRATEGY == STRATEGY_TARGET_MATCH
                token = target_tokens[r];
#elif STRATEGY == STRATEGY_TOPP
                uint n = candidate_count(cand_lens, (ulong)r, C);
                __global const int* ids = cand_ids + (ulong)r * C;
                __global const uint* sc = cand_scores + (ulong)r * C;
                ulong total = 0ul;
                for (uint k = 0; k < n; k++) total += key_weight(rank_key(sc[k]));
                token = ids[0];
                if (total != 0ul) {
                    ulong t = scale_draw(draw64(seeds[r], PURPOSE_CANDIDATE), total);
                    ulong cum = 0ul;
                    bool found = false;
                    for (uint k = 0; k < n && !found; k++) {
                        cum += key_weight(rank_key(sc[k]));
                        if (cum > t) { token = ids[k]; found = true; }
                    }
                }
#endif
            }
            emit(&e, in_vocab(token, V) ? token : end_tokens[0]);
        }
#endif
        if (LID == 0u) accept_num[b] = (int)e.len;
    }
}
