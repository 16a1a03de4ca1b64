//! Sharded rows (`docs/semantics.md` §4d): the rank keys that order a row's tokens across slices,
//! and the weights of a slice's tokens as tokens of the whole row.
//!
//! A tensor-parallel runner holds each row as slices `[s_r, s_{r+1})` of the vocabulary, one per
//! rank. Two things make every rank's answer that of the unsharded row:
//!
//! - the **rank key** of a token, `(ord(value) << 20) | (2^20 − 1 − id)` ([`token_key`]): a
//!   `u64` whose order is the row's rank order (value descending, then id ascending), so a MAX of
//!   keys is the first token in rank order and a threshold key cuts the order exactly;
//! - the **row key**, the largest key of the whole row (a MAX over the ranks' [`shard_key`]s):
//!   it carries the row maximum `m` and the first token in rank order, which is all a slice needs
//!   to weigh its tokens exactly as the whole row does ([`SliceWeigher`]).
//!
//! [`shard_key`]: crate::Device::shard_key

use crate::abi::{SHARD_KEY_ID_BITS, TOP_P_BITS, WEIGHT_BITS};
use crate::fixed_point;
use crate::logit_weights::{RowScale, row_scale, sanitize_logit, scaled_weight};

/// The key of no token (every token of the row masked, or an id outside the slice). Every key of
/// a real token is larger.
pub const NO_KEY: u64 = 0;

/// The largest id part of a key (`2^20 − 1`).
const ID_MASK: u64 = (1 << SHARD_KEY_ID_BITS) - 1;

/// The order a key ranks tokens in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyOrder {
    /// The rank order of the sampling ops (`docs/semantics.md` §4, §4b): probabilities by their
    /// sanitized value, logits by the logit itself with NaN as −inf; −0 equal to +0.
    #[default]
    Rank,
    /// The order of `argmax` (§5.4) and of `accept_logprobs`' top-K: the raw value, NaN below
    /// every number (even −inf), −0 equal to +0.
    Argmax,
}

impl KeyOrder {
    /// Every order.
    pub const ALL: [KeyOrder; 2] = [KeyOrder::Rank, KeyOrder::Argmax];

    /// The name used in case files (`rank`, `argmax`).
    pub const fn name(self) -> &'static str {
        match self {
            KeyOrder::Rank => "rank",
            KeyOrder::Argmax => "argmax",
        }
    }
}

impl_named!(KeyOrder, "key order");

/// The order-preserving `u32` of an f32 value: larger value, larger ordinal; −0 and +0 are one
/// ordinal; NaN is read as −inf. Every ordinal is ≥ `ord(−inf) = 0x007F_FFFF`.
#[inline(always)]
pub fn value_ord(x: f32) -> u32 {
    let x = if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x + 0.0
    };
    let bits = x.to_bits();
    if bits >> 31 == 0 {
        bits | 0x8000_0000
    } else {
        !bits
    }
}

/// The value of an ordinal made by [`value_ord`] (+0 for the ordinal of ±0).
#[inline(always)]
pub fn ord_value(ord: u32) -> f32 {
    if ord >> 31 == 1 {
        f32::from_bits(ord & 0x7fff_ffff)
    } else {
        f32::from_bits(!ord)
    }
}

/// The ordinal of a value in [`KeyOrder::Argmax`]: [`value_ord`], except that NaN is one below
/// −inf.
#[inline(always)]
pub fn argmax_ord(x: f32) -> u32 {
    if x.is_nan() {
        value_ord(f32::NEG_INFINITY) - 1
    } else {
        value_ord(x)
    }
}

/// The ordinal of a score in `order`: a probability ranks by `sanitize(p)` (§4), a logit by
/// itself (§4b); in [`KeyOrder::Argmax`] both by the raw value.
#[inline(always)]
pub fn score_ord(order: KeyOrder, logits: bool, value: f32) -> u32 {
    match (order, logits) {
        (KeyOrder::Argmax, _) => argmax_ord(value),
        (KeyOrder::Rank, true) => value_ord(value),
        (KeyOrder::Rank, false) => value_ord(fixed_point::sanitize(value)),
    }
}

/// The key `(ord << 20) | (2^20 − 1 − id)` of token `id < 2^20`.
#[inline(always)]
pub fn make_key(ord: u32, id: usize) -> u64 {
    (u64::from(ord) << SHARD_KEY_ID_BITS) | (ID_MASK - (id as u64 & ID_MASK))
}

/// The key of token `id` whose score is `value`, in `order`.
#[inline(always)]
pub fn token_key(order: KeyOrder, logits: bool, value: f32, id: usize) -> u64 {
    make_key(score_ord(order, logits, value), id)
}

/// The token id a key names.
#[inline(always)]
pub fn key_id(key: u64) -> usize {
    (ID_MASK - (key & ID_MASK)) as usize
}

/// The value ordinal of a key.
#[inline(always)]
pub fn key_ord(key: u64) -> u32 {
    (key >> SHARD_KEY_ID_BITS) as u32
}

