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
// Exact 128-bit helpers (contract §3: "C · 2^24 ≥ P · W" and the REJECTION tests need up to 113
// bits). Built on __umul64hi so they do not depend on compiler support for __int128.

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

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and the draw of a token seed for a purpose (contract §2).

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
// Fixed-point weights, rank keys and top-p (contract §3).

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

// (x - m) / t with NaN read as -inf: the scaled logit of contract §4.9 in a row whose maximum
// logit is the finite m. Subtract first, then divide (f32), so nothing overflows and a tiny t
// tends to the one-hot of t = 0; at t = +inf a -inf logit gives NaN, hence -inf too.
__device__ __forceinline__ float scaled_logit(float x, float m, float t) {
    const float y = (x - m) / t;
    return isnan(y) ? -SPECULA_INF : y;
}

// What a row's softmax needs (contract §4.9).
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
// Batch layout (contract §1), read from untrusted device buffers: every index is range-checked.

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
