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
    buffers
        .bind(&[
            inputs.accept_tokens,
            inputs.is_block_step,
            inputs.prompt_lens,
            inputs.max_dec_len,
            inputs.end_tokens,
            state.accept_num,
            state.stop_flags,
            state.token_ids_all,
            state.step_idx,
            state.infer_seed,
            state.draft_tokens,
            state.seq_lens_encoder,
            state.seq_lens_decoder,
        ])?
        .bind_optional(runtime, &[counts])?;
    let args = UpdateStateArgs {
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
