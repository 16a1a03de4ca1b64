//! Fixed-point weights, the rank order, the top-p test and the draw (`docs/semantics.md` §4, §5.6
//! step 3), computed here on purpose: the reference shares none of this arithmetic with the
//! backends.
//!
//! Exactness: an f32 has a 24-bit significand, so `p · 2^40` and `top_p · 2^24` are exact in f64
//! (a power-of-two scaling of a value far inside f64's range), and `floor` / `ceil` of an exact
//! f64 are exact. Masses are at most `V · 2^40 ≤ 2^60` and every product is taken in `u128`.

use std::cmp::Ordering;

use specula_backend_api::logit_weights::row_weights;
use specula_backend_api::rng::{Purpose, draw};

/// `2^40`: the scale of a weight, and the weight of probability 1.
pub(crate) const ONE: u64 = 1 << 40;

/// `sanitize(p)`: 0 for NaN and `p ≤ 0` (both zeros), 1 for `p > 1` (and +inf), `p` otherwise.
pub(crate) fn sanitize(p: f32) -> f32 {
    if p.is_nan() || p <= 0.0 {
        0.0
    } else if p > 1.0 {
        1.0
    } else {
        p
    }
}

/// `w(p) = floor(sanitize(p) · 2^40)`, exact.
pub(crate) fn weight(p: f32) -> u64 {
    (f64::from(sanitize(p)) * ONE as f64).floor() as u64
}

/// `P = ceil(top_p · 2^24)`, exact; a `top_p` outside (0, 1] or NaN counts as 1.0.
pub(crate) fn top_p_fixed(top_p: f32) -> u64 {
    let top_p = if top_p > 0.0 && top_p <= 1.0 {
        top_p
    } else {
        1.0
    };
    (f64::from(top_p) * (1u64 << 24) as f64).ceil() as u64
}

/// Whether mass `c` reaches top_p (fixed point `p`) of total `w`: `c · 2^24 ≥ P · W`, exact.
pub(crate) fn reaches_top_p(c: u64, p: u64, w: u64) -> bool {
    u128::from(c) * (1u128 << 24) >= u128::from(p) * u128::from(w)
}

/// The draw position `t = floor(R · C / 2^64)` of a 64-bit draw `R` within a mass `C`.
pub(crate) fn scale_draw(r: u64, mass: u64) -> u64 {
    ((u128::from(r) * u128::from(mass)) >> 64) as u64
}

/// The token ids of a row in rank order: sanitized value descending, then id ascending.
pub(crate) fn rank_order(row: &[f32]) -> Vec<usize> {
    let mut keyed: Vec<(f32, usize)> = row
        .iter()
        .enumerate()
        .map(|(id, &p)| (sanitize(p), id))
        .collect();
    // Sanitized values are never NaN, so `total_cmp` is the order of the values.
    keyed.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, id)| id).collect()
}

/// A row as the sampling ops see it: each token's weight and the row's rank order. Probabilities
/// weigh `w(p)` and rank by their sanitized value; logits weigh as `docs/semantics.md` §4b says
/// (the contract's integer steps, `specula_backend_api::logit_weights`) and rank by the logit
/// itself ([`logit_rank_cmp`]); ties rank by id.
#[derive(Clone, Debug)]
pub(crate) struct WeightedRow {
    values: Vec<f32>,
    weights: Vec<u64>,
    logits: bool,
}

impl WeightedRow {
    /// A probability row.
    pub(crate) fn probs(values: Vec<f32>) -> Self {
        let weights = values.iter().map(|&p| weight(p)).collect();
        WeightedRow {
            values,
            weights,
            logits: false,
        }
    }

