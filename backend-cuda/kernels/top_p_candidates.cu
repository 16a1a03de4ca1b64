// top_p_candidates (`docs/semantics.md` §5.7): the first C tokens in rank order with a nonzero weight, and
// the length of the shortest prefix of them whose mass reaches top_p of the row's whole weight.
//
// One block per row: a count selection of C among the keys of positive weight (select.cuh), one
// id-order pass that gathers the (at most 128) members into shared memory, a rank-by-counting
// order of those few, and the exact 128-bit top-p test over their prefix masses. Logits rows
// (`logits`) are weighed by `docs/semantics.md` §4b at the row's temperature: the count selection takes the
// first C tokens of the whole row (their weights never increase down the rank order, so the ones
// of positive weight lead), and a candidate's score is its exact share of the row
// (candidate_score).

extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    SPECULA_ENTRY(top_p_candidates)(const CandidatesArgs a) {
    __shared__ SelShared s;
    __shared__ u32 keys[SPECULA_MAX_CANDIDATES], ids[SPECULA_MAX_CANDIDATES];
    __shared__ u32 sorted_keys[SPECULA_MAX_CANDIDATES], sorted_ids[SPECULA_MAX_CANDIDATES];
    __shared__ u32 n_gathered;
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const u32 c = a.candidates;
    i32* out_ids = a.ids + (u64)r * c;
    float* out_scores = a.scores + (u64)r * c;
    if (a.batch_id != 0 && a.batch_id[r] < 0) {
        for (u32 i = threadIdx.x; i < c; i += SEL_BLOCK) {
            out_ids[i] = -1;
            out_scores[i] = 0.0f;
        }
        if (threadIdx.x == 0) a.lens[r] = 0;
        return;
    }
    const typename SPECULA_T::raw* row = a.probs + (u64)r * a.vocab;
    RowPart p = row_part_single(a.vocab, a.vec != 0);
    const bool logits = a.logits != 0;
    const Weigh w = row_weigh<SPECULA_T>(row, p, s, logits, logits ? a.temperature[r] : 1.0f);
    // Probability rows: the first C of the tokens of positive weight (keys from that of 2^-40 on).
    // Logits rows: the first C of the row, cut below to those of positive weight after ordering.
    const u32 from_key = logits ? 0u : SPECULA_MIN_WEIGHT_KEY;
    const Sel valid = select_prefix<SPECULA_T, RankKeys>(row, p, s, w, from_key, SPECULA_U32_MAX, false, c, 0);
    u32 n = valid.count < c ? valid.count : c;
    if (logits && valid.within_mass == 0) n = 0;
    if (n == 0) {
        // Row weight 0: its fallback when given (nothing, lens 0, when negative), else its first
        // token in rank order; score 0.
        const u32 first = first_in_rank<SPECULA_T, RankKeys>(row, p, s, w);
        const i32 only = a.fallback != 0 ? a.fallback[r] : (i32)first;
        for (u32 i = threadIdx.x; i < c; i += SEL_BLOCK) {
            out_ids[i] = i == 0 ? only : -1;
            out_scores[i] = 0.0f;
        }
        if (threadIdx.x == 0) a.lens[r] = only >= 0 ? 1 : 0;
        return;
    }
    if (threadIdx.x == 0) n_gathered = 0;
    __syncthreads();
    gather_prefix<SPECULA_T, RankKeys>(row, p, s, w, valid.key, valid.take, keys, ids, &n_gathered,
                                       SPECULA_MAX_CANDIDATES);
    u32 m = n_gathered < n ? n_gathered : n;  // equal by construction
    rank_order_small(keys, ids, m, sorted_keys, sorted_ids);
    // Logits rows: the members of positive weight, a prefix of the order (at least the first).
    u32 positive = 0;
    for (u32 i = 0; i < m; ++i) positive += weight_of(w, sorted_keys[i]) != 0 ? 1u : 0u;
    m = positive;
    const u64 total = valid.within_mass;
    for (u32 i = threadIdx.x; i < c; i += SEL_BLOCK) {
        float score = 0.0f;
        if (i < m) {
            // A probability row's score is its sanitized probability: the rank key itself.
            score = logits ? candidate_score(weight_of(w, sorted_keys[i]), total) : __uint_as_float(sorted_keys[i]);
        }
        out_ids[i] = i < m ? (i32)sorted_ids[i] : -1;
        out_scores[i] = score;
    }
    if (threadIdx.x == 0) {
        const u64 p_fixed = top_p_fixed(a.top_p[r]);
        i32 len = (i32)m;
        u64 mass = 0;
        for (u32 i = 0; i < m; ++i) {
            mass += weight_of(w, sorted_keys[i]);
            if (reaches_top_p(mass, p_fixed, total)) {
                len = (i32)(i + 1);
                break;
            }
        }
        a.lens[r] = len;
    }
}
