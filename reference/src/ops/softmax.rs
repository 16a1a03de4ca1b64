//! `softmax` (`docs/semantics.md` §5.5), and the row distribution that
//! `accept_logprobs` shares.
//!
//! The contract's order: NaN logits count as −inf, `m` is the row maximum, the scaled logit is
//! `y = (l − m) / T` (subtract first, then divide, f32), the probability `exp(y) / Σ exp(y)` with
//! f32 accumulation. The special rows are decided on the raw logits: `T == 0` is one-hot at the
//! argmax, a +inf maximum is uniform over the +inf entries, a row of only −inf is uniform. At
//! `T = +inf` every finite logit scales to 0 (the limit; `(l − m) / T` would give NaN for a gap
//! that overflowed to −inf).

use specula_backend_api::ops::RowShape;
use specula_backend_api::ops::softmax::OpCall;
use specula_backend_api::{Buffer, DType, Op, Result};

use super::argmax::row_argmax;
use crate::ReferenceDevice;
use crate::matrix::{FloatMatrix, view_mut};
use specula_backend_api::host::slice;

/// Number of interleaved partial sums of the normaliser: entry `i` is added to partial sum
/// `i mod 8`, and the partial sums are then added in order (the order the suite's tolerance
/// assumes, `conformance::compare::normalizer_rounding`).
const PARTIAL_SUMS: usize = 8;

/// A device-side temperature: negative or NaN counts as 1.0.
pub(crate) fn effective_temperature(t: f32) -> f32 {
    if t.is_nan() || t < 0.0 { 1.0 } else { t }
}

/// A logit as the rules read it: NaN counts as −inf.
fn clean(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// The f32 sum of `terms` in [`PARTIAL_SUMS`] interleaved partial sums.
pub(crate) fn interleaved_sum(terms: impl Iterator<Item = f32>) -> f32 {
    let mut partial = [0.0f32; PARTIAL_SUMS];
    for (i, term) in terms.enumerate() {
        partial[i % PARTIAL_SUMS] += term;
    }
    partial.iter().fold(0.0, |sum, &p| sum + p)
}

/// The distribution of one logits row at one (effective) temperature.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Distribution {
    /// `T == 0`: everything on the argmax of the raw logits.
    OneHot(usize),
    /// The maximum is +inf: uniform over the `count` entries equal to +inf.
    PosInf {
        /// How many logits are +inf.
        count: usize,
    },
    /// Every logit is −inf (or NaN): uniform over the `vocab` entries.
    Uniform {
        /// The row length.
        vocab: usize,
    },
    /// The ordinary row: `exp(y) / sum` with `y = (l − max) / t`.
    Scaled {
        /// The row maximum (finite).
        max: f32,
        /// The temperature (positive, possibly +inf).
        t: f32,
        /// `Σ exp(y)`, at least 1.
        sum: f32,
    },
}

impl Distribution {
    /// The distribution of `row` at temperature `t` (already made effective).
    pub(crate) fn of(row: &[f32], t: f32) -> Self {
        if t == 0.0 {
            return Distribution::OneHot(row_argmax(row));
        }
        let max = row
            .iter()
            .map(|&l| clean(l))
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::INFINITY {
            let count = row.iter().filter(|&&l| l == f32::INFINITY).count();
            return Distribution::PosInf { count };
        }
        if max == f32::NEG_INFINITY {
            return Distribution::Uniform { vocab: row.len() };
        }
        let sum = interleaved_sum(row.iter().map(|&l| scaled(l, max, t).exp()));
        Distribution::Scaled { max, t, sum }
    }

    /// The probability of entry `id` whose logit is `l`.
    pub(crate) fn prob(&self, id: usize, l: f32) -> f32 {
        match *self {
            Distribution::OneHot(arg) if id == arg => 1.0,
            Distribution::OneHot(_) => 0.0,
            Distribution::PosInf { count } if l == f32::INFINITY => 1.0 / count as f32,
            Distribution::PosInf { .. } => 0.0,
            Distribution::Uniform { vocab } => 1.0 / vocab as f32,
            Distribution::Scaled { max, t, sum } => scaled(l, max, t).exp() / sum,
        }
    }

    /// The log-probability of entry `id` whose logit is `l`.
    pub(crate) fn logprob(&self, id: usize, l: f32) -> f32 {
        match *self {
            Distribution::OneHot(arg) if id == arg => 0.0,
            Distribution::OneHot(_) => f32::NEG_INFINITY,
            Distribution::PosInf { count } if l == f32::INFINITY => -(count as f32).ln(),
            Distribution::PosInf { .. } => f32::NEG_INFINITY,
            Distribution::Uniform { vocab } => -(vocab as f32).ln(),
            Distribution::Scaled { max, t, sum } => scaled(l, max, t) - sum.ln(),
        }
    }
}

/// The scaled logit `(l − max) / t` of a row with a finite maximum; `t = +inf` scales every
/// finite logit to 0.
pub(crate) fn scaled(l: f32, max: f32, t: f32) -> f32 {
    let l = clean(l);
    if l == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else if t == f32::INFINITY {
        0.0
    } else {
        (l - max) / t
    }
}

/// `probs = softmax(logits / temperature)` for every row.
pub(crate) fn softmax(
    dtype: DType,
    logits: &Buffer,
    temperature: &Buffer,
    probs: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let logits = FloatMatrix::new(Op::Softmax, dtype, logits, shape.rows, shape.vocab)?;
    let temperature = slice::<f32>(temperature)?;
    let mut probs = view_mut::<f32>(Op::Softmax, probs, shape.rows, shape.vocab)?;
    for (r, mut out) in probs.rows_mut().into_iter().enumerate() {
        let (Some(row), Some(&t)) = (logits.row(r), temperature.get(r)) else {
            continue;
        };
        let distribution = Distribution::of(&row, effective_temperature(t));
        for (id, (p, &l)) in out.iter_mut().zip(&row).enumerate() {
            *p = distribution.prob(id, l);
        }
    }
    Ok(())
}

/// Runs a validated `softmax` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, probs, params, dtype) = call.parts();
    softmax(
        *dtype,
        inputs.logits,
        inputs.temperature,
        probs,
        &params.shape,
    )
}
