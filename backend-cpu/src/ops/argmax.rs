//! `argmax` (`docs/semantics.md` §5.4): per row, the id of the largest value.
//!
//! One pass per row, rows in parallel. The order is total so every backend agrees bit for bit:
//! NaN ranks below every number (even −inf), −0.0 equals +0.0, ties go to the lowest id; a row of
//! all NaN gives 0.

use rayon::prelude::*;
use specula_backend_api::ops::RowShape;
use specula_backend_api::ops::argmax::OpCall;
use specula_backend_api::{Buffer, DType, FloatElement, Op, Result};

use super::with_float;
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Whether `a` ranks strictly above `b` in argmax order (NaN lowest, −0 == +0).
///
/// Strictness is what sends ties to the lowest id when the row is scanned in id order.
#[inline(always)]
pub(crate) fn ranks_above(a: f32, b: f32) -> bool {
    a > b || (b.is_nan() && !a.is_nan())
}

/// The argmax of one row (0 for an empty or all-NaN row).
#[inline]
pub(crate) fn row_argmax<T: FloatElement>(row: &[T]) -> usize {
    crate::sampling::scan::argmax_row(row)
}

/// Writes the argmax of each `[vocab]` row of `input` to `out` (i32).
pub(crate) fn argmax(
    dtype: DType,
    input: &Buffer,
    out: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let out = slice_mut::<i32>(out)?;
    with_float!(dtype, Op::Argmax, T => {
        let input = slice::<T>(input)?;
        // `vocab ≥ 1` is validated, so the chunk size is nonzero.
        out.par_iter_mut()
            .zip(input.par_chunks(shape.vocab))
            .for_each(|(o, row)| *o = row_argmax(row) as i32);
        Ok(())
    })
}

/// Runs a validated `argmax` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (input, out, shape, dtype) = call.parts();
    device.install(|| argmax(*dtype, input, out, shape))
}
