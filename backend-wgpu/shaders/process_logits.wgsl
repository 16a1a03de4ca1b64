// process_logits (docs/semantics.md §4c, §5.12): one workgroup per row of the block. Output row
// `row0 + g` of the chunk is scores row `first + row0 + g`: the scores chunk is bound from that
// row, and every other per-row input (layout, temperature, bitmask) is read at it.
//
// A row holds the `p.vocab` ids `slice_first ..` of a vocabulary of `table_vocab` tokens: the
// whole vocabulary, or one rank's slice of sharded rows (§4d). Every table (counts, masks, bias,
// drafts, bad words, end tokens) is read by global id; a rule on a token outside the slice writes
// nothing; the fallback is a global id; a slice applies no min_p (the sharded ops apply it
// against the whole row's maximum).
//
// (a) The row's slot and position, or a padding row (every token masked, fallback -1).
// (b) A dense pass over the row: the masks of `allowed` and `bitmask`, and for logits rows the
//     float steps with the slot's table count (no drafts) and no bias.
// (c) One invocation then recomputes, from the input value, every token a sparse rule touches:
//     bias entries and the drafts before the row (complete rule), then the end tokens (min_tokens)
//     and the bad-word bans (masks).
// (d) The fallback: the first unmasked token in rank order (a workgroup reduction).
// (e) min_p from the §4b weights of the processed row, and the masked tokens' final value.
//
// Until (e) a masked token holds MASKED (a NaN: no unmasked value is ever NaN, a NaN logit being
// read as -inf). The float steps are IEEE f32 additions on the device (never fused: every product
// is computed exactly in integers, `mul_exact`, so no multiply can be contracted into an add),
// each result read through `sanitize_logit`; no step meets a subnormal or overflows (§4c). A
// token whose steps end on its sanitized input keeps its logit (§4c).

// `struct ProcessLogitsArgs` is generated from its `kernel_args!` declaration in src/ops/process_logits.rs.

@group(0) @binding(0) var<uniform> p: ProcessLogitsArgs;
// logits or probs [rows, vocab] of the chunk, from scores row first + row0 (f32 words, or packed
// f16/bf16)
@group(0) @binding(1) var<storage, read> scores: array<u32>;
// logits rows: the per-row temperature (f32 bits); otherwise a stand-in, never read
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
@group(0) @binding(3) var<storage, read> cu_out: array<i32>;
@group(0) @binding(4) var<storage, read> batch_id: array<i32>;
@group(0) @binding(5) var<storage, read> token_ids_all: array<i32>;
@group(0) @binding(6) var<storage, read> prompt_lens: array<i32>;
@group(0) @binding(7) var<storage, read> step_idx: array<i32>;
@group(0) @binding(8) var<storage, read> draft_tokens: array<i32>;
@group(0) @binding(9) var<storage, read> token_counts: array<i32>;
@group(0) @binding(10) var<storage, read> prompt_mask: array<u32>;
// [max_bsz, 5] f32 bits: α, α⁻¹, β, γ, min_p
@group(0) @binding(11) var<storage, read> penalties: array<u32>;
@group(0) @binding(12) var<storage, read> min_tokens: array<i32>;
@group(0) @binding(13) var<storage, read> end_tokens: array<i32>;
@group(0) @binding(14) var<storage, read> bias_offsets: array<i32>;
@group(0) @binding(15) var<storage, read> bias_ids: array<i32>;
@group(0) @binding(16) var<storage, read> bias_values: array<u32>;
@group(0) @binding(17) var<storage, read> bad_word_offsets: array<i32>;
@group(0) @binding(18) var<storage, read> bad_words: array<i32>;
// with `has_allowed` / `has_bitmask`; otherwise stand-ins, never read
@group(0) @binding(19) var<storage, read> allowed: array<u32>;
@group(0) @binding(20) var<storage, read> bitmask: array<u32>;
// [rows, vocab] f32 bits of the chunk (output rows row0 ..)
@group(0) @binding(21) var<storage, read_write> processed: array<u32>;
@group(0) @binding(22) var<storage, read_write> fallback: array<i32>;

/// A masked token until the last pass (a NaN, which no processed value is).
const MASKED: u32 = 0x7fc0deadu;
/// 2^24: the largest count the frequency penalty sees.
const MAX_COUNT: u32 = 16777216u;
/// The repetition factors must lie in [2^-32, 2^32] (f32 bits).
const FACTOR_LO: u32 = 0x2f800000u;
const FACTOR_HI: u32 = 0x4f800000u;

