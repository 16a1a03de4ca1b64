// accept_logprobs (contract §4.8). `accept_logprobs_pack_i32` (one invocation) packs the accepted
// counts into `cu_accept` and writes one (token, source row) entry per packed slot of the output.
// `accept_logprobs_<dtype>` then scores each entry with one workgroup: softmax statistics of the
// source row, the token's rank (integer keys, NaN as -inf), and the top-K by a radix count
// selection on argmax order keys (never a sort of the row), K <= 64 ordered among themselves.
// Logits larger than one storage binding are processed in row chunks: an entry is scored in the
// dispatch whose chunk holds its row; entries without a row are written by the first dispatch.

struct PackParams {
    max_bsz: u32,
    real_bsz: u32,
    step_tokens: u32,
    rows: u32,
    accept_tokens_off: u32,
    accept_num_off: u32,
    encoder_off: u32,
    cu_out_off: u32,
    cu_accept_off: u32,
}

@group(0) @binding(9) var<uniform> pk: PackParams;
@group(0) @binding(10) var<storage, read> accept_tokens: array<i32>;
@group(0) @binding(11) var<storage, read> accept_num: array<i32>;
@group(0) @binding(12) var<storage, read> encoder: array<i32>;
@group(0) @binding(13) var<storage, read> cu_out: array<i32>;
@group(0) @binding(14) var<storage, read_write> cu_accept: array<i32>;
@group(0) @binding(15) var<storage, read_write> entries_out: array<i32>;

@compute @workgroup_size(1)
fn accept_logprobs_pack_i32() {
    let s = pk.step_tokens;
    var total = 0u;
    cu_accept[pk.cu_accept_off] = 0;
    for (var b = 0u; b < pk.max_bsz; b++) {
        var n = 0u;
        if b < pk.real_bsz {
            n = min(len_or_zero(accept_num[pk.accept_num_off + b]), s);
        }
        let prefill = encoder[pk.encoder_off + b] > 0;
        var base = 0;
        if b < pk.real_bsz {
            base = cu_out[pk.cu_out_off + b];
        }
        for (var k = 0u; k < n; k++) {
            var row = -1;
            if base >= 0 {
                var r = u32(base);
                if !prefill {
                    r = r + k;
                }
                if r < pk.rows {
                    row = i32(r);
                }
            }
            entries_out[2u * total] = accept_tokens[pk.accept_tokens_off + b * s + k];
            entries_out[2u * total + 1u] = row;
            total = total + 1u;
        }
        cu_accept[pk.cu_accept_off + b + 1u] = i32(total);
    }
    for (var e = total; e < pk.max_bsz * s; e++) {
        entries_out[2u * e] = -1;
        entries_out[2u * e + 1u] = -2;
    }
}

