// top_p_candidates (contract 4.4): one cluster per row. Row totals, a radix count selection of the
// first min(C, valid) tokens in rank order, a gather of those members into local memory in id
// order and a rank placement (at most 128 entries), then core 0 finds lens with the exact top-p test.
__kernel void ENTRY(BUF(const T_STORE, probs), BUF(const uint, top_p), BUF(const int, batch_id),
                    const uint has_batch_id, BUF(int, ids), BUF(uint, scores), BUF(int, lens),
                    const uint rows, const uint V, const uint C) {
    BIND(const T_STORE, probs);
    BIND(const uint, top_p);
    BIND(const int, batch_id);
    BIND(int, ids);
    BIND(uint, scores);
    BIND(int, lens);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
    for (uint r = GRP; r < rows; r += NGRP) {
        __global int* row_ids = ids + (ulong)r * C;
        __global uint* row_scores = scores + (ulong)r * C;
        if (has_batch_id != 0u && batch_id[r] < 0) {
            for (uint i = LID; i < C; i += CORES) { row_ids[i] = -1; row_scores[i] = 0u; }
            if (LID == 0u) lens[r] = 0;
            continue;
        }
        __global const T_STORE* row = probs + (ulong)r * V;
        RowStats st = row_stats(row, V, S);
        if (st.valid == 0u) {
            for (uint i = LID; i < C; i += CORES) {
                row_ids[i] = i == 0u ? (int)st.first : -1;
                row_scores[i] = 0u;
            }
            if (LID == 0u) lens[r] = 1;
            continue;
        }
        uint n = min(C, st.valid);
        Prefix p = select_prefix(row, V, S, KEY_RANK, METRIC_COUNT, (ulong)n, false);
        gather_sorted(row, V, S, KEY_RANK, p);
        for (uint i = LID; i < C; i += CORES) {
            row_ids[i] = i < n ? (int)S->sorted_id[i] : -1;
            row_scores[i] = i < n ? S->sorted_key[i] : 0u;
        }
        if (LID == 0u) {
            ulong P = top_p_fixed(top_p[r]);
            int len = (int)n;
            ulong mass = 0ul;
            for (uint i = 0; i < n; i++) {
                mass += key_weight(S->sorted_key[i]);
                if (reaches_top_p(mass, P, st.mass)) { len = (int)i + 1; break; }
            }
            lens[r] = len;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
