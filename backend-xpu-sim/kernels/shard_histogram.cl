// shard_histogram (docs/semantics.md §5.15): one cluster per row (cluster-stride). Every core
// keys its part of the slice (staged a tile at a time) and adds each token within the row's prefix
// and at or above its floor to the cluster's 256 bins: a count, and its weight as a token of the
// whole row (slice_weigh) in two 32-bit words with counted carries, so the masses are exact
// whatever the order of the adds. The cores then write the bins out.

// struct ShardHistogramArgs: generated from src/ops/shard_histogram.rs.

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature),
                    BUF(const ulong, row_key), BUF(const uint, min_p), BUF(const ulong, prefix),
                    BUF(const ulong, floors), BUF(ulong, counts), BUF(ulong, masses),
                    const struct ShardHistogramArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const uint, temperature, min_p);
    BIND(const ulong, row_key, prefix, floors);
    BIND(ulong, counts, masses);
    const uint rows = args.rows, len = args.len, first = args.first, shift = args.shift;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = matrix + (ulong)r * len;
        SliceWeigh sw = slice_weigh(row_key[r], ROW_TEMPERATURE(temperature, r),
                                    ROW_MIN_P(min_p, args.has_min_p, r));
        const ulong want = prefix[r], low = floors[r];
        FOR_CORE_ITEMS(i, 256u) {
            S->hist_count[i] = 0u;
            S->hist_lo[i] = 0u;
            S->hist_hi[i] = 0u;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        uint lo, hi;
        core_slice(len, &lo, &hi);
        FOR_STAGED_BITS(row, lo, hi, bits, j, {
            ulong k = token_key(ORDER_RANK, bits, first + j);
            // The key above the bucket's 8 bits (none of it when shift + 8 == 64).
            ulong above = shift + 8u >= 64u ? 0ul : k >> (shift + 8u);
            if (k >= low && above == want) {
                uint bin = (uint)(k >> shift) & 255u;
                atomic_inc(&S->hist_count[bin]);
                bin_add_mass(&S->hist_lo[bin], &S->hist_hi[bin], slice_weight(sw, bits, first + j));
            }
        })
        barrier(CLK_LOCAL_MEM_FENCE);
        FOR_CORE_ITEMS(i, 256u) {
            ulong at = (ulong)r * 256ul + i;
            counts[at] = (ulong)S->hist_count[i];
            masses[at] = ((ulong)S->hist_hi[i] << 32) | (ulong)S->hist_lo[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
