// shard_records (`docs/semantics.md` §5.14): one workgroup per row, no sort of the slice. The
// n = min(K, len)-th largest key is found by a radix selection, 8 bits a round from bit 48 down
// (a workgroup count histogram of the keys within the prefix chosen so far); keys are distinct,
// so the round whose bucket holds exactly the tokens still needed ends it, at the latest the last.
// The n tokens at or above that threshold are gathered into workgroup memory in id order (each
// invocation a contiguous part, placed by a scan of the counts), each record's place is the number
// of gathered keys above it, and its weight is that of a token of the whole row (shard.wgsl).
// Records n .. K are (0, 0).

// `struct ShardRecordsArgs` is generated from its `kernel_args!` declaration in src/ops/shard_records.rs.

@group(0) @binding(0) var<uniform> p: ShardRecordsArgs;
// bindings 1-4: the rows (shard_rows.wgsl)
// [rows, K, 2] u64 words
@group(0) @binding(5) var<storage, read_write> records: array<u32>;

var<workgroup> h_count: array<atomic<u32>, 256>;
var<workgroup> members: array<vec2<u32>, MAX_SHARD_RECORDS>;
var<workgroup> s_select: vec4<u32>;

/// The n-th largest key of the current row in `order` (1 <= n <= len): a radix selection, uniform.
fn nth_key(lid: u32, len: u32, order: u32, logits: bool, n: u32) -> vec2<u32> {
    var prefix = vec2<u32>(0u);
    var threshold = vec2<u32>(0u);
    var need = n;
    var done = false;
    for (var round = 0u; round < 7u; round++) {
        let shift = 48u - 8u * round;
        for (var b = lid; b < 256u; b += WG) {
            atomicStore(&h_count[b], 0u);
        }
        workgroupBarrier();
        if !done {
            for (var i = lid; i < len; i += WG) {
                let k = token_key(order, logits, row_bits(i), p.first + i);
                if eq64(shr64(k, shift + 8u), prefix) {
                    atomicAdd(&h_count[shr64(k, shift).x & 255u], 1u);
                }
            }
        }
        workgroupBarrier();
        if lid == 0u && !done {
            // From the top bucket down, the one where the count above reaches `need`.
            var above = 0u;
            var digit = 0u;
            for (var bi = 0u; bi < 256u; bi++) {
                let b = 255u - bi;
                let c = atomicLoad(&h_count[b]);
                if above + c >= need {
                    digit = b;
                    break;
                }
                above = above + c;
            }
            let chosen = shl64(prefix, 8u) | vec2<u32>(digit, 0u);
            let rest = need - above;
            s_select = vec4<u32>(chosen, rest, select(0u, 1u, atomicLoad(&h_count[digit]) == rest));
        }
        let st = workgroupUniformLoad(&s_select);
        if !done {
            prefix = st.xy;
            need = st.z;
            done = st.w != 0u;
            threshold = shl64(prefix, shift);
        }
    }
    return threshold;
}

// Entry points `shard_records_<dtype>` (generated, kernels.rs; groups with work only).
fn shard_records_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.input_off + g * p.vocab);
    let row = p.row0 + g;
    let len = p.vocab;
    let logits = p.logits != 0u;
    let order = p.order;
    let k_records = p.records;
    let n = min(k_records, len);
    let sw = row_weigh(row);
    let threshold = nth_key(lid, len, order, logits, n);
    let part = chunk_range(lid, len);
    var mine = 0u;
    for (var i = part.x; i < part.y; i++) {
        if ge64(token_key(order, logits, row_bits(i), p.first + i), threshold) {
            mine = mine + 1u;
        }
    }
    var at = wg_scan32(lid, mine).x;
    for (var i = part.x; i < part.y; i++) {
        let k = token_key(order, logits, row_bits(i), p.first + i);
        if ge64(k, threshold) && at < n {
            members[at] = k;
            at = at + 1u;
        }
    }
    workgroupBarrier();
    let out = p.records_off + 4u * k_records * row;
    for (var i = lid; i < n; i += WG) {
        let k = members[i];
        var place = 0u;
        for (var m = 0u; m < n; m++) {
            if lt64(k, members[m]) {
                place = place + 1u;
            }
        }
        let id = key_id(k);
        let w = slice_weight(sw, logits, row_bits(id - p.first), id);
        let at_record = out + 4u * place;
        records[at_record] = k.x;
        records[at_record + 1u] = k.y;
        records[at_record + 2u] = w.x;
        records[at_record + 3u] = w.y;
    }
    for (var i = 4u * n + lid; i < 4u * k_records; i += WG) {
        records[out + i] = 0u;
    }
}
