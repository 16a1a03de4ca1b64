// top_k_top_p_sample (`docs/semantics.md` §5.6): one workgroup per row, no sort.
// top-k by a radix count selection, top-p by a radix mass selection over the whole row (the
// shortest prefix reaching the target lies within the top-k survivors), then the SAMPLE draw by
// one chunked prefix scan in ascending id order. All decisions are integer arithmetic on limbs.
// A row of total weight 0 yields its `fallback` entry when given (process_logits), else its first
// token in rank order. With `with_aux` the kept set and the row's total weight are also written (REJECTION uses them).
// Logits rows (`logits`) first find the row maximum, and weigh each token by `docs/semantics.md` §4b at the
// row's temperature.

// `struct TopKTopPSampleArgs` is generated from its `kernel_args!` declaration in src/ops/top_k_top_p_sample.rs.

@group(0) @binding(0) var<uniform> p: TopKTopPSampleArgs;
// probs or logits [rows, vocab]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read> top_k: array<i32>;
@group(0) @binding(3) var<storage, read> top_p: array<u32>;
@group(0) @binding(4) var<storage, read> seeds: array<u32>;
@group(0) @binding(5) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(6) var<storage, read_write> aux: array<u32>;
// logits rows: the per-row temperature (f32 bits)
@group(0) @binding(7) var<storage, read> temperature: array<u32>;
// with `has_fallback`: the token of a row of total weight 0 (process_logits)
@group(0) @binding(8) var<storage, read> fallback: array<i32>;

var<workgroup> wg_row: vec4<u32>;

fn row_key(i: u32) -> u32 {
    if p.logits != 0u {
        return logit_row_key(g_weigh, row_bits(i), i);
    }
    return rank_key(row_bits(i));
}

/// The weight of member `i` (key `k`) in the SAMPLE draw (draw.wgsl): its kept weight.
fn drawn_weight(i: u32, k: u32) -> vec2<u32> {
    return weight_of(k);
}

// Entry points `top_k_top_p_sample_<dtype>` (generated, kernels.rs; groups with work only).
fn top_k_top_p_sample_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.probs_off + g * p.vocab);
    let row = p.row0 + g;
    if lid == 0u {
        let s = p.seed_off + 2u * row;
        wg_row = vec4<u32>(bitcast<u32>(top_k[p.top_k_off + row]), top_p[p.top_p_off + row], seeds[s], seeds[s + 1u]);
    }
    let rp = workgroupUniformLoad(&wg_row);
    let vocab = p.vocab;
    var key_bits = 30u;
    if p.logits != 0u {
        weigh_logits_row(lid, vocab, temperature[p.temperature_off + row]);
        key_bits = 32u;
    }
    let kept = kept_set(lid, vocab, bitcast<i32>(rp.x), rp.y, key_bits);
    var token = 0u;
    if kept.found == 0u {
        // The survivors weigh nothing exactly when the whole row does (weights never increase
        // down the rank order).
        if p.has_fallback != 0u {
            token = bitcast<u32>(fallback[p.fallback_off + row]);
        } else {
            token = first_in_rank(lid, vocab);
        }
    } else {
        let t = scale_draw(draw(rp.zw, PURPOSE_SAMPLE), kept.mass);
        token = draw_in_prefix(lid, vocab, kept, t);
        if token == 0xffffffffu {
            token = first_in_rank(lid, vocab);
        }
    }
    var total = vec2<u32>(0u);
    if p.with_aux != 0u {
        total = totals(lid, vocab, 0u).mass;
    }
    if lid == 0u {
        tokens[p.tokens_off + row] = i32(token);
        if p.with_aux != 0u {
            let a = p.aux_off + 8u * row;
            aux[a] = kept.found;
            aux[a + 1u] = kept.key;
            aux[a + 2u] = kept.take;
            aux[a + 3u] = kept.mass.x;
            aux[a + 4u] = kept.mass.y;
            aux[a + 5u] = total.x;
            aux[a + 6u] = total.y;
            aux[a + 7u] = 0u;
        }
    }
}
