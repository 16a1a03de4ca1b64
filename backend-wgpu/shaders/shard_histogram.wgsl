// shard_histogram (`docs/semantics.md` §5.15): one workgroup per row. Every invocation keys its
// strided part of the slice and adds each token within the row's prefix and at or above its floor
// to the workgroup's 256 buckets: a count, and its weight as a token of the whole row (shard.wgsl)
// as two 32-bit words with an explicit carry (mass_bins.wgsl), so the masses are exact whatever the
// order of the adds. Then the buckets are written out as u64 words.

// `struct ShardHistogramArgs` is generated from its `kernel_args!` declaration in src/ops/shard_histogram.rs.

@group(0) @binding(0) var<uniform> p: ShardHistogramArgs;
// bindings 1-4: the rows (shard_rows.wgsl)
@group(0) @binding(5) var<storage, read> prefix: array<u32>;
@group(0) @binding(6) var<storage, read> floors: array<u32>;
@group(0) @binding(7) var<storage, read_write> counts: array<u32>;
@group(0) @binding(8) var<storage, read_write> masses: array<u32>;

var<workgroup> h_count: array<atomic<u32>, 256>;
var<workgroup> h_mlo: array<atomic<u32>, 256>;
var<workgroup> h_mhi: array<atomic<u32>, 256>;

// Entry points `shard_histogram_<dtype>` (generated, kernels.rs; groups with work only).
fn shard_histogram_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.input_off + g * p.vocab);
    let row = p.row0 + g;
    let logits = p.logits != 0u;
    let sw = row_weigh(row);
    let want = vec2<u32>(prefix[p.prefix_off + 2u * row], prefix[p.prefix_off + 2u * row + 1u]);
    let low = vec2<u32>(floors[p.floor_off + 2u * row], floors[p.floor_off + 2u * row + 1u]);
    clear_bins(lid, 256u);
    workgroupBarrier();
    let shift = p.shift;
    for (var i = lid; i < p.vocab; i += WG) {
        let bits = row_bits(i);
        let id = p.first + i;
        let k = token_key(ORDER_RANK, logits, bits, id);
        // The key above the bucket's 8 bits (none of it when shift + 8 == 64).
        var above = vec2<u32>(0u);
        if shift + 8u < 64u {
            above = shr64(k, shift + 8u);
        }
        if ge64(k, low) && eq64(above, want) {
            let bin = shr64(k, shift).x & 255u;
            atomicAdd(&h_count[bin], 1u);
            add_mass(bin, slice_weight(sw, logits, bits, id));
        }
    }
    workgroupBarrier();
    for (var b = lid; b < 256u; b += WG) {
        let at = 2u * (row * 256u + b);
        counts[p.counts_off + at] = atomicLoad(&h_count[b]);
        counts[p.counts_off + at + 1u] = 0u;
        masses[p.masses_off + at] = atomicLoad(&h_mlo[b]);
        masses[p.masses_off + at + 1u] = atomicLoad(&h_mhi[b]);
    }
}
