//! Vectorised row passes of the float ops (`softmax`, `accept_logprobs`): the row's maximum and
//! +inf count, and `Σ exp((l − m) / T)` with an `exp` the compiler can vectorise.
//!
//! The float ops are tolerance-compared (`docs/semantics.md` §5.5): the contract fixes f32
//! accumulation and the order of the scaling (subtract the maximum, then divide), not how `exp` is
//! evaluated. [`exp`] is a branch-free Cody–Waite reduction with a degree-6 polynomial (within
//! 2 ulp of the correctly rounded value over the normal range, and exactly 0 at −inf), so the
//! passes compile to straight vector code in the AVX-512 and AVX2 variants chosen at run time.
//! The normaliser of `accept_logprobs` is summed in the op's one pass over the row by
//! hand-written AVX-512 and AVX2 lanes (`avx512::Normaliser`, `avx2::Normaliser`): against a
//! running reference instead of the row's maximum (see [`REBASE_ABOVE`]), with a cheaper term
//! (`2^y` of `y = (x − R) · log2(e)/T`: an exact reduction, a degree-4 polynomial and an integer
//! add to the exponent bits, no range checks, floored at `2^-125`) whose error bound is proved
//! there.

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

/// The normaliser of `accept_logprobs` in one pass: the terms of an f32 row summed as the row
/// is read, against a running reference instead of the row's maximum, in the hand-written
/// AVX-512 and AVX2 loops (`avx512::Normaliser`, `avx2::Normaliser`, fed by the op's scan).
///
/// **The shift.** `Σ e^((x − M)/T) = e^((R − M)/T) · Σ e^((x − R)/T)` for any reference `R`.
/// The terms are taken in base 2, `2^y` with `y = (x − R) · log2(e)/T`. The loops start from
/// `R = −inf`; when a block of the row holds a logit with `y` above `REBASE_ABOVE` (23), `R`
/// moves to the maximum so far and the sum so far is multiplied by `e^((R_old − R_new)/T)`
/// ([`rebase_factor`]) before the block's terms are added. So every term is at most `2^23`
/// (the sum of any row stays far from overflow), every term already summed is at most 1 after
/// a rebase (the new reference is the maximum so far), and, as `R` only moves by more than
/// `23 · ln 2 · T`, the part of the sum rebased more than once weighs at most `2^-23 · V` of
/// it (`V · 2^-23 < 0.02` at V = 151936): only the last factor's error counts. After the pass,
/// [`Partial::at_max`] moves the sum to the row's maximum `M` (`R ≤ M`, `(M − R)/T ≤ 16`);
/// rows whose maximum is not finite (±inf, all NaN) are left to the two-pass path, which the
/// caller takes on `None`.
///
/// **The error** (the sum is tolerance-compared, §5.11: relative 1e-4 on the log-probability,
/// absolute at least 1e-4 on its normaliser's logarithm). Against `e^((x − M)/T)` exactly,
/// each term carries: the polynomial's relative error (≤ 2.9 · 10⁻⁶ with its f32
/// coefficients on `0 ≤ r < 1`); none from the reduction (`r = y − ⌊y⌋` is exact);
/// Horner's roundings (four FMAs, ≤ 4 · 2⁻²⁴ = 2.4 · 10⁻⁷); none from `2^n` (an exact
/// scaling, `n ≥ −125`); and the argument's (`x − R`,
/// `log2(e)/T` from `fl(1/T)` and the product: `y` within `4 · 2⁻²⁴ · |y|`, so the term
/// within `2.4 · 10⁻⁷ · |ln-term|`). The two exponentials that move the sum (the last rebase
/// and [`Partial::at_max`], [`exp`]: 2 ulp, argument within `[−16, 0]` rounded once) add at
/// most `2 · (2.4 · 10⁻⁷ + 16 · 6 · 10⁻⁸) = 2.4 · 10⁻⁶`. For the terms that carry the sum's
/// mass (`|(x − M)/T| ≤ ln V + 16`, about 28 at V = 151936; smaller terms weigh less than
/// `V · e^-(ln V + 16)` of it together) that is ≤ 3.2 · 10⁻⁶ + 6.7 · 10⁻⁶ + 2.4 · 10⁻⁶ < 1.3 ·
/// 10⁻⁵ relative, an eighth of the tolerance, besides the f32 accumulation (which the tolerance's
/// `normalizer_rounding` covers, as before). The tests against an f64 sum on hostile rows
/// (`the_avx512_normaliser_…`, `the_avx2_normaliser_…`, and the op's
/// `one_pass_normaliser_matches_an_f64_sum`) hold it to 2 · 10⁻⁵.
pub(crate) const REBASE_ABOVE: f32 = 23.0;

