//! Sampling a logits row that top-k leaves whole (`top_k` 0 or ≥ V) in one weighing pass, without
//! materialising a token list for the whole row.
//!
//! - **top_p = 1**: the pass sums the weights per chunk of [`CHUNK`] tokens; the draw finds its
//!   chunk from those masses and weighs that chunk again.
//! - **top_p < 1**: a strided sample of the row gives a floor logit with about [`BUDGET`] tokens
//!   above it; the pass sums every weight and collects the tokens at or above the floor. Those are
//!   a rank-order prefix of the row, so if their mass reaches top-p of the total the boundary and
//!   the kept set lie among them, exactly. Otherwise (a flat row, or too many tokens above the
//!   floor) the caller falls back to the full path.
//!
//! Both make the decisions of the full path (`kept_set`, `draw_in`) on the same integer weights.

use specula_backend_api::FloatElement;
use specula_backend_api::abi::TOP_P_BITS;
use specula_backend_api::fixed_point::{scale_draw, top_p_fixed};
use specula_backend_api::logit_weights::{logit_rank_key, sanitize_logit};

use specula_backend_api::logit_weights::RowScale;

use super::{
    Boundary, CHUNK, Weighing, Weighted, any_not_below, prefix_boundary, raw_lower_bound,
    weigh_chunk,
};
use crate::float_math;
use crate::sampling::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// Rows shorter than this take the full path (the sample would be most of the row).
const MIN_VOCAB: usize = 8192;
/// Logits read for the floor estimate.
const SAMPLES: usize = 1024;
/// About how many tokens the floor should leave above it.
const BUDGET: usize = 4096;
/// The sub-chunk the collection looks at when a chunk has a token above the floor.
const QUARTER: usize = CHUNK / 4;
/// Collecting stops (and the caller falls back) past this many tokens.
const CAP: usize = 8 * BUDGET;

thread_local! {
    /// Per-thread buffers: chunk masses, and the tokens collected above the floor.
    static BUFFERS: std::cell::RefCell<(Vec<u64>, Vec<Weighted>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The token drawn by `r` from a logits row weighed by `weighing` (not `Zero`, `PosInf` or
/// `Argmax`: those rows are cheap on the full path), or `None` when the full path must decide.
pub(super) fn sample<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    top_p: f32,
    r: u64,
) -> Option<usize> {
    if row.len() < MIN_VOCAB || !matches!(weighing, Weighing::Scaled { .. }) {
        return None;
    }
    let p = top_p_fixed(top_p);
    BUFFERS.with(|cell| {
        let (masses, members) = &mut *cell.borrow_mut();
        if p >= 1 << TOP_P_BITS {
            sample_whole(row, weighing, r, masses)
        } else {
            sample_top_p(row, weighing, p, r, members)
        }
    })
}

/// top_p = 1: every token of positive weight is kept; the draw walks the chunk masses.
fn sample_whole<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    r: u64,
    masses: &mut Vec<u64>,
) -> Option<usize> {
    masses.clear();
    let mut weights = [0u64; CHUNK];
    let mut total = 0u64;
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        let weights = &mut weights[..chunk.len()];
        weigh_chunk(weighing, c * CHUNK, chunk, weights);
        let mass: u64 = weights.iter().sum();
        masses.push(mass);
        total += mass;
    }
    if total == 0 {
        return None;
    }
    let t = scale_draw(r, total);
    let mut running = 0u64;
    let c = masses.iter().position(|&m| {
        running += m;
        running > t
    })?;
    running -= masses[c];
    let chunk = &row[c * CHUNK..row.len().min((c + 1) * CHUNK)];
    let weights = &mut weights[..chunk.len()];
    weigh_chunk(weighing, c * CHUNK, chunk, weights);
    weights
        .iter()
        .position(|&w| {
            running += w;
            running > t
        })
        .map(|j| c * CHUNK + j)
}

/// top_p < 1: the tokens at or above a sampled floor, if their mass reaches top-p of the total.
/// The total is first bounded in floats ([`bounded_boundary`]); only when the bounds leave the
/// boundary open is every token weighed exactly.
fn sample_top_p<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    p: u64,
    r: u64,
    members: &mut Vec<Weighted>,
) -> Option<usize> {
    let floor = sampled_floor(row);
    if !collect_members(row, weighing, floor, members) {
        return None;
    }
    let (boundary, mass) = match bounded_boundary(row, weighing, floor, p, members) {
        Some(found) => found,
        None => {
            let total = exact_total(row, weighing);
            if total == 0 {
                return None;
            }
            prefix_boundary(members, p, total)?
        }
    };
    members.retain(|w| boundary.keeps(w));
    let t = scale_draw(r, mass);
    let mut running = 0u64;
    members
        .iter()
        .find(|w| {
            running += w.weight;
            running > t
        })
        .map(|w| w.id as usize)
}

