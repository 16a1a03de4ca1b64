// common.cl: shared by every xpu-sim kernel. Prepended to each op's source before the build.
//
// Injected with -D by the host (backend_api::abi, never re-typed here): PHILOX_M0, PHILOX_M1,
// PHILOX_W0, PHILOX_W1, PHILOX_ROUNDS, MAX_INFER_SEED, SEED_STRIDE, WEIGHT_BITS, TOP_P_BITS,
// REJECTION_MAX_TOTAL_WEIGHT, MAX_CANDIDATES, MAX_LOGPROBS_TOP_K; the logits constants of
// backend_api::logit_weights (LOG2E_Q63, GAP_FRACTION_BITS, GAP_LIMIT, EXP2_COEFFICIENTS) and the
// bounds of its sanitize_logit (LOGIT_TINY_BITS, LOGIT_HUGE_BITS); the launch shape CORES
// (work-items per work-group = cores per cluster) and TILE (elements one core stages into its local
// tile at a time); the float storage formats T_DTYPE / D_DTYPE (0 f32, 1 f16, 2 bf16); LOGITS (1:
// the sampling ops' rows are logits weighed by §4b, 0: probabilities).
//
// XPU style: a launch is clusters x cores. A cluster (work-group) owns a row (or a slot) at a time,
// walking rows cluster-stride; each core owns one contiguous slice of the row, copies it from global
// memory into its own slice of local memory TILE elements at a time (the GM->LM copy of an XPU core)
// and computes partial results; core 0 then merges the partials of all cores (the second stage) and
// broadcasts the result through local memory. Every merge is exact integer arithmetic or a fixed-order
// float sum, so no exact output depends on CORES or on the number of clusters.
//
// PoCL builds a work-group function by duplicating the code that follows a barrier reached under a
// branch, so the row primitives are called unconditionally (their results selected afterwards):
// the kernels are straight-line sequences of barrier phases inside uniform loops.
//
// Floats are never trusted as floats for decisions: f32/f16/bf16 are widened to f32 *bit patterns*
// with integer code (no fp16 arithmetic, no denormal flushing), and every comparison that decides a
// token is made on integer keys.

#ifndef CORES
#error "CORES must be defined by the host"
#endif
#ifndef TILE
#define TILE 32
#endif
#ifndef T_DTYPE
#define T_DTYPE 0
#endif
#ifndef D_DTYPE
#define D_DTYPE 0
#endif
#ifndef LOGITS
#define LOGITS 0
#endif

// The one float operation an exact output depends on (the gap of §4b step 4) is a single
// f32 subtraction: it must stay one IEEE operation rounded to nearest even. No fast-math option is
// passed, and nothing may be contracted into it.
#pragma OPENCL FP_CONTRACT OFF

#define LID ((uint)get_local_id(0))
#define GRP ((uint)get_group_id(0))
#define NGRP ((uint)get_num_groups(0))

// The ways a kernel deals work, as loop heads:
// rows (or slots) to clusters, cluster-stride: the cluster owns rows GRP, GRP + NGRP, ...
#define FOR_CLUSTER_ROWS(r, n) for (uint r = GRP; r < (n); r += NGRP)
// the items of one row to the cores of the cluster, core-stride
#define FOR_CORE_ITEMS(i, n) for (uint i = LID; i < (n); i += CORES)
// one item per core across every cluster (global-stride)
#define FOR_EVERY_CORE(i, n) for (uint i = GRP * CORES + LID; i < (n); i += NGRP * CORES)

// The head of a kernel over the rows of a [rows, vocab] matrix (`args.rows`, `args.vocab` of its
// argument struct): declares `rows`, the row length `V` and the cluster's scratch `S` (kernel scope).
#define MATRIX_ROWS(args)                            \
    const uint rows = (args).rows, V = (args).vocab; \
    __local Scratch S[1]

// Kernel parameters: each buffer is a positional pointer argument and the element offset of its
// window (BUF), then one struct passed by value as the last argument, always named `args`: `const
// struct <Op>Args args`, the op's scalars. The host writes the struct into the program (after this
// file, before the op's file) from the Rust `kernel_args!` struct of the same name: its 64-bit
// fields as ulong, its 32-bit ones as uint, in the same order (64-bit first, then 32-bit in pairs,
// so neither side pads).
#define BUF(T, name) __global T* name##_b, const ulong name##_offset
// BIND(T, a, b, ..): the window of each named buffer parameter, `__global T* a = a_b +
// a_offset;` and so on, for one to six buffers of one element type.
#define BIND_1(T, a) __global T* a = a##_b + a##_offset
#define BIND_2(T, a, b) BIND_1(T, a); BIND_1(T, b)
#define BIND_3(T, a, b, c) BIND_2(T, a, b); BIND_1(T, c)
#define BIND_4(T, a, b, c, d) BIND_2(T, a, b); BIND_2(T, c, d)
#define BIND_5(T, a, b, c, d, e) BIND_4(T, a, b, c, d); BIND_1(T, e)
#define BIND_6(T, a, b, c, d, e, f) BIND_4(T, a, b, c, d); BIND_2(T, e, f)
#define BIND_PICK(_1, _2, _3, _4, _5, _6, bind, ...) bind
#define BIND(T, ...) \
    BIND_PICK(__VA_ARGS__, BIND_6, BIND_5, BIND_4, BIND_3, BIND_2, BIND_1, -)(T, __VA_ARGS__)

// The most members gather_sorted orders: C of top_p_candidates, K of accept_logprobs (K <= C).
#define SEL_MAX MAX_CANDIDATES
#define ONE_KEY 0x3f800000u
#define NEG_INF_BITS 0xff800000u
#define POS_INF_BITS 0x7f800000u

// Output rows of a slot: 0 when it feeds nothing, 1 for a prefill slot, min(this_time, S) for a
// decode slot.
inline uint slot_output_rows(int this_time, int encoder, uint s) {
    if (this_time <= 0) return 0u;
    if (encoder > 0) return 1u;
    return min((uint)this_time, s);
}

