// build_output_layout (§2, §5.1): a batch op on cluster 0 only (the `if (cluster_id() != 0)
// return;` of XPU batch kernels). Each core takes a contiguous slice of slots and sums its packed
// inputs and output rows, core 0 scans the partials (64-bit, clamped to i32::MAX when stored), then
// every core writes its slots' offsets and batch ids and a share of the padding rows.

// struct BuildOutputLayoutArgs: generated from src/ops/build_output_layout.rs.

inline int clamp_i32_from_u64(ulong v) { return v > 2147483647ul ? 2147483647 : (int)v; }

__kernel void build_output_layout_i32(BUF(const int, this_time), BUF(const int, encoder),
                                      BUF(int, seq_lens_output), BUF(int, cu_seqlens_q),
                                      BUF(int, cu_seqlens_q_output), BUF(int, batch_id),
                                      const struct BuildOutputLayoutArgs args) {
    BIND(const int, this_time, encoder);
    BIND(int, seq_lens_output, cu_seqlens_q, cu_seqlens_q_output, batch_id);
    const uint max_bsz = args.max_bsz, real_bsz = args.real_bsz;
    const uint s = args.max_step_tokens, cap = args.capacity;
    __local Scratch S[1];
    if (GRP != 0u) return;
    FOR_CORE_ITEMS(b, max_bsz) {
        seq_lens_output[b] = b < real_bsz ? (int)slot_output_rows(this_time[b], encoder[b], s) : 0;
    }
    uint lo, hi;
    core_slice(real_bsz, &lo, &hi);
    ulong in_sum = 0ul, out_sum = 0ul;
    for (uint b = lo; b < hi; b++) {
        in_sum += (ulong)max(this_time[b], 0);
        out_sum += (ulong)slot_output_rows(this_time[b], encoder[b], s);
    }
    ulong in_total, t_out;
    ulong a = cluster_scan(in_sum, S, &in_total);
    ulong o = cluster_scan(out_sum, S, &t_out);
    if (LID == 0u) {
        cu_seqlens_q[0] = 0;
        cu_seqlens_q_output[0] = 0;
    }
    for (uint b = lo; b < hi; b++) {
        uint rows = slot_output_rows(this_time[b], encoder[b], s);
        for (uint k = 0; k < rows; k++) {
            ulong t = o + k;
            if (t < cap) batch_id[t] = (int)b;
        }
        a += (ulong)max(this_time[b], 0);
        o += rows;
        cu_seqlens_q[b + 1] = clamp_i32_from_u64(a);
        cu_seqlens_q_output[b + 1] = clamp_i32_from_u64(o);
    }
    for (uint t = (uint)t_out + LID; t < cap; t += CORES) batch_id[t] = -1;
}
