//! `top_k_top_p_sample` (`docs/semantics.md` §5.6, `kernels/top_k_top_p_sample.cl`): one cluster per row; rows
//! of probabilities or of logits (§4b).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::TopKTopPSampleCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `top_k_top_p_sample_<dtype>` (`temperature`: logits rows only;
    /// `fallback`: when `has_fallback`, the token of a row of total weight 0).
    pub(crate) struct TopKTopPSampleArgs {
        rows: u32,
        vocab: u32,
        has_fallback: u32,
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
    buffers
        .bind(&[inputs.scores.matrix()])?
        .bind_optional(runtime, &[inputs.scores.temperature()])?
        .bind(&[inputs.top_k, inputs.top_p, inputs.seed, tokens])?
        .bind_optional(runtime, &[inputs.fallback])?;
    let args = TopKTopPSampleArgs {
        rows: count(params.shape.rows),
        vocab: count(params.shape.vocab),
        has_fallback: flag(inputs.fallback.is_some()),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::TopKTopPSample, plan)
}
