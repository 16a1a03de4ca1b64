// Shared by every Specula CUDA kernel (prepended as text before each op file, so no include path
// is needed): integer types, the exact 64/128-bit helpers, Philox4x32-10 and the draw rule,
// fixed-point weights and rank keys, widening of f16/bf16 storage, and block-wide reductions and
// scans.
//
// Everything a kernel shares with the Rust side (Philox constants, weight bits, limits, block
// sizes) arrives as a -D define generated from `specula_backend_api::abi`; nothing here re-types
// those values. The element types arrive as -DSPECULA_T=F32|F16|BF16 (and SPECULA_D for the draft
// rows of REJECTION); -DSPECULA_SUFFIX names the entry points (`argmax_f32`).

typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define SPECULA_CAT2(a, b) a##_##b
#define SPECULA_CAT(a, b) SPECULA_CAT2(a, b)
// `SPECULA_ENTRY(argmax)` is `argmax_f32` when compiled with -DSPECULA_SUFFIX=f32.
#define SPECULA_ENTRY(op) SPECULA_CAT(op, SPECULA_SUFFIX)

#define SPECULA_I32_MAX 2147483647
#define SPECULA_U32_MAX 0xffffffffu
// +inf as a constant expression (NVRTC has no <math.h> INFINITY).
#define SPECULA_INF __int_as_float(0x7f800000)

// ---------------------------------------------------------------------------------------------
// Element types: probabilities and logits are read as f32; f16 and bf16 widen exactly.

struct F32 {
    typedef float raw;
    static __device__ __forceinline__ float widen(float x) { return x; }
};

struct F16 {
    typedef unsigned short raw;
    static __device__ __forceinline__ float widen(unsigned short h) {
        float f;
        // cvt.f32.f16 is exact (every binary16 value is a binary32 value).
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
};

struct BF16 {
    typedef unsigned short raw;
    static __device__ __forceinline__ float widen(unsigned short h) {
        return __uint_as_float(((u32)h) << 16);
    }
};

// Loads 4 consecutive elements starting at `i` (a multiple of 4 when `vec`), as f32. Elements at or
// beyond `end` are returned as 0 and must be masked by the caller with `i + j < end`.
template <class E>
__device__ __forceinline__ void load4(const typename E::raw* __restrict__ row, u32 i, u32 end,
                                      bool vec, float out[4]);

template <>
__device__ __forceinline__ void load4<F32>(const float* __restrict__ row, u32 i, u32 end, bool vec,
                                           float out[4]) {
    if (vec && i + 4 <= end) {
        float4 v = *reinterpret_cast<const float4*>(row + i);
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) out[j] = (i + j < end) ? row[i + j] : 0.0f;
    }
}

template <class E>
__device__ __forceinline__ void load4_half(const unsigned short* __restrict__ row, u32 i, u32 end,
                                           bool vec, float out[4]) {
    if (vec && i + 4 <= end) {
        uint2 v = *reinterpret_cast<const uint2*>(row + i);
        out[0] = E::widen((unsigned short)(v.x & 0xffffu));
        out[1] = E::widen((unsigned short)(v.x >> 16));
        out[2] = E::widen((unsigned short)(v.y & 0xffffu));
        out[3] = E::widen((unsigned short)(v.y >> 16));
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) out[j] = (i + j < end) ? E::widen(row[i + j]) : 0.0f;
    }
}

template <>
__device__ __forceinline__ void load4<F16>(const unsigned short* __restrict__ row, u32 i, u32 end,
                                           bool vec, float out[4]) {
    load4_half<F16>(row, i, end, vec, out);
}

template <>
__device__ __forceinline__ void load4<BF16>(const unsigned short* __restrict__ row, u32 i, u32 end,
                                            bool vec, float out[4]) {
    load4_half<BF16>(row, i, end, vec, out);
}

// ---------------------------------------------------------------------------------------------
// Exact 128- and 192-bit helpers (`docs/semantics.md` §4: "C · 2^24 ≥ P · W" needs up to 108 bits, the
// REJECTION residual 101, its acceptance test 133 on logits rows). Built on __umul64hi so they do
// not depend on compiler support for __int128.

