// shard.cl: what the kernels of sharded rows share (docs/semantics.md §4d, §5.13-§5.17).
// Prepended after common.cl to the programs of the shard_* ops only.
//
// A rank takes the [rows, len] slice [first, first + len) of every row. A token is ranked by its
// key, the ulong (ord(value) << 20) | (2^20 - 1 - id) of its global id (a larger key comes
// first; keys are distinct within a row), and weighed as a token of the whole row from the row
// key (the largest key of the whole row in rank order: its maximum and its first token), exactly
// as backend_api::shard::SliceWeigher does. Injected with -D by the host besides common.cl's
// constants: SHARD_KEY_ID_BITS, MAX_SHARD_RECORDS.

#ifndef SHARD_KEY_ID_BITS
#error "SHARD_KEY_ID_BITS must be defined by the host"
#endif

#define SHARD_ID_MASK ((1ul << SHARD_KEY_ID_BITS) - 1ul)
#define ORDER_RANK 0u    // KeyOrder::Rank: the sampling ops' order
#define ORDER_ARGMAX 1u  // KeyOrder::Argmax: the raw value, NaN one below -inf
#define ARGMAX_NAN_ORD 0x007ffffeu
#define NO_KEY 0ul

// ---- keys ----------------------------------------------------------------------------------------

// The ordinal of a score (f32 bits) in `order`: rank order takes a probability's sanitized value
// (common.cl's rank_key) or a logit itself with NaN as -inf and -0 as +0 (rank_value_key);
// argmax order the raw value with NaN one below -inf.
inline uint score_ord(uint order, uint bits) {
    if (order == ORDER_ARGMAX) {
        return (bits & 0x7fffffffu) > POS_INF_BITS ? ARGMAX_NAN_ORD : order_key(bits);
    }
#if LOGITS
    return rank_value_key(bits);
#else
    return rank_key(bits) | 0x80000000u;
#endif
}

// The key of global token `id` whose score has the f32 bits `bits`, in `order`.
inline ulong token_key(uint order, uint bits, uint id) {
    ulong ord = (ulong)score_ord(order, bits);
    return (ord << SHARD_KEY_ID_BITS) | (SHARD_ID_MASK - ((ulong)id & SHARD_ID_MASK));
}

// The global id a key names.
inline uint key_id(ulong key) { return (uint)(SHARD_ID_MASK - (key & SHARD_ID_MASK)); }

// The f32 bits of the value a rank key carries (-inf for NO_KEY).
inline uint key_value_bits(ulong key) {
    if (key == NO_KEY) return NEG_INF_BITS;
    uint ord = (uint)(key >> SHARD_KEY_ID_BITS);
    return (ord >> 31) != 0u ? (ord & 0x7fffffffu) : ~ord;
}

// ---- weights of a slice's tokens as tokens of the whole row ---------------------------------------

typedef struct {
    ulong floor_hi;  // min_p on: MINP * w_max (128 bits); a token with w * 2^24 below it weighs 0
    ulong floor_lo;
    Weigh w;         // logits: how the whole row weighs (common.cl); probabilities: by key
    uint only;       // logits at T == 0 (WEIGH_ARGMAX): the one token that weighs, the row key's
    uint min_p_on;
} SliceWeigh;

// Whether a device min_p (f32 bits) is on: above 0 and not NaN (values above 1 count as 1).
inline bool min_p_on(uint bits) {
    return (bits & 0x80000000u) == 0u && bits != 0u && bits <= POS_INF_BITS;
}

// The weighing of a row whose row key is `row_key`, at temperature t_bits (logits rows), with the
// device min_p min_p_bits (0: off).
inline SliceWeigh slice_weigh(ulong row_key, uint t_bits, uint min_p_bits) {
    SliceWeigh s;
    ulong w_max;
#if LOGITS
    uint max_key = row_key == NO_KEY ? NEG_INF_LOGIT_KEY : logit_rank_key(key_value_bits(row_key));
    s.w = logits_weigh(max_key, 0u, t_bits);
    w_max = s.w.kind == WEIGH_ZERO ? 0ul : (1ul << WEIGHT_BITS);
#else
    s.w = by_key();
    w_max = row_key == NO_KEY ? 0ul : key_weight(rank_key(key_value_bits(row_key)));
#endif
    s.only = key_id(row_key);
    s.min_p_on = min_p_on(min_p_bits) ? 1u : 0u;
    u128 floor = mul_64x64(s.min_p_on != 0u ? top_p_fixed(min_p_bits) : 0ul, w_max);
    s.floor_hi = floor.hi;
    s.floor_lo = floor.lo;
    return s;
}

