// process_logits (docs/semantics.md §5.12, §4c): masks, logit bias, repetition / frequency /
// presence penalties and min_p, applied to every output row from the row's own history, and the
// row's fallback token.
//
// One block per row of the call's row block (`first`, `rows`: output row i is the processing of
// scores row first + i, and every per-row input is read at first + i). (a) A row of no slot is
// filled with the masked value, fallback -1. (b) Dense pass: each token's masks from the
// `allowed` / `bitmask` bits, then the float steps with the slot's table counts and no bias (a
// token no sparse rule touches is then final). (c) Thread 0 recomputes, from the input value,
// every token a sparse rule touches, with the complete rule:
// drafted tokens before the row (their count delta, and their bias), bias entries (in list order,
// so the last entry of a token is the one that stays), then the end tokens (min_tokens) and the
// bad-word bans mask. (d) Fallback: the first unmasked token in rank order (value key descending,
// then id). (e) min_p drops the tokens whose weight w has w · 2^24 < MINP · w_max (`docs/semantics.md` §4b
// weights at the row's temperature for logits rows, w(p) for probabilities); masked tokens become
// -inf (logits) or 0 (probabilities).
//
// While the row is built, a masked token is marked in `processed` by a NaN pattern that no
// processed value can have (a NaN logit is read as -inf), so the later passes know it.
//
// Every float step is one IEEE f32 operation rounded to nearest even (__fadd_rn, __fmul_rn,
// __fsub_rn: never contracted), each result read through sanitize_logit (`docs/semantics.md` §4b step 1);
// a token whose steps end on its sanitized input keeps its logit (§4c).
// Every index into a device buffer is range-checked, whatever the buffers hold.
//
// A row holds the `width` ids `slice_first ..` of the tables' `vocab`: the whole vocabulary, or
// one rank's slice of sharded rows (§4d). Every table is read by global id; a rule on a token
// outside the slice writes nothing; the fallback is a global id; a slice applies no min_p (the
// sharded ops apply it against the whole row's maximum).

// The mark of a masked token while the row is built (a NaN: never a processed value).
#define SPECULA_PL_MASKED_BITS 0x7fc00001u
// The largest count the frequency penalty sees (2^24, exact in f32).
#define SPECULA_PL_MAX_COUNT 16777216ll
// The repetition factors must lie in [2^-32, 2^32], or the step is skipped (f32 bit patterns).
#define SPECULA_PL_FACTOR_MIN_BITS 0x2f800000u
#define SPECULA_PL_FACTOR_MAX_BITS 0x4f800000u

// A logit (or a step's result) as the rules read it.
__device__ __forceinline__ float pl_sanitize(float x) {
    return __uint_as_float(sanitize_logit_bits(__float_as_uint(x)));
}

// An additive parameter (bias, β, γ): NaN is 0, |x| below 2^-76 is 0, |x| above 2^64 (±inf
// included) is ±2^64.
__device__ __forceinline__ float pl_additive(float x) {
    const u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > SPECULA_POS_INF_BITS) return 0.0f;
    if ((b & 0x7fffffffu) > SPECULA_LOGIT_HUGE_BITS) return __uint_as_float((b & 0x80000000u) | SPECULA_LOGIT_HUGE_BITS);
    return pl_sanitize(x);
}

// One slot's parameters as read from the device.
struct PlSlot {
    float alpha;
    float inverse;
    float frequency;
    float presence;
    u64 min_p;  // MINP = ceil(min(min_p, 1) · 2^24); 0: off (0, negative or NaN)
    bool repetition;
};

__device__ __forceinline__ PlSlot pl_slot(const ProcessArgs& a, u32 b) {
    const float* p = a.penalties + (u64)b * SPECULA_PENALTY_FIELDS;
    PlSlot s;
    s.alpha = p[SPECULA_PENALTY_REPETITION];
    s.inverse = p[SPECULA_PENALTY_REPETITION_INVERSE];
    const float lo = __uint_as_float(SPECULA_PL_FACTOR_MIN_BITS);
    const float hi = __uint_as_float(SPECULA_PL_FACTOR_MAX_BITS);
    s.repetition = s.alpha >= lo && s.alpha <= hi && s.inverse >= lo && s.inverse <= hi;
    s.frequency = pl_additive(p[SPECULA_PENALTY_FREQUENCY]);
    s.presence = pl_additive(p[SPECULA_PENALTY_PRESENCE]);
    const float min_p = p[SPECULA_PENALTY_MIN_P];
    // top_p_fixed reads a value above 1 (or +inf) as 1: ceil(min(min_p, 1) · 2^24), exact.
    s.min_p = min_p > 0.0f ? top_p_fixed(min_p) : 0ull;
    return s;
}

