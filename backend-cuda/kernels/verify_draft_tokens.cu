// verify_draft_tokens (`docs/semantics.md` §5.8): draft checks and the correction/bonus token, per slot.
//
// GREEDY, TARGET_MATCH and TOPP: `verify_draft_tokens_<t>`, one thread per slot; every decision
// reads a handful of values, so the whole step runs without a host round-trip.
// REJECTION: `verify_draft_tokens_rejection_prepare_<t>` computes, one block per row, each target
// row's raw total weight and its top-k/top-p kept set (select.cuh) and each draft row's total;
// `verify_draft_tokens_rejection_<t>` then runs one block per slot: the slot's control flow is
// executed by every thread of the block identically (it reads the same values), and the row-wide
// parts (the boundary count of weight_in_prefix, the residual draw, the target draw) are block
// collectives. Only thread 0 writes the slot's tokens.
// With `logits`, REJECTION's target and draft rows are logits, weighed by `docs/semantics.md` §4b at the
// temperature of the output row: the prepare kernel keeps each target row's weighing with its
// kept set and each draft row's maximum (its weighing depends on the temperature of the row it is
// checked against, known only per slot); the slot's check then weighs and totals the draft row.
// With `fallback`, REJECTION's sample of a target row of kept weight 0 is fallback[r] (§4c).
// With `draft_index`, REJECTION's draft rows are compact (§5.8.1): `draft_rows` rows, the row of
// draft i + 1 of slot b at draft_index[b · (S − 1) + i], read only when that draft is tested; an
// entry outside [0, draft_rows) rejects the draft and samples the target row.

// Per target row, what REJECTION needs (written by the prepare kernel).
struct TargetStats {
    u64 raw_total;  // total weight before filtering (probability rows)
    u64 kept_mass;  // Wp
    u64 w_c32;      // the row's weighing (Weigh, field for field)
    i32 w_e;
    u32 w_kind;
    u32 w_max_key;
    u32 w_first;
    u32 kept_key;
    u32 kept_take;
    u32 degenerate;  // the survivors weigh nothing
    u32 first;       // then: the first token in rank order
};

// The weighing of a target row, from its stats.
__device__ __forceinline__ Weigh stats_weigh(const TargetStats& st) {
    Weigh w;
    w.c32 = st.w_c32;
    w.e = st.w_e;
    w.kind = st.w_kind;
    w.max_key = st.w_max_key;
    w.first = st.w_first;
    return w;
}

__device__ __forceinline__ const TargetStats* target_stats(const VerifyArgs& a) {
    return reinterpret_cast<const TargetStats*>(a.stats);
}

// Per draft row (8 bytes): its total weight (probability rows), or its maximum as
// pack_key_id(logit_rank_key, id) (logits rows).
__device__ __forceinline__ u64* draft_stats(const VerifyArgs& a) {
    return reinterpret_cast<u64*>(a.stats + sizeof(TargetStats) * a.rows);
}

// The bit length of x (0 for 0).
__device__ __forceinline__ u32 bit_length(u64 x) { return x == 0 ? 0u : 64u - (u32)__clzll((long long)x); }

// The tokens a slot emits, with the stop rules of the contract.
struct Emitter {
    i32* tokens;
    u32 len;
    i64 count;
    i64 max_dec_len;
    const i32* end_tokens;
    u64 n_end;
    bool stopped;
    bool writer;
};

__device__ __forceinline__ bool is_end_token(const i32* end_tokens, u64 n_end, i32 token) {
    bool found = false;
    for (u64 e = 0; e < n_end; ++e) found = found || end_tokens[e] == token;
    return found;
}

// An end token is kept and stops the slot; the token that reaches max_dec_len is replaced by
// end_tokens[0] and stops the slot.
__device__ __forceinline__ void emit(Emitter& e, i32 token) {
    e.count += 1;
    i32 out = token;
    if (is_end_token(e.end_tokens, e.n_end, token)) {
        e.stopped = true;
    } else if (e.count >= e.max_dec_len) {
        e.stopped = true;
        out = e.end_tokens[0];
    }
    if (e.writer) e.tokens[e.len] = out;
    e.len += 1;
}

