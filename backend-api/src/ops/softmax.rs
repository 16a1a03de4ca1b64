//! `softmax` (`docs/semantics.md` §5.5): arguments and validation.

use super::{Check, RowShape};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `softmax`: output `probs [rows, vocab]` f32. Facts: the logits dtype. Nothing to
/// launch when `rows == 0`.
pub type SoftmaxCall<'c> = Call<'c, SoftmaxInputs<'c>, Buffer, SoftmaxParams<'c>, DType>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = SoftmaxCall<'c>;

/// Inputs of `softmax`.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxInputs<'a> {
    /// `[rows, vocab]` logits (f32, f16 or bf16).
    pub logits: &'a Buffer,
    /// `[rows]` f32 per-row temperature.
    pub temperature: &'a Buffer,
}

/// Parameters of `softmax`.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxParams<'a> {
    /// The matrix shape.
    pub shape: RowShape,
    /// Host copy of the per-row temperature, for validation (each ≥ 0, not NaN).
    pub host_temperature: Option<&'a [f32]>,
}

/// Validates `softmax`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: SoftmaxInputs<'c>,
    probs: &'c mut Buffer,
    params: &SoftmaxParams<'c>,
) -> Result<SoftmaxCall<'c>> {
    let check = Check::new(Op::Softmax, device);
    let shape = &params.shape;
    let dtype = shape.validate_matrix(&check, "logits", inputs.logits)?;
    check.exact("temperature", inputs.temperature, DType::F32, shape.rows)?;
    check.host_temperature(params.host_temperature, shape.rows)?;
    check.exact("probs", probs, DType::F32, shape.rows * shape.vocab)?;
    let call = Call::new(inputs, probs, *params, dtype);
    Ok(call
        .with_extent(shape.rows, shape.vocab)
        .launching_nothing_if(shape.rows == 0))
}