// The float steps of one unmasked logit: bias, repetition, frequency and presence. When they end
// on the value they started from (the sanitized input; every sanitized value has one bit pattern,
// +0 for zero), the output is the input logit itself (NaN as -inf): a token no step changes keeps
// its rank.
__device__ __forceinline__ float pl_process(float x, bool has_bias, float bias, bool in_prompt, i64 count,
                                            const PlSlot& s) {
    const float read = pl_sanitize(x);
    float l = read;
    if (has_bias) l = pl_sanitize(__fadd_rn(l, pl_additive(bias)));
    if (s.repetition && (in_prompt || count > 0))
        l = pl_sanitize(l > 0.0f ? __fmul_rn(l, s.inverse) : __fmul_rn(l, s.alpha));
    if (count > 0) {
        l = pl_sanitize(__fsub_rn(l, __fmul_rn(s.frequency, (float)count)));
        l = pl_sanitize(__fsub_rn(l, s.presence));
    }
    if (__float_as_uint(l) != __float_as_uint(read)) return l;
    return isnan(x) ? __uint_as_float(SPECULA_NEG_INF_BITS) : x;
}

// Bit v of row `row` of a [*, words] mask.
__device__ __forceinline__ bool pl_bit(const u32* mask, u64 row, u64 words, u32 v) {
    return ((mask[row * words + (v >> 5)] >> (v & 31u)) & 1u) != 0;
}

// Where row r reads from: its slot b and position pos, and the slot's generated tokens
// token_ids_all[b, start .. start + len).
struct PlRow {
    u64 r;  // the scores row
    u32 b;
    u64 pos;
    u64 start;
    u64 len;
    u64 words;
};

// Token h of the row's history: the generated tokens, then draft_tokens[b, 1 ..= pos].
__device__ __forceinline__ i32 pl_history(const ProcessArgs& a, const PlRow& w, u64 h) {
    if (h < w.len) return a.token_ids_all[(u64)w.b * a.max_model_len + w.start + h];
    return a.draft_tokens[(u64)w.b * a.max_step_tokens + 1 + (h - w.len)];
}

// Whether the allowed / bitmask bits mask token v.
__device__ __forceinline__ bool pl_bits_mask(const ProcessArgs& a, const PlRow& w, u32 v) {
    if (a.allowed != 0 && !pl_bit(a.allowed, w.b, w.words, v)) return true;
    if (a.bitmask != 0 && !pl_bit(a.bitmask, w.r, w.words, v)) return true;
    return false;
}

// count[v] with the drafts before the row: min(max(table, 0) + #drafts equal to v, 2^24).
__device__ __forceinline__ i64 pl_count(const ProcessArgs& a, const PlRow& w, u32 v, bool with_drafts) {
    const i32 t = a.token_counts[(u64)w.b * a.vocab + v];
    i64 c = t > 0 ? (i64)t : 0;
    if (with_drafts) {
        const i32* drafts = a.draft_tokens + (u64)w.b * a.max_step_tokens;
        for (u64 j = 1; j <= w.pos; ++j) c += drafts[j] == (i32)v ? 1 : 0;
    }
    return c < SPECULA_PL_MAX_COUNT ? c : SPECULA_PL_MAX_COUNT;
}

// The value of token v of a logits row from its input x, without the sparse masks.
__device__ __forceinline__ float pl_logit_value(const ProcessArgs& a, const PlRow& w, const PlSlot& s, float x,
                                                u32 v, bool has_bias, float bias, bool with_drafts) {
    if (pl_bits_mask(a, w, v)) return __uint_as_float(SPECULA_PL_MASKED_BITS);
    const bool in_prompt = pl_bit(a.prompt_mask, w.b, w.words, v);
    return pl_process(x, has_bias, bias, in_prompt, pl_count(a, w, v, with_drafts), s);
}

