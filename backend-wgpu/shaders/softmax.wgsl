// softmax (contract §4.9): one workgroup per row; max and +inf count, then the f32 sum, then the
// normalised write. Float class: compared with a tolerance.

struct Params {
    rows: u32,
    vocab: u32,
    row0: u32,
    logits_off: u32,
    temperature_off: u32,
    probs_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;

var<private> g_dt: u32;
var<private> g_base: u32;
var<workgroup> wg_t: u32;

fn row_bits(i: u32) -> u32 {
    let e = g_base + i;
    return widen_bits(logits[word_of(e, g_dt)], e, g_dt);
}

fn row_key(i: u32) -> u32 {
    return order_key(row_bits(i));
}

fn softmax_main(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, dt: u32) {
    let g = group_index(wid, nwg);
    if g >= p.rows {
        return;
    }
    g_dt = dt;
    g_base = p.logits_off + g * p.vocab;
    let row = p.row0 + g;
    if lid == 0u {
        wg_t = temperature[p.temperature_off + row];
    }
    let t = effective_temperature(workgroupUniformLoad(&wg_t));
    let st = row_stats(lid, p.vocab, t);
    let out = p.probs_off + g * p.vocab;
    for (var i = lid; i < p.vocab; i += WG) {
        var y = 0.0;
        if st.kind != KIND_ONEHOT {
            y = scaled(row_bits(i), t);
        }
        probs[out + i] = stats_prob(st, i, y, p.vocab);
    }
}

@compute @workgroup_size(WG)
fn softmax_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    softmax_main(wid, nwg, lid, DT_F32);
}

@compute @workgroup_size(WG)
fn softmax_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    softmax_main(wid, nwg, lid, DT_F16);
}

@compute @workgroup_size(WG)
fn softmax_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    softmax_main(wid, nwg, lid, DT_BF16);
}
