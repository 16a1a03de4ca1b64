// build_output_layout (`docs/semantics.md` §5.1): `build_output_layout_i32` (one invocation) writes the rows per
// slot and both prefix sums, saturating at i32::MAX; `build_output_layout_rows_i32` then writes
// the slot of every output row in parallel by a binary search over `cu_seqlens_q_output`.

// `struct BuildOutputLayoutArgs` is generated from its `kernel_args!` declaration in src/ops/build_output_layout.rs.

@group(0) @binding(0) var<uniform> p: BuildOutputLayoutArgs;
@group(0) @binding(1) var<storage, read> this_time: array<i32>;
@group(0) @binding(2) var<storage, read> encoder: array<i32>;
@group(0) @binding(3) var<storage, read_write> seq_lens_output: array<i32>;
@group(0) @binding(4) var<storage, read_write> cu_q: array<i32>;
@group(0) @binding(5) var<storage, read_write> cu_out: array<i32>;

fn sat_add(a: u32, b: u32) -> u32 {
    let s = a + b;
    return select(s, 0xffffffffu, s < a);
}

fn to_i32(v: u32) -> i32 {
    return i32(min(v, 0x7fffffffu));
}

@compute @workgroup_size(1)
fn build_output_layout_i32() {
    for (var b = 0u; b < p.max_bsz; b++) {
        var rows = 0u;
        if b < p.real_bsz {
            rows = slot_output_rows(this_time[p.this_time_off + b], encoder[p.encoder_off + b], p.step_tokens);
        }
        seq_lens_output[p.seq_lens_output_off + b] = to_i32(rows);
    }
    var acc_in = 0u;
    var acc_out = 0u;
    cu_q[p.cu_q_off] = 0;
    cu_out[p.cu_out_off] = 0;
    for (var b = 0u; b < p.real_bsz; b++) {
        let t = this_time[p.this_time_off + b];
        acc_in = sat_add(acc_in, len_or_zero(t));
        cu_q[p.cu_q_off + b + 1u] = to_i32(acc_in);
        acc_out = sat_add(acc_out, slot_output_rows(t, encoder[p.encoder_off + b], p.step_tokens));
        cu_out[p.cu_out_off + b + 1u] = to_i32(acc_out);
    }
}

// `struct BuildOutputLayoutRowsArgs` is generated from its `kernel_args!` declaration in src/ops/build_output_layout.rs.

@group(0) @binding(6) var<uniform> rp: BuildOutputLayoutRowsArgs;
@group(0) @binding(7) var<storage, read> row_cu_out: array<i32>;
@group(0) @binding(8) var<storage, read_write> batch_id: array<i32>;

@compute @workgroup_size(WG)
fn build_output_layout_rows_i32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = invocation_index(gid, nwg);
    if t >= rp.capacity {
        return;
    }
    let total = u32(max(row_cu_out[rp.cu_out_off + rp.real_bsz], 0));
    if t >= total {
        batch_id[rp.batch_id_off + t] = -1;
        return;
    }
    // The largest slot b < real_bsz with cu_out[b] <= t (cu_out is non-decreasing, cu_out[0] = 0).
    var lo = 0u;
    var hi = rp.real_bsz;
    while hi - lo > 1u {
        let mid = lo + (hi - lo) / 2u;
        if u32(row_cu_out[rp.cu_out_off + mid]) <= t {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    batch_id[rp.batch_id_off + t] = i32(lo);
}