// The valid range [offsets[b], offsets[b + 1]) of a list of n entries, or false.
__device__ __forceinline__ bool pl_list(const i32* offsets, u32 b, u64 n, u64& from, u64& to) {
    const i32 start = offsets[b], end = offsets[b + 1];
    if (start < 0 || end < start || (u64)end > n) return false;
    from = (u64)start;
    to = (u64)end;
    return true;
}

// Element of the row holding token t (a global id), or -1 when the row's ids do not hold it.
__device__ __forceinline__ i64 pl_at(const ProcessArgs& a, i32 t) {
    if (t < 0 || (u32)t >= a.vocab || (u32)t < a.slice_first || (u32)t - a.slice_first >= a.width) return -1;
    return (i64)((u32)t - a.slice_first);
}

// Step (c), on one thread: every token a sparse rule touches (`row` and `out` hold the row's ids).
__device__ void pl_sparse(const ProcessArgs& a, const PlRow& w, const PlSlot& s,
                          const typename SPECULA_T::raw* __restrict__ row, float* out) {
    u64 bias_from = 0, bias_to = 0;
    const bool has_bias_list = pl_list(a.bias_offsets, w.b, a.n_bias, bias_from, bias_to);
    if (a.logits != 0) {
        // Drafted tokens before the row: their count delta, with their bias (last entry).
        const i32* drafts = a.draft_tokens + (u64)w.b * a.max_step_tokens;
        for (u64 j = 1; j <= w.pos; ++j) {
            const i32 d = drafts[j];
            const i64 at = pl_at(a, d);
            if (at < 0) continue;
            bool has_bias = false;
            float bias = 0.0f;
            if (has_bias_list) {
                for (u64 k = bias_from; k < bias_to; ++k) {
                    if (a.bias_ids[k] == d) {
                        has_bias = true;
                        bias = a.bias_values[k];
                    }
                }
            }
            out[at] = pl_logit_value(a, w, s, SPECULA_T::widen(row[at]), (u32)d, has_bias, bias, true);
        }
        // Bias entries in list order: the last entry of a token writes last.
        if (has_bias_list) {
            for (u64 k = bias_from; k < bias_to; ++k) {
                const i32 v = a.bias_ids[k];
                const i64 at = pl_at(a, v);
                if (at < 0) continue;
                out[at] = pl_logit_value(a, w, s, SPECULA_T::widen(row[at]), (u32)v, true, a.bias_values[k], true);
            }
        }
    }
    const float masked = __uint_as_float(SPECULA_PL_MASKED_BITS);
    // min_tokens: the end tokens, while the generated position is below it.
    const i64 generated = (i64)(a.step_idx[w.b] > 0 ? a.step_idx[w.b] : 0) + (i64)w.pos;
    if (generated < (i64)a.min_tokens[w.b]) {
        for (u64 e = 0; e < a.n_end; ++e) {
            const i64 at = pl_at(a, a.end_tokens[e]);
            if (at >= 0) out[at] = masked;
        }
    }
    // Bad words: entries n, t_1 .. t_n; parsing stops at the first malformed one.
    u64 from = 0, to = 0;
    if (!pl_list(a.bad_word_offsets, w.b, a.n_bad_words, from, to)) return;
    const u64 history = w.len + w.pos;
    u64 k = from;
    while (k < to) {
        const i32 n = a.bad_words[k];
        if (n < 1 || (u64)n >= to - k) break;
        const u64 len = (u64)n;
        const i32 last = a.bad_words[k + len];
        bool ban = true;
        const u64 prefix = len - 1;
        if (prefix > history) {
            ban = false;
        } else {
            for (u64 j = 0; j < prefix && ban; ++j)
                ban = pl_history(a, w, history - prefix + j) == a.bad_words[k + 1 + j];
        }
        const i64 at = pl_at(a, last);
        if (ban && at >= 0) out[at] = masked;
        k += len + 1;
    }
}

