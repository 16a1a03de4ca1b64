//! `top_p_candidates` (`docs/semantics.md` §5.7, `kernels/top_p_candidates.cl`): one cluster per row; rows of
//! probabilities or of logits (§4b).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::TopPCandidatesCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `top_p_candidates_<dtype>` (`temperature`: logits rows only;
    /// `fallback`: when `has_fallback`, the one candidate of a row of total weight 0).
    pub(crate) struct TopPCandidatesArgs {
        has_batch_id: u32,
        rows: u32,
        vocab: u32,
        candidates: u32,
        has_fallback: u32,
    }
}

/// The argument structs of `kernels/top_p_candidates.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<TopPCandidatesArgs>()];

/// Launches `top_p_candidates_<dtype>` built for the rows' kind; without
/// `batch_id_per_token_output` (or temperatures, for probability rows) the kernel gets the
/// placeholder buffer, and `has_batch_id = 0` (without `fallback`: `has_fallback = 0`).
pub(crate) fn run(runtime: &Runtime, mut call: TopPCandidatesCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::TopPCandidates, *kind);
    let batch_id = inputs.batch_id_per_token_output;
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[inputs.scores.matrix()])?
        .bind_optional(runtime, &[inputs.scores.temperature()])?
        .bind(&[inputs.top_p])?
        .bind_optional(runtime, &[batch_id])?
        .bind(&[out.ids, out.scores, out.lens])?
        .bind_optional(runtime, &[inputs.fallback])?;
    let args = TopPCandidatesArgs {
        has_batch_id: flag(batch_id.is_some()),
        rows: count(params.shape.rows),
        vocab: count(params.shape.vocab),
        candidates: count(params.candidates),
        has_fallback: flag(inputs.fallback.is_some()),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::TopPCandidates, plan)
}
