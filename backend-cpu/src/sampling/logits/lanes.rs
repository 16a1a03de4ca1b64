//! The weights of f32 logits rows (`docs/semantics.md` §4b) in vector lanes: the exact integer
//! weights, and tight f64 estimates of them with a proven error bound.
//!
//! - **Exact** ([`exact_weights`]): the integer steps of
//!   `logit_weights::scaled_weight`, eight 64-bit lanes per AVX-512 vector (four per AVX2
//!   vector). The gap is one 32 × 32-bit multiply of the gap's significand by `C32` and one
//!   variable shift; each Horner step of the polynomial is one 52-bit multiply-add where the CPU
//!   has AVX-512 IFMA (`vpmadd52huq` of `P · 2^20` and `G · 2^8` gives `⌊P · G / 2^24⌋` added to
//!   the coefficient), else a 32 × 32-bit multiply, a shift and an add; the final shift is
//!   `(P << 9) >> n`. The same integers as the contract's steps (the tests compare every variant
//!   with `scaled_weight` on hostile values).
//! - **Estimates** ([`estimate_block_sums`], [`estimate_store`]): the same function in f32 without
//!   the floors, sixteen lanes per AVX-512 vector: `g = ⌈x⌉ − D · c` in two FMAs (`c` in two f32
//!   parts, so that it keeps its accuracy), the contract's polynomial at `g` with the
//!   coefficients scaled by `2^40 · 2^(2^-25)` (the middle of the contract's floored gap), and
//!   the scale `2^-⌈x⌉`; block sums add four estimates in f32 before widening to f64. The exact
//!   weight differs from the estimate `ŵ` by at most `ŵ · ESTIMATE_RELATIVE + ESTIMATE_ABSOLUTE`
//!   (see their docs, which prove it); every variant stores the scalar steps' bits.
//!
//! The vector kernels need a row whose scale is finite (`0 < T < +inf`), `e ≤ 62` (so that a gap of
//! 0 shifts out entirely, `T` above about `2^-94`) and a gap `D` from which on every weight is 0
//! within the f32 range ([`RowLanes::new`]); other rows are weighed by the scalar steps.

use specula_backend_api::logit_weights::{EXP2_COEFFICIENTS, GAP_LIMIT, RowScale, gap};

use crate::sampling::scan::compiled_for;
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// 2^-76 (bits), below which a finite logit counts as +0.
const TINY_BITS: u32 = 0x1980_0000;
/// 2^64 (bits), the largest magnitude a finite logit keeps.
const HUGE_BITS: u32 = 0x5f80_0000;

/// Tokens per block of [`estimate_block_sums`].
pub(crate) const SUM_BLOCK: usize = 256;

/// The relative part of the bound on `|w − ŵ|` of an estimate `ŵ` ([`estimate_block_sums`],
/// [`estimate_store`]), summed over any set of tokens: `2^-21`. The sources (`u = 2^-24`, the
/// f32 unit roundoff), each a proven bound:
/// - the gap: the estimate takes the middle of the contract's floored gap (the exact one lies
///   within `2^-25` of it; the `2^-25` is folded into the coefficients as the factor `2^(2^-25)`,
///   exact but for `2^-45`), and `g = ⌈x⌉ − D · c` is formed in two FMAs, `⌈x⌉ − D · c_hi` (its
///   magnitude at most 1, so rounded by at most `2^-25`) and `− D · c_lo` (rounded by at most
///   `2^-24`, `2^-25` unless `g` passes 1); `c_hi + c_lo` is within `2^-48` of `c`. That is
///   `2^-23` of gap, and the weight's logarithm moves by at most `0.6935` per unit of gap
///   (`max p'/p` of the polynomial): `2^-23.53`;
/// - the contract's six floors in the Horner steps: at most `6 / 2^30` relative (`2^-27.4`);
/// - the polynomial in f32: its coefficients rounded to f32 (`u` of terms that sum to `p`: `u`)
///   and six FMAs, each rounding by `u` a partial value that reaches `p` multiplied by at most
///   `1, 0.5, 0.153, 0.033, 0.006, 0.001` (`g ≤ 1`, positive terms): `2.69 u` (`2^-22.57`); the
///   scale `2^-⌈x⌉` is exact;
/// - the block sums: four estimates added in f32 in a tree of depth 2 (positive terms: `2u`,
///   `2^-23`), then in f64 (`2^-40`).
///
/// About `3.7 · 10^-7` (`2^-21.4`) in all for the block sums, `2^-22` for one stored estimate;
/// the bound, `4.77 · 10^-7`, is above both (the tests check it on hostile values).
pub(crate) const ESTIMATE_RELATIVE: f64 = 1.0 / 2_097_152.0;
/// The relative part of the bound on `|w − ŵ|` for sums of **stored** estimates
/// ([`estimate_store`], widened to f64 exactly and added in f64): the terms of
/// [`ESTIMATE_RELATIVE`] but the block sums' f32 tree — the gap `2^-23.53`, the floors
/// `2^-27.4`, the polynomial `2^-22.57`, `2.49 · 10^-7` in all (`2^-21.94`), and f64 sums of up
/// to `2^32` terms in lanes of at most `2^20` adds each (`2^-33`). The bound, `2.6 · 10^-7`, is
/// above them (the tests check it on hostile values); about half of [`ESTIMATE_RELATIVE`], which
/// halves how often the top-p path's bounds leave a decision to the exact pass.
pub(crate) const STORED_RELATIVE: f64 = 2.6e-7;
/// The absolute part of the bound per token: the contract's final shift floors the weight (less
/// than 1), and a gap at or past the limit weighs 0 exactly where the estimate is at most 1.
pub(crate) const ESTIMATE_ABSOLUTE: f64 = 1.0;

/// A row's constants for the vector kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowLanes {
    /// The sanitized row maximum (finite).
    pub max: f32,
    /// `C32`, the significand of the row's scale `c = C32 · 2^e`.
    pub c32: u64,
    /// The exponent of the scale.
    pub e: i32,
    /// The least f32 gap `D` whose weight is 0: gaps are clamped to it, so that every
    /// shift stays in range.
    pub dcap: f32,
    /// Whether no logit of the row needs sanitizing (no NaN, infinity, magnitude above `2^64`
    /// or nonzero magnitude below `2^-76`): the kernels then skip it.
    pub clean: bool,
    /// The scale `c = C32 · 2^e` (exact in f64).
    c: f64,
    /// The scale in two f32 parts, `c ≈ c_hi + c_lo` (within `2^-48` of it).
    c_hi: f32,
    c_lo: f32,
    /// `−c_hi`.
    neg_c_hi: f32,
}

impl RowLanes {
    /// The constants of a row of sanitized maximum `max` at `scale`; `None` when the vector
    /// kernels do not apply (see the module doc). `clean` as [`RowLanes::clean`].
    pub(crate) fn new(max: f32, scale: RowScale, clean: bool) -> Option<Self> {
        let RowScale::Scaled { c32, e } = scale else {
            return None;
        };
        if !max.is_finite() || e > 62 {
            return None;
        }
        let dcap = gap_cap(c32, e)?;
        let c = c32 as f64 * f64::powi(2.0, e);
        let c_hi = c as f32;
        if !c_hi.is_normal() {
            return None; // a scale outside the f32 range: the scalar steps weigh the row
        }
        // The vector kernels shift right by `126 − e − E` (E the biased exponent of a gap at
        // most `dcap`): never negative.
        debug_assert!(126 - e - (dcap.to_bits() >> 23) as i32 >= 0);
        Some(RowLanes {
            max,
            c32,
            e,
            dcap,
            clean,
            c,
            c_hi,
            c_lo: (c - f64::from(c_hi)) as f32,
            neg_c_hi: -c_hi,
        })
    }

