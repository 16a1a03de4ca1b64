// softmax (§5.5): one cluster per row; per-core max / +inf count of the logits, then
// per-core compensated sums of exp((l - m) / t), merged by core 0 in core order; f32 throughout.

// struct SoftmaxArgs: generated from src/ops/softmax.rs.

__kernel void ENTRY(BUF(const T_STORE, logits), BUF(const float, temperature), BUF(float, probs),
                    const struct SoftmaxArgs args) {
    BIND(const T_STORE, logits);
    BIND(const float, temperature);
    BIND(float, probs);
    MATRIX_ROWS(args);
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = logits + (ulong)r * V;
        __global float* out = probs + (ulong)r * V;
        float t = effective_temperature(temperature[r]);
        SoftmaxStats st = softmax_stats(row, V, S, t);
        FOR_CORE_ITEMS(i, V) {
            float p;
            if (st.kind == STATS_ONE_HOT) {
                p = i == st.arg ? 1.0f : 0.0f;
            } else if (st.kind == STATS_POS_INF) {
                p = logit_value(LOAD_T(row, i)) == INFINITY ? 1.0f / (float)st.count : 0.0f;
            } else if (st.kind == STATS_ALL_NEG_INF) {
                p = 1.0f / (float)V;
            } else {
                p = exp(scaled(LOAD_T(row, i), st.max, t)) / st.sum;
            }
            out[i] = p;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
