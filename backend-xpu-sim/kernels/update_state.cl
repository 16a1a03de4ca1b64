// update_state (§5.9): per-slot bookkeeping, one slot per core across every cluster (slots
// are independent; the work per slot is at most S tokens). With token counts (has_counts), each
// appended token in [0, V) adds 1, saturating at INT_MAX, to the slot's entry of token_counts.

// struct UpdateStateArgs: generated from src/ops/update_state.rs.

inline int clamp_i32_from_i64(long v) {
    return v > 2147483647l ? 2147483647 : (v < -2147483648l ? (int)0x80000000u : (int)v);
}

__kernel void update_state_i32(BUF(const int, accept_tokens), BUF(const uchar, is_block_step),
                               BUF(const int, prompt_lens), BUF(const int, max_dec_len),
                               BUF(const int, end_tokens), BUF(int, accept_num),
                               BUF(uchar, stop_flags), BUF(int, token_ids_all), BUF(int, step_idx),
                               BUF(ulong, infer_seed), BUF(int, draft_tokens),
                               BUF(int, seq_lens_encoder), BUF(int, seq_lens_decoder),
                               BUF(int, token_counts), const struct UpdateStateArgs args) {
    BIND(const int, accept_tokens, prompt_lens, max_dec_len, end_tokens);
    BIND(const uchar, is_block_step);
    BIND(int, accept_num, token_ids_all, step_idx, draft_tokens);
    BIND(int, seq_lens_encoder, seq_lens_decoder, token_counts);
    BIND(uchar, stop_flags);
    BIND(ulong, infer_seed);
    const uint real_bsz = args.real_bsz, s = args.max_step_tokens, num_end = args.num_end;
    const uint has_counts = args.has_counts, V = args.vocab;
    const ulong max_model_len = args.max_model_len;
    FOR_EVERY_CORE(b, real_bsz) {
        if (stop_flags[b] != 0 || is_block_step[b] != 0) continue;
        ulong n = (ulong)min((uint)max(accept_num[b], 0), s);
        if (n == 0ul) continue;
        ulong prompt = min((ulong)max(prompt_lens[b], 0), max_model_len);
        ulong step = (ulong)max(step_idx[b], 0);
        long room = (long)max_model_len - (long)prompt - (long)step;
        bool stop = false;
        if ((long)n > room) {
            n = room > 0 ? (ulong)room : 0ul;
            stop = true;
        }
        accept_num[b] = (int)n;
        if (n == 0ul) {
            stop_flags[b] = 1;
            continue;
        }
        __global const int* tokens = accept_tokens + (ulong)b * s;
        ulong start = (ulong)b * max_model_len + prompt + step;
        for (ulong i = 0; i < n; i++) token_ids_all[start + i] = tokens[i];
        for (ulong i = 0; i < n && has_counts != 0u; i++) {
            int t = tokens[i];
            if (t < 0 || (uint)t >= V) continue;
            __global int* c = token_counts + (ulong)b * V + (uint)t;
            if (*c != 2147483647) *c += 1;
        }
        int new_step = clamp_i32_from_i64((long)step + (long)n);
        step_idx[b] = new_step;
        infer_seed[b] = row_seed(infer_seed[b], n);
        int last = tokens[n - 1];
        draft_tokens[(ulong)b * s] = last;
        bool is_end = false;
        for (uint e = 0; e < num_end; e++) is_end = is_end || end_tokens[e] == last;
        if (is_end || new_step >= max_dec_len[b]) stop = true;
        if (stop) stop_flags[b] = 1;
        int enc = seq_lens_encoder[b];
        if (enc > 0) {
            seq_lens_decoder[b] = clamp_i32_from_i64((long)seq_lens_decoder[b] + (long)enc);
            seq_lens_encoder[b] = 0;
        } else {
            seq_lens_decoder[b] = clamp_i32_from_i64((long)seq_lens_decoder[b] + (long)n);
        }
    }
}
