// verify_draft_tokens (`docs/semantics.md` §5.8).
//
// `verify_draft_tokens_i32`: one invocation per slot walks phase 1 and phase 2 with the stop
// rules. GREEDY / TARGET_MATCH compare with the target tokens, TOPP with the candidates (its
// phase-2 draw is an exact limb computation over at most C weights).
//
// REJECTION runs before it: the target rows are sampled by `top_k_top_p_sample` (which also
// records each row's kept set and total weight), then `verify_draft_tokens_pair_<dtype>` tests
// every (draft row, target row) pair with one workgroup (an id outside [0, V) weighs 0 in both
// rows, so it is rejected and corrected from the residual like any other draft): the acceptance test
// `U · wq[d] · Wp < 2^32 · wp[d] · Wq` exactly in 160-bit limbs (the products reach 2^133 on logits
// rows), and on rejection the residual draw by a chunked prefix scan. The slot walk then reads the
// pair results. With `has_draft_index` the draft rows are compact (`docs/semantics.md` §5.8.1): the
// dispatch runs over every dense pair j = b·(S − 1) + i and reads the row the index names when it
// lies in the bound draft chunk; an entry outside [0, draft_rows) posts PAIR_RESAMPLE_TARGET
// (from the first draft chunk's dispatch). With `logits` both rows are logits, weighed by `docs/semantics.md` §4b at the temperature of
// the output row (the draft row from its own maximum).

// `struct VerifyDraftTokensArgs` is generated from its `kernel_args!` declaration in src/ops/verify_draft_tokens.rs.

// `STRATEGY_*`: generated from `strategy_code` in src/ops/verify_draft_tokens.rs.

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
// target rows [rows, vocab]: probabilities or logits
@group(0) @binding(21) var<storage, read> row_words: array<u32>;
@group(0) @binding(22) var<storage, read> draft_probs: array<u32>;
@group(0) @binding(23) var<storage, read> pair_draft_tokens: array<i32>;
@group(0) @binding(24) var<storage, read> pair_this_time: array<i32>;
@group(0) @binding(25) var<storage, read> pair_cu_out: array<i32>;
@group(0) @binding(26) var<storage, read> pair_seeds: array<u32>;
@group(0) @binding(27) var<storage, read> kept_aux: array<u32>;
@group(0) @binding(28) var<storage, read_write> pairs_out: array<u32>;
// logits rows: the temperature of each output row (f32 bits)
@group(0) @binding(29) var<storage, read> pair_temperature: array<u32>;
// compact draft rows: the row of each draft (`has_draft_index`)
@group(0) @binding(30) var<storage, read> pair_draft_index: array<i32>;

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
    // the draft row within the bound draft chunk
    qrow: u32,
}

var<private> g_qbase: u32;
/// How the tokens of the draft row weigh (by key for probability rows).
var<private> g_qweigh: Weigh;
var<workgroup> wg_pair: Pair;
var<workgroup> wg_decision: vec2<u32>;

fn row_key(i: u32) -> u32 {
    if pp.logits != 0u {
        return logit_row_key(g_weigh, row_bits(i), i);
    }
    return rank_key(row_bits(i));
}

/// The f32 bits of element `i` of the draft row.
fn q_bits(i: u32) -> u32 {
    let e = g_qbase + i;
    let dt = pp.draft_dtype;
    return widen_bits(draft_probs[word_of(e, dt)], e, dt);
}

fn q_key(i: u32) -> u32 {
    if pp.logits != 0u {
        return logit_row_key(g_qweigh, q_bits(i), i);
    }
    return rank_key(q_bits(i));
}

/// The weight of token `i` of the draft row.
fn q_weight(i: u32) -> vec2<u32> {
    return weigh_key(g_qweigh, q_key(i));
}

