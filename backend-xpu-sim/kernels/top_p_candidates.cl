// top_p_candidates (§5.7): one cluster per row. Row totals, a radix count selection of the
// first min(C, valid) tokens in rank order, a gather of those members into local memory in id
// order and a rank placement (at most 128 entries), then core 0 finds lens with the exact top-p test.
// Logits rows (LOGITS) are weighed by §4b at the row's temperature; their scores are the
// candidates' exact shares of the row (candidate_score). With a fallback input (has_fallback), a
// row of total weight 0 lists fallback[r] (score 0, lens 1), or nothing (lens 0) when it is negative.

// struct TopPCandidatesArgs: generated from src/ops/top_p_candidates.rs.

// The score of a logits candidate of weight w in a row of total weight W > 0 (§4b), as f32
// bits: q = floor(w * 2^40 / W) (binary long division; the remainder stays below W <= 2^60), cut to
// its 24 most significant bits, and score = q * 2^-40, exact in f32.
inline uint candidate_score(ulong w, ulong total) {
    ulong q = w / total, rem = w % total;
    for (int i = 0; i < WEIGHT_BITS; i++) {
        rem <<= 1;
        q <<= 1;
        if (rem >= total) { rem -= total; q |= 1ul; }
    }
    if (q == 0ul) return 0u;
    uint b = 64u - (uint)clz(q);
    ulong significand = b > 24u ? q >> (b - 24u) : q << (24u - b);
    uint exponent = b - 1u - (uint)WEIGHT_BITS + 127u;
    return (exponent << 23) | ((uint)significand & 0x7fffffu);
}

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature),
                    BUF(const uint, top_p), BUF(const int, batch_id), BUF(int, ids),
                    BUF(uint, scores), BUF(int, lens), BUF(const int, fallback),
                    const struct TopPCandidatesArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const uint, temperature, top_p);
    BIND(const int, batch_id, fallback);
    BIND(int, ids, lens);
    BIND(uint, scores);
    const uint has_batch_id = args.has_batch_id, rows = args.rows;
    const uint V = args.vocab, C = args.candidates;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(r, rows) {
        __global int* row_ids = ids + (ulong)r * C;
        __global uint* row_scores = scores + (ulong)r * C;
        if (has_batch_id != 0u && batch_id[r] < 0) {
            FOR_CORE_ITEMS(i, C) { row_ids[i] = -1; row_scores[i] = 0u; }
            if (LID == 0u) lens[r] = 0;
            continue;
        }
        __global const T_STORE* row = matrix + (ulong)r * V;
        Weigh w = row_weigh(row, V, S, ROW_TEMPERATURE(temperature, r));
        RowStats st = row_stats(row, V, S, w);
        if (st.valid == 0u) {
            int first = args.has_fallback != 0u ? fallback[r] : (int)st.first;
            FOR_CORE_ITEMS(i, C) {
                row_ids[i] = i == 0u ? first : -1;
                row_scores[i] = 0u;
            }
            if (LID == 0u) lens[r] = first >= 0 ? 1 : 0;
            continue;
        }
        uint n = min(C, st.valid);
        Prefix p = select_prefix(row, V, S, KEY_RANK, w, METRIC_COUNT, (ulong)n, false);
        gather_sorted(row, V, S, KEY_RANK, w, p);
        FOR_CORE_ITEMS(i, C) {
            uint key = i < n ? S->sorted_key[i] : 0u;
            row_ids[i] = i < n ? (int)S->sorted_id[i] : -1;
            // A probability row's score is its sanitized probability: the rank key itself.
            row_scores[i] = i < n ? (LOGITS ? candidate_score(weight_of(w, key), st.mass) : key) : 0u;
        }
        if (LID == 0u) {
            ulong P = top_p_fixed(top_p[r]);
            int len = (int)n;
            ulong mass = 0ul;
            for (uint i = 0; i < n; i++) {
                mass += weight_of(w, S->sorted_key[i]);
                if (reaches_top_p(mass, P, st.mass)) { len = (int)i + 1; break; }
            }
            lens[r] = len;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
