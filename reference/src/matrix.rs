//! `[rows, cols]` buffers as `ndarray` views.

use half::{bf16, f16};
use ndarray::{ArrayView2, ArrayViewMut2};
use specula_backend_api::ops::{Scores, ScoresKind};
use specula_backend_api::{BackendKind, Buffer, DType, Element, Error, Op, Result};

use crate::weights::WeightedRow;

use specula_backend_api::host::{slice, slice_mut};

fn shape_fault(op: Op) -> Error {
    Error::Execution {
        backend: BackendKind::Cpu,
        what: op.name().to_owned(),
        source: "a buffer does not hold its validated shape".into(),
    }
}

/// A buffer's window as a `[rows, cols]` matrix of `T`.
pub(crate) fn view<T: Element>(
    op: Op,
    buffer: &Buffer,
    rows: usize,
    cols: usize,
) -> Result<ArrayView2<'_, T>> {
    ArrayView2::from_shape((rows, cols), slice::<T>(buffer)?).map_err(|_| shape_fault(op))
}

/// A buffer's window as a mutable `[rows, cols]` matrix of `T`.
pub(crate) fn view_mut<T: Element>(
    op: Op,
    buffer: &mut Buffer,
    rows: usize,
    cols: usize,
) -> Result<ArrayViewMut2<'_, T>> {
    ArrayViewMut2::from_shape((rows, cols), slice_mut::<T>(buffer)?).map_err(|_| shape_fault(op))
}

/// A `[rows, V]` matrix of probabilities or logits in any float dtype; rows are read widened
/// exactly to f32 (f16 and bf16 are subsets of f32).
pub(crate) enum FloatMatrix<'a> {
    /// f32 rows.
    F32(ArrayView2<'a, f32>),
    /// f16 rows.
    F16(ArrayView2<'a, f16>),
    /// bf16 rows.
    BF16(ArrayView2<'a, bf16>),
}

impl<'a> FloatMatrix<'a> {
    /// Views `buffer` (of the float dtype `dtype`, as validated) as `[rows, vocab]`.
    pub(crate) fn new(
        op: Op,
        dtype: DType,
        buffer: &'a Buffer,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => FloatMatrix::F32(view(op, buffer, rows, vocab)?),
            DType::F16 => FloatMatrix::F16(view(op, buffer, rows, vocab)?),
            DType::BF16 => FloatMatrix::BF16(view(op, buffer, rows, vocab)?),
            other => {
                return Err(Error::Unsupported {
                    backend: BackendKind::Cpu,
                    op,
                    what: format!("dtype {other}"),
                });
            }
        })
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        match self {
            FloatMatrix::F32(m) => m.nrows(),
            FloatMatrix::F16(m) => m.nrows(),
            FloatMatrix::BF16(m) => m.nrows(),
        }
    }

    /// Row `r` widened to f32, or `None` when there is no such row.
    pub(crate) fn row(&self, r: usize) -> Option<Vec<f32>> {
        if r >= self.rows() {
            return None;
        }
        Some(match self {
            FloatMatrix::F32(m) => m.row(r).to_vec(),
            FloatMatrix::F16(m) => m.row(r).iter().map(|x| x.to_f32()).collect(),
            FloatMatrix::BF16(m) => m.row(r).iter().map(|x| x.to_f32()).collect(),
        })
    }
}

/// A `[rows, V]` matrix of probabilities, or of logits with a per-row temperature: the rows the
/// sampling ops draw from, as [`WeightedRow`]s.
pub(crate) struct ScoreMatrix<'a> {
    values: FloatMatrix<'a>,
    temperature: Option<&'a [f32]>,
}

impl<'a> ScoreMatrix<'a> {
    /// Views the matrix of `scores` (dtype as validated) as `[rows, vocab]`.
    pub(crate) fn new(
        op: Op,
        kind: ScoresKind,
        scores: &Scores<'a>,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        Self::of(op, kind, scores.matrix(), scores.temperature(), rows, vocab)
    }

    /// Views `values` (logits when `temperature` is given) as `[rows, vocab]`.
    pub(crate) fn of(
        op: Op,
        kind: ScoresKind,
        values: &'a Buffer,
        temperature: Option<&'a Buffer>,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        Ok(ScoreMatrix {
            values: FloatMatrix::new(op, kind.dtype, values, rows, vocab)?,
            temperature: temperature.map(slice::<f32>).transpose()?,
        })
    }

    /// Row `r`, weighed at its own temperature.
    pub(crate) fn row(&self, r: usize) -> Option<WeightedRow> {
        self.row_at(r, r)
    }

    /// Row `r`, weighed at the temperature of row `t` (REJECTION's draft rows take the
    /// temperature of the output row they are checked against).
    pub(crate) fn row_at(&self, r: usize, t: usize) -> Option<WeightedRow> {
        let values = self.values.row(r)?;
        Some(match self.temperature {
            None => WeightedRow::probs(values),
            Some(temperature) => WeightedRow::logits(values, *temperature.get(t)?),
        })
    }
}
