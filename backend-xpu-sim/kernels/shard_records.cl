// shard_records (docs/semantics.md §5.14): one cluster per row (cluster-stride), no sort of the
// slice. The n = min(K, len)-th largest key is found by a radix selection, 8 bits a round from
// bit 48 down (cluster-wide count histograms of the keys within the prefix chosen so far, filled
// by every core); keys are distinct, so the round whose bucket holds exactly the tokens still
// needed ends it, at the latest the last. The n tokens at or above that threshold are gathered
// into local memory in id order (a scan of the cores' counts gives each core its place), and each
// record's place is the number of gathered keys above it; its weight is that of a token of the
// whole row (slice_weigh). Records n .. K are (0, 0).

// struct ShardRecordsArgs: generated from src/ops/shard_records.rs.

// The n-th largest key of the slice `row` in `order` (1 <= n <= len): a radix selection.
inline ulong nth_key(__global const T_STORE* row, uint len, uint first, uint order, uint n,
                     __local Scratch* S) {
    uint lo, hi;
    core_slice(len, &lo, &hi);
    ulong prefix = 0ul, threshold = 0ul;
    uint need = n, done = 0u;
    for (int shift = 48; shift >= 0; shift -= 8) {
        FOR_CORE_ITEMS(i, 256u) S->hist_count[i] = 0u;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (done == 0u) {
            FOR_STAGED_BITS(row, lo, hi, bits, j, {
                ulong k = token_key(order, bits, first + j);
                if ((k >> (shift + 8)) == prefix) atomic_inc(&S->hist_count[(uint)(k >> shift) & 255u]);
            })
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (LID == 0u && done == 0u) {
            // From the top bucket down, the one where the count above reaches `need`.
            uint above = 0u, digit = 0u;
            for (int bin = 255; bin >= 0; bin--) {
                uint c = S->hist_count[bin];
                if (above + c >= need) {
                    digit = (uint)bin;
                    break;
                }
                above += c;
            }
            S->bc_u64[0] = (prefix << 8) | (ulong)digit;
            S->bc_u32[0] = need - above;
            S->bc_u32[1] = S->hist_count[digit] == need - above ? 1u : 0u;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (done == 0u) {
            prefix = S->bc_u64[0];
            need = S->bc_u32[0];
            done = S->bc_u32[1];
            threshold = prefix << shift;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return threshold;
}

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature),
                    BUF(const ulong, row_key), BUF(const uint, min_p), BUF(ulong, records),
                    const struct ShardRecordsArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const uint, temperature, min_p);
    BIND(const ulong, row_key);
    BIND(ulong, records);
    const uint rows = args.rows, len = args.len, first = args.first, order = args.order;
    const uint K = args.records, n = min(K, len);
    __local Scratch S[1];
    __local ulong members[MAX_SHARD_RECORDS];
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = matrix + (ulong)r * len;
        __global ulong* out = records + (ulong)r * 2ul * K;
        SliceWeigh sw = slice_weigh(row_key[r], ROW_TEMPERATURE(temperature, r),
                                    ROW_MIN_P(min_p, args.has_min_p, r));
        const ulong threshold = nth_key(row, len, first, order, n, S);
        uint lo, hi;
        core_slice(len, &lo, &hi);
        uint mine = 0u;
        FOR_STAGED_BITS(row, lo, hi, bits, j, { mine += token_key(order, bits, first + j) >= threshold ? 1u : 0u; })
        ulong total;
        uint at = (uint)cluster_scan((ulong)mine, S, &total);
        FOR_STAGED_BITS(row, lo, hi, bits, j, {
            ulong k = token_key(order, bits, first + j);
            if (k >= threshold && at < n) members[at++] = k;
        })
        barrier(CLK_LOCAL_MEM_FENCE);
        FOR_CORE_ITEMS(i, n) {
            ulong k = members[i];
            uint place = 0u;
            for (uint m = 0; m < n; m++) place += members[m] > k ? 1u : 0u;
            uint id = key_id(k);
            out[2u * place] = k;
            out[2u * place + 1u] = slice_weight(sw, LOAD_T(row, id - first), id);
        }
        FOR_CORE_ITEMS(i, 2u * (K - n)) out[2u * n + i] = 0ul;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