    /// The scale `c = C32 · 2^e` (exact in f64).
    pub(crate) fn scale(&self) -> f64 {
        self.c
    }

    /// The gap `D = max ⊖ s` of a logit (sanitized as the contract says), clamped to `dcap`.
    #[inline(always)]
    fn gap_of(&self, l: f32) -> f32 {
        let s = if self.clean { l } else { sanitize_select(l) };
        let d = self.max - s;
        // NaN cannot occur (s ≤ max, both sanitized); −inf gives +inf, clamped.
        if d < self.dcap { d } else { self.dcap }
    }
}

/// `sanitize_logit` with selects (the value the weights read; the rank order reads the logit
/// itself): NaN → −inf, `|l| < 2^-76` → +0, finite `|l| > 2^64` → ±2^64.
#[inline(always)]
fn sanitize_select(l: f32) -> f32 {
    let (tiny, huge) = (f32::from_bits(TINY_BITS), f32::from_bits(HUGE_BITS));
    let a = l.abs();
    let y = if l.is_nan() { f32::NEG_INFINITY } else { l };
    let y = if a < tiny { 0.0 } else { y };
    if a > huge && a < f32::INFINITY {
        f32::from_bits(HUGE_BITS | (l.to_bits() & 0x8000_0000))
    } else {
        y
    }
}

/// The least f32 `D ≥ 0` whose gap reaches the limit (`X ≥ 40 · 2^F`), or `None` when no
/// finite f32 does.
fn gap_cap(c32: u64, e: i32) -> Option<f32> {
    let c = c32 as f64 * f64::powi(2.0, e);
    let guess = 40.0 / c;
    if guess.is_nan() || guess >= f64::from(f32::MAX) / 2.0 {
        return None;
    }
    let reaches = |d: f32| gap(d, 0.0, c32, e) >= GAP_LIMIT;
    let mut d = (guess as f32).max(f32::MIN_POSITIVE);
    while !reaches(d) {
        d = d.next_up();
        if !d.is_finite() {
            return None;
        }
    }
    while d > f32::MIN_POSITIVE && reaches(d.next_down()) {
        d = d.next_down();
    }
    Some(d)
}

/// The exact weight of a gap `d` (as [`RowLanes::gap_of`] makes it), branch-free: the scalar form
/// of the vector kernels.
#[inline(always)]
fn exact_of_gap(d: f32, lanes: &RowLanes) -> u64 {
    let bits = u64::from(d.to_bits());
    let m_d = (bits & 0x7f_ffff) | 0x80_0000;
    // D = M_D · 2^(E − 150); X = ⌊M_D · C32 · 2^(E − 150 + e + F)⌋ = (M_D · C32) >> (126 − e − E).
    // E is 0 only for D = 0, where the shift is ≥ 64 (e ≤ 62) and X is 0; a gap clamped to
    // `dcap` keeps the shift positive (`RowLanes::new`).
    let shift = i64::from(126 - lanes.e) - (bits >> 23) as i64;
    let product = m_d * lanes.c32;
    let x = match shift {
        s if s >= 64 => 0,
        s if s >= 0 => product >> s,
        _ => GAP_LIMIT,
    };
    weight_of_gap_steps(x)
}

/// Step 5 of the contract for a gap `x` (0 from `GAP_LIMIT` on), branch-free.
#[inline(always)]
fn weight_of_gap_steps(x: u64) -> u64 {
    let n = x >> 24;
    let g = ((!x) & 0xff_ffff) + 1;
    let mut p = EXP2_COEFFICIENTS[6];
    for k in (0..6).rev() {
        p = EXP2_COEFFICIENTS[k] + ((p * g) >> 24);
    }
    let w = (p << 9) >> n.min(63);
    if x < GAP_LIMIT { w } else { 0 }
}