/// Steps 1-3 of `docs/semantics.md` §4b for the draft row, a logits row: its own maximum (a workgroup
/// reduction) at the temperature `t_bits` of the output row it is checked against. Sets
/// `g_qweigh` (the same on every invocation).
fn weigh_draft_row(lid: u32, vocab: u32, t_bits: u32) {
    var best = vec2<u32>(0u, 0xffffffffu);
    for (var i = lid; i < vocab; i += WG) {
        best = keep_larger(best, logit_rank_key(q_bits(i)), i);
    }
    g_qweigh = weigh_best(lid, best, t_bits);
}

/// The acceptance test with `u` = the high 32 bits of the ACCEPT draw:
/// `u · wq[d] · Wp < 2^32 · wp[d] · Wq`, exact (each product of two weights or totals is below
/// 2^100, the comparison reaches 2^133); if wq[d] == 0, accept iff wp[d] > 0.
fn accepts(u: u32, wp_d: vec2<u32>, wq_d: vec2<u32>, wp_total: vec2<u32>, wq_total: vec2<u32>) -> bool {
    if is_zero64(wq_d) {
        return !is_zero64(wp_d);
    }
    let lhs = mul128x32_full(mul64x64(wq_d, wp_total), u);
    let x = mul64x64(wp_d, wq_total);
    let rhs = U160(vec4<u32>(0u, x.x, x.y, x.z), x.w);
    return lt160(lhs, rhs);
}

/// Limb `i` of a 128-bit value (0 beyond the top).
fn limb128(a: vec4<u32>, i: u32) -> u32 {
    if i >= 4u {
        return 0u;
    }
    return a[i];
}

/// The low 64 bits of `floor(a / 2^s)`, s < 128.
fn shr128_low64(a: vec4<u32>, s: u32) -> vec2<u32> {
    let ws = s / 32u;
    let bs = s % 32u;
    var r = vec2<u32>(0u);
    for (var j = 0u; j < 2u; j++) {
        let lo = limb128(a, ws + j);
        if bs == 0u {
            r[j] = lo;
        } else {
            r[j] = (lo >> bs) | (limb128(a, ws + j + 1u) << (32u - bs));
        }
    }
    return r;
}

/// Records the test of draft row `j`: its status (`PAIR_*`) and token.
fn post_pair(j: u32, status: u32, token: u32) {
    pairs_out[2u * j] = status;
    pairs_out[2u * j + 1u] = token;
}

/// The residual `floor(max(0, wp·Wq − wq·Wp) / 2^shift)` (below 2^64 for the shifts of
/// `residual_shift`).
fn residual(wp: vec2<u32>, wq: vec2<u32>, wq_total: vec2<u32>, wp_total: vec2<u32>, shift: u32) -> vec2<u32> {
    let a = mul64x64(wp, wq_total);
    let b = mul64x64(wq, wp_total);
    if lt128(a, b) {
        return vec2<u32>(0u);
    }
    return shr128_low64(sub128(a, b), shift);
}

/// What the residual draw of a pair weighs its members against (set before the draw, the same on
/// every invocation): the draft row's kept weight `Wq`, the target's `Wp` and the scale.
struct Residual {
    wq_total: vec2<u32>,
    wp_total: vec2<u32>,
    shift: u32,
}

var<private> g_residual: Residual;

/// The weight of member `i` (key `k`) in the residual draw (draw.wgsl): its residual.
fn drawn_weight(i: u32, k: u32) -> vec2<u32> {
    let g = g_residual;
    return residual(weight_of(k), q_weight(i), g.wq_total, g.wp_total, g.shift);
}

/// The scale `k` of the residual: 41 for probability rows; for logits rows
/// `max(0, bitlength(Wp) + bitlength(Wq) − 60)`, so that the residual's total stays below 2^60.
fn residual_shift(wp_total: vec2<u32>, wq_total: vec2<u32>) -> u32 {
    if pp.logits == 0u {
        return 41u;
    }
    let bits = bit_length64(wp_total) + bit_length64(wq_total);
    if bits > 60u {
        return bits - 60u;
    }
    return 0u;
}

