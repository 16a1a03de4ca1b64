// softmax (contract 4.9): one cluster per row; per-core max / +inf count, then per-core
// compensated sums of exp(y - max), merged by core 0 in core order; f32 throughout.
__kernel void ENTRY(BUF(const T_STORE, logits), BUF(const float, temperature), BUF(float, probs),
                    const uint rows, const uint V) {
    BIND(const T_STORE, logits);
    BIND(const float, temperature);
    BIND(float, probs);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
    for (uint r = GRP; r < rows; r += NGRP) {
        __global const T_STORE* row = logits + (ulong)r * V;
        __global float* out = probs + (ulong)r * V;
        float t = effective_temperature(temperature[r]);
        SoftmaxStats st = softmax_stats(row, V, S, t);
        for (uint i = LID; i < V; i += CORES) {
            float p;
            if (st.kind == STATS_ONE_HOT) {
                p = i == st.arg ? 1.0f : 0.0f;
            } else if (st.kind == STATS_POS_INF) {
                p = scaled(LOAD_T(row, i), t) == INFINITY ? 1.0f / (float)st.count : 0.0f;
            } else if (st.kind == STATS_ALL_NEG_INF) {
                p = 1.0f / (float)V;
            } else {
                p = exp(scaled(LOAD_T(row, i), t) - st.max) / st.sum;
            }
            out[i] = p;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
