// verify_draft_tokens (contract §4.5).
//
// `verify_draft_tokens_i32`: one invocation per slot walks phase 1 and phase 2 with the stop
// rules. GREEDY / TARGET_MATCH compare with the target tokens, TOPP with the candidates (its
// phase-2 draw is an exact limb computation over at most C weights).
//
// REJECTION runs before it: the target rows are sampled by `top_k_top_p_sample` (which also
// records each row's kept set and total weight), then `verify_draft_tokens_pair_<dtype>` tests
// every (draft row, target row) pair with one workgroup (an id outside [0, V) weighs 0 in both
// rows, so it is rejected and corrected from the residual like any other draft): the acceptance test
// `U · wq[d] · Wp < 2^32 · wp[d] · Wq` in 128-bit limbs, and on rejection the residual draw by a
// chunked prefix scan. The slot walk then reads the pair results.

// `struct VerifyDraftTokensArgs` is generated from its `kernel_args!` declaration in src/ops/verify_draft_tokens.rs.

const STRATEGY_GREEDY: u32 = 0u;
const STRATEGY_TARGET_MATCH: u32 = 1u;
const STRATEGY_TOPP: u32 = 2u;
const STRATEGY_REJECTION: u32 = 3u;

const PAIR_ACCEPTED: u32 = 1u;
const PAIR_REJECTED: u32 = 2u;
const PAIR_RESAMPLE_TARGET: u32 = 3u;

@group(0) @binding(0) var<uniform> p: VerifyDraftTokensArgs;
@group(0) @binding(1) var<storage, read> draft_tokens: array<i32>;
@group(0) @binding(2) var<storage, read> this_time: array<i32>;
@group(0) @binding(3) var<storage, read> encoder: array<i32>;
@group(0) @binding(4) var<storage, read> cu_out: array<i32>;
@group(0) @binding(5) var<storage, read> stop_flags: array<u32>;
@group(0) @binding(6) var<storage, read> is_block: array<u32>;
@group(0) @binding(7) var<storage, read> reasoning: array<i32>;
@group(0) @binding(8) var<storage, read> step_idx: array<i32>;
@group(0) @binding(9) var<storage, read> max_dec_len: array<i32>;
@group(0) @binding(10) var<storage, read> end_tokens: array<i32>;
@group(0) @binding(11) var<storage, read> seeds: array<u32>;
@group(0) @binding(12) var<storage, read> targets: array<i32>;
@group(0) @binding(13) var<storage, read> cand_ids: array<i32>;
@group(0) @binding(14) var<storage, read> cand_scores: array<u32>;
@group(0) @binding(15) var<storage, read> cand_lens: array<i32>;
@group(0) @binding(16) var<storage, read> pairs: array<u32>;
@group(0) @binding(17) var<storage, read_write> accept_tokens: array<i32>;
@group(0) @binding(18) var<storage, read_write> accept_num: array<i32>;

var<private> e_len: u32;
var<private> e_count: u32;
var<private> e_max_dec_len: i32;
var<private> e_stopped: bool;
var<private> e_out: u32;

fn is_end_token(token: i32) -> bool {
    for (var e = 0u; e < p.end_count; e++) {
        if end_tokens[p.end_tokens_off + e] == token {
            return true;
        }
    }
    return false;
}

fn emit(token: i32) {
    e_count = e_count + 1u;
    var t = token;
    if is_end_token(token) {
        e_stopped = true;
    } else if e_max_dec_len < 0 || e_count >= u32(e_max_dec_len) {
        e_stopped = true;
        t = end_tokens[p.end_tokens_off];
    }
    accept_tokens[e_out + e_len] = t;
    e_len = e_len + 1u;
}

fn in_vocab(token: i32) -> bool {
    return token >= 0 && u32(token) < p.vocab;
}

/// The output row `base + i`, or NO_ROW (0xffffffff) when it is outside [0, rows).
fn out_row(base: i32, i: u32) -> u32 {
    return row_at(base, i, p.rows);
}

fn target_token(row: u32) -> i32 {
    if row == NO_ROW {
        return -1;
    }
    return targets[p.targets_off + row];
}

fn candidate_len(row: u32) -> u32 {
    return min(len_or_zero(cand_lens[p.cand_lens_off + row]), p.candidates);
}

