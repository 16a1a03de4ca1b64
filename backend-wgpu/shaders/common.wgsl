// Common helpers for every Specula WGSL kernel: exact 64- and 128-bit integer arithmetic on `u32`
// limbs, Philox4x32-10, the fixed-point weights and rank keys of `docs/semantics.md` §4, exact widening
// of f16/bf16 bit patterns, and order-preserving keys for argmax-style comparisons.
//
// No float operation takes part in any exact decision: keys, weights and comparisons are computed
// from bit patterns, so subnormal flushing or FMA contraction on a GPU cannot change a result.
// The generated prelude (Rust) defines the shared constants (PHILOX_*, WG, DT_*, ...).

// ---- 64-bit values: vec2<u32>(low, high) ----------------------------------------------------

fn u64_from(lo: u32) -> vec2<u32> {
    return vec2<u32>(lo, 0u);
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return !lt64(a, b);
}

fn is_zero64(a: vec2<u32>) -> bool {
    return a.x == 0u && a.y == 0u;
}

/// `a << s` for s < 64.
fn shl64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 32u {
        return vec2<u32>(0u, a.x << (s - 32u));
    }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}

/// `a >> s` for s < 64.
fn shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 32u {
        return vec2<u32>(a.y >> (s - 32u), 0u);
    }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

/// The full 64-bit product of two u32 (16-bit halves; no intermediate overflows).
fn mul32x32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = p01 + (p00 >> 16u) + (p10 & 0xffffu);
    return vec2<u32>((mid << 16u) | (p00 & 0xffffu), p11 + (mid >> 16u) + (p10 >> 16u));
}

/// `a · b` truncated to 64 bits.
fn mul64x32(a: vec2<u32>, b: u32) -> vec2<u32> {
    let lo = mul32x32(a.x, b);
    return vec2<u32>(lo.x, lo.y + a.y * b);
}

// ---- 128-bit values: vec4<u32>, x least significant -----------------------------------------

fn add128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    var r: vec4<u32>;
    var carry = 0u;
    for (var i = 0u; i < 4u; i++) {
        let s = a[i] + b[i];
        let c1 = select(0u, 1u, s < a[i]);
        let t = s + carry;
        let c2 = select(0u, 1u, t < s);
        r[i] = t;
        carry = c1 + c2;
    }
    return r;
}

fn sub128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    var r: vec4<u32>;
    var borrow = 0u;
    for (var i = 0u; i < 4u; i++) {
        let d = a[i] - b[i];
        let b1 = select(0u, 1u, a[i] < b[i]);
        let t = d - borrow;
        let b2 = select(0u, 1u, d < borrow);
        r[i] = t;
        borrow = b1 + b2;
    }
    return r;
}

fn lt128(a: vec4<u32>, b: vec4<u32>) -> bool {
    if a.w != b.w {
        return a.w < b.w;
    }
    if a.z != b.z {
        return a.z < b.z;
    }
    if a.y != b.y {
        return a.y < b.y;
    }
    return a.x < b.x;
}

/// The full 128-bit product of two 64-bit values.
fn mul64x64(a: vec2<u32>, b: vec2<u32>) -> vec4<u32> {
    let p0 = mul32x32(a.x, b.x);
    let p1 = mul32x32(a.x, b.y);
    let p2 = mul32x32(a.y, b.x);
    let p3 = mul32x32(a.y, b.y);
    var r = vec4<u32>(p0.x, p0.y, p3.x, p3.y);
    r = add128(r, vec4<u32>(0u, p1.x, p1.y, 0u));
    r = add128(r, vec4<u32>(0u, p2.x, p2.y, 0u));
    return r;
}

// ---- 160-bit values (the REJECTION acceptance test, up to 2^133) --------------------------------

/// Limbs 0-3 in `lo` (x least significant), limb 4 in `hi`.
struct U160 {
    lo: vec4<u32>,
    hi: u32,
}

