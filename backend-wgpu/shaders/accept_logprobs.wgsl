// accept_logprobs (`docs/semantics.md` §5.11). `accept_logprobs_pack_i32` (one invocation) packs the accepted
// counts into `cu_accept` and writes one (token, source row) entry per packed slot of the output.
// `accept_logprobs_<dtype>` then scores each entry with one workgroup: softmax statistics of the
// source row, the token's rank (integer keys, NaN as -inf), and the top-K by a radix count
// selection on argmax order keys (never a sort of the row), K <= 64 ordered among themselves.
// Logits larger than one storage binding are processed in row chunks: an entry is scored in the
// dispatch whose chunk holds its row; entries without a row are written by the first dispatch.

// `struct AcceptLogprobsPackArgs` is generated from its `kernel_args!` declaration in src/ops/accept_logprobs.rs.

@group(0) @binding(9) var<uniform> pk: AcceptLogprobsPackArgs;
@group(0) @binding(10) var<storage, read> accept_tokens: array<i32>;
@group(0) @binding(11) var<storage, read> accept_num: array<i32>;
@group(0) @binding(12) var<storage, read> encoder: array<i32>;
@group(0) @binding(13) var<storage, read> cu_out: array<i32>;
@group(0) @binding(14) var<storage, read_write> cu_accept: array<i32>;
@group(0) @binding(15) var<storage, read_write> entries_out: array<i32>;

@compute @workgroup_size(1)
fn accept_logprobs_pack_i32() {
    let s = pk.step_tokens;
    var total = 0u;
    cu_accept[pk.cu_accept_off] = 0;
    for (var b = 0u; b < pk.max_bsz; b++) {
        var n = 0u;
        if b < pk.real_bsz {
            n = min(len_or_zero(accept_num[pk.accept_num_off + b]), s);
        }
        let prefill = encoder[pk.encoder_off + b] > 0;
        var base = 0;
        if b < pk.real_bsz {
            base = cu_out[pk.cu_out_off + b];
        }
        for (var k = 0u; k < n; k++) {
            // Decode: row base + k; prefill: its single row base. Missing outside [0, rows).
            let r = row_at(base, select(k, 0u, prefill), pk.rows);
            let row = select(i32(r), -1, r == NO_ROW);
            entries_out[2u * total] = accept_tokens[pk.accept_tokens_off + b * s + k];
            entries_out[2u * total + 1u] = row;
            total = total + 1u;
        }
        cu_accept[pk.cu_accept_off + b + 1u] = i32(total);
    }
    for (var e = total; e < pk.max_bsz * s; e++) {
        entries_out[2u * e] = -1;
        entries_out[2u * e + 1u] = -2;
    }
}

// `struct AcceptLogprobsArgs` is generated from its `kernel_args!` declaration in src/ops/accept_logprobs.rs.

@group(0) @binding(0) var<uniform> p: AcceptLogprobsArgs;
// logits [rows, vocab]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
@group(0) @binding(3) var<storage, read> entries: array<i32>;
@group(0) @binding(4) var<storage, read_write> token_ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> logprobs: array<f32>;
@group(0) @binding(6) var<storage, read_write> ranks: array<i32>;
@group(0) @binding(7) var<storage, read_write> top_ids: array<i32>;
@group(0) @binding(8) var<storage, read_write> top_logprobs: array<f32>;

// is_active, token, row (as u32, 0xffffffff none), temperature bits
var<workgroup> wg_entry: vec4<u32>;

fn row_key(i: u32) -> u32 {
    return order_key(row_bits(i));
}

/// Writes the empty top-K entries `first .. k` of entry `e`.
fn clear_top(lid: u32, e: u32, k: u32, first: u32) {
    for (var j = first + lid; j < k; j += WG) {
        top_ids[p.top_ids_off + e * k + j] = -1;
        top_logprobs[p.top_logprobs_off + e * k + j] = neg_inf();
    }
}

// Entry points `accept_logprobs_<dtype>` (generated, kernels.rs; groups with work only).
fn accept_logprobs_main(e: u32, lid: u32, dt: u32) {
    let k = p.top_k;
    if lid == 0u {
        let token = entries[2u * e];
        let row = entries[2u * e + 1u];
        var is_active = 0u;
        var r = 0xffffffffu;
        var t = 0u;
        if row >= 0 {
            r = u32(row);
            if r >= p.row_lo && r < p.row_hi {
                is_active = 1u;
                t = temperature[p.temperature_off + r];
            }
        } else if p.first_chunk != 0u {
            is_active = 2u;
        }
        wg_entry = vec4<u32>(is_active, bitcast<u32>(token), r, t);
    }
    let ent = workgroupUniformLoad(&wg_entry);
    if ent.x == 0u {
        return;
    }
    let token = bitcast<i32>(ent.y);
    if ent.x == 2u {
        // No source row (padding entry, or a row outside the logits).
        if lid == 0u {
            token_ids[p.token_ids_off + e] = token;
            logprobs[p.logprobs_off + e] = neg_inf();
            ranks[p.ranks_off + e] = 0;
        }
        clear_top(lid, e, k, 0u);
        return;
    }
    let vocab = p.vocab;
    begin_row(dt, p.logits_off + (ent.z - p.row_lo) * vocab);
    let t = effective_temperature(ent.w);
    let st = row_stats(lid, vocab, t);
    let valid = token >= 0 && u32(token) < vocab;
    // Rank: 1 + the number of logits strictly above the token's (NaN as -inf).
    var larger = 0u;
    if valid {
        let tv = rank_value_key(row_bits(u32(token)));
        for (var i = lid; i < vocab; i += WG) {
            if rank_value_key(row_bits(i)) > tv {
                larger = larger + 1u;
            }
        }
    }
    let above = wg_sum32(lid, larger);
    if lid == 0u {
        token_ids[p.token_ids_off + e] = token;
        if valid {
            let ti = u32(token);
            logprobs[p.logprobs_off + e] = stats_logprob(st, ti, row_bits(ti), t, vocab);
            ranks[p.ranks_off + e] = i32(min(above + 1u, 0x7fffffffu));
        } else {
            logprobs[p.logprobs_off + e] = neg_inf();
            ranks[p.ranks_off + e] = 0;
        }
    }
    if k == 0u {
        return;
    }
    // Top-K in argmax order: a count selection of the K-th order key, then the members (at most
    // K <= MAX_LOGPROBS_TOP_K) ordered among themselves.
    var sel = Sel(0u, 0xffffffffu, vocab, 1u, vec2<u32>(0u));
    if k < vocab {
        sel = select_prefix(lid, vocab, 0u, METRIC_COUNT, u64_from(k), 32u);
    }
    let n = min(sel.count, k);
    gather_members(lid, vocab, sel, 0u);
    for (var j = lid; j < n; j += WG) {
        let rank = member_rank(j, n);
        let ij = m_id[j];
        var bits = 0u;
        if st.kind != KIND_ONEHOT {
            bits = row_bits(ij);
        }
        top_ids[p.top_ids_off + e * k + rank] = i32(ij);
        top_logprobs[p.top_logprobs_off + e * k + rank] = stats_logprob(st, ij, bits, t, vocab);
    }
    clear_top(lid, e, k, n);
}
