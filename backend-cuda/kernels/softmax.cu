// softmax (`docs/semantics.md` §5.5): probs = softmax(logits / temperature) per row, f32 out, f32 sums.
// One block per row. The scaled logit is (l - m) / T with m the row's maximum logit (subtract
// first, then divide). Temperature 0 is one-hot at the argmax; a row whose maximum is +inf is
// uniform over its +inf entries; a row of all -inf is uniform; NaN logits count as -inf.

extern "C" __global__ void __launch_bounds__(SPECULA_ROW_BLOCK) SPECULA_ENTRY(softmax)(const SoftmaxArgs a) {
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.logits + (u64)r * a.vocab;
    float* out = a.probs + (u64)r * a.vocab;
    const float t = effective_temperature(a.temperature[r]);
    const RowStats st = block_row_stats<SPECULA_T, SPECULA_ROW_BLOCK>(row, a.vocab, a.vec != 0, t);
    const float inv_count = 1.0f / (float)st.inf_count;
    const float uniform = 1.0f / (float)a.vocab;
    for_row_elements<SPECULA_T, SPECULA_ROW_BLOCK>(row, a.vocab, a.vec != 0, [&](u32 i, float x) {
        float p;
        switch (st.kind) {
            case ROW_STATS_ONE_HOT: p = (i == st.arg) ? 1.0f : 0.0f; break;
            case ROW_STATS_POS_INF: p = x == SPECULA_INF ? inv_count : 0.0f; break;
            case ROW_STATS_ALL_NEG_INF: p = uniform; break;
            default: p = expf(scaled_logit(x, st.max, t)) / st.sum; break;
        }
        out[i] = p;
    });
}