/// The row's source and its slot's parameters, as invocation 0 read them.
struct RowState {
    /// 1 when the row belongs to a slot.
    valid: u32,
    b: u32,
    pos: u32,
    /// 1 when the repetition step applies (α and α⁻¹ in range).
    repetition: u32,
    alpha: u32,
    inverse: u32,
    frequency: u32,
    presence: u32,
    /// MINP = ceil(min_p · 2^24), 0 when min_p is off.
    min_p: u32,
    /// The row's temperature (f32 bits; logits rows).
    t_bits: u32,
}

var<workgroup> wg_state: RowState;
var<workgroup> best_key: array<u32, WG>;
var<workgroup> best_id: array<u32, WG>;
var<workgroup> wg_best_result: vec2<u32>;

/// The best (largest key, then lowest id) of one candidate per invocation; key 0 with id
/// 0xffffffff is "none". Uniform result (key, id).
fn row_best(lid: u32, key: u32, id: u32) -> vec2<u32> {
    best_key[lid] = key;
    best_id[lid] = id;
    workgroupBarrier();
    if lid == 0u {
        var bk = 0u;
        var bi = 0xffffffffu;
        for (var g = 0u; g < WG; g++) {
            let k = best_key[g];
            let i = best_id[g];
            if k > bk || (k == bk && i < bi) {
                bk = k;
                bi = i;
            }
        }
        wg_best_result = vec2<u32>(bk, bi);
    }
    return workgroupUniformLoad(&wg_best_result);
}

/// An additive parameter (bias, β, γ) as the float steps read it: NaN is 0, |x| below 2^-76 is
/// 0, |x| above 2^64 (±inf included) is ±2^64.
fn additive(bits: u32) -> u32 {
    if is_nan_bits(bits) {
        return 0u;
    }
    if (bits & 0x7fffffffu) > LOGIT_HUGE_BITS {
        return (bits & 0x80000000u) | LOGIT_HUGE_BITS;
    }
    return sanitize_logit(bits);
}

/// Whether f32 bits lie in [2^-32, 2^32] (positive; NaN and negatives do not).
fn factor_in_range(bits: u32) -> bool {
    return bits >= FACTOR_LO && bits <= FACTOR_HI;
}

/// The f32 product `a · m2 · 2^e2`, rounded to nearest even, computed exactly in integers: `a` a
/// sanitized logit or parameter (0, ±inf, or a normal of magnitude in [2^-76, 2^64]), `m2 · 2^e2`
/// a positive value with m2 < 2^25 whose product with any such `a` is a normal f32 (§4c: a
/// repetition factor in [2^-32, 2^32], or a count in [1, 2^24]).
fn mul_exact(a: u32, m2: u32, e2: i32) -> u32 {
    let sign = a & 0x80000000u;
    let mag = a & 0x7fffffffu;
    if mag == 0u {
        return sign;
    }
    if mag == 0x7f800000u {
        return a;
    }
    let sa = significand(mag);
    let prod = mul32x32(sa.m, m2);
    let bl = bit_length64(prod);
    var q = prod.x;
    var e = sa.e + e2;
    if bl > 24u {
        let shift = bl - 24u;
        q = shr64(prod, shift).x;
        let low_mask = sub64(shl64(u64_from(1u), shift), u64_from(1u));
        let rem = vec2<u32>(prod.x & low_mask.x, prod.y & low_mask.y);
        let half = shl64(u64_from(1u), shift - 1u);
        if lt64(half, rem) || (rem.x == half.x && rem.y == half.y && (q & 1u) == 1u) {
            q = q + 1u;
        }
        e = e + i32(shift);
        if q == 0x1000000u {
            q = 0x800000u;
            e = e + 1;
        }
    } else {
        q = prod.x << (24u - bl);
        e = e - i32(24u - bl);
    }
    // q in [2^23, 2^24): the value is q · 2^e, biased exponent e + 150.
    let biased = u32(clamp(e + 150, 1, 254));
    return sign | (biased << 23u) | (q & 0x7fffffu);
}

/// The sanitized f32 sum `a + b` (device IEEE addition, round to nearest even).
fn add_sanitized(a: u32, b: u32) -> u32 {
    return sanitize_logit(bitcast<u32>(bitcast<f32>(a) + bitcast<f32>(b)));
}

/// The sanitized f32 difference `a - b`.
fn sub_sanitized(a: u32, b: u32) -> u32 {
    return sanitize_logit(bitcast<u32>(bitcast<f32>(a) - bitcast<f32>(b)));
}

