//! `top_k_top_p_sample` (`docs/semantics.md` §5.6): arguments and validation.

use super::{Check, RowShape, Scores, ScoresKind};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `top_k_top_p_sample`: output `tokens [rows]` i32. Facts: the scores' dtype and
/// kind. Nothing to launch when `rows == 0`.
pub type TopKTopPSampleCall<'c> = Call<'c, SampleInputs<'c>, Buffer, SampleParams<'c>, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = TopKTopPSampleCall<'c>;

/// Inputs of `top_k_top_p_sample`.
#[derive(Clone, Copy, Debug)]
pub struct SampleInputs<'a> {
    /// `[rows, vocab]` probabilities, or logits with their per-row temperature.
    pub scores: Scores<'a>,
    /// `[rows]` i32 `top_k` (0 or ≥ V: no top-k).
    pub top_k: &'a Buffer,
    /// `[rows]` f32 `top_p` (device values outside (0, 1] count as 1.0).
    pub top_p: &'a Buffer,
    /// `[rows]` u64 per-token seeds.
    pub seed: &'a Buffer,
    /// Optional `[rows]` i32 (from `process_logits`): the token a row whose total weight is 0
    /// yields (-1: none) in place of its first token in rank order.
    pub fallback: Option<&'a Buffer>,
}

/// Parameters of `top_k_top_p_sample`.
#[derive(Clone, Copy, Debug)]
pub struct SampleParams<'a> {
    /// The matrix shape.
    pub shape: RowShape,
    /// Host copy of `top_p`, for validation (each in (0, 1]).
    pub host_top_p: Option<&'a [f32]>,
}

impl<'a> SampleInputs<'a> {
    /// The inputs of `top_k_top_p_sample` (`docs/semantics.md` §5.6) without a `fallback`: every
    /// row of total weight 0 yields its first token in rank order.
    pub fn new(scores: Scores<'a>, top_k: &'a Buffer, top_p: &'a Buffer, seed: &'a Buffer) -> Self {
        SampleInputs {
            scores,
            top_k,
            top_p,
            seed,
            fallback: None,
        }
    }

    /// These inputs with the `fallback` input (`None`: without one).
    pub fn with_fallback(self, fallback: Option<&'a Buffer>) -> Self {
        SampleInputs { fallback, ..self }
    }
}

impl SampleParams<'_> {
    /// The parameters of `top_k_top_p_sample` over `shape`, without a host copy of `top_p`.
    pub fn new(shape: RowShape) -> Self {
        SampleParams {
            shape,
            host_top_p: None,
        }
    }
}

/// Validates `top_k_top_p_sample`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: &SampleInputs<'c>,
    tokens: &'c mut Buffer,
    params: &SampleParams<'c>,
) -> Result<TopKTopPSampleCall<'c>> {
    let check = Check::new(Op::TopKTopPSample, device);
    let shape = &params.shape;
    let kind = inputs.scores.validate(&check, ("probs", "logits"), shape)?;
    check.exact("top_k", inputs.top_k, DType::I32, shape.rows)?;
    check.exact("top_p", inputs.top_p, DType::F32, shape.rows)?;
    check.exact("seed", inputs.seed, DType::U64, shape.rows)?;
    check.fallback(inputs.fallback, shape.rows)?;
    check.host_top_p(params.host_top_p, shape.rows)?;
    check.exact("tokens", tokens, DType::I32, shape.rows)?;
    let call = Call::new(*inputs, tokens, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.vocab)
        .launching_nothing_if(shape.rows == 0))
}
