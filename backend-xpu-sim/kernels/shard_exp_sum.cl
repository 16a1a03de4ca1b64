// shard_exp_sum (docs/semantics.md §5.17, float): one cluster per row (cluster-stride). The row's
// maximum m is the value of its row key; the slice's sum of exp((l - m) / T) is taken in the
// reference's order, 8 interleaved partial sums (element i into sum i mod 8) added in order at the
// end: a tile of CORES * TILE terms is computed by every core into local memory, then cores 0-7
// each add their lane of it in id order. Special rows: 0 at T == 0 or m = -inf, the number of
// +inf logits at m = +inf.

// struct ShardExpSumArgs: generated from src/ops/shard_exp_sum.rs.

#define EXP_LANES 8u

// exp((l - m) / t) of a logit (f32 bits) below a maximum m that is not infinite: NaN and -inf
// logits add 0, T = +inf scales a finite logit to 0 (one IEEE subtraction, then one division).
inline float exp_term(uint bits, float m, float t) {
    float l = as_float(bits);
    if (isnan(l) || l == -INFINITY) return 0.0f;
    if (isinf(t)) return 1.0f;
    return exp((l - m) / t);
}

__kernel void ENTRY(BUF(const T_STORE, logits), BUF(const float, temperature),
                    BUF(const ulong, row_key), BUF(float, sums), const struct ShardExpSumArgs args) {
    BIND(const T_STORE, logits);
    BIND(const float, temperature);
    BIND(const ulong, row_key);
    BIND(float, sums);
    const uint rows = args.rows, len = args.len, tile = CORES * TILE;
    __local Scratch S[1];
    __local float lane_sum[EXP_LANES];
    __local float* terms = (__local float*)S->tiles;
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = logits + (ulong)r * len;
        const float m = as_float(key_value_bits(row_key[r]));
        const float t = effective_temperature(temperature[r]);
        const bool special = t == 0.0f || isinf(m);
        // Special rows count the +inf logits (the sum when m = +inf).
        uint inf_here = 0u;
        FOR_CORE_ITEMS(i, special ? len : 0u) inf_here += as_float(LOAD_T(row, i)) == INFINITY ? 1u : 0u;
        ulong inf_count = cluster_sum((ulong)inf_here, S);
        FOR_CORE_ITEMS(l, EXP_LANES) lane_sum[l] = 0.0f;
        for (uint t0 = 0; t0 < (special ? 0u : len); t0 += tile) {
            uint n = min(tile, len - t0);
            FOR_CORE_ITEMS(i, n) terms[i] = exp_term(LOAD_T(row, t0 + i), m, t);
            barrier(CLK_LOCAL_MEM_FENCE);
            // Lane l adds the tile's elements l, l + 8, ... in order (the tile is a multiple of 8
            // long, so element i of the slice always goes to lane i mod 8); one core per lane.
            FOR_CORE_ITEMS(l, EXP_LANES) {
                float s = lane_sum[l];
                for (uint i = l; i < n; i += EXP_LANES) s += terms[i];
                lane_sum[l] = s;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (LID == 0u) {
            float sum = 0.0f;
            if (t == 0.0f || m == -INFINITY) {
                sum = 0.0f;
            } else if (m == INFINITY) {
                sum = (float)inf_count;
            } else {
                for (uint l = 0; l < EXP_LANES; l++) sum += lane_sum[l];
            }
            sums[r] = sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
