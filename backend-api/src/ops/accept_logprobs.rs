//! `accept_logprobs` (`docs/semantics.md` §5.11): arguments and validation.

use super::{BatchDims, Check, RowShape};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Device, DeviceExt, Error, Op, Result};

/// A validated `accept_logprobs`. Facts: the logits dtype. Always launched: the packed offsets
/// `cu_accept` have `max_bsz + 1` entries even when nothing was accepted.
pub type AcceptLogprobsCall<'c, 'o> =
    Call<'c, LogprobsInputs<'c>, LogprobsOutputs<'o>, LogprobsParams<'c>, DType>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = AcceptLogprobsCall<'c, 'o>;

/// Inputs of `accept_logprobs`.
#[derive(Clone, Copy, Debug)]
pub struct LogprobsInputs<'a> {
    /// `[rows, V]` logits (f32, f16 or bf16).
    pub logits: &'a Buffer,
    /// `[rows]` f32 per-row temperature (0: one-hot; device values that are negative or NaN count as 1).
    pub temperature: &'a Buffer,
    /// `[max_bsz, S]` i32 from `verify_draft_tokens`.
    pub accept_tokens: &'a Buffer,
    /// `[max_bsz]` i32 from `verify_draft_tokens`.
    pub accept_num: &'a Buffer,
    /// `[max_bsz]` i32: a prefill slot reads its single row for every token.
    pub seq_lens_encoder: &'a Buffer,
    /// `[real_bsz + 1]` i32 from `build_output_layout`.
    pub cu_seqlens_q_output: &'a Buffer,
}

/// Outputs of `accept_logprobs`; the packed arrays have `max_bsz · S` entries, the valid ones first.
#[derive(Debug)]
pub struct LogprobsOutputs<'a> {
    /// `[max_bsz + 1]` i32: exclusive prefix sum of the accepted counts.
    pub cu_accept: &'a mut Buffer,
    /// `[max_bsz · S]` i32: accepted token ids, packed; -1 beyond the total.
    pub token_ids: &'a mut Buffer,
    /// `[max_bsz · S]` f32: log-probability of each accepted token; -inf beyond the total.
    pub logprobs: &'a mut Buffer,
    /// `[max_bsz · S]` i32: 1 + the number of strictly larger logits; 0 beyond the total.
    pub ranks: &'a mut Buffer,
    /// `[max_bsz · S, K]` i32: the top-K ids of each source row; -1 beyond the total.
    pub top_ids: &'a mut Buffer,
    /// `[max_bsz · S, K]` f32: their log-probabilities; -inf beyond the total.
    pub top_logprobs: &'a mut Buffer,
}

/// The six output buffers of `accept_logprobs`, owned: allocated once with
/// [`alloc`](LogprobsBuffers::alloc), lent to each call with
/// [`outputs`](LogprobsBuffers::outputs).
#[derive(Debug)]
pub struct LogprobsBuffers {
    /// See [`LogprobsOutputs::cu_accept`].
    pub cu_accept: Buffer,
    /// See [`LogprobsOutputs::token_ids`].
    pub token_ids: Buffer,
    /// See [`LogprobsOutputs::logprobs`].
    pub logprobs: Buffer,
    /// See [`LogprobsOutputs::ranks`].
    pub ranks: Buffer,
    /// See [`LogprobsOutputs::top_ids`].
    pub top_ids: Buffer,
    /// See [`LogprobsOutputs::top_logprobs`].
    pub top_logprobs: Buffer,
}

impl LogprobsBuffers {
    /// Zeroed outputs for `max_bsz` slots, `packed` (`max_bsz · S`) packed entries and `top_k`
    /// top log-probabilities per entry.
    pub fn alloc<D: Device + ?Sized>(
        device: &D,
        max_bsz: usize,
        packed: usize,
        top_k: usize,
    ) -> Result<Self> {
        Ok(Self {
            cu_accept: device.alloc::<i32>(max_bsz + 1)?,
            token_ids: device.alloc::<i32>(packed)?,
            logprobs: device.alloc::<f32>(packed)?,
            ranks: device.alloc::<i32>(packed)?,
            top_ids: device.alloc::<i32>(packed * top_k)?,
            top_logprobs: device.alloc::<f32>(packed * top_k)?,
        })
    }

    /// The buffers, lent as the outputs of one `accept_logprobs` call.
    pub fn outputs(&mut self) -> LogprobsOutputs<'_> {
        LogprobsOutputs {
            cu_accept: &mut self.cu_accept,
            token_ids: &mut self.token_ids,
            logprobs: &mut self.logprobs,
            ranks: &mut self.ranks,
            top_ids: &mut self.top_ids,
            top_logprobs: &mut self.top_logprobs,
        }
    }
}

/// Parameters of `accept_logprobs`.
#[derive(Clone, Copy, Debug)]
pub struct LogprobsParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// The logits shape.
    pub shape: RowShape,
    /// `K`, `0 ..= 64`: top log-probabilities per token.
    pub top_k: usize,
    /// Host copy of the temperature, for validation.
    pub host_temperature: Option<&'a [f32]>,
}

/// Validates `accept_logprobs`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &LogprobsInputs<'c>,
    out: &'c mut LogprobsOutputs<'o>,
    params: &LogprobsParams<'c>,
) -> Result<AcceptLogprobsCall<'c, 'o>> {
    let check = Check::new(Op::AcceptLogprobs, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    let shape = &params.shape;
    let dtype = shape.validate_matrix(&check, "logits", inputs.logits)?;
    if params.top_k > crate::abi::MAX_LOGPROBS_TOP_K {
        return Err(Error::invalid(
            check.op,
            "top_k",
            format!("0 ..= {}", crate::abi::MAX_LOGPROBS_TOP_K),
            params.top_k,
        ));
    }
    check.exact("temperature", inputs.temperature, DType::F32, shape.rows)?;
    check.host_temperature(params.host_temperature, shape.rows)?;
    let slot_tokens = check.product("accept_tokens", dims.max_bsz, dims.max_step_tokens)?;
    check.exact(
        "accept_tokens",
        inputs.accept_tokens,
        DType::I32,
        slot_tokens,
    )?;
    check.exact("accept_num", inputs.accept_num, DType::I32, dims.max_bsz)?;
    check.exact(
        "seq_lens_encoder",
        inputs.seq_lens_encoder,
        DType::I32,
        dims.max_bsz,
    )?;
    check.exact(
        "cu_seqlens_q_output",
        inputs.cu_seqlens_q_output,
        DType::I32,
        dims.real_bsz + 1,
    )?;
    check.exact("cu_accept", out.cu_accept, DType::I32, dims.max_bsz + 1)?;
    check.exact("token_ids", out.token_ids, DType::I32, slot_tokens)?;
    check.exact("logprobs", out.logprobs, DType::F32, slot_tokens)?;
    check.exact("ranks", out.ranks, DType::I32, slot_tokens)?;
    let top = check.product("top_ids", slot_tokens, params.top_k)?;
    check.exact("top_ids", out.top_ids, DType::I32, top)?;
    check.exact("top_logprobs", out.top_logprobs, DType::F32, top)?;
    let call = Call::new(*inputs, out, *params, dtype);
    Ok(call
        .with_extent(params.shape.rows, params.shape.vocab)
        .launching_nothing_if(false))
}