// Entry points `verify_draft_tokens_pair_<dtype>` (generated, kernels.rs; groups with work only).
fn verify_draft_tokens_pair_main(g: u32, lid: u32, dt: u32) {
    let j = pp.pair_lo + g;
    let s = pp.step_tokens;
    let vocab = pp.vocab;
    if lid == 0u {
        var pr = Pair(0u, 0u, 0u, 0u, 0u, 0u, vec2<u32>(0u), vec2<u32>(0u), vec2<u32>(0u), 0u);
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
                        // The draft's row: j, or the index's entry (read for a tested draft only).
                        var q = j;
                        var q_ok = true;
                        if pp.has_draft_index != 0u {
                            let e = pair_draft_index[pp.draft_index_off + j];
                            q_ok = e >= 0 && u32(e) < pp.draft_rows;
                            q = bitcast<u32>(e);
                        }
                        if !q_ok {
                            // No such row: rejected, the target row sampled (one dispatch posts).
                            if pp.draft_row_lo == 0u {
                                post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
                            }
                        } else if q >= pp.draft_row_lo && q < pp.draft_row_hi {
                            let a = 8u * r;
                            let sd = pp.seeds_off + 2u * r;
                            pr = Pair(1u, r, d, kept_aux[a], kept_aux[a + 1u], kept_aux[a + 2u],
                                vec2<u32>(pair_seeds[sd], pair_seeds[sd + 1u]),
                                vec2<u32>(kept_aux[a + 3u], kept_aux[a + 4u]),
                                vec2<u32>(kept_aux[a + 5u], kept_aux[a + 6u]),
                                q - pp.draft_row_lo);
                        }
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
    g_qbase = pp.draft_off + pr.qrow * vocab;
    g_qweigh = by_key();
    if pp.logits != 0u {
        // Both rows at the temperature of the output row, each from its own maximum.
        let t_bits = pair_temperature[pp.temperature_off + pr.row];
        weigh_logits_row(lid, vocab, t_bits);
        weigh_draft_row(lid, vocab, t_bits);
    }
    let limit = vec2<u32>(REJECTION_MAX_TOTAL_WEIGHT_LO, REJECTION_MAX_TOTAL_WEIGHT_HI);
    // The draft row's total weight.
    var wq_part = vec2<u32>(0u);
    for (var i = lid; i < vocab; i += WG) {
        wq_part = add64(wq_part, q_weight(i));
    }
    let wq_total = wg_sum64(lid, wq_part);
    // A probability row weighing 2^41 or more is not a distribution (a logits row always is one):
    // reject, and sample the target row; so too when the target's survivors weigh nothing.
    let not_distributions = pp.logits == 0u && (ge64(pr.total, limit) || ge64(wq_total, limit));
    if not_distributions || pr.found == 0u {
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
            wp_d = weight_of(kd);
        } else if kd == sel.key {
            var before = base;
            for (var i = r.x; i < d; i++) {
                if row_key(i) == kd {
                    before = before + 1u;
                }
            }
            if before < sel.take {
                wp_d = weight_of(kd);
            }
        }
        let wq_d = q_weight(d);
        let u = draw(pr.seed, PURPOSE_ACCEPT).y;
        let accepted = accepts(u, wp_d, wq_d, pr.kept_mass, wq_total);
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
    g_residual = Residual(wq_total, pr.kept_mass, residual_shift(pr.kept_mass, wq_total));
    let m = chunk_mass(r, sel, base);
    let total = wg_sum64(lid, m);
    if is_zero64(total) {
        if lid == 0u {
            post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
        }
        return;
    }
    let t = scale_draw(draw(pr.seed, PURPOSE_RESIDUAL), total);
    let result = draw_crossing(lid, r, sel, base, m, t);
    if lid == 0u {
        if result == 0xffffffffu {
            post_pair(j, PAIR_RESAMPLE_TARGET, 0u);
        } else {
            post_pair(j, PAIR_REJECTED, result);
        }
    }
}