/// The least base-2 scaled logit the normaliser's terms read: `2^y` of a smaller `y` (−inf and
/// NaN included) counts as `2^-125` (`2.4 · 10^-38`, with `p · 2^n` still a normal f32). The
/// sum holds the reference's term, at least 1, so what those terms add is below `V · 2^-125`
/// of it, far under §5.11's tolerance.
const TERM_FLOOR: f32 = -125.0;
/// `2^r ≈ 1 + c₁r + … + c₄r⁴` on `0 ≤ r < 1`, the highest coefficient first (Horner with
/// FMAs): the minimax polynomial of relative error with `p(0) = 1` (Remez), rounded to f32:
/// relative error ≤ 2.9 · 10⁻⁶ (`the_normaliser_term_is_exp2_within_its_bound`). Degree 5
/// (9.4 · 10⁻⁸) cost the AVX2 loop 9 % more and the AVX-512 one 4 % more (warm rows); at
/// degree 4 the sum's error stays an eighth of the tolerance (see [`REBASE_ABOVE`]).
const TERM_POLYNOMIAL: [f32; 5] = [
    1.342_668_4e-2,
    5.224_247_3e-2,
    2.412_802e-1,
    6.930_448_4e-1,
    1.0,
];

/// A term `2^y` of the normaliser, `y = max(y, TERM_FLOOR)` (NaN reads as the floor), for
/// `y ≤ REBASE_ABOVE`: `y = n + r` with `n = ⌊y⌋` and `0 ≤ r < 1` (exact), `2^r` by
/// [`TERM_POLYNOMIAL`] (in `[1, 2)`), and `n ≥ −125` added to the exponent bits of the
/// result (exact: it stays normal). The scalar form of the vector loops, which give these
/// bits (AVX-512 by `vreduceps` and `vscalefps`, AVX2 by a floor and an integer add).
#[cfg(test)]
fn term_of(y: f32) -> f32 {
    let y = if y >= TERM_FLOOR { y } else { TERM_FLOOR };
    let n = y.floor();
    let r = y - n;
    let p = TERM_POLYNOMIAL[1..]
        .iter()
        .fold(TERM_POLYNOMIAL[0], |p, &c| p.mul_add(r, c));
    f32::from_bits(p.to_bits().wrapping_add(((n as i32) << 23) as u32))
}

/// `log2(e) / T` from `inverse = 1/T`, rounded once: the scale of the base-2 terms.
#[inline(always)]
pub(crate) fn base2_scale(inverse: f32) -> f32 {
    (std::f64::consts::LOG2_E * f64::from(inverse)) as f32
}

/// The term of logit `x` against reference `m`: [`term_of`] `((x − m) · base2_scale(inverse))`.
#[cfg(test)]
fn normaliser_term(x: f32, m: f32, inverse: f32) -> f32 {
    term_of((x - m) * base2_scale(inverse))
}

/// The factor `e^((from − to) · inverse)` that moves a sum of terms from reference `from` to
/// `to > from` (its argument rounded once): 0 from `−inf` (a sum of floor terms only) or to
/// `+inf`.
#[inline(always)]
pub(crate) fn rebase_factor(from: f32, to: f32, inverse: f32) -> f32 {
    let y = ((f64::from(from) - f64::from(to)) * f64::from(inverse)) as f32;
    if y.is_nan() { 0.0 } else { exp(y) }
}