/// The exact weights of `chunk` (f32 logits of a row with constants `lanes`) into `out`.
pub(crate) fn exact_weights(chunk: &[f32], lanes: &RowLanes, out: &mut [u64]) {
    let out = &mut out[..chunk.len()];
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F/BW/VL/DQ are present (and IFMA where asked).
        unsafe {
            if avx512::has_ifma() {
                avx512::exact_weights_ifma(chunk, lanes, out);
            } else {
                avx512::exact_weights(chunk, lanes, out);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 is present.
        unsafe { avx2::exact_weights(chunk, lanes, out) };
        return;
    }
    for (w, &l) in out.iter_mut().zip(chunk) {
        *w = exact_of_gap(lanes.gap_of(l), lanes);
    }
}

/// The estimate `ŵ` of a gap `d`: the contract's polynomial in f32 without floors at
/// `g = ⌈x⌉ − D · c` (two FMAs), times `2^-⌈x⌉` (see [`ESTIMATE_RELATIVE`]). The same operations,
/// rounded the same way, as the vector loops: every variant gives these bits.
#[inline(always)]
fn estimate_of_gap(d: f32, lanes: &RowLanes) -> f32 {
    // −⌈x⌉ = ⌊−D · c_hi⌋, at least −42 (gaps are clamped).
    let down = (d * lanes.neg_c_hi).floor();
    let g = (-d).mul_add(lanes.c_hi, -down);
    let g = (-d).mul_add(lanes.c_lo, g);
    let mut p = ESTIMATE_COEFFICIENTS[6];
    for k in (0..6).rev() {
        p = p.mul_add(g, ESTIMATE_COEFFICIENTS[k]);
    }
    // 2^-⌈x⌉ from the exponent bits `down + 127` (a normal f32), which the exact sum
    // `down + SCALE_ROUNDER` holds in its low bits (no float-to-int conversion: it vectorises).
    p * f32::from_bits((down + SCALE_ROUNDER).to_bits() << 23)
}

/// `1.5 · 2^23 + 127`: added to an integer `n ∈ [−126, 127]` (exactly), it leaves `n + 127`, the
/// biased exponent of `2^n`, in the low bits of the sum.
const SCALE_ROUNDER: f32 = 12_583_039.0;

/// `2^(2^-25)`: the contract floors the gap to a multiple of `2^-24`, so the exact gap lies in
/// `(x − 2^-24, x]` for the real `x = D · c`; the estimates take its middle, `x − 2^-25`, whose
/// weight is that of `x` times this factor.
const HALF_UNIT_FACTOR: f64 = {
    let t = std::f64::consts::LN_2 / (1u64 << 25) as f64;
    1.0 + t + t * t / 2.0
};

/// The contract's coefficients as f32 values of `A_k / 2^30 · 2^40 · 2^(2^-25)`: the estimate's
/// polynomial in weight units, at the middle of the floored gap.
const ESTIMATE_COEFFICIENTS: [f32; 7] = {
    let mut c = [0.0; 7];
    let mut k = 0;
    while k < 7 {
        c[k] = (EXP2_COEFFICIENTS[k] as f64 * (1u64 << 10) as f64 * HALF_UNIT_FACTOR) as f32;
        k += 1;
    }
    c
};

/// The estimated weight of each block of [`SUM_BLOCK`] tokens of `row` into `sums` (f64 sums of
/// the f32 estimates), and the estimated total (each within [`ESTIMATE_RELATIVE`] and
/// [`ESTIMATE_ABSOLUTE`] per token of the exact sums).
pub(crate) fn estimate_block_sums(row: &[f32], lanes: &RowLanes, sums: &mut [f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F/BW/VL/DQ are present.
        return unsafe { avx512::estimate_block_sums(row, lanes, sums) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { avx2::estimate_block_sums(row, lanes, sums) };
    }
    estimate_sums_generic(row, lanes, sums)
}

/// The estimate of every token of `row` into `out` (each within [`ESTIMATE_RELATIVE`] and
/// [`ESTIMATE_ABSOLUTE`] of the exact weight) and a rough total (f32 sums in lanes: a guide, not
/// a bound; the exact sums of the stored values are the caller's).
pub(crate) fn estimate_store(row: &[f32], lanes: &RowLanes, out: &mut [f32]) -> f64 {
    estimate_store_levels(row, lanes, out, &[]).0
}

/// [`estimate_store`], and for each logit level of `levels` the rough sum of the estimates of
/// the tokens whose logit is at least it (an ordered compare: NaN is never at a level; f32 sums
/// in lanes, a guide like the total: the band they place is checked after the fact).
pub(crate) fn estimate_store_levels<const L: usize>(
    row: &[f32],
    lanes: &RowLanes,
    out: &mut [f32],
    levels: &[f32; L],
) -> (f64, [f64; L]) {
    let out = &mut out[..row.len()];
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F/BW/VL/DQ are present.
        return unsafe { avx512::estimate_store(row, lanes, out, levels) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present; `out` is as long as `row`.
        return unsafe { avx2::estimate_store(row, lanes, out, levels) };
    }
    estimate_store_generic(row, lanes, out, levels)
}

/// The block-sums loop of the vector widths: `block_sum` estimates one whole block of
/// [`SUM_BLOCK`] tokens; a last, partial block is summed token by token. Returns the total.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_sums_with(
    row: &[f32],
    lanes: &RowLanes,
    sums: &mut [f64],
    mut block_sum: impl FnMut(&[f32]) -> f64,
) -> f64 {
    let mut total = 0.0;
    let mut blocks = row.chunks_exact(SUM_BLOCK);
    for (block, sum) in (&mut blocks).zip(sums.iter_mut()) {
        *sum = block_sum(block);
        total += *sum;
    }
    let tail = blocks.remainder();
    if let (false, Some(sum)) = (tail.is_empty(), sums.get_mut(row.len() / SUM_BLOCK)) {
        *sum = tail
            .iter()
            .map(|&l| f64::from(estimate_of_gap(lanes.gap_of(l), lanes)))
            .sum();
        total += *sum;
    }
    total
}

/// The store loop of every width: `step` estimates (and stores, and accumulates) one vector of
/// `N` tokens into its slots of `out`; the tokens past the last whole vector are estimated one
/// by one. Returns the sums of those last ones: the total and the masses at `levels`.
#[inline(always)]
fn store_with<const N: usize, const L: usize>(
    row: &[f32],
    lanes: &RowLanes,
    out: &mut [f32],
    levels: &[f32; L],
    mut step: impl FnMut(&[f32], &mut [f32]),
) -> (f64, [f64; L]) {
    let mut vectors = row.chunks_exact(N);
    let mut outs = out.chunks_exact_mut(N);
    for (v, o) in (&mut vectors).zip(&mut outs) {
        step(v, o);
    }
    let (mut total, mut above) = (0.0, [0.0; L]);
    for (&l, o) in vectors.remainder().iter().zip(outs.into_remainder()) {
        let w = estimate_of_gap(lanes.gap_of(l), lanes);
        *o = w;
        total += f64::from(w);
        for (above, &level) in above.iter_mut().zip(levels) {
            if l >= level {
                *above += f64::from(w);
            }
        }
    }
    (total, above)
}

/// Lanes of the generic estimate loops.
const EST_LANES: usize = 8;

#[inline(always)]
fn estimate_sums_generic(row: &[f32], lanes: &RowLanes, sums: &mut [f64]) -> f64 {
    let estimate = |l: f32| estimate_of_gap(lanes.gap_of(l), lanes);
    let mut total = 0.0;
    for (block, sum) in row.chunks(SUM_BLOCK).zip(sums.iter_mut()) {
        let mut acc = [0.0f64; EST_LANES];
        let mut groups = block.chunks_exact(4 * EST_LANES);
        for group in &mut groups {
            // Four estimates per lane added in f32, `(w0 + w1) + (w2 + w3)`, as the AVX-512 loop.
            let (a, b) = group.split_at(2 * EST_LANES);
            let (a0, a1) = a.split_at(EST_LANES);
            let (b0, b1) = b.split_at(EST_LANES);
            for (j, acc) in acc.iter_mut().enumerate() {
                let pair_a = estimate(a0[j]) + estimate(a1[j]);
                let pair_b = estimate(b0[j]) + estimate(b1[j]);
                *acc += f64::from(pair_a + pair_b);
            }
        }
        let rest: f64 = groups
            .remainder()
            .iter()
            .map(|&l| f64::from(estimate(l)))
            .sum();
        *sum = acc.iter().sum::<f64>() + rest;
        total += *sum;
    }
    total
}

#[inline(always)]
fn estimate_store_generic<const L: usize>(
    row: &[f32],
    lanes: &RowLanes,
    out: &mut [f32],
    levels: &[f32; L],
) -> (f64, [f64; L]) {
    let mut acc = [0.0f32; EST_LANES];
    let mut at = [[0.0f32; EST_LANES]; L];
    let (rest, mut above) = store_with::<EST_LANES, L>(row, lanes, out, levels, |group, o| {
        for (j, (&l, o)) in group.iter().zip(o.iter_mut()).enumerate() {
            let w = estimate_of_gap(lanes.gap_of(l), lanes);
            *o = w;
            acc[j] += w;
            for (at, &level) in at.iter_mut().zip(levels) {
                at[j] += if l >= level { w } else { 0.0 };
            }
        }
    });
    for (above, at) in above.iter_mut().zip(&at) {
        *above += at.iter().map(|&a| f64::from(a)).sum::<f64>();
    }
    (acc.iter().map(|&a| f64::from(a)).sum::<f64>() + rest, above)
}

/// The maximum of an f32 row (NaN ignored; −inf for a row of NaN and −inf) and whether the row
/// is clean ([`RowLanes::clean`]), in one vectorised pass.
pub(crate) fn max_and_clean(row: &[f32]) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports the features the variant is compiled for.
            return unsafe { max_and_clean_avx512(row) };
        }
        if has_avx2() {
            // SAFETY: as above.
            return unsafe { max_and_clean_avx2(row) };
        }
    }
    max_and_clean_generic(row)
}

compiled_for!(avx512, fn max_and_clean_avx512 []
    (row: &[f32]) -> (f32, bool) = max_and_clean_generic []);
compiled_for!(avx2, fn max_and_clean_avx2 []
    (row: &[f32]) -> (f32, bool) = max_and_clean_generic []);

/// Lanes of the maximum pass.
const MAX_LANES: usize = 16;

/// Parts of a row the maximum pass reads side by side, a vector of each in turn: four memory
/// streams in flight instead of one. On the 2-core CI kind one thread reads a row of 151936 f32
/// from memory at about 10 GB/s as one stream and 18 GB/s as four (`docs/performance.md`, "Top-p
/// from logits at batch 64"); the pass is the only one that reads the row from memory.
const MAX_STREAMS: usize = 4;

/// The maximum pass's per-lane state: the maximum (NaN ignored), the largest magnitude (as
/// bits: NaN and infinities above every finite value) and the least nonzero magnitude (bits − 1,
/// so that a zero wraps to the top).
struct MaxLanes {
    max: [f32; MAX_LANES],
    high: [u32; MAX_LANES],
    low: [u32; MAX_LANES],
}

