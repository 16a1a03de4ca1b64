//! `update_state` and `ngram_match`.

use super::{BatchDims, Check};
use crate::{Buffer, DType, DeviceId, Error, Op, Result};

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
}

/// Parameters of `update_state`.
#[derive(Clone, Copy, Debug)]
pub struct UpdateStateParams {
    /// The batch shape.
    pub dims: BatchDims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
}

/// Validates `update_state`.
pub fn validate_update_state(
    device: DeviceId,
    inputs: &UpdateStateInputs<'_>,
    state: &DecodeState<'_>,
    params: &UpdateStateParams,
) -> Result<()> {
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
    check.exact("seq_lens_decoder", state.seq_lens_decoder, DType::I32, n)
}

/// Inputs of `ngram_match` that it only reads, `[max_bsz]` i32 unless noted.
#[derive(Clone, Copy, Debug)]
pub struct NgramInputs<'a> {
    /// `[max_bsz, max_model_len]` i32: prompt then generated tokens.
    pub token_ids_all: &'a Buffer,
    /// Prompt length per slot.
    pub prompt_lens: &'a Buffer,
    /// Tokens generated so far.
    pub step_idx: &'a Buffer,
    /// The most drafts each slot may get.
    pub draft_token_num: &'a Buffer,
    /// > 0: prefill slot (untouched, but counted in the budget).
    pub seq_lens_encoder: &'a Buffer,
    /// The most tokens a slot may generate.
    pub max_dec_len: &'a Buffer,
}

/// What `ngram_match` writes.
#[derive(Debug)]
pub struct NgramOutputs<'a> {
    /// `[max_bsz, S]` i32: drafts written at positions `1 ..`.
    pub draft_tokens: &'a mut Buffer,
    /// `[max_bsz]` i32: in: > 0 marks a running slot; out: `1 + drafts` for decode slots.
    pub seq_lens_this_time: &'a mut Buffer,
}

/// Parameters of `ngram_match`.
#[derive(Clone, Copy, Debug)]
pub struct NgramParams {
    /// The batch shape.
    pub dims: BatchDims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// The longest n-gram tried.
    pub max_ngram_size: usize,
    /// The shortest n-gram tried (`1 ≤ min ≤ max`).
    pub min_ngram_size: usize,
    /// Global budget of tokens per step (default 128).
    pub threshold: usize,
}

/// Validates `ngram_match`.
pub fn validate_ngram_match(
    device: DeviceId,
    inputs: &NgramInputs<'_>,
    out: &NgramOutputs<'_>,
    params: &NgramParams,
) -> Result<()> {
    let check = Check::new(Op::NgramMatch, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    if params.min_ngram_size < 1 || params.min_ngram_size > params.max_ngram_size {
        return Err(Error::invalid(
            check.op,
            "min_ngram_size",
            format!("1 ..= max_ngram_size {}", params.max_ngram_size),
            params.min_ngram_size,
        ));
    }
    let n = dims.max_bsz;
    let all = check.product("token_ids_all", n, params.max_model_len)?;
    check.exact("token_ids_all", inputs.token_ids_all, DType::I32, all)?;
    for (arg, buffer) in [
        ("prompt_lens", inputs.prompt_lens),
        ("step_idx", inputs.step_idx),
        ("draft_token_num", inputs.draft_token_num),
        ("seq_lens_encoder", inputs.seq_lens_encoder),
        ("max_dec_len", inputs.max_dec_len),
    ] {
        check.exact(arg, buffer, DType::I32, n)?;
    }
    let slot_tokens = check.product("draft_tokens", n, dims.max_step_tokens)?;
    check.exact("draft_tokens", out.draft_tokens, DType::I32, slot_tokens)?;
    check.exact("seq_lens_this_time", out.seq_lens_this_time, DType::I32, n)
}
