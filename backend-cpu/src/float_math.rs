//! Vectorised row passes of the float ops (`softmax`, `accept_logprobs`): the row's maximum and
//! +inf count, and `Σ exp((l − m) / T)` with an `exp` the compiler can vectorise.
//!
//! The float ops are tolerance-compared (`docs/semantics.md` §5.5): the contract fixes f32
//! accumulation and the order of the scaling (subtract the maximum, then divide), not how `exp` is
//! evaluated. [`exp`] is a branch-free Cody–Waite reduction with a degree-6 polynomial (within
//! 2 ulp of the correctly rounded value over the normal range, and exactly 0 at −inf), so the
//! passes compile to straight vector code in the AVX-512 and AVX2 variants chosen at run time.

use specula_backend_api::FloatElement;

use crate::sampling::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// Independent accumulators per pass: one AVX-512 register of f32 (two AVX2 registers).
const LANES: usize = 16;

/// `log2(e)`.
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two for the reduction (`HI` has trailing zero bits, so `n · HI` is exact).
const LN2_HI: f32 = 0.693_359_4;
/// The rest of `ln 2`.
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this, `exp` is 0 in f32 (the smallest subnormal is `e^-103.28`).
const EXP_UNDERFLOW: f32 = -103.9;
/// Above this, `exp` overflows f32.
const EXP_OVERFLOW: f32 = 88.722_83;
/// `1.5 · 2^23`: adding it rounds an f32 of magnitude < 2^22 to an integer (ties to even), which
/// then sits in the low bits of the sum's significand.
const ROUNDER: f32 = 12_582_912.0;