/// A one-pass normaliser's result: `sum = Σ e^((x − reference) · inverse)` over the row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Partial {
    /// The sum against `reference`.
    pub(crate) sum: f32,
    /// The reference the sum is taken against (−inf if no logit was finite yet, +inf after a
    /// +inf logit).
    pub(crate) reference: f32,
    /// `1/T`.
    pub(crate) inverse: f32,
}

impl Partial {
    /// The normaliser `Σ e^((x − max)/T)` of a row whose maximum (NaN ignored) is `max`, or
    /// `None` where the one pass does not give it (a maximum of ±inf: the caller's special rows).
    pub(crate) fn at_max(self, max: f32) -> Option<f32> {
        if !max.is_finite() || !self.reference.is_finite() || self.reference > max {
            return None;
        }
        if self.reference == max {
            return Some(self.sum);
        }
        Some(self.sum * rebase_factor(self.reference, max, self.inverse))
    }
}

/// `1/t` where the one-pass normaliser applies: a finite `t > 0` whose reciprocal is a normal
/// f32, on a CPU with the AVX-512 or AVX2 loops; `None` elsewhere (the caller sums in a second
/// pass, [`sum_exp`]).
pub(crate) fn one_pass_inverse(t: f32) -> Option<f32> {
    let inverse = 1.0 / t;
    let usable = t > 0.0 && t.is_finite() && inverse.is_normal();
    #[cfg(target_arch = "x86_64")]
    if usable && (has_avx512() || has_avx2()) {
        return Some(inverse);
    }
    let _ = usable;
    None
}

