//! What the reference's sharded ops share: a slice's rows with the weigher of each whole row.

use specula_backend_api::host::slice;
use specula_backend_api::ops::{ScoresKind, ShardRows, ShardShape};
use specula_backend_api::{Op, Result};

use crate::matrix::FloatMatrix;
use crate::shard::Weigher;

/// The `[rows, slice.len]` scores of a sharded op, with each row's key, temperature and min_p.
pub(crate) struct SliceRows<'a> {
    values: FloatMatrix<'a>,
    temperature: Option<&'a [f32]>,
    row_key: &'a [u64],
    min_p: Option<&'a [f32]>,
}

impl<'a> SliceRows<'a> {
    /// Views the rows of `inputs` (as validated for `shape`).
    pub(crate) fn new(
        op: Op,
        kind: ScoresKind,
        inputs: &ShardRows<'a>,
        shape: &ShardShape,
    ) -> Result<Self> {
        let matrix = inputs.scores.matrix();
        Ok(SliceRows {
            values: FloatMatrix::new(op, kind.dtype, matrix, shape.rows, shape.slice.len)?,
            temperature: inputs.scores.temperature().map(slice::<f32>).transpose()?,
            row_key: slice::<u64>(inputs.row_key)?,
            min_p: inputs.min_p.map(slice::<f32>).transpose()?,
        })
    }

    /// Row `r`'s temperature when the rows are logits.
    pub(crate) fn temperature(&self, r: usize) -> Option<f32> {
        self.temperature.map(|t| t[r])
    }

    /// Row `r` widened to f32, with the weigher of its whole row.
    pub(crate) fn row(&self, r: usize) -> Option<(Vec<f32>, Weigher)> {
        let values = self.values.row(r)?;
        let min_p = self.min_p.map(|m| m[r]);
        Some((
            values,
            Weigher::new(self.row_key[r], self.temperature(r), min_p),
        ))
    }
}
