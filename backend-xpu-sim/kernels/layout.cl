// build_output_layout and build_sampling_params (contract 1, 2).
//
// Batch ops. build_output_layout runs on cluster 0 only (the `if (cluster_id() != 0) return;` of
// XPU batch kernels): each core takes a contiguous slice of slots and sums its packed inputs and
// output rows, core 0 scans the partials (64-bit, clamped to i32::MAX when stored), then every core
// writes its slots' offsets and batch ids and a share of the padding rows.
// build_sampling_params is one output row per core across every cluster.

inline uint slot_output_rows(int this_time, int encoder, uint s) {
    if (this_time <= 0) return 0u;
    if (encoder > 0) return 1u;
    return min((uint)this_time, s);
}

inline int clamp_i32_from_u64(ulong v) { return v > 2147483647ul ? 2147483647 : (int)v; }

__kernel void build_output_layout_i32(BUF(const int, this_time), BUF(const int, encoder),
                                      BUF(int, seq_lens_output), BUF(int, cu_seqlens_q),
                                      BUF(int, cu_seqlens_q_output), BUF(int, batch_id),
                                      const uint max_bsz, const uint real_bsz, const uint s,
                                      const uint cap) {
    BIND(const int, this_time);
    BIND(const int, encoder);
    BIND(int, seq_lens_output);
    BIND(int, cu_seqlens_q);
    BIND(int, cu_seqlens_q_output);
    BIND(int, batch_id);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
    if (GRP != 0u) return;
    for (uint b = LID; b < max_bsz; b += CORES) {
        seq_lens_output[b] = b < real_bsz ? (int)slot_output_rows(this_time[b], encoder[b], s) : 0;
    }
    uint lo, hi;
    core_slice(real_bsz, &lo, &hi);
    ulong in_sum = 0ul, out_sum = 0ul;
    for (uint b = lo; b < hi; b++) {
        in_sum += (ulong)max(this_time[b], 0);
        out_sum += (ulong)slot_output_rows(this_time[b], encoder[b], s);
    }
    S->part_mass[LID] = in_sum;
    S->part_mass2[LID] = out_sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (LID == 0u) {
        ulong a = 0ul, o = 0ul;
        for (uint c = 0; c < CORES; c++) {
            ulong x = S->part_mass[c], y = S->part_mass2[c];
            S->part_mass[c] = a;
            S->part_mass2[c] = o;
            a += x;
            o += y;
        }
        S->bc_u64[1] = o;
        cu_seqlens_q[0] = 0;
        cu_seqlens_q_output[0] = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ulong a = S->part_mass[LID], o = S->part_mass2[LID];
    ulong t_out = S->bc_u64[1];
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

// The slot and position of output row t, or -1 (padding / unresolvable): the one rule every batch op
// uses (b = batch_id[t] must be a described slot, k = t - cu_seqlens_q_output[b] one of its rows).
inline int row_source(uint t, __global const int* batch_id, __global const int* cu_out,
                      __global const int* this_time, __global const int* encoder, uint real_bsz,
                      uint s, uint* pos) {
    int b = batch_id[t];
    if (b < 0 || (uint)b >= real_bsz) return -1;
    long k = (long)t - (long)cu_out[b];
    if (k < 0 || k >= (long)slot_output_rows(this_time[b], encoder[b], s)) return -1;
    *pos = (uint)k;
    return b;
}

__kernel void build_sampling_params_i32(BUF(const uint, slot_top_p), BUF(const int, slot_top_k),
                                        BUF(const uint, slot_temperature),
                                        BUF(const ulong, slot_seed), BUF(const int, this_time),
                                        BUF(const int, encoder), BUF(const int, cu_out),
                                        BUF(const int, batch_id), BUF(uint, top_p),
                                        BUF(int, top_k), BUF(uint, temperature),
                                        BUF(ulong, seed), const uint real_bsz, const uint s,
                                        const uint rows) {
    BIND(const uint, slot_top_p);
    BIND(const int, slot_top_k);
    BIND(const uint, slot_temperature);
    BIND(const ulong, slot_seed);
    BIND(const int, this_time);
    BIND(const int, encoder);
    BIND(const int, cu_out);
    BIND(const int, batch_id);
    BIND(uint, top_p);
    BIND(int, top_k);
    BIND(uint, temperature);
    BIND(ulong, seed);
    // top_p and temperature are copied as bit patterns (uint views): no float is touched here.
    for (uint t = GRP * CORES + LID; t < rows; t += NGRP * CORES) {
        uint pos = 0u;
        int b = row_source(t, batch_id, cu_out, this_time, encoder, real_bsz, s, &pos);
        if (b >= 0) {
            top_p[t] = slot_top_p[b];
            top_k[t] = slot_top_k[b];
            temperature[t] = slot_temperature[b];
            seed[t] = row_seed(slot_seed[b], (ulong)pos);
        } else {
            top_p[t] = ONE_KEY;
            top_k[t] = 0;
            temperature[t] = ONE_KEY;
            seed[t] = 0ul;
        }
    }
}