/// Writes the module of one vector width: `term_of` ([`term_of`] on the lanes of one vector),
/// and `Normaliser`, the one pass's sum (see [`REBASE_ABOVE`]). From the width's intrinsics
/// (`mul`, `sub`, `max`, `set1`, `fmadd`, `setzero`, `add` of `__m256` or `__m512`) and its own
/// steps: `y − ⌊y⌋` (`fraction`), `p · 2^⌊y⌋` (`scale`), whether a lane of `y` is above
/// `limit` (`above`), a vector's maximum with NaN ignored (`max_of`), and how the lanes of the
/// sum are added up (`reduce`).
#[cfg(target_arch = "x86_64")]
macro_rules! normaliser_lanes {
    ($(#[$doc:meta])* mod $module:ident: $vec:ident x $lanes:literal, $features:literal;
        $mul:ident, $sub:ident, $max:ident, $set1:ident, $fmadd:ident,
        $setzero:ident, $add:ident;
        fraction |$yf:ident| $fraction:expr;
        scale |$p:ident, $ys:ident| $scale:expr;
        above |$ya:ident, $limit:ident| $above:expr;
        max_of |$xm:ident| $max_of:expr;
        reduce |$acc:ident| $reduce:expr) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        pub(crate) mod $module {
            use super::{
                Partial, REBASE_ABOVE, TERM_FLOOR, TERM_POLYNOMIAL, base2_scale, rebase_factor,
            };
            use std::arch::x86_64::*;

            /// [`super::term_of`] of the lanes of one vector. Not a `target_feature` function,
            /// so that it is always inlined into the loops that are.
            ///
            /// # Safety
            #[doc = concat!("The CPU must support ", $features, ".")]
            #[inline(always)]
            pub(crate) unsafe fn term_of(y: $vec) -> $vec {
                // SAFETY: the caller's promise (the intrinsics need only those features).
                unsafe {
                    // `max(y, floor)` returns the floor for a NaN `y` (a NaN logit).
                    let y = $max(y, $set1(TERM_FLOOR));
                    let $yf = y;
                    let r = $fraction;
                    let mut p = $set1(TERM_POLYNOMIAL[0]);
                    for &c in &TERM_POLYNOMIAL[1..] {
                        p = $fmadd(p, r, $set1(c));
                    }
                    let ($p, $ys) = (p, y);
                    $scale
                }
            }

            /// The one pass's normaliser over the vectors of a row, in any order (see
            /// [`super::REBASE_ABOVE`]).
            #[derive(Clone, Copy)]
            pub(crate) struct Normaliser {
                /// The reference the sum is taken against (−inf until a finite logit).
                reference: f32,
                /// `1/T`.
                inverse: f32,
                /// `reference` in every lane.
                m: $vec,
                /// `log2(e)/T` in every lane ([`base2_scale`]).
                scale: $vec,
                /// The sum's lanes.
                acc: $vec,
            }

            impl Normaliser {
                /// An empty sum at `1/T = inverse`.
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn new(inverse: f32) -> Self {
                    // SAFETY: the caller's promise.
                    unsafe {
                        Normaliser {
                            reference: f32::NEG_INFINITY,
                            inverse,
                            m: $set1(f32::NEG_INFINITY),
                            scale: $set1(base2_scale(inverse)),
                            acc: $setzero(),
                        }
                    }
                }

                /// Adds the terms of the logits `x` (NaN lanes weigh `2^-125`), first moving
                /// the reference to their maximum if one of them is more than
                /// [`REBASE_ABOVE`] above it.
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn add(&mut self, x: $vec) {
                    // SAFETY: the caller's promise.
                    unsafe {
                        if self.too_far(x) {
                            self.rebase(x);
                        }
                        self.add_unchecked(x);
                    }
                }

                /// Adds the terms of the logits `x`, none of them more than
                /// [`REBASE_ABOVE`] above the reference (the caller checks, [`Self::too_far`],
                /// and takes them again if not).
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn add_unchecked(&mut self, x: $vec) {
                    // SAFETY: the caller's promise.
                    unsafe {
                        let y = $mul($sub(x, self.m), self.scale);
                        self.acc = $add(self.acc, term_of(y));
                    }
                }

                /// Whether a lane of `x` is more than [`REBASE_ABOVE`] above the reference,
                /// scaled as the terms are (the loops pass their maxima so far: when none is,
                /// no logit read so far is).
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn too_far(&self, x: $vec) -> bool {
                    // SAFETY: the caller's promise.
                    unsafe {
                        let ($ya, $limit) = (
                            $mul($sub(x, self.m), self.scale),
                            $set1(REBASE_ABOVE),
                        );
                        $above
                    }
                }

                /// Moves the reference to the maximum of `x` (above the current one) and the
                /// sum so far with it. Inlined, without a call, so that the loop keeps its
                /// vectors in registers.
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn rebase(&mut self, x: $vec) {
                    // SAFETY: the caller's promise.
                    unsafe {
                        let $xm = x;
                        let to: f32 = $max_of;
                        let factor = $set1(rebase_factor(self.reference, to, self.inverse));
                        self.acc = $mul(self.acc, factor);
                        self.reference = to;
                        self.m = $set1(to);
                    }
                }

                /// The sum and its reference.
                ///
                /// # Safety
                #[doc = concat!("The CPU must support ", $features, ".")]
                #[inline(always)]
                pub(crate) unsafe fn finish(&self) -> Partial {
                    // SAFETY: the caller's promise.
                    unsafe {
                        let $acc = self.acc;
                        Partial {
                            sum: $reduce,
                            reference: self.reference,
                            inverse: self.inverse,
                        }
                    }
                }
            }
        }
    };
}

normaliser_lanes!(
    /// The AVX2 normaliser: eight lanes.
    mod avx2: __m256 x 8, "avx2,fma,popcnt,bmi1,bmi2,lzcnt";
        _mm256_mul_ps, _mm256_sub_ps, _mm256_max_ps, _mm256_set1_ps, _mm256_fmadd_ps,
        _mm256_setzero_ps, _mm256_add_ps;
    fraction |y| _mm256_sub_ps(y, _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(y));
    scale |p, y| {
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(y);
        let n = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n));
        _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), n))
    };
    above |y, limit| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(y, limit)) != 0;
    max_of |x| {
        // Inside `rebase`'s unsafe block: `lanes` holds 8 f32.
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), x);
        lanes.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    };
    // Inside `finish`'s unsafe block: `lanes` holds 8 f32.
    reduce |acc| {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes.iter().sum::<f32>()
    }
);

