//! `softmax` (`docs/semantics.md` §5.5): `probs = softmax(logits / temperature)` per row, f32 out.
//!
//! Rows run in parallel; each row is two passes over the logits (max, then exp and sum) and one
//! over the output (normalise), all f32. The scaled logit is `(l − m) / T` with `m` the row's
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
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Independent f32 accumulators in the sums: the loop vectorises and the rounding error grows with
/// `V / LANES` instead of `V`.
const LANES: usize = 8;

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

/// The statistics of one row under temperature `t` (already made effective).
pub(crate) fn row_stats<T: FloatElement>(row: &[T], t: f32) -> RowStats {
    if t == 0.0 {
        return RowStats::OneHot(row_argmax(row));
    }
    let mut max = f32::NEG_INFINITY;
    let mut inf_count = 0usize;
    for v in row {
        // `f32::max` ignores a NaN operand: NaN counts as −inf.
        let x = v.to_f32();
        max = max.max(x);
        inf_count += usize::from(x == f32::INFINITY);
    }
    if max == f32::INFINITY {
        return RowStats::PosInf { count: inf_count };
    }
    if max == f32::NEG_INFINITY {
        return RowStats::AllNegInf;
    }
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += scaled(v.to_f32(), max, t).exp();
        }
    }
    let mut sum: f32 = chunks
        .remainder()
        .iter()
        .map(|v| scaled(v.to_f32(), max, t).exp())
        .sum();
    sum += lanes.iter().sum::<f32>();
    RowStats::Finite { max, sum }
}

/// Writes the probabilities of one row.
fn row_softmax<T: FloatElement>(row: &[T], t: f32, out: &mut [f32]) {
    match row_stats(row, t) {
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
        RowStats::Finite { max, sum } => {
            for (o, v) in out.iter_mut().zip(row) {
                *o = scaled(v.to_f32(), max, t).exp() / sum;
            }
        }
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
