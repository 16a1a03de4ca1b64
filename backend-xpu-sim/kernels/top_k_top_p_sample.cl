// top_k_top_p_sample (§5.6): one cluster per row. Radix selections of the top-k and top-p
// thresholds over the rank keys (cluster-wide histograms filled by every core), then the draw: each
// core sums the kept weight of its slice, core 0 scans the partials, and the one core whose range
// holds the draw walks its slice. All integer, so the token does not depend on the launch shape.
// Logits rows (LOGITS) first find the row maximum, and weigh each token by §4b at the row's
// temperature. With a fallback input (has_fallback), a row of total weight 0 yields fallback[r]
// (§4c) instead of its first token in rank order.

// struct TopKTopPSampleArgs: generated from src/ops/top_k_top_p_sample.rs.

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature), BUF(const int, top_k),
                    BUF(const uint, top_p), BUF(const ulong, seed), BUF(int, tokens),
                    BUF(const int, fallback), const struct TopKTopPSampleArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const uint, temperature, top_p);
    BIND(const int, top_k, fallback);
    BIND(const ulong, seed);
    BIND(int, tokens);
    MATRIX_ROWS(args);
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = matrix + (ulong)r * V;
        KeptSet k = kept_set(row, V, S, row_weigh(row, V, S, ROW_TEMPERATURE(temperature, r)),
                             top_k[r], top_p[r]);
        int token = sample_kept(row, V, S, k, seed[r]);
        // A row weighs nothing exactly when its first token in rank order weighs nothing.
        if (args.has_fallback != 0u && k.stats.mass == 0ul) token = fallback[r];
        if (LID == 0u) tokens[r] = token;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
