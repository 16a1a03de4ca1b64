//! The maximum pass and the chunk-estimate pass of a row split over two threads, in ONE parallel
//! section (`rayon::join`, or `crate::parallel::join` on a caller's thread) instead of two: each
//! side takes its half's maximum, then the other half's, then estimates chunks with the row's
//! constants in steps of [`PREFETCH_STEP`] tokens, the first side from the front of the row and
//! the second from the back until they meet ([`Steps`]): a side that starts late (a worker woken
//! late) takes only what is left. Each chunk's estimate is the same bits whoever computes it.
//!
//! The other half's maximum is **claimed**: whichever side gets to a half first computes it, and
//! the other side waits only for a half that is being computed right now (a claimant never waits
//! on anything, so there is no deadlock, and when rayon runs both sides on one thread the first
//! side simply computes both). The maximum, the cleanliness flag and so the row's constants are
//! those of the two-section path bit for bit: the same halves, combined in the same order.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use specula_backend_api::logit_weights::{row_scale, sanitize_logit};

use super::super::lanes::{RowLanes, estimate_block_sums, max_and_clean};
use super::{CHUNK, PREFETCH_STEP, Segments, combine_max, prefetch_share};

/// A half's maximum: not claimed, being computed, or published.
struct HalfMax {
    state: AtomicU8,
    max: AtomicU32,
    clean: AtomicBool,
}

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
/// How long a waiting side spins before it yields its core: about a half's maximum (7–9 µs on
/// 75968 logits); longer, the claimant was preempted or waits for this very core.
const MAX_SPIN: std::time::Duration = std::time::Duration::from_micros(12);

impl HalfMax {
    fn new() -> Self {
        HalfMax {
            state: AtomicU8::new(FREE),
            max: AtomicU32::new(0),
            clean: AtomicBool::new(false),
        }
    }

    /// The half's maximum and cleanliness: computed here if no side has claimed it yet, else
    /// waited for (its claimant is computing it and waits on nothing).
    fn get(&self, part: &[f32]) -> (f32, bool) {
        if self
            .state
            .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Acquire)
            .is_ok()
        {
            let (max, clean) = max_and_clean(part);
            self.max.store(max.to_bits(), Ordering::Relaxed);
            self.clean.store(clean, Ordering::Relaxed);
            self.state.store(DONE, Ordering::Release);
            return (max, clean);
        }
        crate::parallel::spin_until(MAX_SPIN, || self.state.load(Ordering::Acquire) == DONE);
        (
            f32::from_bits(self.max.load(Ordering::Relaxed)),
            self.clean.load(Ordering::Relaxed),
        )
    }
}

/// The row's constants at temperature `t` (`None` for a row the caller must decide on exact
/// weights, as in the two-section path) and, when there are some, every chunk's estimated weight
/// in `masses`. `segments` has exactly two segments.
pub(super) fn max_then_chunks(
    values: &[f32],
    t: f32,
    segments: Segments,
    next: &[u8],
    masses: &mut Vec<f64>,
) -> Option<RowLanes> {
    debug_assert_eq!(segments.count, 2);
    masses.resize(values.len().div_ceil(CHUNK), 0.0);
    let (first, second) = values.split_at(segments.len.min(values.len()));
    let halves = [HalfMax::new(), HalfMax::new()];
    let scale = row_scale(t);
    let lanes_of = |own: usize| {
        let parts = [first, second];
        let mine = halves[own].get(parts[own]);
        let other = halves[1 - own].get(parts[1 - own]);
        // The two-section path's combine, in its order.
        let (raw_max, clean) = if own == 0 {
            combine_max(mine, other)
        } else {
            combine_max(other, mine)
        };
        RowLanes::new(sanitize_logit(raw_max), scale, clean)
    };
    let outs: Vec<Mutex<&mut [f64]>> = masses
        .chunks_mut(PREFETCH_STEP / CHUNK)
        .map(Mutex::new)
        .collect();
    let steps = Steps::new(outs.len());
    let work = |own: usize| {
        let lanes = lanes_of(own)?;
        while let Some(i) = steps.claim(own) {
            let start = i * PREFETCH_STEP;
            let step = &values[start..values.len().min(start + PREFETCH_STEP)];
            prefetch_share(next, start, step.len(), values.len());
            let mut out = outs[i].lock().unwrap_or_else(PoisonError::into_inner);
            estimate_block_sums(step, &lanes, &mut out);
        }
        Some(lanes)
    };
    let (lanes, _) = crate::parallel::join(|| work(0), || work(1));
    lanes
}

