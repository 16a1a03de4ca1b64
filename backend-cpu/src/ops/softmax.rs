//! `softmax` (`docs/semantics.md` §5.5): `probs = softmax(logits / temperature)` per row, f32 out.
//!
//! Rows run in parallel; each row is two vectorised passes over the logits (max, then exp and sum,
//! leaving each term in the output; `float_math`) and one over the output (normalise), all f32. The scaled logit is `(l − m) / T` with `m` the row's
//! maximum logit — subtract first, then divide — so nothing overflows and a tiny `T` tends to the
//! one-hot of `T = 0`. The special rows have fixed answers so that every backend agrees without
//! relying on how `exp` treats infinities: temperature 0 is one-hot at the argmax, a row whose
//! maximum is +inf is uniform over its +inf entries, a row of all −inf (or NaN) is uniform.

use rayon::prelude::*;
use specula_backend_api::ops::RowShape;
use specula_backend_api::ops::softmax::OpCall;
use specula_backend_api::{Buffer, DType, FloatElement, Op, Result};

use super::argmax::row_argmax;
use super::with_float;
use crate::{CpuDevice, float_math};
use specula_backend_api::host::{slice, slice_mut};

/// A device-side temperature as the ops use it: negative or NaN counts as 1.0 (host copies are
/// validated; device contents cannot be trusted).
#[inline]
pub(crate) fn effective_temperature(t: f32) -> f32 {
    if t >= 0.0 { t } else { 1.0 }
}

/// `(x − m) / t` with NaN mapped to −inf: the scaled logit of a row whose maximum logit is the
/// finite `m`. At `t = +inf` every finite logit scales to 0 (the limit, also when `x − m`
/// overflowed to −inf), and −inf stays −inf.
#[inline(always)]
pub(crate) fn scaled(x: f32, m: f32, t: f32) -> f32 {
    if t == f32::INFINITY {
        return if x.is_finite() {
            0.0
        } else {
            f32::NEG_INFINITY
        };
    }
    let y = (x - m) / t;
    if y.is_nan() { f32::NEG_INFINITY } else { y }
}

/// What a row's softmax needs besides the logits: computed in one pass.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowStats {
    /// Temperature 0: everything on the argmax.
    OneHot(usize),
    /// The maximum logit is +inf: uniform over the `count` entries equal to it.
    PosInf {
        /// How many logits are +inf.
        count: usize,
    },
    /// Every logit is −inf or NaN: uniform over the row.
    AllNegInf,
    /// The ordinary case: `exp(scaled(l, max, t)) / sum`.
    Finite {
        /// The maximum logit (NaN ignored).
        max: f32,
        /// `Σ exp(scaled(l, max, t))`, ≥ 1.
        sum: f32,
    },
}

/// The statistics of one row under temperature `t` (already made effective). With `out` (the
/// row's length), a finite row also leaves each `exp` term there, ready to be normalised.
pub(crate) fn row_stats<T: FloatElement>(row: &[T], t: f32, out: Option<&mut [f32]>) -> RowStats {
    if t == 0.0 {
        return RowStats::OneHot(row_argmax(row));
    }
    let (max, inf_count) = float_math::max_and_inf_count(row);
    row_stats_after_max(row, t, (max, inf_count), out)
}

/// [`row_stats`] of a row whose maximum (NaN ignored) and +inf count are known.
pub(crate) fn row_stats_after_max<T: FloatElement>(
    row: &[T],
    t: f32,
    (max, inf_count): (f32, usize),
    out: Option<&mut [f32]>,
) -> RowStats {
    if t == 0.0 {
        return RowStats::OneHot(row_argmax(row));
    }
    if max == f32::INFINITY {
        return RowStats::PosInf { count: inf_count };
    }
    if max == f32::NEG_INFINITY {
        return RowStats::AllNegInf;
    }
    let sum = if t.is_finite() {
        float_math::sum_exp(row, max, t, out)
    } else {
        infinite_temperature_sum(row, max, t, out)
    };
    RowStats::Finite { max, sum }
}

/// The normaliser at `t = +inf`: every finite logit weighs `exp(0) = 1`.
fn infinite_temperature_sum<T: FloatElement>(
    row: &[T],
    max: f32,
    t: f32,
    out: Option<&mut [f32]>,
) -> f32 {
    let term = |v: &T| scaled(v.to_f32(), max, t).exp();
    match out {
        Some(out) => out
            .iter_mut()
            .zip(row)
            .map(|(o, v)| {
                *o = term(v);
                *o
            })
            .sum(),
        None => row.iter().map(term).sum(),
    }
}

/// Writes the probabilities of one row.
fn row_softmax<T: FloatElement>(row: &[T], t: f32, out: &mut [f32]) {
    match row_stats(row, t, Some(out)) {
        RowStats::OneHot(i) => {
            out.fill(0.0);
            if let Some(o) = out.get_mut(i) {
                *o = 1.0;
            }
        }
        RowStats::PosInf { count } => {
            let p = 1.0 / count as f32;
            for (o, v) in out.iter_mut().zip(row) {
                *o = if v.to_f32() == f32::INFINITY { p } else { 0.0 };
            }
        }
        RowStats::AllNegInf => out.fill(1.0 / row.len() as f32),
        // `row_stats` left the exp terms in `out`.
        RowStats::Finite { sum, .. } => out.iter_mut().for_each(|o| *o /= sum),
    }
}

/// Softmax of every `[vocab]` row of `logits` at its row's temperature, into f32 `probs`.
pub(crate) fn softmax(
    dtype: DType,
    logits: &Buffer,
    temperature: &Buffer,
    probs: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let temperature = slice::<f32>(temperature)?;
    let probs = slice_mut::<f32>(probs)?;
    with_float!(dtype, Op::Softmax, T => {
        let logits = slice::<T>(logits)?;
        // `vocab ≥ 1` is validated, so the chunk size is nonzero.
        probs
            .par_chunks_mut(shape.vocab)
            .zip(logits.par_chunks(shape.vocab))
            .zip(temperature.par_iter())
            .for_each(|((out, row), &t)| row_softmax(row, effective_temperature(t), out));
        Ok(())
    })
}

/// Runs a validated `softmax` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, probs, params, dtype) = call.parts();
    let (logits, temperature) = (inputs.logits, inputs.temperature);
    device.install(|| softmax(*dtype, logits, temperature, probs, &params.shape))
}
