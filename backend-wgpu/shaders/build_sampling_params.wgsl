// build_sampling_params (`docs/semantics.md` §5.3): one invocation per output row; the row's slot and position
// are resolved from the (untrusted) layout exactly as every op does, the seed is
// `(infer_seed + 4·j) mod MAX_INFER_SEED` in 64-bit limbs.

// `struct BuildSamplingParamsArgs` is generated from its `kernel_args!` declaration in src/ops/build_sampling_params.rs.

@group(0) @binding(0) var<uniform> p: BuildSamplingParamsArgs;
@group(0) @binding(1) var<storage, read> slot_top_p: array<u32>;
@group(0) @binding(2) var<storage, read> slot_top_k: array<i32>;
@group(0) @binding(3) var<storage, read> slot_temperature: array<u32>;
@group(0) @binding(4) var<storage, read> infer_seed: array<u32>;
@group(0) @binding(5) var<storage, read> this_time: array<i32>;
@group(0) @binding(6) var<storage, read> encoder: array<i32>;
@group(0) @binding(7) var<storage, read> cu_out: array<i32>;
@group(0) @binding(8) var<storage, read> batch_id: array<i32>;
@group(0) @binding(9) var<storage, read_write> out_top_p: array<u32>;
@group(0) @binding(10) var<storage, read_write> out_top_k: array<i32>;
@group(0) @binding(11) var<storage, read_write> out_temperature: array<u32>;
@group(0) @binding(12) var<storage, read_write> out_seed: array<u32>;

@compute @workgroup_size(WG)
fn build_sampling_params_i32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = invocation_index(gid, nwg);
    if t >= p.rows {
        return;
    }
    var top_p = 0x3f800000u;
    var top_k = 0;
    var temperature = 0x3f800000u;
    var seed = vec2<u32>(0u);
    let slot = slot_of_row(batch_id[p.batch_id_off + t], p.real_bsz);
    if slot != NO_SLOT {
        let rows = slot_output_rows(this_time[p.this_time_off + slot], encoder[p.encoder_off + slot], p.step_tokens);
        let pos = position_in_slot(t, cu_out[p.cu_out_off + slot], rows);
        if pos != NO_ROW {
            top_p = slot_top_p[p.top_p_off + slot];
            top_k = slot_top_k[p.top_k_off + slot];
            temperature = slot_temperature[p.temperature_off + slot];
            let s = p.infer_seed_off + 2u * slot;
            seed = row_seed(vec2<u32>(infer_seed[s], infer_seed[s + 1u]), pos);
        }
    }
    out_top_p[p.out_top_p_off + t] = top_p;
    out_top_k[p.out_top_k_off + t] = top_k;
    out_temperature[p.out_temperature_off + t] = temperature;
    out_seed[p.out_seed_off + 2u * t] = seed.x;
    out_seed[p.out_seed_off + 2u * t + 1u] = seed.y;
}