/// The relative bound on `|w − ŵ|` for a token below the floor, where `w` is its exact weight
/// and `ŵ` its float estimate ([`float_weight`]), besides [`ABSOLUTE_ERROR`]. The sources, in
/// relative terms: the f32 scale `c` and the product `d · c` (the gap in log2 units, < 40) carry
/// `2^-23` of the gap, so `40 · 2^-23 · ln 2 ≈ 2^-18.2` of the weight; `(40 − y) · ln 2` rounds by
/// `2^-19`; `float_math::exp` by 2 ulp (`2^-22`); the contract's polynomial for `2^-g` is within
/// `2^-20` of the true value and its floors within `2^-27`; the gap's floor to `2^-24` moves the
/// weight by `2^-24.5`; f32 partial sums of 8 terms add `2^-21.2`. They total about `2^-17.2`;
/// the bound is `2^-16`, and a test checks it on hostile values.
pub(super) const RELATIVE_ERROR: f64 = 1.0 / 65_536.0;
/// The absolute part of the bound, per token: the final shift of a small weight floors it, and a
/// gap just under 40 may weigh 1 where the estimate says 0.
pub(super) const ABSOLUTE_ERROR: f64 = 2.0;

/// The top-p boundary and its mass among `members` (the tokens at or above `floor`, exactly
/// weighed), with the rest of the row's weight bounded in floats: `Some` when the bounds on the
/// total decide it (the boundary is the same at both ends), `None` otherwise (or for a
/// temperature whose scale is outside the f32 range).
fn bounded_boundary<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    floor: f32,
    p: u64,
    members: &[Weighted],
) -> Option<(Boundary, u64)> {
    let Weighing::Scaled {
        max,
        scale: RowScale::Scaled { c32, e },
    } = *weighing
    else {
        return None;
    };
    let c = (c32 as f64 * f64::powi(2.0, e)) as f32;
    if !(c.is_normal() && c < 1e30) {
        return None;
    }
    let rest = float_rest(row, max, c, floor);
    let exact: u64 = members.iter().map(|w| w.weight).sum();
    let error = rest * RELATIVE_ERROR + ABSOLUTE_ERROR * row.len() as f64;
    let low = exact + (rest - error).max(0.0).floor() as u64;
    let high = exact + (rest + error).ceil() as u64;
    let at_low = prefix_boundary(members, p, low)?;
    let at_high = prefix_boundary(members, p, high)?;
    (at_low == at_high).then_some(at_low)
}

/// The tokens of positive weight whose sanitized logit is at least `floor`, exactly weighed, into
/// `members` (in id order); `false` past [`CAP`] members. Only the sub-chunks of [`QUARTER`]
/// tokens with a logit not below the floor's raw bound are looked at, and the members' logits are
/// weighed together at the end (vectorised).
fn collect_members<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    floor: f32,
    members: &mut Vec<Weighted>,
) -> bool {
    members.clear();
    let lo = raw_lower_bound(floor);
    let mut logits: Vec<f32> = Vec::new();
    for (q, part) in row.chunks(QUARTER).enumerate() {
        if !any_not_below(part, lo) {
            continue;
        }
        for (j, &x) in part.iter().enumerate() {
            let x = x.to_f32();
            if sanitize_logit(x) >= floor {
                members.push(Weighted {
                    key: logit_rank_key(x),
                    id: (q * QUARTER + j) as u32,
                    weight: 0,
                });
                logits.push(x);
            }
        }
        if members.len() > CAP {
            return false;
        }
    }
    let mut weights = vec![0u64; logits.len()];
    for (c, (xs, ws)) in logits
        .chunks(CHUNK)
        .zip(weights.chunks_mut(CHUNK))
        .enumerate()
    {
        // The ids only matter to `Argmax` rows, which never come here.
        weigh_chunk(weighing, c * CHUNK, xs, ws);
    }
    for (m, w) in members.iter_mut().zip(weights) {
        m.weight = w;
    }
    members.retain(|m| m.weight > 0);
    true
}

/// The float estimate of the total weight of the tokens of `row` below `floor` (the others count
/// 0): f32 lanes within each chunk of [`CHUNK`] tokens, chunk sums added in f64.
fn float_rest<T: FloatElement>(row: &[T], max: f32, c: f32, floor: f32) -> f64 {
    dispatch!(float_rest_generic::<T>(row, max, c, floor) via float_rest_avx512, float_rest_avx2)
}