// Output row `row` as an index, or -1 when it does not exist.
__device__ __forceinline__ i64 existing_row(const VerifyArgs& a, i64 row) {
    return (row >= 0 && (u64)row < a.rows) ? row : -1;
}

__device__ __forceinline__ bool in_vocab(const VerifyArgs& a, i32 token) {
    return token >= 0 && (u32)token < a.vocab;
}

// The outcome of checking one draft.
struct Check {
    bool accepted;
    bool has_correction;  // REJECTION: the token to emit instead
    i32 correction;
};

// A rejected draft without a correction of its own: the phase-2 token follows.
__device__ __forceinline__ Check rejected() {
    Check c;
    c.accepted = false;
    c.has_correction = false;
    c.correction = -1;
    return c;
}

// The candidates of output row `row` that count (TOPP): its length, clamped to [0, C].
__device__ __forceinline__ u64 candidate_count(const VerifyArgs& a, i64 row) {
    const u64 n = len_or_zero(a.cand_lens[row]);
    return n < a.candidates ? n : a.candidates;
}

// GREEDY, TARGET_MATCH, TOPP: every decision is a few scalar reads.
struct ScalarPolicy {
    __device__ Check check(const VerifyArgs& a, u32 slot, u64 i, i32 d, i64 row) const {
        Check c = rejected();
        if (a.strategy == SPECULA_STRATEGY_TOPP) {
            if (row < 0) return c;
            const u64 n = candidate_count(a, row);
            const i32* ids = a.cand_ids + (u64)row * a.candidates;
            for (u64 k = 0; k < n; ++k) c.accepted = c.accepted || ids[k] == d;
            return c;
        }
        c.accepted = d == (row < 0 ? -1 : a.target_tokens[row]);
        return c;
    }

    // A draft outside [0, V): rejected, and the phase-2 token follows.
    __device__ Check reject_out_of_vocab(const VerifyArgs&, u32, u64, i64) const { return rejected(); }

    __device__ i32 phase2(const VerifyArgs& a, i64 row) const {
        if (row < 0) return -1;
        if (a.strategy != SPECULA_STRATEGY_TOPP) return a.target_tokens[row];
        const u64 n = candidate_count(a, row);
        const i32* ids = a.cand_ids + (u64)row * a.candidates;
        const float* scores = a.cand_scores + (u64)row * a.candidates;
        u64 total = 0;
        for (u64 k = 0; k < n; ++k) total += prob_weight(scores[k]);
        if (total == 0) return ids[0];
        const u64 t = scale_draw(specula_draw(a.seeds[row], SPECULA_PURPOSE_CANDIDATE), total);
        u64 cumulative = 0;
        for (u64 k = 0; k < n; ++k) {
            cumulative += prob_weight(scores[k]);
            if (cumulative > t) return ids[k];
        }
        return ids[0];
    }
};

// How the target row and the draft row of one check weigh, and the draft row's total Wq.
struct RowPair {
    Weigh target;
    Weigh draft;
    u64 wq_total;
};

// REJECTION: block collectives over the target and draft rows.
struct RejectionPolicy {
    SelShared* s;

    __device__ const SPECULA_T::raw* target_row(const VerifyArgs& a, u64 r) const {
        return a.target_probs + r * a.vocab;
    }

    __device__ const SPECULA_D::raw* draft_row(const VerifyArgs& a, u64 qrow) const {
        return a.draft_probs + qrow * a.vocab;
    }

