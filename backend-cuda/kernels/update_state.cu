// update_state (`docs/semantics.md` §5.9): the end of a step for every running slot: append the emitted
// tokens, advance step_idx and the seed (by 4 per emitted token), record the last token, set the
// stop flag and turn a prefill slot into a decode slot. One thread per slot; sums of untrusted
// lengths are computed in 64 bits and saturate at i32::MAX when stored. With `token_counts`
// (non-null), every appended token in [0, vocab) adds 1 to its slot's entry, saturating at
// i32::MAX (the counts process_logits reads, docs/semantics.md §4c).

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(update_state)(const UpdateStateArgs a) {
    const u32 b = blockIdx.x * SPECULA_BATCH_BLOCK + threadIdx.x;
    if (b >= a.real_bsz) return;
    if (a.stop_flags[b] != 0 || a.is_block_step[b] != 0) return;
    const u64 s = a.max_step_tokens;
    const u64 l = a.max_model_len;
    u64 n = len_or_zero(a.accept_num[b]);
    n = n < s ? n : s;
    if (n == 0) return;
    u64 prompt = len_or_zero(a.prompt_lens[b]);
    prompt = prompt < l ? prompt : l;
    const u64 step = len_or_zero(a.step_idx[b]);
    // Room left in the history row; may be <= 0 when step_idx is already past it.
    const i64 room = (i64)l - (i64)prompt - (i64)step;
    bool stop = false;
    if ((i64)n > room) {
        n = room > 0 ? (u64)room : 0;
        stop = true;
    }
    a.accept_num[b] = (i32)n;
    if (n == 0) {
        a.stop_flags[b] = 1;
        return;
    }
    const i32* tokens = a.accept_tokens + (u64)b * s;
    // prompt + step + n <= max_model_len by the room clamp: the window is inside row b.
    i32* dst = a.token_ids_all + (u64)b * l + prompt + step;
    for (u64 k = 0; k < n; ++k) dst[k] = tokens[k];
    if (a.token_counts != 0) {
        i32* counts = a.token_counts + (u64)b * a.vocab;
        for (u64 k = 0; k < n; ++k) {
            const i32 t = tokens[k];
            if (t >= 0 && (u64)t < a.vocab && counts[t] != SPECULA_I32_MAX) counts[t] += 1;
        }
    }
    const i32 new_step = clamp_i32((i64)step + (i64)n);
    a.step_idx[b] = new_step;
    a.infer_seed[b] = row_seed(a.infer_seed[b], n);
    const i32 last = tokens[n - 1];
    a.draft_tokens[(u64)b * s] = last;
    bool is_end = false;
    for (u64 e = 0; e < a.n_end; ++e) is_end = is_end || a.end_tokens[e] == last;
    if (is_end || new_step >= a.max_dec_len[b]) stop = true;
    if (stop) a.stop_flags[b] = 1;
    if (a.encoder[b] > 0) {
        a.decoder[b] = clamp_i32((i64)a.decoder[b] + (i64)a.encoder[b]);
        a.encoder[b] = 0;
    } else {
        a.decoder[b] = clamp_i32((i64)a.decoder[b] + (i64)n);
    }
}
