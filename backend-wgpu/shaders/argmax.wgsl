// argmax (contract §4.2): one workgroup per row; integer order keys (NaN lowest, -0 == +0), ties
// to the lowest id, so the result never depends on float comparisons or reduction order.

struct Params {
    rows: u32,
    vocab: u32,
    row0: u32,
    input_off: u32,
    out_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> input: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

var<private> g_dt: u32;
var<private> g_base: u32;

fn row_key(i: u32) -> u32 {
    let e = g_base + i;
    return order_key(widen_bits(input[word_of(e, g_dt)], e, g_dt));
}

fn argmax_main(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, dt: u32) {
    let g = group_index(wid, nwg);
    if g >= p.rows {
        return;
    }
    g_dt = dt;
    g_base = p.input_off + g * p.vocab;
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = lid; i < p.vocab; i += WG) {
        let k = row_key(i);
        if k > bk || (k == bk && i < bi) {
            bk = k;
            bi = i;
        }
    }
    let best = wg_best(lid, bk, bi);
    if lid == 0u {
        out[p.out_off + p.row0 + g] = i32(select(best.y, 0u, best.y == 0xffffffffu));
    }
}

@compute @workgroup_size(WG)
fn argmax_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    argmax_main(wid, nwg, lid, DT_F32);
}

@compute @workgroup_size(WG)
fn argmax_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    argmax_main(wid, nwg, lid, DT_F16);
}

@compute @workgroup_size(WG)
fn argmax_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    argmax_main(wid, nwg, lid, DT_BF16);
}