struct u128 {
    u64 hi;
    u64 lo;
};

__device__ __forceinline__ u128 u128_make(u64 hi, u64 lo) {
    u128 r;
    r.hi = hi;
    r.lo = lo;
    return r;
}

__device__ __forceinline__ u128 mul_64x64(u64 a, u64 b) { return u128_make(__umul64hi(a, b), a * b); }

__device__ __forceinline__ bool u128_lt(u128 a, u128 b) {
    return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

__device__ __forceinline__ bool u128_ge(u128 a, u128 b) { return !u128_lt(a, b); }

// a << s for 0 < s < 64.
__device__ __forceinline__ u128 u128_shl(u128 a, u32 s) {
    return u128_make((a.hi << s) | (a.lo >> (64 - s)), a.lo << s);
}

// a - b for a >= b.
__device__ __forceinline__ u128 u128_sub(u128 a, u128 b) {
    u64 lo = a.lo - b.lo;
    u64 borrow = (a.lo < b.lo) ? 1ull : 0ull;
    return u128_make(a.hi - b.hi - borrow, lo);
}

// The low 64 bits of a >> s for 0 < s < 64.
__device__ __forceinline__ u64 u128_shr_lo(u128 a, u32 s) { return (a.hi << (64 - s)) | (a.lo >> s); }

// a · b where a is 128-bit and the product is known to fit in 128 bits.
__device__ __forceinline__ u128 u128_mul_u64(u128 a, u64 b) {
    u128 low = mul_64x64(a.lo, b);
    return u128_make(low.hi + a.hi * b, low.lo);
}

// Three 64-bit limbs: the REJECTION acceptance test's products reach 2^133 on logits rows.
struct u192 {
    u64 hi;
    u64 mid;
    u64 lo;
};

// a · b, in full.
__device__ __forceinline__ u192 u192_mul_128x64(u128 a, u64 b) {
    const u128 l = mul_64x64(a.lo, b);
    const u128 h = mul_64x64(a.hi, b);
    u192 r;
    r.lo = l.lo;
    r.mid = l.hi + h.lo;
    r.hi = h.hi + (r.mid < l.hi ? 1ull : 0ull);
    return r;
}

// a · 2^s, 0 < s < 64.
__device__ __forceinline__ u192 u192_shl_128(u128 a, u32 s) {
    u192 r;
    r.hi = a.hi >> (64 - s);
    r.mid = (a.hi << s) | (a.lo >> (64 - s));
    r.lo = a.lo << s;
    return r;
}

__device__ __forceinline__ bool u192_lt(u192 a, u192 b) {
    if (a.hi != b.hi) return a.hi < b.hi;
    if (a.mid != b.mid) return a.mid < b.mid;
    return a.lo < b.lo;
}

// floor(a / 2^s) for 0 <= s < 64, known to fit in 64 bits.
__device__ __forceinline__ u64 u128_shr_fit(u128 a, u32 s) { return s == 0 ? a.lo : u128_shr_lo(a, s); }

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and the draw of a token seed for a purpose (`docs/semantics.md` §3).

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int round = 0; round < SPECULA_PHILOX_ROUNDS; ++round) {
        if (round > 0) {
            k.x += SPECULA_PHILOX_W0;
            k.y += SPECULA_PHILOX_W1;
        }
        const u32 hi0 = __umulhi(SPECULA_PHILOX_M0, c.x);
        const u32 lo0 = SPECULA_PHILOX_M0 * c.x;
        const u32 hi1 = __umulhi(SPECULA_PHILOX_M1, c.z);
        const u32 lo1 = SPECULA_PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// R = x0 | x1 << 32 with x = philox((purpose, 0, 0, 0), (lo32(seed), hi32(seed))).
__device__ __forceinline__ u64 specula_draw(u64 seed, u32 purpose) {
    const uint4 x = philox4x32_10(make_uint4(purpose, 0u, 0u, 0u),
                                  make_uint2((u32)seed, (u32)(seed >> 32)));
    return (u64)x.x | ((u64)x.y << 32);
}

// t = floor(R · M / 2^64), always < M when M > 0.
__device__ __forceinline__ u64 scale_draw(u64 draw, u64 mass) { return __umul64hi(draw, mass); }

// (infer_seed + 4·j) mod MAX_INFER_SEED, defined for every u64 (reduced first, as rng::row_seed).
__device__ __forceinline__ u64 row_seed(u64 infer_seed, u64 j) {
    const u64 m = SPECULA_MAX_INFER_SEED;
    // j < 2^62 in every caller (a position within a slot), so j·4 does not wrap.
    const u64 step = (j * SPECULA_SEED_STRIDE) % m;
    // Both terms are < m < 2^63: the sum does not wrap.
    return (infer_seed % m + step) % m;
}

// ---------------------------------------------------------------------------------------------
// Fixed-point weights, rank keys and top-p (`docs/semantics.md` §4).

// sanitize(p): 0 for NaN and p <= 0, 1 for p > 1 (and +inf), else p.
__device__ __forceinline__ float sanitize_prob(float p) {
    if (p > 1.0f) return 1.0f;
    if (p > 0.0f) return p;
    return 0.0f;
}

__device__ __forceinline__ u32 rank_key(float p) { return __float_as_uint(sanitize_prob(p)); }

// floor(value(key) · 2^40) for a sanitized key (<= 0x3f800000), exact.
__device__ __forceinline__ u64 key_weight(u32 key) {
    const u32 exp = (key >> 23) & 0xffu;
    if (exp == 0) return 0;
    const u64 mantissa = (u64)((key & 0x7fffffu) | 0x800000u);
    const int shift = (int)exp - 127 - 23 + SPECULA_WEIGHT_BITS;
    if (shift >= 64) return 0;  // not a sanitized key: never produced by rank_key
    if (shift >= 0) return mantissa << shift;
    if (shift > -64) return mantissa >> (-shift);
    return 0;
}

__device__ __forceinline__ u64 prob_weight(float p) { return key_weight(rank_key(p)); }

// The rank key of 2^-40, the smallest probability with a nonzero weight.
#define SPECULA_MIN_WEIGHT_KEY ((u32)(127 - SPECULA_WEIGHT_BITS) << 23)

// A device-side top_p outside (0, 1] (or NaN) counts as 1.0.
__device__ __forceinline__ float effective_top_p(float top_p) {
    return (top_p > 0.0f && top_p <= 1.0f) ? top_p : 1.0f;
}

// P = ceil(top_p · 2^24), exact, in [1, 2^24].
__device__ __forceinline__ u64 top_p_fixed(float top_p) {
    const u32 bits = __float_as_uint(effective_top_p(top_p));
    const u32 e = (bits >> 23) & 0xffu;
    u64 mantissa;
    int exp;
    if (e == 0) {
        mantissa = (u64)(bits & 0x7fffffu);
        exp = -126 - 23;
    } else {
        mantissa = (u64)((bits & 0x7fffffu) | 0x800000u);
        exp = (int)e - 127 - 23;
    }
    const int shift = exp + SPECULA_TOP_P_BITS;
    if (shift >= 0) return mantissa << shift;
    if (shift > -64) {
        const int s = -shift;
        return (mantissa + (1ull << s) - 1) >> s;
    }
    return 1;
}

// The least mass C with C · 2^24 >= P · W: ceil(P · W / 2^24). P <= 2^24, W <= 2^60.
__device__ __forceinline__ u64 top_p_target_mass(u64 p_fixed, u64 total) {
    const u128 prod = mul_64x64(p_fixed, total);
    const u64 mask = (1ull << SPECULA_TOP_P_BITS) - 1;
    const u64 q = u128_shr_lo(prod, SPECULA_TOP_P_BITS);
    return q + ((prod.lo & mask) != 0 ? 1ull : 0ull);
}

// Whether mass c reaches top_p (fixed p) of total w: c · 2^24 >= p · w, exact.
__device__ __forceinline__ bool reaches_top_p(u64 c, u64 p_fixed, u64 total) {
    return u128_ge(u128_shl(u128_make(0, c), SPECULA_TOP_P_BITS), mul_64x64(p_fixed, total));
}

// ---------------------------------------------------------------------------------------------
// Weights from logits (`docs/semantics.md` §4b): `specula_backend_api::logit_weights`, step for step. The
// constants arrive as -D defines from that module (SPECULA_LOG2E_Q63, SPECULA_GAP_FRACTION_BITS,
// SPECULA_GAP_LIMIT, SPECULA_EXP2_COEFFICIENTS) and the bounds of its sanitize_logit as f32 bit
// patterns (SPECULA_LOGIT_TINY_BITS, SPECULA_LOGIT_HUGE_BITS).

#define SPECULA_POS_INF_BITS 0x7f800000u
#define SPECULA_NEG_INF_BITS 0xff800000u

// A logit as the rules read it (step 1), on f32 bits: NaN is -inf; a finite |l| below 2^-76 is +0;
// a finite |l| above 2^64 is +-2^64.
__device__ __forceinline__ u32 sanitize_logit_bits(u32 b) {
    const u32 a = b & 0x7fffffffu;
    if (a > SPECULA_POS_INF_BITS) return SPECULA_NEG_INF_BITS;
    if (a == SPECULA_POS_INF_BITS) return b;
    if (a < SPECULA_LOGIT_TINY_BITS) return 0u;
    if (a > SPECULA_LOGIT_HUGE_BITS) return (b & 0x80000000u) | SPECULA_LOGIT_HUGE_BITS;
    return b;
}

// logit_rank_key(-inf) (NaN has it too): the smallest key of a logit.
#define SPECULA_NEG_INF_LOGIT_KEY 0x007fffffu
// logit_rank_key(+inf): the largest.
#define SPECULA_POS_INF_LOGIT_KEY 0xff800000u

// The rank key of a logit (step 1): an order-preserving u32 of the logit itself, not of its
// sanitized value (NaN as -inf, +0 and -0 one key, never 0). The rank order of a logits row is
// key descending, then id ascending, so its first token is the row's argmax.
__device__ __forceinline__ u32 logit_rank_key(float x) {
    u32 s = __float_as_uint(x);
    if ((s & 0x7fffffffu) > SPECULA_POS_INF_BITS) s = SPECULA_NEG_INF_BITS;
    if (s == 0x80000000u) s = 0u;
    return (s & 0x80000000u) ? ~s : (s | 0x80000000u);
}

// The sanitized logit of a rank key: the value its weight is computed from.
__device__ __forceinline__ float logit_of_key(u32 key) {
    return __uint_as_float(sanitize_logit_bits((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key));
}

// x = M · 2^E with M the integer significand (subnormals included), for finite x > 0 (f32 bits).
__device__ __forceinline__ u64 significand(u32 bits, int& e) {
    const u32 exp = (bits >> 23) & 0xffu;
    const u64 mantissa = (u64)(bits & 0x7fffffu);
    if (exp == 0) {
        e = -149;
        return mantissa;
    }
    e = (int)exp - 150;
    return mantissa | 0x800000ull;
}

// How the tokens of a row weigh. A probability row weighs w(p) by its rank key (WEIGH_KEYS); a
// logits row by the 3b steps, from its maximum and temperature (every other kind).
#define WEIGH_KEYS 0u     // weights from the keys (key_weight): probability rows
#define WEIGH_ZERO 1u     // every logit -inf or NaN (step 2): every weight 0
#define WEIGH_POS_INF 2u  // some logit +inf (step 2): those weigh 2^40, the rest 0
#define WEIGH_ARGMAX 3u   // T == 0 (step 3): the first maximum weighs 2^40, the rest 0
#define WEIGH_UNIFORM 4u  // T == +inf (step 3): every finite logit weighs 2^40
#define WEIGH_SCALED 5u   // otherwise: exp2_weight(logit_gap(m, l, c32, e)) (steps 4, 5)

struct Weigh {
    u64 c32;      // SCALED: c = c32 · 2^e ≈ log2(e) / T, c32 in [2^31, 2^32)
    i32 e;
    u32 kind;
    u32 max_key;  // logits: the rank key of the row maximum m
    u32 first;    // ARGMAX: the first token keyed max_key, the only one that keeps that key
};

// The weighing of probability rows.
__device__ __forceinline__ Weigh weigh_by_key() {
    Weigh w;
    w.c32 = 0;
    w.e = 0;
    w.kind = WEIGH_KEYS;
    w.max_key = 0;
    w.first = 0;
    return w;
}

// Steps 2 and 3: the weighing of a logits row from the rank key of its maximum, the first id
// holding it, and its (device) temperature t (NaN or negative counts as 1.0); then one
// 64-by-24-bit division gives the scale.
__device__ __forceinline__ Weigh logits_weigh(u32 max_key, u32 first, float t) {
    Weigh w = weigh_by_key();
    w.max_key = max_key;
    w.first = first;
    const float tt = t >= 0.0f ? t : 1.0f;
    if (max_key == SPECULA_POS_INF_LOGIT_KEY) {
        w.kind = WEIGH_POS_INF;
    } else if (max_key <= SPECULA_NEG_INF_LOGIT_KEY) {
        w.kind = WEIGH_ZERO;
    } else if (tt == 0.0f) {
        w.kind = WEIGH_ARGMAX;
    } else if (tt == SPECULA_INF) {
        w.kind = WEIGH_UNIFORM;
    } else {
        int e_t;
        const u64 m_t = significand(__float_as_uint(tt), e_t);
        const u64 q = (u64)SPECULA_LOG2E_Q63 / m_t;
        const int b = 64 - __clzll((long long)q);
        w.kind = WEIGH_SCALED;
        w.c32 = q >> (b - 32);
        w.e = b - 95 - e_t;
    }
    return w;
}

// Step 4: the gap X = min(floor(M_D · C32 · 2^(E_D + e + F)), 40 · 2^F) of a finite sanitized
// logit l below the row maximum m, with D = m - l: one f32 subtraction rounded to nearest even
// (__fsub_rn is never contracted; D >= 0, never subnormal after step 1).
__device__ __forceinline__ u64 logit_gap(float m, float l, u64 c32, int e) {
    const u32 d_bits = __float_as_uint(__fsub_rn(m, l));
    if ((d_bits & 0x7fffffffu) == 0) return 0;
    int e_d;
    const u64 product = significand(d_bits, e_d) * c32;  // < 2^56: a shift below 8 cannot overflow
    const int s = e_d + e + SPECULA_GAP_FRACTION_BITS;
    if (s >= 8) return SPECULA_GAP_LIMIT;
    u64 x = 0;
    if (s >= 0) x = product << s;
    else if (s > -64) x = product >> (-s);
    return x < SPECULA_GAP_LIMIT ? x : SPECULA_GAP_LIMIT;
}

// Step 5: the weight of gap x, 2^40 · 2^(-x / 2^F) in integers, 0 from 40 · 2^F on. The maximum's
// P(2^F) = 2^31, so it weighs 2^31 << 9 = 2^40.
__device__ __forceinline__ u64 exp2_weight(u64 x) {
    if (x >= SPECULA_GAP_LIMIT) return 0;
    const u64 a[7] = {SPECULA_EXP2_COEFFICIENTS};
    const u32 n = (u32)(x >> SPECULA_GAP_FRACTION_BITS);
    const u64 one = 1ull << SPECULA_GAP_FRACTION_BITS;
    const u64 g = one - (x & (one - 1));
    u64 p = a[6];
#pragma unroll
    for (int k = 5; k >= 0; --k) p = a[k] + ((p * g) >> SPECULA_GAP_FRACTION_BITS);
    return n <= 9 ? p << (9 - n) : p >> (n - 9);
}

// The weight of a logit of rank key `key` in a row weighed by w (any kind but WEIGH_KEYS).
__device__ __forceinline__ u64 logit_key_weight(const Weigh& w, u32 key) {
    const u64 full = 1ull << SPECULA_WEIGHT_BITS;
    const bool finite = key != SPECULA_NEG_INF_LOGIT_KEY && key != SPECULA_POS_INF_LOGIT_KEY;
    switch (w.kind) {
        case WEIGH_SCALED:
            return finite ? exp2_weight(logit_gap(logit_of_key(w.max_key), logit_of_key(key), w.c32, w.e)) : 0;
        case WEIGH_UNIFORM: return finite ? full : 0;
        case WEIGH_POS_INF: return key == SPECULA_POS_INF_LOGIT_KEY ? full : 0;
        case WEIGH_ARGMAX: return key == w.max_key ? full : 0;
        default: return 0;
    }
}

// The rank key of token `id` (value x) of a logits row weighed by w. At T == 0 only the first
// maximum weighs anything: the other maxima are keyed one below it, so that every weight is a
// function of the key (the order among tokens of weight 0 decides nothing).
__device__ __forceinline__ u32 logit_row_key(const Weigh& w, float x, u32 id) {
    const u32 k = logit_rank_key(x);
    return (w.kind == WEIGH_ARGMAX && k == w.max_key && id != w.first) ? k - 1 : k;
}

// The rank key of token `id` (value x) of a row weighed by w: the sanitized probability's bits,
// or the rank key of the logit. Weights never increase as the key decreases.
__device__ __forceinline__ u32 row_key(const Weigh& w, float x, u32 id) {
    return w.kind == WEIGH_KEYS ? rank_key(x) : logit_row_key(w, x, id);
}

// The weight of a token of rank key `key` in a row weighed by w.
__device__ __forceinline__ u64 weight_of(const Weigh& w, u32 key) {
    return w.kind == WEIGH_KEYS ? key_weight(key) : logit_key_weight(w, key);
}

// The score of a logits candidate of weight w in a row of total weight W > 0 (`docs/semantics.md` §4b), as
// f32: q = floor(w · 2^40 / W) (binary long division; the remainder stays below W <= 2^60), cut
// to its 24 most significant bits, and score = q · 2^-40, exact in f32.
__device__ __forceinline__ float candidate_score(u64 w, u64 total) {
    u64 q = w / total, rem = w % total;
    for (int i = 0; i < SPECULA_WEIGHT_BITS; ++i) {
        rem <<= 1;
        q <<= 1;
        if (rem >= total) {
            rem -= total;
            q |= 1ull;
        }
    }
    if (q == 0) return 0.0f;
    const u32 b = 64u - (u32)__clzll((long long)q);
    const u64 sig = b > 24u ? q >> (b - 24u) : q << (24u - b);
    const u32 exponent = b - 1u - (u32)SPECULA_WEIGHT_BITS + 127u;
    return __uint_as_float((exponent << 23) | ((u32)sig & 0x7fffffu));
}

// Device lengths: negative counts as 0.
__device__ __forceinline__ u64 len_or_zero(i32 v) { return v > 0 ? (u64)v : 0ull; }

__device__ __forceinline__ i32 clamp_i32(i64 v) {
    return v > (i64)SPECULA_I32_MAX ? SPECULA_I32_MAX : (v < -(i64)SPECULA_I32_MAX - 1 ? (i32)(-(i64)SPECULA_I32_MAX - 1) : (i32)v);
}

// ---------------------------------------------------------------------------------------------
// Warp and block collectives. `BLOCK` is a multiple of 32 and at most 1024.

// The combining operations of the reductions: `op(acc, x)` folds x into the running acc.
struct SumOp {
    template <class T>
    __device__ __forceinline__ T operator()(T acc, T x) const { return acc + x; }
};

struct MaxOp {
    template <class T>
    __device__ __forceinline__ T operator()(T acc, T x) const { return x > acc ? x : acc; }
};

// fmaxf ignores a NaN operand: NaN counts as -inf.
struct FMaxOp {
    __device__ __forceinline__ float operator()(float acc, float x) const { return fmaxf(acc, x); }
};

// The reduction of `v` over the warp; every lane gets it.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The reduction of `v` over the block, the warps' results folded in warp order onto `identity`;
// every thread gets it. `scratch` holds BLOCK / 32 entries.
template <int BLOCK, class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, Op op) {
    v = warp_reduce(v, op);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T r = identity;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) r = op(r, scratch[w]);
    return r;
}

