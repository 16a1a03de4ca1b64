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

use super::{CHUNK, Weighing, Weighted, prefix_boundary, weigh_chunk};

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
fn sample_top_p<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    p: u64,
    r: u64,
    members: &mut Vec<Weighted>,
) -> Option<usize> {
    let floor = sampled_floor(row);
    let total = weigh_and_collect(row, weighing, floor, members)?;
    if total == 0 {
        return None;
    }
    let (boundary, mass) = prefix_boundary(members, p, total)?;
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

/// One pass: the row's total weight, and every token of positive weight whose sanitized logit is
/// at least `floor` into `members` (in id order). `None` past [`CAP`] members.
fn weigh_and_collect<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    floor: f32,
    members: &mut Vec<Weighted>,
) -> Option<u64> {
    members.clear();
    let lo = raw_lower_bound(floor);
    let mut weights = [0u64; CHUNK];
    let mut total = 0u64;
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        let weights = &mut weights[..chunk.len()];
        weigh_chunk(weighing, c * CHUNK, chunk, weights);
        total += weights.iter().sum::<u64>();
        if !any_not_below(chunk, lo) {
            continue;
        }
        // Most chunks hold a token or two above the floor: look at the quarters that do.
        for (q, (part, part_weights)) in chunk
            .chunks(QUARTER)
            .zip(weights.chunks(QUARTER))
            .enumerate()
        {
            if !any_not_below(part, lo) {
                continue;
            }
            for (j, (&x, &weight)) in part.iter().zip(part_weights).enumerate() {
                if weight > 0 && sanitize_logit(x.to_f32()) >= floor {
                    members.push(Weighted {
                        key: logit_rank_key(x.to_f32()),
                        id: (c * CHUNK + q * QUARTER + j) as u32,
                        weight,
                    });
                }
            }
        }
        if members.len() > CAP {
            return None;
        }
    }
    Some(total)
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

/// A raw logit `lo` such that every `x` with `sanitize_logit(x) ≥ floor` has `x ≥ lo` (or is NaN):
/// `sanitize_logit` is non-decreasing and moves a logit only by flushing `|x| < 2^-76` to 0 and
/// clamping `|x| > 2^64` to `±2^64`.
fn raw_lower_bound(floor: f32) -> f32 {
    /// 2^-76 and 2^64, the bounds of `sanitize_logit`.
    const TINY: f32 = f32::from_bits(0x1980_0000);
    const HUGE: f32 = f32::from_bits(0x5f80_0000);
    if floor <= -HUGE {
        f32::NEG_INFINITY
    } else if floor <= 0.0 {
        floor.min(-TINY)
    } else {
        floor
    }
}

/// Whether some raw logit of `chunk` is not below `lo` (NaN counts: it is not below anything).
/// A plain compare, so the loop vectorises; the exact test follows for the chunks it keeps.
#[inline(always)]
fn any_not_below<T: FloatElement>(chunk: &[T], lo: f32) -> bool {
    chunk.iter().fold(false, |any, &x| {
        let x = x.to_f32();
        any | (x >= lo) | x.is_nan()
    })
}