/// The estimate steps of a row, claimed by the two sides of the section: the first side takes
/// them from the front, the second from the back (each mostly the half it read for its maximum,
/// still in its core's cache), until they meet. A side that starts late takes only what is left,
/// so the other never waits for more than the step being estimated.
struct Steps {
    /// The next step from the front (low 32 bits) and one past the next from the back (high).
    ends: AtomicU64,
}

impl Steps {
    fn new(count: usize) -> Self {
        Steps {
            ends: AtomicU64::new((count as u64) << 32),
        }
    }

    /// The next step of side `own` (0 from the front, 1 from the back), if any is left.
    fn claim(&self, own: usize) -> Option<usize> {
        let mut ends = self.ends.load(Ordering::Relaxed);
        loop {
            let (front, back) = (ends & u64::from(u32::MAX), ends >> 32);
            if front >= back {
                return None;
            }
            let (claimed, step) = if own == 0 {
                (ends + 1, front)
            } else {
                (ends - (1 << 32), back - 1)
            };
            match self.ends.compare_exchange_weak(
                ends,
                claimed,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(step as usize),
                Err(now) => ends = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::normal_row as normal;
    use super::super::{Passes, RowHints, sample};
    use super::*;
    use crate::sampling::lcg::Lcg;
    use specula_backend_api::logit_weights::scaled_weight;

    /// The contract's draw at top_p 1, every token weighed by `scaled_weight`: the first token
    /// whose cumulative weight exceeds `⌊r · W / 2^64⌋`.
    fn contract_draw(row: &[f32], t: f32, r: u64) -> Option<usize> {
        let m = row
            .iter()
            .map(|&l| sanitize_logit(l))
            .fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<u64> = row
            .iter()
            .map(|&l| scaled_weight(l, m, row_scale(t)))
            .collect();
        let total: u64 = weights.iter().sum();
        let target = ((u128::from(r) * u128::from(total)) >> 64) as u64;
        let mut cumulative = 0;
        weights.iter().position(|&w| {
            cumulative += w;
            cumulative > target
        })
    }

    /// Rows whose halves' maxima are far apart (the lower half weighs 0 or almost 0 at the row's
    /// maximum), whose maximum is the last token or the first, and a half of NaN: the section's
    /// constants and chunk estimates are the two-section path's bits, and the drawn token is the
    /// contract's (weighed token by token here), on one and two parts.
    #[test]
    fn far_apart_halves_and_a_last_maximum_draw_the_contract_token() {
        let mut lcg = Lcg(23);
        let v = 40_000;
        let mut rows = Vec::new();
        for (gap, sigma) in [(3.0f32, 1.0f32), (27.0, 1.0), (45.0, 3.0), (200.0, 1.0)] {
            for lower_first in [false, true] {
                let mut row = normal(&mut lcg, v, sigma);
                let (start, end) = if lower_first { (0, v / 2) } else { (v / 2, v) };
                row[start..end].iter_mut().for_each(|l| *l -= gap);
                rows.push((
                    format!("halves {gap} apart, lower first {lower_first}"),
                    row,
                ));
            }
        }
        let rising: Vec<f32> = (0..v).map(|i| i as f32 * 3e-4 - 6.0).collect();
        let mut falling = rising.clone();
        falling.reverse();
        rows.push(("rising: the maximum last".to_string(), rising));
        rows.push(("falling: the maximum first".to_string(), falling));
        let mut row = normal(&mut lcg, v, 1.0);
        row[..v / 2 + 5000].fill(f32::NAN);
        rows.push(("a NaN first half".to_string(), row));
        let mut decided = 0;
        for t in [0.7f32, 1.0, 0.05] {
            for (name, row) in &rows {
                let segments = Segments::of(row.len(), 2);
                assert_eq!(segments.count, 2);
                let (raw_max, clean) = segments.max_and_clean(row);
                let two = RowLanes::new(sanitize_logit(raw_max), row_scale(t), clean);
                let mut masses = Vec::new();
                let one = max_then_chunks(row, t, segments, &[], &mut masses);
                assert_eq!(one, two, "{name}, t {t}: constants");
                let lanes = one.expect("finite rows");
                let mut estimated = Vec::new();
                Passes::unhinted(row, lanes, segments).estimate_chunks(&mut estimated);
                let bits = |m: &[f64]| m.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&masses), bits(&estimated), "{name}, t {t}: estimates");
                for r in [0, 1 << 63, u64::MAX, lcg.next_u64(), lcg.next_u64()] {
                    let hints = |parts| RowHints { parts, next: &[] };
                    let token = sample(row, t, 1.0, r, hints(2));
                    assert_eq!(token, sample(row, t, 1.0, r, hints(1)), "{name}, r {r}");
                    // `None` hands the row to the exact path (r = u64::MAX always does).
                    if token.is_some() {
                        assert_eq!(token, contract_draw(row, t, r), "{name}, t {t}, r {r}");
                        decided += 1;
                    }
                }
            }
        }
        assert!(decided * 5 >= rows.len() * 3 * 5 * 3, "decided {decided}");
    }

    /// The section run from a caller's thread with one pool worker as its other side (a batch-1
    /// call on the caller's thread, `crate::parallel`), on pools of one and two threads (the
    /// caller computing both halves or not): the two-section path's constants and estimates.
    #[test]
    fn on_the_callers_thread_the_section_keeps_its_bits() {
        let mut lcg = Lcg(29);
        let v = 40_000;
        let mut far = normal(&mut lcg, v, 1.0);
        far[..v / 2].iter_mut().for_each(|l| *l -= 45.0);
        let mut nan = normal(&mut lcg, v, 1.0);
        nan[v / 2 - 10..].fill(f32::NAN);
        let rows = [normal(&mut lcg, v, 3.0), far, nan];
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            for (i, row) in rows.iter().enumerate() {
                let segments = Segments::of(row.len(), 2);
                let (raw_max, clean) = segments.max_and_clean(row);
                let two = RowLanes::new(sanitize_logit(raw_max), row_scale(0.8), clean);
                let mut estimated = Vec::new();
                let lanes = two.expect("finite rows");
                Passes::unhinted(row, lanes, segments).estimate_chunks(&mut estimated);
                let bits = |m: &[f64]| m.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for _ in 0..20 {
                    let mut masses = Vec::new();
                    let one = crate::parallel::on_caller(&pool, || {
                        max_then_chunks(row, 0.8, segments, &[], &mut masses)
                    });
                    assert_eq!(one, two, "row {i}, {threads} threads: constants");
                    assert_eq!(bits(&masses), bits(&estimated), "row {i}: estimates");
                }
            }
        }
    }

    /// Every step is claimed once: by the front side alone, the back side alone, and both
    /// taking turns (the front side's steps a prefix, in order, the back side's the rest).
    #[test]
    fn every_step_is_claimed_once() {
        for count in [0, 1, 2, 38] {
            // Steps each side claims per turn (0: that side never comes).
            for pattern in [[1, 0], [0, 1], [1, 1], [3, 1]] {
                let steps = Steps::new(count);
                let mut taken = [Vec::new(), Vec::new()];
                loop {
                    let mut any = false;
                    for (own, &turn) in pattern.iter().enumerate() {
                        for _ in 0..turn {
                            if let Some(i) = steps.claim(own) {
                                taken[own].push(i);
                                any = true;
                            }
                        }
                    }
                    if !any {
                        break;
                    }
                }
                let front = taken[0].len();
                assert!(taken[0].iter().copied().eq(0..front), "{count} {pattern:?}");
                let back = (front..count).rev();
                assert!(taken[1].iter().copied().eq(back), "{count} {pattern:?}");
            }
        }
    }
}
