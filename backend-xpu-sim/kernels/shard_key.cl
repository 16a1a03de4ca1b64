// shard_key (docs/semantics.md §5.13): one cluster per row (cluster-stride); each core the largest
// key of its part of the slice (staged a tile at a time), core 0 the largest of the cores'. With
// `ids`, core 0 keys the one token ids[r] when the slice holds it (0 otherwise) and the cores read
// nothing.

// struct ShardKeyArgs: generated from src/ops/shard_key.rs.

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const int, ids), BUF(ulong, keys),
                    const struct ShardKeyArgs args) {
    BIND(const T_STORE, matrix);
    BIND(const int, ids);
    BIND(ulong, keys);
    const uint rows = args.rows, len = args.len, first = args.first, order = args.order;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = matrix + (ulong)r * len;
        uint lo, hi;
        core_slice(len, &lo, &hi);
        if (args.has_ids != 0u) hi = lo;
        ulong best = NO_KEY;
        FOR_STAGED_BITS(row, lo, hi, bits, j, { best = max(best, token_key(order, bits, first + j)); })
        best = cluster_max_u64(best, S);
        if (LID == 0u) {
            ulong key = best;
            if (args.has_ids != 0u) {
                long j = (long)ids[r] - (long)first;
                bool held = j >= 0l && j < (long)len;
                key = held ? token_key(order, LOAD_T(row, (uint)j), first + (uint)j) : NO_KEY;
            }
            keys[r] = key;
        }
    }
}
