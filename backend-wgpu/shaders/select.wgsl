// Rank-order selection without sorting (`docs/semantics.md` §4, §5.6): one workgroup per row.
//
// The including shader binds its `[rows, vocab]` float matrix (f32 words, or packed f16/bf16) as
// `row_words`, starts each row with `begin_row`, and defines `fn row_key(i: u32) -> u32`, the key
// of element `i` of the current row from `row_bits(i)` (rank keys of probabilities, or
// `order_key`s of logits). A set of tokens described by a `Sel` is a prefix of the row in rank
// order: every token whose key is above `key`, plus the first `take` tokens (by id) whose key
// equals it.
//
// `select_prefix` finds the shortest prefix reaching a goal count or mass with a radix
// selection: up to four passes over the row, each building a 1024-bin histogram (counts, and masses
// as u32 limb pairs with an explicit carry) of the next 10 key bits among the tokens that match the
// bits found so far, and one walk from the top bin down to the bin where the goal is crossed. The
// take inside the final key group is computed exactly. `draw_in_prefix` (draw.wgsl) then walks the
// members in ascending id order with one chunked pass and a scan of per-thread partial masses.

const HIST_BITS: u32 = 10u;
const HIST_BINS: u32 = 1024u;

struct Sel {
    key: u32,
    take: u32,
    count: u32,
    found: u32,
    mass: vec2<u32>,
}

struct SelState {
    prefix_val: u32,
    prefix_mask: u32,
    above_count: u32,
    eq_count: u32,
    above_mass: vec2<u32>,
    first: u32,
    result: u32,
    cum: vec2<u32>,
    sel_key: u32,
    sel_take: u32,
    sel_count: u32,
    sel_found: u32,
    sel_mass: vec2<u32>,
}

var<workgroup> h_count: array<atomic<u32>, 1024>;
var<workgroup> h_mlo: array<atomic<u32>, 1024>;
var<workgroup> h_mhi: array<atomic<u32>, 1024>;
var<workgroup> p_count: array<u32, WG>;
var<workgroup> p_aux: array<u32, WG>;
var<workgroup> p_mass: array<vec2<u32>, WG>;
var<workgroup> s_state: SelState;

/// The gathered members of a selection (`gather_members`), at most MAX_CANDIDATES (which is at
/// least MAX_LOGPROBS_TOP_K, checked in kernels.rs).
var<workgroup> m_key: array<u32, MAX_CANDIDATES>;
var<workgroup> m_id: array<u32, MAX_CANDIDATES>;

// ---- The current row ----------------------------------------------------------------------------

var<private> g_dt: u32;
var<private> g_base: u32;

/// How the tokens of the current row weigh: WEIGH_KEYS (w(p) of the rank key) until
/// `weigh_logits_row` sets a logits row's weighing.
var<private> g_weigh: Weigh;

/// Starts reading the row of dtype `dt` whose first element is element `base` of `row_words`,
/// weighed by key (a logits row then calls `weigh_logits_row`).
fn begin_row(dt: u32, base: u32) {
    g_dt = dt;
    g_base = base;
    g_weigh = by_key();
}

/// The weight of a token of the current row with key `key`.
fn weight_of(key: u32) -> vec2<u32> {
    return weigh_key(g_weigh, key);
}

/// The f32 bits of element `i` of the current row.
fn row_bits(i: u32) -> u32 {
    let e = g_base + i;
    return widen_bits(row_words[word_of(e, g_dt)], e, g_dt);
}

// ---- Selection ----------------------------------------------------------------------------------

/// Metric of `select_prefix`: count tokens (masses not accumulated).
const METRIC_COUNT: u32 = 0u;
/// Count tokens, and also report the mass of the selected prefix.
const METRIC_COUNT_MASS: u32 = 1u;
/// Accumulate weights.
const METRIC_MASS: u32 = 2u;

fn chunk_range(lid: u32, n: u32) -> vec2<u32> {
    let size = (n + WG - 1u) / WG;
    let start = min(lid * size, n);
    return vec2<u32>(start, min(start + size, n));
}

fn hist_bin_mass(b: u32) -> vec2<u32> {
    return vec2<u32>(atomicLoad(&h_mlo[b]), atomicLoad(&h_mhi[b]));
}

fn sel_reached(metric: u32, goal: vec2<u32>, c: u32, m: vec2<u32>) -> bool {
    if metric == METRIC_MASS {
        return ge64(m, goal);
    }
    return c >= goal.x;
}

