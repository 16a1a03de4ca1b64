// Histogram bins with a count and an exact 64-bit mass (`docs/semantics.md` §4b weights), shared by
// the radix selection (select.wgsl, 1024 bins) and the sharded rows' histogram (shard_histogram.wgsl,
// 256 bins). The including module declares the bins: `h_count`, `h_mlo` and `h_mhi`, workgroup
// arrays of `atomic<u32>` with one entry per bin (a mass is two 32-bit words, low and high, added
// with an explicit carry, so the masses are exact whatever the order of the adds).

/// Zeroes bins `[0, bins)`, each invocation of the workgroup its strided part (a barrier follows
/// at the caller, before the bins are added to).
fn clear_bins(lid: u32, bins: u32) {
    for (var b = lid; b < bins; b += WG) {
        atomicStore(&h_count[b], 0u);
        atomicStore(&h_mlo[b], 0u);
        atomicStore(&h_mhi[b], 0u);
    }
}

/// Adds the 64-bit weight `w` (low, high word) to the mass of bin `bin`: the low word, then the high
/// word and the carry out of the low one, skipped when it is zero (nothing for a zero weight).
fn add_mass(bin: u32, w: vec2<u32>) {
    if is_zero64(w) {
        return;
    }
    let old = atomicAdd(&h_mlo[bin], w.x);
    let hi = w.y + select(0u, 1u, old + w.x < old);
    if hi != 0u {
        atomicAdd(&h_mhi[bin], hi);
    }
}