normaliser_lanes!(
    /// The AVX-512 normaliser: sixteen lanes.
    mod avx512: __m512 x 16, "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt";
        _mm512_mul_ps, _mm512_sub_ps, _mm512_max_ps, _mm512_set1_ps, _mm512_fmadd_ps,
        _mm512_setzero_ps, _mm512_add_ps;
    // `y − ⌊y⌋`, exact.
    fraction |y| _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(y);
    // `p · 2^⌊y⌋`, exact (normal).
    scale |p, y| _mm512_scalef_ps(p, y);
    above |y, limit| _mm512_cmp_ps_mask::<_CMP_GT_OQ>(y, limit) != 0;
    // `max(x, −inf)` is −inf in a NaN lane.
    max_of |x| _mm512_reduce_max_ps(_mm512_max_ps(x, _mm512_set1_ps(f32::NEG_INFINITY)));
    reduce |acc| _mm512_reduce_add_ps(acc)
);

#[cfg(test)]
pub(crate) mod tests {
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

    /// Scaled logits `y` that cover the terms' range (from below the floor to [`REBASE_ABOVE`])
    /// with NaN and ±0, `lanes` at a time.
    fn term_inputs(lanes: usize) -> Vec<f32> {
        let mut ys: Vec<f32> = (0..60_000).map(|i| 23.0 - i as f32 * 0.002_47).collect();
        ys.extend([
            23.0,
            0.0,
            -0.0,
            0.5,
            -0.5,
            -124.5,
            -125.0,
            -125.5,
            f32::NAN,
            f32::NEG_INFINITY,
            -1e30,
        ]);
        ys.resize(ys.len().div_ceil(lanes) * lanes, -1.0);
        ys
    }

    /// The normaliser's term is `2^y` within the bound its doc comment proves (polynomial
    /// 2.9e-6, no reduction error, roundings 2.4e-7: 3.2e-6 relative) from its floor up to
    /// [`REBASE_ABOVE`], `2^-125` below the floor (−inf and NaN included), and exactly 1 at 0.
    #[test]
    fn the_normaliser_term_is_exp2_within_its_bound() {
        let mut worst = 0f64;
        for y in term_inputs(1) {
            let term = f64::from(term_of(y));
            let floored = if y >= TERM_FLOOR { y } else { TERM_FLOOR };
            let want = f64::from(floored).exp2();
            worst = worst.max((term / want - 1.0).abs());
        }
        assert!(worst <= 3.2e-6, "worst relative error {worst:e}");
        assert_eq!(term_of(0.0), 1.0);
        assert_eq!(term_of(-0.0), 1.0);
        assert_eq!(term_of(TERM_FLOOR), 2f32.powi(-125));
        for y in [f32::NAN, f32::NEG_INFINITY, -1e30, -126.0] {
            assert_eq!(term_of(y), term_of(TERM_FLOOR), "{y}");
        }
        assert_eq!(normaliser_term(2.5, 2.5, 1.25), 1.0);
    }

    /// The vector terms (`avx2::term_of`, `avx512::term_of`) are the scalar term's bits.
    fn assert_terms_equal(lanes: usize, terms: impl Fn(&[f32], &mut [f32])) {
        let ys = term_inputs(lanes);
        let mut out = vec![0f32; lanes];
        for v in ys.chunks_exact(lanes) {
            terms(v, &mut out);
            for (&y, &term) in v.iter().zip(&out) {
                assert_eq!(term.to_bits(), term_of(y).to_bits(), "y {y}");
            }
        }
    }