/// The sum over the workgroup of one u64 per thread (uniform result).
fn wg_sum64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    p_mass[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var s = vec2<u32>(0u);
        for (var g = 0u; g < WG; g++) {
            s = add64(s, p_mass[g]);
        }
        s_state.cum = s;
    }
    let st = workgroupUniformLoad(&s_state);
    return st.cum;
}

/// The sum over the workgroup of one u32 per thread, modulo 2^32 (uniform result).
fn wg_sum32(lid: u32, v: u32) -> u32 {
    return wg_sum64(lid, u64_from(v)).x;
}

/// The exclusive prefix sum over the workgroup, in thread order, of one u32 per thread.
fn wg_exclusive_scan(lid: u32, v: u32) -> u32 {
    p_count[lid] = v;
    workgroupBarrier();
    if lid == 0u {
        var acc = 0u;
        for (var g = 0u; g < WG; g++) {
            let x = p_count[g];
            p_count[g] = acc;
            acc = acc + x;
        }
    }
    workgroupBarrier();
    return p_count[lid];
}

/// Where a scan in thread order of one u64 mass per thread crosses the draw `t`: the thread whose
/// chunk holds it (WG when none) and the mass of the chunks before it.
struct Crossing {
    thread: u32,
    before: vec2<u32>,
}

/// The crossing of `t` by the per-thread masses `m` (uniform). Clears the result that the crossing
/// thread then posts in `s_state.result` and `wg_result` returns (0xffffffff when none).
fn wg_crossing(lid: u32, m: vec2<u32>, t: vec2<u32>) -> Crossing {
    p_mass[lid] = m;
    workgroupBarrier();
    if lid == 0u {
        var cum = vec2<u32>(0u);
        s_state.first = WG;
        s_state.result = 0xffffffffu;
        for (var g = 0u; g < WG; g++) {
            let nc = add64(cum, p_mass[g]);
            if lt64(t, nc) {
                s_state.first = g;
                s_state.cum = cum;
                break;
            }
            cum = nc;
        }
    }
    let st = workgroupUniformLoad(&s_state);
    return Crossing(st.first, st.cum);
}

/// The result posted by the crossing thread after `wg_crossing` (uniform).
fn wg_result() -> u32 {
    let st = workgroupUniformLoad(&s_state);
    return st.result;
}

/// The best (largest key, then lowest id) of one candidate per thread; `key` 0 with id 0xffffffff
/// means "none". Returns the winning id (uniform).
fn wg_best(lid: u32, key: u32, id: u32) -> vec2<u32> {
    p_count[lid] = key;
    p_aux[lid] = id;
    workgroupBarrier();
    if lid == 0u {
        var bk = 0u;
        var bi = 0xffffffffu;
        for (var g = 0u; g < WG; g++) {
            let k = p_count[g];
            let i = p_aux[g];
            if k > bk || (k == bk && i < bi) {
                bk = k;
                bi = i;
            }
        }
        s_state.result = bi;
        s_state.first = bk;
    }
    let st = workgroupUniformLoad(&s_state);
    return vec2<u32>(st.first, st.result);
}

/// Steps 1-3 of `docs/semantics.md` §4b for the current row, a logits row at temperature `t_bits` (f32
/// bits): its maximum rank key and the first id holding it (a workgroup reduction), then the scale
/// of the temperature. Sets `g_weigh` (the same on every invocation).
fn weigh_logits_row(lid: u32, vocab: u32, t_bits: u32) {
    var best = vec2<u32>(0u, 0xffffffffu);
    for (var i = lid; i < vocab; i += WG) {
        best = keep_larger(best, logit_rank_key(row_bits(i)), i);
    }
    g_weigh = weigh_best(lid, best, t_bits);
}

/// An invocation's running best `(key, id)` after visiting id `i` of key `k`: the larger key, the
/// earlier id on a tie (an invocation visits its ids in ascending order).
fn keep_larger(best: vec2<u32>, k: u32, i: u32) -> vec2<u32> {
    if k > best.x {
        return vec2<u32>(k, i);
    }
    return best;
}

/// A logits row's weighing from each invocation's best `(rank key, id)`: the row's maximum key and
/// the first id holding it (a workgroup reduction), then the scale of the temperature `t_bits`
/// (`docs/semantics.md` §4b).
fn weigh_best(lid: u32, best: vec2<u32>, t_bits: u32) -> Weigh {
    let row_best = wg_best(lid, best.x, best.y);
    return logits_weigh(row_best.x, row_best.y, t_bits);
}

