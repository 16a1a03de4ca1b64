//! The maximum pass and the chunk-estimate pass of a row split over two threads, in ONE parallel
//! section (`rayon::join`) instead of two: each side takes its half's maximum, then the other
//! half's, then estimates its own half's chunks with the row's constants.
//!
//! The other half's maximum is **claimed**: whichever side gets to a half first computes it, and
//! the other side waits only for a half that is being computed right now (a claimant never waits
//! on anything, so there is no deadlock, and when rayon runs both sides on one thread the first
//! side simply computes both). The maximum, the cleanliness flag and so the row's constants are
//! those of the two-section path bit for bit: the same halves, combined in the same order.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};

use specula_backend_api::logit_weights::{row_scale, sanitize_logit};

use super::super::lanes::{RowLanes, estimate_block_sums, max_and_clean};
use super::{CHUNK, Segments, chunked_steps, combine_max};

/// A half's maximum: not claimed, being computed, or published.
struct HalfMax {
    state: AtomicU8,
    max: AtomicU32,
    clean: AtomicBool,
}

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
/// Spins before a waiting side yields its core (the claimant may have been preempted).
const SPINS: u32 = 1 << 10;

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
        let mut spins = 0u32;
        while self.state.load(Ordering::Acquire) != DONE {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
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
    let (out0, out1) = masses.split_at_mut(segments.len / CHUNK);
    let next_len = next.len().div_ceil(2);
    let (next0, next1) = next.split_at(next_len.min(next.len()));
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
    let estimate = |part: &[f32], out: &mut [f64], next: &[u8], lanes: &RowLanes| {
        chunked_steps(part, out, next, &|step: &[f32], out: &mut [f64]| {
            estimate_block_sums(step, lanes, out);
        });
    };
    let (lanes, _) = rayon::join(
        || {
            let lanes = lanes_of(0)?;
            estimate(first, out0, next0, &lanes);
            Some(lanes)
        },
        || {
            let lanes = lanes_of(1)?;
            estimate(second, out1, next1, &lanes);
            Some(lanes)
        },
    );
    lanes
}