template <int BLOCK>
__device__ __forceinline__ u64 block_sum_u64(u64 v, u64* scratch) {
    return block_reduce<BLOCK>(v, scratch, 0ull, SumOp());
}

template <int BLOCK>
__device__ __forceinline__ u64 block_max_u64(u64 v, u64* scratch) {
    return block_reduce<BLOCK>(v, scratch, 0ull, MaxOp());
}

// Exclusive block scan of a pair of unsigned sums in thread order; also returns the block totals.
// `sa` and `sb` hold BLOCK / 32 entries each.
template <int BLOCK, class A, class B>
__device__ __forceinline__ void block_scan_pair(A a, B b, A& ex_a, B& ex_b, A& tot_a, B& tot_b, A* sa,
                                                B* sb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    A ia = a;
    B ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const A na = __shfl_up_sync(0xffffffffu, ia, o);
        const B nb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += na;
            ib += nb;
        }
    }
    __syncthreads();
    if (lane == 31) {
        sa[warp] = ia;
        sb[warp] = ib;
    }
    __syncthreads();
    A wa = 0, ta = 0;
    B wb = 0, tb = 0;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) {
        if (w < warp) {
            wa += sa[w];
            wb += sb[w];
        }
        ta += sa[w];
        tb += sb[w];
    }
    ex_a = wa + ia - a;
    ex_b = wb + ib - b;
    tot_a = ta;
    tot_b = tb;
}