/// The float steps of one unmasked logit (f32 bits `x`, §4c): bias (when `has_bias`),
/// repetition, frequency and presence. When they end on the value they started from (the
/// sanitized input), the output is the input logit itself (NaN as -inf): a token no step changes
/// keeps its rank.
fn process_logit(x: u32, has_bias: bool, bias: u32, in_prompt: bool, count: u32, st: RowState) -> u32 {
    let read = sanitize_logit(x);
    let l = stepped_logit(read, has_bias, bias, in_prompt, count, st);
    if l == read {
        if is_nan_bits(x) {
            return 0xff800000u;
        }
        return x;
    }
    return l;
}

/// The float steps on the sanitized logit `read` (every sanitized value has one bit pattern: +0
/// for zero, so equal values have equal bits).
fn stepped_logit(read: u32, has_bias: bool, bias: u32, in_prompt: bool, count: u32, st: RowState) -> u32 {
    var l = read;
    if has_bias {
        l = add_sanitized(l, additive(bias));
    }
    if st.repetition != 0u && (in_prompt || count > 0u) {
        let positive = (l & 0x80000000u) == 0u && l != 0u;
        var factor = st.alpha;
        if positive {
            factor = st.inverse;
        }
        let sf = significand(factor);
        l = sanitize_logit(mul_exact(l, sf.m, sf.e));
    }
    if count > 0u {
        l = sub_sanitized(l, mul_exact(st.frequency, count, 0));
        l = sub_sanitized(l, st.presence);
    }
    return l;
}

/// Bit `v` of the mask row starting at word `base` of `mask`.
fn prompt_bit(base: u32, v: u32) -> bool {
    return ((prompt_mask[base + (v >> 5u)] >> (v & 31u)) & 1u) == 1u;
}

/// Whether `allowed` (slot `b`) or `bitmask` (global row `row`) masks token `v`.
fn dense_masked(b: u32, row: u32, v: u32) -> bool {
    let w = v >> 5u;
    let s = v & 31u;
    if p.has_allowed != 0u && ((allowed[p.allowed_off + b * p.words + w] >> s) & 1u) == 0u {
        return true;
    }
    if p.has_bitmask != 0u && ((bitmask[p.bitmask_off + row * p.words + w] >> s) & 1u) == 0u {
        return true;
    }
    return false;
}

/// The f32 bits of element `j` (global id `slice_first + j`) of group `g`'s input row.
fn input_bits(g: u32, j: u32, dt: u32) -> u32 {
    let e = p.scores_off + g * p.vocab + j;
    return widen_bits(scores[word_of(e, dt)], e, dt);
}

/// The slot's table count of token `v` (negative entries count as 0).
fn table_count(b: u32, v: u32) -> u32 {
    return u32(max(token_counts[p.counts_off + b * p.table_vocab + v], 0));
}

/// The token id `t` as an index below `table_vocab`, or 0xffffffff.
fn token_index(t: i32) -> u32 {
    if t < 0 || u32(t) >= p.table_vocab {
        return 0xffffffffu;
    }
    return u32(t);
}

/// The list range `[offsets[b], offsets[b + 1])` of a list of `len` entries (x, y), empty when it
/// is not a valid range.
fn list_range(start: i32, end: i32, len: u32) -> vec2<u32> {
    if start < 0 || end < start || u32(end) > len {
        return vec2<u32>(0u);
    }
    return vec2<u32>(u32(start), u32(end));
}

/// The element of the row holding token `t` (a global id, or 0xffffffff), or 0xffffffff when the
/// row's ids do not hold it.
fn local_index(t: u32) -> u32 {
    if t == 0xffffffffu || t < p.slice_first || t - p.slice_first >= p.vocab {
        return 0xffffffffu;
    }
    return t - p.slice_first;
}

/// Row chunk group `g`, token `t` (a global id within the row's ids) of slot `b` at position `pos`: the complete rule of a logits
/// token (dense masks, the slot's bias for it when `has_bias`, its count with the drafts before
/// the row).
fn full_logit(g: u32, dt: u32, t: u32, has_bias: bool, bias: u32, st: RowState) -> u32 {
    let row = p.first + p.row0 + g;
    if dense_masked(st.b, row, t) {
        return MASKED;
    }
    var count = table_count(st.b, t);
    let drafts = p.draft_off + st.b * p.step_tokens + 1u;
    for (var j = 0u; j < st.pos; j++) {
        if token_index(draft_tokens[drafts + j]) == t {
            count = count + 1u;
        }
    }
    count = min(count, MAX_COUNT);
    let in_prompt = prompt_bit(p.prompt_mask_off + st.b * p.words, t);
    return process_logit(input_bits(g, t - p.slice_first, dt), has_bias, bias, in_prompt, count, st);
}