compiled_for!(avx512, fn float_rest_avx512 [T: FloatElement]
    (row: &[T], max: f32, c: f32, floor: f32) -> f64 = float_rest_generic [T]);
compiled_for!(avx2, fn float_rest_avx2 [T: FloatElement]
    (row: &[T], max: f32, c: f32, floor: f32) -> f64 = float_rest_generic [T]);

/// Lanes of the float pass.
const LANES: usize = 16;

#[inline(always)]
fn float_rest_generic<T: FloatElement>(row: &[T], max: f32, c: f32, floor: f32) -> f64 {
    // Branch-free (a 0/1 factor rather than a branch around the exp), so that it vectorises. The
    // sanitized logit is the one `collect_members` compares with the floor: a token is either a
    // member (factor 0 here) or counted here, never both.
    let term = |v: &T| {
        let s = sanitize_logit(v.to_f32());
        float_weight(s, max, c) * f32::from(u8::from(s < floor))
    };
    let mut total = 0.0f64;
    let mut chunks = row.chunks_exact(CHUNK);
    for chunk in &mut chunks {
        let mut lanes = [0.0f32; LANES];
        for group in chunk.chunks_exact(LANES) {
            for (lane, v) in lanes.iter_mut().zip(group) {
                *lane += term(v);
            }
        }
        total += f64::from(lanes.iter().sum::<f32>());
    }
    total
        + chunks
            .remainder()
            .iter()
            .map(|v| f64::from(term(v)))
            .sum::<f64>()
}

/// `2^(40 − (max − s) · c)`, the float estimate of the weight of the sanitized logit `s` (0 at
/// a gap of 40 or more, and for −inf).
#[inline(always)]
pub(super) fn float_weight(s: f32, max: f32, c: f32) -> f32 {
    let y = (max - s) * c;
    let w = float_math::exp((40.0 - y.min(40.0)) * std::f32::consts::LN_2);
    w * f32::from(u8::from(y < 40.0))
}

/// The row's exact total weight (the fallback when the float bounds leave the boundary open).
fn exact_total<T: FloatElement>(row: &[T], weighing: &Weighing) -> u64 {
    let mut weights = [0u64; CHUNK];
    let mut total = 0u64;
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        let weights = &mut weights[..chunk.len()];
        weigh_chunk(weighing, c * CHUNK, chunk, weights);
        total += weights.iter().sum::<u64>();
    }
    total
}

/// A sanitized logit with about [`BUDGET`] tokens of the row at or above it, estimated from
/// [`SAMPLES`] evenly strided logits.
fn sampled_floor<T: FloatElement>(row: &[T]) -> f32 {
    let stride = row.len() / SAMPLES;
    let mut sample: Vec<f32> = (0..SAMPLES)
        .map(|i| sanitize_logit(row[i * stride].to_f32()))
        .collect();
    // The q-th largest of the sample: about q · stride tokens of the row lie above it.
    let q = (BUDGET / stride).clamp(1, SAMPLES) - 1;
    let (_, floor, _) = sample.select_nth_unstable_by(q, |a, b| b.total_cmp(a));
    *floor
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gaussian-like logits (a sum of uniforms) with a few hostile values.
    fn row(seed: u64, v: usize, spread: f32) -> Vec<f32> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut row: Vec<f32> = (0..v)
            .map(|_| (next() + next() + next() - 1.5) * spread)
            .collect();
        row[v / 3] = f32::NAN;
        row[v / 2] = f32::NEG_INFINITY;
        row[v / 5] = 1e-30;
        row
    }

    /// Whenever the float bounds decide the boundary, it is the boundary of the exact total.
    #[test]
    fn bounded_boundaries_are_the_exact_ones() {
        let mut decided = 0;
        for case in 0..60u64 {
            let v = [8192, 30_000, 151_936][case as usize % 3];
            let row = row(case, v, [4.0, 8.0, 20.0, 60.0][case as usize % 4]);
            let t = [0.3, 0.8, 1.0, 2.0, 1e-3][case as usize % 5];
            let weighing = Weighing::of(&row, t);
            let floor = sampled_floor(&row);
            let mut members = Vec::new();
            if !collect_members(&row, &weighing, floor, &mut members) {
                continue;
            }
            let total = exact_total(&row, &weighing);
            for top_p in [0.9f32, 0.5, 0.99, 0.1] {
                let p = top_p_fixed(top_p);
                if let Some(bounded) = bounded_boundary(&row, &weighing, floor, p, &members) {
                    decided += 1;
                    assert_eq!(
                        Some(bounded),
                        prefix_boundary(&members, p, total),
                        "case {case}, top_p {top_p}"
                    );
                }
            }
        }
        assert!(decided > 100, "the bounds decided only {decided} of 240");
    }
}
