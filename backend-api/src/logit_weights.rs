//! Integer weights from logits (`docs/semantics.md` §4b): exact sampling without a softmax.
//!
//! A token's weight is computed from its logit, the row maximum and the row's temperature alone,
//! with integer arithmetic (and one IEEE f32 subtraction), so it is the same integer on every
//! backend. The weights are proportional to `exp(l / T)` within a relative error of `2^-20` for
//! weights ≥ `2^30`, the maximum weighs `2^40`, and weights never increase down the rank order.
//!
//! The steps, each a function here so that every backend can mirror them one for one:
//! [`sanitize_logit`] → [`row_scale`] (once per row) → [`gap`] (per token) → [`exp2_weight`].
//! [`row_weights`] puts them together for a whole row (for tests, and for users who want a row's
//! weights). The rank order is that of the logits themselves ([`logit_rank_key`]); the sanitized
//! values feed only the weights.

use crate::abi::WEIGHT_BITS;

/// Fraction bits of the gap `X` (log2 units): `F = 24`.
pub const GAP_FRACTION_BITS: u32 = 24;
/// The gap at and beyond which a weight is 0: 40 (log2 units), in fixed point `40 · 2^F`.
pub const GAP_LIMIT: u64 = 40 << GAP_FRACTION_BITS;
/// `floor(log2(e) · 2^63)`.
pub const LOG2E_Q63: u64 = 0xB8AA_3B29_5C17_F0BB;
/// The coefficients of the polynomial for `2^(g)`, `g = G / 2^F` in `(0, 1]`, in Q30; they sum to
/// `2^31`, so the gap 0 gets exactly `2^31 << 9 = 2^40`.
pub const EXP2_COEFFICIENTS: [u64; 7] = [
    1_073_741_824,
    744_260_916,
    257_944_779,
    59_574_981,
    10_392_181,
    1_336_066,
    232_901,
];

/// A logit as the rules read it (step 1): NaN is −inf; a finite `|l| < 2^-76` is +0; a finite
/// `|l| > 2^64` is ±2^64. So no later step meets a subnormal difference or an overflow.
#[inline(always)]
pub fn sanitize_logit(l: f32) -> f32 {
    /// 2^-76, exactly (biased exponent 51, zero mantissa).
    const TINY: f32 = f32::from_bits(0x1980_0000);
    /// 2^64, exactly.
    const HUGE: f32 = f32::from_bits(0x5f80_0000);
    if l.is_nan() {
        f32::NEG_INFINITY
    } else if l.is_infinite() {
        l
    } else if l.abs() < TINY {
        0.0
    } else {
        l.clamp(-HUGE, HUGE)
    }
}

