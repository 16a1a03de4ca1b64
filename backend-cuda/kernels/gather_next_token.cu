// gather_next_token (`docs/semantics.md` §5.2): copies, for every output row, the hidden-state row it
// predicts from; zeros for rows without a source. The copy moves bytes in the widest unit that
// divides the row size and both bases (chosen on the host), so it is bit-exact for every dtype.
// One block per output row.

// The packed input row of slot b at position pos, or -1 when it is outside the input.
__device__ __forceinline__ i64 packed_row(const GatherArgs& a, u32 b, i64 pos) {
    const i64 row = (i64)a.cu_seqlens_q[b] + pos;
    return (row >= 0 && (u64)row < a.token_num) ? row : -1;
}

__device__ __forceinline__ i64 last_row(const GatherArgs& a, u32 b) {
    return packed_row(a, b, (i64)a.this_time[b] - 1);
}

__device__ i64 gather_source(const GatherArgs& a, u32 t) {
    if (a.speculative) {
        u32 b;
        u64 pos;
        if (!row_source(a.batch_id, a.cu_out, a.this_time, a.encoder, a.real_bsz, a.max_step_tokens, t, b, pos))
            return -1;
        if (a.encoder[b] > 0) return last_row(a, b);  // prefill: its last packed token
        return packed_row(a, b, (i64)pos);            // decode row k: packed token k
    }
    if (t < a.real_bsz && slot_output_rows(a.this_time[t], a.encoder[t], a.max_step_tokens) > 0)
        return last_row(a, t);
    return -1;
}

template <class W>
__device__ __forceinline__ void copy_row(const u8* src, u8* dst, u64 row_bytes, bool zero) {
    const u64 n = row_bytes / sizeof(W);
    const W* s = reinterpret_cast<const W*>(src);
    W* d = reinterpret_cast<W*>(dst);
    W z;
    memset(&z, 0, sizeof(W));
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) d[i] = zero ? z : s[i];
}

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(gather_next_token)(const GatherArgs a) {
    const u32 t = blockIdx.x;
    if (t >= a.out_rows) return;
    const i64 source = gather_source(a, t);
    const bool zero = source < 0;
    const u8* src = a.src + (zero ? 0 : (u64)source * a.row_bytes);
    u8* dst = a.dst + (u64)t * a.row_bytes;
    switch (a.unit) {
        case 16: copy_row<uint4>(src, dst, a.row_bytes, zero); break;
        case 8: copy_row<uint2>(src, dst, a.row_bytes, zero); break;
        case 4: copy_row<u32>(src, dst, a.row_bytes, zero); break;
        case 2: copy_row<unsigned short>(src, dst, a.row_bytes, zero); break;
        default: copy_row<u8>(src, dst, a.row_bytes, zero); break;
    }
}