/// `a · b` in full (a 128-bit value times a u32).
fn mul128x32_full(a: vec4<u32>, b: u32) -> U160 {
    var r = vec4<u32>(0u);
    var carry = 0u;
    for (var i = 0u; i < 4u; i++) {
        let prod = mul32x32(a[i], b);
        let s = prod.x + carry;
        r[i] = s;
        // prod.y <= 2^32 - 2, so adding the carry cannot overflow.
        carry = prod.y + select(0u, 1u, s < prod.x);
    }
    return U160(r, carry);
}

fn lt160(a: U160, b: U160) -> bool {
    if a.hi != b.hi {
        return a.hi < b.hi;
    }
    return lt128(a.lo, b.lo);
}

// ---- Philox4x32-10 and draws (`docs/semantics.md` §3) ----------------------------------------------------

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0u; round < PHILOX_ROUNDS; round++) {
        if round > 0u {
            k.x = k.x + PHILOX_W0;
            k.y = k.y + PHILOX_W1;
        }
        let p0 = mul32x32(PHILOX_M0, c.x);
        let p1 = mul32x32(PHILOX_M1, c.z);
        c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
    }
    return c;
}

/// The 64-bit draw of a seed for a purpose: `x0 | x1 << 32`.
fn draw(seed: vec2<u32>, purpose: u32) -> vec2<u32> {
    let x = philox4x32_10(vec4<u32>(purpose, 0u, 0u, 0u), seed);
    return vec2<u32>(x.x, x.y);
}

/// `floor(r · m / 2^64)`.
fn scale_draw(r: vec2<u32>, m: vec2<u32>) -> vec2<u32> {
    let p = mul64x64(r, m);
    return vec2<u32>(p.z, p.w);
}

/// `x mod MAX_INFER_SEED` for any 64-bit x.
fn reduce_seed(x: vec2<u32>) -> vec2<u32> {
    let m = vec2<u32>(MAX_INFER_SEED_LO, MAX_INFER_SEED_HI);
    var r = x;
    for (var i = 0u; i < 2u; i++) {
        if ge64(r, m) {
            r = sub64(r, m);
        }
    }
    return r;
}

/// `(infer_seed + 4·j) mod MAX_INFER_SEED` (rng::row_seed).
fn row_seed(infer_seed: vec2<u32>, j: u32) -> vec2<u32> {
    let step = reduce_seed(shl64(u64_from(j), 2u));
    return reduce_seed(add64(reduce_seed(infer_seed), step));
}

// ---- Fixed-point weights and rank keys (`docs/semantics.md` §4) ------------------------------------------

/// The rank key of a probability given as f32 bits: the bits of sanitize(p).
fn rank_key(bits: u32) -> u32 {
    if (bits & 0x80000000u) != 0u {
        return 0u; // negative, -0, negative NaN
    }
    if bits > 0x7f800000u {
        return 0u; // NaN
    }
    if bits > 0x3f800000u {
        return 0x3f800000u; // > 1 and +inf
    }
    return bits;
}

/// `floor(value(key) · 2^40)`, exact.
fn key_weight(key: u32) -> vec2<u32> {
    let e = (key >> 23u) & 0xffu;
    if e == 0u {
        return vec2<u32>(0u);
    }
    let mant = vec2<u32>((key & 0x7fffffu) | 0x800000u, 0u);
    let shift = i32(e) - 127 - 23 + i32(WEIGHT_BITS);
    if shift >= 0 {
        if shift >= 64 {
            return vec2<u32>(0u);
        }
        return shl64(mant, u32(shift));
    }
    if shift > -64 {
        return shr64(mant, u32(-shift));
    }
    return vec2<u32>(0u);
}

