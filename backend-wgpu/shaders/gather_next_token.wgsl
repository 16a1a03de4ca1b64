// gather_next_token (contract §4.1): a bit-exact byte copy, one invocation per output word, so any
// dtype (including 1- and 2-byte elements at any window offset) is copied without write races;
// bytes of the word outside the output window are written back unchanged. Hidden states larger
// than one storage binding are gathered in input-row chunks: a dispatch copies only the bytes whose
// source row lies in its chunk, and the first dispatch writes the zero rows.

struct Params {
    row_bytes: u32,
    out_rows: u32,
    out_byte_off: u32,
    out_bytes: u32,
    out_first_word: u32,
    out_words: u32,
    in_byte_off: u32,
    in_row_lo: u32,
    in_row_hi: u32,
    first_chunk: u32,
    token_num: u32,
    real_bsz: u32,
    step_tokens: u32,
    is_speculative: u32,
    cu_q_off: u32,
    this_time_off: u32,
    encoder_off: u32,
    cu_out_off: u32,
    batch_id_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> hidden: array<u32>;
@group(0) @binding(2) var<storage, read> cu_q: array<i32>;
@group(0) @binding(3) var<storage, read> this_time: array<i32>;
@group(0) @binding(4) var<storage, read> encoder: array<i32>;
@group(0) @binding(5) var<storage, read> cu_out: array<i32>;
@group(0) @binding(6) var<storage, read> batch_id: array<i32>;
@group(0) @binding(7) var<storage, read_write> out: array<u32>;

const NO_ROW: u32 = 0xffffffffu;

fn slot_output_rows(t: i32, e: i32, s: u32) -> u32 {
    if t <= 0 {
        return 0u;
    }
    if e > 0 {
        return 1u;
    }
    return min(u32(t), s);
}

/// The packed input row `cu_q[b] + pos`, or NO_ROW outside [0, token_num).
fn packed_row(b: u32, pos: u32) -> u32 {
    let cu = cu_q[p.cu_q_off + b];
    var row: u32;
    if cu >= 0 {
        row = u32(cu) + pos;
        if row < u32(cu) {
            return NO_ROW;
        }
    } else {
        let neg = 0u - bitcast<u32>(cu);
        if pos < neg {
            return NO_ROW;
        }
        row = pos - neg;
    }
    if row >= p.token_num {
        return NO_ROW;
    }
    return row;
}

/// The last packed token of slot b (its this_time is > 0 here).
fn last_row(b: u32) -> u32 {
    return packed_row(b, u32(this_time[p.this_time_off + b]) - 1u);
}

fn source(t: u32) -> u32 {
    if p.is_speculative != 0u {
        let b = batch_id[p.batch_id_off + t];
        if b < 0 || u32(b) >= p.real_bsz {
            return NO_ROW;
        }
        let slot = u32(b);
        let start = cu_out[p.cu_out_off + slot];
        if start > i32(t) {
            return NO_ROW;
        }
        let pos = t - bitcast<u32>(start);
        let tt = this_time[p.this_time_off + slot];
        let e = encoder[p.encoder_off + slot];
        if pos >= slot_output_rows(tt, e, p.step_tokens) {
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
    let k = gid.x + gid.y * nwg.x * WG;
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
