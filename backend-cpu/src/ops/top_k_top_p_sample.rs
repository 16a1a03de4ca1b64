//! `top_k_top_p_sample` (`docs/semantics.md` §5.6): exact sampling on fixed-point weights.

use rayon::prelude::*;
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
    let top_k = slice::<i32>(inputs.top_k)?;
    let top_p = slice::<f32>(inputs.top_p)?;
    let seed = slice::<u64>(inputs.seed)?;
    let tokens = slice_mut::<i32>(tokens)?;
    with_float!(dtype, Op::TopKTopPSample, T => {
        let scores = slice::<T>(inputs.scores.matrix())?;
        let parts = super::parts_per_row(shape.rows);
        tokens
            .par_iter_mut()
            .zip(scores.par_chunks_exact(shape.vocab))
            .enumerate()
            .for_each(|(r, (token, row))| {
                let id = match temperature {
                    Some(temperature) => {
                        let draw = draw(seed[r], Purpose::Sample);
                        let hints = logits::RowHints {
                            parts,
                            next: next_row(scores, r, shape.vocab),
                        };
                        let sampling = (top_k[r], top_p[r], draw);
                        logits::sample_logit_row_hinted(row, temperature[r], sampling, hints)
                    }
                    None => sample_prob_row(row, top_k[r], top_p[r], seed[r], parts),
                };
                *token = id as i32;
            });
        Ok(())
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
    device
        .install(|| top_k_top_p_sample(kind.dtype, inputs, temperature, tokens, &params.shape))?;
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
