// Softmax statistics of one row under a temperature (`docs/semantics.md` §5.5), shared by softmax and
// accept_logprobs. Needs select.wgsl (the current row `row_bits`, workgroup reductions); the
// including shader's `row_key` is `order_key(row_bits(i))` (argmax order). Special rows
// are decided on bit patterns of the raw logits (NaN read as -inf): temperature 0 (one-hot at the
// argmax), a +inf maximum (uniform over the +inf entries), all -inf (uniform over the row).
// Otherwise the scaled logit is `(l - m) / t` with `m` the row maximum: subtract first, then
// divide.

const KIND_ONEHOT: u32 = 0u;
const KIND_POSINF: u32 = 1u;
const KIND_ALLNEGINF: u32 = 2u;
const KIND_FINITE: u32 = 3u;

struct Stats {
    kind: u32,
    arg: u32,
    count: u32,
    max: f32,
    sum: f32,
}

var<workgroup> p_f32: array<f32, WG>;
var<workgroup> s_f32: f32;

fn neg_inf() -> f32 {
    return bitcast<f32>(NEG_INF_BITS);
}

/// A device temperature: negative or NaN counts as 1.0 (-0 stays, and means one-hot).
fn effective_temperature(bits: u32) -> f32 {
    if is_nan_bits(bits) || ((bits & 0x80000000u) != 0u && bits != 0x80000000u) {
        return 1.0;
    }
    return bitcast<f32>(bits);
}

/// A logit's value with NaN read as -inf.
fn logit_value(bits: u32) -> f32 {
    if is_nan_bits(bits) {
        return neg_inf();
    }
    return bitcast<f32>(bits);
}

/// The scaled logit `(l - m) / t` of a row whose maximum `m` is finite: subtract first, then
/// divide, in f32 (no scaled logit exceeds 0, and a tiny `t` tends to the one-hot of `t = 0`).
/// A -inf (or NaN) logit stays -inf; at `t = +inf` every finite logit scales to 0 (the limit,
/// where a gap that overflowed to -inf would give NaN).
fn scaled(bits: u32, m: f32, t: f32) -> f32 {
    let l = logit_value(bits);
    if bitcast<u32>(l) == NEG_INF_BITS {
        return neg_inf();
    }
    if bitcast<u32>(t) == POS_INF_BITS {
        return 0.0;
    }
    return (l - m) / t;
}

fn wg_max_f32(lid: u32, v: f32) -> f32 {
    p_f32[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var m = p_f32[0];
        for (var g = 1u; g < WG; g++) {
            if p_f32[g] > m {
                m = p_f32[g];
            }
        }
        s_f32 = m;
    }
    return workgroupUniformLoad(&s_f32);
}

fn wg_sum_f32(lid: u32, v: f32) -> f32 {
    p_f32[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var s = 0.0;
        for (var g = 0u; g < WG; g++) {
            s = s + p_f32[g];
        }
        s_f32 = s;
    }
    return workgroupUniformLoad(&s_f32);
}

/// `exp((x - max) / t)`, 0 for a -inf scaled logit.
fn exp_term(bits: u32, t: f32, max: f32) -> f32 {
    let y = scaled(bits, max, t);
    if bitcast<u32>(y) == NEG_INF_BITS {
        return 0.0;
    }
    return exp(y);
}

/// The row's statistics under temperature `t` (already effective). Uniform result.
fn row_stats(lid: u32, vocab: u32, t: f32) -> Stats {
    if (bitcast<u32>(t) & 0x7fffffffu) == 0u {
        return Stats(KIND_ONEHOT, first_in_rank(lid, vocab), 0u, 0.0, 0.0);
    }
    // The maximum of the raw logits (a positive temperature does not change which entries are
    // the largest, +inf or -inf).
    var m = neg_inf();
    var inf_count = 0u;
    for (var i = lid; i < vocab; i += WG) {
        let l = logit_value(row_bits(i));
        if l > m {
            m = l;
        }
        if bitcast<u32>(l) == POS_INF_BITS {
            inf_count = inf_count + 1u;
        }
    }
    let count = wg_sum32(lid, inf_count);
    let max = wg_max_f32(lid, m);
    if bitcast<u32>(max) == POS_INF_BITS {
        return Stats(KIND_POSINF, 0u, count, max, 0.0);
    }
    if bitcast<u32>(max) == NEG_INF_BITS {
        return Stats(KIND_ALLNEGINF, 0u, 0u, max, 0.0);
    }
    // The normaliser in the reference's summation order (8 sequential lanes over whole groups of
    // 8, then the remainder, then remainder + the lanes in order): when one term dominates, f32
    // rounding of many tiny terms is order-dependent far beyond the tolerance, so the order is
    // part of the contract in practice.
    let full = vocab / 8u * 8u;
    var s = 0.0;
    if lid < 8u {
        for (var i = lid; i < full; i += 8u) {
            s = s + exp_term(row_bits(i), t, max);
        }
    } else if lid == 8u {
        for (var i = full; i < vocab; i++) {
            s = s + exp_term(row_bits(i), t, max);
        }
    }
    p_f32[lid] = s;
    workgroupBarrier();
    if lid == 0u {
        var lanes = 0.0;
        for (var l = 0u; l < 8u; l++) {
            lanes = lanes + p_f32[l];
        }
        s_f32 = p_f32[8] + lanes;
    }
    let sum = workgroupUniformLoad(&s_f32);
    return Stats(KIND_FINITE, 0u, 0u, max, sum);
}

/// The probability of element `i`, whose logit has the f32 bits `bits` (unread for a one-hot row).
fn stats_prob(st: Stats, i: u32, bits: u32, t: f32, vocab: u32) -> f32 {
    switch st.kind {
        case 0u: {
            return select(0.0, 1.0, i == st.arg);
        }
        case 1u: {
            return select(0.0, 1.0 / f32(st.count), bits == POS_INF_BITS);
        }
        case 2u: {
            return 1.0 / f32(vocab);
        }
        default: {
            return exp_term(bits, t, st.max) / st.sum;
        }
    }
}

/// The log-probability of element `i`, whose logit has the f32 bits `bits` (unread for a one-hot
/// row).
fn stats_logprob(st: Stats, i: u32, bits: u32, t: f32, vocab: u32) -> f32 {
    switch st.kind {
        case 0u: {
            return select(neg_inf(), 0.0, i == st.arg);
        }
        case 1u: {
            return select(neg_inf(), -log(f32(st.count)), bits == POS_INF_BITS);
        }
        case 2u: {
            return -log(f32(vocab));
        }
        default: {
            return scaled(bits, st.max, t) - log(st.sum);
        }
    }
}
