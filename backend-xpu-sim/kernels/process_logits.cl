// process_logits (docs/semantics.md 5.12, 4c): one cluster per row of the block (`rows` rows from
// scores row `first`; output row i is scores row first + i), in four barrier phases. A row holds
// the `width` ids `slice_first ..` of the tables' `vocab`: the whole vocabulary, or one rank's
// slice of sharded rows (4d). Every table is read by global id; a rule on a token outside the
// slice writes nothing; the fallback is a global id; a slice applies no min_p (the sharded ops
// apply it against the whole row's maximum).
//  1. Dense (every core, its contiguous slice): the masks of `allowed` and `bitmask`, and for a
//     logits row the float steps with the slot's table counts and no bias; a padding row (no slot)
//     masks every token.
//  2. Sparse (core 0): every token a sparse rule touches is recomputed from its input value with
//     the complete rule: bias entries and the drafts before the row (the count delta), then the
//     end tokens (min_tokens) and the bad-word bans are masked (masks override every float step).
//  3. Fallback: the best (rank key, lowest id) unmasked token, a cluster collective (-1 if none).
//  4. min_p (§4b weights at the row's temperature, or w(p)), and masked tokens become -inf
//     (logits) or 0 (probabilities).
// Masked tokens carry MASK_MARK between the phases: a NaN pattern that no processed value has
// (a NaN logit is read as -inf), so masked and unmasked -inf tokens stay apart.
// Every float step is one IEEE f32 operation (FP_CONTRACT OFF, no fast-math) whose result is read
// through sanitize_logit, exactly as specula_reference does it; a token whose steps end on its
// sanitized input keeps its logit.

// struct ProcessLogitsArgs: generated from src/ops/process_logits.rs.

#define MASK_MARK 0x7fc0deadu
#define MAX_COUNT 16777216l       // 2^24: the largest count the frequency penalty sees
#define MIN_P_BITS 24
#define FACTOR_MIN_BITS 0x2f800000u  // 2^-32: the repetition factors' range
#define FACTOR_MAX_BITS 0x4f800000u  // 2^32
#define PENALTY_FIELDS 5u

#if LOGITS
#define MASKED_BITS NEG_INF_BITS
#else
#define MASKED_BITS 0u
#endif

// An additive parameter (bias, beta, gamma) as the float steps read it: NaN is 0, |x| below 2^-76
// is 0, |x| above 2^64 (+-inf included) is +-2^64.
inline uint additive_bits(uint b) {
    uint a = b & 0x7fffffffu;
    if (a > POS_INF_BITS) return 0u;
    if (a > LOGIT_HUGE_BITS) return (b & 0x80000000u) | LOGIT_HUGE_BITS;
    return sanitize_logit(b);
}

// A repetition factor in [2^-32, 2^32] (NaN and negative values are not).
inline bool factor_ok(uint b) { return b >= FACTOR_MIN_BITS && b <= FACTOR_MAX_BITS; }

// The slot's float parameters as the steps read them.
typedef struct {
    uint alpha;       // f32 bits
    uint inverse;     // f32 bits
    uint repetition;  // both factors usable
    uint frequency;   // additive_bits
    uint presence;    // additive_bits
} Penalties;

// The float steps of one unmasked logit (4c) on its sanitized value `read`: bias, repetition,
// frequency and presence, each one f32 operation read through sanitize_logit. `bias` is
// additive_bits of the value.
inline uint stepped_logit(uint read, bool has_bias, uint bias, bool in_prompt, long count,
                          Penalties p) {
    uint l = read;
    if (has_bias) {
        float sum = as_float(l) + as_float(bias);
        l = sanitize_logit(as_uint(sum));
    }
    if (p.repetition != 0u && (in_prompt || count > 0l)) {
        float f = as_float(l);
        float scaled = f > 0.0f ? f * as_float(p.inverse) : f * as_float(p.alpha);
        l = sanitize_logit(as_uint(scaled));
    }
    if (count > 0l) {
        float penalty = as_float(p.frequency) * (float)count;
        float after = as_float(l) - penalty;
        l = sanitize_logit(as_uint(after));
        float present = as_float(l) - as_float(p.presence);
        l = sanitize_logit(as_uint(present));
    }
    return l;
}

// The processed value of the unmasked logit `x` (f32 bits): the float steps' result, or, when they
// end on the value they started from (the sanitized input; every sanitized value has one bit
// pattern, +0 for zero), the input logit itself (NaN as -inf): a token no step changes keeps its
// rank.
inline uint process_logit(uint x, bool has_bias, uint bias, bool in_prompt, long count,
                          Penalties p) {
    uint read = sanitize_logit(x);
    uint l = stepped_logit(read, has_bias, bias, in_prompt, count, p);
    if (l != read) return l;
    return (x & 0x7fffffffu) > POS_INF_BITS ? NEG_INF_BITS : x;
}

