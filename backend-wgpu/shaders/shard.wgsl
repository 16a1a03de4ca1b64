// Sharded rows (`docs/semantics.md` §4d): what the kernels of the shard_* ops share.
//
// A rank holds the `[rows, len]` slice `[first, first + len)` of every row. A token is ranked by its
// key, the 52-bit `(ord(value) << 20) | (2^20 - 1 - id)` of its global id as a `vec2<u32>(low,
// high)` (a larger key comes first; keys are distinct within a row), and weighed as a token of the
// whole row from the row key (the largest key of the whole row in rank order: its maximum and its
// first token) exactly as `backend_api::shard::SliceWeigher` does: §4 for probabilities, §4b for
// logits (common.wgsl's `logits_weigh` from the row maximum's rank key), min_p against the row's
// largest weight. Everything is integer arithmetic on u32 limbs.
//
// The including shader binds its float matrix as `row_words` and starts each row with `begin_row`.

// ---- the current row ----------------------------------------------------------------------------

var<private> g_dt: u32;
var<private> g_base: u32;

/// Starts reading the row of dtype `dt` whose first element is element `base` of `row_words`.
fn begin_row(dt: u32, base: u32) {
    g_dt = dt;
    g_base = base;
}

/// The f32 bits of element `i` of the current row.
fn row_bits(i: u32) -> u32 {
    let e = g_base + i;
    return widen_bits(row_words[word_of(e, g_dt)], e, g_dt);
}

// ---- 64-bit helpers beyond common.wgsl ----------------------------------------------------------

fn max64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return select(a, b, lt64(a, b));
}

fn eq64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x == b.x && a.y == b.y;
}

/// `a + b`, saturating at 2^64 - 1.
fn add64_sat(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let s = add64(a, b);
    if lt64(s, a) {
        return vec2<u32>(0xffffffffu);
    }
    return s;
}

/// `a >> s` for any s (0 from 128 on).
fn shr128(a: vec4<u32>, s: u32) -> vec4<u32> {
    var r = a;
    var k = s;
    for (var i = 0u; i < 4u && k >= 32u; i++) {
        r = vec4<u32>(r.y, r.z, r.w, 0u);
        k = k - 32u;
    }
    if k >= 32u {
        return vec4<u32>(0u);
    }
    if k > 0u {
        let l = 32u - k;
        r = vec4<u32>((r.x >> k) | (r.y << l), (r.y >> k) | (r.z << l), (r.z >> k) | (r.w << l), r.w >> k);
    }
    return r;
}

// ---- keys ---------------------------------------------------------------------------------------

const ORDER_RANK: u32 = 0u;
const ORDER_ARGMAX: u32 = 1u;
/// The ordinal of NaN in argmax order: one below that of -inf.
const ARGMAX_NAN_ORD: u32 = 0x007ffffeu;
const ID_MASK: u32 = (1u << SHARD_KEY_ID_BITS) - 1u;

/// The ordinal of a score (f32 bits) in `order`: rank order takes a probability's sanitized value
/// or a logit itself (NaN as -inf, -0 as +0); argmax order the raw value with NaN below -inf.
fn score_ord(order: u32, logits: bool, bits: u32) -> u32 {
    if order == ORDER_ARGMAX {
        if is_nan_bits(bits) {
            return ARGMAX_NAN_ORD;
        }
        return float_key(bits);
    }
    if logits {
        return rank_value_key(bits);
    }
    return rank_key(bits) | 0x80000000u;
}

/// The key of global token `id` whose score has the f32 bits `bits`.
fn token_key(order: u32, logits: bool, bits: u32, id: u32) -> vec2<u32> {
    let ord = score_ord(order, logits, bits);
    let low = (ord << SHARD_KEY_ID_BITS) | (ID_MASK - (id & ID_MASK));
    return vec2<u32>(low, ord >> (32u - SHARD_KEY_ID_BITS));
}

/// The global id a key names.
fn key_id(key: vec2<u32>) -> u32 {
    return ID_MASK - (key.x & ID_MASK);
}

/// The f32 bits of the value a rank key carries (-inf for the key 0 of no token).
fn key_value_bits(key: vec2<u32>) -> u32 {
    if is_zero64(key) {
        return 0xff800000u;
    }
    let ord = (key.x >> SHARD_KEY_ID_BITS) | (key.y << (32u - SHARD_KEY_ID_BITS));
    if (ord >> 31u) != 0u {
        return ord & 0x7fffffffu;
    }
    return ~ord;
}

// ---- weights of a slice's tokens as tokens of the whole row ---------------------------------------

struct SliceWeigh {
    /// Logits: how the whole row weighs; probabilities: by key.
    w: Weigh,
    /// Logits at T == 0 (WEIGH_ARGMAX): the one token that weighs, the row key's.
    only: u32,
    /// min_p on: a token with `w · 2^24` below `floor = MINP · w_max` weighs 0.
    min_p_on: u32,
    floor: vec4<u32>,
}

/// Whether a device min_p (f32 bits) is on: above 0 and not NaN (values above 1 count as 1).
fn min_p_is_on(bits: u32) -> bool {
    return (bits & 0x80000000u) == 0u && bits != 0u && bits <= 0x7f800000u;
}