impl MaxLanes {
    #[inline(always)]
    fn new() -> Self {
        MaxLanes {
            max: [f32::NEG_INFINITY; MAX_LANES],
            high: [0; MAX_LANES],
            low: [u32::MAX; MAX_LANES],
        }
    }

    /// Folds `MAX_LANES` values in, one per lane.
    #[inline(always)]
    fn fold(&mut self, chunk: &[f32]) {
        for (lane, &x) in chunk.iter().enumerate().take(MAX_LANES) {
            self.max[lane] = if x > self.max[lane] {
                x
            } else {
                self.max[lane]
            };
            let a = x.to_bits() & 0x7fff_ffff;
            self.high[lane] = self.high[lane].max(a);
            self.low[lane] = self.low[lane].min(a.wrapping_sub(1));
        }
    }
}

/// The maximum and cleanliness of `row`: its first `MAX_STREAMS` equal parts (whole vectors)
/// read side by side, then the rest. A maximum does not depend on the order its values are met
/// in, but for the sign of a zero maximum, which `sanitize_logit` erases (−0 and +0 both become
/// +0) before any weight reads it.
#[inline(always)]
fn max_and_clean_generic(row: &[f32]) -> (f32, bool) {
    let mut lanes = MaxLanes::new();
    let part = row.len() / (MAX_STREAMS * MAX_LANES) * MAX_LANES;
    let (streams, rest) = row.split_at(part * MAX_STREAMS);
    if part > 0 {
        // The four parts (`MAX_STREAMS`), a vector of each per step.
        let (p0, p12) = streams.split_at(part);
        let (p1, p23) = p12.split_at(part);
        let (p2, p3) = p23.split_at(part);
        for (((a, b), c), d) in p0
            .chunks_exact(MAX_LANES)
            .zip(p1.chunks_exact(MAX_LANES))
            .zip(p2.chunks_exact(MAX_LANES))
            .zip(p3.chunks_exact(MAX_LANES))
        {
            lanes.fold(a);
            lanes.fold(b);
            lanes.fold(c);
            lanes.fold(d);
        }
    }
    let mut chunks = rest.chunks_exact(MAX_LANES);
    for chunk in &mut chunks {
        lanes.fold(chunk);
    }
    let (mut best, mut hi, mut lo) = (f32::NEG_INFINITY, 0u32, u32::MAX);
    for &x in chunks.remainder() {
        best = if x > best { x } else { best };
        let a = x.to_bits() & 0x7fff_ffff;
        hi = hi.max(a);
        lo = lo.min(a.wrapping_sub(1));
    }
    for lane in 0..MAX_LANES {
        best = if lanes.max[lane] > best {
            lanes.max[lane]
        } else {
            best
        };
        hi = hi.max(lanes.high[lane]);
        lo = lo.min(lanes.low[lane]);
    }
    (best, hi <= HUGE_BITS && lo >= TINY_BITS - 1)
}

/// The gaps `D` of a vector of logits, clamped to `dcap`, for one vector width: the logits
/// sanitized by `$sanitize` (`sanitize_logit`: NaN to −inf, finite magnitudes above `2^64` to
/// `±2^64`, nonzero magnitudes below `2^-76` to +0) unless the row is clean.
#[cfg(target_arch = "x86_64")]
macro_rules! gaps_fn {
    ($name:ident, $v:ty, $features:literal, $sanitize:ident, ($set1:ident, $sub:ident, $min:ident)) => {
        /// The gaps `D` of a vector of logits, sanitized unless the row is clean, clamped to
        /// `dcap`.
        #[inline]
        #[target_feature(enable = $features)]
        fn $name(l: $v, lanes: &RowLanes) -> $v {
            let s = if lanes.clean {
                l
            } else {
                let huge = $set1(f32::from_bits(super::HUGE_BITS));
                $sanitize(l, huge, $set1(f32::NEG_INFINITY))
            };
            $min($sub($set1(lanes.max), s), $set1(lanes.dcap))
        }
    };
}

/// The store loop with levels of one vector width (`$n` f32 lanes): each vector's estimates
/// stored and summed, and summed again per level where the logit is at it (`$add_at`), the
/// lanes reduced by `$reduce`; see [`estimate_store_levels`].
#[cfg(target_arch = "x86_64")]
macro_rules! store_levels {
    ($features:literal, $n:literal, ($zero:ident, $set1:ident, $add:ident),
     ($load:ident, $store:ident), ($estimate:ident, $add_at:ident, $reduce:ident)) => {
        /// See [`super::estimate_store_levels`].
        ///
        /// # Safety
        /// The CPU must have the features the function is compiled for; `out` is as long as
        /// `row`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn estimate_store<const L: usize>(
            row: &[f32],
            lanes: &RowLanes,
            out: &mut [f32],
            levels: &[f32; L],
        ) -> (f64, [f64; L]) {
            let mut acc = $zero();
            let at = levels.map(|level| $set1(level));
            let mut sums = [$zero(); L];
            let (rest, mut above) = store_with::<$n, L>(row, lanes, out, levels, |v, o| {
                // SAFETY: `v` and `o` hold `$n` f32.
                unsafe {
                    let l = $load(v.as_ptr());
                    let w = $estimate(l, lanes);
                    $store(o.as_mut_ptr(), w);
                    acc = $add(acc, w);
                    for (sum, &level) in sums.iter_mut().zip(&at) {
                        *sum = $add_at(*sum, l, level, w);
                    }
                }
            });
            for (above, &sum) in above.iter_mut().zip(&sums) {
                *above += $reduce(sum);
            }
            ($reduce(acc) + rest, above)
        }
    };
}

