// top_p_candidates (contract §4.4): one workgroup per row. The first C tokens in rank order with a
// nonzero weight are found by a radix count selection (no sort of the row), gathered in id order
// with a chunked scan, ordered among themselves (C <= 128) by a rank count, and the top-p length
// is an exact prefix walk over at most C weights.

struct Params {
    rows: u32,
    vocab: u32,
    row0: u32,
    probs_off: u32,
    top_p_off: u32,
    batch_id_off: u32,
    has_batch_id: u32,
    ids_off: u32,
    scores_off: u32,
    lens_off: u32,
    candidates: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> probs: array<u32>;
@group(0) @binding(2) var<storage, read> top_p: array<u32>;
@group(0) @binding(3) var<storage, read> batch_id: array<i32>;
@group(0) @binding(4) var<storage, read_write> ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> scores: array<u32>;
@group(0) @binding(6) var<storage, read_write> lens: array<i32>;

var<private> g_dt: u32;
var<private> g_base: u32;
var<workgroup> wg_row: vec2<u32>;
var<workgroup> cand_key: array<u32, MAX_CANDIDATES>;
var<workgroup> cand_id: array<u32, MAX_CANDIDATES>;
var<workgroup> sorted_key: array<u32, MAX_CANDIDATES>;

fn row_key(i: u32) -> u32 {
    let e = g_base + i;
    return rank_key(widen_bits(probs[word_of(e, g_dt)], e, g_dt));
}

fn candidates_main(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, dt: u32) {
    let g = group_index(wid, nwg);
    if g >= p.rows {
        return;
    }
    g_dt = dt;
    g_base = p.probs_off + g * p.vocab;
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
        for (var j = lid; j < c; j += WG) {
            ids[p.ids_off + out + j] = -1;
            scores[p.scores_off + out + j] = 0u;
        }
        if lid == 0u {
            lens[p.lens_off + row] = 0;
        }
        return;
    }
    let vocab = p.vocab;
    let all = totals(lid, vocab, MIN_WEIGHT_KEY);
    if all.count == 0u {
        let first = first_in_rank(lid, vocab);
        for (var j = lid; j < c; j += WG) {
            ids[p.ids_off + out + j] = select(-1, i32(first), j == 0u);
            scores[p.scores_off + out + j] = 0u;
        }
        if lid == 0u {
            lens[p.lens_off + row] = 1;
        }
        return;
    }
    var sel = Sel(MIN_WEIGHT_KEY, 0xffffffffu, all.count, 1u, all.mass);
    if all.count > c {
        sel = select_prefix(lid, vocab, MIN_WEIGHT_KEY, METRIC_COUNT, u64_from(c), 30u);
    }
    let n = sel.count;
    // Gather the members in id order.
    let base = eq_base(lid, vocab, sel);
    let r = chunk_range(lid, vocab);
    var seen = base;
    var members = 0u;
    for (var i = r.x; i < r.y; i++) {
        if admit(row_key(i), sel, MIN_WEIGHT_KEY, &seen) {
            members = members + 1u;
        }
    }
    p_aux[lid] = members;
    workgroupBarrier();
    if lid == 0u {
        var acc = 0u;
        for (var t = 0u; t < WG; t++) {
            let v = p_aux[t];
            p_aux[t] = acc;
            acc = acc + v;
        }
    }
    workgroupBarrier();
    var pos = p_aux[lid];
    seen = base;
    for (var i = r.x; i < r.y; i++) {
        let k = row_key(i);
        if admit(k, sel, MIN_WEIGHT_KEY, &seen) {
            if pos < MAX_CANDIDATES {
                cand_key[pos] = k;
                cand_id[pos] = i;
            }
            pos = pos + 1u;
        }
    }
    workgroupBarrier();
    // Order the (at most C) candidates: key descending, id ascending.
    for (var j = lid; j < n; j += WG) {
        let kj = cand_key[j];
        let ij = cand_id[j];
        var rank = 0u;
        for (var m = 0u; m < n; m++) {
            let km = cand_key[m];
            if km > kj || (km == kj && cand_id[m] < ij) {
                rank = rank + 1u;
            }
        }
        ids[p.ids_off + out + rank] = i32(ij);
        scores[p.scores_off + out + rank] = kj;
        sorted_key[rank] = kj;
    }
    for (var j = n + lid; j < c; j += WG) {
        ids[p.ids_off + out + j] = -1;
        scores[p.scores_off + out + j] = 0u;
    }
    workgroupBarrier();
    if lid == 0u {
        let pf = top_p_fixed(rp.y);
        var mass = vec2<u32>(0u);
        var len = n;
        for (var j = 0u; j < n; j++) {
            mass = add64(mass, key_weight(sorted_key[j]));
            if reaches_top_p(mass, pf, all.mass) {
                len = j + 1u;
                break;
            }
        }
        lens[p.lens_off + row] = i32(len);
    }
}

@compute @workgroup_size(WG)
fn top_p_candidates_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    candidates_main(wid, nwg, lid, DT_F32);
}

@compute @workgroup_size(WG)
fn top_p_candidates_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    candidates_main(wid, nwg, lid, DT_F16);
}

@compute @workgroup_size(WG)
fn top_p_candidates_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    candidates_main(wid, nwg, lid, DT_BF16);
}
