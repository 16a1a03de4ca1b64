//! `ngram_match` (`docs/semantics.md` §5.10): arguments and validation.

use super::{BatchDims, Check};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `ngram_match`. Nothing to launch when `real_bsz == 0`.
pub type NgramMatchCall<'c, 'o> = Call<'c, NgramInputs<'c>, NgramOutputs<'o>, NgramParams, ()>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = NgramMatchCall<'c, 'o>;

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
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &NgramInputs<'c>,
    out: &'c mut NgramOutputs<'o>,
    params: &NgramParams,
) -> Result<NgramMatchCall<'c, 'o>> {
    let check = Check::new(Op::NgramMatch, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    // n-grams longer than step_idx (an i32) are skipped anyway, so a larger maximum is clamped;
    // a minimum beyond it could never match and is an error.
    let max_ngram_size = params.max_ngram_size.min(crate::abi::MAX_HOST_LENGTH);
    if params.min_ngram_size < 1 || params.min_ngram_size > max_ngram_size {
        return Err(Error::invalid(
            check.op,
            "min_ngram_size",
            format!("1 ..= max_ngram_size {max_ngram_size}"),
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
    check.exact("seq_lens_this_time", out.seq_lens_this_time, DType::I32, n)?;
    let params = NgramParams {
        max_ngram_size,
        ..*params
    };
    let call = Call::new(*inputs, out, params, ());
    Ok(call
        .with_extent(params.dims.real_bsz, params.max_model_len)
        .launching_nothing_if(params.dims.real_bsz == 0))
}