/// The value a [`KeyOrder::Rank`] key carries (−inf for [`NO_KEY`]).
#[inline(always)]
pub fn key_value(key: u64) -> f32 {
    if key == NO_KEY {
        return f32::NEG_INFINITY;
    }
    ord_value(key_ord(key))
}

/// The smallest key of every token whose value ranks strictly above the value of `key`: the
/// threshold of "a strictly larger value" (`accept_logprobs`' rank).
#[inline(always)]
pub fn above_value(key: u64) -> u64 {
    (u64::from(key_ord(key)) + 1) << SHARD_KEY_ID_BITS
}

/// `MINP = ceil(min_p · 2^24)` of a device `min_p` (§4c): `None` (off) for 0, negative or NaN;
/// values above 1 count as 1.
#[inline]
pub fn min_p_fixed(min_p: f32) -> Option<u64> {
    (min_p > 0.0).then(|| fixed_point::top_p_fixed(min_p.min(1.0)))
}

/// How a slice weighs a logits row, from the row key and the temperature.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LogitsRow {
    /// No weight anywhere: every logit is −inf (or masked).
    Zero,
    /// Some logit is +inf: those weigh `2^40`, the rest 0.
    PosInf,
    /// `T == 0`: only the first token in rank order (this id) weighs `2^40`.
    Only(usize),
    /// The ordinary row: the §4b weights at `scale` below the maximum `m`.
    Scaled { m: f32, scale: RowScale },
}

/// The weights of a slice's tokens as tokens of the whole row (§4d): §4 for probabilities, §4b
/// for logits with the row maximum and the first token in rank order taken from the row key,
/// and min_p (§4c) against the row's largest weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SliceWeigher {
    logits: Option<LogitsRow>,
    /// `MINP · w_max`, when min_p is on.
    min_p_floor: Option<u128>,
}

impl SliceWeigher {
    /// The weigher of a row whose row key ([`KeyOrder::Rank`]) is `row_key`: a logits row at the
    /// device temperature `temperature` (`Some`), or a probability row (`None`); `min_p` is the
    /// row's device `min_p`, if any.
    pub fn new(row_key: u64, temperature: Option<f32>, min_p: Option<f32>) -> Self {
        let logits = temperature.map(|t| logits_row(row_key, t));
        let w_max = match logits {
            Some(LogitsRow::Zero) => 0,
            Some(_) => 1 << WEIGHT_BITS,
            None if row_key == NO_KEY => 0,
            None => fixed_point::weight(key_value(row_key)),
        };
        let min_p_floor = min_p
            .and_then(min_p_fixed)
            .map(|minp| u128::from(minp) * u128::from(w_max));
        SliceWeigher {
            logits,
            min_p_floor,
        }
    }

    /// The weight of token `id` whose score is `value`.
    #[inline(always)]
    pub fn weight(&self, value: f32, id: usize) -> u64 {
        let w = match self.logits {
            None => fixed_point::weight(value),
            Some(row) => logit_weight(row, value, id),
        };
        match self.min_p_floor {
            Some(floor) if u128::from(w) << TOP_P_BITS < floor => 0,
            _ => w,
        }
    }
}

fn logits_row(row_key: u64, temperature: f32) -> LogitsRow {
    if row_key == NO_KEY {
        return LogitsRow::Zero;
    }
    let m = sanitize_logit(key_value(row_key));
    if m == f32::INFINITY {
        return LogitsRow::PosInf;
    }
    if m == f32::NEG_INFINITY {
        return LogitsRow::Zero;
    }
    match row_scale(temperature) {
        RowScale::ArgmaxOnly => LogitsRow::Only(key_id(row_key)),
        scale => LogitsRow::Scaled { m, scale },
    }
}

#[inline(always)]
fn logit_weight(row: LogitsRow, value: f32, id: usize) -> u64 {
    let full = 1 << WEIGHT_BITS;
    match row {
        LogitsRow::Zero => 0,
        LogitsRow::PosInf => u64::from(value == f32::INFINITY) * full,
        LogitsRow::Only(first) => u64::from(id == first) * full,
        LogitsRow::Scaled { m, scale } => scaled_weight(value, m, scale),
    }
}

/// The shift `k` of REJECTION's residual (§5.8, §4b): 41 for probability rows, `max(0,
/// bitlength(Wp) + bitlength(Wq) − 60)` for logits rows.
#[inline]
pub fn residual_shift(logits: bool, target_mass: u64, draft_mass: u64) -> u32 {
    if !logits {
        return WEIGHT_BITS + 1;
    }
    let bits = |x: u64| 64 - x.leading_zeros();
    (bits(target_mass) + bits(draft_mass)).saturating_sub(60)
}

