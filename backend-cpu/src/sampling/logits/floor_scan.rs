//! The streaming top-k's walk over an f32 row: from a chunk on, the first [`CHUNK`] of logits
//! that holds a logit not below the pass's floor (or a NaN), and which of its logits those are.
//!
//! Most chunks of a row hold no such logit once the floor has risen; the loop that looks for the
//! next one is the pass's whole cost at memory speed, so it runs in vector lanes where the CPU
//! has them (one unordered compare a lane) and hands back the chunk's mask for the caller to
//! offer just those tokens.

use super::CHUNK;
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// A loop of the walk: the first whole chunk at or after `from` with a logit `x` of
/// `row` where `!(x < lo)`, and the mask of those logits in it (bit `j`: logit `j`); the count of
/// whole chunks and 0 when there is none.
///
/// # Safety
/// The CPU must have the features the loop is compiled for.
pub(crate) type FloorLoop = unsafe fn(&[f32], usize, f32) -> (usize, u64);

/// The loops of [`FloorLoop`] this CPU runs, best first (the tests run each).
#[cfg(test)]
fn floor_loops() -> Vec<FloorLoop> {
    let mut loops: Vec<FloorLoop> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            loops.push(avx512::next_not_below);
        }
        if has_avx2() {
            loops.push(avx2::next_not_below);
        }
    }
    loops.push(next_not_below_scalar);
    loops
}

/// The best loop of the walk for this CPU.
pub(crate) fn floor_loop() -> FloorLoop {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            return avx512::next_not_below;
        }
        if has_avx2() {
            return avx2::next_not_below;
        }
    }
    next_not_below_scalar
}

/// The [`FloorLoop`] logit by logit: the first whole chunk of `row` at or after chunk `from`
/// holding a logit not below `lo` (NaN included), with the mask of those logits;
/// `(row.len() / CHUNK, 0)` when there is none. The logits past the last whole chunk are the
/// caller's.
fn next_not_below_scalar(row: &[f32], from: usize, lo: f32) -> (usize, u64) {
    let whole = row.len() / CHUNK;
    for c in from..whole {
        let chunk = &row[c * CHUNK..(c + 1) * CHUNK];
        let mask = chunk.iter().enumerate().fold(0u64, |mask, (j, &x)| {
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let not_below = !(x < lo);
            mask | u64::from(not_below) << j
        });
        if mask != 0 {
            return (c, mask);
        }
    }
    (whole, 0)
}

/// The walk in 16 f32 lanes: four compares a chunk.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::CHUNK;
    use std::arch::x86_64::*;

    /// See [`super::FloorLoop`].
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn next_not_below(row: &[f32], from: usize, lo: f32) -> (usize, u64) {
        let whole = row.len() / CHUNK;
        let lo = _mm512_set1_ps(lo);
        for (c, chunk) in row.chunks_exact(CHUNK).enumerate().skip(from) {
            let p = chunk.as_ptr();
            // SAFETY: `chunk` holds CHUNK = 4 × 16 f32.
            let [a, b, d, e] = [0, 16, 32, 48].map(|at| unsafe {
                _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(_mm512_loadu_ps(p.add(at)), lo)
            });
            if (a | b | d | e) != 0 {
                let mask =
                    u64::from(a) | u64::from(b) << 16 | u64::from(d) << 32 | u64::from(e) << 48;
                return (c, mask);
            }
        }
        (whole, 0)
    }
}

/// The walk in 8 f32 lanes: eight compares a chunk.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::CHUNK;
    use std::arch::x86_64::*;

    /// See [`super::FloorLoop`].
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn next_not_below(row: &[f32], from: usize, lo: f32) -> (usize, u64) {
        let whole = row.len() / CHUNK;
        let lo = _mm256_set1_ps(lo);
        for (c, chunk) in row.chunks_exact(CHUNK).enumerate().skip(from) {
            let p = chunk.as_ptr();
            let mut any = _mm256_setzero_ps();
            for at in (0..CHUNK).step_by(8) {
                // SAFETY: `chunk` holds CHUNK = 8 × 8 f32.
                let x = unsafe { _mm256_loadu_ps(p.add(at)) };
                any = _mm256_or_ps(any, _mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo));
            }
            if _mm256_movemask_ps(any) != 0 {
                return (c, mask_of(chunk, lo));
            }
        }
        (whole, 0)
    }

    /// The mask of a chunk that has a logit not below `lo`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mask_of(chunk: &[f32], lo: __m256) -> u64 {
        let p = chunk.as_ptr();
        (0..CHUNK / 8).fold(0u64, |mask, i| {
            // SAFETY: `chunk` holds CHUNK = 8 × 8 f32.
            let x = unsafe { _mm256_loadu_ps(p.add(8 * i)) };
            let bits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo)) as u8;
            mask | u64::from(bits) << (8 * i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;

    #[test]
    fn every_loop_finds_what_the_scalar_one_does() {
        let mut lcg = Lcg(21);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        for len in [0, 1, 63, 64, 65, 640, 1000, 4096 + 17] {
            let mut row: Vec<f32> = (0..len).map(|_| lcg.unit() * 8.0 - 4.0).collect();
            // A few far-apart tokens above a high floor, and the specials here and there.
            for (i, v) in row.iter_mut().enumerate() {
                if i % 211 == 7 {
                    *v = 10.0 + lcg.unit();
                }
                if i % 397 == 11 {
                    *v = specials[i % specials.len()];
                }
            }
            for lo in [
                -5.0,
                0.0,
                3.99,
                10.5,
                11.5,
                f32::INFINITY,
                f32::NEG_INFINITY,
            ] {
                for from in [0, 1, 2, 9] {
                    let want = next_not_below_scalar(&row, from, lo);
                    for (i, walk) in floor_loops().into_iter().enumerate() {
                        // SAFETY: `floor_loops` offers only loops whose features the CPU has.
                        let got = unsafe { walk(&row, from, lo) };
                        assert_eq!(got, want, "loop {i}, len {len}, lo {lo}, from {from}");
                    }
                    // And walking on from each hit lists every chunk the scalar test keeps.
                    let (mut c, mut hits) = (from, Vec::new());
                    loop {
                        // SAFETY: as above.
                        let (at, mask) = unsafe { floor_loop()(&row, c, lo) };
                        if mask == 0 {
                            break;
                        }
                        hits.push(at);
                        c = at + 1;
                    }
                    let expected: Vec<usize> = (from..len / CHUNK)
                        .filter(|&c| {
                            row[c * CHUNK..(c + 1) * CHUNK]
                                .iter()
                                .any(|&x| x >= lo || x.is_nan())
                        })
                        .collect();
                    assert_eq!(hits, expected, "len {len}, lo {lo}, from {from}");
                }
            }
        }
    }
}
