// build_sampling_params (§3, §5.3): one output row per core across every cluster.

// struct BuildSamplingParamsArgs: generated from src/ops/build_sampling_params.rs.

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
                                        BUF(ulong, seed),
                                        const struct BuildSamplingParamsArgs args) {
    BIND(const uint, slot_top_p, slot_temperature);
    BIND(const int, slot_top_k, this_time, encoder, cu_out, batch_id);
    BIND(const ulong, slot_seed);
    BIND(uint, top_p, temperature);
    BIND(int, top_k);
    BIND(ulong, seed);
    const uint real_bsz = args.real_bsz, s = args.max_step_tokens, rows = args.rows;
    // top_p and temperature are copied as bit patterns (uint views): no float is touched here.
    FOR_EVERY_CORE(t, rows) {
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
