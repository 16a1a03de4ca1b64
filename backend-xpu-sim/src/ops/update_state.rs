//! `update_state` (`docs/semantics.md` §5.9, `kernels/update_state.cl`): one slot per core.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::UpdateStateCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, batch_program, count, flag};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `update_state_i32` (`token_counts`: the placeholder and `has_counts = 0`
    /// when the call has no token counts; `pad`: explicit padding to a multiple of 8 bytes, always 0).
    pub(crate) struct UpdateStateArgs {
        accept_tokens_offset: u64,
        is_block_step_offset: u64,
        prompt_lens_offset: u64,
        max_dec_len_offset: u64,
        end_tokens_offset: u64,
        accept_num_offset: u64,
        stop_flags_offset: u64,
        token_ids_all_offset: u64,
        step_idx_offset: u64,
        infer_seed_offset: u64,
        draft_tokens_offset: u64,
        seq_lens_encoder_offset: u64,
        seq_lens_decoder_offset: u64,
        token_counts_offset: u64,
        max_model_len: u64,
        real_bsz: u32,
        max_step_tokens: u32,
        num_end: u32,
        has_counts: u32,
        vocab: u32,
        pad: u32,
    }
}

/// The argument structs of `kernels/update_state.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<UpdateStateArgs>()];

/// Launches `update_state_i32`; without `token_counts` the kernel gets the placeholder buffer and
/// `has_counts = 0`.
pub(crate) fn run(runtime: &Runtime, mut call: UpdateStateCall<'_, '_>) -> Result<()> {
    let (inputs, state, params, _) = call.parts();
    let counts = state.token_counts.as_deref();
    let mut buffers = KernelBuffers::default();
    let args = UpdateStateArgs {
        accept_tokens_offset: buffers.bind(inputs.accept_tokens)?,
        is_block_step_offset: buffers.bind(inputs.is_block_step)?,
        prompt_lens_offset: buffers.bind(inputs.prompt_lens)?,
        max_dec_len_offset: buffers.bind(inputs.max_dec_len)?,
        end_tokens_offset: buffers.bind(inputs.end_tokens)?,
        accept_num_offset: buffers.bind(state.accept_num)?,
        stop_flags_offset: buffers.bind(state.stop_flags)?,
        token_ids_all_offset: buffers.bind(state.token_ids_all)?,
        step_idx_offset: buffers.bind(state.step_idx)?,
        infer_seed_offset: buffers.bind(state.infer_seed)?,
        draft_tokens_offset: buffers.bind(state.draft_tokens)?,
        seq_lens_encoder_offset: buffers.bind(state.seq_lens_encoder)?,
        seq_lens_decoder_offset: buffers.bind(state.seq_lens_decoder)?,
        token_counts_offset: buffers.bind_optional(runtime, counts)?,
        max_model_len: params.max_model_len as u64,
        real_bsz: count(params.dims.real_bsz),
        max_step_tokens: count(params.dims.max_step_tokens),
        num_end: count(inputs.end_tokens.len()),
        has_counts: flag(counts.is_some()),
        vocab: count(params.vocab),
        pad: 0,
    };
    let (key, entry) = batch_program(Op::UpdateState);
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The one program `run` launches (what the warm-up builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    vec![super::single(batch_program(Op::UpdateState))]
}