// ---- f16 / bf16 as storage formats -------------------------------------------------------------

// The f32 bit pattern of an f16 value, exactly (integer code: no fp16 arithmetic exists on the device).
inline uint f16_bits_to_f32_bits(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint exp = (h >> 10) & 0x1fu;
    uint man = h & 0x3ffu;
    if (exp == 0x1fu) return sign | 0x7f800000u | (man << 13);
    if (exp == 0u) {
        if (man == 0u) return sign;
        uint p = 31u - clz(man);          // top set bit, 0..9: value = 1.f * 2^(p - 24)
        uint mant = (man << (23u - p)) & 0x7fffffu;
        return sign | ((p + 103u) << 23) | mant;
    }
    return sign | ((exp + 112u) << 23) | (man << 13);
}

#if T_DTYPE == 0
#define T_STORE uint
#define LOAD_T(p, i) ((p)[i])
#elif T_DTYPE == 1
#define T_STORE ushort
#define LOAD_T(p, i) f16_bits_to_f32_bits((uint)(p)[i])
#else
#define T_STORE ushort
#define LOAD_T(p, i) (((uint)(p)[i]) << 16)
#endif

#if D_DTYPE == 0
#define D_STORE uint
#define LOAD_D(p, i) ((p)[i])
#elif D_DTYPE == 1
#define D_STORE ushort
#define LOAD_D(p, i) f16_bits_to_f32_bits((uint)(p)[i])
#else
#define D_STORE ushort
#define LOAD_D(p, i) (((uint)(p)[i]) << 16)
#endif

// ---- 128-bit helpers (mul_hi on ulong) ----------------------------------------------------------

typedef struct { ulong hi; ulong lo; } u128;