// The weight of global token `id` whose score has the f32 bits `bits`.
inline ulong slice_weight(SliceWeigh s, uint bits, uint id) {
#if LOGITS
    ulong w = s.w.kind == WEIGH_ARGMAX ? (id == s.only ? (1ul << WEIGHT_BITS) : 0ul)
                                       : logit_key_weight(s.w, logit_rank_key(bits));
#else
    ulong w = key_weight(rank_key(bits));
#endif
    if (s.min_p_on != 0u) {
        u128 scaled, floor;
        scaled.hi = w >> (64 - TOP_P_BITS);
        scaled.lo = w << TOP_P_BITS;
        floor.hi = s.floor_hi;
        floor.lo = s.floor_lo;
        if (lt_128(scaled, floor)) w = 0ul;
    }
    return w;
}

// The min_p of row r as f32 bits (0, off, without a min_p input).
#define ROW_MIN_P(min_p, has_min_p, r) ((has_min_p) != 0u ? (min_p)[r] : 0u)

// ---- REJECTION's residual -----------------------------------------------------------------------

inline uint bit_length(ulong x) { return 64u - (uint)clz(x); }

// The shift k of the residual: 41 for probability rows, max(0, bitlength(Wp) + bitlength(Wq) - 60)
// for logits rows.
inline uint residual_shift(ulong target_mass, ulong draft_mass) {
#if LOGITS
    uint bits = bit_length(target_mass) + bit_length(draft_mass);
    return bits > 60u ? bits - 60u : 0u;
#else
    return (uint)WEIGHT_BITS + 1u;
#endif
}

// floor(max(0, wp * Wq - wq * Wp) / 2^shift), exact, saturating at ULONG_MAX (shift <= 68).
inline ulong residual_weight(ulong wp, ulong wq, ulong target_mass, ulong draft_mass, uint shift) {
    u128 plus = mul_64x64(wp, draft_mass), minus = mul_64x64(wq, target_mass);
    if (le_128(plus, minus)) return 0ul;
    u128 d = sub_128(plus, minus);
    ulong hi, lo;
    if (shift >= 64u) {
        hi = 0ul;
        lo = d.hi >> (shift - 64u);
    } else if (shift == 0u) {
        hi = d.hi;
        lo = d.lo;
    } else {
        hi = d.hi >> shift;
        lo = (d.lo >> shift) | (d.hi << (64u - shift));
    }
    return hi != 0ul ? ULONG_MAX : lo;
}

// ---- staging and cluster collectives ------------------------------------------------------------

// Walks this core's slice [lo, hi) of `row` a tile at a time: the f32 bits of TILE elements are
// staged into the core's own part of local memory, then BODY runs for each (bits, j) of the tile.
#define FOR_STAGED_BITS(row, lo, hi, bits, j, ...)                                                 \
    for (uint t0_ = (lo); t0_ < (hi); t0_ += TILE) {                                               \
        uint n_ = min((uint)TILE, (hi) - t0_);                                                     \
        __local uint* tile_ = S->tiles + LID * TILE;                                               \
        for (uint j_ = 0; j_ < n_; j_++) tile_[j_] = LOAD_T((row), t0_ + j_);                      \
        for (uint j_ = 0; j_ < n_; j_++) {                                                         \
            uint bits = tile_[j_];                                                                 \
            uint j = t0_ + j_;                                                                     \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }

// The largest of every core's `v`.
CLUSTER_FOLD(ulong, cluster_max_u64, part_mass, bc_u64, 0ul, max)

// cluster_scan with saturating sums: the saturated sum of the `v` of the cores before this one;
// *total gets the saturated sum over every core (saturating sums of non-negative values are
// associative, so the result is the saturated sum in any grouping).
CLUSTER_SCAN(cluster_scan_sat, add_sat)