/// `ceil(top_p · 2^24)` for a device-side top_p (values outside (0, 1] and NaN count as 1).
fn top_p_fixed(bits: u32) -> u32 {
    var b = bits;
    // top_p > 0 && top_p <= 1, on bits: positive, nonzero, at most 0x3f800000.
    if (b & 0x80000000u) != 0u || b == 0u || b > 0x3f800000u {
        b = 0x3f800000u;
    }
    let e = (b >> 23u) & 0xffu;
    var mant: u32;
    var exp: i32;
    if e == 0u {
        mant = b & 0x7fffffu;
        exp = -126 - 23;
    } else {
        mant = (b & 0x7fffffu) | 0x800000u;
        exp = i32(e) - 127 - 23;
    }
    let shift = exp + i32(TOP_P_BITS);
    if shift >= 0 {
        return mant << u32(shift);
    }
    if shift > -64 {
        let s = u32(-shift);
        // (mant + 2^s - 1) >> s, in 64 bits.
        let one = shl64(u64_from(1u), s);
        let v = add64(u64_from(mant), sub64(one, u64_from(1u)));
        return shr64(v, s).x;
    }
    return 1u;
}

/// The least mass `c` with `c · 2^24 ≥ p · w`: `ceil(p · w / 2^24)`.
fn top_p_target_mass(p: u32, w: vec2<u32>) -> vec2<u32> {
    var prod = mul64x64(w, u64_from(p));
    prod = add128(prod, vec4<u32>((1u << TOP_P_BITS) - 1u, 0u, 0u, 0u));
    // >> 24
    let lo = (prod.x >> TOP_P_BITS) | (prod.y << (32u - TOP_P_BITS));
    let hi = (prod.y >> TOP_P_BITS) | (prod.z << (32u - TOP_P_BITS));
    return vec2<u32>(lo, hi);
}

/// Whether mass `c` reaches top_p `p` of total `w`: `c · 2^24 ≥ p · w`.
fn reaches_top_p(c: vec2<u32>, p: u32, w: vec2<u32>) -> bool {
    let lhs = mul64x64(c, u64_from(1u << TOP_P_BITS));
    let rhs = mul64x64(w, u64_from(p));
    return !lt128(lhs, rhs);
}

// ---- Float bit patterns -------------------------------------------------------------------------

/// Exact widening of f16 bits to f32 bits (subnormals, infinities and NaN payloads included).
fn f16_bits_to_f32_bits(h: u32) -> u32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        if m == 0u {
            return s;
        }
        let p = firstLeadingBit(m); // 0 ..= 9
        let exp = p + 103u;
        let mant = (m << (23u - p)) & 0x7fffffu;
        return s | (exp << 23u) | mant;
    }
    if e == 31u {
        return s | 0x7f800000u | (m << 13u);
    }
    return s | ((e + 112u) << 23u) | (m << 13u);
}

/// The f32 bits of element `i` of a float buffer stored as u32 words, for dtype `dt`.
fn widen_bits(word: u32, i: u32, dt: u32) -> u32 {
    if dt == DT_F32 {
        return word;
    }
    let h = (word >> ((i & 1u) * 16u)) & 0xffffu;
    if dt == DT_BF16 {
        return h << 16u;
    }
    return f16_bits_to_f32_bits(h);
}

/// The word index of element `i` of a float buffer of dtype `dt`.
fn word_of(i: u32, dt: u32) -> u32 {
    if dt == DT_F32 {
        return i;
    }
    return i >> 1u;
}

/// The f32 bits of +inf and -inf.
const POS_INF_BITS: u32 = 0x7f800000u;
const NEG_INF_BITS: u32 = 0xff800000u;

