// ngram_match (`docs/semantics.md` §5.10): the n-gram draft proposer.
//
// `ngram_match_propose`: one block per live slot searches, for n from max_ngram_size down to
// min_ngram_size, the leftmost occurrence of the last n generated tokens first in the prompt,
// then in the generated history (excluding the trivial self-match); the block's threads test
// start positions in parallel and keep the leftmost match. The proposal (a range of the slot's
// history row) and the slot's kind are written to a scratch array.
// `ngram_match`: one block grants the global budget in ascending slot order (one thread, a few
// integer operations per slot), then all threads copy the granted drafts.

// The leftmost start in [0, count) where row[start .. start + n) equals pattern, or U32_MAX.
__device__ u32 leftmost_match(const i32* row, u64 count, const i32* pattern, u32 n, u32* best) {
    if (threadIdx.x == 0) *best = SPECULA_U32_MAX;
    __syncthreads();
    for (u64 i = threadIdx.x; i < count; i += SPECULA_BATCH_BLOCK) {
        if (i >= *best) break;  // a smaller match is already known (a stale read only costs time)
        bool equal = true;
        for (u32 k = 0; k < n && equal; ++k) equal = row[i + k] == pattern[k];
        if (equal) atomicMin(best, (u32)i);
    }
    __syncthreads();
    const u32 r = *best;
    __syncthreads();
    return r;
}

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(ngram_match_propose)(const NgramArgs a) {
    __shared__ u32 best;
    const u32 b = blockIdx.x;
    if (b >= a.real_bsz) return;
    const u64 l = a.max_model_len;
    // The layout's decode kind, on the incoming lengths: this_time > 0 and no prefill.
    const bool decode = a.this_time[b] > 0 && a.encoder[b] <= 0;
    u64 start = 0, len = 0;
    if (decode) {
        const i32* row = a.token_ids_all + (u64)b * l;
        u64 prompt = len_or_zero(a.prompt_lens[b]);
        prompt = prompt < l ? prompt : l;
        u64 step = len_or_zero(a.step_idx[b]);
        step = step < l - prompt ? step : l - prompt;
        const i64 dec_left = (i64)a.max_dec_len[b] - (i64)step - 1;
        u64 budget = len_or_zero(a.draft_token_num[b]);
        budget = budget < a.max_step_tokens - 1 ? budget : a.max_step_tokens - 1;
        budget = budget < (u64)(dec_left > 0 ? dec_left : 0) ? budget : (u64)(dec_left > 0 ? dec_left : 0);
        const i32* generated = row + prompt;
        if (budget > 0 && step > 0) {
            const u32 top = (u64)a.max_ngram < step ? a.max_ngram : (u32)step;
            for (u32 n = top; n >= a.min_ngram && n >= 1; --n) {
                const i32* pattern = generated + (step - n);
                // Prompt: the leftmost occurrence wins if a token follows it.
                if (prompt >= n) {
                    const u32 i = leftmost_match(row, prompt - n + 1, pattern, n, &best);
                    if (i != SPECULA_U32_MAX && (u64)i + n < prompt) {
                        start = i + n;
                        const u64 end = start + budget < prompt ? start + budget : prompt;
                        len = end - start;
                        break;
                    }
                }
                // History, ending before the pattern itself: windows of generated[0 .. step - 1).
                if (step - 1 >= n) {
                    const u32 q = leftmost_match(generated, step - 1 - n + 1, pattern, n, &best);
                    if (q != SPECULA_U32_MAX) {
                        start = prompt + q + n;
                        const u64 end = start + budget < prompt + step ? start + budget : prompt + step;
                        len = end - start;
                        break;
                    }
                }
            }
        }
    }
    if (threadIdx.x == 0) {
        a.proposals[2 * b] = start;
        a.proposals[2 * b + 1] = len | ((decode ? 1ull : 0ull) << 32);
    }
}

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK) SPECULA_ENTRY(ngram_match)(const NgramArgs a) {
    if (threadIdx.x == 0) {
        // Every prefill token and one token per decode slot are fed regardless; drafts share
        // the rest. Computed on the incoming lengths, before any is rewritten.
        u64 mandatory = 0;
        for (u32 b = 0; b < a.real_bsz; ++b) {
            const bool decode = (a.proposals[2 * b + 1] >> 32) != 0;
            if (a.encoder[b] > 0) mandatory += len_or_zero(a.this_time[b]);
            else if (decode) mandatory += 1;
        }
        u64 remaining = a.threshold > mandatory ? a.threshold - mandatory : 0;
        for (u32 b = 0; b < a.real_bsz; ++b) {
            const u64 packed = a.proposals[2 * b + 1];
            if ((packed >> 32) == 0) continue;
            const u64 len = packed & 0xffffffffull;
            const u64 give = len < remaining ? len : remaining;
            remaining -= give;
            a.proposals[2 * b + 1] = give | (1ull << 32);
        }
    }
    __syncthreads();
    for (u32 b = 0; b < a.real_bsz; ++b) {
        const u64 packed = a.proposals[2 * b + 1];
        if ((packed >> 32) == 0) continue;
        const u64 give = packed & 0xffffffffull;
        const i32* src = a.token_ids_all + (u64)b * a.max_model_len + a.proposals[2 * b];
        i32* dst = a.draft_tokens + (u64)b * a.max_step_tokens + 1;
        // give <= S - 1, so the drafts fit in positions 1 .. S of the slot.
        for (u64 k = threadIdx.x; k < give; k += SPECULA_BATCH_BLOCK) dst[k] = src[k];
        if (threadIdx.x == 0) a.this_time[b] = (i32)(1 + give);
    }
}
