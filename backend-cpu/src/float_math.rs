//! Vectorised row passes of the float ops (`softmax`, `accept_logprobs`): the row's maximum and
//! +inf count, and `Σ exp((l − m) / T)` with an `exp` the compiler can vectorise.
//!
//! The float ops are tolerance-compared (`docs/semantics.md` §5.5): the contract fixes f32
//! accumulation and the order of the scaling (subtract the maximum, then divide), not how `exp` is
//! evaluated. [`exp`] is a branch-free Cody–Waite reduction with a degree-6 polynomial (within
//! 2 ulp of the correctly rounded value over the normal range, and exactly 0 at −inf), so the
//! passes compile to straight vector code in the AVX-512 and AVX2 variants chosen at run time.
//! The normaliser of `accept_logprobs` ([`sum_exp_reciprocal`]) has hand-written loops whose
//! terms read only `y ≤ 0` and floor it at −87, which drops the range checks and the subnormal
//! scaling of [`exp`] (about half the operations on the AVX2 loops).

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
/// lanes (eight AVX2 lanes): the normaliser of `accept_logprobs`, which is tolerance-compared
/// (§5.11), with the division by `t` replaced by a multiply by `1/t` (within an ulp of the
/// quotient: its error in the sum is far below the tolerance). Each term is [`normaliser_term`],
/// the same bits in every variant. `None` where the loop does not apply: neither AVX-512 nor
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

/// The least scaled logit the normaliser's terms read: `e^y` of a smaller `y` (−inf and NaN
/// included) counts as `e^-87` (`1.6 · 10^-38`, with `2^n` still a normal f32). The sum holds the
/// maximum's term, 1, so what those terms add is below `V · 2^-125` of it, far under §5.11's
/// tolerance.
const TERM_FLOOR: f32 = -87.0;
/// `1.5 · 2^23 + 127`: adding it to `y · log2(e)` (`|·| < 2^22`) rounds to an integer `n` and
/// leaves `n + 127`, the biased exponent of `2^n`, in the low bits of the sum.
const BIASED_ROUNDER: f32 = 12_583_039.0;
/// Cephes' `e^r ≈ 1 + r + r² · p(r)` as one polynomial, the highest coefficient first (Horner
/// with FMAs, one step fewer than the two-part form).
const TERM_POLYNOMIAL: [f32; 8] = {
    let mut c = [1.0; 8];
    let mut k = 0;
    while k < 6 {
        c[k] = EXP_POLYNOMIAL[k];
        k += 1;
    }
    c
};