    /// A logits row at (device) temperature `t`.
    pub(crate) fn logits(values: Vec<f32>, t: f32) -> Self {
        let weights = row_weights(&values, t);
        WeightedRow {
            values,
            weights,
            logits: true,
        }
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the row holds logits.
    pub(crate) fn is_logits(&self) -> bool {
        self.logits
    }

    /// The weight of token `id`.
    pub(crate) fn weight(&self, id: usize) -> u64 {
        self.weights[id]
    }

    /// Every token's weight.
    pub(crate) fn weights(&self) -> &[u64] {
        &self.weights
    }

    /// The row's total weight (at most `2^60` for `V ≤ 2^20`).
    pub(crate) fn total(&self) -> u64 {
        self.weights.iter().sum()
    }

    /// The token ids in rank order: value descending (sanitized probabilities; logits as they
    /// are, NaN as −inf), then id ascending.
    pub(crate) fn rank_order(&self) -> Vec<usize> {
        if !self.logits {
            return rank_order(&self.values);
        }
        let mut ids: Vec<usize> = (0..self.len()).collect();
        ids.sort_by(|&a, &b| logit_rank_cmp(self.values[a], self.values[b]).then(a.cmp(&b)));
        ids
    }

    /// The score `top_p_candidates` reports for token `id`: the sanitized probability, or for a
    /// logits row its exact share `q · 2^-40`, `q = floor(w · 2^40 / W)` cut to its 24 most
    /// significant bits (so that `w(score) = q`).
    pub(crate) fn score(&self, id: usize) -> f32 {
        if !self.logits {
            return sanitize(self.values[id]);
        }
        let total = u128::from(self.total());
        if total == 0 {
            return 0.0;
        }
        let q = ((u128::from(self.weights[id]) << 40) / total) as u64;
        let low_bits = (64 - q.leading_zeros()).saturating_sub(24);
        let q = q >> low_bits << low_bits;
        (q as f64 / ONE as f64) as f32
    }
}

/// Draws one token among `members` by weight: `t = scale_draw(draw(seed, purpose), Σw)`, then the
/// first member, in the order given, whose running weight exceeds `t`. `None` when the members
/// weigh nothing.
pub(crate) fn draw_by_weight(
    members: impl Iterator<Item = (i32, u64)> + Clone,
    seed: u64,
    purpose: Purpose,
) -> Option<i32> {
    let total: u64 = members.clone().map(|(_, w)| w).sum();
    if total == 0 {
        return None;
    }
    let t = scale_draw(draw(seed, purpose), total);
    let mut running = 0u64;
    for (token, w) in members {
        running += w;
        if running > t {
            return Some(token);
        }
    }
    None
}

/// The rank order of two logits (`docs/semantics.md` §4b step 1): the logit itself, larger first,
/// NaN as −inf, −0 equal to +0 — not the value the weights read (`Less` means "`a` comes first").
pub(crate) fn logit_rank_cmp(a: f32, b: f32) -> Ordering {
    let read = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    // Neither side is NaN any more, so the two always compare.
    read(b).partial_cmp(&read(a)).unwrap_or(Ordering::Equal)
}

/// The order of `logits` values of `accept_logprobs`' top-K and of `argmax`: larger first, NaN
/// after every number, −0 equal to +0 (`Less` means "`a` comes first").
pub(crate) fn logit_order(a: f32, b: f32) -> Ordering {
    let rank = |x: f32| (!x.is_nan()).then_some(x);
    // `None` (NaN) is below every `Some`; two numbers always compare.
    rank(b).partial_cmp(&rank(a)).unwrap_or(Ordering::Equal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_exact_floors() {
        assert_eq!(weight(1.0), ONE);
        assert_eq!(weight(f32::INFINITY), ONE);
        assert_eq!(weight(0.5), ONE / 2);
        assert_eq!(weight(f32::NAN), 0);
        assert_eq!(weight(-0.0), 0);
        assert_eq!(weight(2f32.powi(-40)), 1);
        assert_eq!(weight(2f32.powi(-41)), 0);
        // 0.1f32 = 13421773 · 2^-27: times 2^40 is 13421773 · 2^13 exactly.
        assert_eq!(weight(0.1), 13_421_773 << 13);
        // 0.3f32 = 10066330 · 2^-25 → · 2^15.
        assert_eq!(weight(0.3), 10_066_330 << 15);
        // A subnormal input weighs 0, its key still ranks above 0.
        assert_eq!(weight(f32::from_bits(1)), 0);
    }

    #[test]
    fn top_p_is_an_exact_ceiling() {
        assert_eq!(top_p_fixed(1.0), 1 << 24);
        assert_eq!(top_p_fixed(0.5), 1 << 23);
        assert_eq!(top_p_fixed(f32::NAN), 1 << 24);
        assert_eq!(top_p_fixed(-3.0), 1 << 24);
        assert_eq!(top_p_fixed(1e-30), 1);
        // 0.9f32 = 15099494 · 2^-24 exactly.
        assert_eq!(top_p_fixed(0.9), 15_099_494);
        // 0.1f32 = 13421773 · 2^-27 → 1677721.625 · ... ceil = 1677722.
        assert_eq!(top_p_fixed(0.1), 1_677_722);
        assert!(reaches_top_p(50, 1 << 23, 100));
        assert!(!reaches_top_p(49, 1 << 23, 100));
        assert_eq!(scale_draw(u64::MAX, 10), 9);
    }

    #[test]
    fn rank_order_is_value_then_id() {
        let row = [0.2, f32::NAN, 0.5, 0.2, -1.0, 2.0, 0.0];
        // 2.0 → 1; then 0.5; the two 0.2 by id; NaN, −1 and 0 all sanitize to 0, by id.
        assert_eq!(rank_order(&row), [5, 2, 0, 3, 1, 4, 6]);
    }

    #[test]
    fn logit_order_puts_nan_last() {
        assert_eq!(logit_order(1.0, f32::NAN), Ordering::Less);
        assert_eq!(logit_order(f32::NAN, f32::NEG_INFINITY), Ordering::Greater);
        assert_eq!(logit_order(-0.0, 0.0), Ordering::Equal);
        assert_eq!(logit_order(2.0, 3.0), Ordering::Greater);
    }
}