/// The weighing of a row whose row key is `row_key`: a logits row at temperature `t_bits`, or a
/// probability row; `min_p_bits` is its device min_p (0: off).
fn slice_weigh(logits: bool, row_key: vec2<u32>, t_bits: u32, min_p_bits: u32) -> SliceWeigh {
    var s: SliceWeigh;
    var w_max = vec2<u32>(0u);
    if logits {
        var max_key = NEG_INF_LOGIT_KEY;
        if !is_zero64(row_key) {
            max_key = logit_rank_key(key_value_bits(row_key));
        }
        s.w = logits_weigh(max_key, 0u, t_bits);
        if s.w.kind != WEIGH_ZERO {
            w_max = shl64(u64_from(1u), WEIGHT_BITS);
        }
    } else {
        s.w = by_key();
        if !is_zero64(row_key) {
            w_max = key_weight(rank_key(key_value_bits(row_key)));
        }
    }
    s.only = key_id(row_key);
    var minp = 0u;
    s.min_p_on = 0u;
    if min_p_is_on(min_p_bits) {
        s.min_p_on = 1u;
        minp = top_p_fixed(min_p_bits);
    }
    s.floor = mul64x64(u64_from(minp), w_max);
    return s;
}

/// The weight of global token `id` whose score has the f32 bits `bits`.
fn slice_weight(s: SliceWeigh, logits: bool, bits: u32, id: u32) -> vec2<u32> {
    var w: vec2<u32>;
    if !logits {
        w = key_weight(rank_key(bits));
    } else if s.w.kind == WEIGH_ARGMAX {
        w = select(vec2<u32>(0u), shl64(u64_from(1u), WEIGHT_BITS), id == s.only);
    } else {
        w = logit_key_weight(s.w, logit_rank_key(bits));
    }
    if s.min_p_on != 0u && lt128(mul64x64(w, u64_from(1u << TOP_P_BITS)), s.floor) {
        return vec2<u32>(0u);
    }
    return w;
}

// ---- REJECTION's residual -----------------------------------------------------------------------

/// The shift k of the residual: 41 for probability rows, max(0, bitlength(Wp) + bitlength(Wq) - 60)
/// for logits rows.
fn residual_shift(logits: bool, target_mass: vec2<u32>, draft_mass: vec2<u32>) -> u32 {
    if !logits {
        return WEIGHT_BITS + 1u;
    }
    let bits = bit_length64(target_mass) + bit_length64(draft_mass);
    return select(0u, bits - 60u, bits > 60u);
}

/// floor(max(0, wp·Wq - wq·Wp) / 2^shift), exact, saturating at 2^64 - 1.
fn residual_weight(wp: vec2<u32>, wq: vec2<u32>, target_mass: vec2<u32>, draft_mass: vec2<u32>, shift: u32) -> vec2<u32> {
    let plus = mul64x64(wp, draft_mass);
    let minus = mul64x64(wq, target_mass);
    if !lt128(minus, plus) {
        return vec2<u32>(0u);
    }
    let r = shr128(sub128(plus, minus), shift);
    if r.z != 0u || r.w != 0u {
        return vec2<u32>(0xffffffffu);
    }
    return r.xy;
}

// ---- workgroup collectives (one row per workgroup of WG invocations) ------------------------------

var<workgroup> s_u64: array<vec2<u32>, WG>;
var<workgroup> s_bc: vec4<u32>;

/// The largest of one u64 per invocation (uniform result).
fn wg_max64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    s_u64[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var m = vec2<u32>(0u);
        for (var g = 0u; g < WG; g++) {
            m = max64(m, s_u64[g]);
        }
        s_bc = vec4<u32>(m, 0u, 0u);
    }
    return workgroupUniformLoad(&s_bc).xy;
}

/// The exclusive scan in invocation order of one u64 per invocation, saturating: `.xy` the
/// saturated sum before this invocation, `.zw` over every invocation (uniform). Saturating sums of
/// non-negative values are associative, so the total is the saturated sum in any grouping.
fn wg_scan64_sat(lid: u32, v: vec2<u32>) -> vec4<u32> {
    s_u64[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var acc = vec2<u32>(0u);
        for (var g = 0u; g < WG; g++) {
            let x = s_u64[g];
            s_u64[g] = acc;
            acc = add64_sat(acc, x);
        }
        s_bc = vec4<u32>(acc, 0u, 0u);
    }
    let total = workgroupUniformLoad(&s_bc).xy;
    return vec4<u32>(s_u64[lid], total);
}

/// The exclusive scan in invocation order of one u32 per invocation: `.x` the sum before this
/// invocation, `.y` over every invocation (uniform).
fn wg_scan32(lid: u32, v: u32) -> vec2<u32> {
    let s = wg_scan64_sat(lid, u64_from(v));
    return vec2<u32>(s.x, s.z);
}

/// This invocation's contiguous part `[x, y)` of `n` elements (ascending in invocation order).
fn chunk_range(lid: u32, n: u32) -> vec2<u32> {
    let size = (n + WG - 1u) / WG;
    let start = min(lid * size, n);
    return vec2<u32>(start, min(start + size, n));
}
