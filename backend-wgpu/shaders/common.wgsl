// Common helpers for every Specula WGSL kernel: exact 64- and 128-bit integer arithmetic on `u32`
// limbs, Philox4x32-10, the fixed-point weights and rank keys of the contract (§3), exact widening
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

/// `a · b` truncated to 128 bits.
fn mul128x32(a: vec4<u32>, b: u32) -> vec4<u32> {
    var r = vec4<u32>(0u);
    for (var i = 0u; i < 4u; i++) {
        let p = mul32x32(a[i], b);
        var part = vec4<u32>(0u);
        part[i] = p.x;
        if i < 3u {
            part[i + 1u] = p.y;
        }
        r = add128(r, part);
    }
    return r;
}

// ---- Philox4x32-10 and draws (contract §2) ----------------------------------------------------

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

// ---- Fixed-point weights and rank keys (contract §3) ------------------------------------------

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

fn is_nan_bits(bits: u32) -> bool {
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

/// A key that orders like argmax's order: NaN lowest (0), -0 == +0, then by value.
fn order_key(bits: u32) -> u32 {
    if is_nan_bits(bits) {
        return 0u;
    }
    var b = bits;
    if b == 0x80000000u {
        b = 0u;
    }
    if (b & 0x80000000u) != 0u {
        return ~b;
    }
    return b | 0x80000000u;
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

// ---- Slots and output rows (contract §1) ------------------------------------------------------

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