    // The weighings of target row r and draft row qrow (at the temperature of r), and Wq: for
    // logits rows a block pass over the draft row.
    __device__ RowPair row_pair(const VerifyArgs& a, u64 r, u64 qrow, const TargetStats& st) const {
        RowPair pair;
        pair.target = stats_weigh(st);
        const u64 draft = draft_stats(a)[qrow];
        if (a.logits == 0) {
            pair.draft = weigh_by_key();
            pair.wq_total = draft;
            return pair;
        }
        pair.draft = logits_weigh((u32)(draft >> 32), packed_id(draft), a.temperature[r]);
        const Weigh dw = pair.draft;
        u64 m = 0;
        for_row_elements<SPECULA_D, SEL_BLOCK>(draft_row(a, qrow), a.vocab, a.vec_draft != 0,
                                               [&](u32 i, float x) { m += weight_of(dw, row_key(dw, x, i)); });
        pair.wq_total = block_sum_u64<SEL_BLOCK>(m, s->sa);
        return pair;
    }

    // sample_row of the target row r (`docs/semantics.md` §5.6) from its prepared kept set.
    __device__ i32 sample_target(const VerifyArgs& a, u64 r) const {
        const TargetStats st = target_stats(a)[r];
        // A row of kept weight 0 yields its fallback when given, else its first token in rank order.
        if (st.degenerate) return a.fallback != 0 ? a.fallback[r] : (i32)st.first;
        const Weigh w = stats_weigh(st);
        RowPart p = row_part_single(a.vocab, a.vec_target != 0);
        const u64 t = scale_draw(specula_draw(a.seeds[r], SPECULA_PURPOSE_SAMPLE), st.kept_mass);
        i32 id = draw_in_prefix<SPECULA_T>(target_row(a, r), p, *s, w, st.kept_key, st.kept_take, t);
        if (id < 0) id = (i32)first_in_rank<SPECULA_T, RankKeys>(target_row(a, r), p, *s, w);
        return id;
    }

    // Tokens with key `key` among ids [0, d) of row r (weighed by w).
    __device__ u64 count_key_before(const VerifyArgs& a, u64 r, const Weigh& w, u32 key, u32 d) const {
        u64 c = 0;
        for_row_elements<SPECULA_T, SEL_BLOCK>(target_row(a, r), d, a.vec_target != 0, [&](u32 i, float x) {
            if (row_key(w, x, i) == key) c += 1;
        });
        return block_sum_u64<SEL_BLOCK>(c, s->sa);
    }

    // ρ[v] = floor(max(0, wp·Wq − wq·Wp) / 2^shift) over the kept members in ascending id order:
    // returns the total (find = false), or the member whose running total first exceeds t.
    __device__ __noinline__ u64 residual(const VerifyArgs& a, u64 r, u64 qrow, const TargetStats& st,
                                         const RowPair& pair, u32 shift, bool find, u64 t) const {
        const SPECULA_T::raw* prow = target_row(a, r);
        const SPECULA_D::raw* q = draft_row(a, qrow);
        const Weigh& tw = pair.target;
        const Weigh& dw = pair.draft;
        RowPart pp = row_part_single(a.vocab, a.vec_target != 0);
        RowPart qp = row_part_single(a.vocab, a.vec_draft != 0);
        const u32 pkey = st.kept_key;
        const u64 ptake = st.kept_take;
        const u64 wb = weight_of(tw, pkey);
        u64 carry_b = 0, carry_rho = 0;
        if (threadIdx.x == 0) s->token = -1;
        __syncthreads();
        for (u32 base = 0; base < a.vocab; base += SEL_CHUNK) {
            float pv[SEL_ITEMS], qv[SEL_ITEMS];
            load_items<SPECULA_T>(prow, base, pp, pv);
            load_items<SPECULA_D>(q, base, qp, qv);
            const u32 i0 = base + threadIdx.x * SEL_ITEMS;
            u32 pkeys[SEL_ITEMS];
            const u32 bcount = item_keys<RankKeys>(tw, pv, i0, a.vocab, pkey, pkeys);
            u64 ex_b, tot_b, dummy_ex, dummy_tot;
            block_scan_pair<SEL_BLOCK, u64, u64>((u64)bcount, 0ull, ex_b, dummy_ex, tot_b, dummy_tot, s->sa,
                                                 reinterpret_cast<u64*>(s->mass));
            u64 cb = carry_b + ex_b;
            u64 rho[SEL_ITEMS];
            u64 local = 0;
#pragma unroll
            for (int j = 0; j < SEL_ITEMS; ++j) {
                rho[j] = 0;
                if (i0 + j >= a.vocab) continue;
                const u32 key = pkeys[j];
                u64 wp = 0;
                if (key > pkey) {
                    wp = weight_of(tw, key);
                } else if (key == pkey) {
                    wp = cb < ptake ? wb : 0;
                    cb += 1;
                }
                if (wp == 0) continue;  // not a member, or a member of zero weight: ρ = 0
                const u128 lhs = mul_64x64(wp, pair.wq_total);
                const u128 rhs = mul_64x64(weight_of(dw, row_key(dw, qv[j], i0 + j)), st.kept_mass);
                rho[j] = u128_lt(rhs, lhs) ? u128_shr_fit(u128_sub(lhs, rhs), shift) : 0;
                local += rho[j];
            }
            u64 ex_r, tot_r, ex2, tot2;
            block_scan_pair<SEL_BLOCK, u64, u64>(local, 0ull, ex_r, ex2, tot_r, tot2, s->sa,
                                                 reinterpret_cast<u64*>(s->mass));
            if (find) {
                u64 before = carry_rho + ex_r;
#pragma unroll
                for (int j = 0; j < SEL_ITEMS; ++j) {
                    if (rho[j] != 0 && before <= t && t < before + rho[j]) s->token = (i32)(i0 + j);
                    before += rho[j];
                }
                __syncthreads();
                const i32 found = s->token;
                __syncthreads();
                if (found >= 0) return (u64)found;
            }
            carry_b += tot_b;
            carry_rho += tot_r;
        }
        return find ? SPECULA_U32_MAX : carry_rho;
    }