/// A term `e^y` of the normaliser, `y = max((x − m) · inverse, TERM_FLOOR)` (NaN reads as the
/// floor): the Cody–Waite reduction of [`exp`] with `2^n` from the exponent bits of the rounded
/// sum, on `y ∈ [−87, 0]` only (so never subnormal; within 2 ulp of `e^y`). The scalar form of
/// the vector loops, which give these bits.
#[inline(always)]
fn normaliser_term(x: f32, m: f32, inverse: f32) -> f32 {
    let y = (x - m) * inverse;
    let y = if y >= TERM_FLOOR { y } else { TERM_FLOOR };
    let shifted = y.mul_add(LOG2_E, BIASED_ROUNDER);
    let n = shifted - BIASED_ROUNDER;
    let r = (-n).mul_add(LN2_HI, y);
    let r = (-n).mul_add(LN2_LO, r);
    let p = TERM_POLYNOMIAL[1..]
        .iter()
        .fold(TERM_POLYNOMIAL[0], |p, &c| p.mul_add(r, c));
    p * f32::from_bits(shifted.to_bits() << 23)
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

/// The normaliser's tail (fewer tokens than a step of the vector loop), term by term.
#[cfg(target_arch = "x86_64")]
fn tail_sum(tail: &[f32], max: f32, inverse: f32) -> f32 {
    tail.iter().map(|&x| normaliser_term(x, max, inverse)).sum()
}

/// Writes the module of one vector width: `term`, [`normaliser_term`] on the lanes of one vector,
/// and `sum_exp_reciprocal`, the normaliser's loop (32 tokens a step into `32 / lanes`
/// accumulators, the next row's two cache lines at those tokens' offsets asked for as it goes, the
/// tail term by term). From the width's intrinsics (`mul`, `sub`, `max`, `set1`, `fmadd`,
/// `fnmadd`, `setzero`, `loadu`, `add` of `__m256` or `__m512`) and its two own steps: how a term
/// `p · 2^n` is scaled (`scale`, from `p`, the rounded sum `shifted` whose low bits hold `n`, and
/// `n`) and how the accumulators are summed (`reduce`).
#[cfg(target_arch = "x86_64")]
macro_rules! normaliser_lanes {
    ($(#[$doc:meta])* mod $module:ident: $vec:ident x $lanes:literal, $features:literal ($isa:literal);
        $mul:ident, $sub:ident, $max:ident, $set1:ident, $fmadd:ident, $fnmadd:ident,
        $setzero:ident, $loadu:ident, $add:ident;
        scale |$p:ident, $shifted:ident, $n:ident| $scale:expr;
        reduce |$acc:ident| $reduce:expr) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        mod $module {
            use super::{
                BIASED_ROUNDER, LN2_HI, LN2_LO, LOG2_E, TERM_FLOOR, TERM_POLYNOMIAL, prefetch_pair,
                tail_sum,
            };
            use std::arch::x86_64::*;

            /// f32 lanes of one vector.
            const LANES: usize = $lanes;

            /// [`super::normaliser_term`] of the lanes of one vector.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) fn term(x: $vec, m: $vec, inverse: $vec) -> $vec {
                // `max(y, floor)` returns the floor for a NaN `y` (a NaN logit).
                let y = $mul($sub(x, m), inverse);
                let y = $max(y, $set1(TERM_FLOOR));
                let rounder = $set1(BIASED_ROUNDER);
                let shifted = $fmadd(y, $set1(LOG2_E), rounder);
                let n = $sub(shifted, rounder);
                let r = $fnmadd(n, $set1(LN2_HI), y);
                let r = $fnmadd(n, $set1(LN2_LO), r);
                let mut p = $set1(TERM_POLYNOMIAL[0]);
                for &c in &TERM_POLYNOMIAL[1..] {
                    p = $fmadd(p, r, $set1(c));
                }
                let ($p, $shifted, $n) = (p, shifted, n);
                $scale
            }

            /// See [`super::sum_exp_reciprocal`] (`inverse` is `1/t`).
            ///
            /// # Safety
            #[doc = concat!("The CPU must support ", $isa, ".")]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn sum_exp_reciprocal(
                row: &[f32],
                max: f32,
                inverse: f32,
                next: &[f32],
            ) -> f32 {
                let (m, scale) = ($set1(max), $set1(inverse));
                let mut acc = [$setzero(); 32 / LANES];
                let mut steps = row.chunks_exact(32);
                for (i, v) in (&mut steps).enumerate() {
                    // The next row's two cache lines at these tokens' offsets (32 f32 = 128 bytes).
                    prefetch_pair(next, i);
                    for (j, a) in acc.iter_mut().enumerate() {
                        // SAFETY: `v` holds 32 f32.
                        let x = unsafe { $loadu(v.as_ptr().add(LANES * j)) };
                        *a = $add(*a, term(x, m, scale));
                    }
                }
                let $acc = acc;
                let vector: f32 = $reduce;
                vector + tail_sum(steps.remainder(), max, inverse)
            }
        }
    };
}

normaliser_lanes!(
    /// Hand-written AVX2 loop: eight lanes, `2^n` from the exponent bits of the rounded sum.
    mod avx2: __m256 x 8, "avx2,fma" ("AVX2 and FMA");
        _mm256_mul_ps, _mm256_sub_ps, _mm256_max_ps, _mm256_set1_ps, _mm256_fmadd_ps,
        _mm256_fnmadd_ps, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_add_ps;
    scale |p, shifted, _n| {
        let scale = _mm256_slli_epi32::<23>(_mm256_castps_si256(shifted));
        _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
    };
    reduce |acc| {
        let mut lanes = [0f32; 8];
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum::<f32>()
    }
);

