// shard_walk (docs/semantics.md §5.16): one cluster per row (cluster-stride). The kept tokens are
// those whose rank key reaches the row's threshold; each walks with its weight as a token of the
// whole row, or (`has_residual`) with REJECTION's residual against its draft row. Each core sums
// its contiguous part of the slice (saturating) and counts its kept tokens; core 0 scans the
// partial sums in core order; the one core whose range first exceeds the offset walks its part
// again in ascending id order to the token. Integer throughout, so nothing depends on the launch.

// struct ShardWalkArgs: generated from src/ops/shard_walk.rs.

// What a row's tokens walk with: the kept weight wp, or its residual against draft row q.
typedef struct {
    __global const T_STORE* q;  // the draft row (residual on)
    SliceWeigh qw;              // its weighing: its own row key, the target row's temperature
    ulong target_mass;          // Wp
    ulong draft_mass;           // Wq
    uint shift;
    uint on;                    // 0: the kept weights; 1: the residual; 2: the residual of no draft (0)
} Walked;

// The weight token j (global id id, score bits) walks with.
inline ulong walked_weight(SliceWeigh sw, Walked wk, ulong threshold, uint bits, uint j, uint id,
                           bool* kept) {
    *kept = token_key(ORDER_RANK, bits, id) >= threshold;
    ulong wp = *kept ? slice_weight(sw, bits, id) : 0ul;
    if (wk.on == 0u) return wp;
    if (wk.on == 2u) return 0ul;
    ulong wq = slice_weight(wk.qw, LOAD_T(wk.q, j), id);
    return residual_weight(wp, wq, wk.target_mass, wk.draft_mass, wk.shift);
}

__kernel void ENTRY(BUF(const T_STORE, matrix), BUF(const uint, temperature),
                    BUF(const ulong, row_key), BUF(const uint, min_p), BUF(const ulong, threshold),
                    BUF(const ulong, offset), BUF(const T_STORE, draft), BUF(const ulong, draft_key),
                    BUF(const int, draft_row), BUF(const ulong, target_mass),
                    BUF(const ulong, draft_mass), BUF(int, tokens), BUF(ulong, mass),
                    BUF(ulong, count), const struct ShardWalkArgs args) {
    BIND(const T_STORE, matrix, draft);
    BIND(const uint, temperature, min_p);
    BIND(const ulong, row_key, threshold, offset, draft_key, target_mass, draft_mass);
    BIND(const int, draft_row);
    BIND(int, tokens);
    BIND(ulong, mass, count);
    const uint rows = args.rows, len = args.len, first = args.first;
    __local Scratch S[1];
    FOR_CLUSTER_ROWS(r, rows) {
        __global const T_STORE* row = matrix + (ulong)r * len;
        const uint t_bits = ROW_TEMPERATURE(temperature, r);
        SliceWeigh sw = slice_weigh(row_key[r], t_bits, ROW_MIN_P(min_p, args.has_min_p, r));
        const ulong cut = threshold[r], start_at = offset[r];
        Walked wk;
        wk.q = draft;
        wk.on = 0u;
        wk.target_mass = 0ul;
        wk.draft_mass = 0ul;
        wk.shift = 0u;
        wk.qw = sw;
        if (args.has_residual != 0u) {
            int d = draft_row[r];
            bool valid = d >= 0 && (uint)d < args.draft_rows;
            wk.on = valid ? 1u : 2u;
            if (valid) {
                wk.q = draft + (ulong)d * len;
                wk.qw = slice_weigh(draft_key[d], t_bits, 0u);
                wk.target_mass = target_mass[r];
                wk.draft_mass = draft_mass[r];
                wk.shift = residual_shift(wk.target_mass, wk.draft_mass);
            }
        }
        uint lo, hi;
        core_slice(len, &lo, &hi);
        ulong part = 0ul;
        uint kept_here = 0u;
        FOR_STAGED_BITS(row, lo, hi, bits, j, {
            bool kept;
            part = add_sat(part, walked_weight(sw, wk, cut, bits, j, first + j, &kept));
            kept_here += kept ? 1u : 0u;
        })
        ulong kept_total = cluster_sum((ulong)kept_here, S);
        // bc_u32[2]: the id found by the one core whose range crosses the offset (the scan's
        // barriers order this reset before it).
        if (LID == 0u) S->bc_u32[2] = 0xffffffffu;
        ulong total;
        ulong before = cluster_scan_sat(part, S, &total);
        if (before <= start_at && add_sat(before, part) > start_at) {
            ulong running = before;
            bool found = false;
            FOR_STAGED_BITS(row, lo, hi, bits, j, {
                bool kept;
                running = add_sat(running, walked_weight(sw, wk, cut, bits, j, first + j, &kept));
                if (!found && running > start_at) {
                    found = true;
                    S->bc_u32[2] = first + j;
                }
            })
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (LID == 0u) {
            uint found_id = S->bc_u32[2];
            tokens[r] = found_id == 0xffffffffu ? -1 : (int)found_id;
            mass[r] = total;
            count[r] = kept_total;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