/// The phase-2 token of a row (-1 when the row does not exist).
fn phase2(row: u32) -> i32 {
    if row == NO_ROW {
        return -1;
    }
    if p.strategy == STRATEGY_TOPP {
        let c = p.candidates;
        let n = candidate_len(row);
        let at = row * c;
        var total = vec2<u32>(0u);
        for (var k = 0u; k < n; k++) {
            total = add64(total, key_weight(rank_key(cand_scores[p.cand_scores_off + at + k])));
        }
        if is_zero64(total) {
            return cand_ids[p.cand_ids_off + at];
        }
        let s = p.seeds_off + 2u * row;
        let t = scale_draw(draw(vec2<u32>(seeds[s], seeds[s + 1u]), PURPOSE_CANDIDATE), total);
        var cum = vec2<u32>(0u);
        for (var k = 0u; k < n; k++) {
            cum = add64(cum, key_weight(rank_key(cand_scores[p.cand_scores_off + at + k])));
            if lt64(t, cum) {
                return cand_ids[p.cand_ids_off + at + k];
            }
        }
        return cand_ids[p.cand_ids_off + at];
    }
    // GREEDY and TARGET_MATCH: the target token; REJECTION: the row sampled as 4.3.
    return target_token(row);
}

@compute @workgroup_size(SLOT_WG)
fn verify_draft_tokens_i32(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    if b >= p.max_bsz {
        return;
    }
    let s = p.step_tokens;
    e_out = p.accept_tokens_off + b * s;
    for (var k = 0u; k < s; k++) {
        accept_tokens[e_out + k] = -1;
    }
    let stop_byte = byte_of(stop_flags[(p.stop_flags_off + b) >> 2u], p.stop_flags_off + b);
    let block_byte = byte_of(is_block[(p.is_block_off + b) >> 2u], p.is_block_off + b);
    if b >= p.real_bsz || stop_byte != 0u || block_byte != 0u {
        accept_num[p.accept_num_off + b] = 0;
        return;
    }
    let n = min(len_or_zero(this_time[p.this_time_off + b]), s);
    if n == 0u {
        accept_num[p.accept_num_off + b] = 0;
        return;
    }
    let base = cu_out[p.cu_out_off + b];
    e_len = 0u;
    e_count = len_or_zero(step_idx[p.step_idx_off + b]);
    e_max_dec_len = max_dec_len[p.max_dec_len_off + b];
    e_stopped = false;
    let skip_phase1 = encoder[p.encoder_off + b] > 0 || reasoning[p.reasoning_off + b] == 1 || p.reject_all != 0u;
    var i = 0u;
    var has_correction = false;
    var correction = 0;
    if !skip_phase1 {
        loop {
            if i + 1u >= n {
                break;
            }
            let d = draft_tokens[p.draft_tokens_off + b * s + i + 1u];
            let row = out_row(base, i);
            var accepted = false;
            if p.accept_all != 0u && in_vocab(d) {
                accepted = true;
            } else if p.strategy == STRATEGY_REJECTION {
                // Tested by the pair kernel; an id outside [0, V) weighs 0 in both rows and is
                // rejected like any other draft (accept_all accepts only ids in [0, V)).
                if row != NO_ROW {
                    let j = 2u * (b * (s - 1u) + i);
                    let status = pairs[j];
                    if status == PAIR_ACCEPTED {
                        accepted = true;
                    } else if status == PAIR_REJECTED {
                        has_correction = true;
                        correction = bitcast<i32>(pairs[j + 1u]);
                    } else {
                        has_correction = true;
                        correction = target_token(row);
                    }
                }
            } else if !in_vocab(d) {
                accepted = false;
            } else if p.strategy == STRATEGY_TOPP {
                if row != NO_ROW {
                    let len = candidate_len(row);
                    for (var k = 0u; k < len; k++) {
                        if cand_ids[p.cand_ids_off + row * p.candidates + k] == d {
                            accepted = true;
                            break;
                        }
                    }
                }
            } else {
                accepted = d == target_token(row);
            }
            if !accepted {
                break;
            }
            emit(d);
            if e_stopped {
                accept_num[p.accept_num_off + b] = i32(e_len);
                return;
            }
            i = i + 1u;
        }
    }
    var token = correction;
    if !has_correction {
        token = phase2(out_row(base, i));
    }
    if !in_vocab(token) {
        token = end_tokens[p.end_tokens_off];
    }
    emit(token);
    accept_num[p.accept_num_off + b] = i32(e_len);
}

