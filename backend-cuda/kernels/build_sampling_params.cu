// build_sampling_params (`docs/semantics.md` §5.3): per output row, its slot's top_p, top_k and temperature,
// and the seed (infer_seed + 4·j) mod MAX_INFER_SEED of its position j; padding rows get
// top_p 1, top_k 0, temperature 1, seed 0. One thread per output row.

extern "C" __global__ void __launch_bounds__(SPECULA_BATCH_BLOCK)
    SPECULA_ENTRY(build_sampling_params)(const SamplingParamsArgs a) {
    const u64 t = (u64)blockIdx.x * SPECULA_BATCH_BLOCK + threadIdx.x;
    if (t >= a.rows) return;
    u32 b;
    u64 pos;
    if (row_source(a.batch_id, a.cu_out, a.this_time, a.encoder, a.real_bsz, a.max_step_tokens, t, b, pos)) {
        a.top_p[t] = a.slot_top_p[b];
        a.top_k[t] = a.slot_top_k[b];
        a.temperature[t] = a.slot_temperature[b];
        a.seed[t] = row_seed(a.slot_seed[b], pos);
    } else {
        a.top_p[t] = 1.0f;
        a.top_k[t] = 0;
        a.temperature[t] = 1.0f;
        a.seed[t] = 0;
    }
}
