//! `build_sampling_params` (`docs/semantics.md` §5.3, `kernels/build_sampling_params.cl`): one output row per
//! core.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::BuildSamplingParamsCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, batch_program, count};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `build_sampling_params_i32`.
    pub(crate) struct BuildSamplingParamsArgs {
        real_bsz: u32,
        max_step_tokens: u32,
        rows: u32,
    }
}

/// The argument structs of `kernels/build_sampling_params.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<BuildSamplingParamsArgs>()];

/// Launches `build_sampling_params_i32`.
pub(crate) fn run(runtime: &Runtime, mut call: BuildSamplingParamsCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, rows) = call.parts();
    let (slots, lens, layout) = (&inputs.slots, &inputs.lens, &inputs.layout);
    let buffers = KernelBuffers::of(&[
        slots.top_p,
        slots.top_k,
        slots.temperature,
        slots.infer_seed,
        lens.seq_lens_this_time,
        lens.seq_lens_encoder,
        layout.cu_seqlens_q_output,
        layout.batch_id_per_token_output,
        out.top_p,
        out.top_k,
        out.temperature,
        out.seed,
    ])?;
    let args = BuildSamplingParamsArgs {
        real_bsz: count(params.dims.real_bsz),
        max_step_tokens: count(params.dims.max_step_tokens),
        rows: count(*rows),
    };
    let (key, entry) = batch_program(Op::BuildSamplingParams);
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The one program `run` launches (what the warm-up builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    vec![super::single(batch_program(Op::BuildSamplingParams))]
}