// (key, id) packed so that the largest packed value is the largest key with the lowest id: the
// first token in rank order.
__device__ __forceinline__ u64 pack_key_id(u32 key, u32 id) {
    return ((u64)key << 32) | (u64)(SPECULA_U32_MAX - id);
}

__device__ __forceinline__ u32 packed_id(u64 packed) { return SPECULA_U32_MAX - (u32)packed; }

// ---------------------------------------------------------------------------------------------
// Row statistics shared by argmax, softmax and accept_logprobs (one block per row, `BLOCK`
// threads, rows of `vocab` elements read four at a time when `vec`).

// Whether (a, ia) ranks above (b, ib) in argmax order: larger value, NaN below every number,
// -0 equal to +0, ties to the lower id.
__device__ __forceinline__ bool argmax_better(float a, u32 ia, float b, u32 ib) {
    if (a > b) return true;
    if (b > a) return false;
    const bool an = isnan(a), bn = isnan(b);
    if (an != bn) return bn;
    return ia < ib;
}

// Calls f(i, x) for each of this thread's elements of a row of `end` elements, read four at a time
// when `vec`: elements 4t .. 4t + 3 of thread t, then 4(t + BLOCK) .., in ascending order.
template <class E, int BLOCK, class F>
__device__ __forceinline__ void for_row_elements(const typename E::raw* __restrict__ row, u32 end, bool vec,
                                                 F f) {
    for (u32 i = 4 * threadIdx.x; i < end; i += 4 * BLOCK) {
        float v[4];
        load4<E>(row, i, end, vec, v);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (i + j < end) f(i + j, v[j]);
    }
}