/// Hand-written AVX-512 loops (LLVM keeps generic loops in 256-bit registers on these CPUs).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{ESTIMATE_COEFFICIENTS, RowLanes, block_sums_with, exact_of_gap, store_with};
    use specula_backend_api::logit_weights::{EXP2_COEFFICIENTS, GAP_LIMIT};
    use std::arch::x86_64::*;

    /// Whether the CPU has AVX-512 IFMA (read once).
    pub(super) fn has_ifma() -> bool {
        static IFMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *IFMA.get_or_init(|| std::arch::is_x86_feature_detected!("avx512ifma"))
    }

    gaps_fn!(
        gaps16,
        __m512,
        "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt",
        sanitize16,
        (_mm512_set1_ps, _mm512_sub_ps, _mm512_min_ps)
    );

    /// `sanitize_logit` on 16 lanes (`huge` = `2^64` and `neg_inf` in every lane).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn sanitize16(l: __m512, huge: __m512, neg_inf: __m512) -> __m512 {
        // `max(l, −inf)` returns its second operand for a NaN `l`.
        let s = _mm512_max_ps(l, neg_inf);
        let s = _mm512_min_ps(s, huge);
        let finite_low = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(s, neg_inf);
        let s = _mm512_mask_max_ps(s, finite_low, s, _mm512_sub_ps(_mm512_setzero_ps(), huge));
        let magnitude = _mm512_and_si512(_mm512_castps_si512(l), _mm512_set1_epi32(0x7fff_ffff));
        let tiny = _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(super::TINY_BITS as i32));
        _mm512_maskz_mov_ps(!tiny, s)
    }

    /// The gap `X` (fixed point) of 8 gaps `D` (f32 bits widened to 64-bit lanes).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn gap8(d: __m256i, lanes: &RowLanes) -> __m512i {
        let bits = _mm512_cvtepu32_epi64(d);
        // (bits & 0x7fffff) | 0x800000
        let m_d = _mm512_ternarylogic_epi64::<0xEA>(
            bits,
            _mm512_set1_epi64(0x7f_ffff),
            _mm512_set1_epi64(0x80_0000),
        );
        let shift = _mm512_sub_epi64(
            _mm512_set1_epi64(i64::from(126 - lanes.e)),
            _mm512_srli_epi64::<23>(bits),
        );
        let product = _mm512_mul_epu32(m_d, _mm512_set1_epi64(lanes.c32 as i64));
        _mm512_srlv_epi64(product, shift)
    }

    /// The weight of 8 gaps `X` from the final Horner value `p`: `(P << 9) >> n`, 0 from the
    /// limit on.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn finish8(x: __m512i, p: __m512i) -> __m512i {
        let live = _mm512_cmplt_epu64_mask(x, _mm512_set1_epi64(GAP_LIMIT as i64));
        _mm512_maskz_srlv_epi64(live, _mm512_slli_epi64::<9>(p), _mm512_srli_epi64::<24>(x))
    }

    /// `G = 2^24 − (X mod 2^24)` of 8 gaps.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn g8(x: __m512i) -> __m512i {
        _mm512_add_epi64(
            _mm512_andnot_si512(x, _mm512_set1_epi64(0xff_ffff)),
            _mm512_set1_epi64(1),
        )
    }

    /// Exact weights of 8 gaps `D`, Horner steps as 32 × 32-bit multiplies.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn weigh8(d: __m256i, lanes: &RowLanes) -> __m512i {
        let x = gap8(d, lanes);
        let g = g8(x);
        let mut p = _mm512_set1_epi64(EXP2_COEFFICIENTS[6] as i64);
        for k in (0..6).rev() {
            let pg = _mm512_srli_epi64::<24>(_mm512_mul_epu32(p, g));
            p = _mm512_add_epi64(_mm512_set1_epi64(EXP2_COEFFICIENTS[k] as i64), pg);
        }
        finish8(x, p)
    }

    /// Exact weights of 8 gaps `D`, Horner steps as 52-bit multiply-adds: the high half of
    /// `(P · 2^20) · (G · 2^8)` is `⌊P · G / 2^24⌋` (both factors below `2^52`).
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512ifma,popcnt,bmi1,bmi2,lzcnt"
    )]
    fn weigh8_ifma(d: __m256i, lanes: &RowLanes) -> __m512i {
        let x = gap8(d, lanes);
        let g = _mm512_slli_epi64::<8>(g8(x));
        let mut p = _mm512_set1_epi64((EXP2_COEFFICIENTS[6] << 20) as i64);
        for k in (1..6).rev() {
            let a = _mm512_set1_epi64(EXP2_COEFFICIENTS[k] as i64);
            p = _mm512_slli_epi64::<20>(_mm512_madd52hi_epu64(a, p, g));
        }
        let a = _mm512_set1_epi64(EXP2_COEFFICIENTS[0] as i64);
        finish8(x, _mm512_madd52hi_epu64(a, p, g))
    }

    macro_rules! exact_loop {
        ($name:ident, $weigh:ident, $features:literal) => {
            /// Exact weights of a chunk into `out` (same length).
            ///
            /// # Safety
            /// The CPU must have the features the function is compiled for.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(chunk: &[f32], lanes: &RowLanes, out: &mut [u64]) {
                let mut vectors = chunk.chunks_exact(16);
                let mut outs = out.chunks_exact_mut(16);
                for (v, o) in (&mut vectors).zip(&mut outs) {
                    // SAFETY: `v` holds 16 f32 and `o` 16 u64; unaligned accesses are allowed.
                    unsafe {
                        let d = _mm512_castps_si512(gaps16(_mm512_loadu_ps(v.as_ptr()), lanes));
                        let lo = $weigh(_mm512_castsi512_si256(d), lanes);
                        let hi = $weigh(_mm512_extracti64x4_epi64::<1>(d), lanes);
                        _mm512_storeu_si512(o.as_mut_ptr().cast(), lo);
                        _mm512_storeu_si512(o.as_mut_ptr().add(8).cast(), hi);
                    }
                }
                for (&l, w) in vectors.remainder().iter().zip(outs.into_remainder()) {
                    *w = exact_of_gap(lanes.gap_of(l), lanes);
                }
            }
        };
    }

    exact_loop!(
        exact_weights,
        weigh8,
        "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt"
    );
    exact_loop!(
        exact_weights_ifma,
        weigh8_ifma,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512ifma,popcnt,bmi1,bmi2,lzcnt"
    );

    /// The estimates of 16 logits: [`super::estimate_of_gap`] in lanes, the same bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn estimate16(l: __m512, lanes: &RowLanes) -> __m512 {
        let d = gaps16(l, lanes);
        let c_hi = _mm512_set1_ps(lanes.c_hi);
        let down = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(d, _mm512_set1_ps(lanes.neg_c_hi)),
        );
        // g = ⌈x⌉ − D · c_hi − D · c_lo, as −(D · c_hi) − (−⌈x⌉), then −(D · c_lo) + g.
        let g = _mm512_fnmsub_ps(d, c_hi, down);
        let g = _mm512_fnmadd_ps(d, _mm512_set1_ps(lanes.c_lo), g);
        let mut p = _mm512_set1_ps(ESTIMATE_COEFFICIENTS[6]);
        for k in (0..6).rev() {
            p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(ESTIMATE_COEFFICIENTS[k]));
        }
        _mm512_scalef_ps(p, down)
    }

    /// The two f64 halves of 16 f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn widen16(w: __m512) -> (__m512d, __m512d) {
        let low = _mm512_cvtps_pd(_mm512_castps512_ps256(w));
        let high = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(w),
        )));
        (low, high)
    }

    /// The estimates of 64 logits summed per lane in f32, `(w0 + w1) + (w2 + w3)` (two roundings
    /// of positive terms; see [`super::ESTIMATE_RELATIVE`]).
    ///
    /// # Safety
    /// `v` holds at least 64 f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    unsafe fn estimate64_sum(v: *const f32, lanes: &RowLanes) -> __m512 {
        // SAFETY: the caller's promise.
        let w = |i: usize| estimate16(unsafe { _mm512_loadu_ps(v.add(16 * i)) }, lanes);
        let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3));
        _mm512_add_ps(_mm512_add_ps(w0, w1), _mm512_add_ps(w2, w3))
    }

    /// See [`super::estimate_block_sums`].
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn estimate_block_sums(
        row: &[f32],
        lanes: &RowLanes,
        sums: &mut [f64],
    ) -> f64 {
        block_sums_with(row, lanes, sums, |block| {
            let (mut acc0, mut acc1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
            for v in block.chunks_exact(64) {
                // SAFETY: `v` holds 64 f32.
                let (low, high) = widen16(unsafe { estimate64_sum(v.as_ptr(), lanes) });
                acc0 = _mm512_add_pd(acc0, low);
                acc1 = _mm512_add_pd(acc1, high);
            }
            _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1))
        })
    }

    /// `sum + w` in the lanes whose logit `l` is at least `level` (ordered: NaN is at no level).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn add_at16(sum: __m512, l: __m512, level: __m512, w: __m512) -> __m512 {
        _mm512_mask_add_ps(sum, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(l, level), sum, w)
    }

    /// The sum of 16 f32 lanes, in f64.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn reduce16(v: __m512) -> f64 {
        let (low, high) = widen16(v);
        _mm512_reduce_add_pd(_mm512_add_pd(low, high))
    }

    store_levels!(
        "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt",
        16,
        (_mm512_setzero_ps, _mm512_set1_ps, _mm512_add_ps),
        (_mm512_loadu_ps, _mm512_storeu_ps),
        (estimate16, add_at16, reduce16)
    );
}

