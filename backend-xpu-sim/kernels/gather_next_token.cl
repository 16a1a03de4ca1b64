// gather_next_token (§5.2): one cluster per output row (cluster-stride), the cores copy the
// row's elements. ELEM is an unsigned integer of the dtype's size, so the copy moves bits.

// struct GatherNextTokenArgs: generated from src/ops/gather_next_token.rs.

// Packed input row cu_seqlens_q[b] + pos, if inside [0, token_num).
inline long packed_row(__global const int* cu_in, uint b, long pos, ulong token_num) {
    long row = (long)cu_in[b] + pos;
    return (row >= 0 && (ulong)row < token_num) ? row : -1;
}

__kernel void ENTRY(BUF(const ELEM, hidden_states), BUF(const int, cu_in), BUF(const int, this_time),
                    BUF(const int, encoder), BUF(const int, cu_out), BUF(const int, batch_id),
                    BUF(ELEM, out), const struct GatherNextTokenArgs args) {
    BIND(const ELEM, hidden_states);
    BIND(const int, cu_in, this_time, encoder, cu_out, batch_id);
    BIND(ELEM, out);
    const ulong token_num = args.token_num, hidden = args.hidden;
    const uint real_bsz = args.real_bsz, s = args.max_step_tokens, out_rows = args.rows;
    FOR_CLUSTER_ROWS(t, out_rows) {
        long src = -1;
        if (args.is_speculative != 0u) {
            int b = batch_id[t];
            if (b >= 0 && (uint)b < real_bsz) {
                long k = (long)t - (long)cu_out[b];
                int tt = this_time[b], enc = encoder[b];
                if (k >= 0 && k < (long)slot_output_rows(tt, enc, s)) {
                    if (enc > 0) src = packed_row(cu_in, (uint)b, (long)tt - 1, token_num);
                    else src = packed_row(cu_in, (uint)b, k, token_num);
                }
            }
        } else if (t < real_bsz && slot_output_rows(this_time[t], encoder[t], s) > 0u) {
            src = packed_row(cu_in, t, (long)this_time[t] - 1, token_num);
        }
        __global ELEM* dst = out + (ulong)t * hidden;
        if (src >= 0) {
            __global const ELEM* from = hidden_states + (ulong)src * hidden;
            for (ulong i = LID; i < hidden; i += CORES) dst[i] = from[i];
        } else {
            for (ulong i = LID; i < hidden; i += CORES) dst[i] = (ELEM)0;
        }
    }
}