    /// `e^((from − to) · inverse)`, 0 from −inf or to +inf, and a sum moved to the row's maximum
    /// only where both are finite.
    #[test]
    fn rebase_factors_and_the_move_to_the_maximum() {
        assert_eq!(rebase_factor(1.0, 1.0, 2.0), 1.0);
        assert_eq!(rebase_factor(f32::NEG_INFINITY, 3.0, 2.0), 0.0);
        assert_eq!(rebase_factor(3.0, f32::INFINITY, 2.0), 0.0);
        assert_eq!(rebase_factor(f32::NEG_INFINITY, f32::INFINITY, 2.0), 0.0);
        let want = (-1.5f64 * 2.0).exp();
        assert!((f64::from(rebase_factor(1.0, 2.5, 2.0)) / want - 1.0).abs() < 1e-6);
        let partial = |reference| Partial {
            sum: 2.0,
            reference,
            inverse: 2.0,
        };
        assert_eq!(partial(1.0).at_max(1.0), Some(2.0));
        let moved = partial(1.0).at_max(2.5).expect("finite");
        assert!((f64::from(moved) / (2.0 * want) - 1.0).abs() < 1e-6);
        assert_eq!(partial(1.0).at_max(f32::INFINITY), None);
        assert_eq!(partial(f32::INFINITY).at_max(f32::INFINITY), None);
        assert_eq!(partial(f32::NEG_INFINITY).at_max(f32::NEG_INFINITY), None);
        assert_eq!(partial(f32::NEG_INFINITY).at_max(1.0), None);
        assert_eq!(partial(3.0).at_max(1.0), None);
    }

