//! `top_k_top_p_sample` (`docs/semantics.md` §5.6, `kernels/top_k_top_p_sample.cl`): one cluster per row; rows
//! of probabilities or of logits (§4b).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::TopKTopPSampleCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `top_k_top_p_sample_<dtype>` (`temperature`: logits rows only;
    /// `fallback`: when `has_fallback`, the token of a row of total weight 0; `pad`: always 0).
    pub(crate) struct TopKTopPSampleArgs {
        matrix_offset: u64,
        temperature_offset: u64,
        top_k_offset: u64,
        top_p_offset: u64,
        seed_offset: u64,
        tokens_offset: u64,
        fallback_offset: u64,
        rows: u32,
        vocab: u32,
        has_fallback: u32,
        pad: u32,
    }
}

/// The argument structs of `kernels/top_k_top_p_sample.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<TopKTopPSampleArgs>()];

/// Launches `top_k_top_p_sample_<dtype>` built for the rows' kind; probability rows get the
/// placeholder buffer for the temperatures, and calls without `fallback` for it.
pub(crate) fn run(runtime: &Runtime, mut call: TopKTopPSampleCall<'_>) -> Result<()> {
    let (inputs, tokens, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::TopKTopPSample, *kind);
    let mut buffers = KernelBuffers::default();
    let args = TopKTopPSampleArgs {
        matrix_offset: buffers.bind(inputs.scores.matrix())?,
        temperature_offset: buffers.bind_optional(runtime, inputs.scores.temperature())?,
        top_k_offset: buffers.bind(inputs.top_k)?,
        top_p_offset: buffers.bind(inputs.top_p)?,
        seed_offset: buffers.bind(inputs.seed)?,
        tokens_offset: buffers.bind(tokens)?,
        fallback_offset: buffers.bind_optional(runtime, inputs.fallback)?,
        rows: count(params.shape.rows),
        vocab: count(params.shape.vocab),
        has_fallback: flag(inputs.fallback.is_some()),
        pad: 0,
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::TopKTopPSample, plan)
}
