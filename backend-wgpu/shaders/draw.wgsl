// A draw among the members of a `Sel` (select.wgsl) in ascending id order (`docs/semantics.md`
// §4b): each invocation sums the weights of the members in its chunk of the row (`chunk_mass`),
// and the invocation whose chunk the target `t` falls in walks it again to the member whose
// cumulative weight first exceeds `t` (`draw_crossing`). The including module defines
// `fn drawn_weight(i: u32, k: u32) -> vec2<u32>`, the weight of member `i` of key `k`: the kept
// weight in top_k_top_p_sample, the residual against the draft row in verify_draft_tokens.

/// The weight of the members of `sel` in this invocation's chunk `r` (`base`: the members of
/// `sel`'s key before the chunk, from `eq_base`).
fn chunk_mass(r: vec2<u32>, sel: Sel, base: u32) -> vec2<u32> {
    var m = vec2<u32>(0u);
    var seen = base;
    for (var i = r.x; i < r.y; i++) {
        let k = row_key(i);
        if admit(k, sel, 0u, &seen) {
            m = add64(m, drawn_weight(i, k));
        }
    }
    return m;
}

/// The member whose cumulative weight, in ascending id order, first exceeds `t` (below the members'
/// total), from each invocation's chunk `r`, `base` and chunk mass `m`. Uniform result;
/// 0xffffffff if none.
fn draw_crossing(lid: u32, r: vec2<u32>, sel: Sel, base: u32, m: vec2<u32>, t: vec2<u32>) -> u32 {
    let crossing = wg_crossing(lid, m, t);
    if lid == crossing.thread {
        var cum = crossing.before;
        var seen = base;
        for (var i = r.x; i < r.y; i++) {
            let k = row_key(i);
            if admit(k, sel, 0u, &seen) {
                cum = add64(cum, drawn_weight(i, k));
                if lt64(t, cum) {
                    s_state.result = i;
                    break;
                }
            }
        }
    }
    return wg_result();
}

/// Draws in a prefix: the member, in ascending id order, whose cumulative weight first exceeds
/// `t` (`t < sel.mass`). Uniform result; 0xffffffff if none (unreachable for a valid t).
fn draw_in_prefix(lid: u32, vocab: u32, sel: Sel, t: vec2<u32>) -> u32 {
    let base = eq_base(lid, vocab, sel);
    let r = chunk_range(lid, vocab);
    return draw_crossing(lid, r, sel, base, chunk_mass(r, sel, base), t);
}
