// top_p_candidates (`docs/semantics.md` §5.7): one workgroup per row. The first C tokens in rank order with a
// nonzero weight are found by a radix count selection (no sort of the row), gathered in id order
// with a chunked scan, ordered among themselves (C <= 128) by a rank count, and the top-p length
// is an exact prefix walk over at most C weights. Logits rows (`logits`) are weighed by contract
// §4b at the row's temperature; their scores are the candidates' exact shares of the row
// (`candidate_score`).

// `struct TopPCandidatesArgs` is generated from its `kernel_args!` declaration in src/ops/top_p_candidates.rs.

@group(0) @binding(0) var<uniform> p: TopPCandidatesArgs;
// probs or logits [rows, vocab]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read> top_p: array<u32>;
@group(0) @binding(3) var<storage, read> batch_id: array<i32>;
@group(0) @binding(4) var<storage, read_write> ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> scores: array<u32>;
@group(0) @binding(6) var<storage, read_write> lens: array<i32>;
// logits rows: the per-row temperature (f32 bits)
@group(0) @binding(7) var<storage, read> temperature: array<u32>;
// with `has_fallback`: the token of a row of total weight 0 (process_logits)
@group(0) @binding(8) var<storage, read> fallback: array<i32>;

var<workgroup> wg_row: vec2<u32>;
var<workgroup> sorted_key: array<u32, MAX_CANDIDATES>;

fn row_key(i: u32) -> u32 {
    if p.logits != 0u {
        return logit_row_key(g_weigh, row_bits(i), i);
    }
    return rank_key(row_bits(i));
}

/// Writes the empty candidates `first .. c` of the row whose output starts at `out`.
fn clear_candidates(lid: u32, out: u32, first: u32, c: u32) {
    for (var j = first + lid; j < c; j += WG) {
        ids[p.ids_off + out + j] = -1;
        scores[p.scores_off + out + j] = 0u;
    }
}

// Entry points `top_p_candidates_<dtype>` (generated, kernels.rs; groups with work only).
fn top_p_candidates_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.probs_off + g * p.vocab);
    let row = p.row0 + g;
    let c = p.candidates;
    let out = row * c;
    if lid == 0u {
        var padding = 0u;
        if p.has_batch_id != 0u && batch_id[p.batch_id_off + row] < 0 {
            padding = 1u;
        }
        wg_row = vec2<u32>(padding, top_p[p.top_p_off + row]);
    }
    let rp = workgroupUniformLoad(&wg_row);
    if rp.x != 0u {
        clear_candidates(lid, out, 0u, c);
        if lid == 0u {
            lens[p.lens_off + row] = 0;
        }
        return;
    }
    let vocab = p.vocab;
    // Probability rows: the tokens of nonzero weight are those keyed MIN_WEIGHT_KEY or above.
    // Logits rows: keys of 32 bits; the tokens of nonzero weight are a prefix of the rank order
    // (weights never increase down it), selected by count.
    var min_key = MIN_WEIGHT_KEY;
    var key_bits = 30u;
    if p.logits != 0u {
        weigh_logits_row(lid, vocab, temperature[p.temperature_off + row]);
        min_key = 0u;
        key_bits = 32u;
    }
    let all = totals(lid, vocab, min_key);
    if all.count == 0u {
        // A row of weight 0: its fallback when given (nothing, lens 0, when negative), else its
        // first token in rank order; score 0.
        var first = i32(first_in_rank(lid, vocab));
        if p.has_fallback != 0u {
            first = fallback[p.fallback_off + row];
        }
        for (var j = lid; j < c; j += WG) {
            ids[p.ids_off + out + j] = select(-1, first, j == 0u);
            scores[p.scores_off + out + j] = 0u;
        }
        if lid == 0u {
            lens[p.lens_off + row] = select(0, 1, first >= 0);
        }
        return;
    }
    var sel = Sel(min_key, 0xffffffffu, all.count, 1u, all.mass);
    if all.count > c || p.logits != 0u {
        sel = select_prefix(lid, vocab, min_key, METRIC_COUNT, u64_from(min(c, all.count)), key_bits);
    }
    let n = sel.count;
    gather_members(lid, vocab, sel, min_key);
    // Order the (at most C) candidates: key descending, id ascending. A probability row's score is
    // its sanitized probability, the rank key itself.
    for (var j = lid; j < n; j += WG) {
        let rank = member_rank(j, n);
        var score = m_key[j];
        if p.logits != 0u {
            score = candidate_score(weight_of(m_key[j]), all.mass);
        }
        ids[p.ids_off + out + rank] = i32(m_id[j]);
        scores[p.scores_off + out + rank] = score;
        sorted_key[rank] = m_key[j];
    }
    clear_candidates(lid, out, n, c);
    workgroupBarrier();
    if lid == 0u {
        let pf = top_p_fixed(rp.y);
        var mass = vec2<u32>(0u);
        var len = n;
        for (var j = 0u; j < n; j++) {
            mass = add64(mass, weight_of(sorted_key[j]));
            if reaches_top_p(mass, pf, all.mass) {
                len = j + 1u;
                break;
            }
        }
        lens[p.lens_off + row] = i32(len);
    }
}