/// The bit pattern of the least positive f32 that [`sanitize_logit`] does not flush to +0
/// (2^-76), taken from the function itself by bisection over the positive finite patterns (it
/// flushes exactly a lower range of them), for the kernels that sanitize on bits.
pub fn logit_tiny_bits() -> u32 {
    let (mut lo, mut hi) = (0u32, f32::INFINITY.to_bits());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if sanitize_logit(f32::from_bits(mid)) == 0.0 {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The bit pattern of the largest finite magnitude [`sanitize_logit`] leaves (2^64).
pub fn logit_huge_bits() -> u32 {
    sanitize_logit(f32::MAX).to_bits()
}

/// The rank key of a logit (step 1): an order-preserving `u32` of the logit itself — not of its
/// sanitized value — with NaN read as −inf and −0 as +0 (larger key = larger logit). The rank
/// order of a logits row is "key descending, then id ascending", so its first token is the row's
/// `argmax` (`docs/semantics.md` §5.4) whenever some logit is above −inf. Sanitizing keeps this
/// order (not strictly), so weights never increase down it; `[1e30, 3e38, −1]` ranks token 1
/// first although both logits read as `2^64`.
#[inline(always)]
pub fn logit_rank_key(l: f32) -> u32 {
    let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
    let bits = (l + 0.0).to_bits();
    if bits >> 31 == 0 {
        bits | 0x8000_0000
    } else {
        !bits
    }
}

/// The logit of a rank key (the inverse of [`logit_rank_key`] on the logits it yields: NaN is
/// never returned, −0 comes back as +0). Its weight is that of its [`sanitize_logit`] value.
#[inline(always)]
pub fn logit_of_rank_key(key: u32) -> f32 {
    if key >> 31 == 1 {
        f32::from_bits(key & 0x7fff_ffff)
    } else {
        f32::from_bits(!key)
    }
}

/// What a row's temperature means for its weights (step 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowScale {
    /// `T == 0`: weight `2^40` for the row's argmax, 0 for every other token.
    ArgmaxOnly,
    /// `T == +inf`: every finite logit weighs `2^40`.
    Uniform,
    /// `c = C32 · 2^e ≈ log2(e) / T`, with `C32` in `[2^31, 2^32)`.
    Scaled {
        /// The 32-bit significand of `c`.
        c32: u64,
        /// Its binary exponent.
        e: i32,
    },
}

/// The temperature of a row as the rules read it (device values: NaN or negative count as 1.0;
/// host values are validated ≥ 0 and not NaN).
#[inline(always)]
pub fn effective_temperature(t: f32) -> f32 {
    if t >= 0.0 { t } else { 1.0 }
}

/// `T = M · 2^E` with `M` the integer significand (subnormals included); `T` finite and > 0.
#[inline(always)]
fn significand(x: f32) -> (u64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    let mantissa = u64::from(bits & 0x7f_ffff);
    match exp {
        0 => (mantissa, -149),
        _ => (mantissa | 0x80_0000, exp - 150),
    }
}

/// Step 3: the row's scale from its (device) temperature, one 64-by-24-bit division.
#[inline]
pub fn row_scale(temperature: f32) -> RowScale {
    let t = effective_temperature(temperature);
    if t == 0.0 {
        return RowScale::ArgmaxOnly;
    }
    if t == f32::INFINITY {
        return RowScale::Uniform;
    }
    let (m_t, e_t) = significand(t);
    let q = LOG2E_Q63 / m_t;
    let b = 64 - q.leading_zeros() as i32;
    RowScale::Scaled {
        c32: q >> (b - 32),
        e: b - 95 - e_t,
    }
}

/// Step 4: the gap `X = min(floor(M_D · C32 · 2^(E_D + e + F)), 40 · 2^F)` of a finite sanitized
/// logit `l` below the row maximum `m`, with `D = m ⊖ l` (one f32 subtraction, rounded to nearest
/// even; `D ≥ 0`).
#[inline(always)]
pub fn gap(m: f32, l: f32, c32: u64, e: i32) -> u64 {
    let d = m - l;
    if d == 0.0 {
        return 0;
    }
    let (m_d, e_d) = significand(d);
    let product = m_d * c32; // < 2^56, so a shift below 8 cannot overflow
    let x = match e_d + e + GAP_FRACTION_BITS as i32 {
        s if s >= 8 => return GAP_LIMIT,
        s if s >= 0 => product << s,
        s if s > -64 => product >> -s,
        _ => 0,
    };
    x.min(GAP_LIMIT)
}

/// Step 5: the weight of gap `x`: `2^40 · 2^(-x / 2^F)` in integers, 0 from `40 · 2^F` on.
#[inline(always)]
pub fn exp2_weight(x: u64) -> u64 {
    if x >= GAP_LIMIT {
        return 0;
    }
    let n = (x >> GAP_FRACTION_BITS) as u32;
    let g = (1u64 << GAP_FRACTION_BITS) - (x & ((1u64 << GAP_FRACTION_BITS) - 1));
    let mut p = EXP2_COEFFICIENTS[6];
    for k in (0..6).rev() {
        p = EXP2_COEFFICIENTS[k] + ((p * g) >> GAP_FRACTION_BITS);
    }
    if n <= 9 { p << (9 - n) } else { p >> (n - 9) }
}

/// The weight of a logit `l` in a row whose sanitized maximum is the finite `m`, at `scale`
/// (steps 4 and 5; `l` is sanitized here). An infinite or NaN `l` weighs 0.
#[inline(always)]
pub fn scaled_weight(l: f32, m: f32, scale: RowScale) -> u64 {
    let l = sanitize_logit(l);
    if !l.is_finite() {
        return 0;
    }
    match scale {
        RowScale::Uniform => 1 << WEIGHT_BITS,
        RowScale::Scaled { c32, e } => exp2_weight(gap(m, l, c32, e)),
        // Only the argmax weighs anything; callers handle that row kind before.
        RowScale::ArgmaxOnly => 0,
    }
}

/// The weights (`docs/semantics.md` §4b) of a whole row of logits at temperature `t`.
pub fn row_weights(row: &[f32], t: f32) -> Vec<u64> {
    let values: Vec<f32> = row.iter().map(|&l| sanitize_logit(l)).collect();
    let full = 1u64 << WEIGHT_BITS;
    if values.contains(&f32::INFINITY) {
        return values
            .iter()
            .map(|&l| if l == f32::INFINITY { full } else { 0 })
            .collect();
    }
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0; row.len()];
    }
    match row_scale(t) {
        RowScale::ArgmaxOnly => {
            // The first token in rank order (by the logit itself, not its sanitized value).
            let best = row.iter().copied().map(logit_rank_key).max().unwrap_or(0);
            let first = row
                .iter()
                .position(|&l| logit_rank_key(l) == best)
                .unwrap_or(0);
            (0..row.len())
                .map(|i| if i == first { full } else { 0 })
                .collect()
        }
        scale => values
            .iter()
            .map(|&l| scaled_weight(l, max, scale))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logit_bounds_are_those_of_sanitize_logit() {
        // 2^-76 and 2^64 (`docs/semantics.md` §4b step 1).
        let tiny = logit_tiny_bits();
        assert_eq!(tiny, 0x1980_0000);
        for bits in [tiny - 1, tiny / 2, 1] {
            assert_eq!(sanitize_logit(f32::from_bits(bits)).to_bits(), 0);
            assert_eq!(sanitize_logit(-f32::from_bits(bits)).to_bits(), 0);
        }
        for bits in [tiny, tiny + 1, 1f32.to_bits()] {
            let l = f32::from_bits(bits);
            assert_eq!(sanitize_logit(l), l);
            assert_eq!(sanitize_logit(-l), -l);
        }
        let huge = f32::from_bits(logit_huge_bits());
        assert_eq!(logit_huge_bits(), 0x5f80_0000);
        assert_eq!(sanitize_logit(f32::from_bits(huge.to_bits() + 1)), huge);
        assert_eq!(sanitize_logit(huge), huge);
        assert_eq!(sanitize_logit(-f32::MAX), -huge);
    }

    const KNOWN: [f32; 8] = [2.0, 1.0, 0.0, -1.5, f32::NEG_INFINITY, f32::NAN, 2.0, -30.0];
    const FULL: u64 = 1 << 40;

    #[test]
    fn the_coefficients_sum_to_two_to_the_31() {
        assert_eq!(EXP2_COEFFICIENTS.iter().sum::<u64>(), 1 << 31);
        assert_eq!(exp2_weight(0), FULL);
    }

    #[test]
    fn row_scales_match_the_contract() {
        let scaled = |c32, e| RowScale::Scaled { c32, e };
        assert_eq!(row_scale(1.0), scaled(3_098_164_009, -31));
        assert_eq!(row_scale(0.7), scaled(2_212_974_330, -30));
        assert_eq!(row_scale(2.5), scaled(2_478_531_207, -32));
        assert_eq!(row_scale(0.0), RowScale::ArgmaxOnly);
        assert_eq!(row_scale(f32::INFINITY), RowScale::Uniform);
        assert_eq!(row_scale(f32::NAN), row_scale(1.0));
        assert_eq!(row_scale(-3.0), row_scale(1.0));
    }

    #[test]
    fn known_answers_of_the_contract() {
        assert_eq!(
            row_weights(&KNOWN, 1.0),
            [
                FULL,
                404_487_729_152,
                148_802_721_408,
                33_202_374_448,
                0,
                0,
                FULL,
                0
            ]
        );
        assert_eq!(
            row_weights(&KNOWN, 0.7),
            [
                FULL,
                263_499_105_408,
                63_147_831_776,
                7_408_450_640,
                0,
                0,
                FULL,
                0
            ]
        );
        assert_eq!(
            row_weights(&KNOWN, 2.5),
            [
                FULL,
                737_024_699_904,
                494_042_421_504,
                271_136_238_848,
                0,
                0,
                FULL,
                3_035_501
            ]
        );
        assert_eq!(row_weights(&KNOWN, 0.0), [FULL, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn special_rows() {
        let inf = f32::INFINITY;
        assert_eq!(row_weights(&[1.0, inf, 3.0, inf], 1.0), [0, FULL, 0, FULL]);
        assert_eq!(row_weights(&[f32::NAN, -inf], 1.0), [0, 0]);
        assert_eq!(row_weights(&[1.0, -inf, -1e30], inf), [FULL, 0, FULL]);
    }

    #[test]
    fn weights_follow_exp_and_never_increase_down_the_rank_order() {
        let row: Vec<f32> = (0..2000).map(|i| 3.0 - i as f32 * 0.0137).collect();
        for t in [0.05f32, 0.7, 1.0, 2.5] {
            let w = row_weights(&row, t);
            assert!(w.windows(2).all(|p| p[0] >= p[1]), "t = {t}");
            for (i, &wi) in w.iter().enumerate() {
                let exact = FULL as f64 * f64::exp(f64::from(row[i] - row[0]) / f64::from(t));
                if exact >= f64::from(1u32 << 30) {
                    let rel = (wi as f64 - exact).abs() / exact;
                    assert!(rel <= 2f64.powi(-20), "t = {t}, i = {i}: {wi} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn the_polynomial_is_monotone_in_its_argument() {
        // P(G) non-decreasing for every G in [1, 2^24], i.e. the weight non-increasing in the gap.
        let mut last = 0u64;
        for x in (0..(1u64 << 24)).rev() {
            let w = exp2_weight(x);
            assert!(w >= last, "x = {x}");
            last = w;
        }
    }

    #[test]
    fn hostile_logits_are_sanitized() {
        assert_eq!(sanitize_logit(f32::NAN), f32::NEG_INFINITY);
        assert_eq!(sanitize_logit(1e-30), 0.0);
        assert_eq!(sanitize_logit(-1e-30), 0.0);
        assert_eq!(sanitize_logit(3e38), 2f32.powi(64));
        assert_eq!(sanitize_logit(-3e38), -(2f32.powi(64)));
        // The bounds are exactly 2^-76 and 2^64: the float just below 2^-76 is read as 0, 2^-76
        // itself is kept, and the float just above 2^64 is clamped to it.
        let tiny = 2f32.powi(-76);
        let below = f32::from_bits(tiny.to_bits() - 1);
        assert_eq!(sanitize_logit(below), 0.0);
        assert_eq!(sanitize_logit(-below), 0.0);
        assert_eq!(sanitize_logit(tiny), tiny);
        assert_eq!(sanitize_logit(-tiny), -tiny);
        let huge = 2f32.powi(64);
        assert_eq!(sanitize_logit(f32::from_bits(huge.to_bits() + 1)), huge);
        assert!(logit_rank_key(1.0) > logit_rank_key(0.5));
        assert!(logit_rank_key(-0.5) > logit_rank_key(-1.0));
        assert_eq!(logit_rank_key(-0.0), logit_rank_key(0.0));
        assert!(logit_rank_key(f32::NAN) < logit_rank_key(-3e38));
        assert_eq!(logit_rank_key(f32::NAN), logit_rank_key(f32::NEG_INFINITY));
    }

    /// The rank order is that of the logits themselves (contract §3b step 1, revised): logits
    /// that read as the same value (both clamped to `2^64`, both flushed to +0) still rank by
    /// their value, so the first token in rank order is the argmax.
    #[test]
    fn the_rank_order_is_that_of_the_logits_themselves() {
        let order = |row: &[f32]| {
            let mut ids: Vec<usize> = (0..row.len()).collect();
            ids.sort_by_key(|&i| (std::cmp::Reverse(logit_rank_key(row[i])), i));
            ids
        };
        assert_eq!(order(&[1e30, 3e38, -1.0]), [1, 0, 2]);
        assert_eq!(order(&[1e-30, 2e-30, -5.0]), [1, 0, 2]);
        assert_eq!(order(&[-1e-30, -0.0, 0.0, 1e-40]), [3, 1, 2, 0]);
        assert_eq!(
            order(&[-3e38, -1e30, f32::NAN, f32::NEG_INFINITY]),
            [1, 0, 2, 3]
        );
        // Both weigh 2^40 at a finite T; at T = 0 the argmax alone.
        assert_eq!(row_weights(&[1e30, 3e38, -1.0], 1.0), [FULL, FULL, 0]);
        assert_eq!(row_weights(&[1e30, 3e38, -1.0], 0.0), [0, FULL, 0]);
        assert_eq!(row_weights(&[1e-30, 2e-30, -5.0], 0.0), [0, FULL, 0]);
        assert_eq!(row_weights(&[-0.0, 0.0, -1.0], 0.0), [FULL, 0, 0]);
        for key in [
            0x8000_0000u32,
            0x3f80_0000,
            0xff7f_ffff,
            0xff80_0000,
            0x007f_ffff,
        ] {
            let l = logit_of_rank_key(key);
            assert_eq!(logit_rank_key(l), key, "{key:#x}");
        }
        for l in [
            1e30f32,
            3e38,
            -1e-30,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(logit_of_rank_key(logit_rank_key(l)), l + 0.0);
        }
    }
}
