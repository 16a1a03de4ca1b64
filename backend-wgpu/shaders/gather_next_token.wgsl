// gather_next_token (`docs/semantics.md` §5.2): a bit-exact byte copy, one invocation per output word, so any
// dtype (including 1- and 2-byte elements at any window offset) is copied without write races;
// bytes of the word outside the output window are written back unchanged. Hidden states larger
// than one storage binding are gathered in input-row chunks: a dispatch copies only the bytes whose
// source row lies in its chunk, and the first dispatch writes the zero rows.

// `struct GatherNextTokenArgs` is generated from its `kernel_args!` declaration in src/ops/gather_next_token.rs.

@group(0) @binding(0) var<uniform> p: GatherNextTokenArgs;
@group(0) @binding(1) var<storage, read> hidden: array<u32>;
@group(0) @binding(2) var<storage, read> cu_q: array<i32>;
@group(0) @binding(3) var<storage, read> this_time: array<i32>;
@group(0) @binding(4) var<storage, read> encoder: array<i32>;
@group(0) @binding(5) var<storage, read> cu_out: array<i32>;
@group(0) @binding(6) var<storage, read> batch_id: array<i32>;
@group(0) @binding(7) var<storage, read_write> out: array<u32>;

/// The packed input row `cu_q[b] + pos`, or NO_ROW outside [0, token_num).
fn packed_row(b: u32, pos: u32) -> u32 {
    return row_at(cu_q[p.cu_q_off + b], pos, p.token_num);
}

/// The last packed token of slot b (its this_time is > 0 here).
fn last_row(b: u32) -> u32 {
    return packed_row(b, u32(this_time[p.this_time_off + b]) - 1u);
}

fn source(t: u32) -> u32 {
    if p.is_speculative != 0u {
        let slot = slot_of_row(batch_id[p.batch_id_off + t], p.real_bsz);
        if slot == NO_SLOT {
            return NO_ROW;
        }
        let e = encoder[p.encoder_off + slot];
        let rows = slot_output_rows(this_time[p.this_time_off + slot], e, p.step_tokens);
        let pos = position_in_slot(t, cu_out[p.cu_out_off + slot], rows);
        if pos == NO_ROW {
            return NO_ROW;
        }
        if e > 0 {
            return last_row(slot);
        }
        return packed_row(slot, pos);
    }
    if t < p.real_bsz {
        let tt = this_time[p.this_time_off + t];
        if slot_output_rows(tt, encoder[p.encoder_off + t], p.step_tokens) > 0u {
            return last_row(t);
        }
    }
    return NO_ROW;
}

@compute @workgroup_size(WG)
fn gather_next_token_i32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = invocation_index(gid, nwg);
    if k >= p.out_words {
        return;
    }
    let w = p.out_first_word + k;
    let old = out[w];
    var word = old;
    var cached_t = NO_ROW;
    var cached_src = NO_ROW;
    for (var byte = 0u; byte < 4u; byte++) {
        let at = w * 4u + byte;
        if at < p.out_byte_off || at - p.out_byte_off >= p.out_bytes {
            continue;
        }
        let ob = at - p.out_byte_off;
        let t = ob / p.row_bytes;
        let within = ob % p.row_bytes;
        if t != cached_t {
            cached_t = t;
            cached_src = source(t);
        }
        var value: u32;
        if cached_src == NO_ROW {
            if p.first_chunk == 0u {
                continue;
            }
            value = 0u;
        } else if cached_src >= p.in_row_lo && cached_src < p.in_row_hi {
            let ib = p.in_byte_off + (cached_src - p.in_row_lo) * p.row_bytes + within;
            value = (hidden[ib >> 2u] >> ((ib & 3u) * 8u)) & 0xffu;
        } else {
            continue;
        }
        let shift = byte * 8u;
        word = (word & ~(0xffu << shift)) | (value << shift);
    }
    if word != old {
        out[w] = word;
    }
}