/// The first token of the row in rank order (largest key, lowest id; 0 for an empty row).
fn first_in_rank(lid: u32, vocab: u32) -> u32 {
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = lid; i < vocab; i += WG) {
        let k = row_key(i);
        if k > bk || (k == bk && i < bi) {
            bk = k;
            bi = i;
        }
    }
    let best = wg_best(lid, bk, bi);
    if best.y == 0xffffffffu {
        return 0u;
    }
    return best.y;
}

/// The count of the tokens with `key >= min_key` and a nonzero weight, and their mass (u64)
/// (uniform).
fn totals(lid: u32, vocab: u32, min_key: u32) -> Sel {
    var c = 0u;
    var m = vec2<u32>(0u);
    for (var i = lid; i < vocab; i += WG) {
        let k = row_key(i);
        if k >= min_key {
            let w = weight_of(k);
            if !is_zero64(w) {
                c = c + 1u;
                m = add64(m, w);
            }
        }
    }
    let total_c = wg_sum32(lid, c);
    let total_m = wg_sum64(lid, m);
    return Sel(0u, 0xffffffffu, total_c, 1u, total_m);
}

/// The shortest prefix, in rank order, of the tokens with `key >= min_key` whose metric reaches
/// `goal` (which must be reachable and nonzero). `key_bits` is the width of the keys (30 for
/// rank keys of sanitized probabilities, 32 for order keys). Uniform result.
fn select_prefix(lid: u32, vocab: u32, min_key: u32, metric: u32, goal: vec2<u32>, key_bits: u32) -> Sel {
    var prefix_val = 0u;
    var prefix_mask = 0u;
    var remaining = key_bits;
    if lid == 0u {
        s_state.above_count = 0u;
        s_state.above_mass = vec2<u32>(0u);
    }
    let with_mass = metric != METRIC_COUNT;
    loop {
        if remaining == 0u {
            break;
        }
        var shift = 0u;
        if remaining > HIST_BITS {
            shift = remaining - HIST_BITS;
        }
        let nb = 1u << (remaining - shift);
        clear_bins(lid, HIST_BINS);
        workgroupBarrier();
        for (var i = lid; i < vocab; i += WG) {
            let k = row_key(i);
            if k < min_key || (k & prefix_mask) != prefix_val {
                continue;
            }
            let d = (k >> shift) & (nb - 1u);
            atomicAdd(&h_count[d], 1u);
            if with_mass {
                add_mass(d, weight_of(k));
            }
        }
        workgroupBarrier();
        // Partial sums of four bins per thread.
        let per = HIST_BINS / WG;
        var pc = 0u;
        var pm = vec2<u32>(0u);
        for (var j = 0u; j < per; j++) {
            let b = lid * per + j;
            pc = pc + atomicLoad(&h_count[b]);
            pm = add64(pm, hist_bin_mass(b));
        }
        p_count[lid] = pc;
        p_mass[lid] = pm;
        workgroupBarrier();
        if lid == 0u {
            var c = s_state.above_count;
            var m = s_state.above_mass;
            var group = 0u;
            for (var gi = 0u; gi < WG; gi++) {
                let g = WG - 1u - gi;
                let nc = c + p_count[g];
                let nm = add64(m, p_mass[g]);
                if sel_reached(metric, goal, nc, nm) {
                    group = g;
                    break;
                }
                c = nc;
                m = nm;
            }
            var digit = group * per;
            for (var ji = 0u; ji < per; ji++) {
                let b = group * per + per - 1u - ji;
                let bc = atomicLoad(&h_count[b]);
                let bm = hist_bin_mass(b);
                if sel_reached(metric, goal, c + bc, add64(m, bm)) {
                    digit = b;
                    s_state.eq_count = bc;
                    break;
                }
                c = c + bc;
                m = add64(m, bm);
            }
            s_state.above_count = c;
            s_state.above_mass = m;
            s_state.prefix_val = prefix_val | (digit << shift);
            s_state.prefix_mask = prefix_mask | ((nb - 1u) << shift);
        }
        let st = workgroupUniformLoad(&s_state);
        prefix_val = st.prefix_val;
        prefix_mask = st.prefix_mask;
        remaining = shift;
    }
    if lid == 0u {
        let key = s_state.prefix_val;
        let eq = s_state.eq_count;
        let c = s_state.above_count;
        let m = s_state.above_mass;
        let w = weight_of(key);
        var take = 1u;
        if metric == METRIC_MASS {
            // The least take in [1, eq] with m + w·take >= goal.
            let need = sub64(goal, m);
            var lo = 1u;
            var hi = max(eq, 1u);
            while lo < hi {
                let mid = lo + (hi - lo) / 2u;
                if ge64(mul64x32(w, mid), need) {
                    hi = mid;
                } else {
                    lo = mid + 1u;
                }
            }
            take = lo;
        } else {
            take = goal.x - c;
        }
        s_state.sel_key = key;
        s_state.sel_take = take;
        s_state.sel_count = c + take;
        s_state.sel_found = 1u;
        s_state.sel_mass = add64(m, mul64x32(w, take));
    }
    let st = workgroupUniformLoad(&s_state);
    return Sel(st.sel_key, st.sel_take, st.sel_count, st.sel_found, st.sel_mass);
}

