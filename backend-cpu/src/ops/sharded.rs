//! What the CPU's sharded ops share (`docs/semantics.md` §4d): a slice's rows with the weigher
//! of each whole row, and the key of a token.

use specula_backend_api::host::slice;
use specula_backend_api::ops::{ShardRows, ShardShape};
use specula_backend_api::shard::{KeyOrder, SliceWeigher, token_key};
use specula_backend_api::{FloatElement, Result};

/// The `[rows, slice.len]` scores of a sharded op in their element type, with each row's key,
/// temperature and min_p.
pub(crate) struct SliceRows<'a, T> {
    values: &'a [T],
    len: usize,
    /// The first global id of the slice.
    pub(crate) first: usize,
    /// Whether the rows are logits.
    pub(crate) logits: bool,
    temperature: Option<&'a [f32]>,
    row_key: &'a [u64],
    min_p: Option<&'a [f32]>,
}

impl<'a, T: FloatElement> SliceRows<'a, T> {
    /// Views the rows of `inputs` (as validated for `shape`).
    pub(crate) fn new(inputs: &ShardRows<'a>, shape: &ShardShape) -> Result<Self> {
        Ok(SliceRows {
            values: slice::<T>(inputs.scores.matrix())?,
            len: shape.slice.len,
            first: shape.slice.first,
            logits: inputs.scores.is_logits(),
            temperature: inputs.scores.temperature().map(slice::<f32>).transpose()?,
            row_key: slice::<u64>(inputs.row_key)?,
            min_p: inputs.min_p.map(slice::<f32>).transpose()?,
        })
    }

    /// Row `r`'s values.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> &'a [T] {
        &self.values[r * self.len..(r + 1) * self.len]
    }

    /// Row `r`'s temperature when the rows are logits.
    #[inline]
    pub(crate) fn temperature(&self, r: usize) -> Option<f32> {
        self.temperature.map(|t| t[r])
    }

    /// The weigher of row `r`'s whole row.
    #[inline]
    pub(crate) fn weigher(&self, r: usize) -> SliceWeigher {
        let min_p = self.min_p.map(|m| m[r]);
        SliceWeigher::new(self.row_key[r], self.temperature(r), min_p)
    }

    /// The rank-order key of the token at position `j` of row `r`'s slice.
    #[inline(always)]
    pub(crate) fn key(&self, order: KeyOrder, x: f32, j: usize) -> u64 {
        token_key(order, self.logits, x, self.first + j)
    }
}
