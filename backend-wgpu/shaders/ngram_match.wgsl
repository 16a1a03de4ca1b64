// ngram_match (`docs/semantics.md` §5.10). `ngram_match_i32`: one workgroup per slot searches, for n from
// max_ngram_size down, the leftmost occurrence of the last n generated tokens in the prompt and
// then in the history (the threads test candidate positions in parallel and keep the minimum with
// an atomic), and records the drafts it proposes. `ngram_match_budget_i32` (one invocation) then
// grants the global token budget in ascending slot order and writes the drafts.

// `struct NgramMatchArgs` is generated from its `kernel_args!` declaration in src/ops/ngram_match.rs.

@group(0) @binding(0) var<uniform> p: NgramMatchArgs;
@group(0) @binding(1) var<storage, read> token_ids_all: array<i32>;
@group(0) @binding(2) var<storage, read> prompt_lens: array<i32>;
@group(0) @binding(3) var<storage, read> step_idx: array<i32>;
@group(0) @binding(4) var<storage, read> draft_token_num: array<i32>;
@group(0) @binding(5) var<storage, read> encoder: array<i32>;
@group(0) @binding(6) var<storage, read> max_dec_len: array<i32>;
@group(0) @binding(7) var<storage, read> this_time_in: array<i32>;
// Per slot: decode flag, first draft (index into the slot's row), number of drafts.
@group(0) @binding(8) var<storage, read_write> proposals: array<u32>;

// decode, prompt_len, step, budget
var<workgroup> wg_slot: vec4<u32>;
var<workgroup> wg_best: atomic<u32>;
var<workgroup> wg_best_copy: u32;

fn tok(b: u32, i: u32) -> i32 {
    return token_ids_all[p.token_ids_all_off + b * p.max_model_len + i];
}

/// Whether the n tokens of slot b's row at `at` equal those at `pattern`.
fn matches(b: u32, at: u32, pattern: u32, n: u32) -> bool {
    for (var k = 0u; k < n; k++) {
        if tok(b, at + k) != tok(b, pattern + k) {
            return false;
        }
    }
    return true;
}

/// The leftmost start in [0, count) (row positions `offset + start`) matching the pattern
/// (uniform; 0xffffffff when none).
fn leftmost(lid: u32, b: u32, offset: u32, count: u32, pattern: u32, n: u32) -> u32 {
    if lid == 0u {
        atomicStore(&wg_best, 0xffffffffu);
    }
    workgroupBarrier();
    for (var i = lid; i < count; i += WG) {
        if i < atomicLoad(&wg_best) && matches(b, offset + i, pattern, n) {
            atomicMin(&wg_best, i);
        }
    }
    workgroupBarrier();
    if lid == 0u {
        wg_best_copy = atomicLoad(&wg_best);
    }
    return workgroupUniformLoad(&wg_best_copy);
}

@compute @workgroup_size(WG)
fn ngram_match_i32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.x;
    if b >= p.real_bsz {
        return;
    }
    let mml = p.max_model_len;
    if lid == 0u {
        let t = this_time_in[p.this_time_off + b];
        let e = encoder[p.encoder_off + b];
        var decode = 0u;
        var prompt_len = 0u;
        var step = 0u;
        var budget = 0u;
        if t > 0 && e <= 0 {
            decode = 1u;
            prompt_len = min(len_or_zero(prompt_lens[p.prompt_lens_off + b]), mml);
            step = min(len_or_zero(step_idx[p.step_idx_off + b]), mml - prompt_len);
            let mdl = max_dec_len[p.max_dec_len_off + b];
            // max(max_dec_len - step - 1, 0), without overflow.
            var dec_left = 0u;
            if mdl > 0 && u32(mdl) > step + 1u {
                dec_left = u32(mdl) - step - 1u;
            }
            budget = min(min(len_or_zero(draft_token_num[p.draft_token_num_off + b]), p.step_tokens - 1u), dec_left);
        }
        wg_slot = vec4<u32>(decode, prompt_len, step, budget);
    }
    let slot = workgroupUniformLoad(&wg_slot);
    var first = 0u;
    var count = 0u;
    if slot.x != 0u && slot.w != 0u {
        let pl = slot.y;
        let step = slot.z;
        let budget = slot.w;
        var n = min(p.max_ngram, step);
        loop {
            if n < p.min_ngram || n == 0u {
                break;
            }
            let pattern = pl + step - n;
            // Prompt: the leftmost occurrence, used when a token follows it.
            var positions = 0u;
            if pl >= n {
                positions = pl - n + 1u;
            }
            let i = leftmost(lid, b, 0u, positions, pattern, n);
            if i != 0xffffffffu && i + n < pl {
                first = i + n;
                count = min(budget, pl - first);
                break;
            }
            // History before the pattern itself: windows of gen[0 .. step - 1).
            var hpositions = 0u;
            if step >= n + 1u {
                hpositions = step - n;
            }
            let q = leftmost(lid, b, pl, hpositions, pattern, n);
            if q != 0xffffffffu {
                first = pl + q + n;
                count = min(budget, pl + step - first);
                break;
            }
            n = n - 1u;
        }
    }
    if lid == 0u {
        proposals[3u * b] = slot.x;
        proposals[3u * b + 1u] = first;
        proposals[3u * b + 2u] = count;
    }
}

// `struct NgramMatchBudgetArgs` is generated from its `kernel_args!` declaration in src/ops/ngram_match.rs.

@group(0) @binding(10) var<uniform> bp: NgramMatchBudgetArgs;
@group(0) @binding(11) var<storage, read> budget_token_ids_all: array<i32>;
@group(0) @binding(12) var<storage, read> budget_encoder: array<i32>;
@group(0) @binding(13) var<storage, read> budget_proposals: array<u32>;
@group(0) @binding(14) var<storage, read_write> this_time: array<i32>;
@group(0) @binding(15) var<storage, read_write> draft_tokens: array<i32>;

@compute @workgroup_size(1)
fn ngram_match_budget_i32() {
    // Exact 64-bit counts, as the host's usize: real_bsz < 2^32 slots of at most 2^31 - 1 tokens
    // each stay below 2^63.
    var mandatory = vec2<u32>(0u);
    for (var b = 0u; b < bp.real_bsz; b++) {
        if budget_encoder[bp.encoder_off + b] > 0 {
            mandatory = add64(mandatory, u64_from(len_or_zero(this_time[bp.this_time_off + b])));
        } else if budget_proposals[3u * b] != 0u {
            mandatory = add64(mandatory, u64_from(1u));
        }
    }
    let threshold = vec2<u32>(bp.threshold_lo, bp.threshold_hi);
    var left = vec2<u32>(0u);
    if lt64(mandatory, threshold) {
        left = sub64(threshold, mandatory);
    }
    let s = bp.step_tokens;
    for (var b = 0u; b < bp.real_bsz; b++) {
        if budget_proposals[3u * b] == 0u {
            continue;
        }
        let first = budget_proposals[3u * b + 1u];
        let count = budget_proposals[3u * b + 2u];
        // min(count, left): below count, left fits in its low word.
        let give = select(count, left.x, lt64(left, u64_from(count)));
        left = sub64(left, u64_from(give));
        for (var k = 0u; k < give; k++) {
            draft_tokens[bp.draft_tokens_off + b * s + 1u + k] =
                budget_token_ids_all[bp.token_ids_all_off + b * bp.max_model_len + first + k];
        }
        this_time[bp.this_time_off + b] = i32(1u + give);
    }
}
