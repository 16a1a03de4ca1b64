// top_k_top_p_sample (contract 4.3): one cluster per row. Radix selections of the top-k and top-p
// thresholds over the rank keys (cluster-wide histograms filled by every core), then the draw: each
// core sums the kept weight of its slice, core 0 scans the partials, and the one core whose range
// holds the draw walks its slice. All integer, so the token does not depend on the launch shape.
__kernel void ENTRY(BUF(const T_STORE, probs), BUF(const int, top_k), BUF(const uint, top_p),
                    BUF(const ulong, seed), BUF(int, tokens), const uint rows, const uint V) {
    BIND(const T_STORE, probs);
    BIND(const int, top_k);
    BIND(const uint, top_p);
    BIND(const ulong, seed);
    BIND(int, tokens);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
    for (uint r = GRP; r < rows; r += NGRP) {
        int token = sample_row(probs + (ulong)r * V, V, S, top_k[r], top_p[r], seed[r]);
        if (LID == 0u) tokens[r] = token;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