// ---- REJECTION pairs ----------------------------------------------------------------------------

// `struct VerifyDraftTokensPairArgs` is generated from its `kernel_args!` declaration in src/ops/verify_draft_tokens.rs.

@group(0) @binding(20) var<uniform> pp: VerifyDraftTokensPairArgs;
// target_probs [rows, vocab]
@group(0) @binding(21) var<storage, read> row_words: array<u32>;
@group(0) @binding(22) var<storage, read> draft_probs: array<u32>;
@group(0) @binding(23) var<storage, read> pair_draft_tokens: array<i32>;
@group(0) @binding(24) var<storage, read> pair_this_time: array<i32>;
@group(0) @binding(25) var<storage, read> pair_cu_out: array<i32>;
@group(0) @binding(26) var<storage, read> pair_seeds: array<u32>;
@group(0) @binding(27) var<storage, read> kept_aux: array<u32>;
@group(0) @binding(28) var<storage, read_write> pairs_out: array<u32>;

struct Pair {
    is_active: u32,
    row: u32,
    draft: u32,
    found: u32,
    key: u32,
    take: u32,
    seed: vec2<u32>,
    kept_mass: vec2<u32>,
    total: vec2<u32>,
}

var<private> g_qbase: u32;
var<workgroup> wg_pair: Pair;
var<workgroup> wg_decision: vec2<u32>;

fn row_key(i: u32) -> u32 {
    return rank_key(row_bits(i));
}

fn q_key(i: u32) -> u32 {
    let e = g_qbase + i;
    let dt = pp.draft_dtype;
    return rank_key(widen_bits(draft_probs[word_of(e, dt)], e, dt));
}

/// Records the test of draft row `j`: its status (`PAIR_*`) and token.
fn post_pair(j: u32, status: u32, token: u32) {
    pairs_out[2u * j] = status;
    pairs_out[2u * j + 1u] = token;
}

/// `floor(max(0, wp·Wq − wq·Wp) / 2^41)`.
fn residual(wp: vec2<u32>, wq: vec2<u32>, wq_total: vec2<u32>, wp_total: vec2<u32>) -> vec2<u32> {
    let a = mul64x64(wp, wq_total);
    let b = mul64x64(wq, wp_total);
    if lt128(a, b) {
        return vec2<u32>(0u);
    }
    let d = sub128(a, b);
    return vec2<u32>((d.y >> 9u) | (d.z << 23u), (d.z >> 9u) | (d.w << 23u));
}