    /// The one pass applies to finite temperatures above 0 whose reciprocal is a normal f32.
    #[test]
    fn the_one_pass_applies_to_finite_positive_temperatures() {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            assert_eq!(one_pass_inverse(0.8), Some(1.25));
            assert_eq!(one_pass_inverse(1e-30), Some(1e30));
        }
        for t in [
            0.0f32,
            -0.0,
            -1.0,
            f32::INFINITY,
            f32::NAN,
            1e-40,
            f32::MAX * 1.0,
        ] {
            let inverse = 1.0 / t;
            if t > 0.0 && t.is_finite() && inverse.is_normal() {
                continue;
            }
            assert_eq!(one_pass_inverse(t), None, "{t}");
        }
        assert_eq!(one_pass_inverse(3e38), None);
    }

    /// Hostile rows for the one-pass normaliser, each with the temperatures it is summed at:
    /// Gaussian logits; a rising ramp (a rebase in every vector); the maximum in the first
    /// vector, then in the last; NaN and ±inf-free rows with −inf and NaN among them; a row of
    /// −inf but one logit at its end; large logits at a small temperature; constant rows; and
    /// every length around the vector widths.
    pub(crate) fn hostile_rows() -> Vec<(String, Vec<f32>)> {
        let mut lcg = crate::sampling::lcg::Lcg(77);
        let mut rows = Vec::new();
        let gaussian = |lcg: &mut crate::sampling::lcg::Lcg, n: usize, sigma: f32| -> Vec<f32> {
            (0..n)
                .map(|_| sigma * (lcg.unit() + lcg.unit() + lcg.unit() - 1.5) * 2.0)
                .collect()
        };
        rows.push(("gaussian".to_owned(), gaussian(&mut lcg, 40_000, 3.5)));
        rows.push((
            "ramp".to_owned(),
            (0..20_000).map(|i| i as f32 * 0.37 - 3000.0).collect(),
        ));
        let mut first = gaussian(&mut lcg, 9_000, 1.0);
        first[3] = 30.0;
        rows.push(("max first".to_owned(), first));
        let mut last = gaussian(&mut lcg, 9_001, 1.0);
        last[9_000] = 30.0;
        rows.push(("max last".to_owned(), last));
        let holes: Vec<f32> = gaussian(&mut lcg, 5_000, 2.0)
            .into_iter()
            .enumerate()
            .map(|(i, x)| match i % 13 {
                2 => f32::NAN,
                5 => f32::NEG_INFINITY,
                _ => x,
            })
            .collect();
        rows.push(("NaN and -inf".to_owned(), holes));
        let mut masked = vec![f32::NEG_INFINITY; 3_000];
        masked[2_999] = -7.0;
        masked[17] = f32::NAN;
        rows.push(("masked".to_owned(), masked));
        let big: Vec<f32> = gaussian(&mut lcg, 5_000, 1.0)
            .iter()
            .map(|x| 1e4 + x)
            .collect();
        rows.push(("large".to_owned(), big));
        rows.push(("constant".to_owned(), vec![-2.25; 1_000]));
        for len in [
            1usize, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 4099,
        ] {
            rows.push((format!("len {len}"), gaussian(&mut lcg, len, 3.0)));
        }
        rows
    }

    /// `Σ e^((x − max)/t)` in f64 (NaN counts as −inf) and the row's maximum.
    pub(crate) fn f64_normaliser(row: &[f32], t: f32) -> (f32, f64) {
        let max = row
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        let sum = row
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| ((f64::from(x) - f64::from(max)) / f64::from(t)).exp())
            .sum();
        (max, sum)
    }

    /// The temperatures the hostile rows are summed at.
    pub(crate) const HOSTILE_TEMPERATURES: [f32; 6] = [1.0, 0.8, 0.05, 3.0, 100.0, 0.001];

    /// `sum(row, inverse)` (a vector normaliser fed the row's vectors in the order `order`
    /// gives) is the f64 normaliser within 2e-5 on every hostile row, moved to the row's maximum.
    fn assert_one_pass_sums(lanes: usize, sum: impl Fn(&[f32], f32, &[usize]) -> Partial) {
        for (name, row) in hostile_rows() {
            let padded = {
                let mut p = row.clone();
                p.resize(row.len().div_ceil(lanes) * lanes, f32::NAN);
                p
            };
            let vectors = padded.len() / lanes;
            let in_order: Vec<usize> = (0..vectors).collect();
            let mut shuffled = in_order.clone();
            shuffled.reverse();
            shuffled.rotate_left(vectors / 3);
            for t in HOSTILE_TEMPERATURES {
                let (max, want) = f64_normaliser(&row, t);
                for order in [&in_order, &shuffled] {
                    let got = sum(&padded, 1.0 / t, order).at_max(max);
                    let got = got.unwrap_or_else(|| panic!("{name}, t {t}: no sum"));
                    let error = (f64::from(got) / want - 1.0).abs();
                    assert!(error <= 2e-5, "{name}, t {t}: {got} vs {want} ({error:e})");
                }
            }
        }
    }

    /// Defines the test `$name`, run where `$has` holds (a reported skip elsewhere): the vector
    /// terms of `$module` (`$lanes` lanes, loaded and stored by `$load`, `$store`) are the
    /// scalar ones, bit for bit, and its one-pass normaliser is the f64 sum on hostile rows.
    macro_rules! vector_normaliser_test {
        ($(#[$doc:meta])* fn $name:ident() if $has:ident ($isa:literal):
            $module:ident [$load:ident, $store:ident], $lanes:literal lanes) => {
            $(#[$doc])*
            #[cfg(target_arch = "x86_64")]
            #[test]
            fn $name() {
                use std::arch::x86_64::{$load, $store};
                if !$has() {
                    eprintln!(concat!("skipped: no ", $isa, " on this CPU"));
                    return;
                }
                // SAFETY: the CPU supports the width's features; `v` and `out` hold `$lanes` f32.
                assert_terms_equal($lanes, |v, out| unsafe {
                    $store(out.as_mut_ptr(), $module::term_of($load(v.as_ptr())));
                });
                // SAFETY: as above; every vector read is `$lanes` f32 inside `row`.
                assert_one_pass_sums($lanes, |row, inverse, order| unsafe {
                    let mut sum = $module::Normaliser::new(inverse);
                    for &v in order {
                        sum.add($load(row.as_ptr().add(v * $lanes)));
                    }
                    sum.finish()
                });
            }
        };
    }

    vector_normaliser_test!(
        /// The AVX2 terms are the scalar ones, bit for bit; the AVX2 one-pass normaliser is the
        /// f64 sum within 2e-5 on hostile rows, in order and out of order.
        fn the_avx2_normaliser_matches_the_scalar_terms_and_an_f64_sum() if has_avx2 ("AVX2"):
            avx2 [_mm256_loadu_ps, _mm256_storeu_ps], 8 lanes
    );

    vector_normaliser_test!(
        /// The AVX-512 terms are the scalar ones, bit for bit; the AVX-512 one-pass normaliser is
        /// the f64 sum within 2e-5 on hostile rows, in order and out of order.
        fn the_avx512_normaliser_matches_the_scalar_terms_and_an_f64_sum() if has_avx512 ("AVX-512"):
            avx512 [_mm512_loadu_ps, _mm512_storeu_ps], 16 lanes
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