/// Token `j` of the row's history: the slot's generated tokens (`gen` of them, from `first` in
/// token_ids_all), then the drafts before the row.
fn history_at(first: u32, gen: u32, drafts: u32, j: u32) -> i32 {
    if j < gen {
        return token_ids_all[first + j];
    }
    return draft_tokens[drafts + (j - gen)];
}

/// (c) Invocation 0: the tokens of the sparse rules.
fn sparse_rules(g: u32, dt: u32, st: RowState) {
    let base = p.processed_off + g * p.vocab;
    let b = st.b;
    if p.logits != 0u {
        // Bias entries, in order: the last entry of a token writes last, with its value.
        let br = list_range(bias_offsets[p.bias_offsets_off + b], bias_offsets[p.bias_offsets_off + b + 1u], p.bias_len);
        for (var k = br.x; k < br.y; k++) {
            let t = token_index(bias_ids[p.bias_ids_off + k]);
            let j = local_index(t);
            if j != 0xffffffffu {
                processed[base + j] = full_logit(g, dt, t, true, bias_values[p.bias_values_off + k], st);
            }
        }
        // The drafts before the row (their counts), with the token's bias if it has one.
        let drafts = p.draft_off + b * p.step_tokens + 1u;
        for (var j = 0u; j < st.pos; j++) {
            let t = token_index(draft_tokens[drafts + j]);
            let at = local_index(t);
            if at == 0xffffffffu {
                continue;
            }
            var has_bias = false;
            var bias = 0u;
            for (var k = br.y; k > br.x; k--) {
                if token_index(bias_ids[p.bias_ids_off + k - 1u]) == t {
                    has_bias = true;
                    bias = bias_values[p.bias_values_off + k - 1u];
                    break;
                }
            }
            processed[base + at] = full_logit(g, dt, t, has_bias, bias, st);
        }
    }
    // min_tokens: the end tokens while the generated position is below it.
    let step = len_or_zero(step_idx[p.step_idx_off + b]);
    let generated = step + st.pos;
    let mt = min_tokens[p.min_tokens_off + b];
    if mt > 0 && generated < u32(mt) && generated >= step {
        for (var e = 0u; e < p.end_count; e++) {
            let j = local_index(token_index(end_tokens[p.end_tokens_off + e]));
            if j != 0xffffffffu {
                processed[base + j] = MASKED;
            }
        }
    }
    // Bad words: entries `n, t_1 .. t_n`; parsing stops at the first n < 1 or an entry running
    // past the list. An entry bans t_n when the history ends with t_1 .. t_{n-1}.
    let mml = p.max_model_len;
    let prompt = min(len_or_zero(prompt_lens[p.prompt_lens_off + b]), mml);
    let gen = min(step, mml - prompt);
    let first = p.token_ids_off + b * mml + prompt;
    let drafts = p.draft_off + b * p.step_tokens + 1u;
    let hist = gen + st.pos;
    let wr = list_range(bad_word_offsets[p.bad_offsets_off + b], bad_word_offsets[p.bad_offsets_off + b + 1u], p.bad_words_len);
    let list = p.bad_words_off + wr.x;
    let len = wr.y - wr.x;
    var k = 0u;
    loop {
        if k >= len {
            break;
        }
        let n = bad_words[list + k];
        if n < 1 || u32(n) >= len - k {
            break;
        }
        let nn = u32(n);
        let prefix = nn - 1u;
        var matches = prefix <= hist;
        if matches {
            for (var i = 0u; i < prefix; i++) {
                if bad_words[list + k + 1u + i] != history_at(first, gen, drafts, hist - prefix + i) {
                    matches = false;
                    break;
                }
            }
        }
        if matches {
            let j = local_index(token_index(bad_words[list + k + nn]));
            if j != 0xffffffffu {
                processed[base + j] = MASKED;
            }
        }
        k = k + nn + 1u;
    }
}

