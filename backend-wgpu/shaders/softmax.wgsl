// softmax (`docs/semantics.md` §5.5): one workgroup per row; max and +inf count, then the f32 sum, then the
// normalised write, on the scaled logits (l - max) / T (rowstats.wgsl). Float class: compared
// with a tolerance.

// `struct SoftmaxArgs` is generated from its `kernel_args!` declaration in src/ops/softmax.rs.

@group(0) @binding(0) var<uniform> p: SoftmaxArgs;
// logits [rows, vocab]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;

var<workgroup> wg_t: u32;

fn row_key(i: u32) -> u32 {
    return order_key(row_bits(i));
}

// Entry points `softmax_<dtype>` (generated, kernels.rs; groups with work only).
fn softmax_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.logits_off + g * p.vocab);
    let row = p.row0 + g;
    if lid == 0u {
        wg_t = temperature[p.temperature_off + row];
    }
    let t = effective_temperature(workgroupUniformLoad(&wg_t));
    let st = row_stats(lid, p.vocab, t);
    let out = p.probs_off + g * p.vocab;
    for (var i = lid; i < p.vocab; i += WG) {
        var bits = 0u;
        if st.kind != KIND_ONEHOT {
            bits = row_bits(i);
        }
        probs[out + i] = stats_prob(st, i, bits, t, p.vocab);
    }
}