struct Params {
    entries: u32,
    vocab: u32,
    top_k: u32,
    first_chunk: u32,
    row_lo: u32,
    row_hi: u32,
    logits_off: u32,
    temperature_off: u32,
    token_ids_off: u32,
    logprobs_off: u32,
    ranks_off: u32,
    top_ids_off: u32,
    top_logprobs_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
@group(0) @binding(3) var<storage, read> entries: array<i32>;
@group(0) @binding(4) var<storage, read_write> token_ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> logprobs: array<f32>;
@group(0) @binding(6) var<storage, read_write> ranks: array<i32>;
@group(0) @binding(7) var<storage, read_write> top_ids: array<i32>;
@group(0) @binding(8) var<storage, read_write> top_logprobs: array<f32>;

var<private> g_dt: u32;
var<private> g_base: u32;
// is_active, token, row (as u32, 0xffffffff none), temperature bits
var<workgroup> wg_entry: vec4<u32>;
var<workgroup> top_key: array<u32, MAX_LOGPROBS_TOP_K>;
var<workgroup> top_id: array<u32, MAX_LOGPROBS_TOP_K>;

fn row_bits(i: u32) -> u32 {
    let e = g_base + i;
    return widen_bits(logits[word_of(e, g_dt)], e, g_dt);
}

fn row_key(i: u32) -> u32 {
    return order_key(row_bits(i));
}

fn logprobs_main(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, dt: u32) {
    let e = group_index(wid, nwg);
    if e >= p.entries {
        return;
    }
    g_dt = dt;
    let k = p.top_k;
    if lid == 0u {
        let token = entries[2u * e];
        let row = entries[2u * e + 1u];
        var is_active = 0u;
        var r = 0xffffffffu;
        var t = 0u;
        if row >= 0 {
            r = u32(row);
            if r >= p.row_lo && r < p.row_hi {
                is_active = 1u;
                t = temperature[p.temperature_off + r];
            }
        } else if p.first_chunk != 0u {
            is_active = 2u;
        }
        wg_entry = vec4<u32>(is_active, bitcast<u32>(token), r, t);
    }
    let ent = workgroupUniformLoad(&wg_entry);
    if ent.x == 0u {
        return;
    }
    let token = bitcast<i32>(ent.y);
    if ent.x == 2u {
        // No source row (padding entry, or a row outside the logits).
        if lid == 0u {
            token_ids[p.token_ids_off + e] = token;
            logprobs[p.logprobs_off + e] = neg_inf();
            ranks[p.ranks_off + e] = 0;
        }
        for (var j = lid; j < k; j += WG) {
            top_ids[p.top_ids_off + e * k + j] = -1;
            top_logprobs[p.top_logprobs_off + e * k + j] = neg_inf();
        }
        return;
    }
    let vocab = p.vocab;
    g_base = p.logits_off + (ent.z - p.row_lo) * vocab;
    let t = effective_temperature(ent.w);
    let st = row_stats(lid, vocab, t);
    let valid = token >= 0 && u32(token) < vocab;
    // Rank: 1 + the number of logits strictly above the token's (NaN as -inf).
    var larger = 0u;
    if valid {
        let tv = rank_value_key(row_bits(u32(token)));
        for (var i = lid; i < vocab; i += WG) {
            if rank_value_key(row_bits(i)) > tv {
                larger = larger + 1u;
            }
        }
    }
    let above = wg_sum32(lid, larger);
    if lid == 0u {
        token_ids[p.token_ids_off + e] = token;
        if valid {
            let ti = u32(token);
            logprobs[p.logprobs_off + e] = stats_logprob(st, ti, scaled(row_bits(ti), t), vocab);
            ranks[p.ranks_off + e] = i32(min(above + 1u, 0x7fffffffu));
        } else {
            logprobs[p.logprobs_off + e] = neg_inf();
            ranks[p.ranks_off + e] = 0;
        }
    }
    if k == 0u {
        return;
    }
    // Top-K in argmax order: a count selection of the K-th order key, then the members.
    var sel = Sel(0u, 0xffffffffu, vocab, 1u, vec2<u32>(0u));
    if k < vocab {
        sel = select_prefix(lid, vocab, 0u, METRIC_COUNT, u64_from(k), 32u);
    }
    let n = min(sel.count, k);
    let base = eq_base(lid, vocab, sel);
    let r = chunk_range(lid, vocab);
    var seen = base;
    var members = 0u;
    for (var i = r.x; i < r.y; i++) {
        if admit(row_key(i), sel, 0u, &seen) {
            members = members + 1u;
        }
    }
    p_aux[lid] = members;
    workgroupBarrier();
    if lid == 0u {
        var acc = 0u;
        for (var g = 0u; g < WG; g++) {
            let v = p_aux[g];
            p_aux[g] = acc;
            acc = acc + v;
        }
    }
    workgroupBarrier();
    var pos = p_aux[lid];
    seen = base;
    for (var i = r.x; i < r.y; i++) {
        let key = row_key(i);
        if admit(key, sel, 0u, &seen) {
            if pos < MAX_LOGPROBS_TOP_K {
                top_key[pos] = key;
                top_id[pos] = i;
            }
            pos = pos + 1u;
        }
    }
    workgroupBarrier();
    for (var j = lid; j < n; j += WG) {
        let kj = top_key[j];
        let ij = top_id[j];
        var rank = 0u;
        for (var m = 0u; m < n; m++) {
            let km = top_key[m];
            if km > kj || (km == kj && top_id[m] < ij) {
                rank = rank + 1u;
            }
        }
        var y = 0.0;
        if st.kind != KIND_ONEHOT {
            y = scaled(row_bits(ij), t);
        }
        top_ids[p.top_ids_off + e * k + rank] = i32(ij);
        top_logprobs[p.top_logprobs_off + e * k + rank] = stats_logprob(st, ij, y, vocab);
    }
    for (var j = n + lid; j < k; j += WG) {
        top_ids[p.top_ids_off + e * k + j] = -1;
        top_logprobs[p.top_logprobs_off + e * k + j] = neg_inf();
    }
}

@compute @workgroup_size(WG)
fn accept_logprobs_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    logprobs_main(wid, nwg, lid, DT_F32);
}

@compute @workgroup_size(WG)
fn accept_logprobs_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    logprobs_main(wid, nwg, lid, DT_F16);
}

@compute @workgroup_size(WG)
fn accept_logprobs_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    logprobs_main(wid, nwg, lid, DT_BF16);
}
