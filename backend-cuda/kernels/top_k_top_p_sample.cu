// top_k_top_p_sample (`docs/semantics.md` §5.6): exact sampling on fixed-point weights, no sort.
//
// One block per row (`top_k_top_p_sample_<t>`), or, for a few rows of a large vocabulary, several
// blocks per row launched cooperatively (`top_k_top_p_sample_split_<t>`). The kept set is found by
// the radix selection of select.cuh (top-k on counts, then top-p on exact masses) and the token by
// one id-order prefix scan of the kept weights against t = floor(R · C / 2^64). Logits rows
// (`logits`) first find the row maximum and weigh each token by `docs/semantics.md` §4b at the row's
// temperature. With `fallback`, a row of weight 0 yields fallback[r] (process_logits, §4c).

// Samples row r into tokens[r]; `p` is this block's part of the row.
__device__ void sample_one_row(const SampleArgs& a, u32 r, RowPart& p, SelShared& s) {
    typedef SPECULA_T E;
    const typename E::raw* row = a.probs + (u64)r * a.vocab;
    const Weigh w = row_weigh<E>(row, p, s, a.logits != 0, a.logits != 0 ? a.temperature[r] : 1.0f);
    const Kept k = kept_set<E>(row, p, s, w, a.vocab, a.top_k[r], top_p_fixed(a.top_p[r]));
    if (k.degenerate) {
        // A row of weight 0 yields its fallback when given, else its first token in rank order.
        if (p.block == 0 && threadIdx.x == 0) a.tokens[r] = a.fallback != 0 ? a.fallback[r] : (i32)k.first;
        return;
    }
    const u64 t = scale_draw(specula_draw(a.seed[r], SPECULA_PURPOSE_SAMPLE), k.prefix.mass);
    i32 id = draw_in_prefix<E>(row, p, s, w, k.prefix.key, k.prefix.take, t);
    if (p.nblocks == 1 && id < 0) {
        // Unreachable (t < the kept mass); the first token is the safe answer.
        id = (i32)first_in_rank<E, RankKeys>(row, p, s, w);
    }
    if (id >= 0 && threadIdx.x == 0) a.tokens[r] = id;
}

extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    SPECULA_ENTRY(top_k_top_p_sample)(const SampleArgs a) {
    __shared__ SelShared s;
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    RowPart p = row_part_single(a.vocab, a.vec != 0);
    sample_one_row(a, r, p, s);
}

extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    SPECULA_ENTRY(top_k_top_p_sample_split)(const SampleArgs a) {
    __shared__ SelShared s;
    const u32 r = blockIdx.y;
    if (r >= a.rows) return;
    RowPart p = row_part_split(a.scratch, a.scratch_stride, a.sync, r, a.splits, blockIdx.x, a.vocab, a.vec != 0);
    split_row_begin(p);
    sample_one_row(a, r, p, s);
}