    __device__ Check check(const VerifyArgs& a, u32 slot, u64 i, i32 d, i64 row) const {
        Check c = rejected();
        if (row < 0) return c;
        const u64 r = (u64)row;
        const u64 dense = (u64)slot * (a.max_step_tokens - 1) + i;
        // The draft's row (the same for the whole block): dense, or the index's entry.
        const i64 entry = a.draft_index != 0 ? (i64)a.draft_index[dense] : (i64)dense;
        c.has_correction = true;
        if (entry < 0 || (u64)entry >= a.draft_rows) {
            // No such draft row: reject, sample the target (`docs/semantics.md` §5.8.1).
            c.correction = sample_target(a, r);
            return c;
        }
        const u64 qrow = (u64)entry;
        const TargetStats st = target_stats(a)[r];
        const RowPair pair = row_pair(a, r, qrow, st);
        const u64 wq_total = pair.wq_total;
        // Only probability rows can fail to be a distribution (their weights are bounded by 2^40
        // each, not normalised); a logits row always is one.
        const bool not_distributions = a.logits == 0 && (st.raw_total >= SPECULA_REJECTION_MAX_TOTAL_WEIGHT ||
                                                         wq_total >= SPECULA_REJECTION_MAX_TOTAL_WEIGHT);
        if (not_distributions || st.degenerate) {
            // Not distributions, or a target that weighs nothing: reject, sample the target.
            c.correction = sample_target(a, r);
            return c;
        }
        // An id outside [0, V) weighs 0 in both rows (the same branch for the whole block).
        u64 wp_d = 0, wq_d = 0;
        if (in_vocab(a, d)) {
            const u32 du = (u32)d;
            const u32 key_d = row_key(pair.target, SPECULA_T::widen(target_row(a, r)[du]), du);
            if (key_d > st.kept_key) {
                wp_d = weight_of(pair.target, key_d);
            } else if (key_d == st.kept_key) {
                wp_d = count_key_before(a, r, pair.target, key_d, du) < (u64)st.kept_take
                           ? weight_of(pair.target, key_d)
                           : 0;
            }
            wq_d = weight_of(pair.draft, row_key(pair.draft, SPECULA_D::widen(draft_row(a, qrow)[du]), du));
        }
        const u64 seed = a.seeds[r];
        const u64 u = specula_draw(seed, SPECULA_PURPOSE_ACCEPT) >> 32;
        bool accepted;
        if (wq_d == 0) {
            accepted = wp_d > 0;
        } else {
            // u · wq[d] · Wp < 2^32 · wp[d] · Wq, exact: both sides reach 2^133 on logits rows.
            const u192 lhs = u192_mul_128x64(mul_64x64(u, wq_d), st.kept_mass);
            const u192 rhs = u192_shl_128(mul_64x64(wp_d, wq_total), 32);
            accepted = u192_lt(lhs, rhs);
        }
        if (accepted) {
            c.accepted = true;
            c.has_correction = false;
            return c;
        }
        // The residual's scale: 2^41 for probability rows; for logits rows
        // 2^max(0, bitlength(Wp) + bitlength(Wq) − 60), so that Σρ < 2^60.
        u32 shift = 41;
        if (a.logits != 0) {
            const u32 bits = bit_length(st.kept_mass) + bit_length(wq_total);
            shift = bits > 60 ? bits - 60 : 0;
        }
        const u64 total = residual(a, r, qrow, st, pair, shift, false, 0);
        if (total == 0) {
            c.correction = sample_target(a, r);
            return c;
        }
        const u64 t = scale_draw(specula_draw(seed, SPECULA_PURPOSE_RESIDUAL), total);
        const u64 v = residual(a, r, qrow, st, pair, shift, true, t);
        if (v == SPECULA_U32_MAX) {
            // Unreachable (t < the residual total); the first token is the safe answer.
            RowPart p = row_part_single(a.vocab, a.vec_target != 0);
            c.correction = (i32)first_in_rank<SPECULA_T, RankKeys>(target_row(a, r), p, *s, pair.target);
        } else {
            c.correction = (i32)v;
        }
        return c;
    }

