//! `process_logits` (`docs/semantics.md` §5.12, §4c, `kernels/process_logits.cl`): one cluster per
//! row; rows of logits (every rule) or of probabilities (masks and min_p). The processed rows are
//! always f32. The rows hold the whole vocabulary, or one rank's slice of sharded rows
//! ([`ProcessParams::slice`], `docs/semantics.md` §4d): the kernel reads every table by global id.
//!
//! [`ProcessParams::slice`]: specula_backend_api::ops::ProcessParams::slice

use specula_backend_api::WarmUp;
use specula_backend_api::ops::ProcessLogitsCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `process_logits_<dtype>` (`temperature`: logits rows only; `allowed` and
    /// `bitmask`: the placeholder and a 0 flag when absent). `rows` rows of the block starting at
    /// scores row `first`: output row `i` is the processing of scores row `first + i`. The rows
    /// hold the `width` ids `slice_first ..` of the tables' `vocab`.
    pub(crate) struct ProcessLogitsArgs {
        max_model_len: u64,
        rows: u32,
        vocab: u32,
        max_step_tokens: u32,
        real_bsz: u32,
        num_end: u32,
        num_bias: u32,
        num_bad_words: u32,
        has_allowed: u32,
        has_bitmask: u32,
        first: u32,
        slice_first: u32,
        width: u32,
    }
}

/// The argument structs of `kernels/process_logits.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ProcessLogitsArgs>()];

/// Launches `process_logits_<dtype>` built for the rows' kind.
pub(crate) fn run(runtime: &Runtime, mut call: ProcessLogitsCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::ProcessLogits, *kind);
    let (h, s) = (&inputs.history, &inputs.slots);
    let block = params.row_block();
    let ids = params.ids();
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[inputs.scores.matrix()])?
        .bind_optional(runtime, &[inputs.scores.temperature()])?
        .bind(&[
            inputs.layout.cu_seqlens_q_output,
            inputs.layout.batch_id_per_token_output,
            h.token_ids_all,
            h.prompt_lens,
            h.step_idx,
            h.draft_tokens,
            h.token_counts,
            h.prompt_mask,
            s.penalties,
            s.min_tokens,
            s.end_tokens,
            s.bias_offsets,
            s.bias_ids,
            s.bias_values,
            s.bad_word_offsets,
            s.bad_words,
        ])?
        .bind_optional(runtime, &[s.allowed, inputs.bitmask])?
        .bind(&[out.processed, out.fallback])?;
    let args = ProcessLogitsArgs {
        max_model_len: params.max_model_len as u64,
        rows: count(block.rows),
        vocab: count(params.shape.vocab),
        max_step_tokens: count(params.dims.max_step_tokens),
        real_bsz: count(params.dims.real_bsz),
        num_end: count(s.end_tokens.len()),
        num_bias: count(s.bias_ids.len()),
        num_bad_words: count(s.bad_words.len()),
        has_allowed: flag(s.allowed.is_some()),
        has_bitmask: flag(inputs.bitmask.is_some()),
        first: count(block.first),
        slice_first: count(ids.first),
        width: count(ids.len),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ProcessLogits, plan)
}
