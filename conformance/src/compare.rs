//! Comparing a backend's outputs with the reference's: exact outputs with `==` on their bits, float
//! outputs within a documented tolerance.

use std::collections::BTreeMap;
use std::fmt;

use specula_backend_api::{DType, Op};

use crate::tensor::HostTensor;

/// How an output is compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Class {
    /// Bit-identical (token ids, counts, offsets, flags, seeds, candidate scores, gathered rows).
    Exact,
    /// `|a − b| ≤ max(abs, rel · max(|a|, |b|))`; NaN equals NaN and each infinity itself.
    Float {
        /// Absolute tolerance.
        abs: f64,
        /// Relative tolerance.
        rel: f64,
    },
}

/// The relative rounding error the normalizer of a row of `width` entries may carry.
///
/// The contract fixes f32 accumulation but not its order. The reference sums a row in 8
/// interleaved f32 partial sums, whose worst-case relative error is `(width / 8) · 2^-24`
/// (positive terms); a backend summing in another order may differ from it by that much, and every
/// probability of the row (or every log-probability, additively) inherits the difference. At the
/// contract's vocabularies: 2.4e-4 (32000), 9.6e-4 (128256), 1.1e-3 (151936).
pub fn normalizer_rounding(width: usize) -> f64 {
    width.div_ceil(8) as f64 * f64::from(f32::EPSILON) / 2.0
}

/// Tolerance for `softmax` probabilities over rows of `width` entries (f32 output, f32
/// accumulation; `exp` differs by backend): relative `max(1e-4, normalizer_rounding(width))`,
/// absolute 1e-6.
pub fn softmax_tolerance(width: usize) -> Class {
    Class::Float {
        abs: 1e-6,
        rel: normalizer_rounding(width).max(1e-4),
    }
}

/// Tolerance for `accept_logprobs` log-probabilities over rows of `width` entries: absolute
/// `max(1e-4, normalizer_rounding(width))` (the log of the normalizer), relative 1e-4.
pub fn logprob_tolerance(width: usize) -> Class {
    Class::Float {
        abs: normalizer_rounding(width).max(1e-4),
        rel: 1e-4,
    }
}

/// The comparison class of output `tensor` of `op` whose rows hold `width` entries: the float
/// class of `docs/semantics.md` §1 for softmax probabilities, a slice's share of the softmax
/// normaliser (`shard_exp_sum`, whose ranks' shares add up to at least 1, so an absolute error is
/// one relative to the whole row's normaliser, as for the probabilities) and log-probability
/// values, exact for everything else.
pub fn class_of(op: Op, tensor: &str, width: usize) -> Class {
    match (op, tensor) {
        (Op::Softmax, "probs") | (Op::ShardExpSum, "sums") => softmax_tolerance(width),
        (Op::AcceptLogprobs, "logprobs" | "top_logprobs") => logprob_tolerance(width),
        _ => Class::Exact,
    }
}

/// The first difference between expected and actual outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The output tensor.
    pub tensor: String,
    /// First mismatching element (None: the tensor is missing or has another shape or dtype).
    pub index: Option<usize>,
    /// Expected value (or shape).
    pub expected: String,
    /// Actual value (or shape).
    pub actual: String,
    /// Number of mismatching elements.
    pub count: usize,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(
                f,
                "{}[{i}]: expected {}, got {} ({} mismatching element{})",
                self.tensor,
                self.expected,
                self.actual,
                self.count,
                if self.count == 1 { "" } else { "s" }
            ),
            None => write!(
                f,
                "{}: expected {}, got {}",
                self.tensor, self.expected, self.actual
            ),
        }
    }
}

fn float_at(t: &HostTensor, i: usize) -> f64 {
    let size = t.dtype.size_bytes();
    let b = &t.bytes[i * size..(i + 1) * size];
    match t.dtype {
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        DType::BF16 => f64::from(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        _ => f64::NAN,
    }
}

fn close(a: f64, b: f64, abs: f64, rel: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= abs.max(rel * a.abs().max(b.abs()))
}

/// Compares one tensor.
pub fn compare_tensor(
    class: Class,
    name: &str,
    expected: &HostTensor,
    actual: &HostTensor,
) -> Result<(), Mismatch> {
    if expected.dtype != actual.dtype || expected.shape != actual.shape {
        return Err(Mismatch {
            tensor: name.to_owned(),
            index: None,
            expected: format!("{} {:?}", expected.dtype, expected.shape),
            actual: format!("{} {:?}", actual.dtype, actual.shape),
            count: 0,
        });
    }
    let size = expected.dtype.size_bytes();
    let differs = |i: usize| match class {
        Class::Exact => {
            expected.bytes[i * size..(i + 1) * size] != actual.bytes[i * size..(i + 1) * size]
        }
        Class::Float { abs, rel } => !close(float_at(expected, i), float_at(actual, i), abs, rel),
    };
    let mut first = None;
    let mut count = 0;
    for i in 0..expected.len() {
        if differs(i) {
            first.get_or_insert(i);
            count += 1;
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            tensor: name.to_owned(),
            index: Some(i),
            expected: expected.display_element(i),
            actual: actual.display_element(i),
            count,
        }),
    }
}

/// Compares every expected tensor of `op` (whose float outputs are reduced over rows of `width`
/// entries, see [`class_of`]) with the actual one of the same name.
pub fn compare_outputs(
    op: Op,
    width: usize,
    expected: &BTreeMap<String, HostTensor>,
    actual: &BTreeMap<String, HostTensor>,
) -> Result<(), Mismatch> {
    for (name, e) in expected {
        let Some(a) = actual.get(name) else {
            return Err(Mismatch {
                tensor: name.clone(),
                index: None,
                expected: "an output".to_owned(),
                actual: "nothing".to_owned(),
                count: 0,
            });
        };
        compare_tensor(class_of(op, name, width), name, e, a)?;
    }
    Ok(())
}
