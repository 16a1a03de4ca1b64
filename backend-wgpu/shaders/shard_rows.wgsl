// The rows of the kernels over `ops::ShardRows` (shard_records, shard_histogram, shard_walk;
// bound by `bind_rows` of src/ops/sharded.rs): a rank's `[rows, len]` scores at binding 1, the
// temperatures of logits rows at 2, the row keys (u64 words) at 3 and, with `has_min_p`, the
// per-row min_p at 4. Needs shard.wgsl; the including shader's argument struct `p` has the fields
// `temperature_off`, `row_key_off`, `min_p_off`, `has_min_p` and `logits` that `bind_rows` fills.

// scores [rows, len]: probabilities, or logits when `p.logits` is 1
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
// logits rows: the per-row temperature (f32 bits)
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
// [rows] u64 words: each whole row's row key
@group(0) @binding(3) var<storage, read> row_key: array<u32>;
// with `has_min_p`: the per-row min_p (f32 bits)
@group(0) @binding(4) var<storage, read> min_p: array<u32>;

/// Row `row`'s temperature as f32 bits (1.0 for probability rows, which have none).
fn row_temperature(row: u32) -> u32 {
    if p.logits == 0u {
        return 0x3f800000u;
    }
    return temperature[p.temperature_off + row];
}

/// How row `row`'s tokens weigh as tokens of its whole row: its row key, temperature and min_p.
fn row_weigh(row: u32) -> SliceWeigh {
    var min_p_bits = 0u;
    if p.has_min_p != 0u {
        min_p_bits = min_p[p.min_p_off + row];
    }
    let key = vec2<u32>(row_key[p.row_key_off + 2u * row], row_key[p.row_key_off + 2u * row + 1u]);
    return slice_weigh(p.logits != 0u, key, row_temperature(row), min_p_bits);
}
