// argmax (`docs/semantics.md` §5.4): per row, the id of the largest value; NaN ranks below every number,
// -0 equals +0, ties go to the lowest id. One block per row; the order is total, so the parallel
// reduction gives the CPU's answer bit for bit.

extern "C" __global__ void __launch_bounds__(SPECULA_ROW_BLOCK) SPECULA_ENTRY(argmax)(const ArgmaxArgs a) {
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const u32 id = block_row_argmax<SPECULA_T, SPECULA_ROW_BLOCK>(a.input + (u64)r * a.vocab, a.vocab, a.vec != 0);
    if (threadIdx.x == 0) a.out[r] = (i32)id;
}