// Entry points `process_logits_<dtype>` (generated, kernels.rs; groups with work only).
fn process_logits_main(g: u32, lid: u32, dt: u32) {
    // The output row, and the scores row every per-row input is read at.
    let out_row = p.row0 + g;
    let row = p.first + out_row;
    let vocab = p.vocab;
    let base = p.processed_off + g * vocab;
    var masked_value = 0u;
    if p.logits != 0u {
        masked_value = 0xff800000u;
    }
    // (a) The row's source and slot parameters.
    if lid == 0u {
        var st = RowState(0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0x3f800000u);
        let b = slot_of_row(batch_id[p.batch_id_off + row], p.real_bsz);
        if b != NO_SLOT {
            let pos = position_in_slot(row, cu_out[p.cu_out_off + b], p.step_tokens);
            if pos != NO_ROW {
                st.valid = 1u;
                st.b = b;
                st.pos = pos;
                let pb = p.penalties_off + b * 5u;
                st.alpha = penalties[pb];
                st.inverse = penalties[pb + 1u];
                if factor_in_range(st.alpha) && factor_in_range(st.inverse) {
                    st.repetition = 1u;
                }
                st.frequency = additive(penalties[pb + 2u]);
                st.presence = additive(penalties[pb + 3u]);
                let mp = penalties[pb + 4u];
                // min_p > 0 (not NaN): MINP = ceil(min(min_p, 1) · 2^24); whole rows only.
                let whole = p.vocab == p.table_vocab;
                if whole && (mp & 0x80000000u) == 0u && mp != 0u && mp <= 0x7f800000u {
                    st.min_p = top_p_fixed(mp);
                }
                if p.logits != 0u {
                    st.t_bits = temperature[p.temperature_off + row];
                }
            }
        }
        wg_state = st;
    }
    let st = workgroupUniformLoad(&wg_state);
    if st.valid == 0u {
        for (var v = lid; v < vocab; v += WG) {
            processed[base + v] = masked_value;
        }
        if lid == 0u {
            fallback[p.fallback_off + out_row] = -1;
        }
        return;
    }
    // (b) The dense pass.
    let prompt_base = p.prompt_mask_off + st.b * p.words;
    for (var j = lid; j < vocab; j += WG) {
        let v = p.slice_first + j;
        var out = MASKED;
        if !dense_masked(st.b, row, v) {
            let x = input_bits(g, j, dt);
            if p.logits != 0u {
                let count = min(table_count(st.b, v), MAX_COUNT);
                out = process_logit(x, false, 0u, prompt_bit(prompt_base, v), count, st);
            } else {
                out = rank_key(x);
            }
        }
        processed[base + j] = out;
    }
    storageBarrier();
    // (c) The sparse rules.
    if lid == 0u {
        sparse_rules(g, dt, st);
    }
    storageBarrier();
    // (d) The fallback: the best unmasked token by rank key, then id (a global id).
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var j = lid; j < vocab; j += WG) {
        let v = p.slice_first + j;
        let bits = processed[base + j];
        if bits == MASKED {
            continue;
        }
        var k = bits;
        if p.logits != 0u {
            k = logit_rank_key(bits);
        }
        if k > bk || (k == bk && v < bi) {
            bk = k;
            bi = v;
        }
    }
    let best = row_best(lid, bk, bi);
    if lid == 0u {
        fallback[p.fallback_off + out_row] = select(i32(best.y), -1, best.y == 0xffffffffu);
    }
    // (e) min_p, from the weights of the processed row, and the masked tokens' final value.
    var weigh = by_key();
    var w_max = vec2<u32>(0u);
    if p.logits != 0u {
        var max_key = 0u;
        if best.y != 0xffffffffu {
            max_key = best.x;
        }
        weigh = logits_weigh(max_key, best.y, st.t_bits);
        if weigh.kind != WEIGH_ZERO {
            w_max = shl64(u64_from(1u), WEIGHT_BITS);
        }
    } else if best.y != 0xffffffffu {
        w_max = key_weight(best.x);
    }
    let limit = mul64x64(w_max, u64_from(st.min_p));
    for (var j = lid; j < vocab; j += WG) {
        let bits = processed[base + j];
        if bits == MASKED {
            processed[base + j] = masked_value;
            continue;
        }
        if st.min_p == 0u {
            continue;
        }
        var w: vec2<u32>;
        if p.logits != 0u {
            w = weigh_key(weigh, logit_row_key(weigh, bits, p.slice_first + j));
        } else {
            w = key_weight(bits);
        }
        if lt128(mul64x64(w, u64_from(1u << 24u)), limit) {
            processed[base + j] = masked_value;
        }
    }
}