template <class E, int BLOCK>
__device__ u32 block_row_argmax(const typename E::raw* __restrict__ row, u32 vocab, bool vec) {
    __shared__ float sv[BLOCK / 32];
    __shared__ u32 si[BLOCK / 32];
    float best = __uint_as_float(0x7fc00000u);  // NaN: below every number
    u32 best_i = SPECULA_U32_MAX;
    for_row_elements<E, BLOCK>(row, vocab, vec, [&](u32 i, float x) {
        if (argmax_better(x, i, best, best_i)) {
            best = x;
            best_i = i;
        }
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (argmax_better(ov, oi, best, best_i)) {
            best = ov;
            best_i = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = best_i;
    }
    __syncthreads();
    best = sv[0];
    best_i = si[0];
    for (int w = 1; w < BLOCK / 32; ++w)
        if (argmax_better(sv[w], si[w], best, best_i)) {
            best = sv[w];
            best_i = si[w];
        }
    __syncthreads();
    // An all-NaN row ends on its lowest id, 0 (the placeholder id U32_MAX loses every tie).
    return best_i == SPECULA_U32_MAX ? 0u : best_i;
}

// A device-side temperature: negative or NaN counts as 1.0.
__device__ __forceinline__ float effective_temperature(float t) { return t >= 0.0f ? t : 1.0f; }

// (x - m) / t with NaN read as -inf: the scaled logit of `docs/semantics.md` §5.5 in a row whose maximum
// logit is the finite m. Subtract first, then divide (f32), so a tiny t tends to the one-hot of
// t = 0. At t = +inf every finite logit scales to 0 (x - m can overflow to -inf, and -inf / inf
// would drop it) and a -inf or NaN logit to -inf.
__device__ __forceinline__ float scaled_logit(float x, float m, float t) {
    if (isinf(t)) return isfinite(x) ? 0.0f : -SPECULA_INF;
    const float y = (x - m) / t;
    return isnan(y) ? -SPECULA_INF : y;
}

// What a row's softmax needs (`docs/semantics.md` §5.5).
struct RowStats {
    int kind;       // 0 finite, 1 one-hot, 2 +inf maximum, 3 all -inf (or NaN)
    u32 arg;        // one-hot: the argmax
    u32 inf_count;  // +inf maximum: how many logits are +inf
    float max;      // the maximum logit (NaN ignored)
    float sum;      // finite: sum of exp(scaled_logit(x, max, t)), >= 1
};

#define ROW_STATS_FINITE 0
#define ROW_STATS_ONE_HOT 1
#define ROW_STATS_POS_INF 2
#define ROW_STATS_ALL_NEG_INF 3

template <class E, int BLOCK>
__device__ RowStats block_row_stats(const typename E::raw* __restrict__ row, u32 vocab, bool vec, float t) {
    __shared__ float smax[BLOCK / 32];
    __shared__ u32 scount[BLOCK / 32];
    __shared__ float ssum[BLOCK / 32];
    RowStats st;
    st.arg = 0;
    st.inf_count = 0;
    st.max = -SPECULA_INF;
    st.sum = 0.0f;
    if (t == 0.0f) {
        st.kind = ROW_STATS_ONE_HOT;
        st.arg = block_row_argmax<E, BLOCK>(row, vocab, vec);
        return st;
    }
    float m = -SPECULA_INF;
    u32 c = 0;
    for_row_elements<E, BLOCK>(row, vocab, vec, [&](u32, float x) {
        m = fmaxf(m, x);  // fmaxf ignores a NaN operand: NaN counts as -inf
        c += x == SPECULA_INF ? 1u : 0u;
    });
    m = block_reduce<BLOCK>(m, smax, -SPECULA_INF, FMaxOp());
    c = block_reduce<BLOCK>(c, scount, 0u, SumOp());
    st.max = m;
    st.inf_count = c;
    if (m == SPECULA_INF) {
        st.kind = ROW_STATS_POS_INF;
        return st;
    }
    if (m == -SPECULA_INF) {
        st.kind = ROW_STATS_ALL_NEG_INF;
        return st;
    }
    float sum = 0.0f;
    for_row_elements<E, BLOCK>(row, vocab, vec, [&](u32, float x) { sum += expf(scaled_logit(x, m, t)); });
    sum = block_reduce<BLOCK>(sum, ssum, 0.0f, SumOp());
    st.kind = ROW_STATS_FINITE;
    st.sum = sum;
    return st;
}

// ---------------------------------------------------------------------------------------------
// Batch layout (`docs/semantics.md` §2), read from untrusted device buffers: every index is range-checked.

// 0 (empty), 1 (prefill) or min(this_time, S) (decode).
__device__ __forceinline__ u64 slot_output_rows(i32 this_time, i32 encoder, u64 max_step_tokens) {
    if (this_time <= 0) return 0;
    if (encoder > 0) return 1;
    return (u64)this_time < max_step_tokens ? (u64)this_time : max_step_tokens;
}

// Resolves output row t: b = batch_id[t] must be a described slot and pos = t - cu_out[b] one of
// its output rows. Returns false for padding.
__device__ __forceinline__ bool row_source(const i32* batch_id, const i32* cu_out, const i32* this_time,
                                           const i32* encoder, u32 real_bsz, u64 max_step_tokens, u64 t,
                                           u32& slot, u64& pos) {
    const i32 b = batch_id[t];
    if (b < 0 || (u32)b >= real_bsz) return false;
    const i64 p = (i64)t - (i64)cu_out[b];
    if (p < 0) return false;
    if ((u64)p >= slot_output_rows(this_time[b], encoder[b], max_step_tokens)) return false;
    slot = (u32)b;
    pos = (u64)p;
    return true;
}