/// Hand-written AVX2 loops: the exact weights (four 64-bit lanes per vector) and the estimates
/// (eight f32 lanes).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{
        ESTIMATE_COEFFICIENTS, RowLanes, SCALE_ROUNDER, block_sums_with, exact_of_gap, store_with,
    };
    use specula_backend_api::logit_weights::{EXP2_COEFFICIENTS, GAP_LIMIT};
    use std::arch::x86_64::*;

    gaps_fn!(
        gaps8,
        __m256,
        "avx2,fma,popcnt,bmi1,bmi2,lzcnt",
        sanitize8,
        (_mm256_set1_ps, _mm256_sub_ps, _mm256_min_ps)
    );

    /// `sanitize_logit` on 8 lanes, as [`gaps8`] passes it the constants.
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn sanitize8(l: __m256, huge: __m256, neg_inf: __m256) -> __m256 {
        // `max(l, −inf)` returns its second operand for a NaN `l`; blend the −inf back.
        let s = _mm256_min_ps(_mm256_max_ps(l, neg_inf), huge);
        let clamped = _mm256_max_ps(s, _mm256_sub_ps(_mm256_setzero_ps(), huge));
        let s = _mm256_blendv_ps(clamped, s, _mm256_cmp_ps::<_CMP_EQ_OQ>(s, neg_inf));
        let magnitude = _mm256_and_si256(_mm256_castps_si256(l), _mm256_set1_epi32(0x7fff_ffff));
        let kept = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(super::TINY_BITS as i32 - 1));
        _mm256_and_ps(s, _mm256_castsi256_ps(kept))
    }

    /// Exact weights of 4 gaps `D`.
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn weigh4(d: __m128i, lanes: &RowLanes) -> __m256i {
        let bits = _mm256_cvtepu32_epi64(d);
        let m_d = _mm256_or_si256(
            _mm256_and_si256(bits, _mm256_set1_epi64x(0x7f_ffff)),
            _mm256_set1_epi64x(0x80_0000),
        );
        let shift = _mm256_sub_epi64(
            _mm256_set1_epi64x(i64::from(126 - lanes.e)),
            _mm256_srli_epi64::<23>(bits),
        );
        let x = _mm256_srlv_epi64(
            _mm256_mul_epu32(m_d, _mm256_set1_epi64x(lanes.c32 as i64)),
            shift,
        );
        let g = _mm256_add_epi64(
            _mm256_andnot_si256(x, _mm256_set1_epi64x(0xff_ffff)),
            _mm256_set1_epi64x(1),
        );
        let mut p = _mm256_set1_epi64x(EXP2_COEFFICIENTS[6] as i64);
        for k in (0..6).rev() {
            let pg = _mm256_srli_epi64::<24>(_mm256_mul_epu32(p, g));
            p = _mm256_add_epi64(_mm256_set1_epi64x(EXP2_COEFFICIENTS[k] as i64), pg);
        }
        // x < GAP_LIMIT (x < 2^63, so the signed compare is the unsigned one).
        let live = _mm256_cmpgt_epi64(_mm256_set1_epi64x(GAP_LIMIT as i64), x);
        let w = _mm256_srlv_epi64(_mm256_slli_epi64::<9>(p), _mm256_srli_epi64::<24>(x));
        _mm256_and_si256(live, w)
    }

    /// The estimates of 8 logits: [`super::estimate_of_gap`] in lanes, the same bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn estimate8(l: __m256, lanes: &RowLanes) -> __m256 {
        let d = gaps8(l, lanes);
        let c_hi = _mm256_set1_ps(lanes.c_hi);
        let down = _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            d,
            _mm256_set1_ps(lanes.neg_c_hi),
        ));
        let g = _mm256_fnmsub_ps(d, c_hi, down);
        let g = _mm256_fnmadd_ps(d, _mm256_set1_ps(lanes.c_lo), g);
        let mut p = _mm256_set1_ps(ESTIMATE_COEFFICIENTS[6]);
        for k in (0..6).rev() {
            p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(ESTIMATE_COEFFICIENTS[k]));
        }
        let biased = _mm256_add_ps(down, _mm256_set1_ps(SCALE_ROUNDER));
        let scale = _mm256_slli_epi32::<23>(_mm256_castps_si256(biased));
        _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
    }

    /// See [`super::estimate_block_sums`]: four estimates per lane added in f32,
    /// `(w0 + w1) + (w2 + w3)`, then widened to f64.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn estimate_block_sums(
        row: &[f32],
        lanes: &RowLanes,
        sums: &mut [f64],
    ) -> f64 {
        block_sums_with(row, lanes, sums, |block| {
            let (mut acc0, mut acc1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            for v in block.chunks_exact(32) {
                // SAFETY: `v` holds 32 f32.
                let w =
                    |i: usize| estimate8(unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * i)) }, lanes);
                let s = _mm256_add_ps(_mm256_add_ps(w(0), w(1)), _mm256_add_ps(w(2), w(3)));
                acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(s)));
                acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s)));
            }
            let mut halves = [0f64; 4];
            // SAFETY: `halves` holds 4 f64.
            unsafe { _mm256_storeu_pd(halves.as_mut_ptr(), _mm256_add_pd(acc0, acc1)) };
            halves.iter().sum()
        })
    }

    /// `sum + w` in the lanes whose logit `l` is at least `level` (ordered: NaN is at no level).
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn add_at8(sum: __m256, l: __m256, level: __m256, w: __m256) -> __m256 {
        _mm256_add_ps(sum, _mm256_and_ps(w, _mm256_cmp_ps::<_CMP_GE_OQ>(l, level)))
    }

    /// The sum of 8 f32 lanes, in f64.
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn reduce8(v: __m256) -> f64 {
        let mut lanes8 = [0f32; 8];
        // SAFETY: `lanes8` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes8.as_mut_ptr(), v) };
        lanes8.iter().map(|&a| f64::from(a)).sum()
    }

    store_levels!(
        "avx2,fma,popcnt,bmi1,bmi2,lzcnt",
        8,
        (_mm256_setzero_ps, _mm256_set1_ps, _mm256_add_ps),
        (_mm256_loadu_ps, _mm256_storeu_ps),
        (estimate8, add_at8, reduce8)
    );

    /// Exact weights of a chunk into `out` (same length).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn exact_weights(chunk: &[f32], lanes: &RowLanes, out: &mut [u64]) {
        let mut vectors = chunk.chunks_exact(8);
        let mut outs = out.chunks_exact_mut(8);
        for (v, o) in (&mut vectors).zip(&mut outs) {
            // SAFETY: `v` holds 8 f32 and `o` 8 u64; unaligned accesses are allowed.
            unsafe {
                let d = _mm256_castps_si256(gaps8(_mm256_loadu_ps(v.as_ptr()), lanes));
                let lo = weigh4(_mm256_castsi256_si128(d), lanes);
                let hi = weigh4(_mm256_extracti128_si256::<1>(d), lanes);
                _mm256_storeu_si256(o.as_mut_ptr().cast(), lo);
                _mm256_storeu_si256(o.as_mut_ptr().add(4).cast(), hi);
            }
        }
        for (&l, w) in vectors.remainder().iter().zip(outs.into_remainder()) {
            *w = exact_of_gap(lanes.gap_of(l), lanes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;
    #[cfg(target_arch = "x86_64")]
    use crate::sampling::scan::cpu_has_avx512;
    use specula_backend_api::logit_weights::{row_scale, sanitize_logit, scaled_weight};

    /// Hostile and ordinary logits below `max`: specials, raw bit patterns, values near it.
    fn logits_below(lcg: &mut Lcg, max: f32, n: usize, clean: bool) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let bits = lcg.next_u64() as u32;
                let v = match i % 5 {
                    0 => max - (bits % 1_000_000) as f32 * 1e-4,
                    1 => max - f32::from_bits(bits & 0x7fff_ffff).min(1e4),
                    2 if !clean => f32::from_bits(bits),
                    3 if !clean => [f32::NAN, f32::NEG_INFINITY, -3e38, 1e-30, -1e-30, -0.0][i % 6],
                    _ => max - (bits % 4000) as f32 * 0.01,
                };
                if clean { v.max(-1e18) } else { v }
            })
            .filter(|&l| {
                let a = l.to_bits() & 0x7fff_ffff;
                let tidy = a <= HUGE_BITS && (a == 0 || a >= TINY_BITS);
                sanitize_logit(l) <= max && (!clean || tidy)
            })
            .collect()
    }

    #[test]
    fn exact_lanes_equal_the_contract_steps() {
        let mut lcg = Lcg(41);
        for t in [1e-20f32, 1e-6, 0.05, 0.8, 1.0, 3.0, 1e10] {
            for max in [
                0.0f32,
                1e-20,
                2.5,
                -7.0,
                1e19,
                2f32.powi(64),
                -2f32.powi(64),
            ] {
                for clean in [false, true] {
                    let scale = row_scale(t);
                    let Some(lanes) = RowLanes::new(max, scale, clean) else {
                        continue;
                    };
                    let row = logits_below(&mut lcg, max, 3001, clean);
                    let mut out = vec![0u64; row.len()];
                    exact_weights(&row, &lanes, &mut out);
                    for (i, (&l, &w)) in row.iter().zip(&out).enumerate() {
                        assert_eq!(
                            w,
                            scaled_weight(l, max, scale),
                            "l {l} ({i}), max {max}, t {t}"
                        );
                        assert_eq!(exact_of_gap(lanes.gap_of(l), &lanes), w, "scalar, l {l}");
                    }
                }
            }
        }
    }

    /// Every compiled variant of the exact lanes (AVX-512 with and without IFMA, AVX2), whichever
    /// this CPU has, gives the scalar steps' integers, whatever `SPECULA_CPU_MAX_ISA` says.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_exact_variant_equals_the_scalar_steps() {
        let mut lcg = Lcg(47);
        for t in [1e-6f32, 0.8, 1.0, 7.0] {
            for clean in [false, true] {
                let max = 3.25;
                let lanes = RowLanes::new(max, row_scale(t), clean).expect("vector lanes");
                let row = logits_below(&mut lcg, max, 4099, clean);
                let scalar: Vec<u64> = row
                    .iter()
                    .map(|&l| exact_of_gap(lanes.gap_of(l), &lanes))
                    .collect();
                let mut out = vec![0u64; row.len()];
                if cpu_has_avx512() {
                    // SAFETY: the features are present.
                    unsafe { avx512::exact_weights(&row, &lanes, &mut out) };
                    assert_eq!(out, scalar, "avx512, t {t}, clean {clean}");
                    if avx512::has_ifma() {
                        out.fill(0);
                        // SAFETY: as above, and IFMA.
                        unsafe { avx512::exact_weights_ifma(&row, &lanes, &mut out) };
                        assert_eq!(out, scalar, "avx512 ifma, t {t}, clean {clean}");
                    }
                }
                if has_avx2() {
                    out.fill(0);
                    // SAFETY: the features are present.
                    unsafe { avx2::exact_weights(&row, &lanes, &mut out) };
                    assert_eq!(out, scalar, "avx2, t {t}, clean {clean}");
                }
            }
        }
    }

    #[test]
    fn estimates_stay_within_their_bound() {
        let mut lcg = Lcg(43);
        let mut worst = 0.0f64;
        for t in [1e-20f32, 1e-3, 0.05, 0.7, 1.0, 2.5, 1e3, 1e10] {
            for max in [0.0f32, 2.5, -7.0, 1e19, 31.75] {
                let scale = row_scale(t);
                let Some(lanes) = RowLanes::new(max, scale, false) else {
                    continue;
                };
                let row = logits_below(&mut lcg, max, 20_000, false);
                let mut stored = vec![0f32; row.len()];
                let rough = estimate_store(&row, &lanes, &mut stored);
                let total: f64 = stored.iter().map(|&w| f64::from(w)).sum();
                assert!(
                    (rough - total).abs() <= total * 1e-3,
                    "rough total {rough} of {total}"
                );
                let mut sums = vec![0f64; row.len().div_ceil(SUM_BLOCK)];
                let summed = estimate_block_sums(&row, &lanes, &mut sums);
                let mut exact_total = 0u64;
                for (&l, &w) in row.iter().zip(&stored) {
                    let exact = scaled_weight(l, max, scale) as f64;
                    exact_total += exact as u64;
                    let single = f64::from(estimate_of_gap(lanes.gap_of(l), &lanes));
                    let excess = (exact - single).abs() - ESTIMATE_ABSOLUTE;
                    if excess > 0.0 {
                        worst = worst.max(excess / single);
                    }
                    let bound = f64::from(w) * STORED_RELATIVE + ESTIMATE_ABSOLUTE;
                    assert!(
                        (exact - f64::from(w)).abs() <= bound,
                        "stored, l {l}, t {t}"
                    );
                }
                let n = row.len() as f64;
                for (estimate, relative) in [(total, STORED_RELATIVE), (summed, ESTIMATE_RELATIVE)]
                {
                    let bound = estimate * relative + n * ESTIMATE_ABSOLUTE;
                    let error = (exact_total as f64 - estimate).abs();
                    assert!(error <= bound, "t {t} max {max}: {error} > {bound}");
                }
            }
        }
        assert!(
            worst <= STORED_RELATIVE / 2.0,
            "worst relative error {worst:e} (bound {STORED_RELATIVE:e})"
        );
    }

    /// Every compiled variant of the estimate loops (AVX-512, AVX2, generic), whichever this CPU
    /// has: the stored estimates are the scalar steps' bits, and every block sum is within the
    /// bound of the exact block weight, on hostile values.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_estimate_variant_equals_the_scalar_steps() {
        let mut lcg = Lcg(53);
        for t in [1e-6f32, 0.05, 0.8, 1.0, 7.0, 1e10] {
            for clean in [false, true] {
                let max = 3.25;
                let scale = row_scale(t);
                let lanes = RowLanes::new(max, scale, clean).expect("vector lanes");
                let row = logits_below(&mut lcg, max, 4099, clean);
                let scalar: Vec<u32> = row
                    .iter()
                    .map(|&l| estimate_of_gap(lanes.gap_of(l), &lanes).to_bits())
                    .collect();
                let blocks = row.len().div_ceil(SUM_BLOCK);
                let exact: Vec<f64> = row
                    .chunks(SUM_BLOCK)
                    .map(|b| b.iter().map(|&l| scaled_weight(l, max, scale)).sum::<u64>() as f64)
                    .collect();
                let check_sums = |name: &str, sums: &[f64], total: f64| {
                    for (b, (&sum, &exact)) in sums.iter().zip(&exact).enumerate() {
                        let bound = sum * ESTIMATE_RELATIVE + SUM_BLOCK as f64 * ESTIMATE_ABSOLUTE;
                        assert!((sum - exact).abs() <= bound, "{name} block {b}, t {t}");
                    }
                    let summed: f64 = sums.iter().sum();
                    assert!(
                        (total - summed).abs() <= summed * 1e-12,
                        "{name} total, t {t}"
                    );
                };
                let mut stored = vec![0f32; row.len()];
                let mut sums = vec![0f64; blocks];
                let bits = |stored: &[f32]| stored.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
                estimate_store_generic(&row, &lanes, &mut stored, &[]);
                assert_eq!(bits(&stored), scalar, "generic, t {t}, clean {clean}");
                let total = estimate_sums_generic(&row, &lanes, &mut sums);
                check_sums("generic", &sums, total);
                if cpu_has_avx512() {
                    stored.fill(0.0);
                    // SAFETY: the features are present; `stored` is as long as `row`.
                    unsafe { avx512::estimate_store(&row, &lanes, &mut stored, &[]) };
                    assert_eq!(bits(&stored), scalar, "avx512, t {t}, clean {clean}");
                    // SAFETY: as above.
                    let total = unsafe { avx512::estimate_block_sums(&row, &lanes, &mut sums) };
                    check_sums("avx512", &sums, total);
                }
                if has_avx2() {
                    stored.fill(0.0);
                    // SAFETY: the features are present; `stored` is as long as `row`.
                    unsafe { avx2::estimate_store(&row, &lanes, &mut stored, &[]) };
                    assert_eq!(bits(&stored), scalar, "avx2, t {t}, clean {clean}");
                    // SAFETY: as above.
                    let total = unsafe { avx2::estimate_block_sums(&row, &lanes, &mut sums) };
                    check_sums("avx2", &sums, total);
                }
            }
        }
    }

    /// Every compiled variant of the store loop with levels stores the scalar steps' bits and
    /// sums, per level, the estimates of the tokens at or above it (NaN at none; a level equal to
    /// a token's logit counts it; a NaN level counts nothing), within the f32 rounding of its
    /// lanes.
    #[test]
    fn every_store_variant_sums_the_estimates_at_its_levels() {
        let mut lcg = Lcg(59);
        for (t, clean) in [(1.0f32, false), (0.05, false), (0.8, true)] {
            let max = 3.25;
            let lanes = RowLanes::new(max, row_scale(t), clean).expect("vector lanes");
            let mut row = logits_below(&mut lcg, max, 5003, clean);
            let levels = [max, 3.0, row[17], f32::NAN, -1e30];
            row[40] = 3.0;
            let scalar: Vec<f32> = row
                .iter()
                .map(|&l| estimate_of_gap(lanes.gap_of(l), &lanes))
                .collect();
            let expected = levels.map(|level| {
                row.iter()
                    .zip(&scalar)
                    .filter(|&(&l, _)| l >= level)
                    .map(|(_, &w)| f64::from(w))
                    .sum::<f64>()
            });
            let total: f64 = scalar.iter().map(|&w| f64::from(w)).sum();
            let check = |name: &str, stored: &[f32], (rough, above): (f64, [f64; 5])| {
                let bits = |v: &[f32]| v.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(stored), bits(&scalar), "{name}, t {t}");
                assert!((rough - total).abs() <= total * 1e-4, "{name} total, t {t}");
                for (k, (&a, &e)) in above.iter().zip(&expected).enumerate() {
                    assert!(
                        (a - e).abs() <= total * 1e-4,
                        "{name} level {k}: {a} vs {e}"
                    );
                }
                assert_eq!(above[3], 0.0, "{name}: NaN level");
            };
            let mut stored = vec![0f32; row.len()];
            let sums = estimate_store_generic(&row, &lanes, &mut stored, &levels);
            check("generic", &stored, sums);
            #[cfg(target_arch = "x86_64")]
            {
                if cpu_has_avx512() {
                    stored.fill(0.0);
                    // SAFETY: the features are present; `stored` is as long as `row`.
                    let sums =
                        unsafe { avx512::estimate_store(&row, &lanes, &mut stored, &levels) };
                    check("avx512", &stored, sums);
                }
                if has_avx2() {
                    stored.fill(0.0);
                    // SAFETY: the features are present; `stored` is as long as `row`.
                    let sums = unsafe { avx2::estimate_store(&row, &lanes, &mut stored, &levels) };
                    check("avx2", &stored, sums);
                }
            }
            let sums = estimate_store_levels(&row, &lanes, &mut stored, &levels);
            check("dispatched", &stored, sums);
        }
    }

    #[test]
    fn the_maximum_pass_finds_the_maximum_and_dirt() {
        let clean: Vec<f32> = (0..1000).map(|i| (i % 97) as f32 - 50.0).collect();
        assert_eq!(max_and_clean(&clean), (46.0, true));
        for dirt in [f32::NAN, f32::NEG_INFINITY, 3e38, -3e38, 1e-30, -1e-30] {
            let mut row = clean.clone();
            row[517] = dirt;
            let (max, is_clean) = max_and_clean(&row);
            assert!(!is_clean, "{dirt}");
            assert_eq!(max, if dirt == 3e38 { 3e38 } else { 46.0 });
        }
        let mut zeros = clean.clone();
        zeros[3] = 0.0;
        zeros[4] = -0.0;
        assert!(max_and_clean(&zeros).1);
        assert_eq!(max_and_clean(&[f32::NAN; 3]).0, f32::NEG_INFINITY);
    }

    /// The maximum pass reads a row's first `MAX_STREAMS` parts side by side, then the rest:
    /// on lengths around every split, with the maximum, a NaN, an infinity and each kind of dirt
    /// placed in each part, at its edges and in the rest, every compiled variant gives the
    /// maximum and the cleanliness of a plain scalar fold (a zero maximum up to its sign, which
    /// `sanitize_logit` erases).
    #[test]
    fn the_maximum_pass_in_streams_is_a_plain_fold() {
        let scalar = |row: &[f32]| {
            let best = row
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            let clean = row.iter().all(|x| {
                let a = x.to_bits() & 0x7fff_ffff;
                a <= HUGE_BITS && a.wrapping_sub(1) >= TINY_BITS - 1
            });
            (sanitize_logit(best).to_bits(), clean)
        };
        let variants = |row: &[f32]| {
            let mut out = vec![("generic", max_and_clean_generic(row))];
            #[cfg(target_arch = "x86_64")]
            {
                if has_avx512() {
                    // SAFETY: the CPU has the variant's features.
                    out.push(("avx512", unsafe { max_and_clean_avx512(row) }));
                }
                if has_avx2() {
                    // SAFETY: as above.
                    out.push(("avx2", unsafe { max_and_clean_avx2(row) }));
                }
            }
            out
        };
        let mut lcg = Lcg(23);
        let block = MAX_STREAMS * MAX_LANES;
        for len in [
            0,
            1,
            15,
            16,
            63,
            64,
            65,
            127,
            128,
            129,
            1000,
            4096 + 17,
            151_936,
        ] {
            let base: Vec<f32> = (0..len).map(|_| lcg.unit() * 20.0 - 30.0).collect();
            let part = len / block * MAX_LANES;
            let mut places = vec![0, len.saturating_sub(1), len / 2];
            for k in 0..MAX_STREAMS {
                places.extend([k * part, (k * part + part).saturating_sub(1), k * part + 5]);
            }
            places.retain(|&i| i < len);
            for &at in &places {
                for value in [
                    7.5,
                    f32::NAN,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    3e38,
                    -1e-30,
                    0.0,
                    -0.0,
                ] {
                    let mut row = base.clone();
                    row[at] = value;
                    if value == 0.0 {
                        // A zero maximum, met as −0 and +0 in different parts.
                        row.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
                        row[at] = value;
                        row[len - 1 - at] = -value;
                    }
                    for (name, (max, clean)) in variants(&row) {
                        assert_eq!(
                            (sanitize_logit(max).to_bits(), clean),
                            scalar(&row),
                            "{name}: len {len}, {value} at {at}"
                        );
                    }
                }
            }
        }
    }
}
