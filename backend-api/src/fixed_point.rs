//! Fixed-point weights, rank keys and the exact top-p test (`docs/semantics.md` §4).
//!
//! Every sampling decision of every backend is made on these integers, so that no decision
//! depends on float rounding, reduction order or FMA contraction.

use crate::abi::{TOP_P_BITS, WEIGHT_BITS};

/// `sanitize(p)`: 0 for NaN and p ≤ 0, 1 for p > 1 (and +inf), else p.
#[inline(always)]
pub fn sanitize(p: f32) -> f32 {
    if p > 1.0 {
        1.0
    } else if p > 0.0 {
        p
    } else {
        // NaN, zero (either sign), negative.
        0.0
    }
}

/// The rank key of a probability: the bit pattern of `sanitize(p)`.
///
/// For sanitized (non-negative) values the bit pattern orders like the value, so the rank order of
/// a row is "key descending, then token id ascending".
#[inline(always)]
pub fn rank_key(p: f32) -> u32 {
    sanitize(p).to_bits()
}

/// The weight of a rank key: `floor(value · 2^40)`, exact.
#[inline(always)]
pub fn key_weight(key: u32) -> u64 {
    let exp = (key >> 23) & 0xff;
    if exp == 0 {
        // Zero or subnormal: below 2^-126, far under 2^-40.
        return 0;
    }
    let mantissa = u64::from((key & 0x7f_ffff) | 0x80_0000);
    // value = mantissa · 2^(exp - 127 - 23); times 2^40.
    let shift = exp as i32 - 127 - 23 + WEIGHT_BITS as i32;
    if shift >= 0 {
        mantissa << shift
    } else if shift > -64 {
        mantissa >> (-shift)
    } else {
        0
    }
}

/// `w(p) = floor(sanitize(p) · 2^40)`, computed exactly. At most `2^40`.
#[inline(always)]
pub fn weight(p: f32) -> u64 {
    key_weight(rank_key(p))
}

/// Whether a device-side `top_p` is usable; values outside (0, 1] and NaN count as 1.0.
#[inline(always)]
pub fn effective_top_p(top_p: f32) -> f32 {
    if top_p > 0.0 && top_p <= 1.0 {
        top_p
    } else {
        1.0
    }
}

/// `P = ceil(top_p · 2^24)`, exact, for `top_p` in (0, 1] (others count as 1.0). In `[1, 2^24]`.
#[inline]
pub fn top_p_fixed(top_p: f32) -> u64 {
    let bits = effective_top_p(top_p).to_bits();
    let exp = (bits >> 23) & 0xff;
    let (mantissa, exp) = if exp == 0 {
        (u64::from(bits & 0x7f_ffff), -126 - 23)
    } else {
        (
            u64::from((bits & 0x7f_ffff) | 0x80_0000),
            exp as i32 - 127 - 23,
        )
    };
    let shift = exp + TOP_P_BITS as i32;
    if shift >= 0 {
        mantissa << shift
    } else if shift > -64 {
        let s = -shift;
        (mantissa + (1u64 << s) - 1) >> s
    } else {
        1
    }
}

/// The least mass `C` with `C · 2^24 ≥ P · W`: the mass a top-p prefix must reach.
#[inline]
pub fn top_p_target_mass(top_p_fixed: u64, total_weight: u64) -> u64 {
    let product = u128::from(top_p_fixed) * u128::from(total_weight);
    product.div_ceil(1u128 << TOP_P_BITS) as u64
}

/// Whether mass `c` reaches top_p (fixed `p`) of total `w`: `c · 2^24 ≥ P · W`, exact.
#[inline]
pub fn reaches_top_p(c: u64, top_p_fixed: u64, total_weight: u64) -> bool {
    (u128::from(c) << TOP_P_BITS) >= u128::from(top_p_fixed) * u128::from(total_weight)
}

/// The draw position `t = floor(R · C / 2^64)` within a mass `C`; always `< C` when `C > 0`.
#[inline(always)]
pub fn scale_draw(draw: u64, mass: u64) -> u64 {
    ((u128::from(draw) * u128::from(mass)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_exact_floors() {
        assert_eq!(weight(1.0), 1 << 40);
        assert_eq!(weight(2.0), 1 << 40);
        assert_eq!(weight(f32::INFINITY), 1 << 40);
        assert_eq!(weight(0.5), 1 << 39);
        assert_eq!(weight(f32::NAN), 0);
        assert_eq!(weight(-0.25), 0);
        assert_eq!(weight(-0.0), 0);
        assert_eq!(weight(f32::MIN_POSITIVE), 0);
        // 2^-40 is the smallest positive weight, 2^-41 rounds down to 0.
        assert_eq!(weight(2f32.powi(-40)), 1);
        assert_eq!(weight(2f32.powi(-41)), 0);
        // A value that is not a dyadic multiple of 2^-40: floor, checked against f64 (exact here).
        for p in [0.1f32, 0.3, 0.7, 1e-7, 0.999_999_9] {
            assert_eq!(
                weight(p),
                (f64::from(p) * 2f64.powi(40)).floor() as u64,
                "{p}"
            );
        }
    }

    #[test]
    fn top_p_fixed_is_an_exact_ceiling() {
        assert_eq!(top_p_fixed(1.0), 1 << 24);
        assert_eq!(top_p_fixed(0.5), 1 << 23);
        assert_eq!(top_p_fixed(f32::NAN), 1 << 24);
        assert_eq!(top_p_fixed(0.0), 1 << 24);
        assert_eq!(top_p_fixed(1.5), 1 << 24);
        assert_eq!(top_p_fixed(1e-30), 1);
        for p in [0.9f32, 0.1, 0.7, 0.333] {
            assert_eq!(
                top_p_fixed(p),
                (f64::from(p) * 2f64.powi(24)).ceil() as u64,
                "{p}"
            );
        }
    }

    #[test]
    fn rank_keys_order_like_values() {
        let values = [0.0f32, 1e-30, 1e-7, 0.1, 0.5, 0.9, 1.0];
        for pair in values.windows(2) {
            assert!(rank_key(pair[0]) < rank_key(pair[1]));
        }
        assert_eq!(rank_key(f32::NAN), rank_key(0.0));
        assert_eq!(rank_key(-1.0), 0);
    }

    #[test]
    fn top_p_reach_is_exact() {
        let p = top_p_fixed(0.5);
        assert!(reaches_top_p(50, p, 100));
        assert!(!reaches_top_p(49, p, 100));
        assert_eq!(top_p_target_mass(p, 100), 50);
        assert_eq!(top_p_target_mass(p, 101), 51);
        assert_eq!(scale_draw(u64::MAX, 10), 9);
        assert_eq!(scale_draw(0, 10), 0);
    }
}