    // A draft outside [0, V) weighs 0 in both rows: the check rejects it and the correction comes
    // from the residual (RESIDUAL draw; SAMPLE only when the residual is empty), like any rejected
    // draft (`docs/semantics.md` §5.8).
    __device__ Check reject_out_of_vocab(const VerifyArgs& a, u32 slot, u64 i, i64 row) const {
        return check(a, slot, i, -1, row);
    }

    __device__ i32 phase2(const VerifyArgs& a, i64 row) const {
        if (row < 0) return -1;
        return sample_target(a, (u64)row);
    }
};

// One slot (`docs/semantics.md` §5.8). Every caller thread runs it with the same inputs; `writer` threads
// store the tokens (the caller has filled the row with -1 and synchronised).
template <class P>
__device__ i32 verify_slot(const VerifyArgs& a, u32 b, const P& policy, bool writer) {
    if (b >= a.real_bsz || a.stop_flags[b] != 0 || a.is_block_step[b] != 0) return 0;
    const u64 s = a.max_step_tokens;
    u64 this_time = len_or_zero(a.this_time[b]);
    this_time = this_time < s ? this_time : s;
    if (this_time == 0) return 0;
    const i64 base = a.cu_out[b];
    Emitter out;
    out.tokens = a.accept_tokens + (u64)b * s;
    out.len = 0;
    out.count = a.step_idx[b] > 0 ? a.step_idx[b] : 0;
    out.max_dec_len = a.max_dec_len[b];
    out.end_tokens = a.end_tokens;
    out.n_end = a.n_end;
    out.stopped = false;
    out.writer = writer;
    const bool skip_phase1 = a.encoder[b] > 0 || a.reasoning[b] == 1 || a.reject_all != 0;
    u64 i = 0;
    bool has_correction = false;
    i32 correction = -1;
    if (!skip_phase1) {
        while (i + 1 < this_time) {
            const i32 d = a.draft_tokens[(u64)b * s + i + 1];
            Check c;
            if (!in_vocab(a, d)) {
                // An out-of-vocabulary draft is never accepted, whatever the strategy or flags.
                c = policy.reject_out_of_vocab(a, b, i, existing_row(a, base + (i64)i));
            } else if (a.accept_all != 0) {
                c.accepted = true;
                c.has_correction = false;
            } else {
                c = policy.check(a, b, i, d, existing_row(a, base + (i64)i));
            }
            if (!c.accepted) {
                has_correction = c.has_correction;
                correction = c.correction;
                break;
            }
            emit(out, d);
            if (out.stopped) return (i32)out.len;
            i += 1;
        }
    }
    i32 token = has_correction ? correction : policy.phase2(a, existing_row(a, base + (i64)i));
    // A token outside the vocabulary (a missing row, or candidates a caller made) ends the slot.
    if (!in_vocab(a, token)) token = a.end_tokens[0];
    emit(out, token);
    return (i32)out.len;
}

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(verify_draft_tokens)(const VerifyArgs a) {
    const u32 b = blockIdx.x * SPECULA_BATCH_BLOCK + threadIdx.x;
    if (b >= a.max_bsz) return;
    i32* row = a.accept_tokens + (u64)b * a.max_step_tokens;
    for (u64 k = 0; k < a.max_step_tokens; ++k) row[k] = -1;
    ScalarPolicy policy;
    a.accept_num[b] = verify_slot(a, b, policy, true);
}

extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    SPECULA_ENTRY(verify_draft_tokens_rejection_prepare)(const VerifyArgs a) {
    __shared__ SelShared s;
    const u64 blk = blockIdx.x;
    const bool logits = a.logits != 0;
    if (blk < a.rows) {
        const u64 r = blk;
        const SPECULA_T::raw* row = a.target_probs + r * a.vocab;
        RowPart p = row_part_single(a.vocab, a.vec_target != 0);
        const Weigh w = row_weigh<SPECULA_T>(row, p, s, logits, logits ? a.temperature[r] : 1.0f);
        // The "not a distribution" total is a rule of probability rows only.
        const u64 raw_total = logits ? 0 : row_total_weight<SPECULA_T>(row, p, s, w);
        const Kept k = kept_set<SPECULA_T>(row, p, s, w, a.vocab, a.top_k[r], top_p_fixed(a.top_p[r]));
        if (threadIdx.x == 0) {
            TargetStats st;
            st.raw_total = raw_total;
            st.kept_mass = k.prefix.mass;
            st.w_c32 = w.c32;
            st.w_e = w.e;
            st.w_kind = w.kind;
            st.w_max_key = w.max_key;
            st.w_first = w.first;
            st.kept_key = k.prefix.key;
            st.kept_take = k.prefix.take;
            st.degenerate = k.degenerate ? 1u : 0u;
            st.first = k.first;
            reinterpret_cast<TargetStats*>(a.stats)[r] = st;
        }
    } else if (blk < a.rows + a.draft_rows) {
        const u64 qrow = blk - a.rows;
        const SPECULA_D::raw* row = a.draft_probs + qrow * a.vocab;
        RowPart p = row_part_single(a.vocab, a.vec_draft != 0);
        if (logits) {
            // The maximum only: the weighing needs the temperature of the row it is checked against.
            const Weigh w = row_weigh<SPECULA_D>(row, p, s, true, 1.0f);
            if (threadIdx.x == 0) draft_stats(a)[qrow] = pack_key_id(w.max_key, w.first);
        } else {
            const u64 total = row_total_weight<SPECULA_D>(row, p, s, weigh_by_key());
            if (threadIdx.x == 0) draft_stats(a)[qrow] = total;
        }
    }
}

extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    SPECULA_ENTRY(verify_draft_tokens_rejection)(const VerifyArgs a) {
    __shared__ SelShared s;
    const u32 b = blockIdx.x;
    if (b >= a.max_bsz) return;
    i32* row = a.accept_tokens + (u64)b * a.max_step_tokens;
    for (u64 k = threadIdx.x; k < a.max_step_tokens; k += SEL_BLOCK) row[k] = -1;
    __syncthreads();
    RejectionPolicy policy;
    policy.s = &s;
    const i32 n = verify_slot(a, b, policy, threadIdx.x == 0);
    if (threadIdx.x == 0) a.accept_num[b] = n;
}
