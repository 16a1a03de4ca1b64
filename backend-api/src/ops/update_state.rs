//! `update_state` (`docs/semantics.md` §5.9): arguments and validation.

use super::{BatchDims, Check};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `update_state`. Nothing to launch when `real_bsz == 0` (slots `≥ real_bsz` are
/// never touched).
pub type UpdateStateCall<'c, 'o> =
    Call<'c, UpdateStateInputs<'c>, DecodeState<'o>, UpdateStateParams, ()>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = UpdateStateCall<'c, 'o>;

/// Inputs of `update_state` that it only reads.
#[derive(Clone, Copy, Debug)]
pub struct UpdateStateInputs<'a> {
    /// `[max_bsz, S]` i32 from `verify_draft_tokens`.
    pub accept_tokens: &'a Buffer,
    /// `[max_bsz]` u8: blocked slots are left untouched.
    pub is_block_step: &'a Buffer,
    /// `[max_bsz]` i32: prompt length per slot.
    pub prompt_lens: &'a Buffer,
    /// `[max_bsz]` i32: the most tokens a slot may generate.
    pub max_dec_len: &'a Buffer,
    /// `[E]` i32, `E ≥ 1`: end tokens.
    pub end_tokens: &'a Buffer,
}

/// The per-slot state `update_state` reads and writes.
#[derive(Debug)]
pub struct DecodeState<'a> {
    /// `[max_bsz]` i32: tokens emitted this step (clamped to the room left).
    pub accept_num: &'a mut Buffer,
    /// `[max_bsz]` u8.
    pub stop_flags: &'a mut Buffer,
    /// `[max_bsz, max_model_len]` i32: prompt then generated tokens.
    pub token_ids_all: &'a mut Buffer,
    /// `[max_bsz]` i32: tokens generated so far.
    pub step_idx: &'a mut Buffer,
    /// `[max_bsz]` u64: advanced by 4 per emitted token.
    pub infer_seed: &'a mut Buffer,
    /// `[max_bsz, S]` i32: position 0 becomes the last emitted token.
    pub draft_tokens: &'a mut Buffer,
    /// `[max_bsz]` i32: a prefill slot becomes a decode slot (set to 0).
    pub seq_lens_encoder: &'a mut Buffer,
    /// `[max_bsz]` i32: tokens in the cache.
    pub seq_lens_decoder: &'a mut Buffer,
    /// Optional `[max_bsz, vocab]` i32 per-slot token counts (`process_logits`): each appended token
    /// in `[0, vocab)` adds 1 to its entry.
    pub token_counts: Option<&'a mut Buffer>,
}

/// Parameters of `update_state`.
#[derive(Clone, Copy, Debug)]
pub struct UpdateStateParams {
    /// The batch shape.
    pub dims: BatchDims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// The vocabulary of `token_counts` (ignored without it).
    pub vocab: usize,
}

/// Validates `update_state`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &UpdateStateInputs<'c>,
    state: &'c mut DecodeState<'o>,
    params: &UpdateStateParams,
) -> Result<UpdateStateCall<'c, 'o>> {
    let check = Check::new(Op::UpdateState, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    let n = dims.max_bsz;
    let slot_tokens = check.product("accept_tokens", n, dims.max_step_tokens)?;
    check.exact(
        "accept_tokens",
        inputs.accept_tokens,
        DType::I32,
        slot_tokens,
    )?;
    check.exact("is_block_step", inputs.is_block_step, DType::U8, n)?;
    check.exact("prompt_lens", inputs.prompt_lens, DType::I32, n)?;
    check.exact("max_dec_len", inputs.max_dec_len, DType::I32, n)?;
    check.at_least("end_tokens", inputs.end_tokens, DType::I32, 1)?;
    check.exact("accept_num", state.accept_num, DType::I32, n)?;
    check.exact("stop_flags", state.stop_flags, DType::U8, n)?;
    let all = check.product("token_ids_all", n, params.max_model_len)?;
    check.exact("token_ids_all", state.token_ids_all, DType::I32, all)?;
    check.exact("step_idx", state.step_idx, DType::I32, n)?;
    check.exact("infer_seed", state.infer_seed, DType::U64, n)?;
    check.exact("draft_tokens", state.draft_tokens, DType::I32, slot_tokens)?;
    check.exact("seq_lens_encoder", state.seq_lens_encoder, DType::I32, n)?;
    check.exact("seq_lens_decoder", state.seq_lens_decoder, DType::I32, n)?;
    if let Some(counts) = state.token_counts.as_deref() {
        if !device.capabilities.processing {
            return Err(crate::Error::Unsupported {
                backend: device.info.kind,
                op: check.op,
                what: "token counts (logits processing)".to_owned(),
            });
        }
        check.vocab(params.vocab)?;
        let len = check.product("token_counts", n, params.vocab)?;
        check.exact("token_counts", counts, DType::I32, len)?;
    }
    let call = Call::new(*inputs, state, *params, ());
    Ok(call
        .with_extent(params.dims.real_bsz, params.max_model_len)
        .launching_nothing_if(params.dims.real_bsz == 0))
}