normaliser_lanes!(
    /// Hand-written AVX-512 loop: sixteen lanes, `2^n` by `vscalefps`.
    mod avx512: __m512 x 16, "avx512f,avx512bw,avx512vl,avx512dq" ("AVX-512F/BW/VL/DQ");
        _mm512_mul_ps, _mm512_sub_ps, _mm512_max_ps, _mm512_set1_ps, _mm512_fmadd_ps,
        _mm512_fnmadd_ps, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_add_ps;
    // `n` is an integer in [−126, 0]: the scaling is exact.
    scale |p, _shifted, n| _mm512_scalef_ps(p, n);
    reduce |acc| _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
);

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

    /// `sum(row, max, t)` is the plain `sum_exp` within the float ops' tolerance, on rows with
    /// NaN and −inf of lengths off every vector width (`max` the row's maximum, as the callers
    /// pass it; −1 for the empty row).
    fn assert_sums_close(sum: impl Fn(&[f32], f32, f32) -> f32) {
        for len in [0usize, 1, 7, 8, 15, 16, 17, 31, 32, 33, 1000, 4099] {
            let row: Vec<f32> = (0..len)
                .map(|i| match i % 41 {
                    7 => f32::NAN,
                    9 => f32::NEG_INFINITY,
                    _ => ((i * 7919) % 1013) as f32 / 37.0 - 30.0,
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let max = if max.is_finite() { max } else { -1.0 };
            for t in [1.0f32, 0.8, 0.05, 3.0] {
                let (fast, plain) = (sum(&row, max, t), sum_exp(&row, max, t, None));
                assert!(
                    (fast - plain).abs() <= plain * 1e-5,
                    "len {len}, t {t}: {fast} vs {plain}"
                );
            }
        }
    }

    /// Logits against a maximum of 2.5 whose scaled values cover the terms' range and pass its
    /// floor, with NaN and −inf, `lanes` at a time.
    fn term_inputs(lanes: usize) -> Vec<f32> {
        let mut xs: Vec<f32> = (0..4000).map(|i| 2.5 - i as f32 * 0.0237).collect();
        xs.extend([
            2.5,
            0.0,
            -0.0,
            -84.5,
            -85.0,
            f32::NAN,
            f32::NEG_INFINITY,
            -1e30,
        ]);
        xs.resize(xs.len().div_ceil(lanes) * lanes, -1.0);
        xs
    }

    /// The normaliser's scalar term is `e^y` within 2 ulp of the correctly rounded value down to its floor, and `e^-87` below it
    /// (−inf and NaN included).
    #[test]
    fn the_normaliser_term_is_exp_down_to_its_floor() {
        for t in [1.0f32, 0.8, 0.05, 3.0] {
            let inverse = 1.0 / t;
            for x in term_inputs(1) {
                let term = normaliser_term(x, 2.5, inverse);
                let y = (x - 2.5) * inverse;
                let y = if y >= TERM_FLOOR { y } else { TERM_FLOOR };
                let want = f64::from(y).exp() as f32;
                assert!(ulps(term, want) <= 2, "x {x}, t {t}: {term} vs {want}");
            }
        }
        assert_eq!(normaliser_term(2.5, 2.5, 1.0), 1.0);
    }

    /// The vector terms (`avx2::term`, `avx512::term`) are the scalar term's bits.
    fn assert_terms_equal(lanes: usize, terms: impl Fn(&[f32], f32, f32, &mut [f32])) {
        let xs = term_inputs(lanes);
        for t in [1.0f32, 0.8, 0.05, 3.0] {
            let mut out = vec![0f32; lanes];
            for v in xs.chunks_exact(lanes) {
                terms(v, 2.5, 1.0 / t, &mut out);
                for (&x, &term) in v.iter().zip(&out) {
                    let want = normaliser_term(x, 2.5, 1.0 / t);
                    assert_eq!(term.to_bits(), want.to_bits(), "x {x}, t {t}");
                }
            }
        }
    }

    /// Defines the test `$name`, run where `$has` holds (a reported skip elsewhere): the vector
    /// terms `$term` of `$lanes` lanes (loaded, broadcast and stored by the intrinsics of its
    /// width) are the scalar ones, bit for bit; then `$sums` runs.
    macro_rules! vector_terms_test {
        ($(#[$doc:meta])* fn $name:ident() if $has:ident ($isa:literal):
            $term:path [$load:ident, $set1:ident, $store:ident], $lanes:literal lanes; then $sums:block) => {
            $(#[$doc])*
            #[cfg(target_arch = "x86_64")]
            #[test]
            fn $name() {
                use std::arch::x86_64::{$load, $set1, $store};
                if !$has() {
                    eprintln!(concat!("skipped: no ", $isa, " on this CPU"));
                    return;
                }
                // SAFETY: the CPU supports the width's features; `v` and `out` hold `$lanes` f32.
                assert_terms_equal($lanes, |v, m, inverse, out| unsafe {
                    let x = $load(v.as_ptr());
                    $store(out.as_mut_ptr(), $term(x, $set1(m), $set1(inverse)));
                });
                $sums
            }
        };
    }

    vector_terms_test!(
        /// The AVX2 terms are the scalar ones, bit for bit; the AVX2 reciprocal sum is the plain
        /// sum within the float ops' tolerance.
        fn the_avx2_terms_and_sum_match_the_scalar_ones() if has_avx2 ("AVX2"):
            avx2::term [_mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps], 8 lanes; then {
            // SAFETY: AVX2 and FMA are present.
            assert_sums_close(|row, max, t| unsafe {
                avx2::sum_exp_reciprocal(row, max, 1.0 / t, row)
            });
        }
    );

    vector_terms_test!(
        /// The AVX-512 terms are the scalar ones, bit for bit; the reciprocal sum is the plain sum
        /// within the float ops' tolerance.
        fn the_avx512_terms_and_sum_match_the_scalar_ones() if has_avx512 ("AVX-512"):
            avx512::term [_mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps], 16 lanes; then {
            assert_sums_close(|row, max, t| {
                sum_exp_reciprocal(row, max, t, row).expect("AVX-512")
            });
            assert_eq!(sum_exp_reciprocal(&[0.0], 0.0, 1e-40, &[]), None);
            assert_eq!(sum_exp_reciprocal(&[0.0], f32::INFINITY, 1.0, &[]), None);
        }
    );

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