fn is_nan_bits(bits: u32) -> bool {
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

/// An order-preserving u32 of a non-NaN f32 bit pattern, -0 and +0 one key (never 0).
fn float_key(bits: u32) -> u32 {
    var b = bits;
    if b == 0x80000000u {
        b = 0u;
    }
    if (b & 0x80000000u) != 0u {
        return ~b;
    }
    return b | 0x80000000u;
}

/// A key that orders like argmax's order: NaN lowest (0), -0 == +0, then by value.
fn order_key(bits: u32) -> u32 {
    if is_nan_bits(bits) {
        return 0u;
    }
    return float_key(bits);
}

/// A key that orders like a logit for ranks: NaN counts as -inf, -0 == +0.
fn rank_value_key(bits: u32) -> u32 {
    if is_nan_bits(bits) {
        return order_key(0xff800000u);
    }
    return order_key(bits);
}

/// The i32 read of a device length: negative counts as 0.
fn len_or_zero(v: i32) -> u32 {
    return u32(max(v, 0));
}

/// No row: what `row_at` returns outside [0, rows).
const NO_ROW: u32 = 0xffffffffu;

/// The row `base + k` (a device offset plus a position), computed exactly as an integer: NO_ROW
/// unless it lies in [0, rows). A negative `base` is not "no rows": `base + k` may still be a
/// row. Nothing wraps: a sum at or above 2^32 is detected, a difference is taken only when
/// k >= |base|.
fn row_at(base: i32, k: u32, rows: u32) -> u32 {
    var r: u32;
    if base >= 0 {
        r = u32(base) + k;
        if r < k {
            return NO_ROW;
        }
    } else {
        // The magnitude of base as u32 (2^31 for i32::MIN).
        let neg = 0u - bitcast<u32>(base);
        if k < neg {
            return NO_ROW;
        }
        r = k - neg;
    }
    if r >= rows {
        return NO_ROW;
    }
    return r;
}

/// A byte of a u8 buffer stored as u32 words (`i` is the byte index within the binding).
fn byte_of(word: u32, i: u32) -> u32 {
    return (word >> ((i & 3u) * 8u)) & 0xffu;
}

/// The flat workgroup index of a dispatch that may be two-dimensional (more than 65535 groups).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

/// The flat invocation index of a dispatch of WG-wide workgroups that may be two-dimensional.
fn invocation_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// ---- Slots and output rows (`docs/semantics.md` §2) ------------------------------------------------------

/// Output rows of a slot from its `seq_lens_this_time` and `seq_lens_encoder`: 0 (empty), 1
/// (prefill), min(this_time, S) (decode).
fn slot_output_rows(this_time: i32, encoder: i32, step_tokens: u32) -> u32 {
    if this_time <= 0 {
        return 0u;
    }
    if encoder > 0 {
        return 1u;
    }
    return min(u32(this_time), step_tokens);
}

/// No slot: what `slot_of_row` returns for a batch id outside [0, real_bsz).
const NO_SLOT: u32 = 0xffffffffu;

/// The slot an output row names in `batch_id_per_token_output` (untrusted): NO_SLOT unless it
/// lies in [0, real_bsz).
fn slot_of_row(batch_id: i32, real_bsz: u32) -> u32 {
    if batch_id < 0 || u32(batch_id) >= real_bsz {
        return NO_SLOT;
    }
    return u32(batch_id);
}

/// The position of output row `t` in its slot, whose output rows start at `start`
/// (`cu_seqlens_q_output`, untrusted) and number `rows`: NO_ROW unless it lies in [0, rows).
fn position_in_slot(t: u32, start: i32, rows: u32) -> u32 {
    if start > i32(t) {
        return NO_ROW;
    }
    let pos = t - bitcast<u32>(start);
    if pos >= rows {
        return NO_ROW;
    }
    return pos;
}

// ---- Weights from logits (`docs/semantics.md` §4b): backend_api::logit_weights, step for step ---------------
//
// The generated prelude defines LOG2E_Q63_LO / _HI, GAP_FRACTION_BITS, GAP_LIMIT, EXP2_A0 ..
// EXP2_A6 and the bounds of sanitize_logit (LOGIT_TINY_BITS, LOGIT_HUGE_BITS). Logits are read as
// f32 bit patterns with integer code; the one float operation is the gap's f32 subtraction.

/// logit_rank_key(-inf), the smallest key (NaN has it too).
const NEG_INF_LOGIT_KEY: u32 = 0x007fffffu;
/// logit_rank_key(+inf), the largest.
const POS_INF_LOGIT_KEY: u32 = 0xff800000u;

/// A logit as the rules read it (step 1), on f32 bits: NaN is -inf; a finite |l| below
/// LOGIT_TINY_BITS (2^-76) is +0; a finite |l| above LOGIT_HUGE_BITS (2^64) is ±2^64.
fn sanitize_logit(b: u32) -> u32 {
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return 0xff800000u;
    }
    if a == 0x7f800000u {
        return b;
    }
    if a < LOGIT_TINY_BITS {
        return 0u;
    }
    if a > LOGIT_HUGE_BITS {
        return (b & 0x80000000u) | LOGIT_HUGE_BITS;
    }
    return b;
}

