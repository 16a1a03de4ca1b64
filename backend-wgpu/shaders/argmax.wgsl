// argmax (`docs/semantics.md` §5.4): one workgroup per row; integer order keys (NaN lowest, -0 == +0), ties
// to the lowest id, so the result never depends on float comparisons or reduction order.

// `struct ArgmaxArgs` is generated from its `kernel_args!` declaration in src/ops/argmax.rs.

@group(0) @binding(0) var<uniform> p: ArgmaxArgs;
// input [rows, vocab]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

fn row_key(i: u32) -> u32 {
    return order_key(row_bits(i));
}

// Entry points `argmax_<dtype>` (generated, kernels.rs; groups with work only).
fn argmax_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.input_off + g * p.vocab);
    let best = first_in_rank(lid, p.vocab);
    if lid == 0u {
        out[p.out_off + p.row0 + g] = i32(best);
    }
}
