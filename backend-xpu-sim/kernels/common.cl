// common.cl: shared by every xpu-sim kernel. Prepended to each op's source before the build.
//
// Injected with -D by the host (backend_api::abi, never re-typed here): PHILOX_M0, PHILOX_M1,
// PHILOX_W0, PHILOX_W1, PHILOX_ROUNDS, MAX_INFER_SEED, SEED_STRIDE, WEIGHT_BITS, TOP_P_BITS,
// REJECTION_MAX_TOTAL_WEIGHT, MAX_CANDIDATES, MAX_LOGPROBS_TOP_K; the launch shape CORES (work-items
// per work-group = cores per cluster) and TILE (elements one core stages into its local tile at a
// time); the float storage formats T_DTYPE / D_DTYPE (0 f32, 1 f16, 2 bf16).
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

#define LID ((uint)get_local_id(0))
#define GRP ((uint)get_group_id(0))
#define NGRP ((uint)get_num_groups(0))

// Every buffer argument is (base pointer, element offset of the buffer's window).
#define BUF(T, name) __global T* name##_b, const ulong name##_o
#define BIND(T, name) __global T* name = name##_b + name##_o

// The most members gather_sorted orders: C of top_p_candidates, K of accept_logprobs (K <= C).
#define SEL_MAX MAX_CANDIDATES
#define MIN_WEIGHT_KEY 0x2b800000u
#define ONE_KEY 0x3f800000u
#define NEG_INF_BITS 0xff800000u
#define POS_INF_BITS 0x7f800000u

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
// (a * b) where the product is known to fit in 128 bits and a.hi * b fits in 64.
inline u128 mul_128x64(u128 a, ulong b) {
    u128 r = mul_64x64(a.lo, b);
    r.hi += a.hi * b;
    return r;
}
inline u128 shl_128(u128 a, uint s) { // 0 < s < 64
    u128 r; r.hi = (a.hi << s) | (a.lo >> (64u - s)); r.lo = a.lo << s; return r;
}
inline bool lt_128(u128 a, u128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
inline bool le_128(u128 a, u128 b) { return !lt_128(b, a); }
inline u128 sub_128(u128 a, u128 b) {
    u128 r; r.lo = a.lo - b.lo; r.hi = a.hi - b.hi - (a.lo < b.lo ? 1ul : 0ul); return r;
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

// ---- per-core slices, local scratch, broadcasts -------------------------------------------------

typedef struct {
    uint hist_count[256];
    uint hist_lo[256];
    uint hist_hi[256];
    ulong part_mass[CORES];
    ulong part_mass2[CORES];
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

inline uint key_of(uint mode, uint bits) { return mode == KEY_RANK ? rank_key(bits) : order_key(bits); }

// Walks this core's slice [lo, hi) of `row` a tile at a time: the keys of TILE elements are staged
// into the core's own part of local memory, then BODY runs for each (key, id) of the tile.
#define FOR_STAGED_KEYS(row, lo, hi, mode, key, id, ...)                                          \
    for (uint t0_ = (lo); t0_ < (hi); t0_ += TILE) {                                               \
        uint n_ = min((uint)TILE, (hi) - t0_);                                                     \
        __local uint* tile_ = S->tiles + LID * TILE;                                               \
        for (uint j_ = 0; j_ < n_; j_++) tile_[j_] = key_of((mode), LOAD_T((row), t0_ + j_));      \
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

// ---- row primitives (every core of the cluster calls them with the same arguments) --------------

typedef struct {
    ulong mass;   // total weight of the row
    uint valid;   // tokens with a nonzero weight
    uint first;   // the first token in rank order (largest key, lowest id)
} RowStats;

inline RowStats row_stats(__global const T_STORE* row, uint V, __local Scratch* S) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    ulong mass = 0ul;
    uint valid = 0u, best_key = 0u, best_id = 0u;
    FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, key, id, {
        mass += key_weight(key);
        valid += key >= MIN_WEIGHT_KEY ? 1u : 0u;
        if (key > best_key) { best_key = key; best_id = id; }
    })
    S->part_mass[LID] = mass;
    S->part_count[LID] = valid;
    S->part_key[LID] = best_key;
    S->part_id[LID] = best_id;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
        ulong m = 0ul;
        uint v = 0u, bk = 0u, bi = 0u;
        for (uint c = 0; c < CORES; c++) {
            m += S->part_mass[c];
            v += S->part_count[c];
            if (S->part_key[c] > bk) { bk = S->part_key[c]; bi = S->part_id[c]; }
        }
        S->bc_u64[0] = m;
        S->bc_u32[0] = v;
        S->bc_u32[1] = bi;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    RowStats r;
    r.mass = S->bc_u64[0];
    r.valid = S->bc_u32[0];
    r.first = S->bc_u32[1];
    barrier(CLK_LOCAL_MEM_FENCE);
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
                            uint metric, ulong target, bool want_mass) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint prefix = 0u, mask = 0u;
    ulong c_above = 0ul, m_above = 0ul;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint i = LID; i < 256u; i += CORES) {
            S->hist_count[i] = 0u; S->hist_lo[i] = 0u; S->hist_hi[i] = 0u;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        FOR_STAGED_KEYS(row, lo, hi, mode, key, id, {
            if ((key & mask) == prefix) {
                uint bin = (key >> shift) & 255u;
                atomic_inc(&S->hist_count[bin]);
                if (want_mass) bin_add_mass(&S->hist_lo[bin], &S->hist_hi[bin], key_weight(key));
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
    ulong w = mode == KEY_RANK ? key_weight(prefix) : 0ul;
    ulong take;
    if (metric == METRIC_COUNT) {
        take = target > c_above ? target - c_above : 0ul;
    } else {
        ulong need = target > m_above ? target - m_above : 0ul;
        take = w == 0ul ? 0ul : (need + w - 1ul) / w;
    }
    p.take = (uint)take;
    p.count = (uint)(c_above + take);
    p.mass = m_above + take * w;
    return p;
}

// Per-core counts of the tokens of [lo, hi) keyed above p.key and equal to it; core 0 scans them.
// Leaves in part_eq[c] the number of p.key tokens before core c's slice, in part_count[c] the
// members of the prefix before core c's slice; returns the prefix's member count.
inline void prefix_scan_counts(__global const T_STORE* row, uint V, __local Scratch* S, uint mode,
                               Prefix p, uint limit) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    hi = min(hi, limit);
    lo = min(lo, hi);
    uint gt = 0u, eq = 0u;
    FOR_STAGED_KEYS(row, lo, hi, mode, key, id, {
        gt += key > p.key ? 1u : 0u;
        eq += key == p.key ? 1u : 0u;
    })
    S->part_count[LID] = gt;
    S->part_eq[LID] = eq;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
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

// The weight of token d within prefix p (0 for non-members).
inline ulong weight_in_prefix(__global const T_STORE* row, uint V, __local Scratch* S, Prefix p,
                              uint d) {
    prefix_scan_counts(row, V, S, KEY_RANK, p, d);
    uint eq_before_d = S->bc_u32[1];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (d >= V) return 0ul;
    uint key = rank_key(LOAD_T(row, d));
    if (key > p.key) return key_weight(key);
    if (key < p.key) return 0ul;
    return eq_before_d < p.take ? key_weight(key) : 0ul;
}

// Residual weight of REJECTION: floor(max(0, wp * Wq - wq * Wp) / 2^41).
inline ulong residual_weight(ulong wp, ulong wq, ulong wq_total, ulong wp_total) {
    u128 a = mul_64x64(wp, wq_total);
    u128 b = mul_64x64(wq, wp_total);
    if (le_128(a, b)) return 0ul;
    u128 d = sub_128(a, b);
    return (d.hi << 23) | (d.lo >> 41);
}

#define WEIGHT_KEY 0u
#define WEIGHT_RESIDUAL 1u

// Draws within the members of prefix p: the member, in ascending id order, whose running weight
// first exceeds floor(r * M / 2^64), M the members' total weight. Weights are the key weights, or
// the REJECTION residual against draft row q. Returns -2 when M == 0, -1 if nothing was found.
inline int prefix_draw(__global const T_STORE* row, uint V, __local Scratch* S, Prefix p, ulong r,
                       uint wmode, __global const D_STORE* q, ulong wq_total, ulong wp_total) {
    prefix_scan_counts(row, V, S, KEY_RANK, p, V);
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint eq_idx = S->part_eq[LID];
    barrier(CLK_LOCAL_MEM_FENCE);
    ulong mass = 0ul;
    FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, key, id, {
        bool member = key > p.key;
        if (key == p.key) { member = eq_idx < p.take; eq_idx++; }
        if (member) {
            ulong w = key_weight(key);
            if (wmode == WEIGHT_RESIDUAL) w = residual_weight(w, key_weight(rank_key(LOAD_D(q, id))), wq_total, wp_total);
            mass += w;
        }
    })
    S->part_mass[LID] = mass;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
        ulong before = 0ul;
        for (uint c = 0; c < CORES; c++) {
            ulong m = S->part_mass[c];
            S->part_mass[c] = before;
            before += m;
        }
        S->bc_u64[0] = before;
        S->bc_u32[2] = 0xffffffffu;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ulong total = S->bc_u64[0];
    ulong start = S->part_mass[LID];
    int result = -2;
    if (total != 0ul) {
        ulong t = scale_draw(r, total);
        if (start <= t && t < start + mass) {
            ulong cum = start;
            uint eq2 = S->part_eq[LID];
            bool found = false;
            FOR_STAGED_KEYS(row, lo, hi, KEY_RANK, key, id, {
                bool member = key > p.key;
                if (key == p.key) { member = eq2 < p.take; eq2++; }
                if (member && !found) {
                    ulong w = key_weight(key);
                    if (wmode == WEIGHT_RESIDUAL) w = residual_weight(w, key_weight(rank_key(LOAD_D(q, id))), wq_total, wp_total);
                    cum += w;
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
                          Prefix p) {
    prefix_scan_counts(row, V, S, mode, p, V);
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint at = S->part_count[LID];
    uint eq_idx = S->part_eq[LID];
    uint n = min(S->bc_u32[0], (uint)SEL_MAX);
    barrier(CLK_LOCAL_MEM_FENCE);
    FOR_STAGED_KEYS(row, lo, hi, mode, key, id, {
        bool member = key > p.key;
        if (key == p.key) { member = eq_idx < p.take; eq_idx++; }
        if (member && at < SEL_MAX) { S->sel_key[at] = key; S->sel_id[at] = id; at++; }
    })
    barrier(CLK_LOCAL_MEM_FENCE);
    // The members arrived in id order; a member's place is the number of members ranking before it.
    for (uint i = LID; i < n; i += CORES) {
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

// top_k_top_p_sample of one row (contract 4.3): top-k survivors, the top-p kept set, the SAMPLE draw.
// Every row primitive is called unconditionally (their results are selected afterwards), so the
// kernel has no barrier under a branch: PoCL's work-group compiler duplicates the code after each
// conditional barrier, and uniform straight-line phases keep the build fast.
typedef struct {
    RowStats stats;
    ulong survivors_mass;  // W: mass of the top-k survivors (the whole row without top-k)
    Prefix kept;           // the top-p kept set (meaningless when W == 0)
} KeptSet;

inline KeptSet kept_set(__global const T_STORE* row, uint V, __local Scratch* S, int top_k,
                        uint top_p_bits) {
    KeptSet k;
    k.stats = row_stats(row, V, S);
    bool use_k = top_k > 0 && (uint)top_k < V;
    Prefix survivors = select_prefix(row, V, S, KEY_RANK, METRIC_COUNT,
                                     use_k ? (ulong)top_k : (ulong)V, true);
    k.survivors_mass = use_k ? survivors.mass : k.stats.mass;
    ulong w = k.survivors_mass;
    ulong target = w == 0ul ? 1ul : top_p_target_mass(top_p_fixed(top_p_bits), w);
    // The kept set is the shortest rank prefix of the whole row reaching the target: the survivors
    // reach it, so it lies inside them.
    k.kept = select_prefix(row, V, S, KEY_RANK, METRIC_MASS, target, true);
    return k;
}

// The sampled token of a row from its kept set.
inline int sample_kept(__global const T_STORE* row, uint V, __local Scratch* S, KeptSet k,
                       ulong seed) {
    int id = prefix_draw(row, V, S, k.kept, draw64(seed, PURPOSE_SAMPLE), WEIGHT_KEY,
                         (__global const D_STORE*)0, 0ul, 0ul);
    if (k.survivors_mass == 0ul || id < 0) return (int)k.stats.first;
    return id;
}

inline int sample_row(__global const T_STORE* row, uint V, __local Scratch* S, int top_k,
                      uint top_p_bits, ulong seed) {
    KeptSet k = kept_set(row, V, S, top_k, top_p_bits);
    return sample_kept(row, V, S, k, seed);
}

// The argmax (order_key, lowest id) of a row.
inline uint row_argmax(__global const T_STORE* row, uint V, __local Scratch* S) {
    uint lo, hi;
    core_slice(V, &lo, &hi);
    uint best_key = 0u, best_id = 0u;
    FOR_STAGED_KEYS(row, lo, hi, KEY_ORDER, key, id, {
        if (key > best_key) { best_key = key; best_id = id; }
    })
    S->part_key[LID] = best_key;
    S->part_id[LID] = best_id;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
        uint bk = 0u, bi = 0u;
        for (uint c = 0; c < CORES; c++) {
            if (S->part_key[c] > bk) { bk = S->part_key[c]; bi = S->part_id[c]; }
        }
        S->bc_u32[0] = bi;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint r = S->bc_u32[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// ---- softmax statistics (float class) -----------------------------------------------------------

#define STATS_ONE_HOT 0
#define STATS_POS_INF 1
#define STATS_ALL_NEG_INF 2
#define STATS_FINITE 3

typedef struct {
    int kind;
    uint arg;     // ONE_HOT: the argmax
    uint count;   // POS_INF: entries equal to +inf
    float max;    // FINITE
    float sum;    // FINITE
} SoftmaxStats;

inline float effective_temperature(float t) { return t >= 0.0f ? t : 1.0f; }

// x / t with NaN read as -inf.
inline float scaled(uint bits, float t) {
    float y = as_float(bits) / t;
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
    float m = -INFINITY;
    uint inf = 0u;
    for (uint i = lo; i < hi; i++) {
        float y = scaled(LOAD_T(row, i), tt);
        m = fmax(m, y);
        inf += y == INFINITY ? 1u : 0u;
    }
    S->part_f[LID] = m;
    S->part_count[LID] = inf;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
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
        float v = exp(scaled(LOAD_T(row, i), tt) - m) - comp;
        float s2 = sum + v;
        comp = (s2 - sum) - v;
        sum = s2;
    }
    S->part_f[LID] = sum;
    S->part_c[LID] = comp;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
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
