// build_output_layout (`docs/semantics.md` §5.1): rows per slot, the packed-input and output prefix sums, and
// the slot of every output row (-1 for padding rows). One block: two saturating prefix scans over
// the slots, then every output row finds its slot by binary search in cu_seqlens_q_output.

__device__ __forceinline__ i32 saturate_i32(u64 v) { return v > (u64)SPECULA_I32_MAX ? SPECULA_I32_MAX : (i32)v; }

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(build_output_layout)(const LayoutArgs a) {
    __shared__ u64 sa[SPECULA_BATCH_BLOCK / 32], sb[SPECULA_BATCH_BLOCK / 32];
    for (u32 b = threadIdx.x; b < a.max_bsz; b += SPECULA_BATCH_BLOCK) {
        const u64 rows = b < a.real_bsz ? slot_output_rows(a.this_time[b], a.encoder[b], a.max_step_tokens) : 0;
        a.seq_lens_output[b] = saturate_i32(rows);
    }
    if (threadIdx.x == 0) {
        a.cu_in[0] = 0;
        a.cu_out[0] = 0;
    }
    // Sums run in u64 (each term < 2^31, so they cannot wrap) and saturate when stored.
    u64 carry_in = 0, carry_out = 0;
    for (u32 base = 0; base < a.real_bsz; base += SPECULA_BATCH_BLOCK) {
        const u32 b = base + threadIdx.x;
        const bool live = b < a.real_bsz;
        const u64 vin = live ? len_or_zero(a.this_time[b]) : 0;
        const u64 vout = live ? slot_output_rows(a.this_time[b], a.encoder[b], a.max_step_tokens) : 0;
        u64 ex_in, ex_out, tot_in, tot_out;
        block_scan_pair<SPECULA_BATCH_BLOCK, u64, u64>(vin, vout, ex_in, ex_out, tot_in, tot_out, sa, sb);
        if (live) {
            a.cu_in[b + 1] = saturate_i32(carry_in + ex_in + vin);
            a.cu_out[b + 1] = saturate_i32(carry_out + ex_out + vout);
        }
        carry_in += tot_in;
        carry_out += tot_out;
    }
    // The block's global writes are visible to all its threads after the barrier.
    __syncthreads();
    for (u64 t = threadIdx.x; t < a.capacity; t += SPECULA_BATCH_BLOCK) {
        // The largest b in [0, real_bsz] with cu_out[b] <= t (cu_out is non-decreasing).
        u32 lo = 0, hi = a.real_bsz;
        while (lo < hi) {
            const u32 mid = lo + (hi - lo + 1) / 2;
            if ((u64)(i64)a.cu_out[mid] <= t) lo = mid; else hi = mid - 1;
        }
        a.batch_id[t] = lo < a.real_bsz ? (i32)lo : -1;
    }
}