// Entry points `verify_draft_tokens_pair_<dtype>` (generated, kernels.rs).
fn verify_draft_tokens_pair_main(g: u32, lid: u32, dt: u32) {
    if g >= pp.pairs_in_dispatch {
        return;
    }
    let j = pp.draft_row_lo + g;
    let s = pp.step_tokens;
    let vocab = pp.vocab;
    if lid == 0u {
        var pr = Pair(0u, 0u, 0u, 0u, 0u, 0u, vec2<u32>(0u), vec2<u32>(0u), vec2<u32>(0u));
        if s > 1u {
            let b = j / (s - 1u);
            let i = j % (s - 1u);
            if b < pp.real_bsz {
                let n = min(len_or_zero(pair_this_time[pp.this_time_off + b]), s);
                let r = row_at(pair_cu_out[pp.cu_out_off + b], i, pp.rows);
                if i + 1u < n && r != NO_ROW {
                    // An id outside [0, V) (also negative, as u32) weighs 0 in both rows and is
                    // tested like any other; accept_all accepts the ids in [0, V) untested.
                    let d = bitcast<u32>(pair_draft_tokens[pp.draft_tokens_off + b * s + i + 1u]);
                    let tested = pp.accept_all == 0u || d >= vocab;
                    if r >= pp.target_row_lo && r < pp.target_row_hi && tested {
                        let a = 8u * r;
                        let sd = pp.seeds_off + 2u * r;
                        pr = Pair(1u, r, d, kept_aux[a], kept_aux[a + 1u], kept_aux[a + 2u],
                            vec2<u32>(pair_seeds[sd], pair_seeds[sd + 1u]),
                            vec2<u32>(kept_aux[a + 3u], kept_aux[a + 4u]),
                            vec2<u32>(kept_aux[a + 5u], kept_aux[a + 6u]));
                    }
                }
            }
        }
        wg_pair = pr;
    }
    let pr = workgroupUniformLoad(&wg_pair);
    if pr.is_active == 0u {
        return;
    }
    begin_row(dt, pp.target_off + (pr.row - pp.target_row_lo) * vocab);
    g_qbase = pp.draft_off + g * vocab;
    let limit = vec2<u32>(REJECTION_MAX_TOTAL_WEIGHT_LO, REJECTION_MAX_TOTAL_WEIGHT_HI);
    // The draft row's total weight.
    var wq_part = vec2<u32>(0u);
    for (var i = lid; i < vocab; i += WG) {
        wq_part = add64(wq_part, key_weight(q_key(i)));
    }
    let wq_total = wg_sum64(lid, wq_part);
    if ge64(pr.total, limit) || ge64(wq_total, limit) || pr.found == 0u {
        if lid == 0u {
            post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
        }
        return;
    }
    let sel = Sel(pr.key, pr.take, 0u, 1u, pr.kept_mass);
    let base = eq_base(lid, vocab, sel);
    let r = chunk_range(lid, vocab);
    // The weight of the draft token within the kept set, by the thread whose chunk holds it. An
    // id outside [0, V) is in no chunk: wq[d] = wp[d] = 0, so it is rejected.
    if lid == 0u && pr.draft >= vocab {
        wg_decision = vec2<u32>(0u);
    }
    if pr.draft >= r.x && pr.draft < r.y {
        let d = pr.draft;
        let kd = row_key(d);
        var wp_d = vec2<u32>(0u);
        if kd > sel.key {
            wp_d = key_weight(kd);
        } else if kd == sel.key {
            var before = base;
            for (var i = r.x; i < d; i++) {
                if row_key(i) == kd {
                    before = before + 1u;
                }
            }
            if before < sel.take {
                wp_d = key_weight(kd);
            }
        }
        let wq_d = key_weight(q_key(d));
        let u = draw(pr.seed, PURPOSE_ACCEPT).y;
        var accepted = false;
        if is_zero64(wq_d) {
            accepted = !is_zero64(wp_d);
        } else {
            let lhs = mul128x32(mul64x64(wq_d, pr.kept_mass), u);
            let x = mul64x64(wp_d, wq_total);
            let rhs = vec4<u32>(0u, x.x, x.y, x.z);
            accepted = lt128(lhs, rhs);
        }
        wg_decision = vec2<u32>(select(0u, 1u, accepted), 0u);
    }
    let decision = workgroupUniformLoad(&wg_decision);
    if decision.x == 1u {
        if lid == 0u {
            post_pair(j, PAIR_ACCEPTED, pr.draft);
        }
        return;
    }
    // Residual sample in ascending id order over the kept set.
    var seen = base;
    var m = vec2<u32>(0u);
    for (var i = r.x; i < r.y; i++) {
        let k = row_key(i);
        if admit(k, sel, 0u, &seen) {
            m = add64(m, residual(key_weight(k), key_weight(q_key(i)), wq_total, pr.kept_mass));
        }
    }
    let total = wg_sum64(lid, m);
    if is_zero64(total) {
        if lid == 0u {
            post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
        }
        return;
    }
    let t = scale_draw(draw(pr.seed, PURPOSE_RESIDUAL), total);
    let crossing = wg_crossing(lid, m, t);
    if lid == crossing.thread {
        var cum = crossing.before;
        var seen2 = base;
        for (var i = r.x; i < r.y; i++) {
            let k = row_key(i);
            if admit(k, sel, 0u, &seen2) {
                cum = add64(cum, residual(key_weight(k), key_weight(q_key(i)), wq_total, pr.kept_mass));
                if lt64(t, cum) {
                    s_state.result = i;
                    break;
                }
            }
        }
    }
    let result = wg_result();
    if lid == 0u {
        if result == 0xffffffffu {
            post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
        } else {
            post_pair(j, PAIR_REJECTED, result);
        }
    }
}
