// shard_key (`docs/semantics.md` §5.13): one workgroup per row; each invocation the largest key of
// its strided part of the slice, then a workgroup maximum. With `ids`, invocation 0 keys the one
// token ids[r] when the slice holds it (0 otherwise) and nothing else is read.

// `struct ShardKeyArgs` is generated from its `kernel_args!` declaration in src/ops/shard_key.rs.

@group(0) @binding(0) var<uniform> p: ShardKeyArgs;
// scores [rows, len]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> keys: array<u32>;

// Entry points `shard_key_<dtype>` (generated, kernels.rs; groups with work only).
fn shard_key_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.input_off + g * p.vocab);
    let row = p.row0 + g;
    let len = p.vocab;
    let logits = p.logits != 0u;
    var best = vec2<u32>(0u);
    if p.has_ids == 0u {
        for (var i = lid; i < len; i += WG) {
            best = max64(best, token_key(p.order, logits, row_bits(i), p.first + i));
        }
    }
    let largest = wg_max64(lid, best);
    if lid == 0u {
        var key = largest;
        if p.has_ids != 0u {
            let id = ids[p.ids_off + row];
            key = vec2<u32>(0u);
            // The slice holds ids first .. first + len (a negative id is none of them).
            if id >= 0 && u32(id) >= p.first && u32(id) - p.first < len {
                key = token_key(p.order, logits, row_bits(u32(id) - p.first), u32(id));
            }
        }
        keys[p.keys_off + 2u * row] = key.x;
        keys[p.keys_off + 2u * row + 1u] = key.y;
    }
}
