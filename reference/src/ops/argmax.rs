//! `argmax` (`docs/semantics.md` §5.4).

use specula_backend_api::ops::RowShape;
use specula_backend_api::ops::argmax::OpCall;
use specula_backend_api::{Buffer, DType, Op, Result};

use crate::ReferenceDevice;
use crate::matrix::FloatMatrix;
use crate::weights::logit_order;
use specula_backend_api::host::slice_mut;

/// The id of the largest value: NaN below every number, −0 equal to +0, ties to the lowest id; 0
/// for a row of only NaN.
pub(crate) fn row_argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (id, &x) in row.iter().enumerate() {
        if row.get(best).is_some_and(|&b| logit_order(x, b).is_lt()) {
            best = id;
        }
    }
    best
}

/// Writes the argmax of every row of `input`.
pub(crate) fn argmax(
    dtype: DType,
    input: &Buffer,
    out: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let input = FloatMatrix::new(Op::Argmax, dtype, input, shape.rows, shape.vocab)?;
    for (r, token) in slice_mut::<i32>(out)?.iter_mut().enumerate() {
        *token = input.row(r).map_or(0, |row| row_argmax(&row) as i32);
    }
    Ok(())
}

/// Runs a validated `argmax` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (input, out, shape, dtype) = call.parts();
    argmax(*dtype, input, out, shape)
}