inline u128 mul_64x64(ulong a, ulong b) { u128 r; r.hi = mul_hi(a, b); r.lo = a * b; return r; }
inline bool lt_128(u128 a, u128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
inline bool le_128(u128 a, u128 b) { return !lt_128(b, a); }
inline u128 sub_128(u128 a, u128 b) {
    u128 r; r.lo = a.lo - b.lo; r.hi = a.hi - b.hi - (a.lo < b.lo ? 1ul : 0ul); return r;
}
// floor(a / 2^s), known to fit in 64 bits (s < 64).
inline ulong shr_128(u128 a, uint s) { return s == 0u ? a.lo : (a.hi << (64u - s)) | (a.lo >> s); }

// Three 64-bit limbs: the REJECTION acceptance test's products reach 2^133 on logits rows.
typedef struct { ulong hi; ulong mid; ulong lo; } u192;

// a * b, in full.
inline u192 mul_128x64(u128 a, ulong b) {
    u128 l = mul_64x64(a.lo, b);
    u128 h = mul_64x64(a.hi, b);
    u192 r;
    r.lo = l.lo;
    r.mid = l.hi + h.lo;
    r.hi = h.hi + (r.mid < l.hi ? 1ul : 0ul);
    return r;
}
// a * 2^s, 0 < s < 64.
inline u192 shl_128(u128 a, uint s) {
    u192 r;
    r.hi = a.hi >> (64u - s);
    r.mid = (a.hi << s) | (a.lo >> (64u - s));
    r.lo = a.lo << s;
    return r;
}
inline bool lt_192(u192 a, u192 b) {
    if (a.hi != b.hi) return a.hi < b.hi;
    if (a.mid != b.mid) return a.mid < b.mid;
    return a.lo < b.lo;
}

// ---- Philox4x32-10 and seeds --------------------------------------------------------------------

inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int round = 0; round < PHILOX_ROUNDS; round++) {
        if (round > 0) { k.x += (uint)PHILOX_W0; k.y += (uint)PHILOX_W1; }
        uint hi0 = mul_hi((uint)PHILOX_M0, c.x), lo0 = (uint)PHILOX_M0 * c.x;
        uint hi1 = mul_hi((uint)PHILOX_M1, c.z), lo1 = (uint)PHILOX_M1 * c.z;
        c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

#define PURPOSE_SAMPLE 0u
#define PURPOSE_CANDIDATE 1u
#define PURPOSE_ACCEPT 2u
#define PURPOSE_RESIDUAL 3u

inline ulong draw64(ulong seed, uint purpose) {
    uint4 x = philox4x32_10((uint4)(purpose, 0u, 0u, 0u), (uint2)((uint)seed, (uint)(seed >> 32)));
    return (ulong)x.x | ((ulong)x.y << 32);
}

// (infer_seed + 4 j) mod MAX_INFER_SEED, with infer_seed reduced first (j is small).
inline ulong row_seed(ulong infer_seed, ulong j) {
    ulong m = (ulong)MAX_INFER_SEED;
    ulong step = (j % m) * (ulong)SEED_STRIDE % m;
    return (infer_seed % m + step) % m;
}

// ---- fixed-point weights, rank keys, top-p ------------------------------------------------------

// The bit pattern of sanitize(p): 0 for NaN and p <= 0, 1.0 for p > 1 (and +inf), else p.
inline uint rank_key(uint b) {
    if (b & 0x80000000u) return 0u;
    if (b > POS_INF_BITS) return 0u;
    if (b > ONE_KEY) return ONE_KEY;
    return b;
}

// floor(value(key) * 2^40), exact.
inline ulong key_weight(uint key) {
    uint exp = (key >> 23) & 0xffu;
    if (exp == 0u) return 0ul;
    ulong mant = (ulong)((key & 0x7fffffu) | 0x800000u);
    int shift = (int)exp - 127 - 23 + WEIGHT_BITS;
    if (shift >= 0) return mant << shift;
    if (shift > -64) return mant >> (-shift);
    return 0ul;
}

// Argmax order as an unsigned key: NaN lowest (0), -0 == +0, then the numeric order.
inline uint order_key(uint b) {
    if ((b & 0x7fffffffu) > POS_INF_BITS) return 0u;
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Rank order of accept_logprobs: NaN counts as -inf.
inline uint rank_value_key(uint b) {
    if ((b & 0x7fffffffu) > POS_INF_BITS) b = NEG_INF_BITS;
    return order_key(b);
}

// P = ceil(top_p * 2^24) for a device-side top_p (outside (0, 1] or NaN counts as 1.0).
inline ulong top_p_fixed(uint b) {
    bool usable = ((b & 0x80000000u) == 0u) && b != 0u && b <= ONE_KEY;
    if (!usable) b = ONE_KEY;
    uint exp = (b >> 23) & 0xffu;
    ulong mant;
    int e;
    if (exp == 0u) { mant = (ulong)(b & 0x7fffffu); e = -126 - 23; }
    else { mant = (ulong)((b & 0x7fffffu) | 0x800000u); e = (int)exp - 127 - 23; }
    int shift = e + TOP_P_BITS;
    if (shift >= 0) return mant << shift;
    if (shift > -64) {
        uint s = (uint)(-shift);
        return (mant + (1ul << s) - 1ul) >> s;
    }
    return 1ul;
}

// The least mass C with C * 2^24 >= P * W.
inline ulong top_p_target_mass(ulong p, ulong w) {
    u128 prod = mul_64x64(p, w);
    ulong add = (1ul << TOP_P_BITS) - 1ul;
    ulong lo = prod.lo + add;
    ulong hi = prod.hi + (lo < prod.lo ? 1ul : 0ul);
    return (hi << (64 - TOP_P_BITS)) | (lo >> TOP_P_BITS);
}

// c * 2^24 >= P * W, exact.
inline bool reaches_top_p(ulong c, ulong p, ulong w) {
    u128 lhs; lhs.hi = c >> (64 - TOP_P_BITS); lhs.lo = c << TOP_P_BITS;
    return le_128(mul_64x64(p, w), lhs);
}

inline ulong scale_draw(ulong r, ulong mass) { return mul_hi(r, mass); }

// ---- weights from logits (§4b): backend_api::logit_weights, step for step --------------

// A logit as the rules read it (step 1), on f32 bits: NaN is -inf; a finite |l| below the bound of
// sanitize_logit (LOGIT_TINY_BITS, about 2^-76) is +0; a finite |l| above 2^64 is +-2^64.
inline uint sanitize_logit(uint b) {
    uint a = b & 0x7fffffffu;
    if (a > POS_INF_BITS) return NEG_INF_BITS;
    if (a == POS_INF_BITS) return b;
    if (a < LOGIT_TINY_BITS) return 0u;
    if (a > LOGIT_HUGE_BITS) return (b & 0x80000000u) | LOGIT_HUGE_BITS;
    return b;
}

#define NEG_INF_LOGIT_KEY 0x007fffffu  // logit_rank_key(-inf), the smallest key (NaN has it too)
#define POS_INF_LOGIT_KEY 0xff800000u  // logit_rank_key(+inf), the largest

// The rank key of a logit (step 1): an order-preserving uint of the logit itself, not of its
// sanitized value (NaN as -inf, +0 and -0 one key, never 0). The rank order of a logits row is key
// descending, then id ascending, so its first token is the row's argmax.
inline uint logit_rank_key(uint b) { return rank_value_key(b); }

// The sanitized logit of a rank key: the value its weight is computed from.
inline float logit_of_key(uint key) {
    return as_float(sanitize_logit((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key));
}

// x = M * 2^E with M the integer significand (subnormals included), for finite x > 0 (f32 bits).
inline ulong significand(uint bits, int* e) {
    uint exp = (bits >> 23) & 0xffu;
    ulong mantissa = (ulong)(bits & 0x7fffffu);
    if (exp == 0u) { *e = -149; return mantissa; }
    *e = (int)exp - 150;
    return mantissa | 0x800000ul;
}

// How the tokens of a row weigh. A probability row weighs w(p) by its rank key (WEIGH_KEYS; the
// argmax and logprob selections order by key alone too); a logits row by the 3b steps, from its
// maximum and temperature.
#define WEIGH_KEYS 0u     // weights from the keys (key_weight), or none needed
#define WEIGH_ZERO 1u     // every logit -inf or NaN (step 2): every weight 0
#define WEIGH_POS_INF 2u  // some logit +inf (step 2): those weigh 2^40, the rest 0
#define WEIGH_ARGMAX 3u   // T == 0 (step 3): the first maximum weighs 2^40, the rest 0
#define WEIGH_UNIFORM 4u  // T == +inf (step 3): every finite logit weighs 2^40
#define WEIGH_SCALED 5u   // otherwise: exp2_weight(gap(m, l, c32, e)) (steps 4, 5)

typedef struct {
    ulong c32;     // SCALED: c = c32 * 2^e ~ log2(e) / T, c32 in [2^31, 2^32)
    int e;
    uint kind;
    uint max_key;  // logits: the rank key of the row maximum m
    uint first;    // ARGMAX: the first token keyed max_key, the only one that keeps that key
} Weigh;

// The weighing of probability rows and of selections by key alone.
inline Weigh by_key(void) {
    Weigh w;
    w.c32 = 0ul;
    w.e = 0;
    w.kind = WEIGH_KEYS;
    w.max_key = 0u;
    w.first = 0u;
    return w;
}

// Steps 2 and 3: the weighing of a logits row from the rank key of its maximum (0: an empty row),
// the first id holding it, and its (device) temperature, as f32 bits. The temperature counts as
// 1.0 when NaN or negative (-0 is 0); then one 64-by-24-bit division gives the scale.
inline Weigh logits_weigh(uint max_key, uint first, uint t_bits) {
    Weigh w = by_key();
    w.max_key = max_key;
    w.first = first;
    uint t = t_bits;
    bool negative = (t & 0x80000000u) != 0u && (t & 0x7fffffffu) != 0u;
    if ((t & 0x7fffffffu) > POS_INF_BITS || negative) t = ONE_KEY;
    t &= 0x7fffffffu;
    if (max_key == POS_INF_LOGIT_KEY) {
        w.kind = WEIGH_POS_INF;
    } else if (max_key <= NEG_INF_LOGIT_KEY) {
        w.kind = WEIGH_ZERO;
    } else if (t == 0u) {
        w.kind = WEIGH_ARGMAX;
    } else if (t == POS_INF_BITS) {
        w.kind = WEIGH_UNIFORM;
    } else {
        int e_t;
        ulong m_t = significand(t, &e_t);
        ulong q = (ulong)LOG2E_Q63 / m_t;
        int b = 64 - (int)clz(q);
        w.kind = WEIGH_SCALED;
        w.c32 = q >> (b - 32);
        w.e = b - 95 - e_t;
    }
    return w;
}

// Step 4: the gap X = min(floor(M_D * C32 * 2^(E_D + e + F)), 40 * 2^F) of a finite sanitized logit
// l below the row maximum m, with D = m - l: one f32 subtraction rounded to nearest even (D >= 0,
// never subnormal after step 1).
inline ulong gap(float m, float l, ulong c32, int e) {
    float d = m - l;
    uint d_bits = as_uint(d);
    if ((d_bits & 0x7fffffffu) == 0u) return 0ul;
    int e_d;
    ulong product = significand(d_bits, &e_d) * c32;  // < 2^56: a shift below 8 cannot overflow
    int s = e_d + e + GAP_FRACTION_BITS;
    ulong x = 0ul;
    if (s >= 8) return (ulong)GAP_LIMIT;
    if (s >= 0) x = product << s;
    else if (s > -64) x = product >> (-s);
    return min(x, (ulong)GAP_LIMIT);
}

// The coefficients of the polynomial for 2^g, g in (0, 1], in Q30 (they sum to 2^31).
__constant ulong EXP2_A[7] = {EXP2_COEFFICIENTS};

// Step 5: the weight of gap x, 2^40 * 2^(-x / 2^F) in integers, 0 from 40 * 2^F on. The maximum's
// P(2^F) = 2^31, so it weighs 2^31 << 9 = 2^40.
inline ulong exp2_weight(ulong x) {
    if (x >= (ulong)GAP_LIMIT) return 0ul;
    uint n = (uint)(x >> GAP_FRACTION_BITS);
    ulong g = (1ul << GAP_FRACTION_BITS) - (x & ((1ul << GAP_FRACTION_BITS) - 1ul));
    ulong p = EXP2_A[6];
    for (int k = 5; k >= 0; k--) p = EXP2_A[k] + ((p * g) >> GAP_FRACTION_BITS);
    return n <= 9u ? p << (9u - n) : p >> (n - 9u);
}

// The weight of a logit of rank key `key` in a row weighed by w (any kind but WEIGH_KEYS).
inline ulong logit_key_weight(Weigh w, uint key) {
    ulong full = 1ul << WEIGHT_BITS;
    bool finite = key != NEG_INF_LOGIT_KEY && key != POS_INF_LOGIT_KEY;
    if (w.kind == WEIGH_SCALED) {
        return finite ? exp2_weight(gap(logit_of_key(w.max_key), logit_of_key(key), w.c32, w.e)) : 0ul;
    }
    if (w.kind == WEIGH_UNIFORM) return finite ? full : 0ul;
    if (w.kind == WEIGH_POS_INF) return key == POS_INF_LOGIT_KEY ? full : 0ul;
    if (w.kind == WEIGH_ARGMAX) return key == w.max_key ? full : 0ul;
    return 0ul;
}

// The rank key of token `id` (f32 bits `bits`) of a logits row weighed by w. At T == 0 only the
// first maximum weighs anything: the other maxima are keyed one below it, so that every weight is a
// function of the key (the order among tokens of weight 0 decides nothing).
inline uint logit_row_key(Weigh w, uint bits, uint id) {
    uint k = logit_rank_key(bits);
    return (w.kind == WEIGH_ARGMAX && k == w.max_key && id != w.first) ? k - 1u : k;
}

// ---- per-core slices, local scratch, broadcasts -------------------------------------------------

// The local memory of one cluster. A kernel declares it as `__local Scratch S[1];` (kernel scope,
// or through MATRIX_ROWS) and hands S to the primitives below.
typedef struct {
    uint hist_count[256];
    uint hist_lo[256];
    uint hist_hi[256];
    ulong part_mass[CORES];
    uint part_count[CORES];
    uint part_eq[CORES];
    uint part_key[CORES];
    uint part_id[CORES];
    float part_f[CORES];
    float part_c[CORES];
    ulong bc_u64[4];
    uint bc_u32[8];
    float bc_f[4];
    uint tiles[CORES * TILE];
    uint sel_key[SEL_MAX];
    uint sel_id[SEL_MAX];
    uint sorted_key[SEL_MAX];
    uint sorted_id[SEL_MAX];
} Scratch;

// This core's contiguous slice [*lo, *hi) of n elements.
inline void core_slice(uint n, uint* lo, uint* hi) {
    uint per = (n + CORES - 1u) / CORES;
    uint a = min(n, LID * per);
    *lo = a;
    *hi = min(n, a + per);
}

#define KEY_RANK 0u
#define KEY_ORDER 1u

// The key of token `id` (f32 bits `bits`) of a row weighed by w: its rank key (KEY_RANK: the
// sanitized probability, or the rank key of the logit) or its argmax order key (KEY_ORDER).
inline uint row_key(Weigh w, uint mode, uint bits, uint id) {
    if (mode == KEY_ORDER) return order_key(bits);
#if LOGITS
    return logit_row_key(w, bits, id);
#else
    return rank_key(bits);
#endif
}

// The weight of a token of rank key `key` in a row weighed by w.
inline ulong weight_of(Weigh w, uint key) {
#if LOGITS
    return logit_key_weight(w, key);
#else
    return key_weight(key);
#endif
}

// Walks this core's slice [lo, hi) of `row` (weighed by w) a tile at a time: the keys of TILE
// elements are staged into the core's own part of local memory, then BODY runs for each (key, id)
// of the tile.
#define FOR_STAGED_KEYS(row, lo, hi, mode, w, key, id, ...)                                       \
    for (uint t0_ = (lo); t0_ < (hi); t0_ += TILE) {                                               \
        uint n_ = min((uint)TILE, (hi) - t0_);                                                     \
        __local uint* tile_ = S->tiles + LID * TILE;                                               \
        for (uint j_ = 0; j_ < n_; j_++)                                                           \
            tile_[j_] = row_key((w), (mode), LOAD_T((row), t0_ + j_), t0_ + j_);                    \
        for (uint j_ = 0; j_ < n_; j_++) {                                                         \
            uint key = tile_[j_];                                                                  \
            uint id = t0_ + j_;                                                                    \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }

// Adds a 64-bit weight to a histogram bin kept as two 32-bit words (32-bit local atomics only; the
// carries are counted, so the total is exact whatever the order of the adds).
inline void bin_add_mass(volatile __local uint* lo, volatile __local uint* hi, ulong w) {
    uint wl = (uint)w;
    uint wh = (uint)(w >> 32);
    uint old = atomic_add(lo, wl);
    if (old + wl < old) wh += 1u;
    if (wh != 0u) atomic_add(hi, wh);
}

// ---- cluster collectives: core 0 merges the per-core partials in core order and broadcasts -------
// Every core of the cluster calls them (uniform control flow). They end with a barrier, so the
// scratch they use (part_*, bc_*[0]) is free again when they return.

// The head of core 0's merge of per-core partials: every core posts its partial value `va` to
// S->PA[LID] (and `vb` to S->PB[LID]) and waits for the cluster; the statement or block that follows
// runs on core 0 alone, which reads the partials S->PA[c] (S->PB[c]) in core order.
#define CORE0_MERGES_1(S, PA, va) \
    (S)->PA[LID] = (va);          \
    barrier(CLK_LOCAL_MEM_FENCE); \
    if (LID == 0u)
#define CORE0_MERGES_2(S, PA, va, PB, vb) \
    (S)->PA[LID] = (va);                  \
    (S)->PB[LID] = (vb);                  \
    barrier(CLK_LOCAL_MEM_FENCE);         \
    if (LID == 0u)

// Declares `inline ulong NAME(ulong v, __local Scratch* S, ulong* total)`: the ADD-sum (a binary
// function or macro) of the `v` of the cores before this one, an exclusive scan in core order;
// *total gets the ADD-sum over every core.
#define CLUSTER_SCAN(NAME, ADD)                                                                    \
    inline ulong NAME(ulong v, __local Scratch* S, ulong* total) {                                 \
        CORE0_MERGES_1(S, part_mass, v) {                                                          \
            ulong before = 0ul;                                                                    \
            for (uint c = 0; c < CORES; c++) {                                                     \
                ulong x = S->part_mass[c];                                                         \
                S->part_mass[c] = before;                                                          \
                before = ADD(before, x);                                                           \
            }                                                                                      \
            S->bc_u64[0] = before;                                                                 \
        }                                                                                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                              \
        ulong mine = S->part_mass[LID];                                                            \
        *total = S->bc_u64[0];                                                                     \
        barrier(CLK_LOCAL_MEM_FENCE);                                                              \
        return mine;                                                                               \
    }

// Declares `inline TYPE NAME(TYPE v, __local Scratch* S)`: every core's `v` folded by FOLD (a
// binary function such as min or max) from INIT in core order, through the per-core scratch
// S->PART and the broadcast word S->BC[0].
#define CLUSTER_FOLD(TYPE, NAME, PART, BC, INIT, FOLD)                                             \
    inline TYPE NAME(TYPE v, __local Scratch* S) {                                                 \
        CORE0_MERGES_1(S, PART, v) {                                                               \
            TYPE m = INIT;                                                                         \
            for (uint c = 0; c < CORES; c++) m = FOLD(m, S->PART[c]);                              \
            S->BC[0] = m;                                                                          \
        }                                                                                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                              \
        TYPE r = S->BC[0];                                                                         \
        barrier(CLK_LOCAL_MEM_FENCE);                                                              \
        return r;                                                                                  \
    }

#define PLAIN_ADD(a, b) ((a) + (b))

// The sum of the `v` of the cores before this one (an exclusive scan in core order); *total gets
// the sum over every core.
CLUSTER_SCAN(cluster_scan, PLAIN_ADD)

// The sum of every core's `v` (the total of `cluster_scan`, summed in the same core order).
inline ulong cluster_sum(ulong v, __local Scratch* S) {
    ulong total;
    cluster_scan(v, S, &total);
    return total;
}

// The smallest of every core's `v`.
CLUSTER_FOLD(uint, cluster_min, part_id, bc_u32, 0xffffffffu, min)

typedef struct {
    uint key;
    uint id;
} KeyId;

// The largest of every core's `key` and the `id` of the first core holding it (key and id 0 when
// every key is 0): with contiguous slices in core order, the lowest id among the largest keys of
// the row.
inline KeyId cluster_max(uint key, uint id, __local Scratch* S) {
    CORE0_MERGES_2(S, part_key, key, part_id, id) {
        uint bk = 0u, bi = 0u;
        for (uint c = 0; c < CORES; c++) {
            if (S->part_key[c] > bk) { bk = S->part_key[c]; bi = S->part_id[c]; }
        }
        S->bc_u32[0] = bi;
        S->bc_u32[1] = bk;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    KeyId r;
    r.id = S->bc_u32[0];
    r.key = S->bc_u32[1];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// The `id` of cluster_max.
inline uint cluster_best(uint key, uint id, __local Scratch* S) { return cluster_max(key, id, S).id; }

// ---- weighing a row -----------------------------------------------------------------------------

// The weighing of a logits row whose cores found their largest rank key `best_key` (0 if none)
// first at `best_id`: the row maximum as a cluster collective (steps 1 and 2), then the scale of the
// row's temperature t_bits (step 3).
inline Weigh weigh_logits_row(uint best_key, uint best_id, uint t_bits, __local Scratch* S) {
    KeyId m = cluster_max(best_key, best_id, S);
    return logits_weigh(m.key, m.id, t_bits);
}

// How the tokens of `row` weigh: by key for probability rows; for logits rows, from the row
// maximum and the temperature t_bits (f32 bits).
inline Weigh row_weigh(__global const T_STORE* row, uint V, __local Scratch* S, uint t_bits) {
#if LOGITS
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint best_key = 0u, best_id = 0u;
    FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, by_key(), key, id, {
        if (key > best_key) { best_key = key; best_id = id; }
    })
    return weigh_logits_row(best_key, best_id, t_bits, S);
#else
    return by_key();
#endif
}

// The temperature of row r as f32 bits (1.0 for probability rows, which have none).
#if LOGITS
#define ROW_TEMPERATURE(temperature, r) ((temperature)[r])
#else
#define ROW_TEMPERATURE(temperature, r) ONE_KEY
#endif

// ---- row primitives (every core of the cluster calls them with the same arguments) --------------

typedef struct {
    ulong mass;   // total weight of the row
    uint valid;   // tokens with a nonzero weight
    uint first;   // the first token in rank order (largest key, lowest id)
} RowStats;

inline RowStats row_stats(__global const T_STORE* row, uint V, __local Scratch* S, Weigh w) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    ulong mass = 0ul;
    uint valid = 0u, best_key = 0u, best_id = 0u;
    FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, w, key, id, {
        ulong weight = weight_of(w, key);
        mass += weight;
        valid += weight != 0ul ? 1u : 0u;
        if (key > best_key) { best_key = key; best_id = id; }
    })
    RowStats r;
    r.mass = cluster_sum(mass, S);
    r.valid = (uint)cluster_sum((ulong)valid, S);
    r.first = cluster_best(best_key, best_id, S);
    return r;
}

// A prefix of a row in key order: every token with a key above `key`, plus the first `take` tokens
// (by id) whose key equals it.
typedef struct {
    uint key;
    uint take;
    uint count;
    ulong mass;
} Prefix;

#define METRIC_COUNT 0u
#define METRIC_MASS 1u

// The shortest prefix (keys descending, ids ascending) whose count or mass reaches `target`
// (1 <= target <= the row's total): a radix selection of the threshold key, 8 bits per pass, with
// cluster-wide histograms; no pass orders anything.
inline Prefix select_prefix(__global const T_STORE* row, uint V, __local Scratch* S, uint mode,
                            Weigh w, uint metric, ulong target, bool want_mass) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint prefix = 0u, mask = 0u;
    ulong c_above = 0ul, m_above = 0ul;
    for (int shift = 24; shift >= 0; shift -= 8) {
        FOR_CORE_ITEMS(i, 256u) {
            S->hist_count[i] = 0u; S->hist_lo[i] = 0u; S->hist_hi[i] = 0u;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        FOR_STAGED_KEYS(row, lo, hi, mode, w, key, id, {
            if ((key & mask) == prefix) {
                uint bin = (key >> shift) & 255u;
                atomic_inc(&S->hist_count[bin]);
                if (want_mass) bin_add_mass(&S->hist_lo[bin], &S->hist_hi[bin], weight_of(w, key));
            }
        })
        barrier(CLK_LOCAL_MEM_FENCE);
        if (LID == 0u) {
            uint digit = 0u;
            ulong c = c_above, m = m_above;
            for (int bin = 255; bin >= 0; bin--) {
                ulong bc = (ulong)S->hist_count[bin];
                ulong bm = ((ulong)S->hist_hi[bin] << 32) | (ulong)S->hist_lo[bin];
                bool reached = metric == METRIC_COUNT ? (c + bc >= target) : (m + bm >= target);
                if (reached && bc > 0ul) { digit = (uint)bin; break; }
                c += bc;
                m += bm;
            }
            S->bc_u32[0] = digit;
            S->bc_u64[0] = c;
            S->bc_u64[1] = m;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        uint digit = S->bc_u32[0];
        c_above = S->bc_u64[0];
        m_above = S->bc_u64[1];
        barrier(CLK_LOCAL_MEM_FENCE);
        prefix |= digit << shift;
        mask |= 255u << shift;
    }
    Prefix p;
    p.key = prefix;
    ulong wk = mode == KEY_RANK ? weight_of(w, prefix) : 0ul;  // every token keyed `prefix` weighs wk
    ulong take;
    if (metric == METRIC_COUNT) {
        take = target > c_above ? target - c_above : 0ul;
    } else {
        ulong need = target > m_above ? target - m_above : 0ul;
        take = wk == 0ul ? 0ul : (need + wk - 1ul) / wk;
    }
    p.take = (uint)take;
    p.count = (uint)(c_above + take);
    p.mass = m_above + take * wk;
    return p;
}

// Per-core counts of the tokens of [lo, hi) keyed above p.key and equal to it; core 0 scans them.
// Leaves in part_eq[c] the number of p.key tokens before core c's slice, in part_count[c] the
// members of the prefix before core c's slice; returns the prefix's member count.
inline void prefix_scan_counts(__global const T_STORE* row, uint V, __local Scratch* S, uint mode,
                               Weigh w, Prefix p, uint limit) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    hi = min(hi, limit);
    lo = min(lo, hi);
    uint gt = 0u, eq = 0u;
    FOR_STAGED_KEYS(row, lo, hi, mode, w, key, id, {
        gt += key > p.key ? 1u : 0u;
        eq += key == p.key ? 1u : 0u;
    })
    CORE0_MERGES_2(S, part_count, gt, part_eq, eq) {
        uint eq_before = 0u, members_before = 0u;
        for (uint c = 0; c < CORES; c++) {
            uint g = S->part_count[c], e = S->part_eq[c];
            uint taken = eq_before >= p.take ? 0u : min(e, p.take - eq_before);
            S->part_count[c] = members_before;
            S->part_eq[c] = eq_before;
            members_before += g + taken;
            eq_before += e;
        }
        S->bc_u32[0] = members_before;
        S->bc_u32[1] = eq_before;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

// The weight of token d within prefix p of a row weighed by w (0 for non-members).
inline ulong weight_in_prefix(__global const T_STORE* row, uint V, __local Scratch* S, Weigh w,
                              Prefix p, uint d) {
    prefix_scan_counts(row, V, S, KEY_RANK, w, p, d);
    uint eq_before_d = S->bc_u32[1];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (d >= V) return 0ul;
    uint key = row_key(w, KEY_RANK, LOAD_T(row, d), d);
    if (key > p.key) return weight_of(w, key);
    if (key < p.key) return 0ul;
    return eq_before_d < p.take ? weight_of(w, key) : 0ul;
}

// What prefix_draw weighs its members by: their own weights, or (on) the REJECTION residual
// against draft row q (weighed by w, total wq_total) with the target's kept mass wp_total, scaled
// down by 2^shift.
typedef struct {
    __global const D_STORE* q;
    Weigh w;
    ulong wq_total;
    ulong wp_total;
    uint shift;
    uint on;
} Residual;

// The weighing by the members' own weights.
inline Residual no_residual(void) {
    Residual rs;
    rs.q = (__global const D_STORE*)0;
    rs.w = by_key();
    rs.wq_total = 0ul;
    rs.wp_total = 0ul;
    rs.shift = 0u;
    rs.on = 0u;
    return rs;
}

// The weight of kept target token `id` of weight wp in the draw: wp itself, or its residual
// floor(max(0, wp * Wq - wq * Wp) / 2^shift).
inline ulong member_weight(ulong wp, uint id, Residual rs) {
    if (rs.on == 0u) return wp;
    ulong wq = weight_of(rs.w, row_key(rs.w, KEY_RANK, LOAD_D(rs.q, id), id));
    u128 a = mul_64x64(wp, rs.wq_total);
    u128 b = mul_64x64(wq, rs.wp_total);
    if (le_128(a, b)) return 0ul;
    return shr_128(sub_128(a, b), rs.shift);
}

// Draws within the members of prefix p of a row weighed by w: the member, in ascending id order,
// whose running weight first exceeds floor(r * M / 2^64), M the members' total weight. Weights are
// the members' own, or the REJECTION residual (member_weight). Returns -2 when M == 0, -1 if
// nothing was found.
inline int prefix_draw(__global const T_STORE* row, uint V, __local Scratch* S, Weigh w, Prefix p,
                       ulong r, Residual rs) {
    prefix_scan_counts(row, V, S, KEY_RANK, w, p, V);
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint eq_idx = S->part_eq[LID];
    barrier(CLK_LOCAL_MEM_FENCE);
    ulong mass = 0ul;
    FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, w, key, id, {
        bool member = key > p.key;
        if (key == p.key) { member = eq_idx < p.take; eq_idx++; }
        if (member) mass += member_weight(weight_of(w, key), id, rs);
    })
    // bc_u32[2]: the id found by the one core whose range holds the draw (the scan's barriers order
    // this reset before it).
    if (LID == 0u) S->bc_u32[2] = 0xffffffffu;
    ulong total;
    ulong start = cluster_scan(mass, S, &total);
    int result = -2;
    if (total != 0ul) {
        ulong t = scale_draw(r, total);
        if (start <= t && t < start + mass) {
            ulong cum = start;
            uint eq2 = S->part_eq[LID];
            bool found = false;
            FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, w, key, id, {
                bool member = key > p.key;
                if (key == p.key) { member = eq2 < p.take; eq2++; }
                if (member && !found) {
                    cum += member_weight(weight_of(w, key), id, rs);
                    if (cum > t) { found = true; S->bc_u32[2] = id; }
                }
            })
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (total != 0ul) {
        uint found_id = S->bc_u32[2];
        result = found_id == 0xffffffffu ? -1 : (int)found_id;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

// Gathers the n = p.count members of prefix p (n <= SEL_MAX) into sorted_key / sorted_id in key
// order (key descending, id ascending).
inline void gather_sorted(__global const T_STORE* row, uint V, __local Scratch* S, uint mode,
                          Weigh w, Prefix p) {
    prefix_scan_counts(row, V, S, mode, w, p, V);
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint at = S->part_count[LID];
    uint eq_idx = S->part_eq[LID];
    uint n = min(S->bc_u32[0], (uint)SEL_MAX);
    barrier(CLK_LOCAL_MEM_FENCE);
    FOR_STAGED_KEYS(row, lo, hi, mode, w, key, id, {
        bool member = key > p.key;
        if (key == p.key) { member = eq_idx < p.take; eq_idx++; }
        if (member && at < SEL_MAX) { S->sel_key[at] = key; S->sel_id[at] = id; at++; }
    })
    barrier(CLK_LOCAL_MEM_FENCE);
    // The members arrived in id order; a member's place is the number of members ranking before it.
    FOR_CORE_ITEMS(i, n) {
        uint ki = S->sel_key[i];
        uint pos = 0u;
        for (uint j = 0; j < n; j++) {
            uint kj = S->sel_key[j];
            pos += (kj > ki || (kj == ki && j < i)) ? 1u : 0u;
        }
        S->sorted_key[pos] = ki;
        S->sorted_id[pos] = S->sel_id[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

// top_k_top_p_sample of one row (§5.6): top-k survivors, the top-p kept set, the SAMPLE draw.
// Every row primitive is called unconditionally (their results are selected afterwards), so the
// kernel has no barrier under a branch: PoCL's work-group compiler duplicates the code after each
// conditional barrier, and uniform straight-line phases keep the build fast.
typedef struct {
    Weigh weigh;           // how the row's tokens weigh
    RowStats stats;
    ulong survivors_mass;  // W: mass of the top-k survivors (the whole row without top-k)
    Prefix kept;           // the top-p kept set (meaningless when W == 0)
} KeptSet;

inline KeptSet kept_set(__global const T_STORE* row, uint V, __local Scratch* S, Weigh w,
                        int top_k, uint top_p_bits) {
    KeptSet k;
    k.weigh = w;
    k.stats = row_stats(row, V, S, w);
    bool use_k = top_k > 0 && (uint)top_k < V;
    Prefix survivors = select_prefix(row, V, S, KEY_RANK, w, METRIC_COUNT,
                                     use_k ? (ulong)top_k : (ulong)V, true);
    k.survivors_mass = use_k ? survivors.mass : k.stats.mass;
    ulong total = k.survivors_mass;
    ulong target = total == 0ul ? 1ul : top_p_target_mass(top_p_fixed(top_p_bits), total);
    // The kept set is the shortest rank prefix of the whole row reaching the target: the survivors
    // reach it, so it lies inside them.
    k.kept = select_prefix(row, V, S, KEY_RANK, w, METRIC_MASS, target, true);
    return k;
}

// The sampled token of a row from its kept set.
inline int sample_kept(__global const T_STORE* row, uint V, __local Scratch* S, KeptSet k,
                       ulong seed) {
    int id = prefix_draw(row, V, S, k.weigh, k.kept, draw64(seed, PURPOSE_SAMPLE), no_residual());
    if (k.survivors_mass == 0ul || id < 0) return (int)k.stats.first;
    return id;
}

// top_k_top_p_sample of one row at temperature t_bits (logits rows).
inline int sample_row(__global const T_STORE* row, uint V, __local Scratch* S, uint t_bits,
                      int top_k, uint top_p_bits, ulong seed) {
    KeptSet k = kept_set(row, V, S, row_weigh(row, V, S, t_bits), top_k, top_p_bits);
    return sample_kept(row, V, S, k, seed);
}

// The argmax (order_key, lowest id) of a row.
inline uint row_argmax(__global const T_STORE* row, uint V, __local Scratch* S) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint best_key = 0u, best_id = 0u;
    FOR_STAGED_KEYS(row, lo, hi, KEY_ORDER, by_key(), key, id, {
        if (key > best_key) { best_key = key; best_id = id; }
    })
    return cluster_best(best_key, best_id, S);
}

// ---- softmax statistics (float class) -----------------------------------------------------------

#define STATS_ONE_HOT 0
#define STATS_POS_INF 1
#define STATS_ALL_NEG_INF 2
#define STATS_FINITE 3

typedef struct {
    int kind;
    uint arg;     // ONE_HOT: the argmax
    uint count;   // POS_INF: logits equal to +inf
    float max;    // FINITE: the row maximum m of the logits
    float sum;    // FINITE: the sum of exp((l - m) / t), >= 1
} SoftmaxStats;

inline float effective_temperature(float t) { return t >= 0.0f ? t : 1.0f; }

// A logit as the softmax rules read it: NaN counts as -inf.
inline float logit_value(uint bits) {
    float x = as_float(bits);
    return isnan(x) ? -INFINITY : x;
}

// The scaled logit of §5.5: (l - m) / t, the row maximum m subtracted first and the
// difference then divided by t, in f32, so nothing overflows and a tiny t tends to the one-hot of
// t = 0. At t = +inf every finite logit scales to 0 (also where l - m overflowed); NaN (a NaN
// logit) reads as -inf.
inline float scaled(uint bits, float m, float t) {
    float x = logit_value(bits);
    if (isinf(t)) return isfinite(x) ? 0.0f : -INFINITY;
    float y = (x - m) / t;
    return isnan(y) ? -INFINITY : y;
}

inline SoftmaxStats softmax_stats(__global const T_STORE* row, uint V, __local Scratch* S, float t) {
    // Every phase runs whatever the row turns out to be (no barrier under a branch).
    SoftmaxStats st;
    st.arg = row_argmax(row, V, S);
    st.count = 0u;
    st.max = 0.0f;
    st.sum = 1.0f;
    float tt = t == 0.0f ? 1.0f : t;
    uint lo, hi;
    core_slice(V, &lo, &hi);
    // The row maximum of the logits themselves (the temperature scales differences from it).
    float m = -INFINITY;
    uint inf = 0u;
    for (uint i = lo; i < hi; i++) {
        float x = logit_value(LOAD_T(row, i));
        m = fmax(m, x);
        inf += x == INFINITY ? 1u : 0u;
    }
    CORE0_MERGES_2(S, part_f, m, part_count, inf) {
        float mm = -INFINITY;
        uint ii = 0u;
        for (uint c = 0; c < CORES; c++) { mm = fmax(mm, S->part_f[c]); ii += S->part_count[c]; }
        S->bc_f[0] = mm;
        S->bc_u32[0] = ii;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    m = S->bc_f[0];
    inf = S->bc_u32[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    // Kahan-compensated partial sums per core, merged in core order (skipped when not finite).
    bool finite = m != INFINITY && m != -INFINITY;
    float sum = 0.0f, comp = 0.0f;
    for (uint i = lo; i < hi && finite; i++) {
        float v = exp(scaled(LOAD_T(row, i), m, tt)) - comp;
        float s2 = sum + v;
        comp = (s2 - sum) - v;
        sum = s2;
    }
    CORE0_MERGES_2(S, part_f, sum, part_c, comp) {
        float total = 0.0f, c2 = 0.0f;
        for (uint c = 0; c < CORES; c++) {
            float v = S->part_f[c] - (S->part_c[c] + c2);
            float s2 = total + v;
            c2 = (s2 - total) - v;
            total = s2;
        }
        S->bc_f[0] = total;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float total = S->bc_f[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t == 0.0f) st.kind = STATS_ONE_HOT;
    else if (m == INFINITY) { st.kind = STATS_POS_INF; st.count = inf; }
    else if (m == -INFINITY) st.kind = STATS_ALL_NEG_INF;
    else { st.kind = STATS_FINITE; st.max = m; st.sum = total; }
    return st;
}