// The list range [offsets[b], offsets[b + 1]) of a list of `len` entries; empty when invalid.
inline void list_range(__global const int* offsets, uint b, uint len, uint* start, uint* end) {
    int s = offsets[b], e = offsets[b + 1u];
    bool ok = s >= 0 && e >= s && (uint)e <= len;
    *start = ok ? (uint)s : 0u;
    *end = ok ? (uint)e : 0u;
}

// Element of the row holding token t (a global id), or -1 when the row's ids do not hold it.
inline long slice_index(int t, uint first, uint width) {
    if (t < 0 || (uint)t < first || (uint)t - first >= width) return -1l;
    return (long)((uint)t - first);
}

// Bit v of the mask row starting at word `row_word` is 0.
inline bool bit_clear(__global const uint* mask, ulong row_word, uint v) {
    return ((mask[row_word + (v >> 5)] >> (v & 31u)) & 1u) == 0u;
}

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature),
                    BUF(const int, cu_out), BUF(const int, batch_id),
                    BUF(const int, token_ids_all), BUF(const int, prompt_lens),
                    BUF(const int, step_idx), BUF(const int, draft_tokens),
                    BUF(const int, token_counts), BUF(const uint, prompt_mask),
                    BUF(const uint, penalties), BUF(const int, min_tokens),
                    BUF(const int, end_tokens), BUF(const int, bias_offsets),
                    BUF(const int, bias_ids), BUF(const uint, bias_values),
                    BUF(const int, bad_word_offsets), BUF(const int, bad_words),
                    BUF(const uint, allowed), BUF(const uint, bitmask), BUF(uint, processed),
                    BUF(int, fallback), const struct ProcessLogitsArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const uint, temperature, prompt_mask, penalties, bias_values, allowed, bitmask);
    BIND(const int, cu_out, batch_id, token_ids_all, prompt_lens, step_idx);
    BIND(const int, draft_tokens, token_counts, min_tokens, end_tokens);
    BIND(const int, bias_offsets, bias_ids, bad_word_offsets, bad_words);
    BIND(uint, processed);
    BIND(int, fallback);
    const uint rows = args.rows, V = args.vocab, S_TOK = args.max_step_tokens;
    // The row's ids: [first_id, first_id + W) of V (the whole vocabulary: 0 and V).
    const uint first_id = args.slice_first, W = args.width;
    const uint real_bsz = args.real_bsz, words = (args.vocab + 31u) / 32u;
    const uint has_allowed = args.has_allowed, has_bitmask = args.has_bitmask;
    const ulong mml = args.max_model_len;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(i, rows) {
        // Output row i is scores row r = first + i: every per-row input is read at r.
        const uint r = args.first + i;
        __global const T_STORE* row = matrix + (ulong)r * W;
        __global uint* out = processed + (ulong)i * W;
        // (a) The row's slot and position (uniform over the cluster).
        int bid = batch_id[r];
        bool valid = bid >= 0 && (uint)bid < real_bsz;
        uint b = valid ? (uint)bid : 0u;
        long pos_l = valid ? (long)r - (long)cu_out[b] : -1l;
        valid = valid && pos_l >= 0l && pos_l < (long)S_TOK;
        uint pos = valid ? (uint)pos_l : 0u;
        Penalties pen;
        pen.alpha = 0u; pen.inverse = 0u; pen.repetition = 0u; pen.frequency = 0u; pen.presence = 0u;
        uint bias_start = 0u, bias_end = 0u, bad_start = 0u, bad_end = 0u;
        ulong gen_start = 0ul, gen_len = 0ul, min_p = 0ul;
        bool end_active = false;
        const ulong counts_row = (ulong)b * V, slot_words = (ulong)b * words;
        const ulong row_words = (ulong)r * words, drafts = (ulong)b * S_TOK + 1ul;
        if (valid) {
            __global const uint* p = penalties + (ulong)b * PENALTY_FIELDS;
            pen.alpha = p[0];
            pen.inverse = p[1];
            pen.repetition = factor_ok(p[0]) && factor_ok(p[1]) ? 1u : 0u;
            pen.frequency = additive_bits(p[2]);
            pen.presence = additive_bits(p[3]);
            uint mp = p[4];
            // min_p > 0 (NaN, zero and negative values are off); values above 1 count as 1.
            // Whole rows only.
            bool on = W == V && (mp & 0x80000000u) == 0u && mp != 0u && mp <= POS_INF_BITS;
            min_p = on ? top_p_fixed(mp) : 0ul;
            list_range(bias_offsets, b, args.num_bias, &bias_start, &bias_end);
            list_range(bad_word_offsets, b, args.num_bad_words, &bad_start, &bad_end);
            ulong prompt = min((ulong)max(prompt_lens[b], 0), mml);
            ulong end = min(prompt + (ulong)max(step_idx[b], 0), mml);
            gen_start = (ulong)b * mml + prompt;
            gen_len = end - prompt;
            long generated = (long)max(step_idx[b], 0) + (long)pos;
            end_active = generated < (long)min_tokens[b];
        }
        uint lo, hi;
        core_slice(W, &lo, &hi);

        // (b) Dense phase: element j is token v = first_id + j.
        for (uint j = lo; j < hi; j++) {
            const uint v = first_id + j;
            bool masked = !valid || (has_allowed != 0u && bit_clear(allowed, slot_words, v)) ||
                          (has_bitmask != 0u && bit_clear(bitmask, row_words, v));
            uint value = MASK_MARK;
            if (!masked) {
#if LOGITS
                long c = min((long)max(token_counts[counts_row + v], 0), MAX_COUNT);
                bool in_prompt = !bit_clear(prompt_mask, slot_words, v);
                value = process_logit(LOAD_T(row, j), false, 0u, in_prompt, c, pen);
#else
                value = rank_key(LOAD_T(row, j));
#endif
            }
            out[j] = value;
        }
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);

        // (c) Sparse phase: core 0 recomputes every token a sparse rule touches.
        if (LID == 0u && valid) {
#if LOGITS
            // Bias entries, then the drafts before the row: the complete float steps.
            for (ulong k = bias_start; k < (ulong)bias_end + pos; k++) {
                int t = k < bias_end ? bias_ids[k] : draft_tokens[drafts + (k - bias_end)];
                long at = slice_index(t, first_id, W);
                if (at < 0l || (uint)t >= V) continue;
                uint v = (uint)t;
                bool masked = (has_allowed != 0u && bit_clear(allowed, slot_words, v)) ||
                              (has_bitmask != 0u && bit_clear(bitmask, row_words, v));
                if (masked) continue;
                bool has_bias = false;
                uint bias = 0u;
                for (uint q = bias_start; q < bias_end; q++) {
                    if (bias_ids[q] == t) { has_bias = true; bias = bias_values[q]; }
                }
                long c = (long)max(token_counts[counts_row + v], 0);
                for (uint j = 0; j < pos; j++) c += draft_tokens[drafts + j] == t ? 1l : 0l;
                c = min(c, MAX_COUNT);
                bool in_prompt = !bit_clear(prompt_mask, slot_words, v);
                out[at] = process_logit(LOAD_T(row, at), has_bias, additive_bits(bias), in_prompt, c,
                                       pen);
            }
#endif
            // min_tokens: the end tokens.
            for (uint e = 0; e < args.num_end && end_active; e++) {
                long at = slice_index(end_tokens[e], first_id, W);
                if (at >= 0l && (uint)end_tokens[e] < V) out[at] = MASK_MARK;
            }
            // Bad words: parsing stops at the first malformed entry.
            const ulong history_len = gen_len + (ulong)pos;
            uint k = bad_start;
            while (k < bad_end) {
                int n = bad_words[k];
                if (n < 1 || (uint)n >= bad_end - k) break;
                ulong prefix = (ulong)n - 1ul;
                bool match = prefix <= history_len;
                for (ulong i = 0; i < prefix && match; i++) {
                    ulong h = history_len - prefix + i;
                    int ht = h < gen_len ? token_ids_all[gen_start + h]
                                         : draft_tokens[drafts + (h - gen_len)];
                    match = ht == bad_words[k + 1u + (uint)i];
                }
                int t = bad_words[k + (uint)n];
                long at = slice_index(t, first_id, W);
                if (match && at >= 0l && (uint)t < V) out[at] = MASK_MARK;
                k += (uint)n + 1u;
            }
        }
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);

        // (d) Fallback: the first unmasked token in rank order (keys: 0 masked, never 0 else).
        uint best_key = 0u, best_id = 0u;
        for (uint j = lo; j < hi; j++) {
            uint x = out[j];
#if LOGITS
            uint key = x == MASK_MARK ? 0u : logit_rank_key(x);
#else
            uint key = x == MASK_MARK ? 0u : x + 1u;
#endif
            if (key > best_key) { best_key = key; best_id = first_id + j; }
        }
        KeyId best = cluster_max(best_key, best_id, S);
        if (LID == 0u) fallback[i] = best.key == 0u ? -1 : (int)best.id;

        // (e) min_p: w * 2^24 < MINP * w_max drops the token; masked tokens get their value.
#if LOGITS
        Weigh w = logits_weigh(best.key, best.id, ROW_TEMPERATURE(temperature, r));
        ulong w_max = w.kind == WEIGH_ZERO ? 0ul : logit_key_weight(w, best.key);
#else
        ulong w_max = best.key == 0u ? 0ul : key_weight(best.key - 1u);
#endif
        u128 bar = mul_64x64(min_p, w_max);
        for (uint j = lo; j < hi; j++) {
            uint x = out[j];
            if (x == MASK_MARK) {
                out[j] = MASKED_BITS;
                continue;
            }
            if (min_p == 0ul) continue;
#if LOGITS
            ulong weight = logit_key_weight(w, logit_row_key(w, x, first_id + j));
#else
            ulong weight = key_weight(x);
#endif
            if (lt_128(mul_64x64(weight, 1ul << MIN_P_BITS), bar)) out[j] = MASKED_BITS;
        }
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    }
}