extern "C" __global__ void __launch_bounds__(SPECULA_ROW_BLOCK)
    SPECULA_ENTRY(process_logits)(const ProcessArgs a) {
    typedef SPECULA_T E;
    __shared__ u64 scratch[SPECULA_ROW_BLOCK / 32];
    const u32 i = blockIdx.x;
    if (i >= a.rows) return;
    // Output row i is scores row r: every per-row input is read at r.
    const u64 r = a.first + i;
    const u32 vocab = a.vocab, width = a.width, first_id = a.slice_first;
    const bool logits = a.logits != 0;
    const float masked_value = logits ? -SPECULA_INF : 0.0f;
    float* out = a.processed + (u64)i * width;
    const typename E::raw* __restrict__ row = a.scores + r * width;

    // (a) The row's slot and position; a row of no slot masks every token.
    const i32 bid = a.batch_id[r];
    i64 pos = -1;
    if (bid >= 0 && (u32)bid < a.real_bsz) pos = (i64)r - (i64)a.cu_out[bid];
    if (pos < 0 || (u64)pos >= a.max_step_tokens) {
        for (u32 j = threadIdx.x; j < width; j += SPECULA_ROW_BLOCK) out[j] = masked_value;
        if (threadIdx.x == 0) a.fallback[i] = -1;
        return;
    }
    PlRow w;
    w.r = r;
    w.b = (u32)bid;
    w.pos = (u64)pos;
    const u64 l = a.max_model_len;
    const u64 prompt = len_or_zero(a.prompt_lens[w.b]);
    w.start = prompt < l ? prompt : l;
    const u64 end = w.start + len_or_zero(a.step_idx[w.b]);
    w.len = (end < l ? end : l) - w.start;
    w.words = ((u64)vocab + 31) / 32;
    PlSlot s = pl_slot(a, w.b);
    if (width != vocab) s.min_p = 0;  // a slice: no min_p

    // (b) Dense pass: the bit masks, then the float steps with the table counts and no bias.
    for (u32 j = threadIdx.x; j < width; j += SPECULA_ROW_BLOCK) {
        const u32 v = first_id + j;
        const float x = E::widen(row[j]);
        if (logits) {
            out[j] = pl_logit_value(a, w, s, x, v, false, 0.0f, false);
        } else {
            out[j] = pl_bits_mask(a, w, v) ? __uint_as_float(SPECULA_PL_MASKED_BITS) : sanitize_prob(x);
        }
    }
    __syncthreads();
    // (c) The tokens of the sparse rules, on one thread.
    if (threadIdx.x == 0) pl_sparse(a, w, s, row, out);
    __syncthreads();

    // (d) Fallback: the first unmasked token in rank order (0: none).
    u64 best = 0;
    for (u32 j = threadIdx.x; j < width; j += SPECULA_ROW_BLOCK) {
        const u32 bits = __float_as_uint(out[j]);
        if (bits == SPECULA_PL_MASKED_BITS) continue;
        const u32 key = logits ? logit_rank_key(out[j]) : bits;
        const u64 packed = pack_key_id(key, first_id + j);
        best = packed > best ? packed : best;
    }
    best = block_max_u64<SPECULA_ROW_BLOCK>(best, scratch);
    if (threadIdx.x == 0) a.fallback[i] = best == 0 ? -1 : (i32)packed_id(best);

    // (e) min_p over the weights of the processed row, and the masked value.
    const u32 best_key = (u32)(best >> 32);
    Weigh wg = weigh_by_key();
    u64 w_max = 0;
    if (s.min_p != 0) {
        if (logits) {
            const u32 max_key = best == 0 ? SPECULA_NEG_INF_LOGIT_KEY : best_key;
            wg = logits_weigh(max_key, best == 0 ? 0u : packed_id(best), a.temperature[r]);
            // The row's first maximum weighs 2^40 unless every weight is 0.
            w_max = wg.kind == WEIGH_ZERO ? 0ull : (1ull << SPECULA_WEIGHT_BITS);
        } else {
            w_max = best == 0 ? 0ull : key_weight(best_key);
        }
    }
    const u128 threshold = mul_64x64(s.min_p, w_max);
    for (u32 j = threadIdx.x; j < width; j += SPECULA_ROW_BLOCK) {
        const float x = out[j];
        const u32 bits = __float_as_uint(x);
        if (bits == SPECULA_PL_MASKED_BITS) {
            out[j] = masked_value;
            continue;
        }
        if (s.min_p == 0) continue;
        const u64 weight = logits ? logit_key_weight(wg, logit_row_key(wg, x, first_id + j)) : key_weight(bits);
        if (u128_lt(u128_shl(u128_make(0, weight), SPECULA_TOP_P_BITS), threshold)) out[j] = masked_value;
    }
}