/// The rank key of a logit (step 1): an order-preserving u32 of the logit itself, not of its
/// sanitized value (NaN as -inf, +0 and -0 one key, never 0). The rank order of a logits row is
/// key descending, then id ascending, so its first token is the row's argmax.
fn logit_rank_key(b: u32) -> u32 {
    return rank_value_key(b);
}

/// The sanitized logit of a rank key: the value its weight is computed from.
fn logit_of_key(key: u32) -> f32 {
    var bits = ~key;
    if (key & 0x80000000u) != 0u {
        bits = key & 0x7fffffffu;
    }
    return bitcast<f32>(sanitize_logit(bits));
}

/// `x = m · 2^e`: `m` the integer significand, `e` the binary exponent.
struct Significand {
    m: u32,
    e: i32,
}

/// The significand and exponent of the f32 bits of a finite x > 0 (subnormals included).
fn significand(bits: u32) -> Significand {
    let exp = (bits >> 23u) & 0xffu;
    let mantissa = bits & 0x7fffffu;
    if exp == 0u {
        return Significand(mantissa, -149);
    }
    return Significand(mantissa | 0x800000u, i32(exp) - 150);
}

/// The number of significant bits of a 64-bit value (0 for 0).
fn bit_length64(v: vec2<u32>) -> u32 {
    if v.y != 0u {
        return 33u + firstLeadingBit(v.y);
    }
    if v.x != 0u {
        return 1u + firstLeadingBit(v.x);
    }
    return 0u;
}

/// `floor(n / d)` for a 64-bit n and 0 < d < 2^31: binary long division (the remainder stays
/// below 2d).
fn div64_by_u32(n: vec2<u32>, d: u32) -> vec2<u32> {
    var q = vec2<u32>(0u);
    var rem = 0u;
    for (var i = 0u; i < 64u; i++) {
        let at = 63u - i;
        var bit = 0u;
        if at >= 32u {
            bit = (n.y >> (at - 32u)) & 1u;
        } else {
            bit = (n.x >> at) & 1u;
        }
        rem = (rem << 1u) | bit;
        q = shl64(q, 1u);
        if rem >= d {
            rem = rem - d;
            q.x = q.x | 1u;
        }
    }
    return q;
}

// How the tokens of a row weigh. A probability row weighs w(p) by its rank key (WEIGH_KEYS); a
// logits row by the §4b steps, from its maximum and temperature.
/// Weights from the keys (key_weight): probability rows.
const WEIGH_KEYS: u32 = 0u;
/// Every logit -inf or NaN (step 2): every weight 0.
const WEIGH_ZERO: u32 = 1u;
/// Some logit +inf (step 2): those weigh 2^40, the rest 0.
const WEIGH_POS_INF: u32 = 2u;
/// T == 0 (step 3): the first maximum weighs 2^40, the rest 0.
const WEIGH_ARGMAX: u32 = 3u;
/// T == +inf (step 3): every finite logit weighs 2^40.
const WEIGH_UNIFORM: u32 = 4u;
/// Otherwise: exp2_weight(gap(m, l, c32, e)) (steps 4, 5).
const WEIGH_SCALED: u32 = 5u;

