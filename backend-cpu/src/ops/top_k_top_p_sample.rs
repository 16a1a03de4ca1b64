//! `top_k_top_p_sample` (`docs/semantics.md` §5.6): exact sampling on fixed-point weights.

use rayon::prelude::*;
use specula_backend_api::abi::TOP_P_BITS;
use specula_backend_api::fixed_point::top_p_fixed;
use specula_backend_api::ops::top_k_top_p_sample::OpCall;
use specula_backend_api::ops::{RowShape, SampleInputs};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::{Buffer, DType, FloatElement, Op, Result};

use super::with_float;
use crate::CpuDevice;
use crate::sampling::fast::sample_prob_row_fast;
use crate::sampling::histogram::{Kept, draw_in_prefix, first_prob_in_rank, prob_kept_set};
use crate::sampling::logits;
use specula_backend_api::host::{slice, slice_mut};

/// Samples one row: top-k, then top-p on the survivors, then the SAMPLE draw of `seed` over the
/// kept set in ascending id order. The single-pass fast path decides when it can; the histogram
/// path (the reference) otherwise. Both make the same integer decisions. `parts > 1` lets the
/// fast path scan the row on that many threads.
pub(crate) fn sample_prob_row<T: FloatElement>(
    row: &[T],
    top_k: i32,
    top_p: f32,
    seed: u64,
    parts: usize,
) -> usize {
    let r = draw(seed, Purpose::Sample);
    if let Some(token) = sample_prob_row_fast(row, top_k, top_p, r, parts) {
        return token;
    }
    sample_prob_row_histogram(row, top_k, top_p, r)
}

/// The histogram path of [`sample_prob_row`].
pub(crate) fn sample_prob_row_histogram<T: FloatElement>(
    row: &[T],
    top_k: i32,
    top_p: f32,
    r: u64,
) -> usize {
    match prob_kept_set(row, top_k, top_p_fixed(top_p)) {
        Kept::Degenerate(first) => first,
        Kept::Prefix(prefix) => draw_in_prefix(row, &prefix, r)
            // Unreachable (the draw is below the kept mass); the first token is the safe answer.
            .unwrap_or_else(|| first_prob_in_rank(row)),
    }
}

/// Samples every row; `temperature` is given for logits rows (`docs/semantics.md` §4b: the same
/// decisions from the rows' integer weights).
pub(crate) fn top_k_top_p_sample(
    dtype: DType,
    inputs: &SampleInputs<'_>,
    temperature: Option<&[f32]>,
    tokens: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let parts = super::parts_per_row(shape.rows);
    let rows = Rows::of(inputs, temperature)?;
    let tokens = slice_mut::<i32>(tokens)?;
    with_float!(dtype, Op::TopKTopPSample, T => {
        let scores = slice::<T>(inputs.scores.matrix())?;
        tokens
            .par_iter_mut()
            .zip(scores.par_chunks_exact(shape.vocab))
            .enumerate()
            .for_each(|(r, (token, row))| {
                let next = next_row(scores, r, shape.vocab);
                *token = rows.sample(r, row, parts, next) as i32;
            });
        Ok(())
    })
}

/// The per-row inputs of a call, as slices.
struct Rows<'a> {
    top_k: &'a [i32],
    top_p: &'a [f32],
    seed: &'a [u64],
    temperature: Option<&'a [f32]>,
}

impl<'a> Rows<'a> {
    fn of(inputs: &SampleInputs<'a>, temperature: Option<&'a [f32]>) -> Result<Self> {
        Ok(Rows {
            top_k: slice::<i32>(inputs.top_k)?,
            top_p: slice::<f32>(inputs.top_p)?,
            seed: slice::<u64>(inputs.seed)?,
            temperature,
        })
    }

    /// The token of row `r` (`row`), its passes split over `parts` threads; `next` is the row
    /// this thread likely samples next.
    fn sample<T: FloatElement>(&self, r: usize, row: &[T], parts: usize, next: &[u8]) -> usize {
        let (top_k, top_p, seed) = (self.top_k[r], self.top_p[r], self.seed[r]);
        match self.temperature {
            Some(temperature) => {
                let hints = logits::RowHints { parts, next };
                let sampling = (top_k, top_p, draw(seed, Purpose::Sample));
                logits::sample_logit_row_hinted(row, temperature[r], sampling, hints)
            }
            None => sample_prob_row(row, top_k, top_p, seed, parts),
        }
    }

    /// Whether row `r` of `vocab` logits, its passes split over `parts` threads, enters no rayon
    /// parallel section and makes at most one two-way `parallel::join`: top-k applies (one
    /// streaming pass), or top-p 1 on at most two threads (`logits/unranked/fused.rs`).
    fn at_most_a_join(&self, r: usize, vocab: usize, parts: usize) -> bool {
        let top_k = usize::try_from(self.top_k[r]).unwrap_or(0);
        let whole = top_p_fixed(self.top_p[r]) >= 1 << TOP_P_BITS;
        self.temperature.is_some() && ((top_k > 0 && top_k < vocab) || (whole && parts <= 2))
    }
}

/// A call of one logits row on the caller's thread (`parallel`): `Some` when it ran there,
/// `None` when it must run on the pool (more rows, probabilities, a row split further or through
/// more than one parallel section).
fn on_caller(
    device: &CpuDevice,
    dtype: DType,
    inputs: &SampleInputs<'_>,
    temperature: Option<&[f32]>,
    tokens: &mut Buffer,
    shape: &RowShape,
) -> Result<Option<()>> {
    let parts = device.threads();
    let rows = Rows::of(inputs, temperature)?;
    if shape.rows != 1 || !rows.at_most_a_join(0, shape.vocab, parts) || device.is_worker() {
        return Ok(None);
    }
    let tokens = slice_mut::<i32>(tokens)?;
    with_float!(dtype, Op::TopKTopPSample, T => {
        let row = slice::<T>(inputs.scores.matrix())?;
        let row = row.get(..shape.vocab).unwrap_or(row);
        let token = device.on_caller(|| rows.sample(0, row, parts, &[]));
        if let Some(slot) = tokens.first_mut() {
            *slot = token as i32;
        }
        Ok(Some(()))
    })
}

/// The bytes of row `r + 1` of a `[rows, vocab]` matrix (empty after the last row): the row the
/// thread sampling row `r` most likely samples next (rayon hands a thread consecutive rows).
pub(crate) fn next_row<T: FloatElement>(matrix: &[T], r: usize, vocab: usize) -> &[u8] {
    matrix
        .get((r + 1) * vocab..(r + 2) * vocab)
        .map_or(&[], bytemuck::cast_slice)
}

/// Runs a validated `top_k_top_p_sample` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, tokens, params, kind) = call.parts();
    let temperature = super::logits_temperature(&inputs.scores, kind)?;
    let shape = &params.shape;
    if on_caller(device, kind.dtype, inputs, temperature, tokens, shape)?.is_none() {
        device.install(|| top_k_top_p_sample(kind.dtype, inputs, temperature, tokens, shape))?;
    }
    let Some(fallback) = inputs.fallback else {
        return Ok(());
    };
    let fallback = slice::<i32>(fallback)?;
    let matrix = inputs.scores.matrix();
    for (r, token) in slice_mut::<i32>(tokens)?.iter_mut().enumerate() {
        let value = super::row_value(matrix, kind.dtype, r, params.shape.vocab, *token)?;
        if super::weighs_nothing(value, kind.logits) {
            *token = fallback[r];
        }
    }
    Ok(())
}

#[cfg(test)]
mod batch1_probe;

#[cfg(test)]
mod tests;