/// The coefficients of `e^r ≈ 1 + r + r² · p(r)` on `[−ln2/2, ln2/2]` (Cephes' `expf`), the
/// highest first.
const EXP_POLYNOMIAL: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x` in f32 without branches (vectorisable): ±1 ulp-level accurate, 0 for `x ≤ −103.9` (−inf
/// included), +inf above the f32 range. `x` must not be NaN (the callers map NaN to −inf first).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let clamped = x.clamp(EXP_UNDERFLOW, EXP_OVERFLOW);
    // n = round(x / ln 2), read from the significand of `x · log2(e) + ROUNDER`.
    let shifted = clamped * LOG2_E + ROUNDER;
    let n = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let nf = shifted - ROUNDER;
    // r = x − n · ln 2 ∈ [−ln2/2, ln2/2].
    let r = clamped - nf * LN2_HI - nf * LN2_LO;
    // e^r: the minimax polynomial of Cephes' expf.
    let p = EXP_POLYNOMIAL[1..]
        .iter()
        .fold(EXP_POLYNOMIAL[0], |p, &c| p * r + c);
    let er = p * (r * r) + r + 1.0;
    // 2^n in two normal factors, so that subnormal results come out right: n ∈ [−150, 128].
    let half = n >> 1;
    let value = er * pow2(half) * pow2(n - half);
    if x < EXP_UNDERFLOW {
        0.0
    } else if x > EXP_OVERFLOW {
        f32::INFINITY
    } else {
        value
    }
}

/// `2^k` for `k ∈ [−126, 127]`, built from its exponent bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `(x − m) · inverse` with NaN read as −inf: the reciprocal loops' scaled logit, for their tails.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn scaled_finite_reciprocal(x: f32, m: f32, inverse: f32) -> f32 {
    let y = (x - m) * inverse;
    if y.is_nan() { f32::NEG_INFINITY } else { y }
}

/// The scaled logit of a finite temperature in a row whose maximum `m` is finite: `(x − m) / t`,
/// NaN (a NaN logit) read as −inf. Branch-free.
#[inline(always)]
fn scaled_finite(x: f32, m: f32, t: f32) -> f32 {
    let y = (x - m) / t;
    if y.is_nan() { f32::NEG_INFINITY } else { y }
}

/// The maximum of a row (NaN ignored; −inf for a row of NaN and −inf) and how many entries are
/// +inf, in one vectorised pass.
pub(crate) fn max_and_inf_count<T: FloatElement>(row: &[T]) -> (f32, usize) {
    dispatch!(max_and_inf_count_generic::<T>(row) via max_and_inf_count_avx512, max_and_inf_count_avx2)
}

compiled_for!(avx512, fn max_and_inf_count_avx512 [T: FloatElement]
    (row: &[T]) -> (f32, usize) = max_and_inf_count_generic [T]);
compiled_for!(avx2, fn max_and_inf_count_avx2 [T: FloatElement]
    (row: &[T]) -> (f32, usize) = max_and_inf_count_generic [T]);

#[inline(always)]
fn max_and_inf_count_generic<T: FloatElement>(row: &[T]) -> (f32, usize) {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut infs = [0u32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for ((m, c), v) in max.iter_mut().zip(infs.iter_mut()).zip(chunk) {
            let x = v.to_f32();
            // `x > m` is false for NaN: NaN never becomes the maximum.
            *m = if x > *m { x } else { *m };
            *c += u32::from(x == f32::INFINITY);
        }
    }
    let mut best = f32::NEG_INFINITY;
    let mut count = 0usize;
    for v in chunks.remainder() {
        let x = v.to_f32();
        best = if x > best { x } else { best };
        count += usize::from(x == f32::INFINITY);
    }
    for (m, c) in max.iter().zip(&infs) {
        best = if *m > best { *m } else { best };
        count += *c as usize;
    }
    (best, count)
}

/// `Σ exp((x − max) / t)` over a row whose maximum `max` is finite, at a finite `t > 0`; when
/// `out` is given (the row's length), each term is also written there.
pub(crate) fn sum_exp<T: FloatElement>(
    row: &[T],
    max: f32,
    t: f32,
    out: Option<&mut [f32]>,
) -> f32 {
    match out {
        Some(out) => {
            dispatch!(exp_into_generic::<T>(row, max, t, out) via exp_into_avx512, exp_into_avx2)
        }
        None => dispatch!(sum_exp_generic::<T>(row, max, t) via sum_exp_avx512, sum_exp_avx2),
    }
}

compiled_for!(avx512, fn sum_exp_avx512 [T: FloatElement]
    (row: &[T], max: f32, t: f32) -> f32 = sum_exp_generic [T]);
compiled_for!(avx2, fn sum_exp_avx2 [T: FloatElement]
    (row: &[T], max: f32, t: f32) -> f32 = sum_exp_generic [T]);
compiled_for!(avx512, fn exp_into_avx512 [T: FloatElement]
    (row: &[T], max: f32, t: f32, out: &mut [f32]) -> f32 = exp_into_generic [T]);
compiled_for!(avx2, fn exp_into_avx2 [T: FloatElement]
    (row: &[T], max: f32, t: f32, out: &mut [f32]) -> f32 = exp_into_generic [T]);

#[inline(always)]
fn sum_exp_generic<T: FloatElement>(row: &[T], max: f32, t: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += exp(scaled_finite(v.to_f32(), max, t));
        }
    }
    let rest: f32 = chunks
        .remainder()
        .iter()
        .map(|v| exp(scaled_finite(v.to_f32(), max, t)))
        .sum();
    lanes.iter().sum::<f32>() + rest
}

#[inline(always)]
fn exp_into_generic<T: FloatElement>(row: &[T], max: f32, t: f32, out: &mut [f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    let mut outs = out.chunks_exact_mut(LANES);
    for (chunk, o) in (&mut chunks).zip(&mut outs) {
        for ((acc, v), o) in lanes.iter_mut().zip(chunk).zip(o.iter_mut()) {
            let e = exp(scaled_finite(v.to_f32(), max, t));
            *o = e;
            *acc += e;
        }
    }
    let mut rest = 0.0f32;
    for (v, o) in chunks.remainder().iter().zip(outs.into_remainder()) {
        let e = exp(scaled_finite(v.to_f32(), max, t));
        *o = e;
        rest += e;
    }
    lanes.iter().sum::<f32>() + rest
}

/// `Σ exp((x − max) · (1/t))` over an f32 row whose maximum `max` is finite, in sixteen AVX-512
/// lanes (eight AVX2 lanes): the normaliser of `accept_logprobs`, which is tolerance-compared (§5.11), with the
/// division by `t` replaced by a multiply by `1/t` (within an ulp of the quotient: its error in
/// the sum is far below the tolerance). `None` where the loop does not apply: neither AVX-512 nor
/// AVX2, or a `t` whose reciprocal is not a normal f32 (the caller takes [`sum_exp`]).
///
/// `next` is the row the caller reads next (or empty): its bytes at the offsets of the tokens
/// being summed are asked for into L2 as the loop goes (a hint that never faults), so that the
/// next row's first pass, which is bound by memory, finds it there while this pass computes.
pub(crate) fn sum_exp_reciprocal(row: &[f32], max: f32, t: f32, next: &[f32]) -> Option<f32> {
    let inverse = 1.0 / t;
    if !inverse.is_normal() || !max.is_finite() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F/BW/VL/DQ are present.
        return Some(unsafe { avx512::sum_exp_reciprocal(row, max, inverse, next) });
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return Some(unsafe { avx2::sum_exp_reciprocal(row, max, inverse, next) });
    }
    None
}

/// Asks for the two cache lines of `next` at tokens `32 · i ..` (a hint into L2).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_pair(next: &[f32], i: usize) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    if let Some(ahead) = next.get(32 * i..32 * i + 32) {
        let at = ahead.as_ptr().cast::<i8>();
        // SAFETY: a prefetch is a hint; both addresses are inside `ahead` (128 bytes).
        unsafe {
            _mm_prefetch::<_MM_HINT_T1>(at);
            _mm_prefetch::<_MM_HINT_T1>(at.add(64));
        }
    }
}

/// Hand-written AVX2 loops: eight lanes, `2^n` in two factors as in [`exp`].
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{
        EXP_OVERFLOW, EXP_POLYNOMIAL, EXP_UNDERFLOW, LN2_HI, LN2_LO, LOG2_E, ROUNDER, prefetch_pair,
    };
    use std::arch::x86_64::*;

    /// `2^k` of 8 lanes, `k ∈ [−126, 127]`, from its exponent bits.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn pow2(k: __m256i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )))
    }

    /// [`super::exp`] of 8 lanes (none NaN): the same reduction and polynomial, with FMAs.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp8(x: __m256) -> __m256 {
        let clamped = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_UNDERFLOW)),
            _mm256_set1_ps(EXP_OVERFLOW),
        );
        let rounder = _mm256_set1_ps(ROUNDER);
        let shifted = _mm256_fmadd_ps(clamped, _mm256_set1_ps(LOG2_E), rounder);
        let n = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_castps_si256(rounder));
        let nf = _mm256_sub_ps(shifted, rounder);
        let r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LN2_HI), clamped);
        let r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLYNOMIAL[0]);
        for &c in &EXP_POLYNOMIAL[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let er = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let half = _mm256_srai_epi32::<1>(n);
        let value = _mm256_mul_ps(
            _mm256_mul_ps(er, pow2(half)),
            pow2(_mm256_sub_epi32(n, half)),
        );
        // 0 below the range (−inf included), +inf above it.
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_UNDERFLOW));
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_OVERFLOW));
        let value = _mm256_blendv_ps(value, _mm256_set1_ps(f32::INFINITY), over);
        _mm256_andnot_ps(under, value)
    }

    /// See [`super::sum_exp_reciprocal`] (`inverse` is `1/t`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum_exp_reciprocal(
        row: &[f32],
        max: f32,
        inverse: f32,
        next: &[f32],
    ) -> f32 {
        let (m, scale) = (_mm256_set1_ps(max), _mm256_set1_ps(inverse));
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        let term = |x: __m256| {
            // `max(y, −inf)` returns −inf for a NaN `y` (a NaN logit weighs 0).
            let y = _mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(x, m), scale), neg_inf);
            exp8(y)
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut groups = row.chunks_exact(32);
        for (i, v) in (&mut groups).enumerate() {
            prefetch_pair(next, i);
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `v` holds 32 f32.
                let x = unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * j)) };
                *a = _mm256_add_ps(*a, term(x));
            }
        }
        let mut lanes = [0f32; 8];
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        let rest: f32 = groups
            .remainder()
            .iter()
            .map(|&x| super::exp(super::scaled_finite_reciprocal(x, max, inverse)))
            .sum();
        lanes.iter().sum::<f32>() + rest
    }
}

/// Hand-written AVX-512 loops (LLVM keeps generic loops in 256-bit registers on these CPUs).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{
        EXP_OVERFLOW, EXP_POLYNOMIAL, EXP_UNDERFLOW, LN2_HI, LN2_LO, LOG2_E, ROUNDER, prefetch_pair,
    };
    use std::arch::x86_64::*;

    /// [`super::exp`] of 16 lanes (none NaN): the same reduction and polynomial, with FMAs, and
    /// `2^n` by `vscalefps` (which rounds subnormal results right).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn exp16(x: __m512) -> __m512 {
        let clamped = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_UNDERFLOW)),
            _mm512_set1_ps(EXP_OVERFLOW),
        );
        let rounder = _mm512_set1_ps(ROUNDER);
        let shifted = _mm512_fmadd_ps(clamped, _mm512_set1_ps(LOG2_E), rounder);
        let nf = _mm512_sub_ps(shifted, rounder);
        let r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(LN2_HI), clamped);
        let r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLYNOMIAL[0]);
        for &c in &EXP_POLYNOMIAL[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let er = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let value = _mm512_scalef_ps(er, nf);
        // 0 below the range (−inf included), +inf above it.
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_UNDERFLOW));
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_OVERFLOW));
        let value = _mm512_mask_mov_ps(value, over, _mm512_set1_ps(f32::INFINITY));
        _mm512_maskz_mov_ps(!under, value)
    }

    /// See [`super::sum_exp_reciprocal`] (`inverse` is `1/t`).
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn sum_exp_reciprocal(
        row: &[f32],
        max: f32,
        inverse: f32,
        next: &[f32],
    ) -> f32 {
        let (m, inverse) = (_mm512_set1_ps(max), _mm512_set1_ps(inverse));
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        let term = |x: __m512| {
            // `max(y, −inf)` returns −inf for a NaN `y` (a NaN logit weighs 0).
            let y = _mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(x, m), inverse), neg_inf);
            exp16(y)
        };
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut pairs = row.chunks_exact(32);
        for (i, v) in (&mut pairs).enumerate() {
            // The next row's two cache lines at these tokens' offsets (32 f32 = 128 bytes).
            prefetch_pair(next, i);
            // SAFETY: `v` holds 32 f32.
            let (a, b) = unsafe {
                (
                    _mm512_loadu_ps(v.as_ptr()),
                    _mm512_loadu_ps(v.as_ptr().add(16)),
                )
            };
            acc0 = _mm512_add_ps(acc0, term(a));
            acc1 = _mm512_add_ps(acc1, term(b));
        }
        for v in pairs.remainder().chunks(16) {
            let lanes = (1u32 << v.len()) - 1;
            // SAFETY: the mask reads only the `v.len()` values of `v`; the others are −inf.
            let x = unsafe { _mm512_mask_loadu_ps(neg_inf, lanes as __mmask16, v.as_ptr()) };
            acc0 = _mm512_add_ps(acc0, term(x));
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_correctly_rounded_value_over_the_normal_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.7 {
            let want = (f64::from(x)).exp() as f32;
            worst = worst.max(ulps(exp(x), want));
            x += 0.000_37;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    /// Arguments of `exp` over its range and past its ends, `lanes` at a time.
    fn exp_inputs(lanes: usize) -> Vec<f32> {
        let mut xs: Vec<f32> = (0..4000).map(|i| -104.5 + i as f32 * 0.0481).collect();
        let edges = [
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            -87.3,
            -103.0,
            -103.9,
            -104.0,
            -1e30,
        ];
        xs.extend(edges);
        xs.resize(xs.len().div_ceil(lanes) * lanes, -1.0);
        xs
    }

    /// A vector `exp` value `e` of `x` is the scalar one within 2 ulp (or 2 subnormal steps).
    fn assert_exp_close(x: f32, e: f32) {
        let want = exp(x);
        assert!(
            ulps(e, want) <= 2 || (e - want).abs() <= f32::from_bits(2),
            "exp({x}) = {e}, want {want}"
        );
    }

    /// `sum(row, max, t)` is the plain `sum_exp` within the float ops' tolerance, on rows with
    /// NaN and −inf of lengths off every vector width.
    fn assert_sums_close(sum: impl Fn(&[f32], f32, f32) -> f32) {
        for len in [0usize, 1, 7, 8, 15, 16, 17, 31, 32, 33, 1000, 4099] {
            let row: Vec<f32> = (0..len)
                .map(|i| match i % 41 {
                    7 => f32::NAN,
                    9 => f32::NEG_INFINITY,
                    _ => ((i * 7919) % 1013) as f32 / 37.0 - 30.0,
                })
                .collect();
            let max = row.iter().copied().fold(-1.0f32, f32::max);
            for t in [1.0f32, 0.8, 0.05, 3.0] {
                let (fast, plain) = (sum(&row, max, t), sum_exp(&row, max, t, None));
                assert!(
                    (fast - plain).abs() <= plain * 1e-5,
                    "len {len}, t {t}: {fast} vs {plain}"
                );
            }
        }
    }

    /// The AVX2 `exp` is the scalar one within 2 ulp over the normal range, 0 below it and right
    /// at −inf; the AVX2 reciprocal sum is the plain sum within the float ops' tolerance.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_exp_and_sum_match_the_scalar_ones() {
        use std::arch::x86_64::{_mm256_loadu_ps, _mm256_storeu_ps};
        if !has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        for v in exp_inputs(8).chunks_exact(8) {
            let mut out = [0f32; 8];
            // SAFETY: AVX2 and FMA are present; `v` and `out` hold 8 f32.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(v.as_ptr()))) };
            v.iter()
                .zip(&out)
                .for_each(|(&x, &e)| assert_exp_close(x, e));
        }
        // SAFETY: AVX2 and FMA are present.
        assert_sums_close(|row, max, t| unsafe {
            avx2::sum_exp_reciprocal(row, max, 1.0 / t, row)
        });
    }

    /// The AVX-512 `exp` is the scalar one within 2 ulp over the normal range, 0 below it and
    /// right at −inf; the reciprocal sum is the plain sum within the float ops' tolerance.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_exp_and_sum_match_the_scalar_ones() {
        use std::arch::x86_64::{_mm512_loadu_ps, _mm512_storeu_ps};
        if !has_avx512() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        for v in exp_inputs(16).chunks_exact(16) {
            let mut out = [0f32; 16];
            // SAFETY: AVX-512 is present; `v` and `out` hold 16 f32.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), avx512::exp16(_mm512_loadu_ps(v.as_ptr())))
            };
            v.iter()
                .zip(&out)
                .for_each(|(&x, &e)| assert_exp_close(x, e));
        }
        assert_sums_close(|row, max, t| sum_exp_reciprocal(row, max, t, row).expect("AVX-512"));
        assert_eq!(sum_exp_reciprocal(&[0.0], 0.0, 1e-40, &[]), None);
        assert_eq!(sum_exp_reciprocal(&[0.0], f32::INFINITY, 1.0, &[]), None);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        // Subnormal results: within 2 of the correctly rounded subnormal.
        for x in [-88.0f32, -95.5, -100.0, -103.0] {
            let want = (f64::from(x)).exp() as f32;
            assert!(ulps(exp(x), want) <= 2, "exp({x}) = {} want {want}", exp(x));
        }
    }

    #[test]
    fn the_row_passes_match_plain_loops() {
        let row: Vec<f32> = (0..1000)
            .map(|i| match i % 97 {
                3 => f32::NAN,
                5 => f32::NEG_INFINITY,
                _ => ((i * 7919) % 1013) as f32 / 37.0 - 12.0,
            })
            .collect();
        let plain_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max_and_inf_count(&row), (plain_max, 0));
        let mut with_inf = row.clone();
        with_inf[17] = f32::INFINITY;
        with_inf[999] = f32::INFINITY;
        assert_eq!(max_and_inf_count(&with_inf), (f32::INFINITY, 2));
        assert_eq!(
            max_and_inf_count::<f32>(&[f32::NAN; 3]).0,
            f32::NEG_INFINITY
        );

        let t = 0.8;
        let plain: f64 = row
            .iter()
            .map(|&x| {
                if x.is_nan() {
                    0.0
                } else {
                    f64::from((x - plain_max) / t).exp()
                }
            })
            .sum();
        let mut out = vec![0.0f32; row.len()];
        let summed = sum_exp(&row, plain_max, t, None);
        let written = sum_exp(&row, plain_max, t, Some(&mut out));
        assert_eq!(summed, written);
        assert!((f64::from(summed) - plain).abs() <= plain * 1e-5);
        assert_eq!(out[3], 0.0);
        assert_eq!(out[5], 0.0);
        let total: f64 = out.iter().map(|&e| f64::from(e)).sum();
        assert!((total - plain).abs() <= plain * 1e-5);
    }
}
