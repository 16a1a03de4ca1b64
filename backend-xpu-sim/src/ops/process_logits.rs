//! `process_logits` (`docs/semantics.md` §5.12, §4c, `kernels/process_logits.cl`): one cluster per
//! row; rows of logits (every rule) or of probabilities (masks and min_p). The processed rows are
//! always f32.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::ProcessLogitsCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `process_logits_<dtype>` (`temperature`: logits rows only; `allowed` and
    /// `bitmask`: the placeholder and a 0 flag when absent). `rows` rows of the block starting at
    /// scores row `first`: output row `i` is the processing of scores row `first + i`.
    pub(crate) struct ProcessLogitsArgs {
        matrix_offset: u64,
        temperature_offset: u64,
        cu_out_offset: u64,
        batch_id_offset: u64,
        token_ids_all_offset: u64,
        prompt_lens_offset: u64,
        step_idx_offset: u64,
        draft_tokens_offset: u64,
        token_counts_offset: u64,
        prompt_mask_offset: u64,
        penalties_offset: u64,
        min_tokens_offset: u64,
        end_tokens_offset: u64,
        bias_offsets_offset: u64,
        bias_ids_offset: u64,
        bias_values_offset: u64,
        bad_word_offsets_offset: u64,
        bad_words_offset: u64,
        allowed_offset: u64,
        bitmask_offset: u64,
        processed_offset: u64,
        fallback_offset: u64,
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
    let mut buffers = KernelBuffers::default();
    let args = ProcessLogitsArgs {
        matrix_offset: buffers.bind(inputs.scores.matrix())?,
        temperature_offset: buffers.bind_optional(runtime, inputs.scores.temperature())?,
        cu_out_offset: buffers.bind(inputs.layout.cu_seqlens_q_output)?,
        batch_id_offset: buffers.bind(inputs.layout.batch_id_per_token_output)?,
        token_ids_all_offset: buffers.bind(h.token_ids_all)?,
        prompt_lens_offset: buffers.bind(h.prompt_lens)?,
        step_idx_offset: buffers.bind(h.step_idx)?,
        draft_tokens_offset: buffers.bind(h.draft_tokens)?,
        token_counts_offset: buffers.bind(h.token_counts)?,
        prompt_mask_offset: buffers.bind(h.prompt_mask)?,
        penalties_offset: buffers.bind(s.penalties)?,
        min_tokens_offset: buffers.bind(s.min_tokens)?,
        end_tokens_offset: buffers.bind(s.end_tokens)?,
        bias_offsets_offset: buffers.bind(s.bias_offsets)?,
        bias_ids_offset: buffers.bind(s.bias_ids)?,
        bias_values_offset: buffers.bind(s.bias_values)?,
        bad_word_offsets_offset: buffers.bind(s.bad_word_offsets)?,
        bad_words_offset: buffers.bind(s.bad_words)?,
        allowed_offset: buffers.bind_optional(runtime, s.allowed)?,
        bitmask_offset: buffers.bind_optional(runtime, inputs.bitmask)?,
        processed_offset: buffers.bind(out.processed)?,
        fallback_offset: buffers.bind(out.fallback)?,
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
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ProcessLogits, plan)
}