/// One token's residual `floor(max(0, wp·Wq − wq·Wp) / 2^k)`, exact (products below `2^128`).
#[inline(always)]
pub fn residual(wp: u64, wq: u64, (target_mass, draft_mass): (u64, u64), shift: u32) -> u64 {
    let plus = u128::from(wp) * u128::from(draft_mass);
    let minus = u128::from(wq) * u128::from(target_mass);
    let rho = plus.saturating_sub(minus) >> shift;
    u64::try_from(rho).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logit_weights::row_weights;

    #[test]
    fn ordinals_order_like_the_values() {
        let values = [
            f32::NEG_INFINITY,
            -2.0,
            -0.5,
            -1e-40,
            0.0,
            1e-40,
            0.5,
            3.0,
            f32::INFINITY,
        ];
        for pair in values.windows(2) {
            assert!(value_ord(pair[0]) < value_ord(pair[1]), "{pair:?}");
        }
        assert_eq!(value_ord(-0.0), value_ord(0.0));
        assert_eq!(value_ord(f32::NAN), value_ord(f32::NEG_INFINITY));
        assert_eq!(value_ord(f32::NEG_INFINITY), 0x007f_ffff);
        assert!(argmax_ord(f32::NAN) < value_ord(f32::NEG_INFINITY));
        for x in values {
            assert_eq!(ord_value(value_ord(x)), x + 0.0);
        }
    }

    #[test]
    fn keys_order_value_then_id() {
        let key = |v: f32, id| token_key(KeyOrder::Rank, true, v, id);
        assert!(key(1.0, 7) > key(0.5, 0));
        assert!(key(1.0, 3) > key(1.0, 4));
        assert_eq!(key_id(key(1.0, 1_048_575)), 1_048_575);
        assert_eq!(key_value(key(-2.5, 9)), -2.5);
        assert!(key(f32::NEG_INFINITY, (1 << 20) - 1) > NO_KEY);
        // A probability of 0 still has a real key; sanitized values tie.
        assert!(token_key(KeyOrder::Rank, false, 0.0, (1 << 20) - 1) > NO_KEY);
        assert_eq!(
            token_key(KeyOrder::Rank, false, 2.0, 0),
            token_key(KeyOrder::Rank, false, 1.0, 0)
        );
        assert!(above_value(key(1.0, 0)) > key(1.0, 0));
        assert!(above_value(key(1.0, 0)) <= key(1.0f32.next_up(), 1 << 19));
    }

    /// The slice weights of every token are the unsharded row's (`row_weights`), whatever slice
    /// it is read from.
    #[test]
    fn slice_weights_are_the_row_weights() {
        let row = [2.0, 1.0, 0.0, -1.5, f32::NEG_INFINITY, f32::NAN, 2.0, -30.0];
        for t in [1.0, 0.7, 2.5, 0.0, f32::INFINITY] {
            let row_key = (0..row.len())
                .map(|id| token_key(KeyOrder::Rank, true, row[id], id))
                .max()
                .unwrap_or(NO_KEY);
            let weigher = SliceWeigher::new(row_key, Some(t), None);
            let weights: Vec<u64> = (0..row.len())
                .map(|id| weigher.weight(row[id], id))
                .collect();
            assert_eq!(weights, row_weights(&row, t), "T = {t}");
        }
        let inf = [1.0, f32::INFINITY, 3.0, f32::INFINITY];
        let weigher = SliceWeigher::new(
            token_key(KeyOrder::Rank, true, f32::INFINITY, 1),
            Some(0.0),
            None,
        );
        let weights: Vec<u64> = (0..4).map(|id| weigher.weight(inf[id], id)).collect();
        assert_eq!(weights, row_weights(&inf, 0.0));
        let none = SliceWeigher::new(NO_KEY, Some(1.0), None);
        assert_eq!(none.weight(5.0, 0), 0);
    }

    #[test]
    fn min_p_drops_against_the_row_maximum() {
        // Probabilities: w_max is the weight of the row key's value.
        let weigher = SliceWeigher::new(token_key(KeyOrder::Rank, false, 0.5, 3), None, Some(0.5));
        assert_eq!(weigher.weight(0.25, 0), 1 << 38);
        assert_eq!(weigher.weight(0.2, 0), 0);
        // Logits: w_max = 2^40, so min_p 0.5 keeps weights ≥ 2^39 (gaps ≤ ln 2 at T = 1).
        let weigher = SliceWeigher::new(
            token_key(KeyOrder::Rank, true, 0.0, 3),
            Some(1.0),
            Some(0.5),
        );
        assert_eq!(weigher.weight(0.0, 1), 1 << 40);
        assert_eq!(weigher.weight(-1.0, 1), 0);
        assert_eq!(min_p_fixed(0.0), None);
        assert_eq!(min_p_fixed(f32::NAN), None);
        assert_eq!(min_p_fixed(7.0), Some(1 << 24));
    }

    #[test]
    fn residuals_are_exact() {
        assert_eq!(residual_shift(false, 1, 1), 41);
        assert_eq!(residual_shift(true, 1 << 59, 1 << 59), 60);
        assert_eq!(residual_shift(true, 1 << 40, 1 << 20), 2);
        assert_eq!(residual(3, 1, (4, 8), 0), 20);
        assert_eq!(residual(1, 3, (4, 8), 0), 0);
        assert_eq!(residual(u64::MAX, 0, (0, u64::MAX), 0), u64::MAX);
    }
}