/// Per-thread chunk statistics of a prefix: the number of tokens of the chunk whose key equals
/// `sel.key` goes to `p_count` (then scanned, exclusive), and the returned value is the number of
/// equal-key tokens before this thread's chunk. Tokens below `min_key` are never members.
fn eq_base(lid: u32, vocab: u32, sel: Sel) -> u32 {
    let r = chunk_range(lid, vocab);
    var eq = 0u;
    for (var i = r.x; i < r.y; i++) {
        if row_key(i) == sel.key {
            eq = eq + 1u;
        }
    }
    return wg_exclusive_scan(lid, eq);
}

/// Whether a token with key `k` is a member, given how many equal-key tokens came before it
/// (`seen`, updated).
fn admit(k: u32, sel: Sel, min_key: u32, seen: ptr<function, u32>) -> bool {
    if k < min_key {
        return false;
    }
    if k > sel.key {
        return true;
    }
    if k == sel.key && *seen < sel.take {
        *seen = *seen + 1u;
        return true;
    }
    return false;
}

/// Gathers the members of `sel` (none below `min_key`) in ascending id order into `m_key` and
/// `m_id` (the first MAX_CANDIDATES of them).
fn gather_members(lid: u32, vocab: u32, sel: Sel, min_key: u32) {
    let base = eq_base(lid, vocab, sel);
    let r = chunk_range(lid, vocab);
    var seen = base;
    var members = 0u;
    for (var i = r.x; i < r.y; i++) {
        if admit(row_key(i), sel, min_key, &seen) {
            members = members + 1u;
        }
    }
    var pos = wg_exclusive_scan(lid, members);
    seen = base;
    for (var i = r.x; i < r.y; i++) {
        let k = row_key(i);
        if admit(k, sel, min_key, &seen) {
            if pos < MAX_CANDIDATES {
                m_key[pos] = k;
                m_id[pos] = i;
            }
            pos = pos + 1u;
        }
    }
    workgroupBarrier();
}

/// The rank of gathered member `j` among the first `n` in rank order: key descending, then id
/// ascending.
fn member_rank(j: u32, n: u32) -> u32 {
    let kj = m_key[j];
    let ij = m_id[j];
    var rank = 0u;
    for (var m = 0u; m < n; m++) {
        let km = m_key[m];
        if km > kj || (km == kj && m_id[m] < ij) {
            rank = rank + 1u;
        }
    }
    return rank;
}

/// The kept set of `top_k_top_p_sample` (`docs/semantics.md` §5.6 steps 1-2): `found == 0` means the survivors
/// weigh nothing (degenerate: the result is the first token in rank order). `key_bits` is the
/// width of the row's keys (30 for probabilities, 32 for logits).
fn kept_set(lid: u32, vocab: u32, top_k: i32, top_p_bits: u32, key_bits: u32) -> Sel {
    var w: vec2<u32>;
    if top_k > 0 && u32(top_k) < vocab {
        let s = select_prefix(lid, vocab, 0u, METRIC_COUNT_MASS, u64_from(u32(top_k)), key_bits);
        w = s.mass;
    } else {
        w = totals(lid, vocab, 0u).mass;
    }
    if is_zero64(w) {
        return Sel(0u, 0u, 0u, 0u, vec2<u32>(0u));
    }
    // The kept set is the shortest prefix of the whole row reaching the goal: it lies within the
    // survivors because their whole mass reaches it.
    let goal = top_p_target_mass(top_p_fixed(top_p_bits), w);
    return select_prefix(lid, vocab, 0u, METRIC_MASS, goal, key_bits);
}