struct Weigh {
    kind: u32,
    /// SCALED: c = c32 · 2^e ≈ log2(e) / T, c32 in [2^31, 2^32).
    c32: u32,
    e: i32,
    /// Logits: the rank key of the row maximum m.
    max_key: u32,
    /// ARGMAX: the first token keyed max_key, the only one that keeps that key.
    first: u32,
}

/// The weighing of probability rows.
fn by_key() -> Weigh {
    return Weigh(WEIGH_KEYS, 0u, 0, 0u, 0u);
}

/// Steps 2 and 3: the weighing of a logits row from the rank key of its maximum (0: an empty row),
/// the first id holding it, and its (device) temperature as f32 bits. The temperature counts as
/// 1.0 when NaN or negative (-0 is 0); then one 64-by-24-bit division gives the scale.
fn logits_weigh(max_key: u32, first: u32, t_bits: u32) -> Weigh {
    var w = Weigh(WEIGH_KEYS, 0u, 0, max_key, first);
    var t = t_bits;
    let negative = (t & 0x80000000u) != 0u && (t & 0x7fffffffu) != 0u;
    if (t & 0x7fffffffu) > 0x7f800000u || negative {
        t = 0x3f800000u;
    }
    t = t & 0x7fffffffu;
    if max_key == POS_INF_LOGIT_KEY {
        w.kind = WEIGH_POS_INF;
    } else if max_key <= NEG_INF_LOGIT_KEY {
        w.kind = WEIGH_ZERO;
    } else if t == 0u {
        w.kind = WEIGH_ARGMAX;
    } else if t == 0x7f800000u {
        w.kind = WEIGH_UNIFORM;
    } else {
        let st = significand(t);
        let q = div64_by_u32(vec2<u32>(LOG2E_Q63_LO, LOG2E_Q63_HI), st.m);
        // q >= 2^63 / 2^24, so b >= 40.
        let b = bit_length64(q);
        w.kind = WEIGH_SCALED;
        w.c32 = shr64(q, b - 32u).x;
        w.e = i32(b) - 95 - st.e;
    }
    return w;
}

/// Step 4: the gap X = min(floor(M_D · C32 · 2^(E_D + e + F)), 40 · 2^F) of a finite sanitized logit
/// l below the row maximum m, with D = m - l: one f32 subtraction rounded to nearest even (D >= 0,
/// never subnormal after step 1).
fn gap(m: f32, l: f32, c32: u32, e: i32) -> u32 {
    let d = m - l;
    let d_bits = bitcast<u32>(d);
    if (d_bits & 0x7fffffffu) == 0u {
        return 0u;
    }
    let sd = significand(d_bits);
    // < 2^56: a shift below 8 cannot overflow.
    let product = mul32x32(sd.m, c32);
    let s = sd.e + e + i32(GAP_FRACTION_BITS);
    if s >= 8 {
        return GAP_LIMIT;
    }
    var x = vec2<u32>(0u);
    if s >= 0 {
        x = shl64(product, u32(s));
    } else if s > -64 {
        x = shr64(product, u32(-s));
    }
    if x.y != 0u || x.x > GAP_LIMIT {
        return GAP_LIMIT;
    }
    return x.x;
}

/// One step of the polynomial: `a + floor(p · g / 2^F)` (p · g < 2^55; the result is <= 2^31).
fn exp2_step(a: u32, p: u32, g: u32) -> u32 {
    return a + shr64(mul32x32(p, g), GAP_FRACTION_BITS).x;
}

