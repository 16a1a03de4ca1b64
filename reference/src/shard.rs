//! Sharded rows (`docs/semantics.md` §4d), written from the contract: the rank key of a token,
//! and the weight of a slice's token as a token of the whole row, read from the row key.
//!
//! The key's ordinal and the min_p test are computed here (not taken from `backend-api`'s
//! `shard` module), so that a bug there shows up as a disagreement; the §4b logits weights use
//! the contract's integer steps of `backend_api::logit_weights`, as [`WeightedRow`] does.
//!
//! [`WeightedRow`]: crate::weights::WeightedRow

use specula_backend_api::logit_weights::{RowScale, row_scale, sanitize_logit, scaled_weight};
use specula_backend_api::shard::KeyOrder;

use crate::weights::{ONE, sanitize, top_p_fixed, weight};

/// The ordinal of `x` (NaN as −inf, −0 as +0): larger value, larger ordinal.
fn ord(x: f32) -> u64 {
    let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    u64::from(if bits & 0x8000_0000 == 0 {
        bits + 0x8000_0000
    } else {
        0xffff_ffff - bits
    })
}

/// The value of an ordinal.
fn value(ord: u64) -> f32 {
    let ord = ord as u32;
    if ord >= 0x8000_0000 {
        f32::from_bits(ord - 0x8000_0000)
    } else {
        f32::from_bits(0xffff_ffff - ord)
    }
}

/// The key of token `id` whose score is `x`: `(ord << 20) | (2^20 − 1 − id)`, where the ordinal
/// is of `sanitize(p)` for a probability, of the logit itself for a logit, and of the raw value
/// with NaN below −inf in argmax order.
pub(crate) fn key(order: KeyOrder, logits: bool, x: f32, id: usize) -> u64 {
    let ord = match order {
        KeyOrder::Argmax if x.is_nan() => ord(f32::NEG_INFINITY) - 1,
        KeyOrder::Argmax => ord(x),
        KeyOrder::Rank if logits => ord(x),
        KeyOrder::Rank => ord(sanitize(x)),
    };
    (ord << 20) + ((1 << 20) - 1 - id as u64)
}

/// The id a key names.
pub(crate) fn id_of(key: u64) -> usize {
    ((1 << 20) - 1 - (key & ((1 << 20) - 1))) as usize
}

/// The value a rank key carries (−inf for the key 0 of no token).
pub(crate) fn value_of(key: u64) -> f32 {
    if key == 0 {
        f32::NEG_INFINITY
    } else {
        value(key >> 20)
    }
}

/// The weights of a slice's tokens as tokens of the whole row whose row key is `row_key`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Weigher {
    /// The row's temperature when it holds logits.
    temperature: Option<f32>,
    /// The row key.
    row_key: u64,
    /// `MINP`, when min_p is on.
    min_p: Option<u64>,
}

impl Weigher {
    /// A row of logits at `temperature` (`Some`) or of probabilities, with the device `min_p`.
    pub(crate) fn new(row_key: u64, temperature: Option<f32>, min_p: Option<f32>) -> Self {
        // min_p: 0, negative and NaN are off; above 1 counts as 1.
        let min_p = min_p.filter(|&p| p > 0.0).map(|p| top_p_fixed(p.min(1.0)));
        Weigher {
            temperature,
            row_key,
            min_p,
        }
    }

    /// The weight before min_p: §4 for a probability, §4b for a logit of the whole row whose
    /// maximum and first token in rank order the row key gives.
    fn raw_weight(&self, x: f32, id: usize) -> u64 {
        let Some(t) = self.temperature else {
            return weight(x);
        };
        if self.row_key == 0 {
            return 0;
        }
        let max = sanitize_logit(value_of(self.row_key));
        if max == f32::INFINITY {
            return if x == f32::INFINITY { ONE } else { 0 };
        }
        if max == f32::NEG_INFINITY {
            return 0;
        }
        match row_scale(t) {
            RowScale::ArgmaxOnly if id == id_of(self.row_key) => ONE,
            RowScale::ArgmaxOnly => 0,
            scale => scaled_weight(x, max, scale),
        }
    }

    /// The row's largest weight (min_p's `w_max`).
    fn max_weight(&self) -> u64 {
        match self.temperature {
            _ if self.row_key == 0 => 0,
            Some(_) if value_of(self.row_key) == f32::NEG_INFINITY => 0,
            Some(_) => ONE,
            None => weight(value_of(self.row_key)),
        }
    }

    /// The weight of token `id` whose score is `x`, min_p applied.
    pub(crate) fn weight(&self, x: f32, id: usize) -> u64 {
        let w = self.raw_weight(x, id);
        match self.min_p {
            Some(min_p)
                if u128::from(w) * (1 << 24)
                    < u128::from(min_p) * u128::from(self.max_weight()) =>
            {
                0
            }
            _ => w,
        }
    }
}
