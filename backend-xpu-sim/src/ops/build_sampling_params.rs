//! `build_sampling_params` (`docs/semantics.md` §5.3, `kernels/build_sampling_params.cl`): one output row per
//! core.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::BuildSamplingParamsCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, batch_program, count};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `build_sampling_params_i32` (`pad`: explicit padding to a multiple of
    /// 8 bytes, always 0).
    pub(crate) struct BuildSamplingParamsArgs {
        slot_top_p_offset: u64,
        slot_top_k_offset: u64,
        slot_temperature_offset: u64,
        slot_seed_offset: u64,
        this_time_offset: u64,
        encoder_offset: u64,
        cu_out_offset: u64,
        batch_id_offset: u64,
        top_p_offset: u64,
        top_k_offset: u64,
        temperature_offset: u64,
        seed_offset: u64,
        real_bsz: u32,
        max_step_tokens: u32,
        rows: u32,
        pad: u32,
    }
}

/// The argument structs of `kernels/build_sampling_params.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<BuildSamplingParamsArgs>()];

/// Launches `build_sampling_params_i32`.
pub(crate) fn run(runtime: &Runtime, mut call: BuildSamplingParamsCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, rows) = call.parts();
    let (slots, lens, layout) = (&inputs.slots, &inputs.lens, &inputs.layout);
    let mut buffers = KernelBuffers::default();
    let args = BuildSamplingParamsArgs {
        slot_top_p_offset: buffers.bind(slots.top_p)?,
        slot_top_k_offset: buffers.bind(slots.top_k)?,
        slot_temperature_offset: buffers.bind(slots.temperature)?,
        slot_seed_offset: buffers.bind(slots.infer_seed)?,
        this_time_offset: buffers.bind(lens.seq_lens_this_time)?,
        encoder_offset: buffers.bind(lens.seq_lens_encoder)?,
        cu_out_offset: buffers.bind(layout.cu_seqlens_q_output)?,
        batch_id_offset: buffers.bind(layout.batch_id_per_token_output)?,
        top_p_offset: buffers.bind(out.top_p)?,
        top_k_offset: buffers.bind(out.top_k)?,
        temperature_offset: buffers.bind(out.temperature)?,
        seed_offset: buffers.bind(out.seed)?,
        real_bsz: count(params.dims.real_bsz),
        max_step_tokens: count(params.dims.max_step_tokens),
        rows: count(*rows),
        pad: 0,
    };
    let (key, entry) = batch_program(Op::BuildSamplingParams);
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The one program `run` launches (what the warm-up builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    vec![super::single(batch_program(Op::BuildSamplingParams))]
}