/// Step 5: the weight of gap x, 2^40 · 2^(-x / 2^F) in integers, 0 from 40 · 2^F on. The maximum's
/// P(2^F) = 2^31, so it weighs 2^31 << 9 = 2^40.
fn exp2_weight(x: u32) -> vec2<u32> {
    if x >= GAP_LIMIT {
        return vec2<u32>(0u);
    }
    let n = x >> GAP_FRACTION_BITS;
    let g = (1u << GAP_FRACTION_BITS) - (x & ((1u << GAP_FRACTION_BITS) - 1u));
    var p = EXP2_A6;
    p = exp2_step(EXP2_A5, p, g);
    p = exp2_step(EXP2_A4, p, g);
    p = exp2_step(EXP2_A3, p, g);
    p = exp2_step(EXP2_A2, p, g);
    p = exp2_step(EXP2_A1, p, g);
    p = exp2_step(EXP2_A0, p, g);
    if n <= 9u {
        return shl64(u64_from(p), 9u - n);
    }
    return u64_from(p >> (n - 9u));
}

/// The weight of a logit of rank key `key` in a row weighed by `w` (any kind but WEIGH_KEYS).
fn logit_key_weight(w: Weigh, key: u32) -> vec2<u32> {
    let full = shl64(u64_from(1u), WEIGHT_BITS);
    let finite = key != NEG_INF_LOGIT_KEY && key != POS_INF_LOGIT_KEY;
    switch w.kind {
        case WEIGH_SCALED: {
            if !finite {
                return vec2<u32>(0u);
            }
            return exp2_weight(gap(logit_of_key(w.max_key), logit_of_key(key), w.c32, w.e));
        }
        case WEIGH_UNIFORM: {
            return select(vec2<u32>(0u), full, finite);
        }
        case WEIGH_POS_INF: {
            return select(vec2<u32>(0u), full, key == POS_INF_LOGIT_KEY);
        }
        case WEIGH_ARGMAX: {
            return select(vec2<u32>(0u), full, key == w.max_key);
        }
        default: {
            return vec2<u32>(0u);
        }
    }
}

/// The rank key of token `id` (f32 bits `bits`) of a logits row weighed by `w`. At T == 0 only the
/// first maximum weighs anything: the other maxima are keyed one below it, so that every weight is
/// a function of the key (the order among tokens of weight 0 decides nothing).
fn logit_row_key(w: Weigh, bits: u32, id: u32) -> u32 {
    let k = logit_rank_key(bits);
    if w.kind == WEIGH_ARGMAX && k == w.max_key && id != w.first {
        return k - 1u;
    }
    return k;
}

/// The weight of a token of rank key `key` in a row weighed by `w`: w(p) for probability rows.
fn weigh_key(w: Weigh, key: u32) -> vec2<u32> {
    if w.kind == WEIGH_KEYS {
        return key_weight(key);
    }
    return logit_key_weight(w, key);
}

/// The score top_p_candidates reports for a logits candidate of weight `w` in a row of total
/// weight `total` > 0 (`docs/semantics.md` §4b), as f32 bits: q = floor(w · 2^40 / total) (binary long
/// division; w <= 2^40 <= total <= 2^60, so the remainder stays below 2^61), cut to its 24 most
/// significant bits, and score = q · 2^-40, exact in f32.
fn candidate_score(w: vec2<u32>, total: vec2<u32>) -> u32 {
    var q = vec2<u32>(0u);
    var rem = w;
    if ge64(rem, total) {
        rem = sub64(rem, total);
        q = u64_from(1u);
    }
    for (var i = 0u; i < WEIGHT_BITS; i++) {
        rem = shl64(rem, 1u);
        q = shl64(q, 1u);
        if ge64(rem, total) {
            rem = sub64(rem, total);
            q.x = q.x | 1u;
        }
    }
    if is_zero64(q) {
        return 0u;
    }
    let b = bit_length64(q);
    var sig: vec2<u32>;
    if b > 24u {
        sig = shr64(q, b - 24u);
    } else {
        sig = shl64(q, 24u - b);
    }
    let exponent = b + 127u - 1u - WEIGHT_BITS;
    return (exponent << 23u) | (sig.x & 0x7fffffu);
}
