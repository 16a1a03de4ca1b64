//! `argmax` (`docs/semantics.md` §5.4): validation.

use super::{Check, RowShape};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `argmax`: the `[rows, vocab]` float input, the `[rows]` i32 output and the shape.
/// Facts: the input dtype. Nothing to launch when `rows == 0`.
pub type ArgmaxCall<'c> = Call<'c, &'c Buffer, Buffer, RowShape, DType>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ArgmaxCall<'c>;

/// Validates `argmax`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    input: &'c Buffer,
    out: &'c mut Buffer,
    shape: &RowShape,
) -> Result<ArgmaxCall<'c>> {
    let check = Check::new(Op::Argmax, device);
    let dtype = shape.validate_matrix(&check, "input", input)?;
    check.exact("out", out, DType::I32, shape.rows)?;
    let call = Call::new(input, out, *shape, dtype);
    Ok(call
        .with_extent(shape.rows, shape.vocab)
        .launching_nothing_if(shape.rows == 0))
}
