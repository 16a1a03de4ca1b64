// What the kernels of sharded rows share (`docs/semantics.md` §4d, §5.13-§5.17); prepended after
// common.cuh to the files of the shard_* ops only.
//
// A rank holds the [rows, len] slice [first, first + len) of every row. A token is ranked by its
// key, the u64 (ord(value) << 20) | (2^20 - 1 - id) of its global id (a larger key comes first;
// keys are distinct within a row), and weighed as a token of the whole row from the row key (the
// largest key of the whole row in rank order: its maximum and its first token) exactly as
// `backend_api::shard::SliceWeigher` does: §4 for probabilities, §4b for logits (common.cuh's
// logits_weigh from the rank key of the row maximum), min_p against the row's largest weight.
// One block of SHARD_BLOCK threads per row.

#define SHARD_BLOCK SPECULA_ROW_BLOCK
#define SHARD_ID_MASK ((1ull << SPECULA_SHARD_KEY_ID_BITS) - 1ull)
#define SHARD_ORDER_RANK 0u    // KeyOrder::Rank: the sampling ops' order
#define SHARD_ORDER_ARGMAX 1u  // KeyOrder::Argmax: the raw value, NaN one below -inf
#define SHARD_ARGMAX_NAN_ORD 0x007ffffeu
#define SHARD_NO_KEY 0ull

// ---- keys ----------------------------------------------------------------------------------------

// The order-preserving ordinal of f32 bits: NaN as -inf, -0 as +0.
__device__ __forceinline__ u32 shard_value_ord(u32 b) {
    if ((b & 0x7fffffffu) > SPECULA_POS_INF_BITS) b = SPECULA_NEG_INF_BITS;
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The ordinal of a score in `order`: rank order takes a probability's sanitized value or a logit
// itself; argmax order the raw value with NaN below -inf.
__device__ __forceinline__ u32 shard_score_ord(u32 order, bool logits, float x) {
    const u32 b = __float_as_uint(x);
    if (order == SHARD_ORDER_ARGMAX) {
        return (b & 0x7fffffffu) > SPECULA_POS_INF_BITS ? SHARD_ARGMAX_NAN_ORD : shard_value_ord(b);
    }
    if (logits) return shard_value_ord(b);
    return rank_key(x) | 0x80000000u;
}

// The key of global token `id` whose score is x, in `order`.
__device__ __forceinline__ u64 shard_token_key(u32 order, bool logits, float x, u32 id) {
    const u64 ord = shard_score_ord(order, logits, x);
    return (ord << SPECULA_SHARD_KEY_ID_BITS) | (SHARD_ID_MASK - ((u64)id & SHARD_ID_MASK));
}

// The global id a key names.
__device__ __forceinline__ u32 shard_key_id(u64 key) { return (u32)(SHARD_ID_MASK - (key & SHARD_ID_MASK)); }

// The value a rank key carries (-inf for the key 0 of no token).
__device__ __forceinline__ float shard_key_value(u64 key) {
    if (key == SHARD_NO_KEY) return __uint_as_float(SPECULA_NEG_INF_BITS);
    const u32 ord = (u32)(key >> SPECULA_SHARD_KEY_ID_BITS);
    return __uint_as_float((ord >> 31) != 0 ? (ord & 0x7fffffffu) : ~ord);
}

// ---- weights of a slice's tokens as tokens of the whole row ---------------------------------------

struct SliceWeigh {
    u128 floor;    // min_p on: MINP · w_max; a token with w · 2^24 below it weighs 0
    Weigh w;       // logits: how the whole row weighs; probabilities: by key
    u32 only;      // logits at T == 0 (WEIGH_ARGMAX): the one token that weighs, the row key's
    u32 min_p_on;
};

// The weighing of a row whose row key is `row_key`: a logits row at (device) temperature t, or a
// probability row; min_p is its device min_p (0, negative or NaN: off; above 1 counts as 1).
__device__ __forceinline__ SliceWeigh slice_weigh(bool logits, u64 row_key, float t, float min_p) {
    SliceWeigh s;
    u64 w_max = 0;
    if (logits) {
        const u32 max_key =
            row_key == SHARD_NO_KEY ? SPECULA_NEG_INF_LOGIT_KEY : logit_rank_key(shard_key_value(row_key));
        s.w = logits_weigh(max_key, 0, t);
        if (s.w.kind != WEIGH_ZERO) w_max = 1ull << SPECULA_WEIGHT_BITS;
    } else {
        s.w = weigh_by_key();
        if (row_key != SHARD_NO_KEY) w_max = prob_weight(shard_key_value(row_key));
    }
    s.only = shard_key_id(row_key);
    s.min_p_on = min_p > 0.0f ? 1u : 0u;
    s.floor = mul_64x64(s.min_p_on != 0 ? top_p_fixed(min_p) : 0ull, w_max);
    return s;
}

// The weight of global token `id` whose score is x.
__device__ __forceinline__ u64 slice_weight(const SliceWeigh& s, bool logits, float x, u32 id) {
    u64 w;
    if (!logits) {
        w = prob_weight(x);
    } else if (s.w.kind == WEIGH_ARGMAX) {
        w = id == s.only ? (1ull << SPECULA_WEIGHT_BITS) : 0ull;
    } else {
        w = logit_key_weight(s.w, logit_rank_key(x));
    }
    if (s.min_p_on != 0 && u128_lt(u128_make(w >> (64 - SPECULA_TOP_P_BITS), w << SPECULA_TOP_P_BITS), s.floor)) {
        return 0;
    }
    return w;
}

// ---- REJECTION's residual -----------------------------------------------------------------------

__device__ __forceinline__ u32 shard_bit_length(u64 x) { return 64u - (u32)__clzll((long long)x); }

// The shift k of the residual: 41 for probability rows, max(0, bitlength(Wp) + bitlength(Wq) - 60)
// for logits rows.
__device__ __forceinline__ u32 residual_shift(bool logits, u64 target_mass, u64 draft_mass) {
    if (!logits) return SPECULA_WEIGHT_BITS + 1;
    const u32 bits = shard_bit_length(target_mass) + shard_bit_length(draft_mass);
    return bits > 60 ? bits - 60 : 0;
}

// floor(max(0, wp · Wq - wq · Wp) / 2^shift), exact, saturating at 2^64 - 1 (shift <= 68).
__device__ __forceinline__ u64 residual_weight(u64 wp, u64 wq, u64 target_mass, u64 draft_mass, u32 shift) {
    const u128 plus = mul_64x64(wp, draft_mass), minus = mul_64x64(wq, target_mass);
    if (!u128_lt(minus, plus)) return 0;
    const u128 d = u128_sub(plus, minus);
    if (shift >= 64) return shift >= 128 ? 0 : d.hi >> (shift - 64);
    const u64 hi = shift == 0 ? d.hi : d.hi >> shift;
    if (hi != 0) return ~0ull;
    return shift == 0 ? d.lo : u128_shr_lo(d, shift);
}

// a + b, saturating at 2^64 - 1.
__device__ __forceinline__ u64 add_sat_u64(u64 a, u64 b) {
    const u64 s = a + b;
    return s < a ? ~0ull : s;
}

// This thread's contiguous part [*lo, *hi) of n elements (ascending in thread order).
__device__ __forceinline__ void shard_thread_part(u32 n, u32* lo, u32* hi) {
    const u32 per = (n + SHARD_BLOCK - 1) / SHARD_BLOCK;
    const u64 b = (u64)threadIdx.x * per;
    *lo = b < n ? (u32)b : n;
    *hi = b + per < n ? (u32)(b + per) : n;
}
